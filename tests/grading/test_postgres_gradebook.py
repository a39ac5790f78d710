"""A PostgreSQL gradebook: a real server started in a temporary folder (tests/servers.py).

A course whose ``nbgrader_config.py`` sets ``db_url = "postgresql://..."`` is released,
two assignments (notebook 03, and the same notebook as a resit) are autograded by two
``workbook autograde`` processes at the same time, then exported and tabulated with
``workbook`` and listed by plain nbgrader. Skipped only where no server is installed.
"""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
import sys

import nbformat
import pytest

from autograder.cli import main
from autograder.course import Course
from nbtools import kernel_env
from servers import BIN, PostgresServer, postgres_bin
from workbook_class import ClassBuilder, make_course

NOTEBOOK = "03_self_attention"
RESIT = "03_resit"
LIMITS = ["--cell-timeout", "30", "--notebook-timeout", "240", "--memory-mb", "2048", "--quiet", "-j", "1"]


def _set_db_url(root, url: str) -> None:
    with open(root / "nbgrader_config.py", "a") as f:
        f.write(f"\nc.CourseDirectory.db_url = {url!r}\n")


@pytest.fixture(scope="module")
def postgres_class(tmp_path_factory):
    bin_dir, why = postgres_bin()
    if bin_dir is None:
        pytest.skip(why)
    base = tmp_path_factory.mktemp("postgres")
    root, assignment = make_course(base / "course", NOTEBOOK)
    (root / "solutions" / RESIT).mkdir()
    shutil.copy(root / "solutions" / NOTEBOOK / f"{NOTEBOOK}.ipynb", root / "solutions" / RESIT)
    with PostgresServer(bin_dir) as server:
        _set_db_url(root, server.url)
        course = Course(root)
        assert course.db_url == server.url
        assert main(["--course", str(root), "release"]) == 0
        builder = ClassBuilder(course.release_dir / NOTEBOOK / f"{NOTEBOOK}.ipynb",
                               course.source_dir / NOTEBOOK / f"{NOTEBOOK}.ipynb")
        for a in (NOTEBOOK, RESIT):
            for student, nb in {"correct": builder.filled(), "empty": builder.released}.items():
                folder = course.submission_dir(student, a)
                folder.mkdir(parents=True)
                nbformat.write(nb, str(folder / f"{NOTEBOOK}.ipynb"))
        # two instructors, two assignments, one gradebook, at the same time
        runs = [subprocess.Popen([sys.executable, "-m", "autograder.cli", "--course", str(root), "autograde", a,
                                  *LIMITS], env=kernel_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True) for a in (NOTEBOOK, RESIT)]
        outputs = [run.communicate(timeout=900) for run in runs]
        state = {"course": course, "builder": builder, "codes": [run.returncode for run in runs],
                 "outputs": outputs}
        export = main(["--course", str(root), "export", "-o", str(base / "grades.csv")])
        state["export_rc"], state["csv"] = export, (base / "grades.csv").read_text()
        state["status_rc"] = main(["--course", str(root), "status"])
        state["nbgrader"] = subprocess.run([str(BIN / "nbgrader"), "db", "student", "list"], cwd=root,
                                           env=kernel_env(), capture_output=True, text=True, timeout=300)
        with course.gradebook() as gb:
            state["scores"] = {(sub.assignment.name, sub.student.id): sub.score
                               for a in (NOTEBOOK, RESIT) for sub in gb.assignment_submissions(a)}
        # a dry run of a regrade leaves every row as it was; a regrade of one student writes there
        before = _rows(server.url)
        state["dry"] = subprocess.run([sys.executable, "-m", "autograder.cli", "--course", str(root), "regrade",
                                       NOTEBOOK, "--dry-run", *LIMITS], env=kernel_env(), capture_output=True,
                                      text=True, timeout=900)
        state["rows"] = (before, _rows(server.url))
        state["regrade"] = subprocess.run([sys.executable, "-m", "autograder.cli", "--course", str(root), "regrade",
                                           RESIT, "-s", "correct", *LIMITS], env=kernel_env(), capture_output=True,
                                          text=True, timeout=900)
        state["history"] = subprocess.run([sys.executable, "-m", "autograder.cli", "--course", str(root), "status",
                                           "--history", "correct", RESIT], env=kernel_env(), capture_output=True,
                                          text=True, timeout=300)
        yield state


def _rows(url: str) -> dict[str, list]:
    """Every row of every table of the gradebook (nbgrader's and the history of grades)."""
    from nbgrader.api import Base
    from sqlalchemy import create_engine, inspect, select
    from autograder.course.history import TABLES

    engine = create_engine(url)
    try:
        with engine.connect() as db:
            present = set(inspect(db).get_table_names())
            return {t.name: sorted(map(tuple, db.execute(select(t)).all()), key=repr)
                    for t in [*Base.metadata.sorted_tables, *TABLES] if t.name in present}
    finally:
        engine.dispose()


@pytest.mark.slow
def test_a_dry_run_regrade_leaves_every_row_of_the_postgres_gradebook(postgres_class):
    dry = postgres_class["dry"]
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "2 submissions regraded, 0 items would change" in dry.stdout
    before, after = postgres_class["rows"]
    assert before == after and before["grade"] and before["workbook_grade_history"]


@pytest.mark.slow
def test_a_regrade_on_postgresql_records_the_history_of_each_grade(postgres_class):
    run, history = postgres_class["regrade"], postgres_class["history"]
    assert run.returncode == 0 and "1 submissions regraded, 0 items changed" in run.stdout, run.stdout + run.stderr
    lines = [line for line in history.stdout.splitlines() if "test_causal_mask" in line]
    assert len(lines) == 2 and "autograde" in lines[0] and "regrade" in lines[1], history.stdout


@pytest.mark.slow
def test_concurrent_autograde_runs_on_different_assignments_lose_nothing(postgres_class):
    assert postgres_class["codes"] == [0, 0], postgres_class["outputs"]
    full = sum(postgres_class["builder"].full().values())
    assert full > 0
    assert postgres_class["scores"] == {(a, s): (full if s == "correct" else 0.0)
                                        for a in (NOTEBOOK, RESIT) for s in ("correct", "empty")}


@pytest.mark.slow
def test_export_and_status_read_the_postgres_gradebook(postgres_class, capsys):
    assert postgres_class["export_rc"] == 0 and postgres_class["status_rc"] == 0
    rows = {r["student"]: r for r in csv.DictReader(io.StringIO(postgres_class["csv"]))}
    assert sorted(rows) == ["correct", "empty"]
    full = sum(postgres_class["builder"].full().values())
    assert float(rows["correct"]["total"]) == 2 * full and float(rows["empty"]["total"]) == 0


@pytest.mark.slow
def test_plain_nbgrader_reads_the_postgres_gradebook(postgres_class):
    listing = postgres_class["nbgrader"]
    assert listing.returncode == 0, listing.stderr
    assert "correct" in listing.stdout and "empty" in listing.stdout


def test_a_database_url_without_its_driver_is_a_one_line_error(tmp_path, capsys):
    root, _ = make_course(tmp_path / "course", NOTEBOOK)
    _set_db_url(root, "postgresql+asyncpg://grader:secret@127.0.0.1:5432/gradebook")
    assert main(["--course", str(root), "status"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "driver is not installed (asyncpg)" in err
    assert "secret" not in err  # the password is never shown


def test_moving_to_postgresql_is_refused_until_the_gradebook_is_migrated(tmp_path):
    """A course graded on SQLite whose db_url then names a PostgreSQL server: every command
    refuses and names both databases (it used to start an empty gradebook silently); `workbook
    gradebook migrate` copies every row, after which status and export give the same grades."""
    bin_dir, why = postgres_bin()
    if bin_dir is None:
        pytest.skip(why)
    root, assignment = make_course(tmp_path / "course", NOTEBOOK)
    assert main(["--course", str(root), "release", assignment]) == 0
    course = Course(root)
    with course.gradebook() as gb:  # two students graded (the gradebook's rows, as autograde writes them)
        for student, points in (("alice", 2.0), ("bob", 0.5)):
            gb.add_student(student)
            gb.add_submission(assignment, student)
            grade = gb.find_grade("test_causal_mask", NOTEBOOK, assignment, student)
            grade.auto_score = points
            comment = gb.find_comment("q_cost", NOTEBOOK, assignment, student)
            comment.manual_comment = f"see me, {student}"
        gb.db.commit()
    before = subprocess.run([sys.executable, "-m", "autograder.cli", "--course", str(root), "export", "-o",
                             str(tmp_path / "before.csv")], env=kernel_env(), capture_output=True, text=True)
    assert before.returncode == 0, before.stderr
    with PostgresServer(bin_dir) as server:
        _set_db_url(root, server.url)
        refused = subprocess.run([sys.executable, "-m", "autograder.cli", "--course", str(root), "status"],
                                 env=kernel_env(), capture_output=True, text=True)
        assert refused.returncode == 2
        assert refused.stderr.strip() == (
            f"workbook status: the gradebook is now {server.url} (nbgrader_config.py), which is empty, but "
            f"{root / 'grading' / 'gradebook.db'} holds 2 students' grades: run `workbook gradebook migrate` to copy "
            "them over, or move that file away to start the new gradebook empty")
        moved = subprocess.run([sys.executable, "-m", "autograder.cli", "--course", str(root), "gradebook", "migrate"],
                               env=kernel_env(), capture_output=True, text=True)
        assert moved.returncode == 0, moved.stderr
        assert "2 student" in moved.stdout and "2 submitted_assignment" in moved.stdout
        after = subprocess.run([sys.executable, "-m", "autograder.cli", "--course", str(root), "export", "-o",
                                str(tmp_path / "after.csv")], env=kernel_env(), capture_output=True, text=True)
        assert after.returncode == 0, after.stderr
        assert (tmp_path / "after.csv").read_text() == (tmp_path / "before.csv").read_text()
        written = (tmp_path / "after.csv").read_text()
        assert "alice" in written and "2.5" not in written
        assert after.stdout.strip() == f"wrote {tmp_path / 'after.csv'}: 2 rows, {len(written.splitlines()[0].split(','))} columns"
        with Course(root).gradebook() as gb:
            assert gb.find_comment("q_cost", NOTEBOOK, assignment, "bob").manual_comment == "see me, bob"
        again = subprocess.run([sys.executable, "-m", "autograder.cli", "--course", str(root), "gradebook", "migrate"],
                               env=kernel_env(), capture_output=True, text=True)
        assert again.returncode == 2 and "is not empty" in again.stderr
