"""Autograde every submission in parallel, sealed off; one process writes the gradebook.

This module strings the stages together and does nothing else:

1. **seal**: how submissions are sealed off, checked before anything runs
   (autograder/sealing/isolation.py);
2. **prepare** (autograder/pipeline/prepare.py): read, repair, fingerprint and salt each
   submission: a task, with its job;
3. **run** and **judge** (autograder/pipeline/run.py, judge.py), in a grading worker
   (autograder/pipeline/worker.py), wherever autograder/pipeline/dispatch.py sends the jobs:
   local processes, a Dask cluster, or this process;
4. **record** (autograder/pipeline/record.py: gradebook, autograded notebook, grading report),
   in this process, as each result arrives.

The student's process only ever produces answers and outputs, never a score. A batch
that is interrupted keeps everything it wrote, and the next run grades only what is
missing or changed (``force`` grades everything again).

Every submission ends with a recorded score (0 where nothing could be graded) and
the reasons; a bad one never stops the batch. Grading twice gives the same grades:
the hidden inputs are derived from a secret kept in ``grading/`` (outside every
sandbox) and from the student, notebook and item.
"""

from __future__ import annotations

from typing import Callable

from ..course import Course
from ..sealing.isolation import seal
from .dispatch import dispatch
from .options import GradingOptions
from .prepare import Batch
from .record import Recorder, writing

__all__ = ["autograde"]


def autograde(course: Course, assignment: str, options: GradingOptions | None = None,
              progress: Callable[[dict], None] | None = None) -> list[dict]:
    """Autograde every submission of ``assignment``; return one grading report per student.

    Reports are written to ``grading/reports/<assignment>/<student>.json`` as each
    notebook is graded. Submissions already graded with the same inputs (notebook,
    course, limits) are kept unless ``options.force``.
    """
    options = options or GradingOptions()
    user = seal(options.sealed_by(), course, options.container_user, options.one_at_a_time())
    batch = Batch.start(course, assignment, options, user)
    try:
        with writing(course, assignment) as gb:
            recorder = Recorder(course, assignment, gb, options.sealed_by() == "none",
                                batch.collect_log.get("notes", {}), progress)
            tasks = batch.tasks(gb)
            recorder.record_without_running(tasks.values())
            jobs = [t.job for t in tasks.values() if t.job is not None]
            if jobs:
                dispatch(course, options, jobs,
                         lambda job, result, worker: recorder.record(tasks[job["job_id"]], result, worker))
    finally:
        batch.clean()
    return recorder.final_reports(batch.students)
