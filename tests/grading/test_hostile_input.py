"""Everything a student hands in is hostile, not only the code that runs in the sandbox:
archives, file and folder names, ids, notebook JSON and its size, timestamps, written
answers, outputs and the messages their code raises (tests/hostile_input.py builds them).

1. **Collect, in every layout** (LMS zip and folder, a folder per student, nbgrader
   folders, nbgrader folders zipped): each attack is delivered next to two honest
   students. Nothing is written outside the student's own folder, the honest students
   are imported byte for byte, every attacker is rejected (with the reason) or refused
   (with its name escaped), memory stays bounded, and the terminal output is clean.
2. **A hostile class graded end to end** (collect, autograde, feedback, status, export,
   report, Formgrader): written answers, raw cells, displayed outputs and messages that
   would run script, forge lines or spreadsheet formulas; an honest pasted image; a
   student-written timestamp. Honest students get full marks; no page runs a line of the
   students' script in headless Chromium (the feedback pages and Formgrader's pages, as the
   instructor opens them); CSV files and terminal output are clean; nothing outside the
   grading folders changes.
"""

from __future__ import annotations

import csv
import hashlib
import html
import io
import json
import os
import random
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

import nbformat
import pytest

from browser import CHROMIUM, Chromium
from hostile_input import (DISPLAY_CELL, EVIL_SVG, LAYOUTS, MARKUP, MESSAGE_CELL, PASTED_PNG, PWNED,
                           SURROGATE_CELLS, Hand, add_cells, canary_dir, damaged_zip, deliver, notebook_nested,
                           notebook_of_cells, notebook_of_size, notebook_of_values, with_written_answers, zip_bomb,
                           zip_bytes)
from nbtools import Course, filled, kernel_env

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
A = "03_self_attention"
NB = f"{A}.ipynb"
# what a terminal would act on: C0 and C1 controls (a newline ends a line, a tab is a tab),
# and the invisible and bidirectional characters that make one name look like another
_UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]")


def _released() -> bytes:
    return (REPO / "notebooks" / A / NB).read_bytes()


def _snapshot(root: Path) -> dict[str, str]:
    """Every file of the course outside its grading folders, hashed."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.relative_to(root).parts[0] == "grading" and "__pycache__" not in p.parts:
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _grading_files(root: Path) -> list[Path]:
    return [p for p in (root / "grading").rglob("*")]


def assert_clean_terminal(text: str, what: str) -> None:
    bad = sorted({f"U+{ord(c):04X}" for c in _UNSAFE.findall(text)})
    assert not bad, f"{what} printed {bad} to the terminal:\n{text[-2000:]}"


def assert_clean_csv(path: Path) -> None:
    """No cell a spreadsheet would run (OWASP: = + - @ tab CR at its start), numbers aside."""
    for row in csv.reader(io.StringIO(path.read_text(encoding="utf-8"))):
        for value in row:
            if value.lstrip(" ").startswith(("=", "+", "-", "@", "\t", "\r")):
                assert re.fullmatch(r"[+-]?\d+(\.\d*)?([eE][+-]?\d+)?", value.strip()), (path.name, value)
            assert not _UNSAFE.search(value.replace("\n", "")), (path.name, value)


# ---------------------------------------------------------------------------
# 1. Collect, in every layout
# ---------------------------------------------------------------------------

def _hands() -> list[Hand]:
    nb = _released()
    slip = zip_bytes([(NB, nb), ("../../../../nbgrader_config.py", b"c.Exchange.root = '/tmp/owned'\n")])
    absolute = zip_bytes([(NB, nb), (f"{canary_dir()}/planted.txt", b"planted")])
    link = zip_bytes([(NB, nb), ("notes.txt", b"/etc/passwd")], mode={"notes.txt": stat.S_IFLNK | 0o777})
    device = zip_bytes([(NB, nb), ("tty", b"")], mode={"tty": stat.S_IFCHR | 0o666})
    many = zip_bytes([(NB, nb)] + [(f"f{i}.txt", b"") for i in range(400)])
    duplicate = zip_bytes([(NB, nb), ("data.csv", b"1"), ("data.csv", b"2")])
    backslash = zip_bytes([(NB, nb), ("..\\..\\..\\..\\evil.py", b"import os")])
    encrypted = zip_bytes([(NB, nb), ("secret.txt", b"x")], encrypted={"secret.txt"})
    directory = zip_bytes([(f"{NB}/", b""), (f"{NB}/inner.txt", b"x")])
    stamp = b"2020-01-01 00:00:00.000000 UTC"
    return [
        Hand("alice", [(NB, nb)], "imported"),
        Hand("bob", [(NB, nb), ("data.csv", b"1,2\n")], "imported"),
        Hand("mallory1", [("work.zip", slip)], "rejected: climbs out of its folder"),
        Hand("mallory2", [("work.zip", absolute)], "rejected: is an absolute path"),
        Hand("mallory3", [("work.zip", link)], "rejected: is a symbolic link"),
        Hand("mallory4", [("work.zip", device)], "rejected: not a regular file"),
        Hand("mallory5", [("work.zip", many)], "rejected: members, over the limit of 200"),
        Hand("mallory6", [("work.zip", duplicate)], "rejected: appears twice"),
        Hand("mallory7", [("work.zip", backslash)], "rejected: climbs out of its folder"),
        Hand("mallory8", [("work.zip", encrypted)], "rejected: is encrypted"),
        Hand("mallory9", [("work.zip", directory)], "rejected: no notebook"),
        Hand("bomber", [("work.zip", zip_bomb(400))], "rejected: unpacks to more than 100 MB"),
        Hand("bomber2", [("work.zip", zip_bomb(50))], "rejected: over the limit of 200 to 1"),
        Hand("big", [(NB, notebook_of_size(21))], "rejected: over the limit of 20 MB"),
        Hand("cells", [(NB, notebook_of_cells(20_000))], "rejected: cells, over the limit of 2,000"),
        Hand("deep", [(NB, notebook_nested(100_000))], "rejected: levels deep, over the limit of 64"),
        # (in a zip, 4 MB of "0,0,0" is also an archive bomb: either reason will do)
        Hand("values", [(NB, notebook_of_values(2_000_000))],
             "rejected: values, over the limit of 1,000,000|over the limit of 200 to 1"),
        Hand("crc", [("work.zip", damaged_zip(nb, "crc"))], "rejected: could not be read (BadZipFile"),
        Hand("zstd", [("work.zip", damaged_zip(nb, "compression"))], "rejected: could not be read (NotImplementedError"),
        Hand("garbage", [("work.zip", damaged_zip(nb, "stream"))], "rejected: could not be read ("),
        Hand("stamp", [(NB, nb), ("timestamp.txt", stamp)], "imported"),
        Hand("garbled", [(NB, nb), ("timestamp.txt", b"2026-01-01 00:00 /dev/stdin")], "imported"),
        Hand("hugestamp", [(NB, nb), ("timestamp.txt", "".join(random.choices("0123456789", k=2_000_000)).encode())],
             "imported"),
        # names and ids
        Hand("evil\x1b]52;c;ZXZpbA==\x07\x1b]0;title\x07", [(NB, nb)], "error: refused"),
        Hand("two\nlines", [(NB, nb)], "error: refused"),
        Hand("_collect", [(NB, nb)], "error: refused"),
        Hand("con", [(NB, nb)], "error: refused"),
        Hand("x" * 100, [(NB, nb)], "error: refused"),
        Hand("\u0430lice", [(NB, nb)], "error: refused"),  # a Cyrillic a
        Hand("al\u200bice", [(NB, nb)], "error: refused"),
        Hand("bob\u202egnp", [(NB, nb)], "error: refused"),
        Hand("\uff41lice", [(NB, nb)], "error: refused"),  # fullwidth
        Hand("$\\frac{$", [(NB, nb)], "error: refused"),
        Hand("=HYPERLINK(1)", [(NB, nb)], "error: refused"),
        Hand("<img src=x onerror=alert(1)>", [(NB, nb)], "error: refused", layouts=("lms-zip", "nbgrader-zip")),
        Hand("..", [(NB, nb)], "error: climbs out", layouts=("nbgrader-zip",)),
        Hand("y" * 300, [(NB, nb)], "error: over 150", layouts=("lms-zip", "nbgrader-zip")),
        Hand("Carol", [(NB, nb)], "rejected: differ only in case"),
        Hand("carol", [(NB, nb)], "rejected: differ only in case"),
        # what a folder can hold that an archive cannot
        Hand("linker", [(NB, nb), ("notes.txt", b"")], "rejected: symbolic link",
             special={"symlink": "/etc/passwd"}, layouts=("student-folders", "nbgrader", "nbgrader-zip")),
        Hand("piper", [(NB, nb), ("pipe", b"")], "rejected: not a regular file", special={"fifo": True},
             layouts=("student-folders", "nbgrader")),
    ]


def _collect(course: Course, source: Path, *extra: str) -> subprocess.CompletedProcess:
    """``workbook collect`` in a process of its own, which also reports its peak memory: its own
    (VmHWM), not ``ru_maxrss``, which Linux carries over from the parent it was started from (this
    test's process, PyPI's CUDA torch imported: 1.6 GB)."""
    code = ("import re, sys\nfrom autograder.cli import main\nrc = main(sys.argv[1:])\n"
            "sys.stdout.flush()\nhwm = re.search(r'VmHWM:\\s*(\\d+)', open('/proc/self/status').read())\n"
            "print('PEAK_RSS_MB', int(hwm.group(1)) // 1024, file=sys.stderr)\nsys.exit(rc)\n")
    return subprocess.run([sys.executable, "-c", code, "--course", str(course.root), "collect", str(source),
                           "-a", A, *extra], env=kernel_env(), capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def released_course():
    course = Course([A])
    try:
        course.workbook("release", A)
        yield course
    finally:
        course.close()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_collect_takes_the_honest_and_turns_every_attack_away(released_course, layout, tmp_path):
    course = released_course
    shutil.rmtree(course.root / "grading" / "submitted", ignore_errors=True)
    shutil.rmtree(course.root / "grading" / "reports", ignore_errors=True)
    shutil.rmtree(canary_dir(), ignore_errors=True)
    hands = [h for h in _hands() if layout in h.layouts]
    source = deliver(hands, layout, A, tmp_path / "download")
    before = _snapshot(course.root)
    proc = _collect(course, source)
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out, out
    assert proc.returncode == 1, out  # rejections and errors found, and reported
    assert_clean_terminal(out, f"collect ({layout})")
    peak = int(re.search(r"PEAK_RSS_MB (\d+)", proc.stderr).group(1))
    assert peak < 1200, f"collect held {peak} MB (a 400 MB archive bomb among the files)"

    # nothing outside the students' own folders and the collect log
    assert _snapshot(course.root) == before
    assert not canary_dir().exists()
    submitted = course.root / "grading" / "submitted"
    for path in _grading_files(course.root):
        rel = path.relative_to(course.root / "grading")
        assert rel.parts[0] in ("submitted", "reports", "gradebook.db", "exchange") or rel.name == "gradebook.db", rel
        assert not path.is_symlink(), rel
    log = json.loads((course.root / "grading" / "reports" / A / "_collect.json").read_text())

    for hand in hands:
        kind, _, words = hand.expect.partition(": ")
        folder = submitted / hand.name / A if "/" not in hand.name and hand.name not in ("..", ".") else None
        if kind == "imported":
            assert (folder / NB).read_bytes() == dict(hand.files)[NB], hand.name
            assert hand.name not in log["rejected"], (hand.name, log["rejected"].get(hand.name))
        elif kind == "rejected":
            got = log["rejected"].get(hand.name, "")
            assert any(w in got for w in words.split("|")), (hand.name, got, out)
            assert f"REJECTED {hand.name}: " in proc.stderr, hand.name
            assert not folder.exists() or list(folder.iterdir()) == [], hand.name  # recorded, nothing of it kept
        else:
            assert folder is None or not os.path.lexists(submitted / hand.name), hand.name
    # every refused name is named, escaped, in the errors
    refused = [h for h in hands if h.expect.startswith("error")]
    errors = [line for line in proc.stderr.splitlines() if line.strip().startswith("ERROR")]
    assert len(errors) >= len(refused), (errors, [h.name for h in refused])
    assert "\\x1b]52;c;ZXZpbA==\\x07" in proc.stderr and "two\\nlines" in proc.stderr
    # the only folders are the students' ids, all of them valid, and only the expected ones hold work
    from autograder.doors.intake import student_id
    for folder in submitted.iterdir():
        assert student_id(folder.name) == folder.name
    holding = {f.name for f in submitted.iterdir() if any((f / A).iterdir())}
    assert holding == {h.name for h in hands if h.expect == "imported"}
    # the student's own timestamp.txt is never believed: a claim, recorded and flagged
    assert log["times"]["stamp"] == {"time": None, "source": "none", "claimed": "2020-01-01 00:00:00"}
    assert not (submitted / "stamp" / A / "timestamp.txt").exists()
    garbled = [n["message"] for n in log["notes"]["garbled"]]
    assert any("cannot be read; it was ignored" in m for m in garbled), garbled


def test_the_gradebook_never_hands_a_submission_to_someone_else(released_course, tmp_path):
    """Without a roster a file's student is its name's first part (the LMS writes it): a
    student who names an upload after a known student stays themself; with a roster, a name
    holding two students' ids is refused; a case-only variant of a collected id is a
    conflict, never a merge."""
    course = released_course
    shutil.rmtree(course.root / "grading" / "submitted", ignore_errors=True)
    first = tmp_path / "first"
    first.mkdir()
    (first / f"bob_{NB}").write_bytes(_released())
    assert _collect(course, first).returncode == 0
    bob = (course.root / "grading" / "submitted" / "bob" / A / NB).read_bytes()
    honest_mallory = notebook_of_size(0.01)  # an empty notebook: nothing of bob's
    second = tmp_path / "second"
    second.mkdir()
    (second / f"mallory_bob_{NB}").write_bytes(honest_mallory)
    (second / f"Bob_{NB}").write_bytes(honest_mallory)
    proc = _collect(course, second)
    assert (course.root / "grading" / "submitted" / "bob" / A / NB).read_bytes() == bob
    assert (course.root / "grading" / "submitted" / "mallory" / A / NB).read_bytes() == honest_mallory
    assert "REJECTED Bob: the id Bob differs only in case from bob, collected earlier" in proc.stderr
    roster = tmp_path / "roster.txt"
    roster.write_text("bob\nmallory\n")
    proc = _collect(course, second, "--roster", str(roster))
    assert "holds several students' ids (bob, mallory)" in proc.stderr
    assert (course.root / "grading" / "submitted" / "bob" / A / NB).read_bytes() == bob
    # the case variant left no folder behind: bob hands in again, and it is his
    assert not (course.root / "grading" / "submitted" / "Bob").exists()
    third = tmp_path / "third"
    third.mkdir()
    (third / f"bob_{NB}").write_bytes(notebook_of_size(0.02))
    assert _collect(course, third).returncode == 0
    assert (course.root / "grading" / "submitted" / "bob" / A / NB).read_bytes() == (third / f"bob_{NB}").read_bytes()


def test_ids_that_only_look_alike_are_imported_and_flagged(released_course, tmp_path):
    course = released_course
    shutil.rmtree(course.root / "grading" / "submitted", ignore_errors=True)
    source = tmp_path / "lookalikes"
    source.mkdir()
    for sid in ("alice", "aIice", "b0b", "bob", "carol"):
        (source / f"{sid}_{NB}").write_bytes(_released())
    proc = _collect(course, source)
    assert proc.returncode == 0, proc.stderr
    log = json.loads((course.root / "grading" / "reports" / A / "_collect.json").read_text())
    flagged = {sid: [n["message"] for n in log["notes"][sid] if n["kind"] == "lookalike_ids"]
               for sid in ("alice", "aIice", "b0b", "bob", "carol")}
    assert flagged == {"alice": ["the id alice looks like aIice: check they are different students"],
                       "aIice": ["the id aIice looks like alice: check they are different students"],
                       "b0b": ["the id b0b looks like bob: check they are different students"],
                       "bob": ["the id b0b looks like bob: check they are different students"
                               .replace("id b0b looks like bob", "id bob looks like b0b")], "carol": []}


# ---------------------------------------------------------------------------
# 2. A hostile class, graded end to end
# ---------------------------------------------------------------------------

DUE = "2026-11-21 10:00 UTC"
ON_TIME, LATE_TIME = "2026-11-20-10-00-00", "2026-11-22-12-30-00"
HONEST = ("honest1", "honest2")
CONTENT_ATTACKS = ("x_markup", "x_display", "x_message", "x_bigpage", "x_surrogate")  # correct code, hostile content
# an honest answer with what a clumsy cleaner mangles: comparisons in math and code, a colon after "data"
HONEST_ANSWER = ("Dividing by $\\sqrt{d_k}$ keeps the scores' variance at 1 (with $d_k > 64$ and $s_{ij} < 0$ the "
                 "softmax saturates). Training data: 500 sentences.\n\n    if i < j:\n        mask[i, j] = False\n")
FORGED = " " * 19 + "  alice 03_self_attention: [reference_used] test_SelfAttention: calls course_lib's reference"
REJECTED = ("x_slip", "x_bomb")


def _code_markdown(source: str):
    return nbformat.v4.new_markdown_cell(source)


def _hostile_notebooks() -> dict[str, nbformat.NotebookNode]:
    import copy
    correct = filled(A, {})
    out = {"honest1": with_written_answers(copy.deepcopy(correct), [HONEST_ANSWER])}
    out["honest2"] = with_written_answers(copy.deepcopy(correct), [
        "My sketch of the masks: ![sketch](attachment:sketch.png) and $QK^T/\\sqrt{d_k}$."],
        attachments={"sketch.png": {"image/png": PASTED_PNG}})
    markup = with_written_answers(copy.deepcopy(correct), [" ".join(MARKUP[i::3]) for i in range(3)],
                                  attachments={"evil.svg": {"image/svg+xml": EVIL_SVG}})
    raw = nbformat.v4.new_raw_cell(f"<script>{MARKUP[0]}</script>")
    raw.metadata["format"] = "text/html"
    raw.metadata["raw_mimetype"] = "text/html"
    stored = nbformat.v4.new_code_cell("1 + 1")  # outputs saved in the file (cleared before grading)
    stored.outputs = [nbformat.v4.new_output("display_data", data={"text/html": MARKUP[0],
                                                                   "application/javascript": "window.__pwned=1"})]
    fake_id = _code_markdown("a cell claiming a graded id")
    fake_id.metadata["nbgrader"] = {"grade_id": '"><img src=x onerror=window.__pwned=1>', "grade": False,
                                    "solution": False, "locked": False}
    beacon = _code_markdown('\\`<img src="http://127.0.0.1:9/beacon.png" alt="b">\\` and ![r](http://127.0.0.1:9/r.png)')
    bombs = _code_markdown("$\\def\\a{xxxxxxxxxx}\\def\\b{\\a\\a\\a\\a\\a\\a\\a\\a}\\b$ " + "$x_1$ " * 3000)
    out["x_markup"] = add_cells(markup, [_code_markdown(m) for m in MARKUP] + [raw, stored, fake_id, beacon, bombs])
    out["x_display"] = add_cells(copy.deepcopy(correct), [nbformat.v4.new_code_cell(DISPLAY_CELL)])
    out["x_message"] = add_cells(copy.deepcopy(correct), [
        nbformat.v4.new_code_cell(f"print({MESSAGE_CELL[len('raise ValueError('):-1]})"),
        nbformat.v4.new_code_cell(MESSAGE_CELL), nbformat.v4.new_code_cell(f"raise ValueError({FORGED!r})")])
    surrogate = with_written_answers(copy.deepcopy(correct), ["an answer SURROGATE_HERE"])
    surrogate.metadata["authors"] = [{"name": "SURROGATE_META"}]
    out["x_surrogate"] = add_cells(surrogate, [nbformat.v4.new_code_cell(c) for c in SURROGATE_CELLS])
    big = [nbformat.v4.new_code_cell(f"print('{k}' * 250_000)") for k in range(12)]  # 3 MB printed
    out["x_bigpage"] = add_cells(copy.deepcopy(correct), big + [_code_markdown("y" * 3_000_000)])
    out["x_late"] = copy.deepcopy(correct)
    return out


def _lms_download(path: Path) -> None:
    """A Blackboard download: ``<course>_<id>_attempt_<time>_<file>``, the time the LMS's."""
    nbs = _hostile_notebooks()
    slip = zip_bytes([(NB, nbformat.writes(nbs["honest1"]).encode()),
                      ("../../../../../nbgrader_config.py", b"import os; os.system('touch /tmp/pwned')\n")])
    with zipfile.ZipFile(path, "w") as zf:
        for sid, nb in nbs.items():
            when = LATE_TIME if sid == "x_late" else ON_TIME
            if sid == "x_late":  # its own timestamp.txt claims it was early
                data = zip_bytes([(NB, nbformat.writes(nb).encode()),
                                  ("timestamp.txt", b"2026-11-19 08:00:00.000000 UTC")])
                zf.writestr(f"Week 3_{sid}_attempt_{when}_work.zip", data)
            else:  # (a lone surrogate can only be written as its JSON escape)
                text = nbformat.writes(nb).replace("SURROGATE_HERE", "\\ud800").replace("SURROGATE_META", "\\udc80")
                zf.writestr(f"Week 3_{sid}_attempt_{when}_{NB}", text)
        zf.writestr(f"Week 3_x_slip_attempt_{ON_TIME}_work.zip", slip)
        zf.writestr(f"Week 3_x_bomb_attempt_{ON_TIME}_work.zip", zip_bomb(300))


@pytest.fixture(scope="module")
def hostile_class(tmp_path_factory):
    base = tmp_path_factory.mktemp("hostile-class")
    course = Course([A])
    try:
        with (course.root / "nbgrader_config.py").open("a") as f:
            f.write('\nc.LateSubmissionPlugin.penalty_method = "zero"\nc.Intake.feedback_mb = 1.5\n')
        course.workbook("release", A)
        shutil.rmtree(canary_dir(), ignore_errors=True)
        _lms_download(base / "download.zip")
        ids = [*_hostile_notebooks(), *REJECTED]
        (base / "roster.csv").write_text("id,name\n" + "".join(f"{i},Student {i}\n" for i in ids))
        before = _snapshot(course.root)
        out = {}

        def run(name: str, *args: str, ok=(0,)) -> str:
            proc = subprocess.run([sys.executable, "-m", "autograder.cli", "--course", str(course.root), *args],
                                  env=kernel_env(), capture_output=True, text=True, timeout=1800)
            assert proc.returncode in ok, (args, proc.stdout, proc.stderr)
            out[name] = proc.stdout + proc.stderr
            return out[name]

        run("collect", "collect", str(base / "download.zip"), "-a", A, "--roster", str(base / "roster.csv"),
            "--time-from", "name", ok=(1,))
        run("due", "due", A, DUE)
        run("autograde", "autograde", A, "-j", "2", "--cell-timeout", "60", "--notebook-timeout", "300", "--quiet")
        run("feedback", "feedback", A)
        run("status", "status")
        run("export", "export", "-o", str(base / "grades.csv"))
        run("report", "report", "--names", "-o", str(base / "report"))
        yield {"course": course, "out": out, "before": before, "base": base}
    finally:
        course.close()


def _gradebook(course: Course) -> dict[str, tuple[float, float, float]]:
    """``{student: (code score, max code score, late penalty)}``."""
    from nbgrader.api import Gradebook
    out = {}
    with Gradebook(f"sqlite:///{course.root / 'grading' / 'gradebook.db'}") as gb:
        for sub in gb.assignment_submissions(A):
            nb = sub.notebooks[0]
            out[sub.student.id] = (float(nb.code_score), float(nb.max_code_score),
                                   float(nb.late_submission_penalty or 0.0))
    return out


def test_honest_work_gets_full_marks_beside_the_attackers(hostile_class):
    scores = _gradebook(hostile_class["course"])
    for student in (*HONEST, *CONTENT_ATTACKS):
        code, top, penalty = scores[student]
        assert code == top > 0 and penalty == 0, (student, scores[student])
    # the student's own timestamp.txt claimed the 19th; the LMS said the 22nd: late, penalised
    code, top, penalty = scores["x_late"]
    assert penalty == code == top, scores["x_late"]
    assert "timestamp.txt says 2026-11-19 08:00:00 UTC, the LMS's file name says 2026-11-22 12:30:00 UTC" \
        in hostile_class["out"]["collect"]


def test_rejections_cost_their_student_only_and_say_why(hostile_class):
    out = hostile_class["out"]
    assert "REJECTED x_slip: '../../../../../nbgrader_config.py' climbs out of its folder" in out["collect"]
    assert "REJECTED x_bomb: 'Week 3_x_bomb_attempt_" in out["collect"] and "unpacks to more than 100 MB" \
        in out["collect"]
    assert "REJECTED x_slip 03_self_attention: rejected at collect:" in out["autograde"]
    scores = _gradebook(hostile_class["course"])
    assert scores["x_slip"][0] == scores["x_bomb"][0] == 0
    rows = {line.split()[0]: line for line in out["status"].split("\n\n")[0].splitlines() if line.strip()}
    assert "0/19 REJECTED" in rows["x_slip"] and "0/19 REJECTED" in rows["x_bomb"], rows
    page = (hostile_class["course"].root / "grading" / "feedback" / "x_slip" / A / f"{A}.html").read_text()
    assert "could not be graded" in page and "climbs out of its folder" in page


def test_nothing_outside_the_grading_folders_changed(hostile_class):
    course = hostile_class["course"]
    assert _snapshot(course.root) == hostile_class["before"]
    assert not canary_dir().exists() and not Path("/tmp/pwned").exists()
    for path in (course.root / "grading").rglob("*"):
        assert not path.is_symlink(), path


def test_a_student_timestamp_that_disagrees_is_flagged_where_the_instructor_looks(hostile_class):
    out = hostile_class["out"]
    row = next(line for line in out["status"].splitlines() if line.startswith("x_late "))
    assert "FLAG" in row and "LATE" in row
    assert "x_late 03_self_attention: [timestamp_claim]" in out["status"]
    rows = {r["student"]: r for r in csv.DictReader((hostile_class["base"] / "grades.csv").open())}
    assert "timestamp_claim" in rows["x_late"]["flags"]


def test_lone_surrogates_cost_nothing_and_stop_nobody(hostile_class):
    """A printed chr(0xD800), one raised, one in a written answer and one in the notebook's
    metadata cannot be written as UTF-8: they become U+FFFD, and everyone is graded."""
    course = hostile_class["course"]
    text = (course.root / "grading" / "autograded" / "x_surrogate" / A / NB).read_text(encoding="utf-8")
    assert "\ufffd" in text or "\\ufffd" in text
    scores = _gradebook(course)
    assert scores["x_surrogate"][0] == scores["x_surrogate"][1] > 0
    assert all(s in scores for s in (*HONEST, *CONTENT_ATTACKS, "x_late"))


def test_the_autograded_notebook_keeps_no_markup_and_fetches_nothing(hostile_class):
    """What a person reads in JupyterLab (Formgrader's "open live notebook") holds no raw
    element of the student's, and no image from an address: a code span opened by an escaped
    backtick is not a code span."""
    nb = nbformat.read(str(hostile_class["course"].root / "grading" / "autograded" / "x_markup" / A / NB), as_version=4)
    from nbconvert.filters.markdown import markdown2html  # renders raw HTML, as JupyterLab does before sanitising
    markdown = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    rendered = markdown2html(re.sub(r"\(attachment:[^)]*\)", "(pasted.png)", markdown))
    tags = re.findall(r"<\s*([a-zA-Z][\w-]*)([^>]*)>", rendered)
    assert not [t for t, attrs in tags if t.lower() in ("script", "iframe", "object", "embed", "svg", "style", "form",
                                                          "base", "details", "math")], tags
    assert not [a for _, a in tags if re.search(r"\son\w+\s*=|class=(?!\"anchor-link\")|javascript:|src=\"https?:", a)], tags
    assert "](http://127.0.0.1:9/r.png)" not in markdown and "blocked-remote-image:http://127.0.0.1:9/r.png" in markdown


def test_honest_math_code_and_prose_read_as_written(hostile_class):
    nb = nbformat.read(str(hostile_class["course"].root / "grading" / "autograded" / "honest1" / A / NB),
                       as_version=4)
    answer = next(c.source for c in nb.cells if c.cell_type == "markdown" and "Training data" in c.source)
    assert answer == HONEST_ANSWER  # nothing escaped, nothing "-blocked"
    page = html.unescape(_page(hostile_class["course"], "honest1").read_text())
    assert "Training data: 500 sentences" in page and "if i < j:" in page and "-blocked" not in page
    assert "<mo>&gt;</mo>" in _page(hostile_class["course"], "honest1").read_text()  # d_k > 64 as MathML


def test_terminal_output_is_clean_and_forges_no_line(hostile_class):
    for name, text in hostile_class["out"].items():
        assert_clean_terminal(text, f"workbook {name}")
    lines = hostile_class["out"]["status"].splitlines()
    assert not any(line.startswith("bob ") for line in lines), "a student's message forged a line of status"
    # a message padded with spaces to start a line of its own on an 80-column terminal: its spaces are one
    forged = next(line for line in lines if "[reference_used] test_SelfAttention: calls" in line)
    assert forged.startswith("  x_message 03_self_attention: [error]") and "  alice" not in forged
    message = next(line for line in lines if line.strip().startswith("x_message ") and "HYPERLINK" in line)
    # the escapes were taken out where the message was recorded; the newline is shown, escaped
    assert "]52;c;ZXZpbA==" in message and "\\nbob 03_self_attention: [forged]" in message, message


def test_csv_files_hold_no_formula(hostile_class):
    base = hostile_class["base"]
    for path in [base / "grades.csv", *sorted((base / "report").glob("*.csv"))]:
        assert_clean_csv(path)
    text = (base / "grades.csv").read_text()
    assert "x_message" in text


def _page(course: Course, student: str) -> Path:
    return course.root / "grading" / "feedback" / student / A / f"{A}.html"


def test_feedback_pages_keep_within_their_budget_and_keep_honest_images(hostile_class):
    course = hostile_class["course"]
    big = _page(course, "x_bigpage").read_text()
    assert len(big) < 3 * 2**20 and "outputs or pasted images were left out of this page" in big and "over 1.5 MB" in big
    assert "more characters not shown" in big
    for student in HONEST:
        page = _page(course, student).read_text()
        assert "left out of this page" not in page and len(page) < 1.5 * 2**20
    honest2 = _page(course, "honest2").read_text()
    assert f'<img alt="sketch" src="data:image/png;base64,{PASTED_PNG}"' in honest2 or \
        f'src="data:image/png;base64,{PASTED_PNG}"' in honest2
    for student in os.listdir(course.root / "grading" / "feedback"):
        assert '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'' in \
            _page(course, student).read_text()[:2000], student
    report = (hostile_class["base"] / "report" / "index.html").read_text()
    assert "Content-Security-Policy" in report[:1000]


# what a page must not hold after it has been rendered: any of it would be the student's script
DOM_CHECK = """(() => {
  const root = document.querySelector(%s) || document.body;
  const bad = [];
  for (const el of root.querySelectorAll('*')) {
    for (const a of el.attributes) {
      if (/^on/i.test(a.name)) bad.push(el.tagName + ' ' + a.name);
      if (/^\\s*(javascript|vbscript|data:text)/i.test(a.value) && /href|src|action|data|formaction/i.test(a.name))
        bad.push(el.tagName + ' ' + a.name + '=' + a.value.slice(0, 40));
    }
    if (/^(SCRIPT|IFRAME|OBJECT|EMBED|BASE|FORM|SVG|STYLE|LINK|META)$/i.test(el.tagName) && root !== document.body)
      bad.push(el.tagName);
  }
  return {pwned: window.__pwned === 1 || document.title === %s, bad: bad.slice(0, 20)};
})()"""


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed")
def test_feedback_pages_run_none_of_the_students_script(hostile_class, tmp_path):
    course = hostile_class["course"]
    browser = Chromium(width=1000, height=1400)
    try:
        for student in sorted(os.listdir(course.root / "grading" / "feedback")):
            browser.requests.clear()
            outside = browser.open_offline(_page(course, student))
            time.sleep(0.3)
            found = browser.evaluate(DOM_CHECK % ("'#notebook-container'", json.dumps(PWNED)))
            assert not found["pwned"] and not found["bad"], (student, found)
            assert not [u for u in outside if "127.0.0.1" not in u], (student, outside)
        browser.screenshot(tmp_path / "x_markup-feedback.png")
    finally:
        browser.close()


@pytest.fixture(scope="module")
def formgrader(hostile_class, tmp_path_factory):
    """``workbook formgrader`` on the hostile class, as an instructor starts it: (port, token)."""
    course = hostile_class["course"]
    tmp = tmp_path_factory.mktemp("formgrader")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = hashlib.sha256(os.urandom(16)).hexdigest()[:32]
    env = {**kernel_env(), "JUPYTER_RUNTIME_DIR": str(tmp / "runtime")}
    log = (tmp / "formgrader.log").open("w")
    server = subprocess.Popen([str(REPO / "workbook"), "--course", str(course.root), "formgrader", A,
                               "--no-browser", f"--port={port}", f"--IdentityProvider.token={token}"],
                              env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while True:
            assert server.poll() is None, (tmp / "formgrader.log").read_text()
            try:
                request = urllib.request.Request(f"http://127.0.0.1:{port}/formgrader/api/assignments",
                                                 headers={"Authorization": f"token {token}"})
                urllib.request.urlopen(request, timeout=30).read()
                break
            except OSError:
                assert time.monotonic() < deadline, (tmp / "formgrader.log").read_text()
                time.sleep(1)
        yield port, token
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
        log.close()


def _api(port: int, token: str, path: str):
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed")
def test_formgrader_runs_none_of_the_students_script(hostile_class, formgrader, tmp_path):
    """The instructor opens each submission in Formgrader (in their own Jupyter session, where
    a script could use the server's API): the students' markup is text, their images data."""
    port, token = formgrader
    submissions = {s["student"]: s for s in _api(port, token, f"/formgrader/api/submitted_notebooks/{A}/{A}")}
    assert {*HONEST, *CONTENT_ATTACKS} <= set(submissions)
    browser = Chromium(width=1200, height=1600)
    try:
        for student in (*HONEST, *CONTENT_ATTACKS):
            browser.navigate(f"http://127.0.0.1:{port}/formgrader/submissions/{submissions[student]['id']}/"
                             f"?token={token}")
            browser.wait_for("document.readyState === 'complete' && !!document.querySelector('#notebook-container')",
                             timeout=60)
            time.sleep(0.5)
            found = browser.evaluate(DOM_CHECK % ("'#notebook-container'", json.dumps(PWNED)))
            assert not found["pwned"] and not found["bad"], (student, found)
            if student == "x_markup":  # what the student wrote is there, as text, for the grader to read
                text = browser.evaluate("document.querySelector('#notebook-container').innerText")
                assert "onerror=" in text and "<script>" in text
                browser.screenshot(tmp_path / "x_markup-formgrader.png")
            if student == "honest1":  # read as written: the comparison, the code, the prose
                text = browser.evaluate("document.querySelector('#notebook-container').innerText")
                assert "if i < j:" in text and "Training data: 500 sentences" in text and "-blocked" not in text
            if student == "honest2":
                assert browser.evaluate("Array.from(document.querySelectorAll('#notebook-container img'))"
                                        ".some(i => i.src.startsWith('data:image/png') && i.naturalWidth == 1)")
        # a file beside a submission is never served (nbgrader would serve the autograded folder)
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/formgrader/submissions/{submissions['honest1']['id']}/timestamp.txt",
            headers={"Authorization": f"token {token}"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        assert refused.value.code == 404
    finally:
        browser.close()


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed")
def test_the_browser_check_sees_the_script_of_a_page_that_lets_it_through(tmp_path):
    """The control for the two tests above: the same written answers rendered by nbconvert's
    own exporter, with no sanitiser and no policy, are caught by the same check."""
    from nbconvert import HTMLExporter
    nb = with_written_answers(filled(A, {}), [" ".join(MARKUP)])
    page = tmp_path / "unsafe.html"
    page.write_text(HTMLExporter(template_name="classic").from_notebook_node(nb)[0], encoding="utf-8")
    browser = Chromium(width=1000, height=1400)
    try:
        browser.open_offline(page)
        time.sleep(0.5)
        found = browser.evaluate(DOM_CHECK % ("'#notebook-container'", json.dumps(PWNED)))
        assert found["pwned"] and found["bad"], found
    finally:
        browser.close()
