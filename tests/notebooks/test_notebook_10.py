"""Notebook 10 (attention over images): what its demonstrations must show.
(Its time against its budget: benchmarks/notebook_times.py.)"""

from __future__ import annotations

import re

import pytest

from nbtools import all_text, assert_solution_full_points, assert_student_notebook_reports_stubs, executed_solution

pytestmark = pytest.mark.slow

A = "10_attention_over_images"
NUM = r"(-?[\d.]+)"


@pytest.fixture(scope="module")
def run():
    nb, seconds = executed_solution(A)
    return nb, all_text(nb)


def percent(pattern: str, out: str) -> float:
    found = re.search(pattern, out)
    assert found, f"not printed: {pattern}"
    return float(found.group(1)) / 100


def test_the_captioner_captions_unseen_scenes(run):
    _, out = run
    found = re.search(rf"unseen scenes: captions exactly right {NUM}%, words right {NUM}%", out)
    assert found, out[:2000]
    exact, words = (float(x) / 100 for x in found.groups())
    assert exact >= 0.9 and words >= 0.95
    said = re.findall(r"true: (.+?) +said: (.+)\n", out)
    assert len(said) == 4 and sum(t == s for t, s in said) >= 3


def test_its_attention_points_at_the_named_object_far_above_the_baselines(run):
    _, out = run
    model = percent(rf"pointing accuracy of the captioner: +{NUM}%", out)
    centre = percent(rf"a map that always peaks at the centre: +{NUM}%", out)
    uniform = percent(rf"uniform attention \(a random region\): +{NUM}%", out)
    assert model >= 0.8 and model >= centre + 0.4 and model >= 3 * uniform
    assert 0.1 < uniform < 0.3 and centre < 0.4  # the baselines are what they say
    assert int(re.search(r"(\d+) words of the unseen captions name an object", out).group(1)) > 500


def test_the_penalty_spreads_the_maps_and_costs_pointing(run):
    _, out = run
    rows = {name.strip(): [float(x) for x in values] for name, *values in re.findall(
        rf"\n(no penalty|penalty, lambda = 0.02) +{NUM}% +{NUM}% +{NUM}% +{NUM} +{NUM}", out)}
    assert set(rows) == {"no penalty", "penalty, lambda = 0.02"}
    plain, spread = rows["no penalty"], rows["penalty, lambda = 0.02"]
    # captions, words, pointing (%), entropy, penalty
    assert spread[4] < plain[4]  # the penalty went down: what it asks for
    assert spread[3] > plain[3] + 0.5  # the maps spread out (entropy, at most ln 64 = 4.16)
    assert spread[2] < plain[2] - 5  # and point less often at the object
    assert spread[0] <= plain[0]  # what the captions paid
    # what the notebook says: a nearly flat map still peaks on the object more often than the
    # baselines, and many captions stay right
    centre = percent(rf"a map that always peaks at the centre: +{NUM}%", out) * 100
    assert spread[2] > centre + 10 and spread[0] >= 30 and spread[1] >= 70
    assert all(0 <= r[3] <= 4.16 for r in rows.values())


def test_patches_equal_unfold_and_come_back(run):
    _, out = run
    assert "patchify equals F.unfold(images, 8, stride=8).transpose(1, 2): True" in out
    assert "unpatchify(patchify(images)) equals the images: True" in out
    assert "images (4, 3, 32, 32) -> patches (4, 16, 192)" in out


def test_positions_matter_to_the_vit_and_the_comparison_with_the_cnn_is_stated(run):
    _, out = run
    rows = {name.strip(): (int(n.replace(",", "")), float(acc) / 100) for name, n, acc in re.findall(
        r"\n(ViT with positions|ViT without positions|CNN \(same size\)) +([\d,]+) +([\d.]+)%", out)}
    assert set(rows) == {"ViT with positions", "ViT without positions", "CNN (same size)"}
    vit, blind, cnn = rows["ViT with positions"], rows["ViT without positions"], rows["CNN (same size)"]
    # seen over seeds (docs/claims.md): with positions 68.4-90.2%, without 38.4-44.2%
    assert vit[1] >= 0.6 and blind[1] <= vit[1] - 0.2 and blind[1] < 0.55
    assert cnn[1] >= 0.9
    assert abs(cnn[0] - vit[0]) <= 0.03 * vit[0] and vit[0] == blind[0]  # the same size
    verdict = re.search(r"The (ViT|CNN) is ahead by ([\d.]+) points; positions are worth ([\d.-]+) points", out)
    assert verdict, "no verdict printed"
    leader = "ViT" if vit[1] > cnn[1] else "CNN"
    assert verdict.group(1) == leader
    assert float(verdict.group(2)) == pytest.approx(abs(vit[1] - cnn[1]) * 100, abs=0.11)
    assert float(verdict.group(3)) == pytest.approx((vit[1] - blind[1]) * 100, abs=0.11)


def test_position_similarity_is_measured(run):
    _, out = run
    start, trained = map(float, re.search(
        rf"closeness on the grid: {NUM} at the start, {NUM} after training", out).groups())
    assert abs(start) < 0.35 and -1 <= trained <= 1


def test_rollout_against_the_masks_and_the_heads(run):
    _, out = run
    area = percent(rf"the objects cover {NUM}% of the patches", out)
    fused = {f: percent(rf"rollout of \[CLS\], heads fused by {f}: {NUM}% of its weight", out) for f in ("mean", "max")}
    heads = [float(x) / 100 for x in re.findall(rf"head \d {NUM}%", out)]
    assert len(heads) == 8  # 2 layers of 4 heads
    assert 0.2 < area < 0.5
    # the finding the notebook states: the heads disagree (some far below the objects' share,
    # on the background, others about at it or above; which do what changes with the seed), and
    # rollout, fusing them, lands near the objects' share. Seen over seeds (docs/claims.md):
    # heads 63.5 and 32.8 points apart, the lowest 23.8 and 32.1 below the share, the highest
    # 39.7 and 0.7 above it, the mean rollout 2.8 and 10.3 points from it
    assert max(heads) - min(heads) >= 0.2 and min(heads) <= area - 0.15
    assert abs(fused["mean"] - area) < 0.15 and fused["max"] < max(heads)


def test_the_plots_and_the_explorer_on_patch_tokens_are_shown(run):
    nb, _ = run
    images = sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert images >= 9
    cell = next(c for c in nb.cells if c.cell_type == "code" and "AttentionExplorer(" in c.source)
    assert any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in cell.outputs)


def test_solution_runs_with_full_points():
    assert_solution_full_points(A)


def test_student_notebook_reports_the_stubs():
    assert_student_notebook_reports_stubs(A)
