"""Probes: what a call can ask of an implementation, by name (:data:`PROBES`). A probe is a
function ``probe(subject, impl, inputs, options) -> answer`` registered with ``@probe(name)``:
``invoke`` (call it, the default), ``gradients`` (backpropagate and report the gradients),
``layout`` (construct a module and describe it), ``after`` (the inputs as the call left
them), ``memory`` (the largest tensor the call made) and ``methods`` (call an object's methods
in turn). Add one here when no probe fits a new item."""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import torch
from torch import nn

from .calls import Invoke, Subject

__all__ = ["PROBES", "probe", "module_layout"]


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
