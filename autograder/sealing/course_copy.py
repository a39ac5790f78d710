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
  stub raises :class:`ReferenceUnavailable` until its item has been graded, then
  becomes the real class (its source, which course_lib's students have anyway, is sent
  by the grader and run in its module): a later demonstration that builds on it runs
  as in the student's notebook. A function given something that is not plain data (a
  model, a callable) raises :class:`ReferenceUnavailable`: that demonstration stops
  while a notebook is graded (its cell does not count);
- ``course_lib/grading`` keeps only what the student's side needs to answer calls
  (:mod:`course_lib.grading.answer.calls`, ``perform``, ``probes``, ``watch``, ``silence``,
  :mod:`~course_lib.grading.answer.wire`, the input fixtures); the check specs, hidden tests and catalogued mistakes are not there.
  ``check`` and ``working_or_reference`` become harmless placeholders.
"""

from __future__ import annotations

import ast
import compileall
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterable

__all__ = ["build_course_copy", "build_font_cache", "reference_targets", "ORACLE_MODULE"]

ORACLE_MODULE = "_grading_oracle"

# What course_lib/grading keeps in the sandbox: its student's side, whole (the judge and the
# items stay with the grader).
_GRADING_KEEP = {"answer"}

_INSIDE = Path(__file__).resolve().parents[1] / "inside"  # the two modules copied into the sandbox's course_lib


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

    def visit_Module(self, node: ast.Module) -> ast.Module:
        body = []
        for stmt in node.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and stmt.name in self.names:
                target, item, is_class = self.names[stmt.name]
                maker = "reference_class" if is_class else "function"
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
    shutil.copyfile(_INSIDE / "grading_init.py", grading / "__init__.py")
    shutil.copyfile(_INSIDE / "reference_stubs.py", target / f"{ORACLE_MODULE}.py")
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
    # compiled here, once, so that no run compiles it again (the sandbox writes no bytecode)
    compileall.compile_dir(str(target), quiet=2)
    build_font_cache(dest / "matplotlib")
    # make it world-readable (the sandbox may run as another user)
    for p in [dest, *dest.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return dest


def build_font_cache(folder: Path) -> Path | None:
    """matplotlib's font list (``fontlist-v*.json``) built once into ``folder``, by a Python of
    this environment that sees the fonts a sealed run sees (the system's and matplotlib's own:
    its home is an empty folder); the seal mounts it read-only (autograder/sealing/sandbox.py), so
    that no sealed run lists the system's fonts again (``fc-list``, half a CPU-second). None when
    matplotlib could not build one (each run then builds its own)."""
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as home:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home, "MPLCONFIGDIR": str(folder),
               "MPLBACKEND": "Agg", "LANG": "C.UTF-8"}
        try:
            subprocess.run([sys.executable, "-s", "-c", "import matplotlib.font_manager"], env=env, cwd=home,
                           capture_output=True, timeout=300, check=True)
        except (OSError, subprocess.SubprocessError):
            return None
    found = sorted(folder.glob("fontlist-*.json"))
    return found[-1] if found else None


def fingerprint(path: Path) -> str:
    """A short hash of every file under ``path`` (to tell course versions apart)."""
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            h.update(str(p.relative_to(path)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:16]
