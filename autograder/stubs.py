"""The copy of ``course_lib`` a submission sees while it is graded.

A student must not earn points by handing the grader course_lib's reference for the
item being judged, however the student's process is tampered with. So the sandbox
never holds the code of the references graded in the notebook:

- each of them is replaced, in a copy of ``course_lib``, by a stub. A *function*
  stub sends its arguments (plain data) to the grader, which runs the reference in
  its own process and sends back the result (with gradients, when the caller
  backpropagates through it); the grader refuses while that item's checks run, and
  refuses any reference whose computation would call it. Other notebooks'
  references stay as they are, so later items can build on earlier ones. A *class*
  stub, or a function given something that is not plain data (a model, a
  callable), raises :class:`ReferenceUnavailable`: those demonstrations stop while
  a notebook is graded (their cells do not count);
- ``course_lib/grading`` keeps only what the student's side needs to answer calls
  (:mod:`course_lib.grading.calls`, :mod:`~course_lib.grading.wire`, the input
  fixtures); the check specs, hidden tests and catalogued mistakes are not there.
  ``check`` and ``working_or_reference`` become harmless placeholders.
"""

from __future__ import annotations

import ast
import hashlib
import shutil
import sys
from pathlib import Path
from typing import Any, Iterable

__all__ = ["build_course_copy", "reference_targets", "ORACLE_MODULE"]

ORACLE_MODULE = "_grading_oracle"

# What course_lib/grading keeps in the sandbox.
_GRADING_KEEP = {"calls.py", "wire.py", "spec.py", "fixtures"}

_GRADING_INIT = '''"""Grading runs outside this process while a notebook is graded: the checks live in
the grader, which judges the answers this notebook's code gives."""

from .calls import Call, Invoke, Subject, perform
from .spec import CheckFailed

__all__ = ["check", "working_or_reference"]


def check(item, impl, hidden=False, device=None):
    print(f"({item} is checked by the grader.)")
    return 0.0


def working_or_reference(item, impl):
    """``impl`` if it passes the item's visible checks (judged by the grader), else
    course_lib's reference (see course_lib.grading.runner.working_or_reference)."""
    import workbook_runner

    passed, reference = workbook_runner.visible_check(item, impl)
    if passed or reference is None:
        return impl
    print(f"(Your {item} does not pass its visible checks yet, so this cell uses course_lib's reference.)")
    return reference
'''

_ORACLE_SOURCE = '''"""Stubs for the references graded in this notebook (see autograder.stubs)."""

import torch

from .grading.wire import GeneratorState


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


def unavailable_class(target, item):
    module, _, qualname = target.partition(":")
    name = qualname.rsplit(".", 1)[-1]

    def __init__(self, *args, **kwargs):
        error = ReferenceUnavailable(
            f"course_lib's {name} (the reference for {item}) is not available while this notebook is "
            "graded; this cell does not count towards the grade.")
        error.refused_item = item
        raise error

    cls = type(name, (torch.nn.Module,), {"__init__": __init__, "__module__": module, "__qualname__": qualname,
                                          "__workbook_reference__": target,
                                          "__doc__": f"course_lib's {name}: not available while this notebook is graded."})
    return cls
'''


def reference_targets(items: Iterable[str]) -> dict[str, tuple[Any, str]]:
    """``{"module:Name": (reference object, item)}`` for the given graded items."""
    from course_lib.grading import get_spec

    out = {}
    for item in items:
        ref = get_spec(item).reference
        out[f"{ref.__module__}:{ref.__qualname__}"] = (ref, item)
    return out


class _Stubber(ast.NodeTransformer):
    def __init__(self, names: dict[str, tuple[str, str, bool]]) -> None:
        self.names = names  # top-level name -> (target, item, is_class)
        self.done: set[str] = set()

    def visit_Module(self, node: ast.Module) -> ast.Module:  # noqa: N802
        body = []
        for stmt in node.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and stmt.name in self.names:
                target, item, is_class = self.names[stmt.name]
                maker = "unavailable_class" if is_class else "function"
                new = ast.parse(f"from course_lib.{ORACLE_MODULE} import {maker} as _workbook_stub\n"
                                f"{stmt.name} = _workbook_stub({target!r}, {item!r})\n").body
                for n in new:
                    ast.copy_location(n, stmt)
                body.extend(new)
                self.done.add(stmt.name)
            else:
                body.append(stmt)
        node.body = body
        return node


def build_course_copy(dest: Path, items: Iterable[str], source: Path | None = None) -> Path:
    """Write the sandbox's ``course_lib`` under ``dest`` (``dest/course_lib``), with the
    references of ``items`` stubbed; return ``dest``. Raises if a reference could not
    be found in its module's source (so that no reference slips through)."""
    import course_lib

    source = source or Path(course_lib.__file__).parent
    target = dest / "course_lib"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints"))
    grading = target / "grading"
    for entry in list(grading.iterdir()):
        if entry.name not in _GRADING_KEEP:
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    (grading / "__init__.py").write_text(_GRADING_INIT)
    (target / f"{ORACLE_MODULE}.py").write_text(_ORACLE_SOURCE)
    by_file: dict[Path, dict[str, tuple[str, str, bool]]] = {}
    for key, (ref, item) in reference_targets(items).items():
        if "." in ref.__qualname__:
            raise ValueError(f"reference {key} is not defined at the top level of its module")
        path = Path(sys.modules[ref.__module__].__file__).resolve()  # (decorators may wrap the function)
        rel = path.relative_to(source.resolve())
        by_file.setdefault(target / rel, {})[ref.__qualname__] = (key, item, isinstance(ref, type))
    for path, names in by_file.items():
        tree = ast.parse(path.read_text())
        stubber = _Stubber(names)
        tree = stubber.visit(tree)
        missing = set(names) - stubber.done
        if missing:
            raise ValueError(f"could not find {', '.join(sorted(missing))} in {path}")
        path.write_text(ast.unparse(ast.fix_missing_locations(tree)) + "\n")
    # make it world-readable (the sandbox may run as another user)
    for p in [target, *target.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return dest


def fingerprint(path: Path) -> str:
    """A short hash of every file under ``path`` (to tell course versions apart)."""
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            h.update(str(p.relative_to(path)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:16]
