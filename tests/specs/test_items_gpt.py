"""Notebook 08's check specs: independent correct implementations earn every point,
stubs are reported once, statistical checks pass whatever random stream a correct
sampler uses. (Mistakes and reference calls: tests/specs/test_grading_framework.py.)"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from course_lib.grading import get_spec, grade
from course_lib.multihead import MultiHeadAttention
from spec_helpers import assert_full_marks, assert_stub_reported_once


class Block(nn.Module):
    def __init__(self, d_model, num_heads, d_ff, dropout=0.0):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = MultiHeadAttention(d_model, num_heads, dropout)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(), nn.Linear(d_ff, d_model))

    def forward(self, x):
        T = x.size(1)
        causal = torch.tril(torch.ones(T, T, device=x.device)).bool()
        h = self.ln1(x)
        x = x + self.attn(h, h, h, causal)[0]  # the weights path, not the fast one
        return x + self.mlp(self.ln2(x))


def sample_gumbel(logits, temperature=1.0, top_k=None, generator=None):
    """Correct, but draws through the Gumbel-max trick: a different random stream."""
    if temperature == 0:
        return torch.argmax(logits, dim=1)
    z = logits / temperature
    if top_k:
        v, _ = torch.sort(z, dim=1, descending=True)
        z = torch.where(z >= v[:, min(top_k, z.size(1)) - 1:min(top_k, z.size(1))], z, torch.full_like(z, -float("inf")))
    u = torch.rand(z.shape, generator=generator, dtype=z.dtype, device=z.device).clamp_min(1e-12)
    return torch.argmax(z - torch.log(-torch.log(u)), dim=1)


def sample_cumsum(logits, temperature=1.0, top_k=None, generator=None):
    """Correct: inverse-CDF sampling with its own uniform draws."""
    if temperature == 0:
        return logits.max(dim=-1).indices
    z = logits.double() / temperature
    if top_k is not None and top_k < z.size(-1):
        kth = z.topk(top_k).values[:, -1:]
        z[z < kth] = -math.inf
    cdf = torch.softmax(z, -1).cumsum(-1)
    u = torch.rand(z.size(0), 1, generator=generator, dtype=z.dtype, device=z.device)
    return (cdf < u).sum(-1).clamp_max(z.size(-1) - 1)


def gen(model, idx, max_new_tokens, temperature=1.0, top_k=None, generator=None):
    for _ in range(max_new_tokens):
        with torch.no_grad():
            logits = model(idx if idx.size(1) <= model.block_size else idx[:, idx.size(1) - model.block_size:])
        idx = torch.cat((idx, sample_cumsum(logits[:, -1], temperature, top_k, generator).unsqueeze(1)), 1)
    return idx


def count(n_layer, d_model, vocab_size, n_ctx, tied=True):
    d = d_model
    return int(vocab_size * d * (1 if tied else 2) + n_ctx * d + n_layer * (12 * d * d + 13 * d) + 2 * d)


def accuracy(model, task_sampler, shots, n_eval, generator=None):
    mode = model.training
    model.train(False)
    out = {}
    for k in shots:
        x, y = task_sampler(n_eval, k, generator)
        with torch.inference_mode():
            correct = int((model(x)[:, -1].max(-1).indices == y).sum())
        out[k] = correct / n_eval
    model.train(mode)
    return out


@pytest.mark.parametrize("name,impl", [("GPTBlock", Block), ("sample_next_token", sample_gumbel),
                                       ("sample_next_token", sample_cumsum), ("generate", gen),
                                       ("gpt_parameter_count", count), ("few_shot_accuracy", accuracy)])
def test_independent_solutions_earn_full_marks(name, impl):
    assert_full_marks(name, impl)


def test_stubs_are_reported_once():
    class Stub(nn.Module):
        def __init__(self, d_model, num_heads, d_ff, dropout=0.0):
            super().__init__()
            raise NotImplementedError()

    def stub(*args, **kwargs):
        raise NotImplementedError()

    assert_stub_reported_once("GPTBlock", Stub)
    for name in ("sample_next_token", "generate", "gpt_parameter_count", "few_shot_accuracy"):
        assert_stub_reported_once(name, stub)


def test_sampler_ignoring_the_generator_loses_a_point():
    def no_generator(logits, temperature=1.0, top_k=None, generator=None):
        return sample_cumsum(logits, temperature, top_k, None)

    result = grade(get_spec("sample_next_token"), no_generator, hidden=True)
    assert result.earned == get_spec("sample_next_token").points - 1
    assert "`generator` is not used" in "\n".join(r.message for r in result.results)


def test_sampler_returning_b_by_1_is_told_to_squeeze():
    def unsqueezed(logits, temperature=1.0, top_k=None, generator=None):
        return sample_cumsum(logits, temperature, top_k, generator)[:, None]

    result = grade(get_spec("sample_next_token"), unsqueezed, hidden=False)
    assert "Squeeze the last axis" in "\n".join(r.message for r in result.results)


def test_count_returning_a_float_is_told():
    result = grade(get_spec("gpt_parameter_count"), lambda *a, **k: float(count(*a, **k)), hidden=True)
    assert result.earned == 0


def test_block_without_layernorm_modules_is_told():
    class NoLN(Block):
        def __init__(self, d_model, num_heads, d_ff, dropout=0.0):
            super().__init__(d_model, num_heads, d_ff, dropout)
            self.ln1 = nn.Identity()

    result = grade(get_spec("GPTBlock"), NoLN, hidden=False)
    assert "`ln1` should be an nn.LayerNorm" in result.results[0].message
