"""The sandbox's copy of course_lib (autograder/sealing/course_copy.py): compiled once by the
grader, so that no sandboxed run compiles it again (the sandbox writes no bytecode, and every
submission imports a dozen course modules), and compiled from the stubbed sources."""

from __future__ import annotations

import importlib.util
import marshal
from pathlib import Path

from autograder.sealing.course_copy import ORACLE_MODULE, build_course_copy


def _bytecode(source: Path) -> Path:
    return Path(importlib.util.cache_from_source(str(source)))


def _code(pyc: Path) -> object:
    return marshal.loads(pyc.read_bytes()[16:])  # after the header: magic, flags, mtime, size


def _names(code) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= _names(const)
    return names


def test_every_module_of_the_copy_is_compiled_for_this_python(tmp_path):
    target = build_course_copy(tmp_path / "copy", ["causal_mask", "scaled_dot_product_attention"]) / "course_lib"
    sources = sorted(target.rglob("*.py"))
    assert len(sources) > 20
    missing = [str(p.relative_to(target)) for p in sources if not _bytecode(p).is_file()]
    assert not missing, f"no bytecode for {missing}"
    # the bytecode is the stubbed module's, not course_lib's reference
    code = _code(_bytecode(target / "attention.py"))
    assert {"_workbook_stub", f"course_lib.{ORACLE_MODULE}"} <= _names(code)
    functions = {c.co_name for c in code.co_consts if hasattr(c, "co_name")}
    assert "causal_mask" not in functions and "scaled_dot_product_attention" not in functions
    # and readable by the sandbox's user
    assert all(p.stat().st_mode & 0o004 for p in target.rglob("*.pyc"))
