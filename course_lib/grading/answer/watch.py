"""Watching the student's code for the reference being graded (cooperative: catches honest
mistakes; the grader refuses the reference itself outside the student's process): whether an
implementation is the reference (:func:`is_reference`), and every call of the reference or of
a forbidden callable while it runs (:func:`forbid`). :func:`unwatched` suspends the watch
for code that builds grading inputs."""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator, Mapping

from .calls import qualified

__all__ = ["ReferenceUsed", "code_objects", "is_reference", "unwatched", "forbid"]


class ReferenceUsed(Exception):
    """The student's implementation is, or calls, the reference being graded."""


def code_objects(obj: Any) -> set:
    """Code objects of a function, or of the functions a class defines itself."""
    codes = set()
    if isinstance(obj, type):
        for value in vars(obj).values():
            fn = getattr(value, "__func__", value)
            code = getattr(fn, "__code__", None)
            if code is not None:
                codes.add(code)
    else:
        fn = getattr(obj, "__func__", obj)
        code = getattr(fn, "__code__", None)
        if code is not None:
            codes.add(code)
    return codes


def is_reference(impl: Any, reference: Any) -> bool:
    """``impl`` is the reference itself, a subclass of it, or a function with its code."""
    if impl is reference:
        return True
    marker = getattr(reference, "__workbook_reference__", None)  # a stub standing in for the reference
    if marker is not None:
        return getattr(impl, "__workbook_reference__", None) == marker
    if isinstance(impl, type) and isinstance(reference, type):
        return issubclass(impl, reference)
    fn = getattr(impl, "__func__", impl)
    return getattr(fn, "__code__", None) is not None and fn.__code__ in code_objects(reference)


@contextlib.contextmanager
def unwatched() -> Iterator[None]:
    """Suspend the watch for reference calls (for code that builds grading inputs)."""
    previous = sys.getprofile()
    sys.setprofile(None)
    try:
        yield
    finally:
        sys.setprofile(previous)


@contextlib.contextmanager
def forbid(reference: Any, forbidden: Mapping[Any, str]) -> Iterator[list[str]]:
    """Record (in the yielded list) any call of the reference or a forbidden callable.
    (A stub standing in for the reference shares its code with every other stub: the
    grader refuses it instead, see autograder.sealing.course_copy.)"""
    ref_codes = set() if hasattr(reference, "__workbook_reference__") else code_objects(reference)
    py_forbidden, c_forbidden = {}, {}
    for fn, reason in forbidden.items():
        codes = code_objects(fn)
        for code in codes:
            py_forbidden[code] = reason
        if not codes:
            c_forbidden[id(fn)] = reason
    used: list[str] = []
    ref_reason = f"it calls {qualified(reference)}, the course's reference for this item"

    def profiler(frame, event, arg):
        if used:
            return
        if event == "call":
            code = frame.f_code
            if code in ref_codes:
                used.append(ref_reason)
            elif code in py_forbidden:
                used.append(py_forbidden[code])
        elif event == "c_call" and id(arg) in c_forbidden:
            used.append(c_forbidden[id(arg)])

    previous = sys.getprofile()
    sys.setprofile(profiler)
    try:
        yield used
    finally:
        sys.setprofile(previous)
