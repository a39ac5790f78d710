"""Grading checks: one spec per graded item, used by the notebooks' test cells and
by the autograder.

In a test cell::

    from course_lib.grading import check
    check("causal_mask", causal_mask)                # visible part
    check("causal_mask", causal_mask, hidden=True)   # hidden part (grading)
"""

from .judge.registry import all_specs, get_spec
from .judge.results import ItemResult, Score, format_report
from .judge.runner import check, grade, working_or_reference
from .judge.spec import Case, CheckFailed, ItemSpec, Mistake, SubCheck

__all__ = [
    "check", "grade", "working_or_reference", "format_report", "get_spec", "all_specs",
    "ItemSpec", "SubCheck", "Case", "Mistake", "CheckFailed", "ItemResult", "Score",
]
