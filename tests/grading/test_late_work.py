"""Late work and written answers, on a class of two graded by `workbook autograde`:
`workbook due` sets an assignment's due date, `autograde` applies nbgrader's
late-submission plugin as nbgrader_config.py configures it, and `status`, `export` and
the feedback show how late and what it cost; written answers nobody has graded yet are
"not graded yet" on the feedback page, whose math is MathML (offline, no MathJax), until
an instructor grades them in Formgrader (`workbook formgrader`)."""

from __future__ import annotations

import csv
import html
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import time
import urllib.request
import zipfile
from pathlib import Path

import nbformat

import pytest

from browser import CHROMIUM, Chromium
from nbtools import Course, filled, kernel_env

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow

A = "03_self_attention"
# a written answer that tries to run script in the instructor's browser (Formgrader) and the student's
HOSTILE_MARKUP = '<img src=x onerror="document.title=1">'


@pytest.fixture(scope="module")
def late_class():
    course = Course([A])
    try:
        with (course.root / "nbgrader_config.py").open("a") as f:
            f.write('\nc.LateSubmissionPlugin.penalty_method = "zero"\n')
        course.workbook("release", A)
        correct = filled(A, {})
        answered = filled(A, {})  # and its written answers written
        for c in answered.cells:
            if c.cell_type == "markdown" and c.metadata.get("nbgrader", {}).get("solution"):
                c.source = ("The dot product of $d_k$ unit-variance terms has variance $d_k$, so $\\sqrt{d_k}$ rescales it. "
                            + HOSTILE_MARKUP)
        # a Blackboard download: the LMS writes each submission's time into the file's name, after
        # the student's id; the student's own timestamp.txt (in "late"'s zip) claims an earlier time
        lms = course.root / "download"
        lms.mkdir()
        nbformat.write(answered, str(lms / f"Week 3_early_attempt_2026-11-21-09-00-00_{A}.ipynb"))
        with zipfile.ZipFile(lms / "Week 3_late_attempt_2026-11-22-12-30-00_work.zip", "w") as z:
            z.writestr(f"{A}.ipynb", nbformat.writes(correct))
            z.writestr("timestamp.txt", "2026-11-20 08:00:00.000000 UTC")
        nbformat.write(correct, str(lms / f"Week 3_unknown_{A}.ipynb"))  # no time in the name
        (course.root / "roster.txt").write_text("id\nearly\nlate\nunknown\n")
        collected = course.workbook("collect", str(lms), "-a", A, "--roster", str(course.root / "roster.txt"),
                                    "--time-from", "name").stdout
        # and one student through nbgrader's exchange (a hub): the files' change times are its time,
        # its secret names its feedback in the exchange
        hub = course.root / "exchange-inbound" / "hub" / A
        hub.mkdir(parents=True)
        nbformat.write(correct, str(hub / f"{A}.ipynb"))
        (hub / "timestamp.txt").write_text("2026-11-01 00:00:00.000000 UTC")
        (hub / "submission_secret.txt").write_text("0123456789abcdef0123456789abcdef")
        course.workbook("collect", str(course.root / "exchange-inbound"), "--time-from", "files")
        due = course.workbook("due", A, "2026-11-21 10:00 UTC").stdout
        course.workbook("autograde", A, "-j", "2", "--quiet")
        course.workbook("feedback", A)
        yield {"course": course, "due": due, "collected": collected}
    finally:
        course.close()


def test_due_date_is_recorded_and_shown(late_class):
    assert late_class["due"].strip() == f"{A}: due 2026-11-21 10:00 UTC"
    assert late_class["course"].workbook("due").stdout.strip() == f"{A}: due 2026-11-21 10:00 UTC"


def test_the_time_comes_from_the_lms_never_from_the_student(late_class):
    collected = late_class["collected"]
    assert "early: 03_self_attention (handed in 2026-11-21 09:00:00 UTC)" in collected
    assert "late: 03_self_attention (handed in 2026-11-22 12:30:00 UTC)" in collected
    assert ("timestamp.txt says 2026-11-20 08:00:00 UTC, the LMS's file name says 2026-11-22 12:30:00 UTC; "
            "the latter was used") in collected
    assert "unknown: 03_self_attention\n" in collected + "\n"


def test_lateness_unknown_is_said_in_status_and_feedback(late_class):
    course = late_class["course"]
    status = course.workbook("status").stdout
    unknown = next(line for line in status.splitlines() if line.startswith("unknown "))
    assert "13/19 LATE?" in unknown
    assert "LATE?: the assignment has a due date, but when this was handed in is not known" in status
    course.workbook("feedback", A, "-s", "unknown")
    page = html.unescape(_page(course, "unknown"))
    assert "When this was handed in is not known" in page


def test_export_shows_lateness_and_the_penalty(late_class):
    course = late_class["course"]
    out = course.root / "grades.csv"
    course.workbook("export", "-o", str(out))
    rows = {r["student"]: r for r in csv.DictReader(out.open())}
    assert rows["early"]["late"] == "" and float(rows["early"]["late_penalty"]) == 0
    assert float(rows["early"]["total"]) == float(rows["early"]["auto"]) == 13
    assert rows["late"]["late"] == f"{A}: 1 d 2 h"
    assert float(rows["late"]["late_penalty"]) == 13  # penalty_method "zero": the whole score
    assert float(rows["late"]["total"]) == 0 and float(rows["late"][f"{A}/{A}"]) == 0


def test_status_marks_late_work(late_class):
    status = late_class["course"].workbook("status").stdout
    late = next(line for line in status.splitlines() if line.startswith("late "))
    early = next(line for line in status.splitlines() if line.startswith("early "))
    assert "0/19 LATE 1d2h (-13)" in late and "LATE" not in early
    assert "LATE: handed in after the due date" in status


def test_feedback_shows_the_penalty(late_class):
    course = late_class["course"]
    page = html.unescape((course.root / "grading" / "feedback" / "late" / A / f"{A}.html").read_text())
    assert "Late submission penalty (Score: -13.0)" in page
    # the banner on top gives the score after the penalty, and says why
    assert "Autograding: 03_self_attention — 0 / 19 points" in page
    assert ("Handed in 1 d 2 h after the due date (2026-11-21 10:00 UTC): 13 points were taken off (late-submission "
            "penalty); the score above is after it.") in page
    early = html.unescape((course.root / "grading" / "feedback" / "early" / A / f"{A}.html").read_text())
    assert "Late submission penalty" not in early


def test_a_date_that_cannot_be_read_is_a_clear_error(late_class):
    with pytest.raises(RuntimeError, match="cannot read the date 'next friday-ish'"):
        late_class["course"].workbook("due", A, "next friday-ish")


def _page(course, student: str) -> str:
    return (course.root / "grading" / "feedback" / student / A / f"{A}.html").read_text()


def test_written_answers_are_not_graded_yet_until_a_person_grades_them(late_class):
    course = late_class["course"]
    page = _page(course, "early")
    assert page.count("Not graded yet (2.0 points)") == 3
    assert "3 written answers\n  (6.0 points) are not graded yet" in page
    assert "Not graded yet" not in _page(course, "late")  # no answer written: 0, as nbgrader gives
    status = course.workbook("status").stdout
    assert "13/19 ✎6" in next(line for line in status.splitlines() if line.startswith("early "))
    from autograder.course import Course as GradedCourse
    with GradedCourse(course.root).gradebook() as gb:
        grade = gb.find_grade("q_cost", A, A, "early")
        grade.manual_score = 1.5
        gb.db.commit()
    course.workbook("feedback", A, "-s", "early")
    page = _page(course, "early")
    assert page.count("Not graded yet (2.0 points)") == 2 and "Score: 1.5 / 2.0" in page


def test_feedback_page_starts_with_the_grading_notes(late_class):
    raw = _page(late_class["course"], "early")
    assert HOSTILE_MARKUP not in raw and "onerror" in raw  # the student's markup is text on the page
    page = html.unescape(raw)
    notes = page.index("Autograding: 03_self_attention — 13 / 19 points")
    assert page.index("No problems were found while grading.") > notes
    assert notes < page.index("not graded yet") and notes > page.index("<body")


def test_feedback_contents_name_the_items_and_long_lines_wrap(late_class):
    page = _page(late_class["course"], "early")
    assert "Test cell" not in page and "Written response" not in page
    for item in ("scaled_dot_product_attention", "causal_mask", "padding_mask", "SelfAttention"):
        assert f'<a href="#test_{item}">Test of {item}</a>' in page
    assert '<a href="#q_cost">Written answer q_cost</a>' in page
    assert "white-space: pre-wrap; overflow-wrap: anywhere" in page


def test_feedback_math_is_mathml_and_needs_no_network(late_class):
    page = _page(late_class["course"], "early")
    assert page.count("<math") > 20
    assert "MathJax" not in page and "x-mathjax-config" not in page and "cdnjs" not in page
    assert not re.search(r"<script[^>]+src=", page)


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed")
def test_feedback_page_renders_offline_in_a_browser(late_class, tmp_path):
    page = late_class["course"].root / "grading" / "feedback" / "early" / A / f"{A}.html"
    browser = Chromium(width=1100, height=1600)
    try:
        outside = browser.open_offline(page)
        sizes = browser.evaluate("Array.from(document.querySelectorAll('math')).map(m => m.getBoundingClientRect().width)")
        assert len(sizes) > 20 and all(w > 0 for w in sizes)  # every formula is laid out
        assert not outside, outside
        # the student's markup stayed text: no element carries its handler, it never ran
        assert browser.evaluate("document.querySelectorAll('[onerror]').length") == 0
        assert browser.evaluate("document.title") != "1"
        browser.screenshot(tmp_path / "feedback.png")
    finally:
        browser.close()


@pytest.fixture
def formgrader(late_class, tmp_path):
    """``workbook formgrader`` on the class, as an instructor starts it (no browser here):
    a function that calls its HTTP API."""
    course = late_class["course"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = secrets.token_hex(16)
    env = {**kernel_env(grading=False), "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
    log = (tmp_path / "formgrader.log").open("w")
    server = subprocess.Popen([str(REPO / "workbook"), "--course", str(course.root), "formgrader", A,
                               "--no-browser", f"--port={port}", f"--IdentityProvider.token={token}"],
                              env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def call(method: str, path: str, body: dict | None = None):
        request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method,
                                         data=None if body is None else json.dumps(body).encode(),
                                         headers={"Authorization": f"token {token}"})
        with urllib.request.urlopen(request, timeout=60) as response:
            text = response.read().decode()
        return json.loads(text) if path.startswith("/formgrader/api/") else text

    call.port, call.token = port, token
    try:
        deadline = time.monotonic() + 240
        while True:
            assert server.poll() is None, (tmp_path / "formgrader.log").read_text()
            try:
                call("GET", "/formgrader/api/assignments")
                break
            except OSError:
                assert time.monotonic() < deadline, (tmp_path / "formgrader.log").read_text()
                time.sleep(1)
        yield call
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
        log.close()


def test_the_printed_formgrader_link_logs_the_browser_in_for_the_whole_server(late_class, formgrader):
    """The link `workbook formgrader` prints carries the token: the cookie it sets must reach
    Formgrader's API too (nbgrader's pages set it for their own folder only, and the page
    then stays on "Loading")."""
    import http.cookiejar
    port, token = formgrader.port, formgrader.token
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    with opener.open(f"http://127.0.0.1:{port}/formgrader/gradebook/{A}/{A}?token={token}", timeout=60) as page:
        assert page.status == 200
    assert {c.path for c in jar if c.name.startswith("username-")} == {"/"}
    with opener.open(f"http://127.0.0.1:{port}/formgrader/api/assignments", timeout=60) as api:  # no token: the cookie
        assert json.loads(api.read())[0]["name"] == A


def test_formgraders_release_feedback_button_works(late_class, formgrader):
    course = late_class["course"]
    course.workbook("feedback", A)
    released = formgrader("POST", f"/formgrader/api/assignment/{A}/release_feedback")
    assert released["success"], released
    assert released["log"] == ("released the feedback of 1 students to the exchange; 3 handed in through an LMS "
                               "download, not the exchange (early, late, unknown): return their pages from "
                               "grading/feedback/<student>/ through the LMS.")
    exchange = course.root / "grading" / "exchange" / "attention-workbook" / "feedback"
    from nbgrader.utils import notebook_hash
    assert [p.name for p in exchange.glob("*.html")] == \
        [notebook_hash(secret="0123456789abcdef0123456789abcdef", notebook_id=A) + ".html"]


def test_written_answers_are_graded_in_formgrader(late_class, formgrader):
    """The manual-grading step: the written answers are graded in Formgrader (through its
    own HTTP API, as its page does), and status, export and feedback then count them.
    Formgrader's autograde button refuses (it would run the code unsealed) and leaves
    the autograded notebook alone."""
    course = late_class["course"]
    submissions = {s["student"]: s for s in formgrader("GET", f"/formgrader/api/submitted_notebooks/{A}/{A}")}
    assert set(submissions) == {"early", "late", "unknown", "hub"} and submissions["early"]["needs_manual_grade"]
    page = formgrader("GET", f"/formgrader/submissions/{submissions['early']['id']}/")
    # the student's answer, to be graded, its formulas as MathML (offline: Formgrader's MathJax is not fetched)
    assert re.search(r"so <math[^>]*><mrow><msqrt>.*?</msqrt></mrow></math> rescales it", page)
    assert HOSTILE_MARKUP not in page and HOSTILE_MARKUP in html.unescape(page)  # shown as text, never run
    grades = formgrader("GET", f"/formgrader/api/grades?submission_id={submissions['early']['id']}")
    written = [g for g in grades if g["cell_type"] == "markdown"]
    assert len(written) == 3
    given = dict(zip((g["name"] for g in written), (2.0, 1.0, 0.5)))
    for g in written:
        saved = formgrader("PUT", f"/formgrader/api/grade/{g['id']}", {"manual_score": given[g["name"]]})
        assert saved["manual_score"] == given[g["name"]] and not saved["needs_manual_grade"]

    autograded = course.root / "grading" / "autograded" / "late" / A / f"{A}.ipynb"
    before = autograded.read_bytes()
    refused = formgrader("POST", f"/formgrader/api/submission/{A}/late/autograde")
    assert not refused["success"] and "`workbook autograde`" in refused["error"]
    refused = formgrader("POST", f"/formgrader/api/assignment/{A}/generate_feedback")
    assert not refused["success"] and "`workbook feedback`" in refused["error"]
    assert autograded.read_bytes() == before

    early = next(line for line in course.workbook("status").stdout.splitlines() if line.startswith("early "))
    assert "16.5/19" in early and "✎" not in early
    out = course.root / "grades.csv"
    course.workbook("export", "-o", str(out))
    row = next(r for r in csv.DictReader(out.open()) if r["student"] == "early")
    assert float(row["manual"]) == 3.5 and float(row["awaiting_manual"]) == 0 and float(row["total"]) == 16.5
    course.workbook("feedback", A, "-s", "early")
    page = html.unescape(_page(course, "early"))
    assert "Not graded yet" not in page and "Score: 0.5 / 2.0" in page and "not graded yet" not in page
