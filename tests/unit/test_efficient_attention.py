"""course_lib's efficient-attention references (notebook 09) against PyTorch's own
kernels, and the key/value cache against notebook 08's generate."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from conftest import devices
from course_lib.attention import sliding_window_mask
from course_lib.cost import compare_generation, largest_tensor_bytes
from course_lib.efficient_attention import (KVCache, add_global_tokens, cached_generate, dilated_window_mask,
                                            linear_attention, local_global_attention, online_softmax_attention,
                                            performer_features, random_projection, sliding_window_attention)
from course_lib.long_context import LongContextModel
from course_lib.synthetic_tasks import shift_by_first_batch
from course_lib.gpt import GPT
from course_lib.sampling import generate


def qkv(*shape, dtype=torch.float64, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*shape, generator=g, dtype=dtype).to(device) for _ in range(3))


def test_masks_by_hand():
    assert sliding_window_mask(4, 2).int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]]
    assert sliding_window_mask(4, 2, causal=False).int().tolist() == [[1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 1],
                                                                      [0, 0, 1, 1]]
    assert dilated_window_mask(6, 2, 2).int().tolist() == [
        [1, 0, 0, 0, 0, 0], [0, 1, 0, 0, 0, 0], [1, 0, 1, 0, 0, 0],
        [0, 1, 0, 1, 0, 0], [0, 0, 1, 0, 1, 0], [0, 0, 0, 1, 0, 1]]
    both = dilated_window_mask(7, 2, 3, causal=False)
    assert both[3].int().tolist() == [1, 0, 0, 1, 0, 0, 1]
    assert torch.equal(dilated_window_mask(9, 4, 1), sliding_window_mask(9, 4))
    assert torch.equal(dilated_window_mask(9, 4, 1, causal=False), sliding_window_mask(9, 4, causal=False))


def test_global_tokens_touch_only_their_rows_and_columns():
    base = sliding_window_mask(8, 2)
    out = add_global_tokens(base, [0, 5])
    assert bool(out[[0, 5]].all()) and bool(out[:, [0, 5]].all())
    rest = torch.ones(8, dtype=torch.bool)
    rest[[0, 5]] = False
    assert torch.equal(out[rest][:, rest], base[rest][:, rest])
    assert torch.equal(base, sliding_window_mask(8, 2))  # the input is not modified
    batched = add_global_tokens(base.expand(3, 8, 8), torch.tensor([2]))
    assert batched.shape == (3, 8, 8) and bool(batched[:, :, 2].all())


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window", [1, 3, 8, 40])
def test_sliding_window_attention_equals_masked_kernel(device, causal, window):
    q, k, v = qkv(2, 3, 33, 8, device=device)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=sliding_window_mask(33, window, causal, device))
    assert torch.allclose(sliding_window_attention(q, k, v, window, causal), expected, atol=1e-12)


def test_sliding_window_attention_float32_and_gradients():
    q, k, v = (t.float().requires_grad_() for t in qkv(1, 50, 16, seed=1))
    out = sliding_window_attention(q, k, v, 5)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=sliding_window_mask(50, 5))
    assert torch.allclose(out, expected, atol=1e-5)
    out.sum().backward()
    assert all(t.grad is not None and bool(t.grad.abs().sum() > 0) for t in (q, k, v))


def test_sliding_window_attention_keeps_no_square_tensor():
    """Every tensor autograd saves for the backward pass is O(T · window), none (T, T)."""
    T, window = 256, 4
    q, k, v = (t.float().requires_grad_() for t in qkv(1, T, 8, seed=2))
    sizes = []

    def pack(t):
        sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        sliding_window_attention(q, k, v, window)
    assert sizes and max(sizes) < T * T / 4


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block_size", [1, 5, 16, 64, 100])
def test_online_softmax_equals_kernel_in_float32(device, causal, block_size):
    q, k, v = qkv(2, 2, 64, 16, dtype=torch.float32, device=device, seed=3)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    assert torch.allclose(online_softmax_attention(q, k, v, block_size, causal), expected, atol=2e-6, rtol=1e-5)


def test_online_softmax_large_scores_and_cross_attention():
    q, k, v = qkv(3, 7, 8, seed=4)
    k2, v2 = torch.randn(3, 29, 8, dtype=torch.float64), torch.randn(3, 29, 5, dtype=torch.float64)
    q = 30 * q  # sharp: a running max that is not rescaled would overflow or differ
    expected = F.scaled_dot_product_attention(q, k2, v2)
    assert torch.allclose(online_softmax_attention(q, k2, v2, 4), expected, atol=1e-10)


def test_kv_cache_concatenates_along_time():
    cache = KVCache()
    assert len(cache) == 0
    k1, v1 = torch.randn(2, 3, 4, 5), torch.randn(2, 3, 4, 6)
    K, V = cache.append(k1, v1)
    assert torch.equal(K, k1) and torch.equal(V, v1) and len(cache) == 4
    k2, v2 = torch.randn(2, 3, 1, 5), torch.randn(2, 3, 1, 6)
    K, V = cache.append(k2, v2)
    assert torch.equal(K, torch.cat([k1, k2], 2)) and torch.equal(V, torch.cat([v1, v2], 2)) and len(cache) == 5


def test_gpt_with_caches_equals_gpt_without():
    torch.manual_seed(5)
    model = GPT(17, 16, d_model=32, num_layers=2, num_heads=4).eval()
    idx = torch.randint(0, 17, (2, 11))
    full = model(idx)
    caches = [KVCache() for _ in model.blocks]
    first = model(idx[:, :6], caches=caches)
    steps = [model(idx[:, t:t + 1], caches=caches) for t in range(6, 11)]
    assert torch.allclose(torch.cat([first, *steps], 1), full, atol=1e-5)
    with pytest.raises(ValueError, match="block size"):
        model(torch.zeros(2, 6, dtype=torch.long), caches=caches)


@pytest.mark.parametrize("prompt,new", [(3, 0), (3, 1), (5, 10), (14, 9), (20, 4)])
@pytest.mark.parametrize("temperature,top_k", [(0.0, None), (1.0, None), (0.8, 5)])
def test_cached_generate_gives_generate_tokens(prompt, new, temperature, top_k):
    torch.manual_seed(6)
    model = GPT(23, 16, d_model=32, num_layers=2, num_heads=2).eval()
    idx = torch.randint(0, 23, (3, prompt))
    a = generate(model, idx, new, temperature, top_k, torch.Generator().manual_seed(7))
    b = cached_generate(model, idx, new, temperature, top_k, torch.Generator().manual_seed(7))
    assert a.shape == (3, prompt + new) and torch.equal(a, b)



def test_compare_generation_times_each_method_and_tells_different_tokens_apart():
    """Every method gets the same seeded generator for a length; 'same' is False as soon as
    one method writes other tokens, and the thread setting is restored afterwards."""
    torch.manual_seed(6)
    model = GPT(23, 16, d_model=32, num_layers=2, num_heads=2).eval()
    prompt = torch.randint(0, 23, (2, 3))

    def shifted(m, idx, n, generator=None):
        out = generate(m, idx, n, 1.0, None, generator)
        out[:, -1] = (out[:, -1] + 1) % 23 if n else out[:, -1]
        return out

    threads = torch.get_num_threads()
    runs = compare_generation({"generate": lambda m, idx, n, generator=None: generate(m, idx, n, 1.0, None, generator),
                               "cached": lambda m, idx, n, generator=None: cached_generate(m, idx, n, 1.0, None,
                                                                                          generator),
                               "shifted": shifted}, model, prompt, [0, 4, 7], progress=False)
    assert torch.get_num_threads() == threads
    assert runs["new_tokens"] == [0, 4, 7] and runs["same"] == [True, False, False]
    assert set(runs["seconds"]) == {"generate", "cached", "shifted"}
    assert all(len(t) == 3 and all(s > 0 for s in t) for t in runs["seconds"].values())
    # positions the model computed, counted: every step recomputes the whole sequence without a
    # cache (3 + i positions at step i), one position a step after the prompt with one
    assert runs["positions"]["generate"] == runs["positions"]["shifted"] == [sum(3 + i for i in range(n))
                                                                             for n in (0, 4, 7)]
    assert runs["positions"]["cached"] == [0, 3 + 3, 3 + 6]
    alike = compare_generation({"generate": lambda m, idx, n, generator=None: generate(m, idx, n, 1.0, None, generator),
                                "cached": lambda m, idx, n, generator=None: cached_generate(m, idx, n, 1.0, None,
                                                                                           generator)},
                               model, prompt, [5], progress=False)
    assert alike["same"] == [True]


def test_performer_features_are_unbiased():
    g = torch.Generator().manual_seed(8)
    d = 8
    a, b = 0.4 * torch.randn(d, generator=g, dtype=torch.float64), 0.4 * torch.randn(d, generator=g, dtype=torch.float64)
    for orthogonal in (False, True):
        w = random_projection(100_000, d, torch.Generator().manual_seed(9), orthogonal, torch.float64)
        phi_a, phi_b = performer_features(a[None], w), performer_features(b[None], w)
        assert bool((phi_a > 0).all())
        assert math.isclose((phi_a @ phi_b.T).item(), math.exp(a @ b), rel_tol=0.02)


def test_performer_formula():
    x = torch.randn(2, 5, 4, dtype=torch.float64)
    w = torch.randn(6, 4, dtype=torch.float64)
    expected = torch.exp(x @ w.T - (x ** 2).sum(-1, keepdim=True) / 2) / math.sqrt(6)
    assert torch.allclose(performer_features(x, w), expected)


@pytest.mark.parametrize("causal", [False, True])
def test_linear_attention_equals_explicit_kernel_attention(causal):
    q, k, v = qkv(2, 3, 19, 4, seed=10)
    w = torch.randn(32, 4, dtype=torch.float64)

    def phi(x):
        return performer_features(x, w)

    s = phi(q) @ phi(k).transpose(-2, -1)
    if causal:
        s = s * torch.ones(19, 19, dtype=torch.float64).tril()
    expected = (s / s.sum(-1, keepdim=True)) @ v
    assert torch.allclose(linear_attention(q, k, v, phi, causal), expected, atol=1e-10)


def test_performer_approximates_soft_attention_with_many_features():
    q, k, v = qkv(1, 256, 16, seed=11)
    q, k = 0.5 * q, 0.5 * k  # soft attention; sharp attention needs far more features
    d = q.size(-1)
    expected = F.scaled_dot_product_attention(q, k, v)
    w = random_projection(4096, d, torch.Generator().manual_seed(12), dtype=torch.float64)

    def phi(x):
        return performer_features(x * d ** -0.25, w)

    err = (linear_attention(q, k, v, phi) - expected).norm() / expected.norm()
    assert err < 0.1


@pytest.mark.parametrize("positions", [[0], [0, 17], [39]])
def test_local_global_attention_equals_masked_kernel(positions):
    q, k, v = qkv(2, 40, 8, seed=13)
    mask = add_global_tokens(sliding_window_mask(40, 5, causal=False), positions)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.allclose(local_global_attention(q, k, v, 5, positions), expected, atol=1e-12)


def test_shift_by_first_task():
    x, y = shift_by_first_batch(3, 50, n_shifts=4, vocab_size=8, generator=torch.Generator().manual_seed(0))
    s = x[:, 0] - 8
    assert bool(((s >= 0) & (s < 4)).all()) and bool((x[:, 1:] < 8).all())
    assert torch.equal(y[:, 1:], (x[:, 1:] + s[:, None]) % 8) and bool((y[:, 0] == -100).all())


@pytest.mark.parametrize("kind,sees_first", [("full", True), ("window", False), ("window + global", True)])
def test_only_full_and_global_attention_see_the_first_token_far_away(kind, sees_first):
    torch.manual_seed(14)
    model = LongContextModel(12, 8, kind, window=4).eval()
    x, _ = shift_by_first_batch(1, 64, generator=torch.Generator().manual_seed(1))
    y = x.clone()
    y[:, 0] = 8 + (x[0, 0] - 8 + 1) % 4  # another shift token
    changed = (model(x)[:, 10:] - model(y)[:, 10:]).abs().max().item()
    assert (changed > 1e-6) == sees_first


def test_largest_tensor_bytes_sees_the_score_matrix():
    q, k, v = (torch.randn(1, 256, 8) for _ in range(3))
    from course_lib.attention import scaled_dot_product_attention
    assert largest_tensor_bytes(lambda: scaled_dot_product_attention(q, k, v)) >= 256 * 256 * 4
    assert largest_tensor_bytes(lambda: sliding_window_attention(q, k, v, 4)) <= 256 * 4 * 8 * 4  # (T, window, d)
    assert largest_tensor_bytes(lambda: online_softmax_attention(q, k, v, 16)) <= 256 * 16 * 4  # (T, block_size)


@pytest.mark.parametrize("T,window,causal", [(1, 1, True), (5, 7, False), (31, 8, True), (32, 8, False), (33, 1, False)])
def test_blocked_window_edges_and_gradients_equal_the_masked_kernel(T, window, causal):
    """Lengths that are not a multiple of the window, windows longer than the input, and the
    gradients (padding queries must not turn them into nan)."""
    q, k, v = (t.requires_grad_() for t in qkv(2, T, 4, seed=T))
    out = sliding_window_attention(q, k, v, window, causal)
    q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
    expected = F.scaled_dot_product_attention(q2, k2, v2, attn_mask=sliding_window_mask(T, window, causal))
    assert torch.allclose(out, expected, atol=1e-12)
    (out * torch.arange(out.numel()).reshape(out.shape)).sum().backward()
    (expected * torch.arange(out.numel()).reshape(out.shape)).sum().backward()
    for a, b in ((q, q2), (k, k2), (v, v2)):
        assert torch.allclose(a.grad, b.grad, atol=1e-10)


def test_blocked_window_holds_no_key_copy_per_query():
    """Scores of (T, 3·window) and views of the padded keys: nothing of (T, window, d)."""
    T, window, d = 1024, 32, 64
    q, k, v = (torch.randn(1, T, d) for _ in range(3))
    largest = largest_tensor_bytes(lambda: sliding_window_attention(q, k, v, window, causal=False))
    assert largest <= max(T * 3 * window, (T + 2 * window) * d) * 4


def test_long_context_model_heads_and_two_stage_training():
    from course_lib.long_context import shift_accuracy, train_long_context

    with pytest.raises(ValueError, match="divisible"):
        LongContextModel(12, 8, "full", d_model=30, num_heads=4)
    with pytest.raises(ValueError, match="attention must be one of"):
        LongContextModel(12, 8, "sparse")
    run = train_long_context("window + global", long_T=96, short_T=32, short_steps=3, long_steps=2,
                             batch_size=8, progress=False)
    assert run.short.steps == 3 and run.long.steps == 2 and run.long_T == 96
    assert run.seconds_per_step > 0 and 0.0 <= run.accuracy <= 1.0
    full = train_long_context("full", long_T=96, short_T=32, short_steps=1, long_steps=1, batch_size=8,
                              progress=False)
    # a step's operations, counted: the window and one global token score fewer pairs than all T x T
    assert 0 < run.flops_per_step < full.flops_per_step
    assert run.accuracy == shift_accuracy(run.model, 96)  # fresh inputs, the same every time
