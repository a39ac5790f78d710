"""Check specs for notebook 06 (the full Transformer): LayerNorm, PositionwiseFeedForward,
EncoderLayer, DecoderLayer, noam_lr, label_smoothed_cross_entropy, greedy_decode and
bleu, with their mistake catalogues.

The catalogued wrong variants are written standalone (they never call or subclass the
item's reference); layers use course_lib's MultiHeadAttention, as students do.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from ... import bleu as bleu_ref
from ... import decoding as dec_ref
from ... import optim as optim_ref
from ... import transformer as ref
from ...attention import causal_mask
from ...multihead import MultiHeadAttention
from ...positional import sinusoidal_positional_encoding
from ..compare import describe_difference, fmt_num
from ..properties import (
    compare_cases, dtype_name, generator, layout, module_inputs, randn,
    reference_state, seed as salted_seed,
)
from ..calls import Invoke
_FIXTURES = "course_lib.grading.fixtures.transformer"  # Build targets (student side)
from ..spec import Case, CheckFailed, ItemSpec, Mistake, SubCheck
from ..wire import Build

f32, f64 = torch.float32, torch.float64

# ---------------------------------------------------------------------------
# Modules: the grader builds the reference's weights, the student's side loads them
# ---------------------------------------------------------------------------


def _reference_state(cls: type, args: tuple, seed: int) -> dict[str, torch.Tensor]:
    """State of a seeded reference instance, its LayerNorms moved away from (1, 0) so
    that a forgotten γ or β shows (grader side)."""
    state = reference_state(cls, args, seed)
    g = generator(seed + 1)
    for key, value in state.items():
        if key.endswith("gamma"):
            state[key] = 1.0 + 0.3 * torch.randn(value.shape, generator=g)
        elif key.endswith("beta"):
            state[key] = 0.3 * torch.randn(value.shape, generator=g)
    return state


def _module_case(label: str, reference: type, args: tuple, seed: int, dtype: torch.dtype,
                 make_inputs: Callable[[torch.device], dict]) -> Case:
    def make(device: torch.device) -> dict:
        return module_inputs(args, _reference_state(reference, args, seed), device, dtype, **make_inputs(device))

    return Case(label, make)


def _construct(trial, args: tuple, kwargs: dict | None = None, attrs: tuple = (), label: str = "") -> dict:
    """The student's ``impl(*args, **kwargs)``: its parameters (values) and the requested
    attributes it has."""
    built = layout(trial, args, attrs, kwargs=kwargs, values=True, label=label)
    return {"params": built.get("values", {}), "attrs": built.get("attrs", {})}


def _padding(lengths: list[int], T: int, device: torch.device) -> torch.Tensor:
    return (torch.arange(T, device=device)[None, :] < torch.tensor(lengths, device=device)[:, None])[:, None, :]


def _submodules(trial, args: tuple, names: dict[str, str]) -> None:
    """The student's module has the named submodules."""
    label = f"{trial.spec.name}{args}"
    found = layout(trial, args, tuple(names)).get("attrs") or {}
    missing = [n for n in names if not isinstance(found.get(n), dict)]
    if missing:
        wanted = ", ".join(f"`{n}` ({what})" for n, what in names.items())
        raise CheckFailed(f"{label} needs the submodules {wanted}; missing: {', '.join(missing)}. "
                          "The grader copies weights into them by name.")


# ---------------------------------------------------------------------------
# LayerNorm
# ---------------------------------------------------------------------------

class _LNLayout(nn.Module):
    def __init__(self, d_model, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.gamma = nn.Parameter(torch.ones(d_model))
        self.beta = nn.Parameter(torch.zeros(d_model))


class LayerNormUnbiased(_LNLayout):
    def forward(self, x):
        return self.gamma * (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True) + self.eps) + self.beta


class LayerNormWrongAxis(_LNLayout):
    def forward(self, x):
        mean = x.mean(-2, keepdim=True)
        var = x.var(-2, keepdim=True, unbiased=False)
        return self.gamma * (x - mean) / torch.sqrt(var + self.eps) + self.beta


class LayerNormEpsOutside(_LNLayout):
    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        std = x.var(-1, keepdim=True, unbiased=False).sqrt()
        return self.gamma * (x - mean) / (std + self.eps) + self.beta


class LayerNormNoAffine(_LNLayout):
    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        return (x - mean) / torch.sqrt(x.var(-1, keepdim=True, unbiased=False) + self.eps)


LN_MISTAKES = (
    Mistake("unbiased variance", LayerNormUnbiased,
            "You normalise with the unbiased variance (dividing by D − 1, the default of torch.var/std): "
            "LayerNorm uses the biased one, x.var(dim=-1, unbiased=False) or ((x - mean)**2).mean(-1)."),
    Mistake("wrong axis", LayerNormWrongAxis,
            "You normalise over the wrong axis: LayerNorm takes the mean and variance over the features "
            "of each position, the last axis (dim=-1, keepdim=True), not over the positions."),
    Mistake("eps outside the square root", LayerNormEpsOutside,
            "eps is added to the standard deviation: add it to the variance, inside the square root, "
            "(x − mean) / sqrt(var + eps)."),
    Mistake("no gamma and beta", LayerNormNoAffine,
            "The output is normalised but gamma and beta are not applied: return gamma * x_hat + beta."),
)


def _ln_case(shape: tuple, dtype: torch.dtype, seed: int, scale: float = 1.0, shift: float = 0.0) -> Case:
    d = shape[-1]
    words = "" if scale == 1.0 else f" with small spread (std {scale:g})"
    if shift:
        words += f" around {shift:g}"
    return _module_case(f"LayerNorm({d}) on x {shape} {dtype_name(dtype)}{words}", ref.LayerNorm, (d,), seed,
                        dtype, lambda device: {"x": randn(shape, seed, dtype, device) * scale + shift})


def _ln_parameters(trial) -> None:
    built = _construct(trial, (6,), attrs=("eps",), label="LayerNorm(6)")
    params = built["params"]
    if set(params) != {"gamma", "beta"}:
        raise CheckFailed(f"LayerNorm(6) should have exactly the parameters gamma (6,) and beta (6,); yours: "
                          f"{', '.join(f'{k} {tuple(v.shape)}' for k, v in params.items()) or 'none'}.")
    if tuple(params["gamma"].shape) != (6,) or tuple(params["beta"].shape) != (6,):
        raise CheckFailed("gamma and beta must have shape (d_model,).")
    if not (bool((params["gamma"] == 1).all()) and bool((params["beta"] == 0).all())):
        raise CheckFailed("gamma starts at ones and beta at zeros (so a new LayerNorm only normalises).")
    eps = built["attrs"].get("eps", None)
    built2 = _construct(trial, (6,), {"eps": 1e-3}, attrs=("eps",), label="LayerNorm(6, eps=1e-3)")
    if built2["attrs"].get("eps", 1e-3) != 1e-3 or (eps is not None and eps != 1e-5):
        raise CheckFailed("eps defaults to 1e-5 and must be stored as given (LayerNorm(6, eps=1e-3)).")


def _ln_matches_torch(trial) -> None:
    x = randn((3, 4, 10), 77, f64, trial.device)
    state = {"gamma": torch.linspace(0.5, 1.5, 10, dtype=f64), "beta": torch.linspace(-1, 1, 10, dtype=f64)}
    got = trial.student(module_inputs((10,), state, trial.device, f64, x=x), "x (3, 4, 10) float64")
    expected = F.layer_norm(x, (10,), torch.linspace(0.5, 1.5, 10, dtype=f64, device=trial.device),
                            torch.linspace(-1, 1, 10, dtype=f64, device=trial.device), 1e-5)
    problem = describe_difference(expected, got)
    if problem:
        raise CheckFailed(f"Compared with torch.nn.functional.layer_norm on x (3, 4, 10) float64: {problem}")


def _ln_spec() -> ItemSpec:
    return ItemSpec(
        name="LayerNorm",
        reference=ref.LayerNorm,
        invoke=Invoke(module=True, forward=("x",), aliases=True),
        mistakes=LN_MISTAKES,
        forbidden={F.layer_norm: "it calls torch.nn.functional.layer_norm; compute the mean and variance yourself"},
        subchecks=(
            SubCheck("parameters gamma (ones) and beta (zeros), eps stored", 1, _ln_parameters),
            SubCheck("matches the reference on x (2, 3, 8)", 1, compare_cases(_ln_case((2, 3, 8), f32, 300))),
            SubCheck("matches on other shapes, float64, and an input with small spread (where eps matters)", 1,
                     compare_cases(_ln_case((5, 16), f64, 310), _ln_case((2, 2, 3, 12), f32, 320),
                                   _ln_case((2, 4, 6), f64, 330, scale=0.003, shift=5.0)), hidden=True),
            SubCheck("equals torch.nn.functional.layer_norm", 1, _ln_matches_torch, hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# PositionwiseFeedForward
# ---------------------------------------------------------------------------

class _FFNLayout(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)


class FFNNoActivation(_FFNLayout):
    def forward(self, x):
        return self.linear2(self.linear1(x))


class FFNReluAtEnd(_FFNLayout):
    def forward(self, x):
        return torch.relu(self.linear2(torch.relu(self.linear1(x))))


class FFNGelu(_FFNLayout):
    def forward(self, x):
        return self.linear2(F.gelu(self.linear1(x)))


FFN_MISTAKES = (
    Mistake("no activation", FFNNoActivation,
            "There is no ReLU between the two linear maps, so the FFN is one linear map: "
            "use linear2(relu(linear1(x)))."),
    Mistake("ReLU on the output", FFNReluAtEnd,
            "The output goes through a ReLU too: FFN(x) = max(0, x W1 + b1) W2 + b2 has the ReLU only in between."),
    Mistake("GELU", FFNGelu,
            "You used GELU; the original Transformer's FFN uses ReLU, max(0, ·)."),
)


def _ffn_case(B: int, T: int, d: int, d_ff: int, dtype: torch.dtype, seed: int) -> Case:
    return _module_case(f"PositionwiseFeedForward({d}, {d_ff}) on x ({B}, {T}, {d}) {dtype_name(dtype)}",
                        ref.PositionwiseFeedForward, (d, d_ff), seed, dtype,
                        lambda device: {"x": randn((B, T, d), seed, dtype, device)})


def _ffn_parameters(trial) -> None:
    params = _construct(trial, (6, 10), label="PositionwiseFeedForward(6, 10)")["params"]
    expected = {"linear1.weight": (10, 6), "linear1.bias": (10,), "linear2.weight": (6, 10), "linear2.bias": (6,)}
    got = {k: tuple(v.shape) for k, v in params.items()}
    if got != expected:
        raise CheckFailed("PositionwiseFeedForward(d_model=6, d_ff=10) should have exactly "
                          f"{', '.join(f'{k} {v}' for k, v in expected.items())}; yours: "
                          f"{', '.join(f'{k} {v}' for k, v in got.items()) or 'none'}.")
    _construct(trial, (6, 10), {"dropout": 0.1}, label="PositionwiseFeedForward(6, 10, dropout=0.1)")


def _ffn_spec() -> ItemSpec:
    return ItemSpec(
        name="PositionwiseFeedForward",
        reference=ref.PositionwiseFeedForward,
        invoke=Invoke(module=True, forward=("x",), aliases=True),
        mistakes=FFN_MISTAKES,
        subchecks=(
            SubCheck("parameters linear1 (d_model → d_ff) and linear2 (d_ff → d_model); takes dropout", 1,
                     _ffn_parameters),
            SubCheck("matches the reference on a random batch", 1, compare_cases(_ffn_case(2, 5, 8, 16, f32, 400))),
            SubCheck("matches on other sizes and float64 (positions are independent)", 1,
                     compare_cases(_ffn_case(3, 4, 12, 7, f64, 410), _ffn_case(1, 9, 6, 24, f32, 420)), hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# EncoderLayer
# ---------------------------------------------------------------------------

class _LN(nn.Module):
    """A LayerNorm for the mistake variants (same parameter names as the contract)."""

    def __init__(self, d):
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(d))
        self.beta = nn.Parameter(torch.zeros(d))

    def forward(self, x):
        return F.layer_norm(x, (x.size(-1),), self.gamma, self.beta, 1e-5)


class _FFN(_FFNLayout):
    def forward(self, x):
        return self.linear2(torch.relu(self.linear1(x)))


class _EncLayout(nn.Module):
    def __init__(self, d_model, num_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, num_heads)
        self.ffn = _FFN(d_model, d_ff)
        self.norm1, self.norm2 = _LN(d_model), _LN(d_model)

    def sa(self, x, mask):
        return self.self_attn(x, x, x, mask)[0]


class EncoderNormFirstSwapped(_EncLayout):
    def forward(self, x, mask=None):
        if not self.norm_first:
            x = x + self.sa(self.norm1(x), mask)
            return x + self.ffn(self.norm2(x))
        x = self.norm1(x + self.sa(x, mask))
        return self.norm2(x + self.ffn(x))


class EncoderNoAttnResidual(_EncLayout):
    def forward(self, x, mask=None):
        if self.norm_first:
            x = self.sa(self.norm1(x), mask)
            return x + self.ffn(self.norm2(x))
        x = self.norm1(self.sa(x, mask))
        return self.norm2(x + self.ffn(x))


class EncoderNoFFNResidual(_EncLayout):
    def forward(self, x, mask=None):
        if self.norm_first:
            x = x + self.sa(self.norm1(x), mask)
            return self.ffn(self.norm2(x))
        x = self.norm1(x + self.sa(x, mask))
        return self.norm2(self.ffn(x))


class EncoderMaskIgnored(_EncLayout):
    def forward(self, x, mask=None):
        if self.norm_first:
            x = x + self.sa(self.norm1(x), None)
            return x + self.ffn(self.norm2(x))
        x = self.norm1(x + self.sa(x, None))
        return self.norm2(x + self.ffn(x))


class EncoderPreLNResidualNormed(_EncLayout):
    """Pre-LN with the residual taken from the normalised input."""

    def forward(self, x, mask=None):
        if self.norm_first:
            h = self.norm1(x)
            x = h + self.sa(h, mask)
            h = self.norm2(x)
            return h + self.ffn(h)
        x = self.norm1(x + self.sa(x, mask))
        return self.norm2(x + self.ffn(x))


ENC_MISTAKES = (
    Mistake("post-LN and pre-LN swapped", EncoderNormFirstSwapped,
            "Post-LN and pre-LN are swapped: norm_first=False (the original) normalises after the residual sum, "
            "x = norm1(x + attn(x)); norm_first=True normalises the sub-layer's input, x = x + attn(norm1(x))."),
    Mistake("no residual around self-attention", EncoderNoAttnResidual,
            "The residual connection around self-attention is missing: add the layer's input back, x + attn(...)."),
    Mistake("no residual around the FFN", EncoderNoFFNResidual,
            "The residual connection around the feed-forward network is missing: x + ffn(...)."),
    Mistake("mask ignored", EncoderMaskIgnored,
            "The mask is not passed to self-attention, so padded positions are attended to: self_attn(x, x, x, mask)."),
    Mistake("pre-LN residual from the normalised input", EncoderPreLNResidualNormed,
            "In pre-LN the residual adds the un-normalised input: x = x + attn(norm1(x)), not norm1(x) + attn(norm1(x))."),
)


def _enc_case(B: int, T: int, d: int, h: int, d_ff: int, norm_first: bool, dtype: torch.dtype, seed: int,
              lengths: list[int] | None = None) -> Case:
    def inputs(device):
        return {"x": randn((B, T, d), seed, dtype, device),
                "mask": _padding(lengths, T, device) if lengths else None}

    ln = "pre-LN (norm_first=True)" if norm_first else "post-LN"
    m = f"padding mask, lengths {lengths}" if lengths else "no mask"
    return _module_case(f"EncoderLayer({d}, {h}, {d_ff}, norm_first={norm_first}) [{ln}] on x ({B}, {T}, {d}) "
                        f"{dtype_name(dtype)}, {m}", ref.EncoderLayer, (d, h, d_ff, 0.0, norm_first), seed, dtype,
                        inputs)


ENC_FORWARD = ("x", "mask")


def _padding_no_leak(case: Case, lengths: list[int], key: str = "x") -> Callable:
    """Changing the padded positions of ``key`` leaves the outputs at real positions unchanged."""

    def run(trial) -> None:
        inputs = case.make(trial.device)
        before = trial.student(inputs, case.label)
        changed = case.make(trial.device)
        T = changed[key].size(1)
        pad = ~_padding(lengths, T, trial.device)[:, 0, :, None]
        noise = 5.0 * randn(changed[key].shape, 998, changed[key].dtype, trial.device)
        changed[key] = torch.where(pad, noise, changed[key])  # other vectors at the padded positions
        after = trial.student(changed, case.label)
        keep = (torch.arange(before.size(1), device=trial.device)[None, :]
                < torch.tensor(lengths, device=trial.device)[:, None]) if key == "x" else None
        a, b = (before, after) if keep is None else (before[keep], after[keep])
        if describe_difference(a.detach(), b.detach()) is not None:
            raise CheckFailed(f"On {case.label}: changing the padded positions of `{key}` changed the outputs at "
                              "real positions, so padding leaks in: pass the mask to the attention.")

    return run


def _enc_structure(trial) -> None:
    _submodules(trial, (8, 2, 16), {"self_attn": "MultiHeadAttention", "ffn": "PositionwiseFeedForward",
                                    "norm1": "LayerNorm", "norm2": "LayerNorm"})


def _enc_spec() -> ItemSpec:
    pad_case = _enc_case(3, 6, 8, 2, 16, False, f64, 520, [6, 4, 2])
    return ItemSpec(
        name="EncoderLayer",
        reference=ref.EncoderLayer,
        invoke=Invoke(module=True, forward=ENC_FORWARD, aliases=True),
        mistakes=ENC_MISTAKES,
        subchecks=(
            SubCheck("submodules self_attn, ffn, norm1, norm2", 1, _enc_structure),
            SubCheck("post-LN matches the reference (same weights)", 1,
                     compare_cases(_enc_case(2, 5, 8, 2, 16, False, f32, 500))),
            SubCheck("pre-LN (norm_first=True) matches the reference", 1,
                     compare_cases(_enc_case(2, 5, 8, 2, 16, True, f32, 505))),
            SubCheck("matches with padding masks, other sizes, float64, both norm placements", 1,
                     compare_cases(pad_case, _enc_case(2, 7, 12, 3, 10, True, f64, 530, [7, 3]),
                                   _enc_case(1, 4, 16, 4, 32, False, f32, 540)), hidden=True),
            SubCheck("padded positions do not change the real positions' outputs", 1,
                     _padding_no_leak(pad_case, [6, 4, 2]), hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# DecoderLayer
# ---------------------------------------------------------------------------

class _DecLayout(nn.Module):
    def __init__(self, d_model, num_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, num_heads)
        self.cross_attn = MultiHeadAttention(d_model, num_heads)
        self.ffn = _FFN(d_model, d_ff)
        self.norm1, self.norm2, self.norm3 = _LN(d_model), _LN(d_model), _LN(d_model)

    def run(self, x, memory, tgt_mask, memory_mask, pre=None, kv_from_decoder=False, causal=True,
            residual=(True, True, True)):
        pre = self.norm_first if pre is None else pre

        def sa(h):
            return self.self_attn(h, h, h, tgt_mask if causal else None)[0]

        def ca(h):
            src = h if kv_from_decoder else memory
            mask = None if kv_from_decoder else memory_mask
            return self.cross_attn(h, src, src, mask)[0]

        blocks = ((sa, self.norm1), (ca, self.norm2), (self.ffn, self.norm3))
        for (f, norm), res in zip(blocks, residual):
            if pre:
                x = (x if res else 0) + f(norm(x))
            else:
                x = norm((x if res else 0) + f(x))
        return x


class DecoderNoCausalMask(_DecLayout):
    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        return self.run(x, memory, tgt_mask, memory_mask, causal=False)


class DecoderCrossKVFromDecoder(_DecLayout):
    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        return self.run(x, memory, tgt_mask, memory_mask, kv_from_decoder=True)


class DecoderNormFirstSwapped(_DecLayout):
    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        return self.run(x, memory, tgt_mask, memory_mask, pre=not self.norm_first)


class DecoderNoCrossResidual(_DecLayout):
    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        return self.run(x, memory, tgt_mask, memory_mask, residual=(True, False, True))


class DecoderNoSelfResidual(_DecLayout):
    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        return self.run(x, memory, tgt_mask, memory_mask, residual=(False, True, True))


class DecoderMemoryMaskIgnored(_DecLayout):
    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        return self.run(x, memory, tgt_mask, None)


class DecoderCrossBeforeSelf(_DecLayout):
    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        pre = self.norm_first

        def step(x, f, norm):
            return x + f(norm(x)) if pre else norm(x + f(x))

        x = step(x, lambda h: self.cross_attn(h, memory, memory, memory_mask)[0], self.norm1)
        x = step(x, lambda h: self.self_attn(h, h, h, tgt_mask)[0], self.norm2)
        return step(x, self.ffn, self.norm3)


DEC_MISTAKES = (
    Mistake("decoder self-attention without the causal mask", DecoderNoCausalMask,
            "The decoder's self-attention ignores tgt_mask, so each position sees the tokens after it (the "
            "ones it must predict): self_attn(x, x, x, tgt_mask)."),
    Mistake("cross-attention keys and values from the decoder", DecoderCrossKVFromDecoder,
            "Cross-attention takes its keys and values from the decoder: queries come from the decoder, "
            "keys and values from the encoder output, cross_attn(x, memory, memory, memory_mask)."),
    Mistake("post-LN and pre-LN swapped", DecoderNormFirstSwapped,
            "Post-LN and pre-LN are swapped: norm_first=False normalises after each residual sum, "
            "x = norm(x + f(x)); norm_first=True normalises the sub-layer's input, x = x + f(norm(x))."),
    Mistake("no residual around cross-attention", DecoderNoCrossResidual,
            "The residual connection around cross-attention is missing: x + cross_attn(...)."),
    Mistake("no residual around self-attention", DecoderNoSelfResidual,
            "The residual connection around the masked self-attention is missing: x + self_attn(...)."),
    Mistake("memory mask ignored", DecoderMemoryMaskIgnored,
            "memory_mask is not passed to cross-attention, so the decoder attends to padded source positions."),
    Mistake("cross-attention before self-attention", DecoderCrossBeforeSelf,
            "The sub-layers are in the wrong order: masked self-attention (norm1), then cross-attention (norm2), "
            "then the FFN (norm3)."),
)


def _dec_case(B: int, T: int, S: int, d: int, h: int, d_ff: int, norm_first: bool, dtype: torch.dtype, seed: int,
              src_lengths: list[int] | None = None) -> Case:
    def inputs(device):
        return {"x": randn((B, T, d), seed, dtype, device), "memory": randn((B, S, d), seed + 1, dtype, device),
                "tgt_mask": torch.ones(T, T, dtype=torch.bool, device=device).tril(),
                "memory_mask": _padding(src_lengths, S, device) if src_lengths else None}

    ln = "pre-LN (norm_first=True)" if norm_first else "post-LN"
    m = f"source padding mask, lengths {src_lengths}" if src_lengths else "no memory mask"
    return _module_case(f"DecoderLayer({d}, {h}, {d_ff}, norm_first={norm_first}) [{ln}] on x ({B}, {T}, {d}), "
                        f"memory ({B}, {S}, {d}) {dtype_name(dtype)}, causal tgt_mask, {m}",
                        ref.DecoderLayer, (d, h, d_ff, 0.0, norm_first), seed, dtype, inputs)


DEC_FORWARD = ("x", "memory", "tgt_mask", "memory_mask")


def _dec_causal(case: Case) -> Callable:
    def run(trial) -> None:
        inputs = case.make(trial.device)
        before = trial.student(inputs, case.label)
        changed = case.make(trial.device)
        x = changed["x"].clone()
        x[:, -2:] = 3.0 * randn(x[:, -2:].shape, 999, x.dtype, x.device)  # new tokens, not a constant shift
        changed["x"] = x
        after = trial.student(changed, case.label)
        if describe_difference(before[:, :-2].detach(), after[:, :-2].detach()) is not None:
            raise CheckFailed(f"On {case.label}: changing the last two target positions changed the outputs at "
                              "earlier positions: the decoder sees the future. Pass tgt_mask to self-attention.")

    return run


def _dec_memory_matters(case: Case) -> Callable:
    def run(trial) -> None:
        before = trial.student(case.make(trial.device), case.label)
        changed = case.make(trial.device)
        changed["memory"] = changed["memory"] * -1.0 + 1.0
        after = trial.student(changed, case.label)
        if describe_difference(before.detach(), after.detach()) is None:
            raise CheckFailed(f"On {case.label}: the output does not depend on `memory`: cross-attention must "
                              "take its keys and values from the encoder output.")

    return run


def _dec_structure(trial) -> None:
    _submodules(trial, (8, 2, 16), {"self_attn": "MultiHeadAttention", "cross_attn": "MultiHeadAttention",
                                    "ffn": "PositionwiseFeedForward", "norm1": "LayerNorm", "norm2": "LayerNorm",
                                    "norm3": "LayerNorm"})


def _dec_spec() -> ItemSpec:
    pad_case = _dec_case(3, 5, 6, 8, 2, 16, False, f64, 620, [6, 3, 1])
    return ItemSpec(
        name="DecoderLayer",
        reference=ref.DecoderLayer,
        invoke=Invoke(module=True, forward=DEC_FORWARD, aliases=True),
        mistakes=DEC_MISTAKES,
        subchecks=(
            SubCheck("submodules self_attn, cross_attn, ffn, norm1, norm2, norm3", 1, _dec_structure),
            SubCheck("post-LN matches the reference (same weights, causal mask, T ≠ S)", 1,
                     compare_cases(_dec_case(2, 4, 6, 8, 2, 16, False, f32, 600))),
            SubCheck("pre-LN (norm_first=True) matches the reference", 1,
                     compare_cases(_dec_case(2, 4, 6, 8, 2, 16, True, f32, 605))),
            SubCheck("matches with source padding, other sizes, float64, both norm placements", 1,
                     compare_cases(pad_case, _dec_case(2, 6, 3, 12, 3, 10, True, f64, 630, [3, 2]),
                                   _dec_case(1, 3, 7, 16, 4, 32, False, f32, 640)), hidden=True),
            SubCheck("causal: a position's output never depends on later target positions", 1,
                     _dec_causal(_dec_case(2, 6, 5, 8, 2, 16, True, f64, 650)), hidden=True),
            SubCheck("cross-attention reads the encoder output; padded source positions do not leak", 1,
                     lambda t: (_dec_memory_matters(pad_case)(t),
                                _padding_no_leak(pad_case, [6, 3, 1], key="memory")(t)), hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# noam_lr
# ---------------------------------------------------------------------------

def noam_max(step, d_model, warmup):
    return d_model ** -0.5 * max(step ** -0.5, step * warmup ** -1.5)


def noam_warmup_exponent(step, d_model, warmup):
    return d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.0)


def noam_zero_based(step, d_model, warmup):
    s = step + 1
    return d_model ** -0.5 * min(s ** -0.5, s * warmup ** -1.5)


def noam_no_scale(step, d_model, warmup):
    return min(step ** -0.5, step * warmup ** -1.5)


NOAM_MISTAKES = (
    Mistake("max instead of min", noam_max,
            "You take the max of the two branches: the rate is the *smaller* of step^-0.5 and step·warmup^-1.5 "
            "(it rises during warm-up, then decays)."),
    Mistake("peak not at the boundary", noam_warmup_exponent,
            "The two branches do not meet at step = warmup, where the rate must peak: the warm-up branch is "
            "step · warmup^-1.5 (at step = warmup it equals warmup^-0.5)."),
    Mistake("one step late", noam_zero_based,
            "Your schedule is one step late (it uses step + 1): steps count from 1, and the peak is at step = warmup."),
    Mistake("no d_model factor", noam_no_scale,
            "The factor d_model^-0.5 is missing."),
)


def _noam_case(step: int, d_model: int, warmup: int) -> Case:
    where = "the boundary step = warmup" if step == warmup else ("during warm-up" if step < warmup else "after warm-up")
    return Case(f"step={step}, d_model={d_model}, warmup={warmup} ({where})",
                lambda device: {"step": step, "d_model": d_model, "warmup": warmup})


def _noam_float(trial) -> None:
    got = trial.student({"step": 10, "d_model": 512, "warmup": 4000}, "step=10, d_model=512, warmup=4000")
    if not isinstance(got, float):
        raise CheckFailed(f"noam_lr should return a Python float, got {type(got).__name__} "
                          "(use math.sqrt / ** on numbers, or float(...)).")


def _noam_peak(trial) -> None:
    d, w = 64, 50
    rates = [trial.student({"step": s, "d_model": d, "warmup": w}, f"step={s}") for s in range(1, 3 * w)]
    rates = [float(r) for r in rates]
    peak = max(range(len(rates)), key=rates.__getitem__) + 1
    if peak != w:
        raise CheckFailed(f"With d_model={d}, warmup={w} the rate peaks at step {peak}; it should peak at step = warmup = {w}.")


def _noam_spec() -> ItemSpec:
    return ItemSpec(
        name="noam_lr",
        reference=optim_ref.noam_lr,
        mistakes=NOAM_MISTAKES,
        subchecks=(
            SubCheck("values during warm-up, at the boundary and after it (d_model=512, warmup=4000)", 1,
                     compare_cases(_noam_case(1, 512, 4000), _noam_case(4000, 512, 4000),
                                   _noam_case(100000, 512, 4000))),
            SubCheck("returns a Python float", 1, _noam_float),
            SubCheck("other sizes: steps 1, warmup − 1, warmup, warmup + 1", 1,
                     compare_cases(*(_noam_case(s, 64, 10) for s in (1, 9, 10, 11, 500))), hidden=True),
            SubCheck("the rate peaks exactly at step = warmup", 1, _noam_peak, hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# label_smoothed_cross_entropy
# ---------------------------------------------------------------------------

def _ls_parts(logits, target, ignore_index):
    logp = torch.log_softmax(logits, -1)
    keep = target != ignore_index
    safe = torch.where(keep, target, torch.zeros_like(target))
    nll = -logp.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
    return logp, keep, nll


def ls_smoothing_on_ignored(logits, target, epsilon, ignore_index=-100):
    logp, keep, nll = _ls_parts(logits, target, ignore_index)
    loss = (1 - epsilon) * torch.where(keep, nll, torch.zeros_like(nll)) + epsilon * (-logp.mean(-1))
    return loss.sum() / keep.sum()


def ls_mean_over_all(logits, target, epsilon, ignore_index=-100):
    logp, keep, nll = _ls_parts(logits, target, ignore_index)
    loss = (1 - epsilon) * nll + epsilon * (-logp.mean(-1))
    return torch.where(keep, loss, torch.zeros_like(loss)).sum() / keep.numel()


def ls_other_classes(logits, target, epsilon, ignore_index=-100):
    logp, keep, nll = _ls_parts(logits, target, ignore_index)
    K = logits.size(-1)
    others = (-logp.sum(-1) - nll) / (K - 1)
    loss = (1 - epsilon) * nll + epsilon * others
    return torch.where(keep, loss, torch.zeros_like(loss)).sum() / keep.sum()


def ls_pad_class_excluded(logits, target, epsilon, ignore_index=-100):
    logp, keep, nll = _ls_parts(logits, target, ignore_index)
    K = logits.size(-1)
    if 0 <= ignore_index < K:
        cols = [k for k in range(K) if k != ignore_index]
        smooth = -logp[..., cols].mean(-1)
    else:
        smooth = -logp.mean(-1)
    loss = (1 - epsilon) * nll + epsilon * smooth
    return torch.where(keep, loss, torch.zeros_like(loss)).sum() / keep.sum()


def ls_no_smoothing(logits, target, epsilon, ignore_index=-100):
    logp, keep, nll = _ls_parts(logits, target, ignore_index)
    return torch.where(keep, nll, torch.zeros_like(nll)).sum() / keep.sum()


def ls_epsilon_on_target(logits, target, epsilon, ignore_index=-100):
    logp, keep, nll = _ls_parts(logits, target, ignore_index)
    loss = (1 - epsilon) * nll + epsilon * (-logp.sum(-1))
    return torch.where(keep, loss, torch.zeros_like(loss)).sum() / keep.sum()


LS_MISTAKES = (
    Mistake("smoothing on ignored positions", ls_smoothing_on_ignored,
            "Positions whose target is ignore_index still get the smoothing term ε·mean(−log p): the smoothed "
            "target spreads mass onto ignored positions. Drop those positions entirely (both terms)."),
    Mistake("mean over all positions", ls_mean_over_all,
            "You divide by the number of all positions; average over the positions whose target is not "
            "ignore_index only."),
    Mistake("ε spread over the other classes", ls_other_classes,
            "The smoothing mass goes to the K − 1 wrong classes (ε/(K−1) each); as in PyTorch, spread ε "
            "uniformly over all K classes (ε/K each, the right one included): ε · mean_k(−log p_k)."),
    Mistake("padding class excluded from smoothing", ls_pad_class_excluded,
            "You keep the smoothing mass off the ignore_index class; PyTorch spreads ε/K over every class, "
            "the padding class included (only the ignored *positions* are dropped)."),
    Mistake("no smoothing", ls_no_smoothing,
            "epsilon has no effect: the loss is (1 − ε)·(−log p_y) + ε · mean_k(−log p_k)."),
    Mistake("ε times the sum", ls_epsilon_on_target,
            "The smoothing term uses the sum of −log p_k over the classes; it is the mean (ε/K for each class)."),
)


def _ls_case(shape: tuple, K: int, epsilon: float, ignore_index: int | None, dtype: torch.dtype, seed: int) -> Case:
    def make(device):
        logits = randn((*shape, K), seed, dtype, device) * 2
        g = generator(seed + 1)
        target = torch.randint(0, K, shape, generator=g)
        drop = torch.rand(shape, generator=g) < 0.3
        drop.view(-1)[0] = True
        drop.view(-1)[-1] = False
        kw = {"logits": logits, "epsilon": epsilon}
        if ignore_index is None:
            target = torch.where(drop, torch.full_like(target, -100), target)
        else:
            target = torch.where(target == ignore_index, (target + 1) % K, target)
            target = torch.where(drop, torch.full_like(target, ignore_index), target)
            kw["ignore_index"] = ignore_index
        kw["target"] = target.to(device)
        return kw

    ig = "ignore_index=-100 (default)" if ignore_index is None else f"ignore_index={ignore_index} (a real class: padding)"
    return Case(f"logits {(*shape, K)} {dtype_name(dtype)}, epsilon={epsilon}, some targets ignored, {ig}", make)


def _ls_gradients(trial) -> None:
    case = _ls_case((3, 4), 6, 0.1, 0, f64, 790)
    inputs = case.make(trial.device)
    asked = {**inputs, "_grads": {"names": ["logits"], "index": None, "reduce": "sum"}}
    out = trial.student(asked, case.label, probe="gradients")
    loss = out.get("output") if isinstance(out, dict) else None
    if not out.get("connected") or not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        raise CheckFailed(f"On {case.label}: return a scalar tensor connected to the logits (no .item(), no .detach()).")
    g = (out.get("grads") or {}).get("logits")
    ignored = inputs["target"] == 0
    if (not isinstance(g, torch.Tensor) or tuple(g.shape) != tuple(inputs["logits"].shape)
            or not bool(torch.isfinite(g).all())):
        raise CheckFailed(f"On {case.label}: the logits get no finite gradient.")
    if bool((g[ignored] != 0).any()):
        raise CheckFailed(f"On {case.label}: ignored positions get a gradient; they must not affect the loss.")


def _ls_spec() -> ItemSpec:
    return ItemSpec(
        name="label_smoothed_cross_entropy",
        reference=optim_ref.label_smoothed_cross_entropy,
        mistakes=LS_MISTAKES,
        forbidden={F.cross_entropy: "it calls torch.nn.functional.cross_entropy; compute the smoothed loss "
                                    "from log_softmax yourself"},
        subchecks=(
            SubCheck("matches F.cross_entropy(label_smoothing=0.1) on logits (2, 5, 7) with ignored targets", 1,
                     compare_cases(_ls_case((2, 5), 7, 0.1, None, f32, 700))),
            SubCheck("ignore_index = a real class (padding id 0)", 1,
                     compare_cases(_ls_case((3, 4), 9, 0.1, 0, f32, 710))),
            SubCheck("other shapes and epsilons (0, 0.25, 1), float64, ignore_index 3", 1,
                     compare_cases(_ls_case((6,), 5, 0.0, None, f64, 720), _ls_case((2, 3, 4), 11, 0.25, 3, f64, 730),
                                   _ls_case((4, 6), 8, 1.0, 0, f32, 740)), hidden=True),
            SubCheck("a scalar with gradients to the logits; none at ignored positions", 1, _ls_gradients,
                     hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# greedy_decode
# ---------------------------------------------------------------------------

_TRANSFORMER_ARGS = (12, 16, 2, 1, 1, 32)  # vocab, d_model, heads, encoder layers, decoder layers, d_ff


def _transformer_model(seed: int, device: torch.device) -> Build:
    """A small random Transformer: the reference's initialisation (grader side), run by a
    :class:`PlainTransformer` on the student's side."""
    state = reference_state(ref.Transformer, (*_TRANSFORMER_ARGS, 0.0), seed)
    state["out_bias"][2] = 1.5  # EOS likely enough that some sentences end early
    state = {k.replace(".gamma", ".weight").replace(".beta", ".bias"): v for k, v in state.items()}
    return Build(f"{_FIXTURES}:PlainTransformer", _TRANSFORMER_ARGS, state=state, device=str(device), train=False)


def _greedy_case(kind: str, lengths: list[int], S: int, max_len: int, seed: int) -> Case:
    def make(device):
        g = generator(seed)
        src = torch.randint(3, 12, (len(lengths), S), generator=g).to(device)
        mask = _padding(lengths, S, device)
        model = (Build(f"{_FIXTURES}:ScriptedModel", device=str(device), train=False) if kind == "scripted"
                 else _transformer_model(seed, device))
        return {"model": model, "src": src, "src_mask": mask, "bos_id": 1, "eos_id": 2, "max_len": max_len}

    what = ("a scripted model (sentence b predicts <eos> after as many tokens as its source has)" if kind == "scripted"
            else "a small random Transformer")
    return Case(f"{what}, src ({len(lengths)}, {S}) with lengths {lengths}, bos_id=1, eos_id=2, max_len={max_len}",
                make)


def greedy_no_bos(model, src, src_mask, bos_id, eos_id, max_len):
    memory = model.encode(src, src_mask)
    ys = torch.full((src.size(0), 1), bos_id, dtype=torch.long, device=src.device)
    done = torch.zeros(src.size(0), dtype=torch.bool, device=src.device)
    while ys.size(1) < max_len and not bool(done.all()):
        nxt = model.decode(ys, memory, src_mask)[:, -1].argmax(-1)
        nxt = torch.where(done, torch.full_like(nxt, eos_id), nxt)
        ys = torch.cat([ys, nxt[:, None]], 1)
        done |= nxt == eos_id
    return ys[:, 1:]


def greedy_keeps_going(model, src, src_mask, bos_id, eos_id, max_len):
    memory = model.encode(src, src_mask)
    ys = torch.full((src.size(0), 1), bos_id, dtype=torch.long, device=src.device)
    done = torch.zeros(src.size(0), dtype=torch.bool, device=src.device)
    while ys.size(1) < max_len and not bool(done.all()):
        nxt = model.decode(ys, memory, src_mask)[:, -1].argmax(-1)
        ys = torch.cat([ys, nxt[:, None]], 1)
        done |= nxt == eos_id
    return ys


def greedy_last_token_only(model, src, src_mask, bos_id, eos_id, max_len):
    memory = model.encode(src, src_mask)
    ys = torch.full((src.size(0), 1), bos_id, dtype=torch.long, device=src.device)
    done = torch.zeros(src.size(0), dtype=torch.bool, device=src.device)
    while ys.size(1) < max_len and not bool(done.all()):
        nxt = model.decode(ys[:, -1:], memory, src_mask)[:, -1].argmax(-1)
        nxt = torch.where(done, torch.full_like(nxt, eos_id), nxt)
        ys = torch.cat([ys, nxt[:, None]], 1)
        done |= nxt == eos_id
    return ys


def greedy_max_len_new_tokens(model, src, src_mask, bos_id, eos_id, max_len):
    memory = model.encode(src, src_mask)
    ys = torch.full((src.size(0), 1), bos_id, dtype=torch.long, device=src.device)
    done = torch.zeros(src.size(0), dtype=torch.bool, device=src.device)
    while ys.size(1) < max_len + 1 and not bool(done.all()):
        nxt = model.decode(ys, memory, src_mask)[:, -1].argmax(-1)
        nxt = torch.where(done, torch.full_like(nxt, eos_id), nxt)
        ys = torch.cat([ys, nxt[:, None]], 1)
        done |= nxt == eos_id
    return ys


def greedy_stops_at_first_eos(model, src, src_mask, bos_id, eos_id, max_len):
    memory = model.encode(src, src_mask)
    ys = torch.full((src.size(0), 1), bos_id, dtype=torch.long, device=src.device)
    while ys.size(1) < max_len:
        nxt = model.decode(ys, memory, src_mask)[:, -1].argmax(-1)
        ys = torch.cat([ys, nxt[:, None]], 1)
        if bool((nxt == eos_id).any()):
            break
    return ys


GREEDY_MISTAKES = (
    Mistake("no <bos> column", greedy_no_bos,
            "The returned sequences lack the <bos> column: return the whole decoded tensor, starting with bos_id."),
    Mistake("tokens after <eos> not filled", greedy_keeps_going,
            "After a sentence has produced <eos> you keep its later predictions: once finished, fill its remaining "
            "positions with eos_id (torch.where(done, eos_id, next_token))."),
    Mistake("only the last token fed", greedy_last_token_only,
            "You feed only the last token to model.decode: the decoder needs the whole prefix so far "
            "(model.decode(ys, memory, src_mask)), then take the logits of the last position."),
    Mistake("max_len new tokens", greedy_max_len_new_tokens,
            "Your output can be one token too long: max_len counts the <bos> column, so stop when "
            "ys.size(1) == max_len."),
    Mistake("stops at the first <eos> of the batch", greedy_stops_at_first_eos,
            "Decoding stops as soon as one sentence of the batch has finished: keep going until every sentence "
            "has produced <eos> (or max_len is reached)."),
)


def _greedy_int(trial) -> None:
    case = _greedy_case("scripted", [3, 5], 5, 10, 810)
    out = trial.student(case.make(trial.device), case.label)
    if not isinstance(out, torch.Tensor) or out.dtype != torch.long:
        what = out.dtype if isinstance(out, torch.Tensor) else type(out).__name__
        raise CheckFailed(f"greedy_decode should return a LongTensor (B, L), got {what}.")


def _greedy_spec() -> ItemSpec:
    return ItemSpec(
        name="greedy_decode",
        reference=dec_ref.greedy_decode,
        mistakes=GREEDY_MISTAKES,
        forbidden={dec_ref.beam_search: "it calls course_lib's beam_search; write the greedy loop yourself"},
        subchecks=(
            SubCheck("matches the reference on a scripted model (sentences of different lengths)", 1,
                     compare_cases(_greedy_case("scripted", [4, 2, 6], 6, 12, 800))),
            SubCheck("returns a LongTensor", 1, _greedy_int),
            SubCheck("max_len cuts sentences that have not ended; one-sentence batches", 1,
                     compare_cases(_greedy_case("scripted", [7, 5], 7, 5, 820), _greedy_case("scripted", [3], 3, 9, 830)),
                     hidden=True),
            SubCheck("matches the reference on small random Transformers", 1,
                     compare_cases(_greedy_case("transformer", [5, 3, 4, 2], 5, 9, 840),
                                   _greedy_case("transformer", [6, 6], 6, 7, 850)), hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# bleu
# ---------------------------------------------------------------------------

def _grams(tokens, n):
    return Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


def _bleu_core(candidates, references, max_n, clip=True, bp=True, geometric=True, bp_inverted=False):
    matches, totals, c, r = [0] * max_n, [0] * max_n, 0, 0
    for cand, ref_ in zip(candidates, references):
        c += len(cand)
        r += len(ref_)
        for n in range(1, max_n + 1):
            cc, rc = _grams(cand, n), _grams(ref_, n)
            matches[n - 1] += sum((min(k, rc[g]) if clip else (k if g in rc else 0)) for g, k in cc.items())
            totals[n - 1] += max(len(cand) - n + 1, 0)
    if c == 0 or min(matches) == 0:
        return 0.0
    ps = [m / t for m, t in zip(matches, totals)]
    mean = math.exp(sum(map(math.log, ps)) / max_n) if geometric else sum(ps) / max_n
    penalty = 1.0
    if bp and c < r:
        penalty = math.exp(1 - c / r) if bp_inverted else math.exp(1 - r / c)
    return penalty * mean


def bleu_no_clipping(candidates, references, max_n=4):
    return _bleu_core(candidates, references, max_n, clip=False)


def bleu_no_brevity_penalty(candidates, references, max_n=4):
    return _bleu_core(candidates, references, max_n, bp=False)


def bleu_arithmetic_mean(candidates, references, max_n=4):
    return _bleu_core(candidates, references, max_n, geometric=False)


def bleu_bp_inverted(candidates, references, max_n=4):
    return _bleu_core(candidates, references, max_n, bp_inverted=True)


def bleu_sentence_average(candidates, references, max_n=4):
    return sum(_bleu_core([c], [r], max_n) for c, r in zip(candidates, references)) / len(candidates)


BLEU_MISTAKES = (
    Mistake("no clipping", bleu_no_clipping,
            "Your n-gram counts are not clipped: a candidate n-gram counts at most as often as it occurs in the "
            "reference, min(count in candidate, count in reference) (\"the the the the\" must not score 1)."),
    Mistake("no brevity penalty", bleu_no_brevity_penalty,
            "The brevity penalty is missing: when the candidates' total length c is shorter than the references' "
            "r, multiply by exp(1 − r/c)."),
    Mistake("brevity penalty inverted", bleu_bp_inverted,
            "The brevity penalty is exp(1 − r/c) (r: reference length, c: candidate length), not exp(1 − c/r)."),
    Mistake("arithmetic mean of precisions", bleu_arithmetic_mean,
            "You average the n-gram precisions arithmetically: BLEU uses the geometric mean, exp(mean of log p_n)."),
    Mistake("average of sentence scores", bleu_sentence_average,
            "You average sentence-level scores: corpus BLEU pools the clipped n-gram counts and the lengths over "
            "the whole corpus first, then computes one score."),
)


def _bleu_corpus(seed: int, n_sent: int, short: bool = False, repeat: bool = False) -> tuple[list, list]:
    rng = random.Random(salted_seed(seed))
    words = "a b c d e f".split()
    cands, refs = [], []
    for _ in range(n_sent):
        ref_ = [rng.choice(words) for _ in range(rng.randint(5, 10))]
        cand = [w if rng.random() < 0.75 else rng.choice(words) for w in ref_]
        if short:
            cand = cand[:max(4, len(cand) - rng.randint(1, 4))]
        elif rng.random() < 0.3:
            cand = cand + [rng.choice(words)]
        if repeat:
            cand = cand + [cand[0]] * 3
        cands.append(cand)
        refs.append(ref_)
    return cands, refs


def _bleu_case(label: str, cands: list, refs: list, max_n: int = 4) -> Case:
    return Case(label, lambda device: {"candidates": [list(c) for c in cands],
                                       "references": [list(r) for r in refs], "max_n": max_n})


def _bleu_random_case(label: str, seed: int, n_sent: int, short: bool = False, repeat: bool = False,
                      max_n: int = 4) -> Case:
    """A random corpus drawn when the case is made (so that it follows the grading salt)."""

    def make(device) -> dict:
        cands, refs = _bleu_corpus(seed, n_sent, short=short, repeat=repeat)
        return {"candidates": cands, "references": refs, "max_n": max_n}

    return Case(label, make)


HAND_CANDS = [["the", "cat", "sat", "on", "the", "mat"], ["a", "dog", "ran", "in", "the", "park"]]
HAND_REFS = [["the", "cat", "sat", "on", "the", "mat"], ["the", "dog", "ran", "in", "the", "big", "park"]]


def _bleu_range(trial) -> None:
    for label, cands, refs, expected in (
        ("identical candidates and references", [["a", "b", "c", "d", "e"]], [["a", "b", "c", "d", "e"]], 1.0),
        ("no 4-gram in common", [["a", "b", "c", "d"]], [["d", "c", "b", "a"]], 0.0),
    ):
        got = trial.student({"candidates": cands, "references": refs, "max_n": 4}, label)
        if not isinstance(got, (int, float)) or not abs(float(got) - expected) <= 1e-9:  # NaN fails
            raise CheckFailed(f"On {label}: expected {fmt_num(expected)}, got {got!r}. BLEU is a number in [0, 1] "
                              "(no smoothing: a zero precision gives 0).")


def _bleu_spec() -> ItemSpec:
    return ItemSpec(
        name="bleu",
        reference=bleu_ref.bleu,
        mistakes=BLEU_MISTAKES,
        subchecks=(
            SubCheck("the two-sentence example of the notebook", 1,
                     compare_cases(_bleu_case("the notebook's example (2 sentences, the second one word short)",
                                              HAND_CANDS, HAND_REFS))),
            SubCheck("1 for a perfect match, 0 without a common 4-gram", 1, _bleu_range),
            SubCheck("random corpora: longer candidates, repeated words (clipping), short candidates (brevity), "
                     "max_n=2", 1,
                     compare_cases(_bleu_random_case("a random corpus of 8 sentences", 900, 8),
                                   _bleu_random_case("candidates ending in repeated words", 920, 5, repeat=True),
                                   _bleu_random_case("candidates shorter than their references", 910, 6, short=True),
                                   _bleu_random_case("a random corpus with max_n=2", 900, 8, max_n=2)), hidden=True),
        ),
    )


SPECS = {
    spec.name: spec
    for spec in (_ln_spec(), _ffn_spec(), _enc_spec(), _dec_spec(), _noam_spec(), _ls_spec(), _greedy_spec(),
                 _bleu_spec())
}
