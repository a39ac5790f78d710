"""End to end: the whole ``workbook`` CLI on a generated class of 12 students.

The class is made from notebook 03 as released. Correct, partial, mistaken,
damaged and malicious submissions arrive as an LMS
download; they are collected, autograded in parallel and then sequentially, given
feedback, exported and tabulated. Expected scores come from the notebook's test
points (and, for a catalogued mistake, from ``course_lib.grading.grade`` run here).
"""

from __future__ import annotations

import contextlib
import csv
import html
import io
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from autograder.cli import main
from autograder.course import Course, read_json
from workbook_class import ClassBuilder, make_course, write_roster

pytestmark = pytest.mark.slow

NOTEBOOK = "03_self_attention"
LIMITS = ["--cell-timeout", "15", "--notebook-timeout", "150", "--memory-mb", "2048", "--quiet"]


def _grades(course: Course, assignment: str, notebook: str, students) -> dict:
    """Every graded cell's score and the notebook totals, read from the gradebook."""
    out = {}
    with course.gradebook() as gb:
        for s in students:
            sub = gb.find_submission_notebook(notebook, assignment, s.id)
            out[s.id] = ({g.name: g.score for g in sub.grades}, sub.score, sub.max_score)
    return out


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    base = tmp_path_factory.mktemp("class")
    root, assignment = make_course(base / "course", NOTEBOOK)
    course = Course(root)
    assert main(["--course", str(root), "release", assignment]) == 0
    assert main(["--course", str(root), "release", "--check"]) == 0
    notebook = assignment
    builder = ClassBuilder(course.release_dir / assignment / f"{notebook}.ipynb",
                           course.source_dir / assignment / f"{notebook}.ipynb")
    students = builder.build()
    write_roster(students, base / "roster.csv")
    builder.write_lms_download(students, base / "lms.zip")
    state = {"course": course, "assignment": assignment, "notebook": notebook, "students": students,
             "builder": builder, "base": base}
    state["collect_rc"] = main(["--course", str(root), "collect", str(base / "lms.zip"), "-a", assignment,
                                "--roster", str(base / "roster.csv")])
    assert main(["--course", str(root), "autograde", assignment, "-j", "2", *LIMITS]) == 0
    state["parallel"] = _grades(course, assignment, notebook, students)
    state["parallel_reports"] = {s.id: read_json(course.report_path(assignment, s.id)) for s in students}
    state["kept_reports"] = {s.id: read_json(course.report_path(assignment, s.id)) for s in students}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["--course", str(root), "autograde", assignment, "-j", "2", *LIMITS]) == 0  # nothing to do
    state["kept_words"] = printed.getvalue()
    state["kept"] = _grades(course, assignment, notebook, students)
    assert main(["--course", str(root), "autograde", assignment, "-j", "1", "--force", *LIMITS]) == 0
    state["sequential"] = _grades(course, assignment, notebook, students)
    return state


def test_collect_imports_everyone_and_names_every_bad_file(graded, capsys):
    course, a = graded["course"], graded["assignment"]
    assert graded["collect_rc"] == 1  # errors were found, and reported
    assert course.submitted_students(a) == sorted(s.id for s in graded["students"])
    assert (course.submission_dir("s03", a) / "notes.txt").read_bytes() == b"my notes"
    # a second, dry run prints every error with the offending file's name
    rc = main(["--course", str(course.root), "collect", str(graded["base"] / "lms.zip"), "-a", a,
               "--roster", str(graded["base"] / "roster.csv"), "--dry-run"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "'README.txt': unrecognised student id" in err
    assert f"'x99_{a}.ipynb': unrecognised student id" in err
    assert "REJECTED s13: its JSON is nested" in err  # rejected alone, with the reason


def test_scores_are_the_expected_ones(graded):
    for s in graded["students"]:
        cells, total, max_total = graded["parallel"][s.id]
        for test_id, expected in s.expected.items():
            assert cells[test_id] == pytest.approx(expected), (s.id, s.kind, test_id, cells)
        assert total == pytest.approx(sum(s.expected.values())), (s.id, s.kind)
        assert max_total > 0


def test_parallel_grades_equal_sequential_grades_and_reruns(graded):
    assert graded["parallel"] == graded["sequential"]
    # the run that had nothing to do says so (it used to say "graded 13 students")
    assert graded["kept_words"].splitlines()[0] == (
        f"{graded['assignment']}: nothing new to grade; {len(graded['students'])} students already graded with these "
        "notebooks, course and limits (`--force` grades them again)")
    assert "REJECTED s13 03_self_attention: rejected at collect:" in graded["kept_words"]  # the summary names it
    # a second run without --force keeps every grade and report: nothing was missing
    assert graded["kept"] == graded["parallel"]
    assert graded["kept_reports"] == graded["parallel_reports"]
    # the second run's reports give the same scores and the same problems
    course, a = graded["course"], graded["assignment"]
    for s in graded["students"]:
        first, again = graded["parallel_reports"][s.id], read_json(course.report_path(a, s.id))
        assert first["score"] == again["score"]
        kinds = lambda r: sorted(p["kind"] for n in r["notebooks"].values() for p in n["problems"])
        assert kinds(first) == kinds(again), s.id


def test_every_bad_submission_is_reported_with_its_reason(graded):
    course, a, nb = graded["course"], graded["assignment"], graded["notebook"]
    for s in graded["students"]:
        report = read_json(course.report_path(a, s.id))
        record = report["notebooks"][nb]
        problems = record["problems"] + report["collect"]
        kinds = {p["kind"] for p in problems}
        text = " ".join(p["message"] for p in problems)
        for want in s.problems:
            if want.startswith("error:"):
                assert want.split(":")[1] in text, (s.id, s.kind, problems)
            else:
                assert want in kinds, (s.id, s.kind, problems)
        if s.kind in ("correct", "partial (zip)", "mistake"):
            assert not problems, (s.id, problems)
        assert record["status"] == ("failed" if s.kind.startswith(("invalid JSON", "rejected")) else "graded"), s.id
    s09 = read_json(course.report_path(a, "s09"))["notebooks"][nb]["problems"]
    assert any("exit code 3" in p["message"] for p in s09)
    s12 = read_json(course.report_path(a, "s12"))["notebooks"][nb]["problems"]
    assert any("SIGSEGV" in p["message"] for p in s12)
    # a notebook nested too deeply for json.loads is rejected alone, at collect (it used to stop
    # collect and autograde for everyone): 0 points, with the reason
    s13 = read_json(course.report_path(a, "s13"))["notebooks"][nb]["problems"]
    assert [p["kind"] for p in s13] == ["rejected"], s13
    assert "levels deep, over the limit of 64" in s13[0]["message"], s13


def test_students_code_runs_outside_the_course_in_grading_mode(graded):
    course, a, nb = graded["course"], graded["assignment"], graded["notebook"]
    text = course.autograded_path("s01", a, nb).read_text()
    line = next(l for l in text.split("\\n") if "working directory:" in l)
    cwd = line.split("working directory:")[1].split('"')[0].strip()
    assert cwd and not Path(cwd).resolve().is_relative_to(course.root.resolve())
    assert "grading mode: True" in text  # WORKBOOK_GRADING=1 reached the kernel
    printed = course.autograded_path("s11", a, nb).read_text()
    assert len(printed) < 2_000_000 and "output truncated" in printed


def test_an_output_flood_costs_its_student_nothing_but_the_output(graded):
    """s11 floods its output as fast as it can: the cell ends by itself within its time limit
    (no timeout, the notebook graded in full) and only the output is cut."""
    course, a, nb = graded["course"], graded["assignment"], graded["notebook"]
    record = read_json(course.report_path(a, "s11"))["notebooks"][nb]
    assert {p["kind"] for p in record["problems"]} == {"output_truncated"}, record["problems"]
    s11 = next(s for s in graded["students"] if s.id == "s11")
    for run in ("parallel", "sequential"):
        cells = graded[run]["s11"][0]
        assert {t: cells[t] for t in s11.expected} == pytest.approx(s11.expected), (run, cells)


def test_feedback_shows_results_and_hints_but_no_hidden_tests(graded):
    course, a, nb = graded["course"], graded["assignment"], graded["notebook"]
    assert main(["--course", str(course.root), "feedback", a]) == 0
    from course_lib.grading import get_spec
    builder = graded["builder"]
    mistaken_item = next(i for i in builder.items if get_spec(i).mistakes)
    hint = get_spec(mistaken_item).mistakes[0].hint
    flooded = (course.feedback_dir / "s11" / a / f"{nb}.html").read_text(encoding="utf-8")
    assert "output truncated" in flooded and len(flooded) < 2_000_000  # the flood's page: its output cut
    for s in graded["students"]:
        page = (course.feedback_dir / s.id / a / f"{nb}.html").read_text(encoding="utf-8")
        assert "BEGIN HIDDEN TESTS" not in page and "hidden=True" not in page, s.id
        if s.kind == "correct":
            # the grader's own report, one line per graded item, with its points
            for item in builder.items:
                points = get_spec(item).points
                assert f"✓ {item}: {points:g}/{points:g} points" in html.unescape(page), (s.id, item)
            # and the test cell's result says what it is
            graded_nb = nbformat.read(str(course.autograded_path(s.id, a, nb)), as_version=4)
            shown = [o.data["text/plain"] for c in graded_nb.cells if c.cell_type == "code"
                     for o in c.get("outputs", []) if o.output_type == "execute_result"
                     and c.metadata.get("nbgrader", {}).get("grade_id", "").startswith("test_")]
            full = [f"{get_spec(i).points:g} / {get_spec(i).points:g} points" for i in builder.items]
            assert sorted(shown) == sorted(full), (s.id, shown)
        if s.kind == "mistake":
            assert html.escape(hint[:40]) in page or hint[:40] in page
        if s.kind.startswith("invalid JSON"):
            assert "could not be graded" in page and "not valid notebook JSON" in page
        if s.kind.startswith("rejected"):
            assert "could not be graded" in page and "rejected at collect" in page
        if s.kind == "infinite loop":
            assert "15 s limit" in page


def test_export_and_status(graded, capsys):
    course, a, nb = graded["course"], graded["assignment"], graded["notebook"]
    out = course.root / "grades.csv"
    assert main(["--course", str(course.root), "export", "-o", str(out)]) == 0
    rows = {r["student"]: r for r in csv.DictReader(io.StringIO(out.read_text()))}
    for s in graded["students"]:
        assert float(rows[s.id][f"{a}/{nb}"]) == pytest.approx(sum(s.expected.values()))
        assert float(rows[s.id]["total"]) == pytest.approx(sum(s.expected.values()))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                       os.environ.get("PYTHONPATH", "")]))
    status = subprocess.run([sys.executable, "-m", "autograder.cli", "--course", str(course.root), "status"],
                            capture_output=True, text=True, env=env, check=True).stdout
    for s in graded["students"]:
        assert s.id in status
    assert "s05" in status and "FAILED" in status
    assert "[cell_timeout]" in status and "[kernel_died]" in status
