"""Notebook 03 (self-attention): what its demonstrations must show
(its time against its budget: benchmarks/notebook_times.py)."""

from __future__ import annotations

import re

import pytest

from nbtools import all_text, assert_solution_full_points, assert_student_notebook_reports_stubs, executed_solution

pytestmark = pytest.mark.slow


def test_demonstrations_show_what_the_text_claims():
    nb, seconds = executed_solution("03_self_attention")
    out = all_text(nb)
    raw, scaled = map(float, re.findall(r"std of A @ B\.T.*?: ([\d.]+)", out))
    assert 16.5 < raw < 18.0 and 0.95 < scaled < 1.05  # √300 ≈ 17.3 → ≈ 1
    assert float(re.search(r"weights on masked positions: ([\d.e+-]+)", out).group(1)) == 0.0
    assert float(re.search(r"largest difference from PyTorch's kernel: ([\d.e+-]+)", out).group(1)) < 1e-5
    assert float(re.search(r"P SelfAttn\(X\)\| = ([\d.e+-]+)", out).group(1)) < 1e-5
    assert "'it' attends most to 'animal'" in out
    mib = [float(m) for m in re.findall(r"weights\s+([\d.]+) MiB", out)]
    assert mib == sorted(mib) and mib[-1] / mib[1] == pytest.approx((2048 / 128) ** 2)
    images = sum(1 for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {}))
    assert images >= 4  # entropy, hand example, masks, cost curves
    widget_views = [o for c in nb.cells for o in c.get("outputs", [])
                    if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert widget_views, "the attention explorer was not displayed as a widget"


def test_solution_runs_with_full_points():
    assert_solution_full_points('03_self_attention')


def test_student_notebook_reports_the_stubs():
    assert_student_notebook_reports_stubs('03_self_attention')
