"""A sealed run's CPU share (autograder/sealing/cpu_share.py), attacked through the real grader
(autograder.pipeline.worker.grade_notebook), both ways a notebook is sealed as root: forked from
a zygote and in a fresh bubblewrap sandbox.

A cell that starts many busy processes, each in a session of its own (``os.setsid``: the
kernel's per-session sharing would give each one as much CPU as a whole notebook), gets no
more than its run's ``threads`` CPUs together; an honest notebook graded beside such a hog gets
at least half the CPU it gets alone; and where no CPU group can be made, new sessions are
refused in the seal instead. The CPU is measured inside the sealed processes (their own CPU
time against the wall time of the same run), never against a fixed time.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time

import nbformat
import pytest

from autograder.pipeline.worker import grade_notebook
from autograder.sealing import cpu_share, sandbox
from autograder.sealing.course_copy import build_course_copy
from autograder.sealing.zygote import Zygotes
from hostile_cells import SWALLOWS

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="the zygote, the slot users and cgroups need root")]

UID = sandbox.SANDBOX_UID_BASE + 4400

# Start N busy processes, each after setsid() (refused or not: the process goes on), each busy
# for SECONDS of wall time; print how much CPU they got together against the wall time.
HOG = r'''
import json, os, sys, time
N, SECONDS = {n}, {seconds}
refused = 0
started = time.monotonic()
children = []
for _ in range(N):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            os.setsid()
        except PermissionError:
            refused = 1
        end = time.monotonic() + SECONDS
        while time.monotonic() < end:
            pass
        os.write(write, json.dumps([time.process_time(), refused]).encode())
        os._exit(0)
    os.close(write)
    children.append(read)
got = [json.loads(os.read(fd, 100)) for fd in children]
for _ in children:
    os.wait()
print("HOG " + json.dumps({{"cpu": sum(c for c, _ in got), "wall": time.monotonic() - started, "t0": started,
                           "refused": sum(r for _, r in got)}}))
'''

# A fixed amount of work (one CPU-second of this process's own), and how long it took.
HONEST = r'''
import json, time
started, cpu = time.monotonic(), time.process_time()
while time.process_time() - cpu < {cpu}:
    sum(i * i for i in range(1000))
print("HONEST " + json.dumps({{"cpu": time.process_time() - cpu, "wall": time.monotonic() - started, "t0": started}}))
'''


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    sandbox.check_available()
    tmp = tmp_path_factory.mktemp("cpu")
    tmp.chmod(0o711)
    return {"copy": build_course_copy(tmp / "course", []), "tmp": tmp, "n": 0}


def graded(course: dict, source: str, uid: int = UID, zygotes: Zygotes | None = None) -> tuple[dict, str]:
    """One one-cell notebook graded as a worker grades it (one thread): its result and what it printed."""
    course["n"] += 1
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
    job = {"notebook": nbformat.writes(nb), "salts": {}, "extra_files": [], "job_id": f"cpu-{course['n']}",
           "limits": sandbox.Limits(cell_timeout=120, notebook_timeout=240, memory_mb=2048).__dict__.copy(),
           "threads": 1}
    result = grade_notebook(job, course["copy"], course["tmp"] / f"job-{course['n']}", uid=uid, zygotes=zygotes)
    assert not result.get("crash"), result
    cell = nbformat.reads(result["notebook"], as_version=4).cells[0]
    return result, "".join(o.get("text", "") + o.get("evalue", "") for o in cell.outputs)


def report(printed: str, tag: str) -> dict:
    assert tag + " " in printed, printed
    return json.loads(printed.split(tag + " ", 1)[1].splitlines()[0])


@pytest.mark.parametrize("way", ("zygote", "fresh"))
def test_many_processes_in_sessions_of_their_own_get_one_runs_share(course, tmp_path, way):
    groups, why = cpu_share.found()
    if groups is None:
        pytest.skip(f"no CPU group can be made here ({why}): the fallback is tested below")
    zygotes = Zygotes(tmp_path / "zygotes") if way == "zygote" else None
    try:
        result, printed = graded(course, HOG.format(n=12, seconds=3.0), zygotes=zygotes)
    finally:
        if zygotes is not None:
            zygotes.close()
    hog = report(printed, "HOG")
    assert hog["refused"] == 0, "with a CPU group, setsid is allowed"
    # one thread's share: 12 busy processes got at most about one CPU together, however many
    # CPUs the machine has (without the group: every idle CPU, 2 on a 2-core machine)
    assert hog["cpu"] <= 1.3 * hog["wall"], (hog, result["seal"])
    assert "a CPU share per run" in result["seal"]["cpu"], result["seal"]
    assert not list(groups.base.glob(cpu_share.PREFIX + f"{os.getpid()}-*")), "the run's group is removed"


def test_an_honest_notebook_beside_a_hog_gets_at_least_half_of_its_share_alone(course):
    """The honest notebook's whole grading (its sandbox's start, its imports, its cell) beside a
    hog of 56 busy processes in sessions of their own, against the same grading alone."""
    if os.cpu_count() < 2:
        pytest.skip("needs two CPUs: one for each notebook")
    started = time.monotonic()
    _, alone = graded(course, HONEST.format(cpu=1.5))
    wall_alone = time.monotonic() - started

    hog_result: dict = {}

    def hog() -> None:
        hog_result["printed"] = graded(course, HOG.format(n=56, seconds=15.0), uid=UID + 1)[1]
    thread = threading.Thread(target=hog)
    thread.start()
    try:
        threading.Event().wait(4.0)  # the hog's processes are busy
        started = time.monotonic()
        _, beside = graded(course, HONEST.format(cpu=1.5))
        wall_beside = time.monotonic() - started
    finally:
        thread.join()
    honest, hogged = report(beside, "HONEST"), report(hog_result.get("printed", ""), "HOG")
    assert wall_alone / wall_beside >= 0.5, (f"graded alone in {wall_alone:.1f} s, beside the hog in "
                                            f"{wall_beside:.1f} s", hogged)
    assert hogged["t0"] < honest["t0"] and honest["t0"] + honest["wall"] < hogged["t0"] + hogged["wall"], \
        ("the honest cell ran when the hog was not busy: nothing was measured", honest, hogged)


def test_without_a_cpu_group_new_sessions_are_refused(course, monkeypatch):
    monkeypatch.setenv("WORKBOOK_CPU_GROUPS", "off")
    result, printed = graded(course, HOG.format(n=2, seconds=0.2))
    hog = report(printed, "HOG")
    assert hog["refused"] == 2, hog
    assert result["seal"]["sessions"] == "refused"
    assert "new sessions refused (no CPU group: WORKBOOK_CPU_GROUPS=off)" in result["seal"]["cpu"], result["seal"]




def _stopped_after(result: dict) -> float:
    """How long after its limit the grader stopped a cell that swallowed its interrupt (its problem says)."""
    stopped = [p["message"] for p in result["problems"] if p["kind"] == "cell_timeout"]
    assert stopped and "did not stop when interrupted" in stopped[0], result["problems"]
    return float(stopped[0].split("(stopped ", 1)[1].split(" s after", 1)[0])


def test_a_cell_that_swallows_its_interrupt_beside_a_hog_is_stopped_at_its_grace(course, monkeypatch):
    """The grace is kept on the grader's clock: a hog graded beside cannot starve the grader
    (it is not in any run's group), so the cell is stopped as late after its limit as alone."""
    from autograder.pipeline import run
    monkeypatch.setattr(run, "GRACE", 2.0)
    limits = dict(cell_timeout=2, notebook_timeout=120, memory_mb=2048)

    def grade(source: str, uid: int = UID) -> dict:
        course["n"] += 1
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
        job = {"notebook": nbformat.writes(nb), "salts": {}, "extra_files": [], "job_id": f"cpu-{course['n']}",
               "limits": sandbox.Limits(**limits).__dict__.copy(), "threads": 1}
        return grade_notebook(job, course["copy"], course["tmp"] / f"job-{course['n']}", uid=uid)

    alone = _stopped_after(grade(SWALLOWS))
    thread = threading.Thread(target=lambda: graded(course, HOG.format(n=56, seconds=15.0), uid=UID + 1))
    thread.start()
    try:
        threading.Event().wait(4.0)
        beside = _stopped_after(grade(SWALLOWS))
    finally:
        thread.join()
    assert beside <= 2 * alone, f"stopped {alone:.1f} s after its limit alone, {beside:.1f} s beside the hog"


def test_a_process_left_in_a_runs_group_is_killed_and_the_group_removed():
    groups, why = cpu_share.found()
    if groups is None:
        pytest.skip(f"no CPU group can be made here ({why})")
    group = groups.make(1)
    left = subprocess.Popen(["sleep", "60"], preexec_fn=group.add_self, start_new_session=True)
    assert group.pids() == [left.pid]
    assert group.close() == [left.pid]
    assert left.wait(timeout=10) == -9
    assert not group.path.exists()


def test_a_forked_run_sees_nothing_of_the_grader_in_its_groups_name(course, tmp_path):
    """A child of a zygote sees its CPU group's path (/proc/self/cgroup, in the zygote's cgroup
    namespace): the grader's PID and a random token, no student, notebook or count of runs."""
    if cpu_share.found()[0] is None:
        pytest.skip("no CPU group can be made here")
    zygotes = Zygotes(tmp_path / "zygotes")
    try:
        seen = [graded(course, "print(open('/proc/self/cgroup').read())", zygotes=zygotes)[1] for _ in range(2)]
    finally:
        zygotes.close()
    names = [line.rsplit("/", 1)[1] for text in seen for line in text.splitlines() if cpu_share.PREFIX in line]
    assert len(names) == 2 and names[0] != names[1], seen
    for name in names:
        assert re.fullmatch(re.escape(cpu_share.PREFIX) + r"\d+-[0-9a-f]{16}", name), name
        assert "cpu-" not in name  # the job's id ("cpu-N" here; "assignment/student/notebook" in grading)
