"""The student's side of a check: run an implementation on a call's inputs and hand back plain
data (:func:`perform`). This is the only code that touches a student's implementation; in a
graded notebook it runs in the student's sandboxed process, and the grader believes nothing
of it but the plain data it returns."""

from __future__ import annotations

import traceback
from typing import Any

from ...device import full_precision
from .answers import Answer, Kind, answered, failure
from .calls import Call, CheckFailed, Subject, bound_names, qualified, realise
from .probes import PROBES
from .silence import quiet
from .watch import forbid, is_reference

__all__ = ["perform", "student_frame"]


def student_frame(tb: traceback.StackSummary) -> str:
    """The last line of the traceback that is not inside course_lib or torch."""
    for frame in reversed(tb):
        path = frame.filename.replace("\\", "/")
        if "/course_lib/" in path or "/torch/" in path or "/site-packages/" in path:
            continue
        if frame.line:
            return f" (at `{frame.line.strip()[:200]}`)"
    return ""


def _raised(kind: Kind, exc: BaseException) -> Answer:
    """The answer of a call that raised ``exc``: its class, the student's line, its message."""
    return failure(kind, str(exc).strip(), type(exc).__name__, student_frame(traceback.extract_tb(exc.__traceback__)))


def perform(subject: Any, impl: Any, call: Call, watch: bool = True) -> Answer:
    """Run ``call`` on ``impl`` (the student's, the reference or a mistake) and return the
    answer as plain data (:class:`~course_lib.grading.answer.answers.Answer`): a value, or
    why there is none (:class:`~course_lib.grading.answer.answers.Kind`).

    ``watch`` watches for calls of the reference and forbidden callables (off when
    the reference itself answers). The call runs in
    :func:`~course_lib.device.full_precision` (no TF32), wherever it runs: a student's
    float32 answer and the reference's are computed alike on a CPU and on a GPU."""
    spec = subject if isinstance(subject, Subject) else Subject.of(subject)
    if impl is None:
        return failure(Kind.MISSING, f"`{spec.name}` is not defined")
    run = PROBES.get(call.probe.name)
    if run is None:
        return failure(Kind.CHECK, f"the grader asked for an unknown probe {call.probe.name!r}")
    options = call.probe.options

    names = getattr(spec.invoke, "names", ())

    def answer(impl: Any, inputs: dict) -> Any:
        with bound_names(impl, names):  # an item judged on its own: the earlier items it uses are course_lib's
            return run(spec, impl, inputs, options)
    if watch and spec.reference is not None and is_reference(impl, spec.reference):
        return failure(Kind.REFERENCE, f"it is {qualified(spec.reference)}, the course's reference for this item")
    try:
        inputs = realise(call.inputs)
    except Exception as exc:  # a grading input could not be built here
        return failure(Kind.CHECK, f"the grader's inputs could not be built: {type(exc).__name__}: {exc}")
    used: list[str] = []
    with quiet() as captured, full_precision():
        try:
            if watch and spec.reference is not None:
                with forbid(spec.reference, spec.forbidden) as used:
                    value = answer(impl, inputs)
            else:
                value = answer(impl, inputs)
        except CheckFailed as failed:
            return failure(Kind.CHECK, str(failed), stop=failed.stop)
        except NotImplementedError as exc:
            return _raised(Kind.STUB, exc)
        except RecursionError as exc:
            return _raised(Kind.RECURSION, exc)
        except Exception as exc:  # the student's code may raise anything
            if used:  # it called the reference before failing: that is what the student hears
                return failure(Kind.REFERENCE, used[0])
            if getattr(exc, "refused_item", None) == spec.name:  # the grader refused the reference itself
                named = str(getattr(spec.reference, "__workbook_reference__", spec.name)).replace(":", ".")
                return failure(Kind.REFERENCE, f"it calls {named}, the course's reference for this item")
            return _raised(Kind.ERROR, exc)
    if used:
        return failure(Kind.REFERENCE, used[0])
    return answered(value, captured.warnings)
