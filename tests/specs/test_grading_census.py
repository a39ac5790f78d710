"""The census of check specs covers every registered item with its sub-checks and mistakes."""

from __future__ import annotations

from course_lib.grading.judge.registry import all_specs
from grading_census import census


def test_census_lists_every_item_with_its_points():
    data = census()
    assert set(data) == set(all_specs())
    for name, item in data.items():
        assert item["subchecks"], name
        assert item["points"] == sum(s["points"] for s in item["subchecks"]), name
        assert all(m["name"] and m["hint"] for m in item["mistakes"]), name
