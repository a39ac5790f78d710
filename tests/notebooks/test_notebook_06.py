"""Notebook 06 (the Transformer): what its demonstrations must show
(its time against its budget: benchmarks/notebook_times.py)."""

from __future__ import annotations

import re

import pytest

from nbtools import all_text, assert_solution_full_points, assert_student_notebook_reports_stubs, errors, execute, executed_solution, graded_cells, result
from conftest import ROOT

pytestmark = pytest.mark.slow



def _number(pattern: str, text: str) -> float:
    match = re.search(pattern, text)
    assert match, f"the notebook did not print {pattern!r}"
    return float(match.group(1))


def test_transformer_notebook_reaches_its_goals():
    nb, seconds = executed_solution("06_transformer")
    out = all_text(nb)
    assert not errors(nb), errors(nb)
    # the reference equals torch.nn.Transformer with copied weights, post-LN and pre-LN
    diffs = [float(x) for x in re.findall(r"largest difference from torch\.nn\.Transformer: ([\d.e+-]+)", out)]
    assert len(diffs) == 2 and max(diffs) < 1e-5
    # Transformer-base: ≈ 63 M by the formula and in the built model (the paper's "65M")
    formula, built = map(float, re.search(r"Transformer-base: ([\d.]+) M parameters by the formula, ([\d.]+) M", out).groups())
    assert formula == built and 62.5 < formula < 65.5
    # held-out translation quality, greedy and beam
    greedy = _number(r"held-out BLEU \(greedy\): ([\d.]+)", out)
    beam = _number(r"held-out BLEU \(beam 4\): ([\d.]+)", out)
    assert greedy >= 0.9 and beam >= 0.9, (greedy, beam)
    assert _number(r"held-out exact match \(greedy\): ([\d.]+)%", out) > 80
    # the cross-attention of the verb goes back to the middle of the source
    assert _number(r"attending most to the source verb: ([\d.]+)%", out) > 60
    # pre-LN trains a deep stack without warm-up; post-LN lags far behind
    post = _number(r"post-LN final loss \(mean of the last 20 steps\): ([\d.]+)", out)
    pre = _number(r"pre-LN\s+final loss \(mean of the last 20 steps\): ([\d.]+)", out)
    assert pre < 0.6 * post, (pre, post)
    images = sum(1 for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {}))
    assert images >= 4  # schedule, training loss, cross-attention heatmaps, LN curves


def test_grading_mode_trains_only_a_few_steps():
    nb, seconds = execute(ROOT / "solutions" / "06_transformer" / "06_transformer.ipynb", grading=True)
    assert not errors(nb), errors(nb)
    out = all_text(nb)
    assert re.search(r"\b20 steps in", out)
    for c in graded_cells(nb):
        assert float(result(c)) == float(c.metadata.nbgrader.points), c.metadata.nbgrader.grade_id


def test_solution_runs_with_full_points():
    assert_solution_full_points('06_transformer')


def test_student_notebook_reports_the_stubs():
    assert_student_notebook_reports_stubs('06_transformer')
