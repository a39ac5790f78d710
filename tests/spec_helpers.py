"""Shared assertions for check specs: a correct independent implementation earns every
point; each catalogued mistake loses points and its hint is shown."""

from __future__ import annotations

from typing import Any

from course_lib.grading import get_spec, grade
from course_lib.grading.runner import ItemResult


def messages(result: ItemResult) -> str:
    return "\n".join(r.message for r in result.results)


def assert_full_marks(name: str, impl: Any) -> ItemResult:
    spec = get_spec(name)
    result = grade(spec, impl, hidden=True, device="cpu")
    assert not result.reference_used, result.reference_used
    assert result.earned == spec.points, f"{name}: {result.earned}/{spec.points}\n{messages(result)}"
    assert result.notes == [], result.notes
    return result


def assert_mistakes_caught(name: str) -> None:
    """Every catalogued mistake of ``name`` loses points, and its own hint is shown."""
    spec = get_spec(name)
    assert spec.mistakes, f"{name} has no mistake catalogue"
    for mistake in spec.mistakes:
        result = grade(spec, mistake.impl, hidden=True, device="cpu")
        assert not result.reference_used, (mistake.name, result.reference_used)
        assert result.earned < spec.points, f"{name}: mistake {mistake.name!r} earns full points"
        text = messages(result)
        assert mistake.hint in text, f"{name}: mistake {mistake.name!r} is caught without its hint:\n{text}"


def assert_reference_earns_nothing(name: str) -> None:
    spec = get_spec(name)
    result = grade(spec, spec.reference, hidden=True, device="cpu")
    assert result.reference_used and result.earned == 0


def assert_stub_reported_once(name: str, stub: Any) -> None:
    spec = get_spec(name)
    result = grade(spec, stub, hidden=True, device="cpu")
    assert result.earned == 0
    failing = [r for r in result.results if r.message not in ("", "not run")]
    assert len(failing) == 1 and "NotImplementedError" in failing[0].message, messages(result)
