"""course_lib.grading as a submission sees it while it is graded (copied into the sandbox's
course_lib by autograder/sealing/course_copy.py): grading runs outside this process, the checks live in
the grader, which judges the answers this notebook's code gives."""

from course_lib.grading.answer.calls import Call, Invoke, Subject  # noqa: F401 - what the notebooks import
from course_lib.grading.answer.perform import perform  # noqa: F401
from course_lib.grading.answer.calls import CheckFailed  # noqa: F401

__all__ = ["check", "working_or_reference"]


def check(item, impl, hidden=False, device=None):
    print(f"({item} is checked by the grader.)")
    return 0.0


def working_or_reference(item, impl):
    """``impl`` if it passes the item's visible checks (judged by the grader), else
    course_lib's reference (see course_lib.grading.judge.runner.working_or_reference)."""
    import workbook_runner

    passed, reference = workbook_runner.visible_check(item, impl)
    if passed or reference is None:
        return impl
    print(f"(Your {item} does not pass its visible checks yet, so this cell uses course_lib's reference.)")
    return reference
