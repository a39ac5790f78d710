"""Check specs for notebook 02 (Bahdanau attention): the three scoring functions,
masked_softmax, context_vector and BahdanauAttention, with their mistake catalogues."""

from __future__ import annotations

import torch
from torch import nn

from ... import bahdanau as ref
from ..answer.calls import Invoke, Probe
from ..judge.properties import (compare_cases, dtype_name, gradients_reach, masked_keys_ignored, masked_weights_zero,
                          module_case, parameter_shapes, randn, variant, weights_sum_to_one)
from ..judge.spec import Case, CheckFailed, ItemSpec, Mistake, SubCheck

f32, f64 = torch.float32, torch.float64


def _lengths_mask(B: int, T: int, device: torch.device) -> torch.Tensor:
    """(B, T) bool: sequence b has max(1, T - 2b) real positions (the first is always full)."""
    lengths = torch.tensor([max(1, T - 2 * b) for b in range(B)], device=device)
    return torch.arange(T, device=device)[None, :] < lengths[:, None]


def _mask_words(mask: torch.Tensor | None) -> str:
    if mask is None:
        return "no mask"
    lengths = mask.sum(dim=1).tolist()
    return f"mask with lengths {lengths}"


# ---------------------------------------------------------------------------
# Scoring functions
# ---------------------------------------------------------------------------

def _hs(seed: int, B: int, T: int, d_h: int, d_s: int, dtype: torch.dtype, device: torch.device) -> dict:
    return {"h": randn((B, T, d_h), seed, dtype, device), "s": randn((B, d_s), seed + 1, dtype, device)}


def _dot_case(seed: int, B: int, T: int, D: int, dtype: torch.dtype) -> Case:
    return Case(f"h ({B}, {T}, {D}), s ({B}, {D}) {dtype_name(dtype)}",
                lambda device: _hs(seed, B, T, D, D, dtype, device))


def _hand_dot_case() -> Case:
    def make(device: torch.device) -> dict:
        h = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]], device=device)
        s = torch.tensor([[2.0, -1.0]], device=device)
        return {"h": h, "s": s}

    return Case("the hand example h (1, 3, 2), s (1, 2) (from the notebook)", make)


DOT_MISTAKES = (
    Mistake("trailing axis kept", lambda h, s: h @ s.unsqueeze(-1),
            "Your scores have shape (B, T, 1): remove the last axis (.squeeze(-1)) to return (B, T)."),
    Mistake("summed over time", lambda h, s: (h * s.unsqueeze(1)).sum(dim=1),
            "You summed over the time axis: the score of position i is the sum over the features, "
            "(h * s[:, None, :]).sum(dim=-1)."),
    Mistake("all batch pairs", lambda h, s: h @ s.T,
            "You multiplied every h with every decoder state of the batch (h @ s.T): each sequence is scored only "
            "with its own s, e.g. (h @ s.unsqueeze(-1)).squeeze(-1)."),
)


def _dot_spec() -> ItemSpec:
    hidden = (_dot_case(20, 4, 4, 4, f64), _dot_case(30, 1, 7, 3, f32), _dot_case(40, 5, 2, 16, f64))
    return ItemSpec(
        name="dot_score", reference=ref.dot_score, mistakes=DOT_MISTAKES,
        subchecks=(
            # (the hand example is public: with it, one the student has not seen)
            SubCheck("matches the reference on the hand example and a random input of its shape", 1, compare_cases(_hand_dot_case(), _dot_case(15, 1, 3, 2, f32))),
            SubCheck("matches the reference on a random batch", 1, compare_cases(_dot_case(10, 2, 5, 3, f32))),
            SubCheck("matches on other sizes and float64 (B = T = D, batch of 1)", 1, compare_cases(*hidden),
                     hidden=True),
            SubCheck("gradients reach h and s", 1, lambda t: gradients_reach(t, hidden[0], ("h", "s"), index=None),
                     hidden=True),
        ),
    )


def _general_case(seed: int, B: int, T: int, d_h: int, d_s: int, dtype: torch.dtype) -> Case:
    def make(device: torch.device) -> dict:
        return {**_hs(seed, B, T, d_h, d_s, dtype, device), "W": randn((d_h, d_s), seed + 2, dtype, device)}

    return Case(f"h ({B}, {T}, {d_h}), s ({B}, {d_s}), W ({d_h}, {d_s}) {dtype_name(dtype)}", make)


def general_without_w(h, s, W):
    return (h @ s.unsqueeze(-1)).squeeze(-1)


GENERAL_MISTAKES = (
    Mistake("W transposed", lambda h, s, W: (h @ W.T @ s.unsqueeze(-1)).squeeze(-1),
            "W is used transposed: the score is h_iᵀ W s with W of shape (D_h, D_s), e.g. "
            "(h @ W @ s.unsqueeze(-1)).squeeze(-1)."),
    Mistake("W ignored", general_without_w, "W has no effect on your scores: compute h_iᵀ W s, not h_iᵀ s."),
    Mistake("trailing axis kept", lambda h, s, W: h @ W @ s.unsqueeze(-1),
            "Your scores have shape (B, T, 1): remove the last axis (.squeeze(-1)) to return (B, T)."),
)


def _general_spec() -> ItemSpec:
    hidden = (_general_case(60, 3, 4, 5, 5, f64), _general_case(70, 1, 6, 2, 7, f32),
              _general_case(80, 4, 3, 8, 3, f64))
    return ItemSpec(
        name="general_score", reference=ref.general_score, mistakes=GENERAL_MISTAKES,
        subchecks=(
            SubCheck("matches the reference on a random batch (D_h ≠ D_s)", 1,
                     compare_cases(_general_case(50, 2, 5, 4, 3, f32))),
            SubCheck("matches on other sizes and float64 (square W, batch of 1)", 1, compare_cases(*hidden),
                     hidden=True),
            SubCheck("gradients reach h, s and W", 1,
                     lambda t: gradients_reach(t, hidden[0], ("h", "s", "W"), index=None), hidden=True),
        ),
    )


def _additive_case(seed: int, B: int, T: int, d_h: int, d_s: int, A: int, dtype: torch.dtype) -> Case:
    def make(device: torch.device) -> dict:
        return {**_hs(seed, B, T, d_h, d_s, dtype, device),
                "W_h": randn((A, d_h), seed + 2, dtype, device) / d_h ** 0.5,
                "W_s": randn((A, d_s), seed + 3, dtype, device) / d_s ** 0.5,
                "v": randn((A,), seed + 4, dtype, device)}

    return Case(f"h ({B}, {T}, {d_h}), s ({B}, {d_s}), W_h ({A}, {d_h}), W_s ({A}, {d_s}), v ({A},) "
                f"{dtype_name(dtype)}", make)


ADDITIVE_MISTAKES = (
    Mistake("missing tanh", lambda h, s, W_h, W_s, v: (h @ W_h.T + (s @ W_s.T).unsqueeze(1)) @ v,
            "The tanh is missing: the score is vᵀ tanh(W_h h_i + W_s s)."),
    Mistake("tanh after v", lambda h, s, W_h, W_s, v: torch.tanh((h @ W_h.T + (s @ W_s.T).unsqueeze(1)) @ v),
            "The tanh is applied after v: apply it to W_h h_i + W_s s, then take the dot product with v."),
    Mistake("v ignored", lambda h, s, W_h, W_s, v: torch.tanh(h @ W_h.T + (s @ W_s.T).unsqueeze(1)).sum(dim=-1),
            "You summed the tanh features instead of weighting them with v: take the dot product with v (... @ v)."),
    Mistake("W_h and W_s swapped", lambda h, s, W_h, W_s, v: torch.tanh(h @ W_s.T + (s @ W_h.T).unsqueeze(1)) @ v,
            "W_h and W_s are swapped: W_h maps the encoder states h, W_s the decoder state s."),
    Mistake("maps transposed", lambda h, s, W_h, W_s, v: torch.tanh(h @ W_h + (s @ W_s).unsqueeze(1)) @ v,
            "W_h and W_s are used transposed: with rows as vectors, W_h h_i is h @ W_h.T and W_s s is s @ W_s.T."),
    Mistake("trailing axis kept",
            lambda h, s, W_h, W_s, v: torch.tanh(h @ W_h.T + (s @ W_s.T).unsqueeze(1)) @ v.unsqueeze(-1),
            "Your scores have shape (B, T, 1): use ... @ v (a vector), or remove the last axis, to return (B, T)."),
)


def _additive_spec() -> ItemSpec:
    hidden = (_additive_case(110, 3, 4, 4, 4, 4, f64), _additive_case(120, 1, 7, 3, 5, 2, f32),
              _additive_case(130, 4, 3, 6, 2, 8, f64))
    return ItemSpec(
        name="additive_score", reference=ref.additive_score, mistakes=ADDITIVE_MISTAKES,
        subchecks=(
            SubCheck("matches the reference on a random batch", 1,
                     compare_cases(_additive_case(100, 2, 5, 4, 3, 6, f32))),
            SubCheck("matches on other sizes and float64 (all sizes equal, batch of 1)", 1,
                     compare_cases(*hidden), hidden=True),
            SubCheck("gradients reach h, s, W_h, W_s and v", 1,
                     lambda t: gradients_reach(t, hidden[0], ("h", "s", "W_h", "W_s", "v"), index=None),
                     hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# masked_softmax
# ---------------------------------------------------------------------------

def _softmax_case(seed: int, B: int, T: int, dtype: torch.dtype, masked: bool = True) -> Case:
    def make(device: torch.device) -> dict:
        return {"scores": 2 * randn((B, T), seed, dtype, device),
                "mask": _lengths_mask(B, T, device) if masked else None}

    mask = _lengths_mask(B, T, torch.device("cpu")) if masked else None  # (the same for every seed)
    return Case(f"scores ({B}, {T}) {dtype_name(dtype)}, {_mask_words(mask)}", make)


def _hand_softmax_case() -> Case:
    def make(device: torch.device) -> dict:
        return {"scores": torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 5.0]], device=device),
                "mask": torch.tensor([[True, True, True], [True, True, False]], device=device)}

    return Case("the hand example scores (2, 3), mask with lengths [3, 2] (from the notebook)", make)


def _fill(scores, mask, value=float("-inf")):
    return scores if mask is None else scores.masked_fill(~mask, value)


def softmax_mask_after(scores, mask):
    w = torch.softmax(scores, dim=-1)
    return w if mask is None else w * mask


def softmax_not_normalised(scores, mask):
    e = torch.exp(scores)
    return e if mask is None else e * mask


SOFTMAX_MISTAKES = (
    Mistake("softmax over the batch axis", lambda scores, mask: torch.softmax(_fill(scores, mask), dim=0),
            "Your softmax runs over the batch axis (dim=0): the weights of one sequence sum to 1 over its "
            "positions, so use dim=-1."),
    Mistake("mask ignored", lambda scores, mask: torch.softmax(scores, dim=-1),
            "The mask has no effect: set the scores where mask is False to float('-inf') before the softmax."),
    Mistake("mask inverted", lambda scores, mask: torch.softmax(_fill(scores, None if mask is None else ~mask), dim=-1),
            "Your mask is inverted: True means a real (valid) position, so fill the scores where the mask is False "
            "(~mask)."),
    Mistake("mask after softmax", softmax_mask_after,
            "You masked after the softmax, so the weights of a padded sequence no longer sum to 1: "
            "fill the masked scores with -inf before the softmax."),
    Mistake("masked scores set to 0", lambda scores, mask: torch.softmax(_fill(scores, mask, 0.0), dim=-1),
            "Masked scores are set to 0, but exp(0) = 1 still gives them weight: fill them with float('-inf')."),
    Mistake("not normalised", softmax_not_normalised,
            "Your weights do not sum to 1: divide the exponentials by their sum over the positions (or use "
            "torch.softmax(..., dim=-1))."),
)


def _softmax_spec() -> ItemSpec:
    visible = _softmax_case(200, 3, 5, f32)
    hidden = (_softmax_case(210, 4, 7, f64), _softmax_case(220, 1, 1, f32), _softmax_case(230, 3, 6, f64, masked=False),
              _softmax_case(240, 5, 5, f32))
    props = _softmax_case(250, 4, 9, f64)

    def properties(t) -> None:
        weights_sum_to_one(t, props, index=None)
        masked_weights_zero(t, props, index=None)

    return ItemSpec(
        name="masked_softmax", reference=ref.masked_softmax, mistakes=SOFTMAX_MISTAKES,
        subchecks=(
            SubCheck("matches the reference on the hand example and a random input of its shape", 1,
                     compare_cases(_hand_softmax_case(), _softmax_case(205, 2, 3, f32))),
            SubCheck("matches the reference on a random padded batch", 1, compare_cases(visible)),
            SubCheck("matches on other shapes, float64, one position, and mask=None", 1, compare_cases(*hidden),
                     hidden=True),
            SubCheck("weights sum to 1 over the positions and masked positions are exactly 0", 1, properties,
                     hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# context_vector
# ---------------------------------------------------------------------------

def _context_case(seed: int, B: int, T: int, D: int, dtype: torch.dtype) -> Case:
    def make(device: torch.device) -> dict:
        return {"weights": torch.softmax(randn((B, T), seed, dtype, device), dim=-1),
                "h": randn((B, T, D), seed + 1, dtype, device)}

    return Case(f"weights ({B}, {T}), h ({B}, {T}, {D}) {dtype_name(dtype)}", make)


CONTEXT_MISTAKES = (
    Mistake("summed over the feature axis", lambda weights, h: (weights.unsqueeze(-1) * h).sum(dim=-1),
            "You summed over the feature axis: the context sums the weighted states over the time axis (dim=1), "
            "keeping the features: (weights[:, :, None] * h).sum(dim=1)."),
    Mistake("summed over the batch axis", lambda weights, h: (weights.unsqueeze(-1) * h).sum(dim=0),
            "You summed over the batch axis: the context sums over the time axis (dim=1), one vector per sequence."),
    Mistake("weights unused", lambda weights, h: h.mean(dim=1),
            "The weights have no effect: the context is the weighted sum Σ_i α_i h_i, not the mean of the states."),
    Mistake("weights unused (sum)", lambda weights, h: h.sum(dim=1),
            "The weights have no effect: multiply each state h_i by its weight α_i before summing."),
    Mistake("middle axis kept", lambda weights, h: weights.unsqueeze(1) @ h,
            "Your context has shape (B, 1, D_h): remove the middle axis (.squeeze(1)) to return (B, D_h)."),
    Mistake("weights broadcast along the features", lambda weights, h: (weights.unsqueeze(1) * h).sum(dim=1),
            "The weights are lined up with the wrong axis of h: give them a trailing axis, weights[:, :, None] "
            "(B, T, 1), so that weight i scales the whole state h_i."),
)


def _context_spec() -> ItemSpec:
    hidden = (_context_case(330, 3, 3, 3, f64), _context_case(310, 4, 6, 3, f64), _context_case(320, 1, 1, 5, f32))
    return ItemSpec(
        name="context_vector", reference=ref.context_vector, mistakes=CONTEXT_MISTAKES,
        subchecks=(
            SubCheck("matches the reference on a random batch", 1, compare_cases(_context_case(300, 2, 5, 4, f32))),
            SubCheck("matches on other sizes and float64 (one position, B = T = D)", 1, compare_cases(*hidden),
                     hidden=True),
            SubCheck("gradients reach weights and h", 1,
                     lambda t: gradients_reach(t, hidden[0], ("weights", "h"), index=None), hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# BahdanauAttention
# ---------------------------------------------------------------------------

def _attn_case(seed: int, B: int, T: int, enc: int, dec: int, A: int, dtype: torch.dtype, masked: bool) -> Case:
    def inputs(device: torch.device) -> dict:
        return {**_hs(seed, B, T, enc, dec, dtype, device), "mask": _lengths_mask(B, T, device) if masked else None}

    def adjust(module: nn.Module) -> None:
        module.W_s.bias.normal_()  # a non-zero bias, so that a dropped bias shows

    dims = (enc, dec, A)
    mask = _lengths_mask(B, T, torch.device("cpu")) if masked else None
    return module_case(f"BahdanauAttention(enc_dim={enc}, dec_dim={dec}, attn_dim={A}) on h ({B}, {T}, {enc}), "
                       f"s ({B}, {dec}) {dtype_name(dtype)}, {_mask_words(mask)}", ref.BahdanauAttention, dims,
                       4321 + sum(dims), dtype, inputs, adjust)


class _AttentionLayout(nn.Module):
    """The contract's parameter layout, shared by the catalogued wrong variants."""

    def __init__(self, enc_dim: int, dec_dim: int, attn_dim: int) -> None:
        super().__init__()
        self.W_h = nn.Linear(enc_dim, attn_dim, bias=False)
        self.W_s = nn.Linear(dec_dim, attn_dim, bias=True)
        self.v = nn.Linear(attn_dim, 1, bias=False)

    def run(self, h, s, mask, dim=-1, use_mask=True, invert=False, tanh=True, use_state=True, context_dim=1,
            swapped=False, squeeze_first=True):
        e = self.W_h(h) + self.W_s(s).unsqueeze(1) if use_state else self.W_h(h)
        e = self.v(torch.tanh(e) if tanh else e)  # (B, T, 1)
        m = None if mask is None or not use_mask else (~mask if invert else mask)
        if not squeeze_first:  # the softmax over the size-1 feature axis
            if m is not None:
                e = e.masked_fill(~m.unsqueeze(-1), float("-inf"))
            w = torch.softmax(e, dim=-1)
            return (w * h).sum(dim=1), w.squeeze(-1)
        e = e.squeeze(-1)
        if m is not None:
            e = e.masked_fill(~m, float("-inf"))
        w = torch.softmax(e, dim=dim)
        c = (w.unsqueeze(-1) * h).sum(dim=context_dim)
        return (w, c) if swapped else (c, w)


ATTENTION_MISTAKES = (
    Mistake("softmax over the batch axis", variant(_AttentionLayout, "AttentionSoftmaxBatch", dim=0),
            "Your softmax runs over the batch axis (dim=0): normalise each sequence's scores over its positions "
            "(the last axis of the (B, T) scores)."),
    Mistake("softmax over the feature axis", variant(_AttentionLayout, "AttentionSoftmaxFeature", squeeze_first=False),
            "Your softmax runs over the size-1 feature axis that self.v leaves, so every weight is 1: "
            "squeeze that axis first (scores of shape (B, T)), then take the softmax over the positions."),
    Mistake("mask ignored", variant(_AttentionLayout, "AttentionMaskIgnored", use_mask=False),
            "forward ignores its mask: padded positions must get weight exactly 0 (fill their scores with -inf)."),
    Mistake("mask inverted", variant(_AttentionLayout, "AttentionMaskInverted", invert=True),
            "Your mask is inverted: True means a real position; fill the scores where the mask is False (~mask)."),
    Mistake("missing tanh", variant(_AttentionLayout, "AttentionNoTanh", tanh=False),
            "The tanh is missing: the score is v(tanh(W_h(h) + W_s(s)))."),
    Mistake("decoder state ignored", variant(_AttentionLayout, "AttentionStateIgnored", use_state=False),
            "The decoder state s has no effect: add W_s(s) (broadcast over the positions) inside the tanh."),
    Mistake("context summed over the feature axis",
            variant(_AttentionLayout, "AttentionContextSummedOverFeatures", context_dim=-1),
            "The context is summed over the wrong axis: sum the weighted states over the positions (dim=1) to get "
            "(B, enc_dim)."),
    Mistake("outputs swapped", variant(_AttentionLayout, "AttentionOutputsSwapped", swapped=True),
            "You returned (weights, context): return (context, weights)."),
)


def _attn_spec() -> ItemSpec:
    visible = _attn_case(400, 3, 5, 6, 4, 5, f32, True)
    hidden = (
        _attn_case(410, 2, 7, 8, 8, 8, f64, True),
        _attn_case(420, 1, 4, 3, 5, 2, f32, False),
        _attn_case(430, 4, 6, 10, 6, 7, f64, True),
    )
    props = _attn_case(440, 4, 8, 6, 5, 4, f64, True)

    def properties(t) -> None:
        weights_sum_to_one(t, props, index=1)
        masked_weights_zero(t, props, index=1)
        masked_keys_ignored(t, props, perturb=("h",), key_mask=lambda inputs: ~inputs["mask"], index=0)

    def gradients(trial) -> None:
        """The module keeps its own initialisation; h and s require a gradient (a non-finite
        gradient counts as one: masked rows are judged by the other sub-checks)."""
        case = hidden[0]
        inputs = {**case.make(trial.device), "state": None}
        out = trial.student(inputs, case.label, probe=Probe("gradients", {"names": ["h", "s"]}))
        if not isinstance(out, dict) or not out.get("connected"):
            raise CheckFailed(f"On {case.label}: the context is not connected to the autograd graph "
                              "(did you use .detach(), .item() or torch.no_grad()?).")
        for name, g in {**(out.get("grads") or {}), **(out.get("params") or {})}.items():
            if not isinstance(g, torch.Tensor) or float(g.abs().sum()) == 0.0:
                raise CheckFailed(f"On {case.label}: `{name}` gets no gradient from the context.")

    return ItemSpec(
        name="BahdanauAttention", reference=ref.BahdanauAttention,
        invoke=Invoke(module=True, forward=("h", "s", "mask")), output_names=("context", "weights"),
        mistakes=ATTENTION_MISTAKES,
        subchecks=(
            SubCheck("parameters W_h, W_s (with bias) and v with the right shapes", 1,
                     lambda t: parameter_shapes(t, (6, 4, 5), {"W_h.weight": (5, 6), "W_s.weight": (5, 4),
                                                               "W_s.bias": (5,), "v.weight": (1, 5)},
                                                "BahdanauAttention(enc_dim=6, dec_dim=4, attn_dim=5)")),
            SubCheck("matches the reference (same weights) on a random padded batch", 1, compare_cases(visible)),
            SubCheck("matches with other sizes, float64, and mask=None", 1, compare_cases(*hidden), hidden=True),
            SubCheck("weights sum to 1, padded positions get weight 0 and do not leak into the context", 1,
                     properties, hidden=True),
            SubCheck("gradients reach h, s, W_h, W_s and v", 1, gradients, hidden=True),
        ),
    )


SPECS = {
    spec.name: spec
    for spec in (_dot_spec(), _general_spec(), _additive_spec(), _softmax_spec(), _context_spec(), _attn_spec())
}
