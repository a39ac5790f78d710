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
- the student part of the README, with its two commands (``make lab``, ``make test``) and the
  path without make, the Makefile's virtualenv part (Python 3.11 to 3.14), ``constraints.txt``
  without the instructor's tools, and a short test suite that checks a student's set-up (the
  references against PyTorch, notebook 03 run top to bottom);
- a ``pyproject.toml`` that ``pip install EDITION`` (a folder or its git URL) reads: course_lib
  and its light dependencies, keeping a PyTorch that is there (Colab, a lab machine); JupyterLab
  is the ``lab`` extra. With ``--install-url URL`` each notebook starts with a cell that runs
  that install on Colab and does nothing elsewhere (:func:`colab_cell`).
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import tempfile
import tomllib
from pathlib import Path

import nbformat

from ..course import Course, CourseError

__all__ = ["write_edition", "strip_hidden_subchecks", "colab_cell", "check_install_url", "INSTRUCTOR_ONLY_PACKAGES"]

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


def _run_argument(node: ast.Call) -> ast.expr | None:
    """A sub-check's check function: its third argument or its ``run`` keyword."""
    if len(node.args) >= 3:
        return node.args[2]
    return next((k.value for k in node.keywords if k.arg == "run"), None)


def _referenced(node: ast.AST, skip: list[ast.AST]) -> set[str]:
    """The names ``node`` uses, outside the sub-trees in ``skip``."""
    inside = {id(n) for s in skip for n in ast.walk(s)}
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and id(n) not in inside}


def _unused_private(tree: ast.Module, dropped: list[ast.AST], removed: set[str]) -> set[str]:
    """Private top-level functions and classes that nothing outside their own definition (and
    outside the ``dropped`` check functions and the ``removed`` definitions) names."""
    defs = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name.startswith("_")}
    named = set()
    for node in tree.body:
        own = node.name if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else None
        if own in removed:
            continue
        named |= _referenced(node, dropped) - {own}
    return defs - removed - named


def strip_hidden_subchecks(source: str) -> str:
    """A check-spec module's source without the code of its hidden sub-checks (their titles
    and points stay) and without the private helpers nothing else uses any more.

    Each hidden ``SubCheck(..., hidden=True)`` keeps its title and points (so the visible tests
    report the same totals) and its check function becomes :data:`_GRADER_ONLY`'s. The source
    is edited as text, never regenerated: everything else stays as written (its comments, its
    layout, and code that the oldest Python the course supports reads, whichever Python makes
    the edition)."""
    tree = ast.parse(source)
    data = source.encode("utf-8")  # (ast's columns count UTF-8 bytes)
    starts = [0]
    for line in data.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))

    def at(line: int, col: int) -> int:
        return starts[line - 1] + col

    edits: list[tuple[int, int, bytes]] = []  # (start, end, replacement) in bytes
    dropped = [arg for node in ast.walk(tree) if _hidden(node) for arg in [_run_argument(node)] if arg is not None]
    outermost = [a for a in dropped if not any(a is not b and a in list(ast.walk(b)) for b in dropped)]
    for arg in outermost:
        edits.append((at(arg.lineno, arg.col_offset), at(arg.end_lineno, arg.end_col_offset), b"_graded_by_the_course"))
    removed: set[str] = set()
    while unused := _unused_private(tree, outermost, removed):
        removed |= unused
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in removed:
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            gone = (starts[first - 1], starts[node.end_lineno])  # its whole lines
            edits = [e for e in edits if not gone[0] <= e[0] < gone[1]] + [(*gone, b"")]
    if outermost:
        imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        after = starts[imports[0].end_lineno] if imports else 0  # (CheckFailed: every items module imports it)
        edits.append((after, after, _GRADER_ONLY.encode() + b"\n"))
    note = "(Student edition: the hidden sub-checks of these items are left out; the grader uses the course's own.)"
    first = tree.body[0] if tree.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str) \
            and data[at(first.end_lineno, first.end_col_offset) - 3:][:3] in (b'"""', b"'''"):
        end = at(first.end_lineno, first.end_col_offset) - 3
        body = data[:end].rstrip()
        edits.append((len(body), end, f"\n\n{note}\n".encode()))
    else:
        edits.append((0, 0, f'"""{note}"""\n'.encode()))
    for start, end, text in sorted(edits, key=lambda e: (e[0], e[1]), reverse=True):
        data = data[:start] + text + data[end:]
    stripped = data.decode("utf-8")
    ast.parse(stripped)  # (an edit that broke the module fails here, not in a student's kernel)
    return stripped


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


def _makefile(repo: Path) -> str:
    """The edition's Makefile: the course's own virtualenv part (the Pythons it accepts, the
    messages that say how to get one), then ``lab`` and ``test``."""
    text = (repo / "Makefile").read_text(encoding="utf-8")
    begin, end = "# --- the virtualenv", "# --- end of the virtualenv ---"
    venv = text[text.index(begin):text.index(end) + len(end)]
    venv = venv.replace("EXTRAS  ?= dev", "EXTRAS  ?= lab,test")
    return f"""# Two commands:
#   make lab    set up .venv and open the workbook in JupyterLab
#   make test   set up .venv and check it (the references, a notebook run top to bottom)
# Without make (Windows, or no make installed): the README's three commands.

{venv}

.PHONY: lab test

lab: $(STAMP)
\t$(BIN)/python -m course_lib.workspace $(LAB_ARGS)

test: $(STAMP)
\t$(BIN)/python -m pytest -q tests
"""


def _requirement(project: dict, name: str) -> str:
    """The course's own requirement string for package ``name`` (its pinned range)."""
    lists = [project["dependencies"], *project["optional-dependencies"].values()]
    for requirement in (r for group in lists for r in group):
        if re.split(r"[\[<>=!~ ;]", requirement, maxsplit=1)[0].lower() == name:
            return requirement
    raise CourseError(f"pyproject.toml names no requirement {name!r}")


def _pyproject(repo: Path) -> str:
    """The edition's pyproject: course_lib and its light dependencies (``pip install EDITION``
    into an environment with torch keeps that torch: Colab, a lab machine), and extras for a
    JupyterLab (``lab``), a hub's student environment (``hub``) and the edition's tests."""
    text = (repo / "pyproject.toml").read_text(encoding="utf-8")
    project = tomllib.loads(text)["project"]

    def names(*packages: str) -> str:
        return "".join(f"\n    {json.dumps(_requirement(project, p))}," for p in packages)

    base = "".join(f"\n    {json.dumps(r)}," for r in project["dependencies"])
    build = text[:text.index("[project]")]
    return f"""{build}[project]
name = "attention-workbook-student"
version = {json.dumps(project["version"])}
description = "A course workbook on attention and transformers: the notebooks and course_lib, for students."
readme = "README.md"
requires-python = {json.dumps(project["requires-python"])}
license = {json.dumps(project["license"])}
dependencies = [{base}
]

[project.optional-dependencies]
lab = [{names("jupyterlab", "ipykernel")}
]
hub = [
    "attention-workbook-student[lab]",{names("jupyterhub", "nbgrader")}
]
test = [{names("pytest", "nbformat", "nbclient")}
]

[tool.setuptools.packages.find]
include = ["course_lib*"]

[tool.setuptools.package-data]
"course_lib.data" = ["*.toml"]
"course_lib" = ["lab_config/*.json", "lab_config/labconfig/*.json"]

[tool.pytest.ini_options]
testpaths = ["tests"]
"""


_TESTS = '''"""A student's set-up, checked: course_lib's references agree with PyTorch's own, and a
notebook runs top to bottom (its test cells report the stubs you have not filled in yet)."""

import os
import tempfile
from pathlib import Path

import nbformat
import torch

from course_lib.attention import causal_mask, scaled_dot_product_attention
from course_lib.notebook_client import NotebookClient

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


COLAB_CELL_TAG = "colab-install"


def check_install_url(url: str) -> str:
    """``url`` as one argument for ``pip install``: a git URL, an archive's URL or a path;
    refused if it could be read as an option or holds characters a URL has no need of."""
    if not url or len(url) > 500 or url.startswith("-") or any(c.isspace() or not c.isprintable() for c in url):
        raise CourseError(f"--install-url must be one URL or path for pip (no spaces, not starting with '-'), "
                          f"got {url!r}")
    return url


def colab_cell(url: str) -> nbformat.NotebookNode:
    """The first cell of each notebook in an edition made with ``--install-url``: on Colab
    (``google.colab`` importable) it installs the course unless it is there already; anywhere
    else it does nothing. pip keeps the PyTorch it finds (the course asks for torch>=2.2)."""
    source = f"""# On Google Colab this cell installs the course (course_lib and its light dependencies;
# Colab's own PyTorch is kept). Anywhere else it does nothing.
import importlib.util
import subprocess
import sys

try:
    import google.colab  # noqa: F401  (importable only on Colab)
except ImportError:
    pass
else:
    if importlib.util.find_spec("course_lib") is None:
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", {check_install_url(url)!r}], check=True)
        importlib.invalidate_caches()"""
    return nbformat.v4.new_code_cell(source, metadata={"tags": [COLAB_CELL_TAG]})


def _add_colab_cells(notebooks: Path, url: str) -> int:
    count = 0
    for path in sorted(notebooks.glob("*/*.ipynb")):
        nb = nbformat.read(str(path), as_version=4)
        cell = colab_cell(url)
        cell.pop("id", None)  # ids as the released notebooks have them (none, or made by nbformat)
        nb.cells.insert(0, cell)
        nbformat.write(nb, str(path))
        count += 1
    return count


EDITION_MARK = ".workbook-edition"  # in an edition's folder: what made it (the course's repository), kept in git


def write_edition(course: Course, out: Path, repo: Path | None = None, install_url: str | None = None) -> list[str]:
    """Write the student edition of the course's repository into ``out``, a git repository:
    made when ``out`` does not exist or is empty, updated in place (one commit of the change)
    when it is an edition made before; any other folder is refused. Returns what it wrote, one
    line per part. Refuses if anything of a solution, a hidden test or a model answer would be in
    it. With ``install_url``, each notebook starts with :func:`colab_cell` (the course installed
    from there on Colab). Students clone it and ``git pull`` each update: their own copies live
    in ``work/``, which git ignores (``make lab`` offers a changed notebook beside theirs)."""
    repo = repo or course.root
    if install_url is not None:
        check_install_url(install_url)
    out = Path(out)
    update = (out / EDITION_MARK).is_file() and (out / ".git").is_dir()
    if out.exists() and any(out.iterdir()) and not update:
        raise CourseError(f"{out} is not empty and not a student edition made before: the student edition goes "
                          "into a new folder, or updates one it made")
    if out.resolve().is_relative_to(repo.resolve()):
        raise CourseError(f"{out} is inside the course's repository; write the student edition elsewhere")
    from ..course.release import out_of_date
    stale = out_of_date(None, course)
    if stale:
        raise CourseError(f"notebooks/ is out of date ({', '.join(stale)}): run `workbook release` first")
    with tempfile.TemporaryDirectory(prefix="workbook-edition-") as staging:
        built = Path(staging) / "edition"
        lines = _build(course, repo, built, install_url)
        lines.append(_publish(built, out, update))
    return lines


def _build(course: Course, repo: Path, out: Path, install_url: str | None) -> list[str]:
    """The edition's files, written into the new folder ``out``."""
    out.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints")
    shutil.copytree(course.release_dir, out / "notebooks", ignore=ignore)
    colab = _add_colab_cells(out / "notebooks", install_url) if install_url is not None else 0
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
    (out / "Makefile").write_text(_makefile(repo))
    (out / "pyproject.toml").write_text(_pyproject(repo))
    (out / "tests").mkdir()
    (out / "tests" / "test_setup.py").write_text(_TESTS)
    (out / EDITION_MARK).write_text("the student edition of a course workbook: `workbook student-edition` updates "
                                    "this folder in place (one commit a change)\n", encoding="utf-8")
    leaks = [str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()
             and any(s in p.read_text(encoding="utf-8", errors="replace") for s in _SECRETS)]
    if leaks:
        raise CourseError(f"the student edition would hold solutions or hidden tests: {', '.join(leaks)}")
    notebooks = len(list((out / "notebooks").glob("*/*.ipynb")))
    first = f", each with a first cell that installs the course on Colab from {install_url}" if colab else ""
    return [f"notebooks/: {notebooks} notebooks as released{first}", f"course_lib/: {stripped} hidden sub-checks left out",
            "README.md, Makefile (make lab, make test), pyproject.toml, constraints.txt, tests/"]


def _git(folder: Path, *args: str) -> subprocess.CompletedProcess:
    """git in ``folder``, with an author where none is configured (the commit is the course's)."""
    identity = ["-c", "user.name=Course staff", "-c", "user.email=course@localhost"] if subprocess.run(
        ["git", "-C", str(folder), "config", "user.email"], capture_output=True, text=True).returncode else []
    return subprocess.run(["git", "-C", str(folder), *identity, *args], capture_output=True, text=True, check=True)


def _publish(built: Path, out: Path, update: bool) -> str:
    """``built`` into ``out``: a new git repository, or the edition's next commit; in words."""
    if shutil.which("git") is None:
        if update:
            raise CourseError("git is not installed: an edition is updated as a git commit (apt-get install git)")
        shutil.copytree(built, out, dirs_exist_ok=True)
        return "git is not installed: a plain folder (students then cannot `git pull` updates)"
    if not update:
        shutil.copytree(built, out, dirs_exist_ok=True)
        _git(out, "init", "-q", "-b", "main")
        _git(out, "add", "-A")
        _git(out, "commit", "-q", "-m", "The course's student edition")
        return f"a git repository: students clone it ({out}), then `git pull` each update"
    for path in sorted(out.iterdir()):  # the edition's files replaced by the new ones; git keeps the history
        if path.name != ".git":
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    shutil.copytree(built, out, dirs_exist_ok=True)
    _git(out, "add", "-A")
    changed = _git(out, "status", "--porcelain").stdout.splitlines()
    if not changed:
        return "updated in place: nothing changed since the last edition (no commit)"
    _git(out, "commit", "-q", "-m", f"Course update: {len(changed)} file{'s' if len(changed) != 1 else ''} changed")
    return (f"updated in place: one commit, {len(changed)} files changed; students `git pull` it (their own copies "
            "in work/ are kept, a changed notebook appears beside theirs)")
