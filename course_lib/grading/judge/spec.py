"""Check specs: each graded item described once, as plain data and functions.

An :class:`ItemSpec` names the item, its reference implementation, the sub-checks
(each worth some points, visible or hidden) and the catalogue of common mistakes.
Nothing here depends on a notebook kernel: a separate grading process can import a
student's function and run the same spec on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch

from ..answer.calls import CheckFailed, Invoke  # (CheckFailed is defined where the student's side raises it too)

__all__ = ["CheckFailed", "Case", "Mistake", "SubCheck", "ItemSpec", "call_function"]


@dataclass(frozen=True)
class Case:
    """One input on which an implementation is run.

    ``label`` describes the input in words ("q (2, 5, 4) float32, causal mask");
    ``make(device)`` builds fresh inputs (keyword arguments for the item's
    ``invoke``) so that an implementation that modifies its inputs in place cannot
    affect the next run. Inputs are plain data (tensors, numbers, strings, lists,
    tuples, dicts) and :class:`~course_lib.grading.answer.wire.Build` descriptions of the
    objects the student's side constructs (models, samplers); ``make`` runs in the
    grader and may use the reference (e.g. for the weights a module item loads).
    """

    label: str
    make: Callable[[torch.device], dict[str, Any]]


@dataclass(frozen=True)
class Mistake:
    """A named wrong variant with the same interface as the reference.

    When a student's output does not match the reference but matches ``impl`` on the
    same inputs, ``hint`` is shown: a plain sentence saying what was probably done
    and how to fix it.
    """

    name: str
    impl: Any
    hint: str


@dataclass(frozen=True)
class SubCheck:
    """One scored part of an item's check.

    ``run(trial)`` raises :class:`CheckFailed` with a message when the student's
    implementation fails it; returning normally earns ``points``. Hidden sub-checks
    run only when grading (the hidden part of the test cell).
    """

    title: str
    points: float
    run: Callable[["Trial"], None]  # noqa: F821  (trial.Trial)
    hidden: bool = False


def call_function(impl: Callable[..., Any], inputs: Mapping[str, Any]) -> Any:
    """Call a function implementation with keyword arguments."""
    return impl(**inputs)


@dataclass(frozen=True)
class ItemSpec:
    """Everything needed to grade one item.

    - ``name``: the item's name, equal to the solution cell's ``grade_id``.
    - ``reference``: course_lib's implementation (function or ``nn.Module`` class).
    - ``subchecks``: the scored parts, in the order they are shown.
    - ``mistakes``: the catalogue of known wrong variants.
    - ``invoke``: how any implementation (reference, student's or a mistake) runs on a
      case's inputs: a :class:`~course_lib.grading.answer.calls.Invoke` (plain data: call a
      function with keyword arguments, or build a module with the grader's weights and
      call its forward). It is carried out on the student's side, which knows nothing
      else of the spec. Sub-checks may also ask for the built-in probes ``gradients``,
      ``layout`` and ``after`` (see :mod:`course_lib.grading.answer.probes`).
    - ``output_names``: names of the parts of a tuple output, for messages.
    - ``forbidden``: extra callables whose use earns nothing, each with the reason.
    """

    name: str
    reference: Any
    subchecks: Sequence[SubCheck]
    mistakes: Sequence[Mistake] = ()
    invoke: Any = field(default_factory=Invoke)
    output_names: Sequence[str] = ()
    forbidden: Mapping[Any, str] = field(default_factory=dict)

    @property
    def points(self) -> float:
        """Total points of the item (= the nbgrader ``points`` of its test cell)."""
        return float(sum(s.points for s in self.subchecks))

    def visible(self) -> list[SubCheck]:
        return [s for s in self.subchecks if not s.hidden]

    def hidden(self) -> list[SubCheck]:
        return [s for s in self.subchecks if s.hidden]
