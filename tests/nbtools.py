"""Helpers for tests that execute notebooks and run nbgrader end to end.

- ``execute(path)`` runs a notebook top to bottom in a fresh kernel (working directory
  outside the repository) and returns the executed notebook and its wall time.
- ``cell(nb, grade_id)``, ``text(cell)``, ``result(cell)`` read what a cell printed;
  ``all_text(nb)`` what the whole notebook printed.
- ``Course`` is a throw-away nbgrader course: the repository's solutions are copied in,
  ``generate()`` releases them, ``submit(student, notebook)`` adds a submission,
  ``autograde()`` grades everything with the real nbgrader command line, ``scores()``
  reads the gradebook and ``feedback_html(student)`` the generated feedback.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from conftest import NOTEBOOK_TIMES, ROOT
from course_lib.notebook_client import NotebookClient  # (nbclient's, without its stalls on Output widgets)

PYTHON_BIN = Path(sys.executable).parent


def kernel_env(grading: bool = False) -> dict[str, str]:
    """Environment for kernels and nbgrader: the repository importable, Agg plots."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    env["PATH"] = str(PYTHON_BIN) + os.pathsep + env.get("PATH", "")
    env["PYTHONWARNINGS"] = "ignore::DeprecationWarning"
    if grading:
        env["WORKBOOK_GRADING"] = "1"
    else:
        env.pop("WORKBOOK_GRADING", None)
    return env


def execute(path: Path, timeout: int = 600, grading: bool = False) -> tuple[nbformat.NotebookNode, float]:
    """Execute a notebook (errors kept in the outputs); return it and its wall time."""
    nb = nbformat.read(str(path), as_version=4)
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "MPLBACKEND", "WORKBOOK_GRADING")}
    os.environ.update({k: v for k, v in kernel_env(grading).items() if k in saved})
    if not grading:
        os.environ.pop("WORKBOOK_GRADING", None)
    try:
        with tempfile.TemporaryDirectory(prefix="workbook-run-") as cwd:
            client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                                    resources={"metadata": {"path": cwd}})
            start = time.perf_counter()
            client.execute()
            seconds = time.perf_counter() - start
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    path = Path(path)
    NOTEBOOK_TIMES[f"{path.parent.parent.name}/{path.parent.name}/{path.name}"
                   + (" (grading mode)" if grading else "")] = seconds
    return nb, seconds


def grade_id(c) -> str | None:
    return c.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def cell(nb, gid: str):
    for c in nb.cells:
        if grade_id(c) == gid:
            return c
    raise KeyError(f"no cell with grade_id {gid!r}")


def text(c) -> str:
    """Everything a code cell printed (stdout and stderr streams, errors)."""
    parts = []
    for o in c.get("outputs", []):
        if o.output_type == "stream":
            parts.append(o.text)
        elif o.output_type == "error":
            parts.append(f"{o.ename}: {o.evalue}")
    return "".join(parts)


def stderr(c) -> str:
    return "".join(o.text for o in c.get("outputs", []) if o.output_type == "stream" and o.name == "stderr")


def errors(nb) -> list[str]:
    """``'cell N: Name: message'`` for every cell that raised."""
    out = []
    for i, c in enumerate(nb.cells):
        for o in c.get("outputs", []):
            if o.output_type == "error":
                out.append(f"cell {i}: {o.ename}: {o.evalue}")
    return out


def all_text(nb) -> str:
    """Everything the code cells of an executed notebook printed."""
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))


def result(c) -> str | None:
    """The text/plain of a code cell's execute_result (what nbgrader reads for points)."""
    for o in c.get("outputs", []):
        if o.output_type == "execute_result":
            return o.data.get("text/plain")
    return None


def graded_cells(nb) -> list:
    return [c for c in nb.cells if c.get("metadata", {}).get("nbgrader", {}).get("grade") and c.cell_type == "code"]


def replace_solution(nb, gid: str, source: str):
    """A copy of ``nb`` whose cell ``gid`` has the given source (a student's answer)."""
    new = copy.deepcopy(nb)
    cell(new, gid).source = source
    return new


class Course:
    """A temporary nbgrader course built from the repository's solutions (removed by
    ``close``; with ``keep``, left for another process to use and remove)."""

    def __init__(self, assignments: list[str], keep: bool = False):
        self.root = Path(tempfile.mkdtemp(prefix="workbook-course-"))
        self.keep = keep
        self.assignments = assignments
        shutil.copy(ROOT / "nbgrader_config.py", self.root / "nbgrader_config.py")
        for a in assignments:
            shutil.copytree(ROOT / "solutions" / a, self.root / "solutions" / a)

    @classmethod
    def existing(cls, root: Path, assignments: list[str]) -> "Course":
        """A course another process made (the shared graded class): never removed here."""
        course = cls.__new__(cls)
        course.root, course.keep, course.assignments = Path(root), True, list(assignments)
        return course

    def close(self) -> None:
        if not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)

    def nbgrader(self, *args: str, timeout: int = 1800) -> subprocess.CompletedProcess:
        cmd = [str(PYTHON_BIN / "nbgrader"), *args]
        proc = subprocess.run(cmd, cwd=self.root, env=kernel_env(grading=True), capture_output=True,
                              text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        return proc

    def generate(self, assignment: str) -> Path:
        self.nbgrader("db", "assignment", "add", assignment)
        self.nbgrader("generate_assignment", assignment, "--force")
        return self.root / "notebooks" / assignment

    def released(self, assignment: str, notebook: str | None = None):
        notebook = notebook or assignment
        return nbformat.read(str(self.root / "notebooks" / assignment / f"{notebook}.ipynb"), as_version=4)

    def submit(self, student: str, assignment: str, nb, notebook: str | None = None, raw: str | None = None,
               register: bool = True) -> None:
        """Add a submission; ``raw`` writes the file's text as is (e.g. broken JSON).
        ``register=False`` leaves the student out of the gradebook (``workbook autograde``
        adds the students it grades)."""
        notebook = notebook or assignment
        folder = self.root / "grading" / "submitted" / student / assignment
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{notebook}.ipynb"
        if raw is not None:
            path.write_text(raw)
        else:
            nbformat.write(nb, str(path))
        (folder / "timestamp.txt").write_text("2026-11-21 09:00:00.000000 UTC")
        if register:
            self.nbgrader("db", "student", "add", student)

    def workbook(self, *args: str, timeout: int = 3000) -> subprocess.CompletedProcess:
        """Run the instructor's ``workbook`` command on this course."""
        cmd = [sys.executable, "-m", "autograder.cli", "--course", str(self.root), *args]
        proc = subprocess.run(cmd, env=kernel_env(grading=False), capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        return proc

    def autograde(self, assignment: str) -> subprocess.CompletedProcess:
        return self.nbgrader("autograde", assignment, "--force")

    def scores(self, assignment: str) -> dict[str, dict[str, float]]:
        """``{student: {"code": code_score, "test_<item>": points, ...}}`` from the gradebook."""
        from nbgrader.api import Gradebook

        out: dict[str, dict[str, float]] = {}
        with Gradebook(f"sqlite:///{self.root / 'grading' / 'gradebook.db'}") as gb:
            for sub in gb.assignment_submissions(assignment):
                row = {"code": sub.code_score}
                for nb in sub.notebooks:
                    for grade in nb.grades:
                        if grade.cell_type == "code":
                            row[grade.name] = grade.score
                out[sub.student.id] = row
        return out

    def autograded(self, student: str, assignment: str, notebook: str | None = None):
        notebook = notebook or assignment
        path = self.root / "grading" / "autograded" / student / assignment / f"{notebook}.ipynb"
        return nbformat.read(str(path), as_version=4)

    def generate_feedback(self, assignment: str) -> None:
        """Feedback HTML for every student of ``assignment`` (one nbgrader run)."""
        self.nbgrader("generate_feedback", assignment, "--force")

    def feedback_html(self, student: str, assignment: str, notebook: str | None = None) -> str:
        notebook = notebook or assignment
        return (self.root / "grading" / "feedback" / student / assignment / f"{notebook}.html").read_text()


def edited(sources: dict[str, str], item: str, old: str, new: str) -> str:
    """A wrong answer for a test: the solution of ``item`` in ``sources`` (from
    :func:`solution_sources`) with ``old`` replaced by ``new``; fails if ``old`` is not in it."""
    assert old in sources[item], f"{old!r} not in the solution of {item}"
    return sources[item].replace(old, new)


def solution_sources(assignment: str, notebook: str | None = None) -> dict[str, str]:
    """``{grade_id: source}`` of the solution cells of a solutions/ notebook."""
    notebook = notebook or assignment
    nb = json.loads((ROOT / "solutions" / assignment / f"{notebook}.ipynb").read_text())
    out = {}
    for c in nb["cells"]:
        meta = c.get("metadata", {}).get("nbgrader", {})
        if meta.get("solution") and c["cell_type"] == "code":
            lines = "".join(c["source"]).splitlines()
            keep = [line for line in lines if line.strip() not in ("### BEGIN SOLUTION", "### END SOLUTION")]
            out[meta["grade_id"]] = "\n".join(keep) + "\n"
    return out


_EXECUTED: dict[tuple[str, bool], tuple[nbformat.NotebookNode, float]] = {}


def executed_solution(assignment: str, student: bool = False) -> tuple[nbformat.NotebookNode, float]:
    """The solution (or student) notebook of ``assignment`` executed once per test session.

    Tests that assert on a notebook's outputs (quality numbers, plots, test cells) share
    this run instead of executing the notebook again. The student notebook runs in
    grading mode (short training): what matters there is that every cell runs and the
    test cells report the stubs.
    """
    key = (assignment, student)
    if key not in _EXECUTED:
        folder = "notebooks" if student else "solutions"
        path = ROOT / folder / assignment / f"{assignment}.ipynb"
        _EXECUTED[key] = execute(path, grading=student)
    return _EXECUTED[key]


def assert_solution_full_points(assignment: str) -> None:
    """The solution notebook runs top to bottom without an error, every graded test cell
    at full points, shown as JupyterLab shows it, and nothing on stderr."""
    nb, seconds = executed_solution(assignment)
    assert not errors(nb), errors(nb)
    cells = graded_cells(nb)
    assert cells, f"{assignment}: no graded test cells"
    for c in cells:
        gid = c.metadata.nbgrader.grade_id
        points = float(c.metadata.nbgrader.points)
        assert result(c) is not None and float(result(c)) == points, f"{gid}: {text(c)}"
        shown = next(o.data.get("text/markdown") for o in c.outputs if o.output_type == "execute_result")
        assert shown == f"**{points:g} / {points:g} points**", shown
        assert stderr(c) == "", f"{gid} wrote to stderr: {stderr(c)}"


def assert_student_notebook_reports_stubs(assignment: str) -> None:
    """The released notebook runs top to bottom too: every graded test cell reports its
    stub at 0 points (no crash, no traceback, nothing on stderr)."""
    nb, seconds = executed_solution(assignment, student=True)
    assert not errors(nb), "a cell crashed in the released notebook: " + "; ".join(errors(nb))
    cells = graded_cells(nb)
    assert cells, f"{assignment}: no graded test cells"
    for c in cells:
        gid = c.metadata.nbgrader.grade_id
        assert float(result(c)) == 0.0, gid
        assert "NotImplementedError" in text(c) and "stub" in text(c), f"{gid}: {text(c)}"
        assert stderr(c) == "", f"{gid} wrote to stderr: {stderr(c)}"


def exec_solution_cells(assignment: str) -> dict:
    """Run only the set-up cell and the solution cells of a solutions/ notebook.

    Returns the namespace holding the solution's functions and classes (fast: no
    demonstrations, no training).
    """
    nb = json.loads((ROOT / "solutions" / assignment / f"{assignment}.ipynb").read_text())
    namespace: dict = {"__name__": f"solution_{assignment}"}
    for c in nb["cells"]:
        meta = c.get("metadata", {}).get("nbgrader", {})
        if c["cell_type"] != "code":
            continue
        if meta.get("solution") or (meta.get("locked") and not meta.get("grade")):
            exec(compile("".join(c["source"]), f"<{assignment}:{meta.get('grade_id')}>", "exec"), namespace)
    return namespace


# ---------------------------------------------------------------------------
# The graded class: every notebook's submissions graded in one `workbook autograde` run
# ---------------------------------------------------------------------------

# assignment -> {student: notebook}; filled when the test modules are imported
CLASS: dict[str, dict[str, nbformat.NotebookNode]] = {}


def filled(assignment: str, cells: dict[str, str] | None) -> nbformat.NotebookNode:
    """The released notebook with the correct answers, except ``cells`` (``{grade_id:
    source}``); ``cells=None`` leaves the stubs as released."""
    nb = nbformat.read(str(ROOT / "notebooks" / assignment / f"{assignment}.ipynb"), as_version=4)
    if cells is None:
        return nb
    for gid, source in {**solution_sources(assignment), **cells}.items():
        nb = replace_solution(nb, gid, source)
    return nb


def register(assignment: str, students: dict[str, nbformat.NotebookNode]) -> None:
    """Add submissions to the class graded once per test session (see ``graded_class``)."""
    for student, nb in students.items():
        if student in CLASS.setdefault(assignment, {}):
            raise ValueError(f"{assignment}: student {student!r} registered twice")
        CLASS[assignment][student] = nb


class GradedClass:
    """The shared graded course: every registered submission, graded by ``workbook
    autograde -j 2`` in one run, with feedback written."""

    def __init__(self, keep: bool = False) -> None:
        self.course = Course(sorted(CLASS), keep=keep)
        self.log = ""
        try:
            for assignment in sorted(CLASS):
                self.course.workbook("release", assignment)
                for student, nb in CLASS[assignment].items():
                    self.course.submit(student, assignment, nb, register=False)
            self.before = snapshot([self.course.root / "solutions", self.course.root / "nbgrader_config.py",
                                    self.course.root / "notebooks", ROOT / "course_lib", ROOT / "autograder"])
            start = time.perf_counter()
            proc = self.course.workbook("autograde", *sorted(CLASS), "-j", "2", "--cell-timeout", "60",
                                        "--notebook-timeout", "400", "--memory-mb", "3072", "--quiet",
                                        timeout=5400)  # a busy machine's pace: CI's own limit is 90 minutes
            self.seconds = time.perf_counter() - start
            self.log = proc.stdout + proc.stderr
            self.course.workbook("feedback", *sorted(CLASS), "-j", "2")
            self._scores = {a: self.course.scores(a) for a in CLASS}
            self.submission_seconds = self._submission_seconds()
        except BaseException:
            shutil.rmtree(self.course.root, ignore_errors=True)
            raise

    def scores(self, assignment: str) -> dict[str, dict[str, float]]:
        return self._scores[assignment]

    def _submission_seconds(self) -> dict[str, float]:
        """``{"assignment/student": seconds}`` from the run's reports (where the time went)."""
        out = {}
        for path in (self.course.root / "grading" / "reports").glob("*/*.json"):
            if path.name.startswith("_"):
                continue
            report = json.loads(path.read_text())
            seconds = [n.get("seconds") or 0.0 for n in report.get("notebooks", {}).values()]
            out[f"{path.parent.name}/{path.stem}"] = sum(seconds)
        return out

    def close(self) -> None:
        self.course.close()


def snapshot(paths: list[Path]) -> dict[str, str]:
    """A hash of every file under ``paths`` (to show nothing changed them)."""
    import hashlib
    out = {}
    for root in paths:
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file()
                                                      and "__pycache__" not in p.parts)
        for p in files:
            out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def assert_scores(scores: dict, student: str, items: tuple[str, ...], expected: tuple) -> None:
    """The student's points per test cell are exactly ``expected`` (an entry that is a frozenset:
    one of those, where a hidden input drawn from the grading's salt may or may not meet the
    student's mistake), and their sum is the code score."""
    got = tuple(scores[student][f"test_{item}"] for item in items)
    assert all(g in e if isinstance(e, frozenset) else g == e for g, e in zip(got, expected, strict=True)), \
        f"{student}: {dict(zip(items, got))}"
    assert scores[student]["code"] == sum(got)


def assert_feedback_says(course: Course, assignment: str, student: str, fragments) -> None:
    """The student's feedback page contains every fragment (a string or a tuple of them)."""
    import html

    page = html.unescape(course.feedback_html(student, assignment))
    for fragment in (fragments,) if isinstance(fragments, str) else fragments:
        assert fragment in page, f"feedback for {student} does not say {fragment!r}"


def assert_reports_not_tracebacks(course: Course, assignment: str, student: str, grade_ids) -> None:
    """In the student's autograded notebook, each of the test cells ``grade_ids`` shows a
    report naming the likely cause of the mistake, not a traceback or an error output."""
    nb = course.autograded(student, assignment)
    for gid in grade_ids:
        c = cell(nb, gid)
        out = text(c)
        assert "Likely cause:" in out and "Traceback" not in out, f"{student} {gid}: {out}"
        assert not any(o.output_type == "error" for o in c.outputs), f"{student} {gid}"


def assert_feedback_is_clean(course: Course, assignment: str, student: str) -> None:
    """A correct student's feedback page shows the notebook's figures and no traceback or path
    of the sandbox's: a cell that cannot run while the notebook is graded says so in one line."""
    import html

    page = html.unescape(course.feedback_html(student, assignment))
    assert "Traceback (most recent call last)" not in page, page[page.find("Traceback (most recent"):][:3000]
    assert "/opt/course" not in page and "/opt/workbook" not in page, page[page.find("/opt/") - 2000:][:3000]
    assert "<img" in page, f"{student}: no figure on the page"


def nbgrader_suite(assignment: str, submissions: dict[str, tuple], items: tuple[str, ...]):
    """The end-to-end grading tests every notebook gets. ``submissions[student]`` is
    ``(cells, points, fragments)``: the cells that differ from the correct answers
    (``{grade_id: source}``, or ``None`` for the released stubs), the expected points per
    item of ``items``, and a fragment (or tuple) the feedback must show, or None.

    The submissions join the session's graded class (one ``workbook autograde`` run for
    every notebook). Returns ``(graded, test_exact_scores, test_feedback_names_the_mistake,
    test_a_correct_submission_has_no_problems, test_a_correct_submissions_feedback_is_clean)``:
    assign them to names of the test module (``graded`` is the fixture ``(course, scores)``).
    """
    import pytest

    register(assignment, {student: filled(assignment, cells) for student, (cells, *_rest) in submissions.items()})

    @pytest.fixture(scope="module")
    def graded(graded_class):
        return graded_class.course, graded_class.scores(assignment)

    @pytest.mark.parametrize("student", list(submissions))
    def test_exact_scores(graded, student):
        assert_scores(graded[1], student, items, submissions[student][1])

    @pytest.mark.parametrize("student", [s for s in submissions if submissions[s][2]])
    def test_feedback_names_the_mistake(graded, student):
        assert_feedback_says(graded[0], assignment, student, submissions[student][2])

    @pytest.mark.skipif("correct" not in submissions, reason="no correct submission in this suite")
    def test_a_correct_submission_has_no_problems(graded):
        report = json.loads(graded[0].root.joinpath("grading", "reports", assignment, "correct.json").read_text())
        problems = [p for n in report["notebooks"].values() for p in n["problems"]]
        assert problems == [], problems

    @pytest.mark.skipif("correct" not in submissions, reason="no correct submission in this suite")
    def test_a_correct_submissions_feedback_is_clean(graded):
        assert_feedback_is_clean(graded[0], assignment, "correct")

    return (graded, test_exact_scores, test_feedback_names_the_mistake, test_a_correct_submission_has_no_problems,
            test_a_correct_submissions_feedback_is_clean)
