"""Every hidden check asks only what the contract and the notebook state.

The contract is ../shared/curriculum.md's line for an item and the docstring of the graded
function or class in its solution notebook (the one students read). For every graded item the
calls its sub-checks make (its plan, visible and hidden) are audited against both:

- every argument passed is one of the signature's parameters;
- a tensor passed for a parameter whose shape either text gives, e.g. ``x (B, H, T, head_dim)``
  or ``q: (..., T_q, d_k)``, has that many axes (at least as many as the named ones after a
  leading ``...``);
- floating inputs are float32 or float64, and a parameter the texts call ``bool`` gets a bool tensor;
- a sub-check that asks for a ``ValueError`` belongs to an item whose texts say when one is raised.

A check that fed ``apply_rope`` an x of shape (T, head_dim) cost correct four-axis code its point;
this audit fails on such a check."""

from __future__ import annotations

import inspect
import json
import re
from collections import defaultdict
from functools import lru_cache
from pathlib import Path

import pytest
import torch

from course_lib.grading import all_specs
from course_lib.grading.answer.calls import Call
from course_lib.grading.judge.runner import plan_item
from course_lib.grading.answer.wire import decode

ROOT = Path(__file__).resolve().parents[2]
CURRICULUM = ROOT.parent / "shared" / "curriculum.md"
SHAPE = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*):? \(([^()`]*)\)(\s*bool)?")
LEADING = re.compile(r"^\s*\(([^()]*)\)\s*->")


@lru_cache(maxsize=1)
def _contract_lines() -> dict[str, str]:
    """Item name -> the curriculum bullets that name it."""
    if not CURRICULUM.exists():
        return {}
    lines: dict[str, str] = defaultdict(str)
    for bullet in re.split(r"\n(?=- )", CURRICULUM.read_text(encoding="utf-8")):
        for found in re.finditer(r"`(?:class )?([A-Za-z_][A-Za-z0-9_]*)\(", bullet):
            lines[found.group(1)] += bullet + "\n"
    return dict(lines)


@lru_cache(maxsize=1)
def _docstrings() -> dict[str, str]:
    """Item name -> the docstring of its graded definition in the solution notebooks."""
    found: dict[str, str] = {}
    for path in sorted(ROOT.glob("solutions/*/*.ipynb")):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            src = "".join(cell["source"])
            if cell["cell_type"] != "code" or "BEGIN SOLUTION" not in src:
                continue
            for m in re.finditer(r"^(?:def|class) (\w+).*?\"\"\"(.*?)\"\"\"", src, re.S | re.M):
                found.setdefault(m.group(1), m.group(2))
    return found


def _texts(name: str) -> str:
    return _contract_lines().get(name, "") + "\n" + _docstrings().get(name, "")


def _parameters(spec) -> list[str]:
    ref = spec.reference
    target = (getattr(ref, "forward", None) or getattr(ref, "append", None) or ref.__init__) \
        if isinstance(ref, type) else ref
    return [p for p in inspect.signature(target).parameters if p != "self"]


def _declared(spec) -> dict[str, list[tuple[tuple[str, ...], bool]]]:
    """Parameter -> the shapes the texts give it (and whether they call it bool)."""
    params = _parameters(spec)
    shapes: dict[str, list[tuple[tuple[str, ...], bool]]] = defaultdict(list)
    doc = _docstrings().get(spec.name, "")
    lead = LEADING.match(doc)
    tensors = [p for p in params if p not in ("num_heads", "n_rep", "patch_size", "image_size")]
    if lead and tensors:  # "(B, T, D) -> ...": the first parameter's shape
        shapes[tensors[0]].append((tuple(d.strip() for d in lead.group(1).split(",") if d.strip()), False))
    for m in SHAPE.finditer(_texts(spec.name)):
        if m.group(1) in params:
            dims = tuple(d.strip() for d in m.group(2).split(",") if d.strip())
            if dims and all(re.fullmatch(r"[\w.·*+/ −-]+|\.\.\.|…", d) for d in dims):
                shapes[m.group(1)].append((dims, bool(m.group(3))))
    return shapes


def _fits(rank: int, dims: tuple[str, ...]) -> bool:
    if dims and dims[0] in ("...", "…"):
        return rank >= len(dims) - 1
    return rank == len(dims)


def _calls(spec) -> list[Call]:
    return [Call.from_data(decode(c, kind="call")) for c in plan_item(spec, hidden=True).calls]


SPECS = sorted(all_specs().items())


@pytest.mark.parametrize("name, spec", SPECS, ids=[n for n, _ in SPECS])
def test_every_check_asks_within_the_contract(name, spec):
    params = set(_parameters(spec))
    declared = _declared(spec)
    module = isinstance(spec.reference, type)
    invoke_names = set(getattr(spec.invoke, "forward", ()) or ()) if module else None
    problems = []
    for call in _calls(spec):
        if call.probe.name != "invoke":
            continue
        passed = ({k: v for k, v in call.inputs.items() if k in invoke_names} if module
                  else {k: v for k, v in call.inputs.items() if k not in ("args", "kwargs")})
        if not module:
            unknown = set(passed) - params
            if unknown:
                problems.append(f"passes {sorted(unknown)}, not parameters of {name}{tuple(params)}")
        for key, value in passed.items():
            if not isinstance(value, torch.Tensor):
                continue
            if value.is_floating_point() and value.dtype not in (torch.float32, torch.float64):
                problems.append(f"{key} in {value.dtype}")
            shapes = declared.get(key)
            if shapes and not any(_fits(value.dim(), dims) for dims, _ in shapes):
                problems.append(f"{key} with {value.dim()} axes {tuple(value.shape)}; the texts say "
                                f"{' or '.join(str(d) for d, _ in shapes)}")
            if shapes and any(is_bool for _, is_bool in shapes) and value.dtype != torch.bool:
                problems.append(f"{key} as {value.dtype}; the texts say bool")
    assert not problems, f"{name}: " + "; ".join(sorted(set(problems)))


def test_a_value_error_is_asked_for_only_where_the_texts_promise_one():
    asking = {name: [s.title for s in spec.subchecks if "ValueError" in s.title] for name, spec in SPECS}
    asking = {name: titles for name, titles in asking.items() if titles}
    unpromised = {name: titles for name, titles in asking.items() if "ValueError" not in _texts(name)}
    assert not unpromised, f"checks ask for a ValueError the item's texts never mention: {unpromised}"
    assert len(asking) >= 5, sorted(asking)


def test_the_audit_reads_shapes_from_both_texts():
    """The audit has something to check: the shapes of the items whose breakage it exists for."""
    spec = dict(SPECS)
    assert ("B", "H", "T", "head_dim") in [d for d, _ in _declared(spec["apply_rope"])["x"]]
    assert ("...", "T_q", "d_k") in [d for d, _ in _declared(spec["scaled_dot_product_attention"])["q"]]
    assert ("B", "T", "D") in [d for d, _ in _declared(spec["split_heads"])["x"]]
    assert any(is_bool for _, is_bool in _declared(spec["masked_softmax"])["mask"])
    assert sum(1 for _, s in SPECS if _declared(s)) >= 35


def test_the_audit_catches_an_input_outside_the_contract():
    """The check that broke correct RoPE code, x (T, head_dim), is what the audit refuses."""
    spec = dict(SPECS)["apply_rope"]
    assert not _fits(2, ("B", "H", "T", "head_dim"))
    assert _fits(4, ("B", "H", "T", "head_dim")) and _fits(2, ("...", "T", "d")) and not _fits(1, ("...", "T", "d"))
    assert "x" in _declared(spec)
