"""The synthetic tasks of notebooks 04 and 05, the small attention model and its training loop."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from course_lib.multihead import MultiHeadAttention
from course_lib.synthetic_tasks import IGNORE_INDEX, is_sorted, offset_digits_batch, sortedness_batch
from course_lib.tiny_models import TinyTransformer, accuracy, fit


def test_offset_digits_targets():
    x, y = offset_digits_batch(5, 9, generator=torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (5, 9) and x.dtype == y.dtype == torch.long
    assert bool((y[:, :3] == IGNORE_INDEX).all())
    for b in range(5):
        for t in range(3, 9):
            assert y[b, t].item() == 10 * x[b, t - 1].item() + x[b, t - 3].item()
    x, y = offset_digits_batch(2, 6, offsets=(2,), vocab_size=4, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(y[:, 2:], x[:, :4])
    with pytest.raises(ValueError, match="offsets"):
        offset_digits_batch(2, 3, offsets=(3,))
    # seeded: the same generator state gives the same batch
    a = offset_digits_batch(3, 8, generator=torch.Generator().manual_seed(5))
    b = offset_digits_batch(3, 8, generator=torch.Generator().manual_seed(5))
    assert all(torch.equal(p, q) for p, q in zip(a, b))


def test_sortedness_labels_and_bags():
    x, y = sortedness_batch(4000, 12, vocab_size=10, generator=torch.Generator().manual_seed(0))
    assert x.shape == (4000, 12) and y.shape == (4000,)
    assert torch.equal(y.bool(), is_sorted(x))
    assert int(x.min()) >= 0 and int(x.max()) <= 9
    frac = y.float().mean().item()
    assert 0.45 < frac < 0.55
    # the bag of tokens carries no information about the label: the distribution of
    # sorted multisets is the same in both classes (compare token histograms)
    pos = Counter(x[y == 1].flatten().tolist())
    neg = Counter(x[y == 0].flatten().tolist())
    n_pos, n_neg = sum(pos.values()), sum(neg.values())
    assert max(abs(pos[v] / n_pos - neg[v] / n_neg) for v in range(10)) < 0.01
    # one-swap negatives differ from a sorted row in exactly one adjacent pair
    swapped = [r for r in x[y == 0].tolist() if sum(a > b for a, b in zip(r, r[1:])) == 1]
    assert len(swapped) > 500


def test_tiny_transformer_shapes_masks_and_pooling():
    torch.manual_seed(0)
    for positions in ("none", "sinusoidal", "learned", "relative", "rotary"):
        heads = 1 if positions in ("relative", "rotary") else 2
        m = TinyTransformer(10, 3, d_model=8, num_heads=heads, num_layers=2, positions=positions, max_len=12)
        x = torch.randint(0, 10, (2, 7))
        logits, weights = m(x, need_weights=True)
        assert logits.shape == (2, 7, 3) and len(weights) == 2 and weights[0].shape == (2, heads, 7, 7)
    m = TinyTransformer(10, 3, d_model=8, num_heads=2, pool="max", causal=True).eval()
    x = torch.randint(0, 10, (2, 6))
    _, w = m(x, need_weights=True)
    assert bool((w[0][..., ~torch.ones(6, 6, dtype=torch.bool).tril()] == 0).all())
    # padding: the padded tokens change nothing
    lengths = torch.tensor([6, 4])
    out = m(x, lengths)
    x2 = x.clone()
    x2[1, 4:] = (x2[1, 4:] + 1) % 10
    torch.testing.assert_close(m(x2, lengths), out)
    assert m(x, lengths).shape == (2, 3)
    # an extra attention mask applies on top of the causal one
    window = (torch.arange(6)[:, None] - torch.arange(6)[None, :]) < 2
    _, w = m(x, attn_mask=window, need_weights=True)
    assert bool((w[0][..., ~(window & torch.ones(6, 6, dtype=torch.bool).tril())] == 0).all())
    # window: each position sees the keys within that distance, at any length; with relative
    # positions clipped at the same distance a token's output does not depend on the length
    m = TinyTransformer(10, 3, d_model=8, num_heads=1, positions="relative", max_distance=2, window=2).eval()
    for T in (5, 9):
        _, w = m(torch.randint(0, 10, (2, T)), need_weights=True)
        far = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).abs() > 2
        assert bool((w[0][..., far] == 0).all()) and bool((w[0][..., ~far] > 0).all())
    x = torch.randint(0, 10, (1, 9))
    torch.testing.assert_close(m(x)[:, :4], m(x[:, :7])[:, :4])  # positions 0-3 see the same keys in both
    with pytest.raises(ValueError, match="window"):
        TinyTransformer(10, 3, window=-1)
    with pytest.raises(ValueError, match="single head"):
        TinyTransformer(10, 3, d_model=8, num_heads=2, positions="relative")
    with pytest.raises(ValueError, match="positions"):
        TinyTransformer(10, 3, positions="absolute")


def test_a_student_attention_class_plugs_in():
    class Mine(MultiHeadAttention):  # any class with the MultiHeadAttention interface
        pass

    m = TinyTransformer(10, 3, d_model=8, num_heads=2, attention=Mine)
    assert isinstance(m.layers[0].attn, Mine)


def test_fit_learns_and_restores_threads(two_threads):
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    m = TinyTransformer(10, 10, d_model=16, num_heads=2, positions="learned", max_len=8, causal=True)
    g = torch.Generator().manual_seed(0)

    def batch():  # copy the previous token: one head, a few hundred steps
        x = torch.randint(0, 10, (32, 8), generator=g)
        y = torch.full_like(x, IGNORE_INDEX)
        y[:, 1:] = x[:, :-1]
        return x, y

    history = fit(m, batch, steps=150, lr=1e-2, progress=False)
    assert history.steps == 150 and sum(history.losses[-10:]) / 10 < 0.5 * history.losses[0]
    assert torch.get_num_threads() == threads and not m.training
    x, y = batch()
    with torch.no_grad():
        assert accuracy(m(x), y) > 0.8
    with pytest.raises(ValueError, match="ignore_index"):
        accuracy(torch.zeros(2, 3), torch.full((2,), IGNORE_INDEX))


def test_fit_with_an_attention_penalty_records_the_task_loss_apart():
    from course_lib.training import cosine_schedule

    m = TinyTransformer(10, 2, d_model=8, num_heads=2, pool="mean")
    g = torch.Generator().manual_seed(0)
    batch = lambda: (torch.randint(0, 10, (4, 6), generator=g), torch.randint(0, 2, (4,), generator=g))
    history = fit(m, batch, steps=5, progress=False, attention_penalty=lambda ws: sum(w.sum() for w in ws))
    task = [loss for _, loss in history.evals["task loss"]]
    assert [step for step, _ in history.evals["task loss"]] == [1, 2, 3, 4, 5]
    assert all(total > loss for total, loss in zip(history.losses, task))  # the penalty is positive
    assert cosine_schedule(10)(0) == 1.0 and abs(cosine_schedule(10)(10)) < 1e-12


def test_cosine_schedule_with_a_warm_up():
    import math

    from course_lib.training import cosine_schedule

    f = cosine_schedule(100, warmup=10)
    assert f(0) == pytest.approx(0.1) and f(4) == pytest.approx(0.5 * 0.5 * (1 + math.cos(math.pi * 0.04)))
    assert f(9) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.09)))  # warmed up: the cosine alone
    assert abs(f(100)) < 1e-12 and max(f(s) for s in range(101)) <= 1.0
    with pytest.raises(ValueError, match="warmup"):
        cosine_schedule(10, warmup=-1)
