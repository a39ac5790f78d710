"""The grace of a cell past its limit (autograder/pipeline/run.py): grown by the time the runner
waited for a CPU the run was denied (not for one its own processes held), bounded on the
grader's clock: what the grader itself waited for a CPU since the limit counts against the same
bound (:data:`~autograder.pipeline.run.STARVED_MAX`), so that a starved grader does not overrun
it. The kernel's readings are given here; tests/grading/test_sandbox.py starves a real run."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from autograder.pipeline import run
from autograder.pipeline.run import STARVED_MAX, Supervisor, grace_extra
from autograder.sealing import sandbox


@pytest.mark.parametrize("extra, runner, grader, expected", [
    (0.0, 12.0, 0.0, 12.0),                    # the runner's wait is added
    (0.0, STARVED_MAX + 30, 0.0, STARVED_MAX),  # at most STARVED_MAX
    (0.0, 50.0, 20.0, STARVED_MAX - 20.0),     # the grader's own wait counts against the bound
    (0.0, 50.0, STARVED_MAX + 5, 0.0),         # never below nothing
    (30.0, None, 0.0, 30.0),                    # the kernel stopped saying: what was added stays
    (30.0, 10.0, 0.0, 30.0),                    # the longest wait seen
])
def test_the_grace_added_and_the_graders_own_wait_never_pass_the_bound(extra, runner, grader, expected):
    assert grace_extra(extra, runner, grader) == pytest.approx(expected)


def _supervisor(monkeypatch, runner_waits: list[float], grader_waits: list[float], cpu: list[float]) -> Supervisor:
    """A supervisor of a one-thread run whose kernel readings are these, one per look."""
    runner, grader, used = iter(runner_waits), iter(grader_waits), iter(cpu)
    monkeypatch.setattr(sandbox, "run_queue_seconds", lambda pid: next(runner))
    monkeypatch.setattr(sandbox, "own_run_queue_seconds", lambda: next(grader))
    monkeypatch.setattr(sandbox, "tree_cpu_seconds", lambda root: next(used))
    supervisor = Supervisor.__new__(Supervisor)
    supervisor.process = SimpleNamespace(pid=1234, memory_root=1200)
    supervisor.threads = 1
    supervisor._grace = run._Grace()
    return supervisor


def test_a_supervisor_reads_both_waits_from_the_cells_limit_on(monkeypatch):
    """The runner waited 50 s for a CPU after its cell's limit while the run got almost none
    (2 CPU-seconds in 60 s), the grader 25 s: 35 s are added (before, all 50: with the
    grader's own 25 s late, 75 s past the grace, over its 60 s bound)."""
    supervisor = _supervisor(monkeypatch, [100.0, 150.0], [7.0, 32.0], [10.0, 12.0])
    assert supervisor._starved(3, now=10.0) == 0.0  # cell 3 at its limit: the readings so far
    assert supervisor._starved(3, now=70.0) == pytest.approx(STARVED_MAX - 25.0)


def test_a_runner_kept_waiting_by_its_own_processes_gets_no_more_grace(monkeypatch):
    """The run's own busy processes used its whole share (one CPU for 20 s) while its runner
    waited 15 s: the notebook's doing, nothing added (before: 15 s more, every cell)."""
    supervisor = _supervisor(monkeypatch, [100.0, 115.0], [7.0, 7.0], [10.0, 30.0])
    supervisor._starved(3, now=10.0)
    assert supervisor._starved(3, now=30.0) == 0.0


def test_only_the_cpu_the_run_was_denied_is_added(monkeypatch):
    """In 20 s the run got 12 CPU-seconds of its 20: at most the 8 it was denied are added,
    though its runner waited 15."""
    supervisor = _supervisor(monkeypatch, [100.0, 115.0], [7.0, 7.0], [10.0, 22.0])
    supervisor._starved(3, now=10.0)
    assert supervisor._starved(3, now=30.0) == pytest.approx(8.0)


def test_the_grace_is_decided_on_a_fresh_reading(monkeypatch):
    """A cell with a 2 s limit and a 1 s grace, its runner kept waiting for a CPU for 0.5 s of
    the 1.25 s after its limit, then all the time, then not at all. Its grace ends when the
    runner has had 1 s off the run queue since the limit (at 4.5 s), not at 3.5 s, where a
    reading 0.25 s old said so (before: one reading every 0.5 s, and the cell was stopped on it)."""
    monkeypatch.setattr(run, "GRACE", 1.0)
    supervisor = _supervisor(monkeypatch, [100.0, 100.5, 101.0, 101.5, 101.5], [7.0] * 5, [10.0] * 5)
    supervisor.limits = SimpleNamespace(cell_timeout=2)
    supervisor._starved(3, now=2.0)  # the limit: the readings so far
    assert [supervisor._past_grace(3, 0.0, now) for now in (3.25, 3.5, 4.0)] == [False, False, False]
    assert supervisor._grace.extra == 1.5
    assert supervisor._past_grace(3, 0.0, 4.5)
