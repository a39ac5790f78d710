"""A census of every registered check spec: its points, its sub-checks and its mistake
catalogue, as plain data. Two censuses taken before and after a change to
``course_lib/grading`` must be equal when the change keeps the same checks and mistakes.

    .venv/bin/python tests/grading_census.py > census.json
"""

from __future__ import annotations

import json
import sys
from typing import Any

from course_lib.grading.judge.registry import all_specs


def census() -> dict[str, Any]:
    """Per item: points, each sub-check (title, points, hidden), each mistake (name, hint),
    the forbidden callables' reasons, the output names and how an implementation is invoked."""
    out: dict[str, Any] = {}
    for name, spec in sorted(all_specs().items()):
        invoke = spec.invoke.as_data() if hasattr(spec.invoke, "as_data") else repr(spec.invoke)
        out[name] = {
            "points": spec.points,
            "reference": f"{spec.reference.__module__}.{spec.reference.__qualname__}",
            "invoke": invoke,
            "output_names": list(spec.output_names),
            "forbidden": sorted(spec.forbidden.values()),
            "subchecks": [{"title": s.title, "points": s.points, "hidden": s.hidden} for s in spec.subchecks],
            "mistakes": [{"name": m.name, "hint": m.hint} for m in spec.mistakes],
        }
    return out


if __name__ == "__main__":
    json.dump(census(), sys.stdout, indent=1, ensure_ascii=False, sort_keys=True)
    sys.stdout.write("\n")
