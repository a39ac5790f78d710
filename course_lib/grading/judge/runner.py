"""Run an item's check spec: here, on an implementation (:func:`grade`, and the notebook's
``check``), or split in two for grading a submission: :func:`plan_item` (the calls to make,
found by letting the reference answer) and :func:`judge_item` (the result, from answers
computed elsewhere, in the grader's process). Every sub-check runs on a
:class:`~course_lib.grading.judge.trial.Trial`; the result is a
:class:`~course_lib.grading.judge.results.ItemResult`. ``grade`` and ``judge_item`` never print and
never raise for anything the student's code does. Hidden inputs come from the check's salt
(:func:`salted`).
"""

from __future__ import annotations

import contextlib
import contextvars
import traceback
from typing import Any, Iterator, Sequence

import torch

from ...device import full_precision, get_device, torch_threads
from ..answer.calls import qualified
from ..answer.perform import student_frame
from .results import ItemResult, Score, SubResult, format_report
from ..answer.silence import quiet
from .spec import CheckFailed, ItemSpec, SubCheck
from .trial import ItemPlan, LocalAnswers, RecordingAnswers, ReplayAnswers, Trial
from ..answer.watch import ReferenceUsed, is_reference

__all__ = ["grade", "check", "working_or_reference", "plan_item", "judge_item", "salted", "current_salt"]


# ---------------------------------------------------------------------------
# The salt: grading inputs that cannot be known in advance
# ---------------------------------------------------------------------------

_SALT: contextvars.ContextVar[int | None] = contextvars.ContextVar("grading_salt", default=None)


def current_salt() -> int:
    """The salt of the check being run (0 in a notebook: the inputs students see). Outside a
    running check there is none: an input made then (when a spec is built, at import) would
    be the same for every grading, so asking is an error."""
    salt = _SALT.get()
    if salt is None:
        raise RuntimeError("a grading seed was asked for outside a running check: make seeded inputs in a "
                           "Case's make() (called while the check runs), not when the spec is built")
    return salt


@contextlib.contextmanager
def salted(salt: int) -> Iterator[None]:
    """Run checks with inputs derived from ``salt`` (random inputs change, shapes and
    hand examples stay)."""
    token = _SALT.set(int(salt))
    try:
        yield
    finally:
        _SALT.reset(token)


def _run_subchecks(spec: ItemSpec, subchecks: Sequence[SubCheck], trial: Trial, result: ItemResult) -> None:
    stopped = False
    begin = getattr(trial.source, "begin", None)
    for sub in subchecks:
        if begin:
            begin()
        if result.reference_used or stopped:
            result.results.append(SubResult(sub.title, sub.points, 0.0, sub.hidden, "not run"))
            continue
        try:
            sub.run(trial)
            result.results.append(SubResult(sub.title, sub.points, sub.points, sub.hidden))
        except CheckFailed as failed:
            stopped = failed.stop
            result.results.append(SubResult(sub.title, sub.points, 0.0, sub.hidden, str(failed),
                                            failed.cause.name if failed.cause else ""))
        except ReferenceUsed as used:
            result.reference_used = str(used)
            result.results.append(SubResult(sub.title, sub.points, 0.0, sub.hidden, "not run"))
        except Exception as exc:  # a student's output can break a property check
            where = student_frame(traceback.extract_tb(exc.__traceback__))
            result.results.append(
                SubResult(sub.title, sub.points, 0.0, sub.hidden,
                          f"Checking failed with {type(exc).__name__}{where}: {str(exc).strip()[:300]}"))
    result.notes = [f"Your code emitted a warning: {w}" for w in trial.warnings[:3]]


def _device(device: torch.device | str | None) -> torch.device:
    return torch.device(device) if device is not None else get_device()


def grade(spec: ItemSpec, impl: Any, hidden: bool = False, device: torch.device | str | None = None,
          salt: int = 0, name_mistakes: bool = True) -> ItemResult:
    """Run the spec's sub-checks (all of them when ``hidden``) on ``impl``, here
    (``name_mistakes=False``: pass or fail only, without searching the mistake catalogue)."""
    if impl is None:
        raise TypeError(f"check('{spec.name}', ...) needs your implementation, got None")
    subchecks = list(spec.subchecks) if hidden else spec.visible()
    result = ItemResult(spec.name, [], graded=hidden, total_points=spec.points)
    if is_reference(impl, spec.reference):
        result.reference_used = f"it is {qualified(spec.reference)}, the course's reference for this item"
    trial = Trial(spec, LocalAnswers(spec, impl), _device(device), name_mistakes)
    with salted(salt), quiet(), full_precision():
        _run_subchecks(spec, subchecks, trial, result)
    return result


def plan_item(spec: ItemSpec, hidden: bool = True, device: torch.device | str | None = None,
              salt: int = 0) -> ItemPlan:
    """Every call the item's sub-checks make, found by letting the reference answer."""
    subchecks = list(spec.subchecks) if hidden else spec.visible()
    source = RecordingAnswers(spec)
    trial = Trial(spec, source, _device(device))
    result = ItemResult(spec.name, [], graded=hidden, total_points=spec.points)
    with salted(salt), quiet(), full_precision():
        _run_subchecks(spec, subchecks, trial, result)
    return ItemPlan(spec.name, hidden, source.segments)


def judge_item(spec: ItemSpec, plan: ItemPlan, answers: Sequence[Sequence[dict | None]],
               device: torch.device | str | None = None, salt: int = 0, reference_used: str = "",
               name_mistakes: bool = True) -> ItemResult:
    """The item's result from answers computed elsewhere (``answers[s][i]`` for the
    i-th call of sub-check s, None where none came back). Runs in the grader.
    ``name_mistakes=False``: pass or fail only, without searching the mistake catalogue."""
    subchecks = list(spec.subchecks) if plan.hidden else spec.visible()
    result = ItemResult(spec.name, [], graded=plan.hidden, total_points=spec.points,
                        reference_used=reference_used)
    trial = Trial(spec, ReplayAnswers(plan, answers), _device(device), name_mistakes)
    with salted(salt), quiet(), full_precision():
        _run_subchecks(spec, subchecks, trial, result)
    return result


def check(item: str, impl: Any, hidden: bool = False, device: torch.device | str | None = None) -> Score:
    """Check a student's implementation of ``item``; print a report; return the points.

    The visible part of a test cell calls ``check(name, fn)``; its hidden part calls
    ``check(name, fn, hidden=True)``, which runs every sub-check and returns the score
    that nbgrader records for the cell.

    The checks run on one CPU thread (as the autograder gives each notebook): their cases
    are small, and the threads of a multi-threaded run of small operations mostly wait
    for each other, many times longer when other programs keep the cores busy.
    """
    from .registry import get_spec

    spec = get_spec(item)
    with torch_threads(1):
        result = grade(spec, impl, hidden=hidden, device=device)
    print(format_report(result), flush=True)
    return Score(result.score, result)


def working_or_reference(item: str, impl: Any) -> Any:
    """``impl`` if it passes the item's visible checks, else course_lib's reference.

    "See it" cells use this so that they show the student's own code at work when it
    is right, and still run (with a one-line note) when it is not.
    """
    from .registry import get_spec

    spec = get_spec(item)
    try:
        with torch_threads(1):  # small cases, as in check
            result = grade(spec, impl, hidden=False, name_mistakes=False)  # pass or fail is all it needs
        ok = not result.reference_used and all(r.passed for r in result.results)
    except Exception:
        ok = False
    if ok:
        return impl
    print(f"(Your {item} does not pass its visible checks yet, so this cell uses course_lib's reference.)")
    return spec.reference
