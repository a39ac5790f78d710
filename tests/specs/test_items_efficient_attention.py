"""Notebook 09's check specs: independent correct implementations earn every point,
stubs are reported once, each catalogued mistake loses points and is named (also under
other salts), and the memory and cache checks catch what they are for."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from course_lib.grading import get_spec, grade
from course_lib.grading.items import efficient_attention as items
from course_lib.sampling import sample_next_token


def assert_full_marks(name, impl):
    spec = get_spec(name)
    result = grade(spec, impl, hidden=True, device="cpu")
    assert not result.reference_used, result.reference_used
    assert result.earned == spec.points, [r.message for r in result.results if not r.passed]
    assert result.notes == [], result.notes


def assert_stub_reported_once(name, stub):
    result = grade(get_spec(name), stub, hidden=True, device="cpu")
    assert result.earned == 0
    failing = [r for r in result.results if r.message not in ("", "not run")]
    assert len(failing) == 1 and "NotImplementedError" in failing[0].message


@pytest.mark.parametrize("name", sorted(items.SPECS))
def test_reference_earns_nothing(name):
    result = grade(get_spec(name), get_spec(name).reference, hidden=True)
    assert result.earned == 0 and "reference" in result.reference_used


def window_mask(T, window, causal=True, device=None):
    i = torch.arange(T, device=device).unsqueeze(1)
    j = torch.arange(T, device=device).unsqueeze(0)
    return (j <= i) & (j > i - window) if causal else (i - j).abs() <= window - 1


def dilated(T, window, dilation, causal=True, device=None):
    out = torch.zeros(T, T, dtype=torch.bool, device=device)
    for i in range(T):
        for n in range(window):
            for j in ((i - n * dilation,) if causal else (i - n * dilation, i + n * dilation)):
                if 0 <= j < T:
                    out[i, j] = True
    return out


def global_tokens(mask, global_positions):
    out = mask.clone()
    for g in [int(p) for p in global_positions]:
        out[..., g, :] = True
        out[..., :, g] = True
    return out


def windowed(q, k, v, window, causal=True):
    """Chunked: each block of `block` queries sees its own keys and `window` - 1 keys on either side
    (blocks of at least 512 queries: a loop of 65,536 tiny blocks at T = 262,144 took minutes)."""
    T, d = q.size(-2), q.size(-1)
    block = max(window, 512)
    outs = []
    for s in range(0, T, block):
        qb = q[..., s:s + block, :]
        lo, hi = max(0, s - window + 1), min(T, s + block + (0 if causal else window - 1))
        kb, vb = k[..., lo:hi, :], v[..., lo:hi, :]
        i = torch.arange(s, s + qb.size(-2), device=q.device)[:, None]
        j = torch.arange(lo, hi, device=q.device)[None, :]
        allowed = ((j <= i) & (j > i - window)) if causal else ((i - j).abs() < window)
        scores = (qb @ kb.transpose(-1, -2)) / math.sqrt(d)
        outs.append(torch.softmax(scores.masked_fill(~allowed, -math.inf), -1) @ vb)
    return torch.cat(outs, dim=-2)


def tiled(q, k, v, block_size, causal=False):
    """Keeps the normalised output and the log-sum-exp instead of max and sum."""
    T_q, T_k = q.size(-2), k.size(-2)
    out = torch.zeros(*q.shape[:-1], v.size(-1), dtype=q.dtype, device=q.device)
    lse = torch.full((*q.shape[:-1], 1), -math.inf, dtype=q.dtype, device=q.device)
    for s in range(0, T_k, block_size):
        sc = q @ k[..., s:s + block_size, :].transpose(-1, -2) / math.sqrt(q.size(-1))
        if causal:
            sc = sc.masked_fill(torch.arange(s, s + sc.size(-1), device=q.device) > torch.arange(T_q, device=q.device)[:, None], -math.inf)
        block_lse = torch.logsumexp(sc, -1, keepdim=True)
        new_lse = torch.logaddexp(lse, block_lse)
        w_old = torch.nan_to_num(torch.exp(lse - new_lse))
        w_new = torch.nan_to_num(torch.exp(sc - new_lse))
        out = out * w_old + w_new @ v[..., s:s + block_size, :]
        lse = torch.where(torch.isinf(new_lse), lse, new_lse)
    return out


class Cache:
    def __init__(self):
        self.keys, self.values = [], []

    def append(self, k, v):
        self.keys.append(k)
        self.values.append(v)
        return torch.cat(self.keys, dim=2), torch.cat(self.values, dim=2)

    def __len__(self):
        return sum(k.shape[2] for k in self.keys)


def make_cached_generate(cache_cls):
    def cached_generate(model, idx, max_new_tokens, temperature=1.0, top_k=None, generator=None):
        caches = None
        with torch.no_grad():
            for _ in range(max_new_tokens):
                if caches is not None and len(caches[0]) < model.block_size:
                    logits = model(idx[:, -1:], caches=caches)
                else:
                    caches = [cache_cls() for _ in model.blocks]
                    logits = model(idx[:, -model.block_size:], caches=caches)
                idx = torch.cat([idx, sample_next_token(logits[:, -1], temperature, top_k, generator)[:, None]], 1)
        return idx

    return cached_generate


def features(x, projection):
    m = projection.shape[0]
    return torch.exp(torch.einsum("...td,md->...tm", x, projection) - x.pow(2).sum(-1, keepdim=True) / 2) / m ** 0.5


def linear(q, k, v, feature_map, causal=False):
    fq, fk = feature_map(q), feature_map(k)
    if not causal:
        return torch.einsum("...tm,...md->...td", fq, torch.einsum("...sm,...sd->...md", fk, v)) / \
            torch.einsum("...tm,...m->...t", fq, fk.sum(-2)).unsqueeze(-1)
    outs = []
    for t in range(q.size(-2)):
        s = fq[..., t:t + 1, :] @ fk[..., :t + 1, :].transpose(-1, -2)
        outs.append((s / s.sum(-1, keepdim=True)) @ v[..., :t + 1, :])
    return torch.cat(outs, -2)


CORRECT = {
    "sliding_window_mask": window_mask,
    "dilated_window_mask": dilated,
    "add_global_tokens": global_tokens,
    "sliding_window_attention": windowed,
    "online_softmax_attention": tiled,
    "KVCache": Cache,
    "cached_generate": make_cached_generate(Cache),
    "performer_features": features,
    "linear_attention": linear,
}


@pytest.mark.parametrize("name", sorted(CORRECT))
def test_independent_correct_implementations_earn_every_point(name):
    assert_full_marks(name, CORRECT[name])


def _stub(*args, **kwargs):
    raise NotImplementedError()


class StubCache:
    def __init__(self):
        raise NotImplementedError()


@pytest.mark.parametrize("name", sorted(CORRECT))
def test_stub_is_reported_once(name):
    assert_stub_reported_once(name, StubCache if name == "KVCache" else _stub)


MISTAKES = [(name, m) for name, spec in items.SPECS.items() for m in spec.mistakes]


@pytest.mark.parametrize("salt", [0, 7, 31337])
@pytest.mark.parametrize("item,mistake", MISTAKES, ids=[f"{n}-{m.name}" for n, m in MISTAKES])
def test_mistakes_are_named_under_other_salts(item, mistake, salt):
    spec = get_spec(item)
    result = grade(spec, mistake.impl, hidden=True, salt=salt)
    assert not result.reference_used
    assert result.earned < spec.points
    assert mistake.hint in "\n".join(r.message for r in result.results)


MEMORY_TITLE = "no (T, T) tensor: T = 262,144, window 4 (a (T, T) one would need 256 GiB)"


def test_full_attention_with_a_window_mask_fails_only_the_memory_check():
    def masked_full(q, k, v, window, causal=True):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=window_mask(q.size(-2), window, causal, q.device))

    result = grade(get_spec("sliding_window_attention"), masked_full, hidden=True)
    failed = [r for r in result.results if not r.passed]
    assert [r.title for r in failed] == [MEMORY_TITLE]
    assert "would need 256 GiB" in failed[0].message and "T · window" in failed[0].message


def test_the_memory_check_cannot_be_talked_out_of_by_the_student_process():
    """The attack on an in-process measurement: the (T, T) scores made in numpy (invisible to
    torch's dispatcher) and the grader's memory probe replaced by one that reports a tiny
    tensor. Neither earns the point: at this T the machine itself refuses the (T, T) array."""
    import numpy as np

    from course_lib.grading.answer import probes

    def numpy_scores(q, k, v, window, causal=True):
        s = np.asarray(q.detach()) @ np.swapaxes(np.asarray(k.detach()), -1, -2) / math.sqrt(q.size(-1))
        s = np.where(np.asarray(window_mask(q.size(-2), window, causal)), s, -np.inf)  # (…, T, T) in numpy
        w = np.exp(s - s.max(-1, keepdims=True))
        return torch.from_numpy((w / w.sum(-1, keepdims=True)) @ np.asarray(v.detach())).to(q.dtype)

    forged = probes.PROBES["memory"]
    probes.PROBES["memory"] = lambda subject, impl, inputs, options: {"output": impl(**inputs), "largest": [1]}
    try:
        result = grade(get_spec("sliding_window_attention"), numpy_scores, hidden=True)
    finally:
        probes.PROBES["memory"] = forged
    failed = {r.title: r.message for r in result.results if not r.passed}
    assert set(failed) == {MEMORY_TITLE, "gradients reach q, k and v"}  # numpy also cuts the gradients
    assert "would need 256 GiB" in failed[MEMORY_TITLE]


def test_full_scores_in_one_block_fail_only_the_memory_check():
    def one_block(q, k, v, block_size, causal=False):
        s = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
        if causal:
            s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=q.device).triu(1), -math.inf)
        return torch.softmax(s, -1) @ v

    result = grade(get_spec("online_softmax_attention"), one_block, hidden=True)
    assert [r.title for r in result.results if not r.passed] == [
        items.ADVICE + "never more than (T_q, block_size) scores: T = 256, block_size 16"]
    assert result.earned == get_spec("online_softmax_attention").points  # advice: measured in the student's process


def test_generation_without_a_cache_loses_the_one_token_per_step_point_with_the_mistake_named():
    """A "cache" that recomputes everything gives generate's tokens; the model that answers right
    only when fed the newest token with its caches tells it apart, from the tokens alone."""
    def no_cache(model, idx, max_new_tokens, temperature=1.0, top_k=None, generator=None):
        with torch.no_grad():
            for _ in range(max_new_tokens):
                logits = model(idx[:, -model.block_size:])[:, -1]
                idx = torch.cat([idx, sample_next_token(logits, temperature, top_k, generator)[:, None]], 1)
        return idx

    result = grade(get_spec("cached_generate"), no_cache, hidden=True)
    failed = [r for r in result.results if not r.passed]
    assert [r.title for r in failed] == ["one new token per step with the caches: prompt 4, 6 steps"]
    assert failed[0].mistake == "recomputes every step" and items.RECOMPUTE_HINT in failed[0].message
    assert result.earned == get_spec("cached_generate").points - 1


def _notebook(source: str) -> dict:
    """Names defined by ``source`` run as a notebook cell (one shared global namespace)."""
    space = {"torch": torch, "sample_next_token": sample_next_token}
    exec(compile(source, "<notebook>", "exec"), space)  # the test's own code
    return space


GENERATE_WITH_GLOBAL_CACHE = """
def cached_generate(model, idx, max_new_tokens, temperature=1.0, top_k=None, generator=None):
    caches = None
    with torch.no_grad():
        for _ in range(max_new_tokens):
            if caches is not None and len(caches[0]) < model.block_size:
                logits = model(idx[:, -1:], caches=caches)
            else:
                caches = [KVCache() for _ in model.blocks]
                logits = model(idx[:, -model.block_size:], caches=caches)
            idx = torch.cat([idx, sample_next_token(logits[:, -1], temperature, top_k, generator)[:, None]], 1)
    return idx
"""


def test_cached_generate_is_judged_with_the_graders_cache_and_the_cache_on_its_own():
    """A wrong KVCache costs KVCache's points only: cached_generate, which builds its caches by
    the notebook's name KVCache, is run with the grader's cache; the student's name is left
    as it was."""
    wrong = items.CACHE_MISTAKES[0].impl  # returns only the new keys
    space = _notebook(GENERATE_WITH_GLOBAL_CACHE)
    space["KVCache"] = wrong
    assert grade(get_spec("KVCache"), wrong, hidden=True).earned < get_spec("KVCache").points
    result = grade(get_spec("cached_generate"), space["cached_generate"], hidden=True)
    assert result.earned == get_spec("cached_generate").points, [r.message for r in result.results if not r.passed]
    assert space["KVCache"] is wrong
    from course_lib.grading.answer.fixtures.efficient import GraderCache
    borrowed = grade(get_spec("KVCache"), GraderCache, hidden=True)
    assert borrowed.earned == 0 and "the grader's own cache" in borrowed.reference_used


def test_the_fresh_window_size_is_drawn_for_each_grading():
    sizes = set()

    def recording(T, window, causal=True, device=None):
        sizes.add(T)
        return window_mask(T, window, causal, device)

    for salt in (3, 7, 11, 19, 31337):
        assert grade(get_spec("sliding_window_mask"), recording, hidden=True, salt=salt).earned == \
            get_spec("sliding_window_mask").points
    assert len(sizes - {1, 4, 5, 6, 9, 12}) >= 2, sizes  # fresh sizes beyond the fixed cases, not one


def test_a_cache_that_modifies_the_mask_in_place_loses_the_point():
    def in_place(mask, global_positions):
        for g in global_positions:
            mask[..., int(g), :] = True
            mask[..., :, int(g)] = True
        return mask

    result = grade(get_spec("add_global_tokens"), in_place, hidden=True)
    assert [r.title for r in result.results if not r.passed] == ["the input mask is left unchanged"]
