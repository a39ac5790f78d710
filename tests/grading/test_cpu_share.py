"""A sealed run's CPU share (autograder/sealing/cpu_share.py), attacked through the real grader
(autograder.pipeline.worker.grade_notebook), both ways a notebook is sealed as root: forked from
a zygote and in a fresh bubblewrap sandbox.

A cell that starts many busy processes, each in a session of its own (``os.setsid``: the
kernel's per-session sharing would give each one as much CPU as a whole notebook), gets no
more than its run's ``threads`` CPUs together, alone or while an honest notebook is graded
beside it; and where no CPU group can be made, new sessions are refused in the seal instead.
The CPU is measured inside the sealed processes (their own CPU time against the wall time of
the same run), never against a fixed time. How much longer the honest notebook takes beside
the hog than alone depends on the machine's load as well: benchmarks/cpu_share.py measures it.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading

import pytest

from autograder.sealing import cpu_share, sandbox
from autograder.sealing.course_copy import build_course_copy
from autograder.sealing.zygote import Zygotes
from cpu_hogs import HOG, HONEST, UID, graded, report
from hostile_cells import SWALLOWS

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="the zygote, the slot users and cgroups need root")]


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    sandbox.check_available()
    tmp = tmp_path_factory.mktemp("cpu")
    tmp.chmod(0o711)
    return {"copy": build_course_copy(tmp / "course", []), "tmp": tmp, "n": 0}


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


def test_a_hog_keeps_to_its_share_while_an_honest_notebook_is_graded_beside_it(course):
    """A hog of 56 busy processes in sessions of their own, graded beside an honest notebook:
    together they get at most about the one CPU of the hog's run while the honest notebook is
    graded, and the honest cell does all its work (1.5 CPU-seconds) while the hog is busy."""
    if os.cpu_count() < 2:
        pytest.skip("needs two CPUs: one for each notebook")
    if cpu_share.found()[0] is None:
        pytest.skip("no CPU group can be made here: the fallback is tested below")
    hog_result: dict = {}

    def hog() -> None:
        hog_result["printed"] = graded(course, HOG.format(n=56, seconds=15.0), uid=UID + 1)[1]
    thread = threading.Thread(target=hog)
    thread.start()
    try:
        threading.Event().wait(4.0)  # the hog's processes are busy
        _, beside = graded(course, HONEST.format(cpu=1.5))
    finally:
        thread.join()
    honest, hogged = report(beside, "HONEST"), report(hog_result.get("printed", ""), "HOG")
    assert hogged["t0"] < honest["t0"] and honest["t0"] + honest["wall"] < hogged["t0"] + hogged["wall"], \
        ("the honest cell ran when the hog was not busy: nothing was measured", honest, hogged)
    assert hogged["cpu"] <= 1.3 * hogged["wall"], ("the hog got more than its run's one CPU", hogged, honest)


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

    limits = sandbox.Limits(cell_timeout=2, notebook_timeout=120, memory_mb=2048)
    alone = _stopped_after(graded(course, SWALLOWS, limits=limits)[0])
    thread = threading.Thread(target=lambda: graded(course, HOG.format(n=56, seconds=15.0), uid=UID + 1))
    thread.start()
    try:
        threading.Event().wait(4.0)
        beside = _stopped_after(graded(course, SWALLOWS, limits=limits)[0])
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
