"""A call: what a sub-check asks of an implementation, as plain data, and how it reaches one.

A check spec's sub-checks never call the student's implementation directly: they ask for an
answer to a :class:`Call` (the item, a :class:`Probe` and its inputs), which
:func:`course_lib.grading.answer.perform.perform` runs on the implementation, returning plain data
only (see :mod:`course_lib.grading.answer.wire`). In a notebook this happens in the same process;
when a submission is graded, in the student's sandboxed process, and the grader judges the
answers in its own.

An item's :class:`Invoke` says how an implementation runs on a call's inputs (a function
called with them; a module built with the grader's weights, then called), and its
:class:`Subject` what the student's side needs to know of the item; :func:`realise` builds
what the inputs describe (the grading fixtures, generators). The probes a call can ask for
are in :mod:`course_lib.grading.answer.probes`.
"""

from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch
from torch import nn

from .wire import Build, GeneratorState

__all__ = ["Call", "Probe", "INVOKE", "Invoke", "Subject", "CheckFailed", "realise", "build_module", "load_state",
           "qualified", "target_name", "resolve", "bound_names", "earlier", "BUILD_PREFIXES"]

# What a Build may construct: the grading fixtures (small models and samplers), nothing else.
BUILD_PREFIXES = ("course_lib.grading.answer.fixtures.",)


@dataclass(frozen=True)
class Probe:
    """What a call asks of an implementation: the name of a registered probe
    (:data:`PROBES`) and its options (plain data), e.g. ``Probe("gradients", {"names": ["q"]})``."""

    name: str = "invoke"
    options: Mapping[str, Any] = field(default_factory=dict)


INVOKE = Probe()


@dataclass
class Call:
    """One request for an answer: run ``probe`` of ``item`` on ``inputs``."""

    item: str
    inputs: dict
    probe: Probe = INVOKE

    def as_data(self) -> dict:
        return {"item": self.item, "probe": self.probe.name, "options": dict(self.probe.options),
                "inputs": self.inputs}

    @classmethod
    def from_data(cls, data: Any) -> "Call":
        if not (isinstance(data, dict) and isinstance(data.get("item"), str) and isinstance(data.get("probe"), str)
                and isinstance(data.get("inputs"), dict) and isinstance(data.get("options", {}), dict)):
            raise ValueError("malformed call")
        return cls(data["item"], data["inputs"], Probe(data["probe"], data.get("options", {})))


class CheckFailed(Exception):
    """Raised by a sub-check with the message to show the student.

    ``stop=True`` skips the item's remaining sub-checks (used when the student's
    code is still the stub, so that the report says it once). ``cause`` is the likely
    cause the judge named (a :class:`~course_lib.grading.judge.spec.Mistake`, set only on the
    judge's side by :meth:`~course_lib.grading.judge.trial.Trial.failed`): the grades name it
    from there, never by reading the message back.
    """

    def __init__(self, message: str, stop: bool = False, cause: Any = None) -> None:
        super().__init__(message)
        self.stop = stop
        self.cause = cause


@dataclass(frozen=True)
class Invoke:
    """How an implementation runs on a call's inputs, as plain data (so that the
    student's side needs nothing of the spec):

    - a function (``module=False``): ``impl(**inputs)``;
    - a module (``module=True``): ``impl(*inputs["args"])`` with the grader's weights
      ``inputs["state"]`` loaded (``aliases``: ``gamma``/``beta`` may be called
      ``weight``/``bias``), moved to ``inputs["device"]``/``inputs["dtype"]``, in eval
      mode (train mode with ``train``); then ``module(*(inputs[n] for n in forward))``.
    """

    module: bool = False
    forward: tuple[str, ...] = ()
    aliases: bool = False
    train: bool = False
    names: tuple[tuple[str, str], ...] = ()  # (global name, course_lib target) bound while a function runs

    def build(self, impl: Any, inputs: dict, state: bool = True) -> nn.Module:
        return build_module(impl, tuple(inputs["args"]), inputs.get("state") if state else None,
                            inputs["device"], inputs["dtype"], train=self.train, aliases=self.aliases)

    def call(self, module: Any, inputs: dict) -> Any:
        return module(*(inputs[name] for name in self.forward))

    def __call__(self, impl: Any, inputs: dict) -> Any:
        if not self.module:
            return impl(**inputs)
        return self.call(self.build(impl, inputs), inputs)

    def as_data(self) -> dict:
        return {"module": self.module, "forward": list(self.forward), "aliases": self.aliases, "train": self.train,
                "names": [list(pair) for pair in self.names]}

    @classmethod
    def from_data(cls, data: Any) -> "Invoke":
        if not isinstance(data, dict) or not all(isinstance(n, str) for n in data.get("forward", [])):
            raise ValueError("malformed invoke")
        names = data.get("names", [])
        if not isinstance(names, list) or not all(isinstance(p, list) and len(p) == 2 and
                                                  all(isinstance(x, str) for x in p) for p in names):
            raise ValueError("malformed invoke")
        return cls(bool(data.get("module")), tuple(data.get("forward", ())), bool(data.get("aliases")),
                   bool(data.get("train")), tuple(tuple(p) for p in names))


def earlier(*references: Any) -> tuple[tuple[str, str], ...]:
    """``Invoke.names`` for an item that may build on the earlier items whose references these
    are: while it is judged, each such name in the notebook means course_lib's reference."""
    return tuple((ref.__name__, target_name(ref)) for ref in references)


def _globals_of(impl: Any) -> dict | None:
    """The global namespace an implementation's code runs in: a function's own, or that of a
    class's methods defined with it (the notebook's), never a base class's (torch's)."""
    if callable(impl) and not isinstance(impl, type):
        space = getattr(impl, "__globals__", None)
        return space if isinstance(space, dict) else None
    for name in ("forward", "__init__", "__call__"):
        method = getattr(impl, "__dict__", {}).get(name)
        space = getattr(method, "__globals__", None)
        if isinstance(space, dict):
            return space
    return None


@contextlib.contextmanager
def bound_names(impl: Any, names: tuple[tuple[str, str], ...]):
    """While an item runs, the global ``name`` of its own module (the notebook) means the
    course_lib ``target``: an item is then judged on its own, not on an earlier item it builds
    on (``SelfAttention`` with course_lib's ``scaled_dot_product_attention``, not the
    student's; ``cached_generate`` with the grader's cache, not the student's ``KVCache``), so
    that one mistake costs points once, in the item where it is. Restored afterwards."""
    space = _globals_of(impl)
    if not names or not isinstance(space, dict):
        yield
        return
    missing = object()
    saved = {name: space.get(name, missing) for name, _ in names}
    try:
        for name, target in names:
            space[name] = resolve(target)
        yield
    finally:
        for name, value in saved.items():
            if value is missing:
                space.pop(name, None)
            else:
                space[name] = value


def target_name(obj: Any) -> str:
    """``"package.module:Qualified.name"`` of a function or class (empty if it has none)."""
    module = getattr(obj, "__module__", None)
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if not isinstance(module, str) or not isinstance(name, str):
        return ""
    if module.startswith("torch._C") and hasattr(obj, "__name__"):  # e.g. F.scaled_dot_product_attention
        for public in ("torch.nn.functional", "torch"):
            if getattr(importlib.import_module(public), obj.__name__, None) is obj:
                return f"{public}:{obj.__name__}"
    return f"{module}:{name}"


def resolve(name: str) -> Any:
    """The object named ``"package.module:Qualified.name"`` (course_lib or torch only)."""
    return _resolve(name)


@dataclass
class Subject:
    """What the student's side needs to know of an item: its name, how to invoke an
    implementation, and what it may not use (the reference and forbidden callables).
    It travels as data with a plan (:meth:`as_data`)."""

    name: str
    invoke: Any
    reference: Any = None
    forbidden: Mapping[Any, str] = field(default_factory=dict)

    @classmethod
    def of(cls, spec: Any) -> "Subject":
        return cls(spec.name, spec.invoke, spec.reference, dict(spec.forbidden))

    def as_data(self) -> dict:
        if not isinstance(self.invoke, Invoke):
            raise TypeError(f"{self.name}: its invoke is a function, which cannot travel to the student's side")
        return {"name": self.name, "invoke": self.invoke.as_data(), "reference": target_name(self.reference),
                "forbidden": {target_name(f): reason for f, reason in self.forbidden.items() if target_name(f)}}

    @classmethod
    def from_data(cls, data: Any) -> "Subject":
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            raise ValueError("malformed subject")
        reference = None
        try:
            reference = _resolve(data["reference"]) if data.get("reference") else None
        except Exception:  # not importable here
            pass
        forbidden = {}
        for name, reason in (data.get("forbidden") or {}).items():
            try:
                forbidden[_resolve(name)] = str(reason)
            except Exception:
                pass
        return cls(data["name"], Invoke.from_data(data.get("invoke")), reference, forbidden)


# ---------------------------------------------------------------------------
# Building what the inputs describe
# ---------------------------------------------------------------------------

def _resolve(target: str, prefixes: tuple[str, ...] = ("course_lib.", "torch.")) -> Any:
    module_name, _, name = str(target).partition(":")
    if not (module_name + ".").startswith(prefixes):
        raise ValueError(f"cannot use {target!r}: not one of {', '.join(prefixes)}")
    obj: Any = importlib.import_module(module_name)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def realise(value: Any) -> Any:
    """``value`` with every :class:`Build` constructed and every generator state made a
    ``torch.Generator`` (recursively; tensors are cloned so no call sees another's)."""
    if isinstance(value, Build):
        obj = _resolve(value.target, BUILD_PREFIXES)(*realise(value.args), **realise(value.kwargs))
        if value.state is not None:
            obj.load_state_dict(realise(value.state))
        if value.device is not None or value.dtype is not None:
            dtype = getattr(torch, value.dtype) if value.dtype else None
            obj = obj.to(device=value.device, dtype=dtype) if dtype else obj.to(device=value.device)
        if value.train is not None:
            obj.train(value.train)
        return obj
    if isinstance(value, GeneratorState):
        return value.build()
    if isinstance(value, torch.Tensor):
        out = value.detach().clone()
        return out.requires_grad_(True) if value.requires_grad else out
    if isinstance(value, tuple):
        return tuple(realise(v) for v in value)
    if isinstance(value, list):
        return [realise(v) for v in value]
    if isinstance(value, dict):
        return {k: realise(v) for k, v in value.items()}
    return value


# ---------------------------------------------------------------------------
# Modules: construct the student's class, load the grader's weights
# ---------------------------------------------------------------------------

_ALIASES = {"gamma": "weight", "beta": "bias"}


def load_state(module: nn.Module, state: Mapping[str, torch.Tensor], aliases: bool = True) -> None:
    """Copy ``state`` into ``module`` by parameter name, with a student-facing message
    for a missing name or a wrong shape. With ``aliases``, ``gamma``/``beta`` may be
    called ``weight``/``bias`` (as in ``nn.LayerNorm``)."""
    if not isinstance(module, nn.Module):
        raise CheckFailed(f"expected an nn.Module instance, got {type(module).__name__}.")
    own = module.state_dict()
    mapped = {}
    for key, value in state.items():
        target = key
        if key not in own and aliases:
            head, _, last = key.rpartition(".")
            alt = (head + "." if head else "") + _ALIASES.get(last, last)
            if alt in own:
                target = alt
        if target not in own:
            have = ", ".join(f"{k} {tuple(v.shape)}" for k, v in own.items()) or "none"
            raise CheckFailed(f"expected a parameter `{key}` {tuple(value.shape)}; your module has: {have}.")
        if own[target].shape != value.shape:
            raise CheckFailed(f"parameter `{target}` has shape {tuple(own[target].shape)}, "
                              f"expected {tuple(value.shape)}.")
        mapped[target] = value
    module.load_state_dict(mapped, strict=False)


def build_module(impl: Any, args: tuple, state: Mapping[str, torch.Tensor] | None, device: Any,
                 dtype: torch.dtype | None, train: bool = False, aliases: bool = True) -> nn.Module:
    """``impl(*args)`` with ``state`` loaded, moved to ``device``/``dtype``, in eval mode
    (or train mode with ``train``)."""
    module = impl(*args)
    if not isinstance(module, nn.Module):
        raise CheckFailed(f"{getattr(impl, '__name__', 'the class')}{tuple(args)} is not an nn.Module "
                          f"(got {type(module).__name__}).")
    module = module.to(device=device, dtype=dtype) if dtype is not None else module.to(device=device)
    if state is not None:  # after the move, so that float64 weights keep their precision
        load_state(module, state, aliases)
    return module.train(train)


def qualified(obj: Any) -> str:
    module = getattr(obj, "__module__", None) or ""
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", repr(obj))
    return f"{module}.{name}" if module else name
