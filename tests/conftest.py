"""Shared fixtures and the notebook-timing summary printed at the end of a run."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent

# Notebook wall times collected by tests/nbtools.py, reported at the end of the run.
NOTEBOOK_TIMES: dict[str, float] = {}


def pytest_configure(config):
    os.environ.setdefault("MPLBACKEND", "Agg")
    config._workbook_times = NOTEBOOK_TIMES
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # Two workers share the machine's cores (and the graded class's graders run beside
        # them): one thread each, for this process and the kernels it starts. Two threads
        # per process on a loaded 2-core machine made training steps up to 10x slower.
        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)


GRADED_CLASS_TIMES: dict[str, float] = {}  # "assignment/student" -> seconds in the shared graded run

# With pytest-xdist (`make test` runs `pytest -n 2 --dist loadgroup`), tests are handed out
# to workers in groups: every test file that uses the shared graded class in one group (one
# worker grades that class once), every other file whole (module fixtures and a notebook's
# one execution stay in one worker, and the tests of one solution notebook in other files
# join it). xdist's own groups (the ``xdist_group`` mark) do not
# reach its scheduler under pytest 9 (it renames node ids, which pytest 9 no longer lets
# it do), so the grouping is a scheduler of ours.
GRADED_CLASS_GROUP = "graded-class"
TESTS = Path(__file__).resolve().parent


def graded_class_files() -> set[str]:
    """The test files that use the graded class (the fixture, or a suite built on it)."""
    return {path.name for path in TESTS.glob("test_*.py")
            if re.search(r"\bgraded_class\b|\bnbgrader_suite\(", path.read_text(encoding="utf-8"))}


def notebook_groups() -> dict[str, str]:
    """``{"07": "notebook 07", "02": "notebook 01", ...}``: each solution notebook is executed
    once per worker (tests/nbtools.py ``executed_solution``), so the tests that share its run
    (its test_notebook_<nn> file, test_notebooks.py's full-points run) share a group."""
    out = {}
    for path in sorted(TESTS.glob("test_notebook_*.py")):
        numbers = re.findall(r"\d\d", path.stem)
        out.update({nn: f"notebook {numbers[0]}" for nn in numbers})
    return out


def _group(nodeid: str, graded: set[str], notebooks: dict[str, str] | None = None) -> str:
    file = nodeid.split("::")[0]
    name = file.rsplit("/", 1)[-1]
    if name in graded:
        return GRADED_CLASS_GROUP
    notebooks = notebook_groups() if notebooks is None else notebooks
    found = re.match(r"test_notebook_(\d\d)", name) or re.search(r"::test_solution_notebook_\w+\[(\d\d)_", nodeid)
    if found and found.group(1) in notebooks:
        return notebooks[found.group(1)]
    return file


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    graded, notebooks = graded_class_files(), notebook_groups()

    class Grouped(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid, graded, notebooks)

    return Grouped(config, log)


def pytest_collection_modifyitems(config, items):
    """Every test that uses the graded class must sit in a file the scheduler groups with it:
    otherwise two workers would each grade the whole class."""
    graded = graded_class_files()
    stray = sorted({item.nodeid.split("::")[0] for item in items
                    if "graded_class" in getattr(item, "fixturenames", ())
                    and _group(item.nodeid, graded) != GRADED_CLASS_GROUP})
    if stray:
        raise pytest.UsageError(f"{', '.join(stray)} use(s) graded_class without naming it or nbgrader_suite: "
                                "tests/conftest.py's graded_class_files() cannot see it")


def pytest_sessionfinish(session):
    """On an xdist worker: send this worker's timings to the controller."""
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output["workbook_times"] = json.dumps({"notebooks": NOTEBOOK_TIMES, "graded_class": GRADED_CLASS_TIMES})


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """On the xdist controller: gather a finished worker's timings for the summary."""
    times = json.loads(getattr(node, "workeroutput", {}).get("workbook_times", "{}"))
    NOTEBOOK_TIMES.update(times.get("notebooks", {}))
    GRADED_CLASS_TIMES.update(times.get("graded_class", {}))


def pytest_terminal_summary(terminalreporter):
    if NOTEBOOK_TIMES:
        terminalreporter.section("notebook wall times")
        for name, seconds in sorted(NOTEBOOK_TIMES.items()):
            terminalreporter.write_line(f"{seconds:7.1f} s  {name}")
    if GRADED_CLASS_TIMES:
        total = sum(GRADED_CLASS_TIMES.values())
        terminalreporter.section(f"graded class: {len(GRADED_CLASS_TIMES)} submissions, {total:.0f} s of grading")
        for name, seconds in sorted(GRADED_CLASS_TIMES.items(), key=lambda kv: -kv[1])[:15]:
            terminalreporter.write_line(f"{seconds:7.1f} s  {name}")


@pytest.fixture(scope="session")
def graded_class():
    """Every registered submission of every notebook (tests/nbtools.py ``register``),
    graded in one ``workbook autograde -j 2`` run, with feedback."""
    from nbtools import GradedClass

    graded = GradedClass()
    GRADED_CLASS_TIMES.update(graded.submission_seconds)
    yield graded
    graded.close()


@pytest.fixture(scope="session")
def generated_class():
    """Notebook 03 released, 30 generated students with planted mistakes recorded
    (tests/report_class.py), and ``workbook report`` written without and with names."""
    from autograder.course import Course as GradedCourse
    from nbtools import Course
    from report_class import ASSIGNMENT, write_class

    course = Course([ASSIGNMENT])
    try:
        course.workbook("release", ASSIGNMENT)
        students = write_class(GradedCourse(course.root), 30)
        anonymous, named = course.root / "out-anonymous", course.root / "out-named"
        course.workbook("report", "-o", str(anonymous))
        course.workbook("report", "--names", "-o", str(named))
        yield {"course": course, "students": students, "anonymous": anonymous, "named": named}
    finally:
        course.close()


@pytest.fixture
def two_threads():
    """torch on two threads for this test, restored after: a test of code that changes the
    thread count and restores it must not start from the count it sets (one, as xdist's
    workers run)."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield 2
    torch.set_num_threads(before)


@pytest.fixture
def cuda():
    """A CUDA device, or skip the test cleanly."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return torch.device("cuda")


def devices() -> list:
    """CPU always; CUDA when present (as a skipped parameter otherwise)."""
    return ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                 reason="no CUDA device"))]
