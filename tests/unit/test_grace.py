"""The grace of a cell past its limit (autograder/pipeline/run.py): grown by the time the runner
waited for a CPU, bounded on the grader's clock: what the grader itself waited for a CPU since
the limit counts against the same bound (:data:`~autograder.pipeline.run.STARVED_MAX`), so that
a starved grader does not overrun it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

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


def test_a_supervisor_reads_both_waits_from_the_cells_limit_on(monkeypatch):
    """The runner waited 50 s for a CPU after its cell's limit, the grader 25 s: 35 s are added
    (before, all 50: with the grader's own 25 s late, 75 s past the grace, over its 60 s bound)."""
    runner_waits = iter([100.0, 150.0])
    grader_waits = iter([7.0, 32.0])
    monkeypatch.setattr(sandbox, "run_queue_seconds", lambda pid: next(runner_waits))
    monkeypatch.setattr(sandbox, "own_run_queue_seconds", lambda: next(grader_waits))
    supervisor = Supervisor.__new__(Supervisor)
    supervisor.process = SimpleNamespace(pid=1234)
    supervisor._grace = (None, None, 0.0, 0.0)
    assert supervisor._starved(3, now=10.0) == 0.0  # cell 3 at its limit: the waits so far
    assert supervisor._starved(3, now=11.0) == pytest.approx(STARVED_MAX - 25.0)
