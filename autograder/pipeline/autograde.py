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

from contextlib import ExitStack
from typing import Callable

from ..course import Course
from ..sealing.isolation import seal
from .dispatch import cool_down, dispatch, warm_up
from .options import GradingOptions
from .prepare import Batch
from .record import Recorder, Rescore, writing

__all__ = ["autograde", "autograde_assignments"]


def autograde(course: Course, assignment: str, options: GradingOptions | None = None,
              progress: Callable[[dict], None] | None = None) -> list[dict]:
    """Autograde every submission of ``assignment``; return one grading report per student.

    Reports are written to ``grading/reports/<assignment>/<student>.json`` as each
    notebook is graded. Submissions already graded with the same inputs (notebook,
    course, limits) are kept unless ``options.force``.
    """
    return autograde_assignments(course, [assignment], options, progress)[assignment]


def autograde_assignments(course: Course, assignments: list[str], options: GradingOptions | None = None,
                          progress: Callable[[dict], None] | None = None,
                          rescore: dict[str, Rescore] | None = None) -> dict[str, list[dict]]:
    """Autograde every submission of each of ``assignments`` in one batch of jobs: one set of
    workers for them all (each a Python with torch to start), and a worker that finishes an
    assignment's last notebook takes the next assignment's first. Returns each assignment's
    grading reports, one per student; ``progress(record)`` hears of each notebook (its
    ``assignment`` named in the record); ``rescore``: how a regrade takes the new points, per
    assignment (autograder/pipeline/regrade.py)."""
    options = options or GradingOptions()
    assignments = list(dict.fromkeys(assignments))
    user = seal(options.sealed_by(), course, options.container_user, options.one_at_a_time())
    warm_up(options)
    with ExitStack() as stack:
        stack.callback(cool_down)
        batches: dict[str, Batch] = {}
        for assignment in assignments:
            batches[assignment] = Batch.start(course, assignment, options, user)
            stack.callback(batches[assignment].clean)
        gb = stack.enter_context(writing(course, *assignments))
        recorders, tasks, jobs = {}, {}, []
        for assignment, batch in batches.items():
            def told(record: dict, assignment: str = assignment) -> None:
                if progress:
                    progress(dict(record, assignment=assignment))
            recorders[assignment] = Recorder(course, assignment, gb, not options.sealed_by().sealed,
                                             batch.collect_log.get("notes", {}), told, batch.digest,
                                             (rescore or {}).get(assignment))
            recorders[assignment].enroll(batch.handed_in())
            mine = batch.tasks(gb)
            recorders[assignment].record_without_running(mine.values())
            tasks.update({f"{assignment}/{key}": (assignment, task) for key, task in mine.items()})
        for key, (assignment, task) in tasks.items():
            if task.job is not None:  # its key names the assignment too: one batch, unique keys
                jobs.append({**task.job, "job_id": key})

        def done(job: dict, result: dict, worker: str | None) -> None:
            assignment, task = tasks[job["job_id"]]
            recorders[assignment].record(task, result, worker)
        if jobs:
            dispatch(course, options, jobs, done)
        return {a: recorders[a].final_reports(batches[a].students) for a in assignments}
