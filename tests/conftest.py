"""Shared fixtures and the notebook-timing summary printed at the end of a run."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent

# Notebook wall times collected by tests/nbtools.py, reported at the end of the run.
NOTEBOOK_TIMES: dict[str, float] = {}


def pytest_configure(config):
    os.environ.setdefault("MPLBACKEND", "Agg")
    config._workbook_times = NOTEBOOK_TIMES
    if not hasattr(config, "workerinput"):  # the session's own process (xdist's controller, or the only one)
        import tempfile
        from graded_class import SHARED
        os.environ[SHARED] = tempfile.mkdtemp(prefix="workbook-graded-class-")  # the workers inherit it
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # Two workers share the machine's cores (and the graded class's graders run beside
        # them): one thread each, for this process and the kernels it starts. Two threads
        # per process on a loaded 2-core machine made training steps up to 10x slower.
        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)


WORKER_NICENESS = 5  # the xdist workers' scheduling priority, below the graded class's builder (0)
GRADED_CLASS_TIMES: dict[str, float] = {}  # "assignment/student" -> seconds in the shared graded run
TESTS = Path(__file__).resolve().parent


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected what will not run
def pytest_collection_modifyitems(config, items):
    """The tests that need the graded class run last, and the class starts grading now, in a
    process of its own (tests/graded_class.py), while the others run. With pytest-xdist's
    ``--dist loadfile`` both workers collect the same order; the first to get here starts the
    one builder."""
    import python_envs
    from graded_class import SHARED, start

    shared = Path(os.environ[SHARED])
    needing = [item for item in items if "graded_class" in getattr(item, "fixturenames", ())]
    # the other Pythons' environments (tests/python_envs.py) are made meanwhile too, and waited for last
    pythons = [item for item in items if Path(str(item.fspath)).name.startswith("test_python_")
               and item not in set(needing)]
    if pythons and not config.option.collectonly:
        python_envs.start(shared)
    items[:] = [item for item in items if item not in set(needing) | set(pythons)] + needing + pythons
    if needing and not config.option.collectonly:
        start(shared, sorted({Path(str(item.fspath)) for item in needing}))
    if os.environ.get("PYTEST_XDIST_WORKER") and not config.option.collectonly:
        # The graded class is the run's critical path (its tests run last and wait for it): its
        # builder, started above at this worker's priority, goes first when the cores are busy;
        # the workers, and the kernels and graders they start, yield to it.
        os.nice(max(0, WORKER_NICENESS - os.nice(0)))


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
    layers: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, "when", None) in ("setup", "call", "teardown"):
                parts = report.nodeid.split("::")[0].split("/")
                layer = "/".join(parts[:2]) if len(parts) > 2 else parts[0]
                layers[layer] = layers.get(layer, 0.0) + report.duration
    if layers:
        terminalreporter.section("test time by layer (summed over workers)")
        for layer, seconds in sorted(layers.items()):
            terminalreporter.write_line(f"{seconds / 60:6.1f} min  {layer}")
    if NOTEBOOK_TIMES:
        terminalreporter.section("notebook wall times")
        for name, seconds in sorted(NOTEBOOK_TIMES.items()):
            terminalreporter.write_line(f"{seconds:7.1f} s  {name}")
    if GRADED_CLASS_TIMES:
        total = sum(GRADED_CLASS_TIMES.values())
        terminalreporter.section(f"graded class: {len(GRADED_CLASS_TIMES)} submissions, {total:.0f} s of grading")
        for name, seconds in sorted(GRADED_CLASS_TIMES.items(), key=lambda kv: -kv[1])[:15]:
            terminalreporter.write_line(f"{seconds:7.1f} s  {name}")


def pytest_unconfigure(config):
    """The session's own process removes the graded class when every worker is done."""
    if hasattr(config, "workerinput"):
        return
    import json
    import shutil
    import python_envs
    from graded_class import SHARED, stop
    shared = Path(os.environ.get(SHARED, ""))
    if not os.environ.get(SHARED) or not shared.is_dir():
        return
    stop(shared)
    python_envs.stop(shared)
    if (shared / "state.json").exists():
        shutil.rmtree(json.loads((shared / "state.json").read_text())["root"], ignore_errors=True)
    shutil.rmtree(shared, ignore_errors=True)


@pytest.fixture(scope="session")
def graded_class():
    """Every registered submission of every notebook (tests/nbtools.py ``register``),
    graded in one ``workbook autograde -j 2`` run, with feedback: built once per session in
    the background (tests/graded_class.py), shared by every worker."""
    from graded_class import SHARED, wait

    graded = wait(Path(os.environ[SHARED]))
    GRADED_CLASS_TIMES.update(graded.submission_seconds)
    return graded


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
