"""Stubs for the references graded in a notebook, as the sandbox's course_lib holds them
(copied in as ``course_lib._grading_oracle`` by autograder/sealing/course_copy.py): each one asks the grader
to run the reference, through the runner (autograder/inside/notebook_runner.py)."""

import torch

from course_lib.grading.answer.wire import GeneratorState


class ReferenceUnavailable(RuntimeError):
    """course_lib's reference for an item of this notebook is not available while it is graded."""


_PLAIN = (type(None), bool, int, float, str, torch.device, torch.dtype)


def _check_plain(value, name, generators, depth=0):
    if isinstance(value, torch.Tensor) or isinstance(value, _PLAIN):
        return value
    if isinstance(value, torch.Generator):
        generators.append(value)
        return GeneratorState.of(value)
    if depth < 20 and isinstance(value, (list, tuple)):
        out = [_check_plain(v, name, generators, depth + 1) for v in value]
        return tuple(out) if isinstance(value, tuple) else out
    if depth < 20 and isinstance(value, dict):
        return {k: _check_plain(v, name, generators, depth + 1) for k, v in value.items()}
    raise ReferenceUnavailable(
        f"course_lib's {name} is not available while this notebook is graded when it is given "
        f"a {type(value).__name__}; this cell does not count towards the grade.")


def _flatten(value, tensors):
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return ("T", len(tensors) - 1)
    if isinstance(value, (list, tuple)):
        return ("L" if isinstance(value, list) else "U", [_flatten(v, tensors) for v in value])
    if isinstance(value, dict):
        return ("D", [(k, _flatten(v, tensors)) for k, v in value.items()])
    return ("C", value)


def _rebuild(structure, tensors):
    kind, body = structure
    if kind == "T":
        return tensors[body]
    if kind == "L":
        return [_rebuild(s, tensors) for s in body]
    if kind == "U":
        return tuple(_rebuild(s, tensors) for s in body)
    if kind == "D":
        return {k: _rebuild(s, tensors) for k, s in body}
    return body


def _ask(target, args, kwargs, grad_outputs=None):
    import workbook_runner

    reply = workbook_runner.oracle(target, args, kwargs, grad_outputs)
    if not reply.get("ok"):
        error = ReferenceUnavailable(str(reply.get("text", "course_lib's reference is not available")))
        error.refused_item = reply.get("item")
        raise error
    return reply


class _Remote(torch.autograd.Function):
    @staticmethod
    def forward(ctx, target, structure, holder, *tensors):
        args, kwargs = _rebuild(structure, [t.detach() for t in tensors])
        reply = _ask(target, args, kwargs)
        out_tensors = []
        holder.append(_flatten(reply["value"], out_tensors))
        ctx.target, ctx.structure = target, structure
        ctx.save_for_backward(*tensors)
        return tuple(out_tensors)

    @staticmethod
    def backward(ctx, *grads):
        tensors = ctx.saved_tensors
        args, kwargs = _rebuild(ctx.structure, list(tensors))
        grads = [torch.zeros(()) if g is None else g for g in grads]
        reply = _ask(ctx.target, args, kwargs, grad_outputs=list(grads))
        got = list(reply.get("grads") or [])
        got += [None] * (len(tensors) - len(got))
        return (None, None, None, *[g if isinstance(g, torch.Tensor) else None for g in got[:len(tensors)]])


def function(target, item):
    module, _, qualname = target.partition(":")
    name = f"{module.split('.', 1)[-1]}.{qualname}"

    def stub(*args, **kwargs):
        generators = []
        try:
            plain = _check_plain((args, kwargs), name, generators)
        except ReferenceUnavailable as error:
            error.refused_item = item
            raise
        tensors = []
        structure = _flatten(plain, tensors)
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            holder = []
            outs = _Remote.apply(target, structure, holder, *tensors)
            return _rebuild(holder[0], list(outs))
        reply = _ask(target, plain[0], plain[1])
        for gen, state in zip(generators, reply.get("generators") or []):
            if isinstance(state, GeneratorState):
                gen.set_state(state.state)
        return reply["value"]

    stub.__name__ = qualname.rsplit(".", 1)[-1]
    stub.__qualname__ = qualname
    stub.__module__ = module
    stub.__doc__ = f"course_lib's reference for {item}: run by the grader while this notebook is graded."
    stub.__workbook_reference__ = target
    return stub


class _ReferenceClass(type):
    """The type of a graded class reference's stand-in: once the real class is loaded, its
    instances count as the stand-in's (``isinstance`` in course_lib's own code keeps working)."""

    def __instancecheck__(cls, obj):
        real = cls.__dict__.get("_workbook_real")
        return isinstance(obj, real) if real is not None else type.__instancecheck__(cls, obj)

    def __subclasscheck__(cls, other):
        real = cls.__dict__.get("_workbook_real")
        return issubclass(other, real) if real is not None else type.__subclasscheck__(cls, other)


def _real_class(stand_in, target, item):
    """course_lib's class ``target``, once the grader says its item has been graded: its source
    (course_lib's own, public) run in its module, where the notebook's other graded references
    are stand-ins still. Before that, :class:`ReferenceUnavailable`."""
    import sys

    import workbook_runner

    real = stand_in.__dict__.get("_workbook_real")
    if real is not None:
        return real
    module, _, qualname = target.partition(":")
    reply = workbook_runner.reference_source(target)
    if not reply.get("ok"):
        error = ReferenceUnavailable(str(reply.get("text", "course_lib's reference is not available")))
        error.refused_item = item
        raise error
    namespace = sys.modules[module].__dict__
    exec(compile(str(reply["source"]), f"<course_lib {target}>", "exec"), namespace)
    real = namespace[qualname]
    stand_in._workbook_real = real
    return real


def reference_class(target, item):
    """A stand-in for course_lib's class ``target`` (the reference for ``item``): refused (a
    :class:`ReferenceUnavailable` that the cell does not count) until ``item`` has been graded,
    then the real class (a later demonstration may build on it, as the notebook does)."""
    module, _, qualname = target.partition(":")
    name = qualname.rsplit(".", 1)[-1]

    def __new__(cls, *args, **kwargs):
        return _real_class(stand_in, target, item)(*args, **kwargs)

    stand_in = _ReferenceClass(name, (torch.nn.Module,), {
        "__new__": __new__, "__module__": module, "__qualname__": qualname, "__workbook_reference__": target,
        "__doc__": f"course_lib's {name}: available once {item} has been graded, while this notebook is graded."})
    return stand_in
