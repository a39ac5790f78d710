"""What the student's side hands back for one call: an :class:`Answer`, plain data that crosses
:mod:`~course_lib.grading.answer.wire` (``kind`` travels as its string). The judge believes
nothing of it but its shape (:meth:`course_lib.grading.judge.trial.Trial.student` reads it)."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, TypedDict

__all__ = ["Answer", "Kind", "answered", "failure"]


class Kind(StrEnum):
    """Why a call gave no value."""

    STUB = "stub"  # NotImplementedError: the stub is still there
    ERROR = "error"  # the student's code raised (``exc``, ``where``, ``text``)
    CHECK = "check"  # a message from course code (a wrong parameter shape, inputs that could not be built)
    RECURSION = "recursion"
    REFERENCE = "reference"  # course_lib's reference answered
    MISSING = "missing"  # no implementation of that name
    NO_ANSWER = "no_answer"  # none came back (a time limit, an unplanned call)


class Answer(TypedDict, total=False):
    """``{"ok": True, "value", "warnings"}`` or ``{"ok": False, "kind", "text"[, "exc", "where", "stop"]}``."""

    ok: bool
    value: Any
    warnings: list[str]
    kind: str  # a Kind's value
    text: str
    exc: str  # the exception's class name
    where: str  # the student's line it was raised at
    stop: bool  # skip the item's other sub-checks


def answered(value: Any, warnings: list[str] | None = None) -> Answer:
    """A value, with the first warnings the call emitted."""
    return {"ok": True, "value": value, "warnings": list(warnings or [])[:3]}


def failure(kind: Kind, text: str = "", exc: str = "", where: str = "", stop: bool = False) -> Answer:
    """No value, and why (``text`` capped at 2000 characters, ``exc`` at 80)."""
    answer: Answer = {"ok": False, "kind": kind.value, "text": str(text)[:2000]}
    if exc:
        answer["exc"], answer["where"] = str(exc)[:80], str(where)[:300]
    if stop:
        answer["stop"] = True
    return answer
