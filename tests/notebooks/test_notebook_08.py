"""Notebook 08 (GPT and in-context learning): what its demonstrations must show.
(Its time against its budget: benchmarks/notebook_times.py.)"""

from __future__ import annotations

import math
import re

import pytest

from nbtools import all_text, assert_solution_full_points, assert_student_notebook_reports_stubs, executed_solution

pytestmark = pytest.mark.slow

A = "08_gpt_in_context_learning"


@pytest.fixture(scope="module")
def run():
    nb, seconds = executed_solution(A)
    return nb, all_text(nb), seconds


def test_block_is_causal(run):
    _, out, _ = run
    changes = [float(x) for x in re.findall(r"position \d: output changed by ([\d.e+-]+)", out)]
    assert len(changes) == 6 and all(c == 0.0 for c in changes[:-1]) and changes[-1] > 0.01


def test_parameter_counts(run):
    _, out, _ = run
    counted, torch_says = re.search(r"a small GPT: counted ([\d,]+), PyTorch says ([\d,]+)", out).groups()
    assert counted == torch_says
    gpt2 = float(re.search(r"GPT-2 XL: .*?: ([\d.]+) billion", out).group(1))
    gpt3 = float(re.search(r"GPT-3: .*?: ([\d.]+) billion", out).group(1))
    assert 1.5 < gpt2 < 1.6 and 170 < gpt3 < 180


def test_in_context_learning_rises_from_chance(run):
    _, out, _ = run
    assert "parameters unchanged by the evaluation: True" in out
    rows = re.findall(r"K = +(\d+): transformer ([\d.]+)%   nearest-centroid baseline ([\d.]+)%", out)
    acc = {int(k): float(a) / 100 for k, a, _ in rows}
    base = {int(k): float(b) / 100 for k, _, b in rows}
    assert sorted(acc) == [0, 1, 2, 4, 8, 16]
    # 2000 prompts per K: chance is 0.25 ± 0.01
    assert 0.20 < acc[0] < 0.30 and 0.20 < base[0] < 0.30
    ks = sorted(acc)
    assert all(acc[b] > acc[a] for a, b in zip(ks, ks[1:])), acc
    assert acc[16] >= 0.9 and acc[1] > 0.35
    assert base[16] > 0.9


def test_prompt_format(run):
    _, out, _ = run
    desc = [float(x) / 100 for x in re.search(r"description +([\d.% ]+)\n", out).group(1).replace("%", " ").split()]
    none = [float(x) / 100 for x in re.search(r"no descr\. +([\d.% ]+)\n", out).group(1).replace("%", " ").split()]
    assert len(desc) == len(none) == 4  # K = 0, 1, 2, 4
    assert desc[0] > 0.9 and none[0] < 0.45  # zero-shot: the description is what tells the task
    assert none[-1] > 0.9 and desc[-1] - none[-1] < 0.1  # with examples it matters little


def test_induction_heads(run):
    _, out, _ = run
    losses = {int(n): (float(a), float(b)) for n, a, b in
              re.findall(r"(\d)-layer model: mean loss ([\d.]+) nats on the first half, ([\d.]+) nats on the repeat", out)}
    guess = math.log(32)
    assert losses[2][0] > 0.9 * guess and losses[2][1] < 0.4 * guess, losses
    assert losses[1][1] > 0.7 * guess, losses  # the control does not learn to copy
    scores = [float(s) for s in re.search(r"layer 1, induction score per head: +\[([^\]]*)\]", out).group(1)
              .replace("'", "").split(",")]
    control = float(re.search(r"1-layer control, best induction score: ([\d.]+)", out).group(1))
    assert max(scores) > 0.3 and control < 0.2


def test_plots_and_time(run):
    nb, _, seconds = run
    images = sum(1 for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {}))
    assert images >= 5  # sampling bars, ICL loss, accuracy vs K, induction loss, induction head


def test_solution_runs_with_full_points():
    assert_solution_full_points(A)


def test_student_notebook_reports_the_stubs():
    assert_student_notebook_reports_stubs(A)
