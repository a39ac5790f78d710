"""What can be wrong with a submission: one record, from ``collect`` to the feedback.

A problem is plain data, stored in ``grading/reports/<assignment>/<student>.json``:
``{"kind": ..., "message": ..., "cell": ...}``. ``collect``, the grader and
``feedback`` make them with :func:`problem`; ``status``, ``export``, ``report`` and the
feedback page read them. Every kind is listed in :data:`KINDS` with what it means.
"""

from __future__ import annotations

from typing import TypedDict

__all__ = ["Problem", "KINDS", "FLAGS", "INSTRUCTOR_ONLY", "WHOLE_SUBMISSION", "problem"]


class Problem(TypedDict):
    kind: str  # a key of KINDS
    message: str  # one or two sentences for the instructor and the student
    cell: str  # the grade id of the cell it concerns, or ""


KINDS: dict[str, str] = {
    # the submitted file (collect, autograde: autograder/doors/intake.py)
    "rejected": "the submission broke a rule of what may be handed in (a size, an archive, a name); it scores 0",
    "timestamp_claim": "the submission's own timestamp.txt was unreadable or disagreed with the trusted time",
    "lookalike_ids": "the student's id looks like another student's (alice, aIice): check they are two students",
    "missing": "no notebook was handed in",
    "symlink": "a symbolic link was handed in instead of a file; it was not read",
    "invalid_json": "the notebook is not valid JSON (truncated or damaged)",
    "invalid_notebook": "the file is not a notebook nbgrader can read",
    "old_format": "written by an older Jupyter; converted",
    "renamed": "the notebook had another name and was recognised by its graded cells",
    # its cells (autograde, with nbgrader's own repair steps)
    "edited_locked": "a locked cell was edited; the original was put back",
    "duplicate_cells": "a graded cell appears more than once; only the first counts",
    "deleted_cells": "a graded cell was deleted; the original was put back",
    "foreign_cell": "a cell claimed a graded id the assignment does not have; it was graded as an ordinary cell",
    # running it (the sandbox)
    "error": "a cell raised an error",
    "cell_timeout": "a cell ran past the time limit of a cell",
    "notebook_timeout": "the notebook ran past the time limit of a notebook",
    "memory": "the notebook ran out of its memory limit",
    "kernel_died": "the notebook's process died (crash, exit or signal)",
    "output_truncated": "a cell's output went past the output limit and was cut",
    "protocol": "the notebook's process broke the grader's protocol",
    "worker_crash": "the grading worker failed while grading this notebook",
    "cleanup": "the grader could not remove everything the notebook's code left behind (for the instructor: "
               "no points depend on it)",
    # grading it
    "test_failed": "a test cell could not be graded",
    "no_check": "a test cell has no check defined",
    "grader_error": "the grader could not plan an item's checks",
    "reference_used": "the graded code calls course_lib's reference for the item (no points for it)",
    "copied_reference": "the code closely matches course_lib's reference (for the instructor to look at)",
    "unverified": "graded without the sandbox: the score was not decided outside the student's code",
    # afterwards
    "feedback": "nbgrader could not render the feedback page",
}

# problems for the instructor to look at, not reasons a notebook lost points
FLAGS = frozenset({"copied_reference", "reference_used", "timestamp_claim", "lookalike_ids", "cleanup"})
# problems the student's own page and results never show (the instructor's to look into)
INSTRUCTOR_ONLY = frozenset({"copied_reference", "cleanup"})
WHOLE_SUBMISSION = frozenset({"timestamp_claim", "lookalike_ids"})  # notes of collect that concern every notebook


def problem(kind: str, message: str, cell: str = "") -> Problem:
    """A problem of a known ``kind`` (see :data:`KINDS`)."""
    if kind not in KINDS:
        raise ValueError(f"unknown problem kind {kind!r}; known: {', '.join(KINDS)}")
    return {"kind": kind, "message": message, "cell": cell}
