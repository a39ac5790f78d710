"""Shared assertions for check specs: a correct implementation written independently of
course_lib earns every point; a stub is reported once. (Mistake catalogues and reference
calls are covered for every spec by tests/specs/test_grading_framework.py.)"""

from __future__ import annotations

from typing import Any

from course_lib.grading import get_spec, grade
from course_lib.grading.judge.results import ItemResult


def messages(result: ItemResult) -> str:
    return "\n".join(r.message for r in result.results)


def assert_full_marks(name: str, impl: Any) -> ItemResult:
    spec = get_spec(name)
    result = grade(spec, impl, hidden=True, device="cpu")
    assert not result.reference_used, result.reference_used
    assert result.earned == spec.points, f"{name}: {result.earned}/{spec.points}\n{messages(result)}"
    assert result.notes == [], result.notes
    return result


def assert_stub_reported_once(name: str, stub: Any) -> None:
    spec = get_spec(name)
    result = grade(spec, stub, hidden=True, device="cpu")
    assert result.earned == 0
    failing = [r for r in result.results if r.message not in ("", "not run")]
    assert len(failing) == 1 and "NotImplementedError" in failing[0].message, messages(result)
