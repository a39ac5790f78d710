"""What the grader reads in the student's code, once the run is over (in the grader's
process): :func:`read_source` gives, per item, a forbidden callable its solution cell names,
and the copies of course_lib's references found anywhere, as problems.

Copies. A student can paste a reference's code into a solution cell, or hide a private copy
of it under another name. Neither calls the reference, so the sandbox cannot catch
it; a comparison of the code can. Each function and class the student wrote is
*normalised* (docstrings and comments dropped, every local name replaced by a
placeholder in order of first use, attribute names and literals kept) and compared
with the normalised references of the notebook's items. A close match is reported
for the instructor to look at; it does not change the points.

Short references (a line or two) are left out: a correct solution of a one-line
item looks like the reference whatever its author did.
"""

from __future__ import annotations

import ast
import difflib
import inspect
import textwrap
from functools import lru_cache
from typing import Iterable

from ..course.problems import problem
from ..inside.cells import cell_label, nbgrader_meta, test_id_of

__all__ = ["read_source", "normalise", "find_copies", "forbidden_uses", "MIN_NODES", "THRESHOLD"]

MIN_NODES = 150  # references smaller than this are not compared (a correct solution is forced to look alike)
THRESHOLD = 0.93  # similarity (0..1) of normalised token streams reported as a copy


def read_source(nb: dict, items: list[str]) -> tuple[dict[str, str], list[dict]]:
    """``(forbidden, copies)``: item -> the reason of a forbidden callable its solution cell
    names ("" for none), and a ``copied_reference`` problem for each definition that closely
    matches an item's reference."""
    from course_lib.grading import get_spec

    forbidden = {item: forbidden_in_solution(nb, item, get_spec(item).forbidden) for item in items}
    return forbidden, copied_reference_problems(nb, items)


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def forbidden_in_solution(nb: dict, item: str, forbidden: dict) -> str:
    """A forbidden callable named in the item's solution cell (found in the code, here)."""
    for cell in nb["cells"]:
        meta = nbgrader_meta(cell)
        if cell.get("cell_type") == "code" and meta.get("solution") and meta.get("grade_id") == item:
            return forbidden_uses(_source(cell), forbidden)
    return ""


def copied_reference_problems(nb: dict, items: list[str]) -> list[dict]:
    """``copied_reference`` problems for code that closely matches an item's reference."""
    sources = [(cell_label(index, cell), _source(cell)) for index, cell in enumerate(nb["cells"])
               if cell.get("cell_type") == "code" and not nbgrader_meta(cell).get("locked")]
    return [problem("copied_reference", f"{f['where']}: `{f['name']}` closely matches course_lib's reference for "
                                        f"{f['item']} (similarity {f['similarity']:.2f}); check it was not copied",
                    test_id_of(f['item'])) for f in find_copies(sources, items)]


class _Normaliser(ast.NodeTransformer):
    def __init__(self) -> None:
        self.names: dict[str, str] = {}

    def _name(self, name: str) -> str:
        if name not in self.names:
            self.names[name] = f"v{len(self.names)}"
        return self.names[name]

    def _strip_docstring(self, node: ast.AST) -> None:
        body = getattr(node, "body", None)
        if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        self._strip_docstring(node)
        node.name = "f"
        node.decorator_list = []
        node.returns = None
        self.generic_visit(node)
        return node

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.AST:
        self._strip_docstring(node)
        node.name = "C"
        self.generic_visit(node)
        return node

    def visit_arg(self, node: ast.arg) -> ast.AST:
        node.arg = self._name(node.arg)
        node.annotation = None
        return node

    def visit_Name(self, node: ast.Name) -> ast.AST:
        node.id = self._name(node.id)
        return node


def normalise(node: ast.AST) -> list[str]:
    """The token stream of a normalised function or class definition."""
    tree = _Normaliser().visit(ast.parse(ast.unparse(node)))
    return ast.unparse(tree).split()


def _size(node: ast.AST) -> int:
    return sum(1 for _ in ast.walk(node))


@lru_cache(maxsize=None)
def _reference_tokens(item: str) -> tuple[tuple[str, ...], int] | None:
    from course_lib.grading import get_spec
    try:
        source = textwrap.dedent(inspect.getsource(get_spec(item).reference))
    except (OSError, TypeError, KeyError):
        return None
    node = ast.parse(source).body[0]
    return tuple(normalise(node)), _size(node)


def _definitions(source: str) -> list[ast.AST]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]


def find_copies(sources: Iterable[tuple[str, str]], items: Iterable[str]) -> list[dict]:
    """``sources`` are ``(where, code)`` of the cells the student wrote; ``items`` the
    notebook's graded items. One finding per (definition, item) that matches closely:
    ``{"item", "name", "where", "similarity"}``."""
    references = {item: _reference_tokens(item) for item in items}
    found = []
    for where, code in sources:
        for node in _definitions(code):
            if isinstance(node, ast.ClassDef) and node.name == "_":
                continue
            tokens = normalise(node)
            for item, ref in references.items():
                if ref is None or ref[1] < MIN_NODES:
                    continue
                ratio = difflib.SequenceMatcher(None, ref[0], tokens, autojunk=False).ratio()
                if ratio >= THRESHOLD:
                    found.append({"item": item, "name": node.name, "where": where, "similarity": round(ratio, 3)})
    return found


# ---------------------------------------------------------------------------
# Forbidden callables, found in the code (a hostile process can hide their calls)
# ---------------------------------------------------------------------------

# Other names under which torch offers a forbidden computation.
ALIASES = {
    "layer_norm": ("native_layer_norm", "LayerNorm"),
    "rms_norm": ("_fused_rms_norm", "RMSNorm"),
    "cross_entropy": ("cross_entropy_loss", "CrossEntropyLoss"),
    "scaled_dot_product_attention": ("_scaled_dot_product_attention_math", "_scaled_dot_product_flash_attention",
                                     "_scaled_dot_product_efficient_attention", "_fused_sdp_choice"),
    "multi_head_attention_forward": ("MultiheadAttention", "_native_multi_head_attention"),
    "rnn_tanh": ("RNN", "_VF"),
}


def forbidden_uses(source: str, forbidden: dict) -> str:
    """The reason of the first forbidden callable the code names (``x.name``, an import of
    it from torch, or ``getattr(x, "name")``), or ``""``. ``forbidden`` maps callables to
    reasons, as ``ItemSpec.forbidden``."""
    names = {}
    for fn, reason in forbidden.items():
        name = getattr(fn, "__name__", "")
        for n in (name, *ALIASES.get(name, ())):
            if n:
                names[n] = reason
    if not names:
        return ""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return ""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in names:
            return names[node.attr]
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            for alias in node.names:
                if alias.name in names:
                    return names[alias.name]
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and node.args[1].value in names):
            return names[node.args[1].value]
    return ""
