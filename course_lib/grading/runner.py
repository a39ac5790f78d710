"""Run an item's check spec on a student's implementation and report the result.

``grade(spec, impl)`` is a pure function returning an :class:`ItemResult`; it never
prints and never raises for anything the student's code does. ``check(name, impl)``
(the call in a notebook's test cell) grades, prints a short report on stdout and
returns the points as a number, which nbgrader reads for partial credit.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import tempfile
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch

from ..device import get_device
from .compare import describe_difference, describe_value
from .spec import Case, CheckFailed, ItemSpec, SubCheck

__all__ = ["Trial", "SubResult", "ItemResult", "Score", "grade", "check", "format_report", "quiet",
           "unwatched", "working_or_reference"]


class ReferenceUsed(Exception):
    """The student's implementation is, or calls, the reference being graded."""


# ---------------------------------------------------------------------------
# Detecting the use of the reference
# ---------------------------------------------------------------------------

def _code_objects(obj: Any) -> set:
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


def _qualified(obj: Any) -> str:
    module = getattr(obj, "__module__", None) or ""
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", repr(obj))
    return f"{module}.{name}" if module else name


def _is_reference(impl: Any, reference: Any) -> bool:
    if impl is reference:
        return True
    if isinstance(impl, type) and isinstance(reference, type):
        return issubclass(impl, reference)
    fn = getattr(impl, "__func__", impl)
    return getattr(fn, "__code__", None) is not None and fn.__code__ in _code_objects(reference)


@contextlib.contextmanager
def unwatched() -> Iterator[None]:
    """Suspend the watch for reference calls (for grading code that builds the
    reference, e.g. a seeded reference module whose weights are copied)."""
    previous = sys.getprofile()
    sys.setprofile(None)
    try:
        yield
    finally:
        sys.setprofile(previous)


@contextlib.contextmanager
def _forbid(spec: ItemSpec) -> Iterator[list[str]]:
    """Record (in the yielded list) any call of the reference or a forbidden callable."""
    ref_codes = _code_objects(spec.reference)
    py_forbidden = {}
    c_forbidden = {}
    for fn, reason in spec.forbidden.items():
        codes = _code_objects(fn)
        if codes:
            for code in codes:
                py_forbidden[code] = reason
        else:
            c_forbidden[id(fn)] = reason
    used: list[str] = []
    ref_reason = (
        f"it calls {_qualified(spec.reference)}, the course's reference for this item"
    )

    def profiler(frame, event, arg):  # noqa: ANN001
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


# ---------------------------------------------------------------------------
# Silence: checks never write to stderr
# ---------------------------------------------------------------------------

@dataclass
class Captured:
    warnings: list[str] = field(default_factory=list)
    stderr: str = ""


@contextlib.contextmanager
def _fd2_to_file() -> Iterator[io.BufferedRandom | None]:
    """Point file descriptor 2 at a temporary file (catches C-level writes)."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, AttributeError, ValueError):
        yield None
        return
    tmp = tempfile.TemporaryFile()
    try:
        os.dup2(tmp.fileno(), 2)
        yield tmp
    finally:
        os.dup2(saved, 2)
        os.close(saved)


@contextlib.contextmanager
def quiet() -> Iterator[Captured]:
    """Capture warnings and everything written to stderr (Python- and C-level)."""
    captured = Captured()
    buffer = io.StringIO()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with _fd2_to_file() as tmp, contextlib.redirect_stderr(buffer):
            try:
                yield captured
            finally:
                if tmp is not None:
                    tmp.seek(0)
                    captured.stderr = tmp.read().decode(errors="replace")
                    tmp.close()
    captured.stderr = buffer.getvalue() + captured.stderr
    seen = []
    for w in caught:
        text = f"{w.category.__name__}: {w.message}"
        if text not in seen:
            seen.append(text)
    captured.warnings = seen


# ---------------------------------------------------------------------------
# A trial: one student implementation under one spec
# ---------------------------------------------------------------------------

def _student_frame(tb: traceback.StackSummary) -> str:
    """The last line of the traceback that is not inside course_lib or torch."""
    for frame in reversed(tb):
        path = frame.filename.replace("\\", "/")
        if "/course_lib/" in path or "/torch/" in path or "/site-packages/" in path:
            continue
        if frame.line:
            return f" (at `{frame.line.strip()}`)"
    return ""


class Trial:
    """Runs implementations for one item: the student's, the reference, mistakes.

    Sub-checks receive a ``Trial`` and use :meth:`student`, :meth:`reference` and
    :meth:`compare`; all of them raise :class:`CheckFailed` with a student-facing
    message when something is wrong.
    """

    def __init__(self, spec: ItemSpec, impl: Any, device: torch.device) -> None:
        self.spec = spec
        self.impl = impl
        self.device = device

    # -- running ---------------------------------------------------------
    def reference(self, inputs: Mapping[str, Any]) -> Any:
        return self.spec.invoke(self.spec.reference, inputs)

    def student(self, inputs: Mapping[str, Any], label: str = "") -> Any:
        """Run the student's implementation on ``inputs`` (see :meth:`guarded`)."""
        return self.guarded(lambda: self.spec.invoke(self.impl, inputs), label)

    def guarded(self, run: Callable[[], Any], label: str = "") -> Any:
        """Run student code: watch for use of the reference and turn its exceptions
        into a :class:`CheckFailed` message that names the exception and the line."""
        on = f" on {label}" if label else ""
        try:
            with _forbid(self.spec) as used:
                out = run()
        except CheckFailed:
            raise
        except NotImplementedError:
            raise CheckFailed(
                f"`{self.spec.name}` raised NotImplementedError{on}: it still contains the "
                "stub `raise NotImplementedError()`. Replace it with your code.", stop=True
            ) from None
        except RecursionError:
            raise CheckFailed(f"`{self.spec.name}` recursed without end{on}.") from None
        except Exception as exc:  # the student's code may raise anything
            where = _student_frame(traceback.extract_tb(exc.__traceback__))
            raise CheckFailed(
                f"`{self.spec.name}` raised {type(exc).__name__}{on}{where}: {str(exc).strip()[:300]}"
            ) from None
        if used:
            raise ReferenceUsed(used[0])
        return out

    def mistake_output(self, impl: Any, inputs: Mapping[str, Any]) -> Any:
        try:
            with quiet():
                return self.spec.invoke(impl, inputs)
        except Exception:
            return None

    # -- comparing -------------------------------------------------------
    def likely_mistake(self, case: Case, got: Any, expected: Any) -> str | None:
        """The hint of the first catalogued mistake that reproduces ``got`` on this case."""
        names = self.spec.output_names
        for mistake in self.spec.mistakes:
            wrong = self.mistake_output(mistake.impl, case.make(self.device))
            if wrong is None or describe_difference(expected, wrong, names) is None:
                continue  # this mistake does not show on this input
            if describe_difference(wrong, got, names, equal_nan=True) is None:
                return mistake.hint
        return None

    def compare(self, cases: Sequence[Case]) -> None:
        """Compare the student's output with the reference on each case."""
        for case in cases:
            expected = self.reference(case.make(self.device))
            got = self.student(case.make(self.device), case.label)
            problem = describe_difference(expected, got, self.spec.output_names)
            if problem is None:
                continue
            message = f"On {case.label}: {problem}"
            hint = self.likely_mistake(case, got, expected)
            if hint:
                message += f"\nLikely cause: {hint}"
            raise CheckFailed(message)


# ---------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------

@dataclass
class SubResult:
    title: str
    points: float
    earned: float
    hidden: bool
    message: str = ""

    @property
    def passed(self) -> bool:
        return self.earned >= self.points


@dataclass
class ItemResult:
    item: str
    results: list[SubResult]
    graded: bool  # True when the hidden sub-checks ran too
    total_points: float
    reference_used: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def earned(self) -> float:
        if self.reference_used:
            return 0.0
        return float(sum(r.earned for r in self.results))

    @property
    def score(self) -> float:
        """Points for nbgrader: the real score when graded; when only the visible
        sub-checks ran, their pass fraction scaled to the item's points."""
        if self.graded or self.reference_used:
            return self.earned
        ran = sum(r.points for r in self.results)
        return self.total_points * (self.earned / ran) if ran else 0.0


class Score(float):
    """The points a check earned. Its ``repr`` is the bare number nbgrader reads."""

    result: ItemResult

    def __new__(cls, value: float, result: ItemResult) -> "Score":
        obj = super().__new__(cls, round(value, 4))
        obj.result = result
        return obj

    def __repr__(self) -> str:
        return float.__repr__(self)


def grade(spec: ItemSpec, impl: Any, hidden: bool = False, device: torch.device | str | None = None) -> ItemResult:
    """Run the spec's sub-checks (all of them when ``hidden``) on ``impl``."""
    device = torch.device(device) if device is not None else get_device()
    subchecks: list[SubCheck] = list(spec.subchecks) if hidden else spec.visible()
    result = ItemResult(spec.name, [], graded=hidden, total_points=spec.points)
    if impl is None:
        raise TypeError(f"check('{spec.name}', ...) needs your implementation, got None")
    if _is_reference(impl, spec.reference):
        result.reference_used = f"it is {_qualified(spec.reference)}, the course's reference for this item"
    trial = Trial(spec, impl, device)
    stopped = False
    with quiet() as captured:
        for sub in subchecks:
            if result.reference_used or stopped:
                result.results.append(SubResult(sub.title, sub.points, 0.0, sub.hidden, "not run"))
                continue
            try:
                sub.run(trial)
                result.results.append(SubResult(sub.title, sub.points, sub.points, sub.hidden))
            except CheckFailed as failed:
                stopped = failed.stop
                result.results.append(SubResult(sub.title, sub.points, 0.0, sub.hidden, str(failed)))
            except ReferenceUsed as used:
                result.reference_used = str(used)
                result.results.append(SubResult(sub.title, sub.points, 0.0, sub.hidden, "not run"))
            except Exception as exc:  # a student's output can break a property check
                where = _student_frame(traceback.extract_tb(exc.__traceback__))
                result.results.append(
                    SubResult(sub.title, sub.points, 0.0, sub.hidden,
                              f"Checking failed with {type(exc).__name__}{where}: {str(exc).strip()[:300]}")
                )
    result.notes = [f"Your code emitted a warning: {w}" for w in captured.warnings[:3]]
    return result


def format_report(result: ItemResult) -> str:
    """Plain-text report: one line when everything passes, details otherwise."""
    name = result.item
    if result.reference_used:
        return (
            f"✗ {name}: 0/{result.total_points:g} points. Your solution earns nothing because "
            f"{result.reference_used}. Write the computation yourself; torch operations are fine."
        )
    n_pass = sum(r.passed for r in result.results)
    n = len(result.results)
    lines: list[str] = []
    if result.graded:
        head = f"{name}: {result.earned:g}/{result.total_points:g} points"
        if n_pass == n:
            lines.append(f"✓ {head} — " + ("the check passes." if n == 1 else f"all {n} checks pass."))
        else:
            lines.append(f"✗ {head} — {n - n_pass} of {n} checks failed.")
    else:
        if n_pass == n:
            which = "the visible check passes" if n == 1 else f"the {n} visible checks pass"
            lines.append(f"✓ {name}: {which}. The grader runs more checks on other inputs.")
        else:
            lines.append(f"✗ {name}: {n - n_pass} of {n} visible checks failed.")
    if n_pass != n:
        for r in result.results:
            mark = "✓" if r.passed else "✗"
            pts = f" [{r.earned:g}/{r.points:g}]" if result.graded else ""
            lines.append(f"  {mark} {r.title}{pts}")
            if r.message == "not run":
                lines[-1] += " (not run)"
            elif not r.passed and r.message:
                lines.extend("      " + line for line in r.message.splitlines())
    lines.extend("  note: " + note for note in result.notes)
    return "\n".join(lines)


def check(item: str, impl: Any, hidden: bool = False, device: torch.device | str | None = None) -> Score:
    """Check a student's implementation of ``item``; print a report; return the points.

    The visible part of a test cell calls ``check(name, fn)``; its hidden part calls
    ``check(name, fn, hidden=True)``, which runs every sub-check and returns the score
    that nbgrader records for the cell.
    """
    from .registry import get_spec

    spec = get_spec(item)
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
        result = grade(spec, impl, hidden=False)
        ok = not result.reference_used and all(r.passed for r in result.results)
    except Exception:
        ok = False
    if ok:
        return impl
    print(f"(Your {item} does not pass its visible checks yet, so this cell uses course_lib's reference.)")
    return spec.reference
