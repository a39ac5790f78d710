"""Notebook 07 (BERT): the measured goals of its experiments
(its time against its budget: benchmarks/notebook_times.py)."""

from __future__ import annotations

import re

import pytest

from nbtools import all_text, assert_solution_full_points, assert_student_notebook_reports_stubs, executed_solution

pytestmark = pytest.mark.slow

A = "07_bert_mlm_nsp"


def _percent(pattern: str, text: str) -> float:
    match = re.search(pattern, text)
    assert match, f"nothing matches {pattern!r}"
    return float(match.group(1)) / 100


@pytest.fixture(scope="module")
def run():
    nb, seconds = executed_solution(A)
    return nb, all_text(nb), seconds


def test_bpe_demonstration(run):
    _, out, _ = run
    assert "unrelated    -> un ##related" in out
    assert "special ids: {'[PAD]': 0, '[UNK]': 1, '[CLS]': 2, '[SEP]': 3, '[MASK]': 4}" in out
    assert "un ##us" in out  # a word the stories never use is split into pieces


def test_mlm_well_above_unigram_baseline(run):
    _, out, _ = run
    mlm = _percent(r"held-out MLM accuracy: ([\d.]+)%", out)
    unigram = _percent(r"unigram baseline, always '[^']+': ([\d.]+)%", out)
    assert mlm > 2.5 * unigram and mlm - unigram > 0.25, (mlm, unigram)


def test_nsp_goal(run):
    _, out, _ = run
    assert _percent(r"held-out NSP accuracy: ([\d.]+)%", out) >= 0.85


def test_nsp_plateau_then_jump(run):
    # what the text describes: NSP at chance at the first evaluation, far above it at the end
    _, out, _ = run
    curve = re.search(r"NSP accuracy during pre-training: (.*)", out)
    assert curve, "the notebook prints the NSP curve"
    points = [(int(step), int(acc) / 100) for step, acc in re.findall(r"(\d+): (\d+)%", curve.group(1))]
    assert len(points) >= 6
    assert points[0][1] <= 0.6 and points[-1][1] >= 0.85, points


def test_finetuning_beats_training_from_scratch(run):
    _, out, _ = run
    pretrained = _percent(r"pre-trained\s*: ([\d.]+)%", out)
    scratch = _percent(r"from scratch\s*: ([\d.]+)%", out)
    assert pretrained > scratch + 0.25 and pretrained > 0.6, (pretrained, scratch)


def test_probe_per_layer(run):
    nb, out, _ = run
    probe = dict(re.findall(r"^(cls|mean) ((?:\d+% ?)+)$", out, re.M))
    assert set(probe) == {"cls", "mean"}
    cls_acc = [int(x.rstrip("%")) for x in probe["cls"].split()]
    mean_acc = [int(x.rstrip("%")) for x in probe["mean"].split()]
    assert len(cls_acc) == len(mean_acc) == 3  # embeddings + 2 layers
    assert cls_acc[0] <= 15  # the [CLS] embedding is the same for every sentence: chance
    assert cls_acc[-1] >= 80 and mean_acc[0] >= 80  # [CLS] learned the topic; words carry it from the start
    images = sum(1 for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {}))
    assert images >= 2  # pre-training curves, probe per layer


def test_solution_runs_with_full_points():
    assert_solution_full_points(A)


def test_student_notebook_reports_the_stubs():
    assert_student_notebook_reports_stubs(A)
