"""The shape of the code, checked: what runs with the student's code is one folder that
imports nothing of the trusted side and is all the sandbox sees of the autograder;
``course_lib`` and ``autograder`` have no import cycle and import no other module's
private names."""

from __future__ import annotations

import ast
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("course_lib", "autograder")
INSIDE = ROOT / "autograder" / "inside"
# copied into the sandbox's course_lib: they run as course_lib modules, not autograder's
COPIED_INTO_COURSE_LIB = {"grading_init.py", "reference_stubs.py"}


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module(p): p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))
            if "__pycache__" not in p.parts}


def _imports(path: Path, module: str) -> list[tuple[str, tuple[str, ...], int]]:
    """``(imported module, names imported from it, line)`` for every import in the file, at
    any depth (a function-level import is a dependency too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, (), node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.append((target, tuple(a.name for a in node.names), node.lineno))
    return out


def _ours(target: str, modules: dict[str, Path], names: tuple[str, ...] = ()) -> list[str]:
    """The modules of ours an import reaches: the module itself, or its submodules named."""
    found = [target] if target in modules else []
    found += [f"{target}.{n}" for n in names if f"{target}.{n}" in modules]
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        if path.parent == INSIDE and path.name in COPIED_INTO_COURSE_LIB:
            continue
        for target, names, _ in _imports(path, module):
            for dep in _ours(target, modules, names):
                if dep != module and not module.startswith(dep + "."):  # a package's own __init__ is no cycle
                    graph[module].add(dep)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan's algorithm)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    cycles = _cycles(_graph())
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_private_name_is_imported_from_another_module():
    modules = _modules()
    reaching = []
    for module, path in modules.items():
        for target, names, line in _imports(path, module):
            if target.split(".")[0] not in PACKAGES or target == module:
                continue
            private = [n for n in names if n.startswith("_") and not n.startswith("__")
                       and f"{target}.{n}" not in modules]
            if private:
                reaching.append(f"{path.relative_to(ROOT)}:{line} imports {', '.join(private)} from {target}")
    assert not reaching, "\n".join(reaching)


def test_the_inside_package_imports_nothing_of_the_trusted_side():
    """What runs with the student's code may import the standard library, torch, IPython,
    course_lib (the sandbox's filtered copy) and its own sibling modules, nothing else."""
    siblings = {p.stem for p in INSIDE.glob("*.py")}
    allowed_roots = {"torch", "numpy", "IPython", "traitlets", "course_lib", "matplotlib", "workbook_runner"} | siblings
    stdlib = set(sys.stdlib_module_names)
    wrong = []
    for path in sorted(INSIDE.glob("*.py")):
        for target, _, line in _imports(path, f"autograder.inside.{path.stem}"):
            root = target.split(".")[0]
            if target.startswith("autograder") or (root not in allowed_roots and root not in stdlib):
                wrong.append(f"{path.name}:{line} imports {target}")
    assert not wrong, wrong


def test_the_sandbox_mounts_the_inside_folder_and_nothing_else_of_the_autograder(tmp_path, monkeypatch):
    from autograder.sealing import sandbox
    from autograder.pipeline.run import RUNNER

    assert RUNNER.parent == INSIDE
    monkeypatch.setattr(sandbox, "check_available", lambda: "/usr/bin/bwrap")
    argv = sandbox.command(RUNNER, tmp_path / "course", tmp_path, sandbox.Limits(), 100_000, 3)
    autograder = (ROOT / "autograder").resolve()
    mounted = [argv[i + 1] for i, a in enumerate(argv[:-2]) if a in ("--ro-bind", "--bind", "--dev-bind")]
    ours = [m for m in mounted if Path(m).resolve() == autograder or autograder in Path(m).resolve().parents
            or Path(m).resolve() in autograder.parents and Path(m).resolve() != Path("/")
            and str(Path(m).resolve()).startswith(str(ROOT))]
    assert ours == [str(INSIDE)], ours


def test_every_public_list_names_what_its_module_defines():
    """A module's ``__all__`` lists only names it has (a stale entry breaks ``import *`` and
    misleads a reader)."""
    import importlib

    stale = []
    for module, path in _modules().items():
        if path.parent == INSIDE:
            continue  # runs as top-level modules inside the sandbox
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if not any(isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in n.targets)
                   for n in tree.body):
            continue
        loaded = importlib.import_module(module)
        stale += [f"{module}.{name}" for name in loaded.__all__ if not hasattr(loaded, name)]
    assert not stale, stale
