"""The shape of the code, checked: what runs with the student's code is one folder that
imports nothing of the trusted side and is all the sandbox sees of the autograder; the
autograder's folders stand one on another (doors, course, sealing, pipeline, reports,
platforms, commands, then ``cli.py``) and none imports a folder above it; ``course_lib`` and
``autograder`` have no import cycle and reach no other module's private names (imported, or
as ``module._name``)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("course_lib", "autograder")
INSIDE = ROOT / "autograder" / "inside"
# copied into the sandbox's course_lib: they run as course_lib modules, not autograder's
COPIED_INTO_COURSE_LIB = {"grading_init.py", "reference_stubs.py"}
# The autograder's folders, bottom to top: a module imports its own folder and those below it
# (``inside/`` imports none: it runs with the student's code); ``cli.py`` stands on all of them.
FOLDERS = ("inside", "doors", "course", "sealing", "pipeline", "reports", "platforms", "commands")
TOP = {"autograder", "autograder.cli"}


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


def _floor(module: str) -> int | None:
    """The floor of an autograder module (its folder's place in :data:`FOLDERS`; ``cli.py``
    above them all); None for the package itself and for course_lib."""
    parts = module.split(".")
    if parts[0] != "autograder" or module == "autograder":
        return None
    if module in TOP:
        return len(FOLDERS)
    return FOLDERS.index(parts[1])


def _upward(graph: dict[str, set[str]]) -> list[str]:
    """``a -> b`` for every import of a module ``b`` on a floor above ``a``'s."""
    out = []
    for module, deps in sorted(graph.items()):
        here = _floor(module)
        out += [f"{module} -> {dep}" for dep in sorted(deps)
                if here is not None and _floor(dep) is not None and _floor(dep) > here]
    return out


def test_every_module_of_the_autograder_is_in_a_folder():
    loose = [m for m in _modules() if m.startswith("autograder.") and m not in TOP
             and m.split(".")[1] not in FOLDERS]
    assert not loose, f"modules outside the folders {FOLDERS}: {loose}"


def test_no_folder_imports_one_above_it():
    wrong = _upward(_graph())
    assert not wrong, "imports of a folder above: " + "; ".join(wrong)


def test_the_folder_check_finds_an_import_upwards():
    graph = {"autograder.doors.intake": {"autograder.pipeline.run"}, "autograder.pipeline.run": {"autograder.doors.intake"},
             "autograder.cli": {"autograder.platforms.lms"}, "autograder.reports.status": {"course_lib.grading"}}
    assert _upward(graph) == ["autograder.doors.intake -> autograder.pipeline.run"]


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


def _module_names(tree: ast.AST, module: str, path: Path, modules: dict[str, Path]) -> dict[str, str]:
    """Local name -> module of ours, for every name an import binds to one of our modules
    (``from . import intake``, ``import autograder.sealing.sandbox as sandbox``)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PACKAGES:
                    bound[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname \
                        else alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:
                    bound[alias.asname or alias.name] = f"{base}.{alias.name}"
    return bound


def _reached_privately(source: str, module: str, path: Path, modules: dict[str, Path]) -> list[str]:
    """``module._name`` uses of another module of ours (its private names are its own)."""
    tree = ast.parse(source)
    bound = _module_names(tree, module, path, modules)
    out = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
            continue
        chain, value = [], node.value
        while isinstance(value, ast.Attribute):
            chain.insert(0, value.attr)
            value = value.value
        if not isinstance(value, ast.Name) or value.id not in bound:
            continue
        target = ".".join([bound[value.id], *chain])
        if target in modules and target != module:
            out.append(f"{path.relative_to(ROOT)}:{node.lineno} uses {target}.{node.attr}")
    return out


def test_no_private_name_of_another_module_is_reached_as_an_attribute():
    modules = _modules()
    reaching = []
    for module, path in modules.items():
        reaching += _reached_privately(path.read_text(encoding="utf-8"), module, path, modules)
    assert not reaching, "\n".join(reaching)


def test_the_attribute_check_finds_a_private_name_reached():
    modules = {"autograder.doors.intake": ROOT / "autograder/doors/intake.py",
               "autograder.pipeline.collect": ROOT / "autograder/pipeline/collect.py",
               "autograder.sealing.sandbox": ROOT / "autograder/sealing/sandbox.py"}
    source = ("from ..doors import intake\nimport autograder.sealing.sandbox as box\nimport autograder\n"
              "intake._zone('x'); intake.shown('y'); box._bwrap(); autograder.doors.intake._MB\n")
    found = _reached_privately(source, "autograder.pipeline.collect", modules["autograder.pipeline.collect"], modules)
    assert sorted(f.split(" uses ")[1] for f in found) == \
        ["autograder.doors.intake._MB", "autograder.doors.intake._zone", "autograder.sealing.sandbox._bwrap"]


def test_the_inside_package_imports_nothing_of_the_trusted_side():
    """What runs with the student's code may import the standard library, torch, IPython,
    course_lib (the sandbox's filtered copy), libseccomp's binding (the seal's syscall filter) and
    its own sibling modules, nothing else."""
    siblings = {p.stem for p in INSIDE.glob("*.py")}
    allowed_roots = {"torch", "numpy", "IPython", "traitlets", "course_lib", "matplotlib", "workbook_runner",
                     "pyseccomp"} | siblings
    stdlib = set(sys.stdlib_module_names)
    wrong = []
    for path in sorted(INSIDE.glob("*.py")):
        for target, _, line in _imports(path, f"autograder.inside.{path.stem}"):
            root = target.split(".")[0]
            if target.startswith("autograder") or (root not in allowed_roots and root not in stdlib):
                wrong.append(f"{path.name}:{line} imports {target}")
    assert not wrong, wrong


ANSWER = "course_lib.grading.answer"
JUDGE_SIDE = ("course_lib.grading.judge", "course_lib.grading.items")


def _judge_side_reached(graph: dict[str, set[str]], starts: list[str]) -> list[str]:
    """``a -> … -> b`` for each module ``b`` of the judge's side (or course_lib.grading's own
    ``__init__``, which imports it) that a module in ``starts`` reaches through its imports."""
    out = []
    for start in starts:
        seen, todo, via = {start}, [start], {start: None}
        while todo:
            here = todo.pop()
            for dep in sorted(graph.get(here, ())):
                if dep in seen:
                    continue
                seen.add(dep)
                via[dep] = here
                if dep == "course_lib.grading" or dep.startswith(JUDGE_SIDE):
                    chain, at = [dep], here
                    while at is not None:
                        chain.insert(0, at)
                        at = via[at]
                    out.append(" -> ".join(chain))
                    continue
                todo.append(dep)
    return out


def test_the_answer_side_imports_nothing_of_the_judge():
    """course_lib/grading/answer/ is copied whole into the sealed course and runs beside the
    student's code; autograder/inside/ runs there too. Neither may reach the judge's side
    (course_lib.grading.judge, .items), directly or through another module: in the seal it is not
    there, and it must not be."""
    graph = _graph()
    for path in sorted(INSIDE.glob("*.py")):  # (the two copied into course_lib are checked too)
        module = f"autograder.inside.{path.stem}"
        graph[module] = {dep for target, names, _ in _imports(path, module)
                         for dep in _ours(target, _modules(), names) if dep != module}
    starts = sorted(m for m in graph if m == ANSWER or m.startswith(ANSWER + ".") or m.startswith("autograder.inside."))
    assert len([m for m in starts if m.startswith(ANSWER)]) >= 7, starts
    reached = _judge_side_reached(graph, starts)
    assert not reached, "the answer side reaches the judge's: " + "; ".join(reached)


def test_the_answer_rule_finds_a_judge_side_import():
    graph = {"course_lib.grading.answer.perform": {"course_lib.grading.answer.calls", "course_lib.device"},
             "course_lib.grading.answer.calls": {"course_lib.grading.answer.wire"},
             "course_lib.grading.answer.wire": {"course_lib.grading.judge.compare"},
             "autograder.inside.cells": {"course_lib.grading"}, "course_lib.device": set()}
    assert _judge_side_reached(graph, ["course_lib.grading.answer.perform", "autograder.inside.cells"]) == [
        "course_lib.grading.answer.perform -> course_lib.grading.answer.calls -> course_lib.grading.answer.wire "
        "-> course_lib.grading.judge.compare",
        "autograder.inside.cells -> course_lib.grading"]


def test_the_sealed_course_holds_the_answer_side_whole_and_nothing_of_the_judge(tmp_path):
    from autograder.sealing.course_copy import build_course_copy

    build_course_copy(tmp_path, ["causal_mask"])
    grading = tmp_path / "course_lib" / "grading"
    assert sorted(p.name for p in grading.iterdir() if p.name != "__pycache__") == ["__init__.py", "answer"]
    source = ROOT / "course_lib" / "grading" / "answer"
    assert sorted(p.relative_to(grading / "answer").as_posix() for p in (grading / "answer").rglob("*.py")) == \
        sorted(p.relative_to(source).as_posix() for p in source.rglob("*.py"))


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
