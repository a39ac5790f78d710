"""Check specs for notebook 06's layers: LayerNorm, PositionwiseFeedForward, EncoderLayer
and DecoderLayer, with their mistake catalogues.

Every layer is graded with the grader's weights (the reference's seeded initialisation,
LayerNorms moved away from (1, 0) so that a forgotten γ or β shows). The catalogued
wrong variants are written standalone (they never call or subclass the item's
reference); layers use course_lib's MultiHeadAttention, as students do.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ... import transformer as ref
from ...multihead import MultiHeadAttention
from ..answer.calls import Invoke, earlier
from ..judge.compare import describe_difference
from ..judge.properties import (compare_cases, dtype_name, generator, layout, module_case, module_inputs, no_future_leak,
                          padding, padding_no_leak, parameter_shapes, randn, variant)
from ..judge.spec import Case, CheckFailed, ItemSpec, Mistake, SubCheck

f32, f64 = torch.float32, torch.float64


def _moved_norms(seed: int) -> Callable[[nn.Module], None]:
    """``adjust`` for :func:`reference_state`: every LayerNorm's γ and β drawn around (1, 0)."""

    def adjust(module: nn.Module) -> None:
        g = generator(seed + 1)
        for key, value in module.state_dict().items():
            if key.endswith("gamma"):
                value.copy_(1.0 + 0.3 * torch.randn(value.shape, generator=g))
            elif key.endswith("beta"):
                value.copy_(0.3 * torch.randn(value.shape, generator=g))

    return adjust


def _layer_case(label: str, cls: type, args: tuple, seed: int, dtype: torch.dtype, inputs: Callable) -> Case:
    return module_case(label, cls, args, seed, dtype, inputs, adjust=_moved_norms(seed))


def _submodules(trial, args: tuple, names: dict[str, str]) -> None:
    """The student's module has the named submodules (the grader loads weights into them by name)."""
    found = layout(trial, args, tuple(names)).get("attrs") or {}
    missing = [n for n in names if not isinstance(found.get(n), dict)]
    if missing:
        wanted = ", ".join(f"`{n}` ({what})" for n, what in names.items())
        raise CheckFailed(f"{trial.spec.name}{args} needs the submodules {wanted}; missing: {', '.join(missing)}. "
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

    def run(self, x, unbiased=False, dim=-1, eps_outside=False, affine=True):
        mean = x.mean(dim, keepdim=True)
        var = x.var(dim, keepdim=True, unbiased=unbiased)
        denominator = var.sqrt() + self.eps if eps_outside else torch.sqrt(var + self.eps)
        return self.gamma * (x - mean) / denominator + self.beta if affine else (x - mean) / denominator


LN_MISTAKES = (
    Mistake("unbiased variance", variant(_LNLayout, "LayerNormUnbiased", unbiased=True),
            "You normalise with the unbiased variance (dividing by D − 1, the default of torch.var/std): "
            "LayerNorm uses the biased one, x.var(dim=-1, unbiased=False) or ((x - mean)**2).mean(-1)."),
    Mistake("wrong axis", variant(_LNLayout, "LayerNormWrongAxis", dim=-2),
            "You normalise over the wrong axis: LayerNorm takes the mean and variance over the features "
            "of each position, the last axis (dim=-1, keepdim=True), not over the positions."),
    Mistake("eps outside the square root", variant(_LNLayout, "LayerNormEpsOutside", eps_outside=True),
            "eps is added to the standard deviation: add it to the variance, inside the square root, "
            "(x − mean) / sqrt(var + eps)."),
    Mistake("no gamma and beta", variant(_LNLayout, "LayerNormNoAffine", affine=False),
            "The output is normalised but gamma and beta are not applied: return gamma * x_hat + beta."),
)


def _ln_case(shape: tuple, dtype: torch.dtype, seed: int, scale: float = 1.0, shift: float = 0.0) -> Case:
    d = shape[-1]
    words = "" if scale == 1.0 else f" with small spread (std {scale:g})"
    if shift:
        words += f" around {shift:g}"
    return _layer_case(f"LayerNorm({d}) on x {shape} {dtype_name(dtype)}{words}", ref.LayerNorm, (d,), seed,
                       dtype, lambda device: {"x": randn(shape, seed, dtype, device) * scale + shift})


def _ln_parameters(trial) -> None:
    built = layout(trial, (6,), ("eps",), values=True, label="LayerNorm(6)")
    params = built.get("values", {})
    if set(params) != {"gamma", "beta"}:
        raise CheckFailed(f"LayerNorm(6) should have exactly the parameters gamma (6,) and beta (6,); yours: "
                          f"{', '.join(f'{k} {tuple(v.shape)}' for k, v in params.items()) or 'none'}.")
    if tuple(params["gamma"].shape) != (6,) or tuple(params["beta"].shape) != (6,):
        raise CheckFailed("gamma and beta must have shape (d_model,).")
    if not (bool((params["gamma"] == 1).all()) and bool((params["beta"] == 0).all())):
        raise CheckFailed("gamma starts at ones and beta at zeros (so a new LayerNorm only normalises).")
    eps = built.get("attrs", {}).get("eps", None)
    other = layout(trial, (6,), ("eps",), kwargs={"eps": 1e-3}, values=True, label="LayerNorm(6, eps=1e-3)")
    if other.get("attrs", {}).get("eps", 1e-3) != 1e-3 or (eps is not None and eps != 1e-5):
        raise CheckFailed("eps defaults to 1e-5 and must be stored as given (LayerNorm(6, eps=1e-3)).")


def _ln_matches_torch(trial) -> None:
    x = randn((3, 4, 10), 77, f64, trial.device)
    gamma, beta = torch.linspace(0.5, 1.5, 10, dtype=f64), torch.linspace(-1, 1, 10, dtype=f64)
    got = trial.student(module_inputs((10,), {"gamma": gamma, "beta": beta}, trial.device, f64, x=x),
                        "x (3, 4, 10) float64")
    problem = describe_difference(F.layer_norm(x, (10,), gamma.to(trial.device), beta.to(trial.device), 1e-5), got)
    if problem:
        raise CheckFailed(f"Compared with torch.nn.functional.layer_norm on x (3, 4, 10) float64: {problem}")


def _ln_spec() -> ItemSpec:
    return ItemSpec(
        name="LayerNorm", reference=ref.LayerNorm, invoke=Invoke(module=True, forward=("x",), aliases=True),
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

class _FFN(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)

    def run(self, x, inner=torch.relu, outer=lambda y: y):
        return outer(self.linear2(inner(self.linear1(x))))

    forward = run


FFN_MISTAKES = (
    Mistake("no activation", variant(_FFN, "FFNNoActivation", inner=lambda y: y),
            "There is no ReLU between the two linear maps, so the FFN is one linear map: "
            "use linear2(relu(linear1(x)))."),
    Mistake("ReLU on the output", variant(_FFN, "FFNReluAtEnd", outer=torch.relu),
            "The output goes through a ReLU too: FFN(x) = max(0, x W1 + b1) W2 + b2 has the ReLU only in between."),
    Mistake("GELU", variant(_FFN, "FFNGelu", inner=F.gelu),
            "You used GELU; the original Transformer's FFN uses ReLU, max(0, ·)."),
)


def _ffn_case(B: int, T: int, d: int, d_ff: int, dtype: torch.dtype, seed: int) -> Case:
    return _layer_case(f"PositionwiseFeedForward({d}, {d_ff}) on x ({B}, {T}, {d}) {dtype_name(dtype)}",
                       ref.PositionwiseFeedForward, (d, d_ff), seed, dtype,
                       lambda device: {"x": randn((B, T, d), seed, dtype, device)})


def _ffn_parameters(trial) -> None:
    expected = {"linear1.weight": (10, 6), "linear1.bias": (10,), "linear2.weight": (6, 10), "linear2.bias": (6,)}
    parameter_shapes(trial, (6, 10), expected, "PositionwiseFeedForward(d_model=6, d_ff=10)", values=True,
                     label="PositionwiseFeedForward(6, 10)")
    layout(trial, (6, 10), kwargs={"dropout": 0.1}, values=True, label="PositionwiseFeedForward(6, 10, dropout=0.1)")


def _ffn_spec() -> ItemSpec:
    return ItemSpec(
        name="PositionwiseFeedForward", reference=ref.PositionwiseFeedForward,
        invoke=Invoke(module=True, forward=("x",), aliases=True), mistakes=FFN_MISTAKES,
        subchecks=(
            SubCheck("parameters linear1 (d_model → d_ff) and linear2 (d_ff → d_model); takes dropout", 1,
                     _ffn_parameters),
            SubCheck("matches the reference on a random batch", 1, compare_cases(_ffn_case(2, 5, 8, 16, f32, 400))),
            SubCheck("matches on other sizes and float64 (positions are independent)", 1,
                     compare_cases(_ffn_case(3, 4, 12, 7, f64, 410), _ffn_case(1, 9, 6, 24, f32, 420)), hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# EncoderLayer and DecoderLayer: sub-layers with residuals and norms, in one of two placements
# ---------------------------------------------------------------------------

class _LN(nn.Module):
    """A LayerNorm for the mistake variants (same parameter names as the contract)."""

    def __init__(self, d):
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(d))
        self.beta = nn.Parameter(torch.zeros(d))

    def forward(self, x):
        return F.layer_norm(x, (x.size(-1),), self.gamma, self.beta, 1e-5)


def _sublayers(x, blocks, pre: bool, residual, from_normed: bool = False):
    """``x`` through each (sub-layer, norm) of ``blocks``: pre-LN x + f(norm(x)) (norm(x) + f(norm(x))
    ``from_normed``) or post-LN norm(x + f(x)); a False in ``residual`` drops that block's x +."""
    for (f, norm), res in zip(blocks, residual):
        if pre:
            h = norm(x)
            x = ((h if from_normed else x) if res else 0) + f(h)
        else:
            x = norm((x if res else 0) + f(x))
    return x


class _EncLayout(nn.Module):
    def __init__(self, d_model, num_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, num_heads)
        self.ffn = _FFN(d_model, d_ff)
        self.norm1, self.norm2 = _LN(d_model), _LN(d_model)

    def run(self, x, mask, swapped=False, residual=(True, True), use_mask=True, from_normed=False):
        blocks = ((lambda h: self.self_attn(h, h, h, mask if use_mask else None)[0], self.norm1), (self.ffn, self.norm2))
        return _sublayers(x, blocks, self.norm_first != swapped, residual, from_normed and self.norm_first)


ENC_MISTAKES = (
    Mistake("post-LN and pre-LN swapped", variant(_EncLayout, "EncoderNormFirstSwapped", swapped=True),
            "Post-LN and pre-LN are swapped: norm_first=False (the original) normalises after the residual sum, "
            "x = norm1(x + attn(x)); norm_first=True normalises the sub-layer's input, x = x + attn(norm1(x))."),
    Mistake("no residual around self-attention", variant(_EncLayout, "EncoderNoAttnResidual", residual=(False, True)),
            "The residual connection around self-attention is missing: add the layer's input back, x + attn(...)."),
    Mistake("no residual around the FFN", variant(_EncLayout, "EncoderNoFFNResidual", residual=(True, False)),
            "The residual connection around the feed-forward network is missing: x + ffn(...)."),
    Mistake("mask ignored", variant(_EncLayout, "EncoderMaskIgnored", use_mask=False),
            "The mask is not passed to self-attention, so padded positions are attended to: self_attn(x, x, x, mask)."),
    Mistake("pre-LN residual from the normalised input", variant(_EncLayout, "EncoderPreLNResidualNormed",
                                                                 from_normed=True),
            "In pre-LN the residual adds the un-normalised input: x = x + attn(norm1(x)), not norm1(x) + attn(norm1(x))."),
)


def _enc_case(B: int, T: int, d: int, h: int, d_ff: int, norm_first: bool, dtype: torch.dtype, seed: int,
              lengths: list[int] | None = None) -> Case:
    def inputs(device):
        return {"x": randn((B, T, d), seed, dtype, device), "mask": padding(lengths, T, device) if lengths else None}

    ln = "pre-LN (norm_first=True)" if norm_first else "post-LN"
    m = f"padding mask, lengths {lengths}" if lengths else "no mask"
    return _layer_case(f"EncoderLayer({d}, {h}, {d_ff}, norm_first={norm_first}) [{ln}] on x ({B}, {T}, {d}) "
                       f"{dtype_name(dtype)}, {m}", ref.EncoderLayer, (d, h, d_ff, 0.0, norm_first), seed, dtype,
                       inputs)


def _enc_spec() -> ItemSpec:
    pad_case = _enc_case(3, 6, 8, 2, 16, False, f64, 520, [6, 4, 2])
    return ItemSpec(
        name="EncoderLayer", reference=ref.EncoderLayer,
        invoke=Invoke(module=True, forward=("x", "mask"), aliases=True,
                      names=earlier(ref.LayerNorm, ref.PositionwiseFeedForward)), mistakes=ENC_MISTAKES,
        subchecks=(
            SubCheck("submodules self_attn, ffn, norm1, norm2", 1,
                     lambda t: _submodules(t, (8, 2, 16), {"self_attn": "MultiHeadAttention",
                                                           "ffn": "PositionwiseFeedForward",
                                                           "norm1": "LayerNorm", "norm2": "LayerNorm"})),
            SubCheck("post-LN matches the reference (same weights)", 1,
                     compare_cases(_enc_case(2, 5, 8, 2, 16, False, f32, 500))),
            SubCheck("pre-LN (norm_first=True) matches the reference", 1,
                     compare_cases(_enc_case(2, 5, 8, 2, 16, True, f32, 505))),
            SubCheck("matches with padding masks, other sizes, float64, both norm placements", 1,
                     compare_cases(pad_case, _enc_case(2, 7, 12, 3, 10, True, f64, 530, [7, 3]),
                                   _enc_case(1, 4, 16, 4, 32, False, f32, 540)), hidden=True),
            SubCheck("padded positions do not change the real positions' outputs", 1,
                     padding_no_leak(pad_case, [6, 4, 2]), hidden=True),
        ),
    )


class _DecLayout(nn.Module):
    def __init__(self, d_model, num_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, num_heads)
        self.cross_attn = MultiHeadAttention(d_model, num_heads)
        self.ffn = _FFN(d_model, d_ff)
        self.norm1, self.norm2, self.norm3 = _LN(d_model), _LN(d_model), _LN(d_model)

    def run(self, x, memory, tgt_mask, memory_mask, swapped=False, kv_from_decoder=False, causal=True,
            residual=(True, True, True), use_memory_mask=True, cross_first=False):
        def sa(h):
            return self.self_attn(h, h, h, tgt_mask if causal else None)[0]

        def ca(h):
            src = h if kv_from_decoder else memory
            mask = None if kv_from_decoder or not use_memory_mask else memory_mask
            return self.cross_attn(h, src, src, mask)[0]

        first, second = (ca, sa) if cross_first else (sa, ca)
        blocks = ((first, self.norm1), (second, self.norm2), (self.ffn, self.norm3))
        return _sublayers(x, blocks, self.norm_first != swapped, residual)


DecoderCrossKVFromDecoder = variant(_DecLayout, "DecoderCrossKVFromDecoder", kv_from_decoder=True)
DEC_MISTAKES = (
    Mistake("decoder self-attention without the causal mask", variant(_DecLayout, "DecoderNoCausalMask", causal=False),
            "The decoder's self-attention ignores tgt_mask, so each position sees the tokens after it (the "
            "ones it must predict): self_attn(x, x, x, tgt_mask)."),
    Mistake("cross-attention keys and values from the decoder",
            DecoderCrossKVFromDecoder,
            "Cross-attention takes its keys and values from the decoder: queries come from the decoder, "
            "keys and values from the encoder output, cross_attn(x, memory, memory, memory_mask)."),
    Mistake("post-LN and pre-LN swapped", variant(_DecLayout, "DecoderNormFirstSwapped", swapped=True),
            "Post-LN and pre-LN are swapped: norm_first=False normalises after each residual sum, "
            "x = norm(x + f(x)); norm_first=True normalises the sub-layer's input, x = x + f(norm(x))."),
    Mistake("no residual around cross-attention",
            variant(_DecLayout, "DecoderNoCrossResidual", residual=(True, False, True)),
            "The residual connection around cross-attention is missing: x + cross_attn(...)."),
    Mistake("no residual around self-attention",
            variant(_DecLayout, "DecoderNoSelfResidual", residual=(False, True, True)),
            "The residual connection around the masked self-attention is missing: x + self_attn(...)."),
    Mistake("memory mask ignored", variant(_DecLayout, "DecoderMemoryMaskIgnored", use_memory_mask=False),
            "memory_mask is not passed to cross-attention, so the decoder attends to padded source positions."),
    Mistake("cross-attention before self-attention", variant(_DecLayout, "DecoderCrossBeforeSelf", cross_first=True),
            "The sub-layers are in the wrong order: masked self-attention (norm1), then cross-attention (norm2), "
            "then the FFN (norm3)."),
)


def _dec_case(B: int, T: int, S: int, d: int, h: int, d_ff: int, norm_first: bool, dtype: torch.dtype, seed: int,
              src_lengths: list[int] | None = None) -> Case:
    def inputs(device):
        return {"x": randn((B, T, d), seed, dtype, device), "memory": randn((B, S, d), seed + 1, dtype, device),
                "tgt_mask": torch.ones(T, T, dtype=torch.bool, device=device).tril(),
                "memory_mask": padding(src_lengths, S, device) if src_lengths else None}

    ln = "pre-LN (norm_first=True)" if norm_first else "post-LN"
    m = f"source padding mask, lengths {src_lengths}" if src_lengths else "no memory mask"
    return _layer_case(f"DecoderLayer({d}, {h}, {d_ff}, norm_first={norm_first}) [{ln}] on x ({B}, {T}, {d}), "
                       f"memory ({B}, {S}, {d}) {dtype_name(dtype)}, causal tgt_mask, {m}",
                       ref.DecoderLayer, (d, h, d_ff, 0.0, norm_first), seed, dtype, inputs)


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


def _dec_spec() -> ItemSpec:
    pad_case = _dec_case(3, 5, 6, 8, 2, 16, False, f64, 620, [6, 3, 1])
    causal = no_future_leak(_dec_case(2, 6, 5, 8, 2, 16, True, f64, 650),
                            "the decoder sees the future. Pass tgt_mask to self-attention.")

    def _memory_read_and_no_padding_leak(t) -> None:
        """The output depends on the encoder memory, and padded source positions do not leak into it."""
        _dec_memory_matters(pad_case)(t)
        padding_no_leak(pad_case, [6, 3, 1], key="memory")(t)

    return ItemSpec(
        name="DecoderLayer", reference=ref.DecoderLayer,
        invoke=Invoke(module=True, forward=("x", "memory", "tgt_mask", "memory_mask"), aliases=True,
                      names=earlier(ref.LayerNorm, ref.PositionwiseFeedForward)),
        mistakes=DEC_MISTAKES,
        subchecks=(
            SubCheck("submodules self_attn, cross_attn, ffn, norm1, norm2, norm3", 1,
                     lambda t: _submodules(t, (8, 2, 16), {
                         "self_attn": "MultiHeadAttention", "cross_attn": "MultiHeadAttention",
                         "ffn": "PositionwiseFeedForward", "norm1": "LayerNorm", "norm2": "LayerNorm",
                         "norm3": "LayerNorm"})),
            SubCheck("post-LN matches the reference (same weights, causal mask, T ≠ S)", 1,
                     compare_cases(_dec_case(2, 4, 6, 8, 2, 16, False, f32, 600))),
            SubCheck("pre-LN (norm_first=True) matches the reference", 1,
                     compare_cases(_dec_case(2, 4, 6, 8, 2, 16, True, f32, 605))),
            SubCheck("matches with source padding, other sizes, float64, both norm placements", 1,
                     compare_cases(pad_case, _dec_case(2, 6, 3, 12, 3, 10, True, f64, 630, [3, 2]),
                                   _dec_case(1, 3, 7, 16, 4, 32, False, f32, 640)), hidden=True),
            SubCheck("causal: a position's output never depends on later target positions", 1, causal, hidden=True),
            SubCheck("cross-attention reads the encoder output; padded source positions do not leak", 1,
                     _memory_read_and_no_padding_leak, hidden=True),
        ),
    )


SPECS = {spec.name: spec for spec in (_ln_spec(), _ffn_spec(), _enc_spec(), _dec_spec())}
