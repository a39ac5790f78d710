"""Notebooks 01 and 02: what their demonstrations must show
(their time against the budget, and notebook 01's claim about time: benchmarks/notebook_times.py)."""

from __future__ import annotations

import re

import pytest

from nbtools import all_text, assert_solution_full_points, assert_student_notebook_reports_stubs, executed_solution

pytestmark = pytest.mark.slow



def _images(nb) -> int:
    return sum(1 for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {}))


def test_notebook_01_shows_the_limits_of_recurrence():
    nb, seconds = executed_solution("01_rnn_limitations")
    out = all_text(nb)
    assert float(re.search(r"largest difference from torch\.nn\.RNN: ([\d.e+-]+)", out).group(1)) < 1e-5
    grads = {float(r): float(v) for r, v in re.findall(r"spectral radius ([\d.]+): ‖∂h_30/∂h_1‖ = ([\d.e+-]+)", out)}
    assert grads[0.5] < 1e-6 and grads[3.0] > 10.0 and 1e-3 < grads[1.0] < 1e3
    rows = {int(L): (float(em), float(tok)) for L, em, tok in
            re.findall(r"length\s+(\d+): exact match\s+([\d.]+)%, token accuracy\s+([\d.]+)%", out)}
    assert sorted(rows) == [4, 8, 12, 16, 20]
    assert rows[4][0] > 95 and rows[20][0] < 5, rows  # short strings copied, long ones not
    tokens = [rows[L][1] for L in sorted(rows)]
    assert all(a > b for a, b in zip(tokens, tokens[1:])), f"token accuracy does not fall with length: {tokens}"
    for L, first, last in re.findall(r"length (\d+): first 4 output positions ([\d.]+)%, last 4 output positions ([\d.]+)%",
                                     out):
        assert float(first) > float(last) + 10, (L, first, last)
    # read straight out of c (no decoder), the start of the input is remembered worst
    first, last = map(float, re.search(r"context readout: first 4 positions ([\d.]+)%, last 4 positions ([\d.]+)%",
                                       out).groups())
    assert last > first + 5 and last > 90, (first, last)
    # the sequential bottleneck, counted (the times are compared in benchmarks/notebook_times.py):
    # the loop runs a few operations a step, one after another, the product a few in all, for
    # the same floating-point operations
    rows = {int(T): (int(loop), int(product), equal) for T, loop, product, equal in re.findall(
        r"T = +(\d+): loop .*?× slower\); +(\d+) operations in a row against (\d+), "
        r"floating-point operations equal: (\w+)", out)}
    assert sorted(rows) == [16, 64, 256, 1024], rows
    assert all(equal == "True" for _, _, equal in rows.values())
    assert len({product for _, product, _ in rows.values()}) == 1  # the same few, whatever T
    per_step = {loop / T for T, (loop, _, _) in rows.items()}
    assert rows[1024][0] >= 2 * 1024 and max(per_step) - min(per_step) < 0.1, rows  # T steps of the same work
    assert _images(nb) >= 5  # loss, accuracy plots, context readout, gradient norms, timing


def test_notebook_02_attention_reads_dates():
    nb, seconds = executed_solution("02_bahdanau_attention")
    out = all_text(nb)
    assert "no date in two splits: True" in out
    attention = float(re.search(r"held-out exact match \(attention\): ([\d.]+)%", out).group(1))
    fixed = float(re.search(r"held-out exact match \(fixed context\): ([\d.]+)%", out).group(1))
    assert attention >= 97.0, f"attention model: {attention}% held-out exact match"
    assert fixed < attention - 5
    worst = dict(re.findall(r"(attention|fixed context)\s*: worst length bin ([\d.]+)%", out))
    assert float(worst["attention"]) >= 90 and float(worst["fixed context"]) < float(worst["attention"])
    mass = {f: float(v) for f, v in re.findall(r"(day|month|year)\s* digits put (\d+)% of their attention", out)}
    assert set(mass) == {"day", "month", "year"} and min(mass.values()) >= 50, mass
    assert _images(nb) >= 3  # loss curve, alignments, comparison


@pytest.mark.parametrize("assignment", ["01_rnn_limitations", "02_bahdanau_attention"])
def test_solution_runs_with_full_points(assignment):
    assert_solution_full_points(assignment)


@pytest.mark.parametrize("assignment", ["01_rnn_limitations", "02_bahdanau_attention"])
def test_student_notebook_reports_the_stubs(assignment):
    assert_student_notebook_reports_stubs(assignment)
