"""A trial: one implementation under one item's spec, as its sub-checks see it.

A sub-check asks its :class:`Trial` for the student's answers to calls
(:meth:`Trial.student`) and judges them: it compares them with the reference, checks
properties and names catalogued mistakes (:meth:`Trial.likely_mistake`). Where the answers
come from is the trial's *answer source*:

- :class:`LocalAnswers` runs the student's implementation in this process (the
  notebook's ``check(...)``, the tests);
- :class:`RecordingAnswers` lets the reference answer and records every call: the
  *plan* of an item (:class:`ItemPlan`: what to run, on which inputs);
- :class:`ReplayAnswers` hands out answers computed elsewhere (the student's
  sandboxed process) in the planned order.

Every answer crosses :mod:`course_lib.grading.answer.wire`, also in-process, so the three paths see
the same plain data. Running a spec's sub-checks on a trial: :mod:`course_lib.grading.judge.runner`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from ..answer.answers import Kind, failure
from ..answer.calls import INVOKE, Call, Probe
from ..answer.perform import perform
from .spec import CheckFailed, ItemSpec, Mistake
from ..answer.watch import ReferenceUsed
from ..answer.wire import decode, encode, to_plain

__all__ = ["Trial", "LocalAnswers", "RecordingAnswers", "ReplayAnswers", "ItemPlan", "LIKELY_CAUSE",
           "RaisedError", "raised"]

LIKELY_CAUSE = "Likely cause: "


@dataclass
class ItemPlan:
    """What to run for one item: the encoded calls, one segment per sub-check."""

    item: str
    hidden: bool
    segments: list[list[bytes]]

    @property
    def calls(self) -> list[bytes]:
        return [c for seg in self.segments for c in seg]


def _call_bytes(call: Call) -> bytes:
    return encode(call.as_data(), kind="call")


class LocalAnswers:
    """The implementation runs here, on the inputs as the other side of the wire would
    see them, and its answer is made plain data."""

    def __init__(self, spec: ItemSpec, impl: Any) -> None:
        self.spec, self.impl = spec, impl

    def answer(self, call: Call) -> dict:
        sent = Call.from_data(decode(_call_bytes(call), kind="call"))
        return to_plain(perform(self.spec, self.impl, sent))


class RecordingAnswers:
    """The reference answers; every call is recorded, segment by segment (one segment
    per sub-check)."""

    def __init__(self, spec: ItemSpec) -> None:
        self.spec = spec
        self.segments: list[list[bytes]] = []

    def begin(self) -> None:
        self.segments.append([])

    def answer(self, call: Call) -> dict:
        data = _call_bytes(call)
        self.segments[-1].append(data)
        answer = perform(self.spec, self.spec.reference, Call.from_data(decode(data, kind="call")), watch=False)
        return to_plain(answer)


class ReplayAnswers:
    """Answers computed elsewhere, handed out in the order of the plan. A call that
    differs from the planned one gets no answer (it would be a bug in a spec: the
    calls a sub-check makes may not depend on the answers, except by stopping early)."""

    def __init__(self, plan: "ItemPlan", answers: Sequence[Sequence[dict | None]]) -> None:
        self.plan, self.answers = plan, answers
        self.segment = -1
        self.position = 0

    def begin(self) -> None:
        self.segment += 1
        self.position = 0

    def answer(self, call: Call) -> dict:
        s, i = self.segment, self.position
        self.position += 1
        planned = self.plan.segments[s] if s < len(self.plan.segments) else []
        if i >= len(planned) or _call_bytes(call) != planned[i]:
            return failure(Kind.NO_ANSWER, "the grader asked for an answer it had not planned")
        got = self.answers[s][i] if s < len(self.answers) and i < len(self.answers[s]) else None
        if got is None:
            return failure(Kind.NO_ANSWER, "no answer came back for this call")
        return got


class Trial:
    """What a sub-check uses: :meth:`student` (answers), :meth:`reference` and
    :meth:`mistake_output` (computed here), :meth:`compare`, :meth:`likely_mistake` and
    :meth:`failed`. All raise :class:`CheckFailed` with a student-facing message when something
    is wrong, carrying its likely cause when one is named."""

    def __init__(self, spec: ItemSpec, source: Any, device: torch.device, name_mistakes: bool = True) -> None:
        self.spec = spec
        self.source = source
        self.device = device
        self.name_mistakes = name_mistakes  # False: pass or fail only (no search of the catalogue)
        self.warnings: list[str] = []

    # -- running ---------------------------------------------------------
    def student(self, inputs: dict, label: str = "", probe: Probe = INVOKE) -> Any:
        """The student's answer for ``probe`` on ``inputs`` (plain data)."""
        call = Call(self.spec.name, inputs, probe)
        answer = self.source.answer(call)
        try:
            return self._unwrap(answer, label)
        except RaisedError as error:
            mistake = self._raising_mistake(call, error)
            if mistake:
                raise RaisedError(f"{error}\n{LIKELY_CAUSE}{mistake.hint}", error.exc, error.text, mistake) from None
            raise

    def failed(self, message: str, cause: "Mistake | str | None" = None, sep: str = "\n") -> CheckFailed:
        """The failure for a sub-check to raise: ``message``, then after ``sep`` the likely cause
        (a catalogued :class:`Mistake`, or the hint of a cause the check names itself, which is
        the catalogue's mistake when one has that hint), carried on the failure as ``cause``."""
        if not cause:
            return CheckFailed(message)
        mistake = cause if isinstance(cause, Mistake) else self._cause_of(cause)
        return CheckFailed(f"{message}{sep}{LIKELY_CAUSE}{mistake.hint}", cause=mistake)

    def _cause_of(self, hint: str) -> Mistake:
        """The catalogued mistake whose hint ``hint`` gives (the longest such), else a cause named
        by the hint's first clause."""
        known = [m for m in self.spec.mistakes if m.hint and m.hint in hint]
        if known:
            return max(known, key=lambda m: len(m.hint))
        return Mistake(re.split(r"[:.;]\s", hint.strip(), maxsplit=1)[0][:80], None, hint)

    def _unwrap(self, answer: Any, label: str) -> Any:
        name = self.spec.name
        on = f" on {label}" if label else ""
        if not isinstance(answer, dict):
            raise CheckFailed(f"`{name}`{on}: the answer could not be read.")
        if answer.get("ok") is True:
            for w in answer.get("warnings") or []:
                if isinstance(w, str) and w not in self.warnings:
                    self.warnings.append(w[:300])
            return answer.get("value")
        kind = answer.get("kind")
        text = str(answer.get("text", ""))[:2000]
        if kind == Kind.STUB:
            raise CheckFailed(f"`{name}` raised NotImplementedError{on}: it still contains the stub "
                              "`raise NotImplementedError()`. Replace it with your code.", stop=True)
        if kind == Kind.RECURSION:
            raise CheckFailed(f"`{name}` recursed without end{on}.")
        if kind == Kind.ERROR:
            exc = str(answer.get("exc", "an exception"))[:80]
            where = str(answer.get("where", ""))[:300]
            raise RaisedError(f"`{name}` raised {exc}{on}{where}: {text[:300]}", exc, text)
        if kind == Kind.CHECK:
            raise CheckFailed(text, stop=bool(answer.get("stop")))
        if kind == Kind.REFERENCE:
            raise ReferenceUsed(text)
        if kind == Kind.MISSING:
            raise CheckFailed(f"`{name}` is not defined when its test cell runs (its cell did not run, "
                              "or raised an error).", stop=True)
        raise CheckFailed(f"`{name}`{on}: {text or 'no answer'}", stop=kind == Kind.NO_ANSWER)

    def reference(self, inputs: dict, probe: Probe = INVOKE) -> Any:
        """The reference's output on ``inputs``, as plain data."""
        answer = perform(self.spec, self.spec.reference, Call(self.spec.name, inputs, probe), watch=False)
        if not answer["ok"]:
            raise RuntimeError(f"the reference of {self.spec.name} failed: {answer}")
        return to_plain(answer["value"])

    def _raising_mistake(self, call: Call, raised: "RaisedError") -> Mistake | None:
        """The first catalogued mistake that raises what the student's code raised
        on ``call`` (the same exception, the same message: ``k.T`` on a batch, a mask's axis
        added twice, row sums without keepdim), None otherwise."""
        if not self.name_mistakes:
            return None
        for mistake in self.spec.mistakes:
            fresh = Call.from_data(decode(_call_bytes(call), kind="call"))  # the mistake gets its own copy
            answer = perform(self.spec, mistake.impl, fresh, watch=False)
            if (not answer["ok"] and answer.get("kind") == Kind.ERROR and answer.get("exc") == raised.exc
                    and _error_key(str(answer.get("text", ""))) == _error_key(raised.text)):
                return mistake
        return None

    def mistake_output(self, impl: Any, inputs: dict, probe: Probe = INVOKE) -> Any:
        """A catalogued mistake's output on ``inputs`` (None if it raises)."""
        answer = perform(self.spec, impl, Call(self.spec.name, inputs, probe), watch=False)
        return to_plain(answer["value"]) if answer["ok"] else None

    # -- comparing -------------------------------------------------------
    def likely_mistake(self, case: Any, got: Any, expected: Any, differ: Any = None,
                       probe: Probe = INVOKE) -> Mistake | None:
        """The first catalogued mistake that reproduces ``got`` on ``case``.

        ``differ(a, b)`` returns None when two outputs match (default:
        :func:`~course_lib.grading.judge.compare.describe_difference`, NaN equal to NaN when
        matching the student's output)."""
        if not self.name_mistakes:
            return None
        from .compare import describe_difference
        names = self.spec.output_names
        shows = differ or (lambda e, w: describe_difference(e, w, names))
        same = differ or (lambda w, g: describe_difference(w, g, names, equal_nan=True))
        for mistake in self.spec.mistakes:
            wrong = self.mistake_output(mistake.impl, case.make(self.device), probe)
            if wrong is None or shows(expected, wrong) is None:
                continue  # this mistake does not show on this input
            if same(wrong, got) is None:
                return mistake
        return None

    def _precision_hint(self, case: Any, expected: Any, got: Any, probe: Probe) -> str | None:
        """The likely cause "computed in float32", where the student's float64 output is off by
        about as much as the reference's on the inputs in float32."""
        from .compare import precision_hint
        inputs = case.make(self.device)
        if not any(isinstance(v, torch.Tensor) and v.dtype == torch.float64 for v in inputs.values()) \
                and inputs.get("dtype") is not torch.float64:
            return None
        low = {k: v.float() if isinstance(v, torch.Tensor) and v.dtype == torch.float64
               else torch.float32 if k == "dtype" and v is torch.float64 else v for k, v in inputs.items()}
        try:
            rounded = self.reference(low, probe)
        except RuntimeError:
            return None
        back = tuple(_as_float64(r) for r in rounded) if isinstance(rounded, (tuple, list)) else _as_float64(rounded)
        return precision_hint(expected, got, back)

    def compare(self, cases: Sequence[Any], probe: Probe = INVOKE, differ: Any = None) -> None:
        """Compare the student's answer to ``probe`` with the reference's on each case;
        ``differ(expected, got)`` says how they differ, None when they match (default:
        :func:`~course_lib.grading.judge.compare.describe_difference`)."""
        from .compare import describe_difference
        for case in cases:
            expected = self.reference(case.make(self.device), probe)
            got = self.student(case.make(self.device), case.label, probe)
            problem = (differ or (lambda e, g: describe_difference(e, g, self.spec.output_names)))(expected, got)
            if problem is None:
                continue
            cause = self.likely_mistake(case, got, expected, differ=differ, probe=probe)
            if not cause and self.name_mistakes and differ is None:
                cause = self._precision_hint(case, expected, got, probe)
            raise self.failed(f"On {case.label}: {problem}", cause)


def _as_float64(x: Any) -> Any:
    return x.double() if isinstance(x, torch.Tensor) and x.dtype == torch.float32 else x


class RaisedError(CheckFailed):
    """The student's code raised ``exc`` with message ``text`` (a failure a catalogued mistake
    may explain: :meth:`Trial._raising_mistake`)."""

    def __init__(self, message: str, exc: str, text: str, cause: Mistake | None = None) -> None:
        super().__init__(message, cause=cause)
        self.exc, self.text = exc, text


def raised(failed: CheckFailed, exc: str) -> bool:
    """Whether a failure is the student's code raising ``exc`` (an exception's name), as a check
    that expects it to raise asks."""
    return isinstance(failed, RaisedError) and failed.exc == exc


_BROADCAST = re.compile(r"The size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\) "
                        r"at non-singleton dimension (\d+)")


def _error_key(text: str) -> str:
    """An error message as matched against a catalogued mistake's: a broadcasting error names
    the same two sizes whichever operand came first (``masked_fill`` or ``torch.where``,
    ``m == 0`` or ``~m``)."""
    text = text[:300]
    found = _BROADCAST.search(text)
    if found:
        return "broadcast " + " ".join(sorted(found.group(1, 2)))
    return text
