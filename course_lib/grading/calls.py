"""The student's side of a check: run an implementation on given inputs, hand back plain data.

This module is the only code that touches a student's implementation. A check spec's
sub-checks never call the implementation directly: they ask for an answer to a
:class:`Call` (the item, a *probe* and its inputs), and :func:`perform` runs the
probe on the implementation and returns an answer made of plain data only (see
:mod:`course_lib.grading.wire`). In a notebook this happens in the same process; when
a submission is graded, it happens in the student's sandboxed process, and the
grader judges the answers in its own process.

A probe is a function ``probe(impl, inputs) -> value`` defined in the item's spec
module: ``spec.invoke`` (call the implementation, the default) or one of
``spec.probes`` (e.g. build a module and report its parameter names, or run a
backward pass and return the gradients).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import math
import os
import sys
import tempfile
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

import torch
from torch import nn

from .wire import Build, GeneratorState

__all__ = ["Call", "Probe", "PROBES", "probe", "INVOKE", "Invoke", "Subject", "perform", "realise", "build_module", "load_state", "module_layout",
           "quiet", "unwatched", "is_reference", "qualified", "target_name", "resolve", "BUILD_PREFIXES"]

# What a Build may construct: the grading fixtures (small models and samplers), nothing else.
BUILD_PREFIXES = ("course_lib.grading.fixtures.",)


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
    code is still the stub, so that the report says it once).
    """

    def __init__(self, message: str, stop: bool = False) -> None:
        super().__init__(message)
        self.stop = stop


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
            with bound_names(impl, self.names):
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


@contextlib.contextmanager
def bound_names(impl: Any, names: tuple[tuple[str, str], ...]):
    """While a function item runs, the global ``name`` of its own module (the notebook)
    means the course_lib ``target``: an item is then judged on its own, not on an earlier
    item it builds on (``cached_generate`` with the grader's cache, not the student's
    ``KVCache``). Restored afterwards."""
    space = getattr(impl, "__globals__", None)
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


def _class_info(obj: Any) -> dict:
    """A module's class name and the torch.nn classes it is an instance of."""
    cls = type(obj)
    bases = sorted({f"{c.__module__}.{c.__qualname__}" for c in cls.__mro__
                    if c.__module__.startswith("torch.nn.") and c is not nn.Module})
    return {"type": cls.__name__, "torch": bases, "is_module": isinstance(obj, nn.Module)}


def module_layout(module: nn.Module, attrs: tuple[str, ...] = ()) -> dict:
    """What a layout check needs to know about a module, as plain data: parameter and
    buffer shapes, the class of each direct submodule (with the torch.nn classes it
    derives from, e.g. ``torch.nn.modules.sparse.Embedding``), and the requested
    attributes (``"attn.num_heads"``): numbers, strings, booleans, or a submodule's
    class."""
    if not isinstance(module, nn.Module):
        return {"module": False, "type": type(module).__name__}
    children = {name: _class_info(child) for name, child in module.named_children()}
    values = {}
    for path in attrs:
        obj: Any = module
        try:
            for part in path.split("."):
                obj = getattr(obj, part)
        except Exception:
            continue
        if obj is None or isinstance(obj, (bool, int, float, str)):
            values[path] = obj
        elif isinstance(obj, nn.Module):
            values[path] = _class_info(obj)
    return {"module": True, "state": {k: tuple(v.shape) for k, v in module.state_dict().items()},
            "children": children, "attrs": values}


# ---------------------------------------------------------------------------
# Detecting the use of the reference (cooperative: catches honest mistakes)
# ---------------------------------------------------------------------------

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


def qualified(obj: Any) -> str:
    module = getattr(obj, "__module__", None) or ""
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", repr(obj))
    return f"{module}.{name}" if module else name


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
def _forbid(reference: Any, forbidden: Mapping[Any, str]) -> Iterator[list[str]]:
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


# ---------------------------------------------------------------------------
# Silence: the student's code never writes to stderr while it is checked
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
                    captured.stderr = tmp.read(1 << 20).decode(errors="replace")
                    tmp.close()
    captured.stderr = buffer.getvalue()[:1 << 20] + captured.stderr
    seen = []
    for w in caught:
        text = f"{w.category.__name__}: {w.message}"[:300]
        if text not in seen:
            seen.append(text)
    captured.warnings = seen


# ---------------------------------------------------------------------------
# Performing a call
# ---------------------------------------------------------------------------

def student_frame(tb: traceback.StackSummary) -> str:
    """The last line of the traceback that is not inside course_lib or torch."""
    for frame in reversed(tb):
        path = frame.filename.replace("\\", "/")
        if "/course_lib/" in path or "/torch/" in path or "/site-packages/" in path:
            continue
        if frame.line:
            return f" (at `{frame.line.strip()[:200]}`)"
    return ""


def _error(kind: str, exc: BaseException | None = None, text: str = "") -> dict:
    answer = {"ok": False, "kind": kind, "text": text[:2000]}
    if exc is not None:
        answer["exc"] = type(exc).__name__[:80]
        answer["where"] = student_frame(traceback.extract_tb(exc.__traceback__))
        answer["text"] = (text or str(exc)).strip()[:2000]
    return answer


# ---------------------------------------------------------------------------
# Probes: what a call can ask of an implementation, by name
# ---------------------------------------------------------------------------

PROBES: dict[str, Callable[[Subject, Any, dict, Mapping[str, Any]], Any]] = {}


def probe(name: str) -> Callable:
    """Register ``fn(subject, impl, inputs, options) -> answer`` as the probe ``name``."""
    def register(fn: Callable) -> Callable:
        PROBES[name] = fn
        return fn
    return register


@probe("invoke")
def _invoke(subject: Subject, impl: Any, inputs: dict, options: Mapping[str, Any]) -> Any:
    """Run the implementation as the item's ``invoke`` says, and answer its output."""
    return subject.invoke(impl, inputs)


@probe("gradients")
def _gradients(subject: Subject, impl: Any, inputs: dict, options: Mapping[str, Any]) -> dict:
    """Mark the inputs ``options["names"]`` as requiring a gradient, run the implementation,
    backpropagate ``(y ** 2).sum()`` (or ``y.sum()`` with ``"reduce": "sum"``, e.g. for a
    loss) from output ``options["index"]`` (default: the first output of a tuple, else the
    whole output) and report the gradients of those inputs, and for a module item of every
    parameter (built with its own initialisation unless ``options["state"]``)."""
    names, index = list(options["names"]), options.get("index", 0)
    for name in names:
        inputs[name] = inputs[name].detach().requires_grad_(True)
    module = None
    invoke = subject.invoke
    if isinstance(invoke, Invoke) and invoke.module:
        module = invoke.build(impl, inputs, state=bool(options.get("state")))
        out = invoke.call(module, inputs)
    else:
        out = invoke(impl, inputs)
    y = out
    if isinstance(out, (tuple, list)) and index is not None:
        y = out[index] if len(out) > index else None
    if not isinstance(y, torch.Tensor) or not y.requires_grad:
        return {"connected": False, "type": type(y).__name__, "output": out}
    (y.sum() if options.get("reduce") == "sum" else (y.double() ** 2).sum()).backward()
    grads = {name: inputs[name].grad for name in names}
    params = {name: p.grad for name, p in module.named_parameters()} if module is not None else {}
    return {"connected": True, "grads": grads, "params": params, "output": out}


@probe("layout")
def _layout(subject: Subject, impl: Any, inputs: dict, options: Mapping[str, Any]) -> dict:
    """Construct ``impl(*inputs["args"], **inputs["kwargs"])`` and describe it
    (:func:`module_layout`); with ``options["values"]``, also the values of its parameters."""
    module = impl(*inputs["args"], **inputs.get("kwargs", {}))
    described = module_layout(module, tuple(options.get("attrs", ())))
    if options.get("values") and isinstance(module, nn.Module):
        described["values"] = {name: p.detach().clone() for name, p in module.named_parameters()}
    return described


def _state_after(obj: Any) -> Any:
    if isinstance(obj, nn.Module):
        return {"state": {k: v.detach().clone() for k, v in obj.state_dict().items()}, "training": obj.training,
                "with_grad": [n for n, p in obj.named_parameters() if p.grad is not None],
                "requires_grad": {n: p.requires_grad for n, p in obj.named_parameters()}}
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    return None


@probe("after")
def _after(subject: Subject, impl: Any, inputs: dict, options: Mapping[str, Any]) -> dict:
    """Run the implementation, then report the inputs ``options["names"]`` as they are after
    the call (a module's weights, mode and gradients; a tensor's values), to check that the
    call left them alone."""
    out = subject.invoke(impl, inputs)
    return {"output": out, "after": {name: _state_after(inputs.get(name)) for name in options["names"]}}


@probe("memory")
def _memory(subject: Subject, impl: Any, inputs: dict, options: Mapping[str, Any]) -> dict:
    """Run the implementation and report, beside its output, the shape of the largest tensor
    any operation made during the call (the inputs are not counted), e.g. to check that
    windowed attention never builds a ``(T, T)`` tensor."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    largest: list[int] = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and (not largest or t.numel() > math.prod(largest)):
                    largest[:] = list(t.shape)
            return out

    with Record():
        out = subject.invoke(impl, inputs)
    return {"output": out, "largest": largest}


@probe("methods")
def _methods(subject: Subject, impl: Any, inputs: dict, options: Mapping[str, Any]) -> list:
    """Construct ``impl()`` and call its methods in turn, ``inputs["calls"]`` a list of
    ``[name, kwargs]`` (``"len"`` for ``len(obj)``); report each call's result (e.g. a
    cache's ``append`` and ``len``)."""
    obj = impl()
    return [len(obj) if name == "len" else getattr(obj, name)(**kwargs) for name, kwargs in inputs["calls"]]


def perform(subject: Any, impl: Any, call: Call, watch: bool = True) -> dict:
    """Run ``call`` on ``impl`` (the student's, the reference or a mistake) and return the
    answer as plain data: ``{"ok": True, "value": ..., "warnings": [...]}`` or
    ``{"ok": False, "kind": ..., ...}`` where kind is ``stub``, ``error``, ``check``
    (a message from course code, e.g. a wrong parameter shape), ``recursion``,
    ``reference`` (the reference was used) or ``missing`` (no implementation).

    ``watch`` watches for calls of the reference and forbidden callables (off when
    the reference itself answers)."""
    spec = subject if isinstance(subject, Subject) else Subject.of(subject)
    if impl is None:
        return _error("missing", text=f"`{spec.name}` is not defined")
    run = PROBES.get(call.probe.name)
    if run is None:
        return _error("check", text=f"the grader asked for an unknown probe {call.probe.name!r}")
    options = call.probe.options

    def answer(impl: Any, inputs: dict) -> Any:
        return run(spec, impl, inputs, options)
    if watch and spec.reference is not None and is_reference(impl, spec.reference):
        return {"ok": False, "kind": "reference",
                "text": f"it is {qualified(spec.reference)}, the course's reference for this item"}
    try:
        inputs = realise(call.inputs)
    except Exception as exc:  # a grading input could not be built here
        return _error("check", text=f"the grader's inputs could not be built: {type(exc).__name__}: {exc}")
    used: list[str] = []
    with quiet() as captured:
        try:
            if watch and spec.reference is not None:
                with _forbid(spec.reference, spec.forbidden) as used:
                    value = answer(impl, inputs)
            else:
                value = answer(impl, inputs)
        except CheckFailed as failed:
            return {**_error("check", text=str(failed)), "stop": failed.stop}
        except NotImplementedError as exc:
            return _error("stub", exc)
        except RecursionError as exc:
            return _error("recursion", exc)
        except Exception as exc:  # the student's code may raise anything
            if used:  # it called the reference before failing: that is what the student hears
                return {"ok": False, "kind": "reference", "text": used[0]}
            if getattr(exc, "refused_item", None) == spec.name:  # the grader refused the reference itself
                return {"ok": False, "kind": "reference",
                        "text": f"it calls {str(getattr(spec.reference, '__workbook_reference__', spec.name)).replace(':', '.')}, "
                                "the course's reference for this item"}
            return _error("error", exc)
    if used:
        return {"ok": False, "kind": "reference", "text": used[0]}
    return {"ok": True, "value": value, "warnings": captured.warnings[:3]}
