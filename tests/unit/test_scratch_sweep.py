"""`workbook autograde` removes the scratch folders that killed runs left behind (a SIGKILL gives a
run no chance to clean up; the folders hold the jobs' copies of the students' files), and nothing
else: not a running grader's, not another user's, not through a link. The real kill is in
tests/grading/test_hostile_class.py (test_killing_autograde_keeps_what_was_graded_and_leaves_nothing_running)."""

from __future__ import annotations

import os
import tempfile

from autograder.pipeline.prepare import OWNER_FILE, SCRATCH_PREFIX, make_scratch, sweep_stale_scratch


def _left(folder, name: str, owner: str | None):
    path = folder / f"{SCRATCH_PREFIX}{name}"
    deep = path / "job" / "home"
    deep.mkdir(parents=True)
    (deep / "notes.txt").write_text("a student's file")
    (path / "job" / "locked").mkdir(mode=0o000)  # what a submission may leave: a folder it cannot list
    if owner is not None:
        (path / OWNER_FILE).write_text(owner)
    return path


def test_only_the_scratch_of_runs_that_ended_is_removed(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    running = make_scratch()  # this process's: it runs
    assert running.parent == tmp_path and running.name.startswith(SCRATCH_PREFIX)
    reused = _left(tmp_path, "reused", f"{os.getpid()} 1\n")  # this pid, another process's start time
    gone = _left(tmp_path, "gone", "999999999 12345\n")  # no such process
    unmarked = _left(tmp_path, "unmarked", None)  # who made it is unknown
    target = _left(tmp_path / "elsewhere", "target", "999999999 12345\n")
    link = tmp_path / f"{SCRATCH_PREFIX}link"
    link.symlink_to(target)
    other = _left(tmp_path, "other", "999999999 12345\n")
    if os.geteuid() == 0:
        os.chown(other, 65534, 65534)  # another user's

    removed = sweep_stale_scratch()

    assert sorted(removed) == sorted([reused, gone] + ([] if os.geteuid() == 0 else [other]))
    assert not reused.exists() and not gone.exists()
    assert running.is_dir() and unmarked.is_dir() and target.is_dir() and link.is_symlink()
    if os.geteuid() == 0:
        assert other.is_dir()
    assert sweep_stale_scratch() == []
