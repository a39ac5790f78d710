"""``workbook student-edition OUT``: the repository students receive.

The course's own repository holds model answers (``solutions/``), hidden tests, the
autograder and the instructor's documents. The student edition holds what a student
works with, and nothing of the rest:

- ``notebooks/``: the released notebooks (no solutions, no hidden tests, no model answers);
- ``course_lib/``: the references the notebooks build on, the data generators, plots and
  widgets, and the checks behind the visible test cells; the code of each item's **hidden
  sub-checks is left out** (each ``SubCheck(..., hidden=True)`` of ``grading/items/`` keeps
  its title and points, its check becomes one that says the grader runs it, and the
  private helpers only hidden checks used go). They separate cleanly: a visible test runs
  only visible sub-checks, so it prints the same report and the same points, and the
  grader never relies on the student's copy (it grades with the course's own, outside the
  student's process). The mistake catalogues stay: the visible tests name mistakes with them;
- the student part of the README, with its two commands (``make lab``, ``make test``), a
  Makefile, ``pyproject.toml`` and ``constraints.txt`` without the instructor's tools
  (the autograder, Dask, the PostgreSQL driver), and a short test suite that checks a
  student's set-up (the references against PyTorch, notebook 03 run top to bottom).
"""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

from ..course import Course, CourseError

__all__ = ["write_edition", "strip_hidden_subchecks", "INSTRUCTOR_ONLY_PACKAGES"]

INSTRUCTOR_ONLY_PACKAGES = ("dask", "distributed", "psycopg")  # grading on a cluster, a gradebook server
_SECRETS = ("### BEGIN SOLUTION", "### BEGIN HIDDEN TESTS", "*Model answer.*")


def _hidden(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "SubCheck"
            and any(k.arg == "hidden" and isinstance(k.value, ast.Constant) and k.value.value is True
                    for k in node.keywords))


_GRADER_ONLY = '''
def _graded_by_the_course(trial):
    """A hidden sub-check: the course's grader runs it (its code is not in this edition)."""
    raise CheckFailed("this sub-check is run by your instructor's grader")
'''


class _DropHidden(ast.NodeTransformer):
    """Each hidden sub-check keeps its title and points (so the visible tests report the same
    totals) and loses its code: its check becomes :data:`_GRADER_ONLY`'s function."""

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if _hidden(node):
            runner = ast.Name("_graded_by_the_course", ast.Load())
            if len(node.args) >= 3:
                node.args[2] = runner
            node.keywords = [k if k.arg != "run" else ast.keyword("run", runner) for k in node.keywords]
        return node


def _unused_private(tree: ast.Module) -> set[str]:
    """Private top-level functions and classes that nothing outside their own definition names."""
    defs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name.startswith("_")}
    named = set()
    for node in tree.body:
        own = node.name if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else None
        named |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and n.id != own}
    return set(defs) - named


def strip_hidden_subchecks(source: str) -> str:
    """A check-spec module's source without the code of its hidden sub-checks (their titles
    and points stay) and without the private helpers nothing else uses any more."""
    tree = _DropHidden().visit(ast.parse(source))
    at = next((i + 1 for i, n in enumerate(tree.body) if isinstance(n, (ast.Import, ast.ImportFrom))), 0)
    for k, node in enumerate(ast.parse(_GRADER_ONLY).body):  # (CheckFailed: every items module imports it)
        tree.body.insert(at + k, node)
    while True:
        unused = _unused_private(tree)
        if not unused:
            break
        tree.body = [n for n in tree.body if not (isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in unused)]
    note = "(Student edition: the hidden sub-checks of these items are left out; the grader uses the course's own.)"
    first = tree.body[0] if tree.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        first.value.value = first.value.value.rstrip() + "\n\n" + note + "\n"
    else:
        tree.body.insert(0, ast.Expr(ast.Constant(note)))
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


def _readme(repo: Path) -> str:
    text = (repo / "README.md").read_text(encoding="utf-8")
    student = text.split("\n## How an instructor grades", 1)[0].rstrip()
    student = student.replace("make test   # set up .venv and run the whole test suite",
                              "make test   # set up .venv and check it: the references, a notebook run top to bottom")
    return student + """

## This edition

This is the students' edition of the course: the notebooks, `course_lib` (the references,
data, plots, widgets and the checks behind the test cells) and nothing of the grading.
Test cells run the visible checks; your instructor's autograder runs more (other
shapes, dtypes, masks), with the course's own copy of the checks.
"""


def _makefile() -> str:
    return """# Two commands:
#   make lab    set up .venv and open the workbook in JupyterLab
#   make test   set up .venv and check it (the references, a notebook run top to bottom)
# Any Python 3.11: make lab PYTHON=/path/to/python3.11
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: lab test

$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null || { \\
	  echo "The workbook needs Python 3.11 (any 3.11.x); '$(PYTHON)' is $$($(PYTHON) --version 2>&1 || echo missing)." >&2; \\
	  echo "Install it (Debian/Ubuntu: sudo apt-get install python3.11 python3.11-venv; macOS: brew install python@3.11)" >&2; \\
	  echo "and name it if it is not on PATH as python3.11: make lab PYTHON=/path/to/python3.11" >&2; exit 2; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[dev]"
	touch $(STAMP)

ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

lab: $(STAMP)
	$(BIN)/python -m course_lib.workspace $(ROOT_FLAG) $(LAB_ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest -q tests
"""


def _pyproject(repo: Path) -> str:
    text = (repo / "pyproject.toml").read_text(encoding="utf-8")
    keep = []
    for line in text.splitlines():
        name = re.match(r'\s*"([A-Za-z0-9_.\-\[\]]+)', line)
        package = re.split(r"[\[<>=!~ ]", name.group(1))[0] if name else ""
        if package in INSTRUCTOR_ONLY_PACKAGES or package == "attention-workbook":
            continue  # the instructor's tools, and the dev extra's own hub extra (a hub installs ".[hub]")
        keep.append(line)
    text = "\n".join(keep) + "\n"
    text = re.sub(r"\n\[project\.scripts\]\n[^\[]*", "\n", text)
    text = text.replace('include = ["course_lib*", "autograder*"]', 'include = ["course_lib*"]')
    return text.replace('name = "attention-workbook"', 'name = "attention-workbook-student"')


_TESTS = '''"""A student's set-up, checked: course_lib's references agree with PyTorch's own, and a
notebook runs top to bottom (its test cells report the stubs you have not filled in yet)."""

import os
import tempfile
from pathlib import Path

import nbformat
import torch
from nbclient import NotebookClient

from course_lib.attention import causal_mask, scaled_dot_product_attention

ROOT = Path(__file__).resolve().parents[1]


def test_attention_matches_pytorch():
    q, k, v = (torch.randn(2, 3, 5, 4) for _ in range(3))
    mask = causal_mask(5)
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.allclose(out, expected, atol=1e-5) and torch.allclose(weights.sum(-1), torch.ones(2, 3, 5))


def test_a_notebook_runs_top_to_bottom():
    path = ROOT / "notebooks" / "03_self_attention" / "03_self_attention.ipynb"
    nb = nbformat.read(str(path), as_version=4)
    os.environ.setdefault("MPLBACKEND", "Agg")
    with tempfile.TemporaryDirectory() as cwd:
        NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=True,
                       resources={"metadata": {"path": cwd}}).execute()
    printed = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "still contains the stub" in printed  # the test cells explain what to do
    crashed = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
               if o.output_type == "error" and o.ename not in ("NotImplementedError",)]
    assert not crashed, [f"{o.ename}: {o.evalue}" for o in crashed][:3]
'''


def write_edition(course: Course, out: Path, repo: Path | None = None) -> list[str]:
    """Write the student edition of the course's repository into ``out`` (which must not
    exist or be empty); returns what it wrote, one line per part. Refuses if anything of a
    solution, a hidden test or a model answer would be in it."""
    repo = repo or course.root
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise CourseError(f"{out} is not empty: the student edition goes into a new folder")
    if out.resolve().is_relative_to(repo.resolve()):
        raise CourseError(f"{out} is inside the course's repository; write the student edition elsewhere")
    from ..course.release import out_of_date
    stale = out_of_date(None, course)
    if stale:
        raise CourseError(f"notebooks/ is out of date ({', '.join(stale)}): run `workbook release` first")
    out.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints")
    shutil.copytree(course.release_dir, out / "notebooks", ignore=ignore)
    shutil.copytree(repo / "course_lib", out / "course_lib", ignore=ignore)
    stripped = 0
    for path in sorted((out / "course_lib" / "grading" / "items").glob("*.py")):
        text = path.read_text(encoding="utf-8")
        if "hidden=True" in text:
            path.write_text(strip_hidden_subchecks(text), encoding="utf-8")
            stripped += text.count("hidden=True")
    for name in ("LICENSE", "constraints.txt", ".gitignore"):
        if (repo / name).exists():
            shutil.copyfile(repo / name, out / name)
    constraints = [line for line in (out / "constraints.txt").read_text().splitlines()
                   if line.split("==")[0].lower() not in INSTRUCTOR_ONLY_PACKAGES]
    (out / "constraints.txt").write_text("\n".join(constraints) + "\n")
    (out / "README.md").write_text(_readme(repo), encoding="utf-8")
    (out / "Makefile").write_text(_makefile())
    (out / "pyproject.toml").write_text(_pyproject(repo))
    (out / "tests").mkdir()
    (out / "tests" / "test_setup.py").write_text(_TESTS)
    leaks = [str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()
             and any(s in p.read_text(encoding="utf-8", errors="replace") for s in _SECRETS)]
    if leaks:
        shutil.rmtree(out)
        raise CourseError(f"the student edition would hold solutions or hidden tests: {', '.join(leaks)}")
    notebooks = len(list((out / "notebooks").glob("*/*.ipynb")))
    return [f"notebooks/: {notebooks} notebooks as released", f"course_lib/: {stripped} hidden sub-checks left out",
            "README.md, Makefile (make lab, make test), pyproject.toml, constraints.txt, tests/"]
