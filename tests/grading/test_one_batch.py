"""``workbook autograde A B ...`` grades every assignment in one batch: one set of grading
workers for the whole call (each a Python that imports torch before its first notebook), and a
worker that finishes one assignment's last notebook goes on with the next assignment's first.
Each assignment's grades are the ones it gets alone."""

from __future__ import annotations

import nbformat
import pytest

from autograder.course import Course as GradedCourse
from autograder.pipeline import dispatch as dispatch_module
from autograder.pipeline.autograde import autograde, autograde_assignments
from autograder.pipeline.options import GradingOptions
from autograder.pipeline.pool import WorkerPool
from nbtools import Course, filled

pytestmark = pytest.mark.slow  # two notebooks graded in the sandbox

ASSIGNMENTS = ["03_self_attention", "05_positional_encoding"]
ONE_WORKER = GradingOptions(workers=1)
# the first assignment's notebook leaves what it can for the next job of the same worker (the same
# sandbox user); the second one's looks for it
PLANT = r'''
import os, subprocess
for folder in ("/tmp", "/dev/shm", "/var/tmp", os.path.expanduser("~")):
    try:
        open(os.path.join(folder, "LEFT_BEHIND"), "w").write("x")
    except OSError:
        pass
subprocess.Popen(["sleep", "1000"], start_new_session=True)
'''
PROBE = r'''
import glob, os, subprocess
left = [p for folder in ("/tmp", "/dev/shm", "/var/tmp", os.path.expanduser("~"))
        for p in glob.glob(os.path.join(folder, "LEFT_BEHIND"))]
sleeping = [line for line in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout.splitlines()
            if line.strip() == "sleep 1000"]
print("PROBE", left, sleeping)
'''


@pytest.fixture(scope="module")
def batch():
    """Two assignments handed in by one student (the correct answers in one, the stubs as released in
    the other: a result recorded under the wrong assignment would show; the first leaves a file and a
    process behind, the second looks for them), graded in one call with one worker; the worker pools
    made and the jobs each was given are recorded."""
    course = Course(ASSIGNMENTS)
    pools: list[list[str]] = []

    class RecordedPool(WorkerPool):
        def work(self, jobs, on_result):
            jobs = list(jobs)
            pools.append([job["job_id"] for job in jobs])
            return super().work(jobs, on_result)

    try:
        for a, cells, extra in zip(ASSIGNMENTS, ({}, None), (PLANT, PROBE)):
            course.workbook("release", a)
            nb = filled(a, cells)
            nb.cells.insert(2, nbformat.v4.new_code_cell(extra))
            course.submit("ann", a, nb, register=False)
        heard: list[dict] = []
        patch = pytest.MonkeyPatch()
        patch.setattr(dispatch_module, "WorkerPool", RecordedPool)
        try:
            graded = autograde_assignments(GradedCourse(course.root), ASSIGNMENTS, ONE_WORKER, progress=heard.append)
        finally:
            patch.undo()
        yield {"course": course, "graded": graded, "pools": pools, "heard": heard}
    finally:
        course.close()


def test_one_pool_grades_every_assignment(batch):
    assert len(batch["pools"]) == 1, batch["pools"]
    jobs = batch["pools"][0]
    assert jobs == [f"{a}/ann/{a}" for a in ASSIGNMENTS]  # one student's two notebooks, told apart


def test_each_assignment_is_recorded_as_alone(batch):
    course = batch["course"]
    for a in ASSIGNMENTS:
        report, = batch["graded"][a]
        assert report["student"] == "ann" and report["notebooks"][a]["status"] == "graded", report
    correct, stubs = (course.scores(a)["ann"] for a in ASSIGNMENTS)
    assert all(v > 0 for k, v in correct.items() if k.startswith("test_")), correct
    assert all(v == 0 for k, v in stubs.items() if k.startswith("test_")), stubs
    assert sorted((r["assignment"], r["status"]) for r in batch["heard"]) == [(a, "graded") for a in ASSIGNMENTS]


def test_a_second_call_keeps_what_the_batch_graded(batch):
    """Graded again assignment by assignment, nothing changed: every notebook kept, no pool made."""
    course = GradedCourse(batch["course"].root)
    for a in ASSIGNMENTS:
        heard: list[dict] = []
        autograde(course, a, ONE_WORKER, progress=heard.append)
        assert [(r["assignment"], r["status"]) for r in heard] == [(a, "kept")]


def test_nothing_one_job_leaves_reaches_the_next_assignments_job(batch):
    """The same worker, the same sandbox user, the next assignment: none of the files or processes
    the first notebook left behind is there."""
    nb = batch["course"].autograded("ann", ASSIGNMENTS[1])
    printed = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "PROBE [] []" in printed, printed[-2000:]
