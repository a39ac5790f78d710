"""Check specs for notebook 04 (multi-head attention): split_heads, merge_heads,
MultiHeadAttention, head_diversity_penalty and mha_parameter_count, with their
mistake catalogues."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ... import multihead as ref
from ..judge.compare import describe_difference
from ..judge.properties import (compare_cases, dtype_name, fresh, masked_keys_ignored, masked_weights_zero, module_case,
                          module_gradients, parameter_shapes, randn, variant, weights_sum_to_one)
from ..answer.calls import Invoke
from ..judge.spec import Case, CheckFailed, ItemSpec, Mistake, SubCheck

f32, f64 = torch.float32, torch.float64

# ---------------------------------------------------------------------------
# split_heads / merge_heads
# ---------------------------------------------------------------------------


def _split_case(B: int, T: int, D: int, H: int, dtype: torch.dtype, seed: int | None = None) -> Case:
    """x (B, T, D): arange values (easy to read back) unless a seed is given."""

    def make(device: torch.device) -> dict:
        if seed is None:
            x = torch.arange(B * T * D, dtype=dtype, device=device).reshape(B, T, D)
        else:
            x = randn((B, T, D), seed, dtype, device)
        return {"x": x, "num_heads": H}

    values = "arange values" if seed is None else "random values"
    return Case(f"x ({B}, {T}, {D}) {dtype_name(dtype)} with {values}, num_heads = {H}", make)


def _merge_case(B: int, H: int, T: int, d_head: int, dtype: torch.dtype, seed: int | None = None) -> Case:
    def make(device: torch.device) -> dict:
        if seed is None:
            x = torch.arange(B * H * T * d_head, dtype=dtype, device=device).reshape(B, H, T, d_head)
        else:
            x = randn((B, H, T, d_head), seed, dtype, device)
        return {"x": x}

    values = "arange values" if seed is None else "random values"
    return Case(f"x ({B}, {H}, {T}, {d_head}) {dtype_name(dtype)} with {values}", make)


def _split(order, then=lambda y: y):
    """A wrong split: x (B, T, D) reshaped to ``order(B, T, H, D // H)``, then ``then``."""

    def split_heads(x, num_heads):
        B, T, D = x.shape
        return then(x.reshape(*order(B, T, num_heads, D // num_heads)))

    return split_heads


SPLIT_MISTAKES = (
    Mistake("reshaped without transpose", _split(lambda B, T, H, d: (B, H, T, d)),
            "You reshaped (B, T, D) straight to (B, H, T, D/H), which mixes features of different "
            "positions into one head: reshape to (B, T, H, D/H) first, then .transpose(1, 2)."),
    Mistake("head size and head count swapped", _split(lambda B, T, H, d: (B, T, d, H), lambda y: y.transpose(1, 2)),
            "The shape comes out as (B, D/H, T, H): the head axis has size num_heads and each head "
            "gets D/H features, so reshape to (B, T, num_heads, D // num_heads)."),
    Mistake("strided features", _split(lambda B, T, H, d: (B, T, d, H), lambda y: y.permute(0, 3, 1, 2)),
            "Head j should get the contiguous block of features j·D/H … (j+1)·D/H − 1, but yours "
            "gets every H-th feature: reshape to (B, T, H, D/H), not (B, T, D/H, H)."),
    Mistake("no transpose", _split(lambda B, T, H, d: (B, T, H, d)),
            "You returned (B, T, H, D/H): transpose(1, 2) so that the head axis comes second, (B, H, T, D/H)."),
)


MERGE_MISTAKES = (
    Mistake("reshaped without transpose", lambda x: x.reshape(x.size(0), x.size(2), -1),
            "You reshaped (B, H, T, d) straight to (B, T, H·d), which mixes positions: "
            ".transpose(1, 2) back to (B, T, H, d) first, then reshape to (B, T, H·d)."),
    Mistake("strided features", lambda x: x.permute(0, 2, 3, 1).reshape(x.size(0), x.size(2), -1),
            "The heads are interleaved feature by feature: head j must fill the contiguous block "
            "j·d … (j+1)·d − 1, so transpose(1, 2) to (B, T, H, d) and then reshape."),
    Mistake("heads averaged", lambda x: x.mean(dim=1),
            "You averaged the heads: merge_heads concatenates them, giving (B, T, H·d)."),
)


def _roundtrip(trial) -> None:
    """merge_heads(split_heads(x)) gives back x (runs the reference split on student merge)."""
    case = _split_case(2, 3, 12, 3, f64, seed=5)
    x = case.make(trial.device)["x"]
    heads = ref.split_heads(x, 3)
    back = trial.student({"x": heads}, f"split_heads(x) of {case.label}")
    problem = describe_difference(x, back, what="merge_heads(split_heads(x))")
    if problem:
        raise CheckFailed(f"merge_heads should undo split_heads, but {problem}")


def _split_spec() -> ItemSpec:
    return ItemSpec(
        name="split_heads", reference=ref.split_heads, mistakes=SPLIT_MISTAKES,
        subchecks=(
            SubCheck("split_heads(x (1, 2, 4), num_heads=2) matches the reference, with arange and random values", 1,
                     compare_cases(_split_case(1, 2, 4, 2, f32), _split_case(1, 2, 4, 2, f32, seed=7))),
            SubCheck("a random batch (2, 5, 8) with 4 heads", 1, compare_cases(_split_case(2, 5, 8, 4, f32, seed=1))),
            SubCheck("other shapes and dtypes: one head, one feature per head, T = 1, float64", 1,
                     compare_cases(_split_case(3, 4, 6, 1, f64, seed=2), _split_case(2, 3, 6, 6, f32, seed=3),
                                   _split_case(1, 1, 8, 2, f64, seed=4), _split_case(2, 7, 12, 3, f64, seed=6)),
                     hidden=True),
        ),
    )


def _merge_shapes_and_roundtrip(trial) -> None:
    """merge_heads matches on other shapes and dtypes, and undoes split_heads."""
    trial.compare([_merge_case(3, 1, 4, 6, f64, seed=12), _merge_case(2, 6, 3, 1, f32, seed=13),
                   _merge_case(1, 3, 1, 4, f64, seed=14)])
    _roundtrip(trial)


def _merge_spec() -> ItemSpec:
    return ItemSpec(
        name="merge_heads", reference=ref.merge_heads, mistakes=MERGE_MISTAKES,
        subchecks=(
            SubCheck("merge_heads(x (1, 2, 2, 2)) matches the reference, with arange and random values", 1,
                     compare_cases(_merge_case(1, 2, 2, 2, f32), _merge_case(1, 2, 2, 2, f32, seed=15))),
            SubCheck("a random batch (2, 4, 5, 2)", 1, compare_cases(_merge_case(2, 4, 5, 2, f32, seed=11))),
            SubCheck("other shapes and dtypes; merge_heads undoes split_heads", 1,
                     _merge_shapes_and_roundtrip, hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# MultiHeadAttention
# ---------------------------------------------------------------------------


def _mha_case(seed: int, B: int, T_q: int, T_k: int, d_model: int, H: int, dtype: torch.dtype,
              mask: str = "none", cross: bool = False) -> Case:
    """Self-attention (query = key = value = x) or cross-attention (query (B, T_q, D),
    key = value (B, T_k, D)); mask 'none', 'causal' (T_q, T_k) or 'padding' (B, 1, T_k)."""
    if not cross and T_q != T_k:
        raise ValueError("self-attention cases need T_q == T_k")

    def inputs(device: torch.device) -> dict:
        query = randn((B, T_q, d_model), seed, dtype, device)
        memory = randn((B, T_k, d_model), seed + 1, dtype, device) if cross else query
        m = None
        if mask == "causal":
            m = torch.ones(T_q, T_k, dtype=torch.bool, device=device).tril()
        elif mask == "padding":
            lengths = torch.tensor([max(1, T_k - 2 * b) for b in range(B)], device=device)
            m = (torch.arange(T_k, device=device)[None, :] < lengths[:, None])[:, None, :]
        # "head_mask": the mask as it applies to weights (B, H, T_q, T_k), for the property checks
        head_mask = None if m is None else (m.unsqueeze(1) if m.dim() == 3 else m)
        return {"query": query, "key": memory, "value": memory, "mask": m, "head_mask": head_mask}

    words = {"none": "no mask", "causal": f"causal mask ({T_q}, {T_k})",
             "padding": f"padding mask ({B}, 1, {T_k}) with lengths {[max(1, T_k - 2 * b) for b in range(B)]}"}[mask]
    what = (f"cross-attention with query ({B}, {T_q}, {d_model}) and key = value ({B}, {T_k}, {d_model})"
            if cross else f"self-attention on x ({B}, {T_q}, {d_model})")
    return module_case(f"MultiHeadAttention(d_model={d_model}, num_heads={H}), {what} {dtype_name(dtype)}, {words}",
                       ref.MultiHeadAttention, (d_model, H), 4321 + 7 * d_model + H, dtype, inputs)


class _MHALayout(nn.Module):
    """The contract's parameter layout, shared by the catalogued wrong variants."""

    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.w_q = nn.Linear(d_model, d_model)
        self.w_k = nn.Linear(d_model, d_model)
        self.w_v = nn.Linear(d_model, d_model)
        self.w_o = nn.Linear(d_model, d_model)

    def run(self, query, key, value, mask, reshape_only=False, scale_by_d_model=False, out="w_o",
            keys_from_query=False, mask_as="head", dim=-1, average=False):
        """Attention with its ways of going wrong: heads reshaped without a transpose, scores
        scaled by √d_model, the output map skipped (``out="none"``) or applied per head, keys
        and values from the query, the mask ``mask_as`` given / none / inverted, the softmax
        over ``dim``, the weights averaged over the heads."""
        B, T_q, D = query.shape
        H = self.num_heads
        if keys_from_query:
            key = value = query
        pairs = ((self.w_q, query), (self.w_k, key), (self.w_v, value))
        if reshape_only:
            q, k, v = (lin(t).reshape(B, H, t.size(1), D // H) for lin, t in pairs)
        else:
            q, k, v = (lin(t).reshape(B, t.size(1), H, D // H).transpose(1, 2) for lin, t in pairs)
        m = mask.unsqueeze(1) if mask is not None and mask.dim() == 3 else mask
        m = {"head": m, "given": mask, "none": None, "inverted": None if m is None else ~m,
             "always_unsqueezed": None if mask is None else mask.unsqueeze(1)}[mask_as]
        s = q @ k.transpose(-2, -1) / math.sqrt(D if scale_by_d_model else D // H)
        if m is not None:
            s = s.masked_fill(~m, float("-inf"))
        w = torch.softmax(s, dim=dim)
        heads = w @ v
        merged = heads.reshape(B, T_q, D) if reshape_only else heads.transpose(1, 2).reshape(B, T_q, D)
        if out == "per_head":  # w_o on each head alone (zero-padded into its block), then averaged
            d = D // H
            outs = []
            for j in range(H):
                padded = torch.zeros(B, T_q, D, dtype=heads.dtype, device=heads.device)
                padded[..., j * d:(j + 1) * d] = heads[:, j]
                outs.append(self.w_o(padded))
            return torch.stack(outs).mean(0), w
        return (self.w_o(merged) if out == "w_o" else merged), (w.mean(1) if average else w)


MHANoWo = variant(_MHALayout, "MHANoWo", out="none")
MHAMaskNoHeadAxis = variant(_MHALayout, "MHAMaskNoHeadAxis", mask_as="given")
MHA_MISTAKES = (
    Mistake("heads reshaped without transpose", variant(_MHALayout, "MHANoTranspose", reshape_only=True),
            "The heads are reshaped straight from (B, T, D) to (B, H, T, D/H) (or back) without a transpose, "
            "which mixes positions: split with .reshape(B, T, H, D/H).transpose(1, 2) and merge with the inverse."),
    Mistake("scaled by √d_model", variant(_MHALayout, "MHAScaledByDModel", scale_by_d_model=True),
            "The scores are divided by √d_model, but each head's dot products have d_head = d_model / num_heads "
            "terms: divide by √d_head."),
    Mistake("w_o missing", MHANoWo,
            "The output skips w_o: concatenate the heads (B, T, d_model) and apply self.w_o once."),
    Mistake("w_o applied per head", variant(_MHALayout, "MHAWoPerHead", out="per_head"),
            "w_o is applied to each head separately and the results are averaged: concatenate the heads "
            "first and apply self.w_o once to the (B, T, d_model) result."),
    Mistake("keys and values from the query", variant(_MHALayout, "MHASelfOnly", keys_from_query=True),
            "Keys and values are computed from `query`: they must come from w_k(key) and w_v(value), which "
            "differ from the queries in cross-attention."),
    Mistake("mask without a head axis", MHAMaskNoHeadAxis,
            "A padding mask (B, 1, T_k) is applied to scores (B, H, T_q, T_k) without a head axis, so it lines "
            "up with the heads instead of the batch: use mask.unsqueeze(1) for 3-D masks."),
    Mistake("head axis added to a 2-D mask", variant(_MHALayout, "MHAMaskAlwaysUnsqueezed", mask_as="always_unsqueezed"),
            "The mask always gets a head axis (mask.unsqueeze(1)), but a (T_q, T_k) mask already broadcasts over "
            "the batch and the heads: the added axis lines its rows up with the heads. Add the head axis only to "
            "3-D (B, 1, T_k) masks (if mask.dim() == 3)."),
    Mistake("mask ignored", variant(_MHALayout, "MHAMaskIgnored", mask_as="none"),
            "forward ignores its mask: pass it on to every head's attention."),
    Mistake("mask inverted", variant(_MHALayout, "MHAMaskInverted", mask_as="inverted"),
            "Your mask is inverted: True means 'may attend', so fill the scores where the mask is False (~mask)."),
    Mistake("softmax over the query axis", variant(_MHALayout, "MHASoftmaxQueries", dim=-2),
            "Your weights sum to 1 over the queries, not the keys: apply the softmax over the last axis (dim=-1)."),
    Mistake("weights averaged over heads", variant(_MHALayout, "MHAWeightsAveraged", average=True),
            "You returned the weights averaged over the heads (B, T_q, T_k); return every head's weights, "
            "(B, H, T_q, T_k)."),
)


def _mha_advice(got: dict) -> str:
    advice = ""
    if any(v in ((4, 8), (8, 4)) for v in got.values()):
        advice += (" Keep one nn.Linear(d_model, d_model) per projection and split its output into heads "
                   "(d_model / num_heads features each) instead of one small Linear per head.")
    return advice


def _mha_parameters(trial) -> None:
    expected = {f"{n}.{p}": (8, 8) if p == "weight" else (8,) for n in ("w_q", "w_k", "w_v", "w_o") for p in ("weight", "bias")}
    parameter_shapes(trial, (8, 2), expected, "MultiHeadAttention(d_model=8, num_heads=2)", _mha_advice)


def _mha_gradients(trial) -> None:
    case = _mha_case(240, 2, 3, 5, 8, 2, f64, "padding", cross=True)
    module_gradients(trial, case, names=("query", "key", "value"))


def _mha_spec() -> ItemSpec:
    visible = _mha_case(200, 2, 5, 5, 8, 2, f32)
    hidden_cases = (
        _mha_case(210, 2, 6, 6, 12, 3, f32, "causal"),
        _mha_case(220, 2, 5, 5, 8, 2, f64, "padding"),  # B == H: a mask without head axis silently misaligns
        _mha_case(230, 3, 4, 7, 16, 4, f64, "none", cross=True),
        _mha_case(250, 1, 3, 3, 6, 1, f32),
        _mha_case(260, 2, 4, 4, 6, 6, f64, "causal"),
        _mha_case(270, 3, 2, 6, 8, 4, f32, "padding", cross=True),
    )
    pad = _mha_case(280, 3, 5, 5, 8, 2, f64, "padding")
    causal = _mha_case(290, 2, 4, 4, 8, 4, f32, "causal")

    def padded_keys(inputs: dict) -> torch.Tensor:
        return ~inputs["mask"][:, 0, :]

    def properties(t) -> None:
        weights_sum_to_one(t, pad)
        masked_weights_zero(t, pad, mask_key="head_mask")
        masked_weights_zero(t, causal, mask_key="head_mask")
        masked_keys_ignored(t, pad, perturb=("key", "value"), key_mask=padded_keys)

    return ItemSpec(
        name="MultiHeadAttention", reference=ref.MultiHeadAttention,
        invoke=Invoke(module=True, forward=("query", "key", "value", "mask")), output_names=("out", "weights"),
        mistakes=MHA_MISTAKES,
        forbidden={F.multi_head_attention_forward: "it calls torch's multi_head_attention_forward; "
                   "write the heads yourself"},
        subchecks=(
            SubCheck("parameters w_q, w_k, w_v, w_o, each Linear(d_model, d_model) with bias", 1, _mha_parameters),
            SubCheck("matches the reference (same weights) on a random batch, 2 heads", 1, compare_cases(visible)),
            SubCheck("matches with causal and padding masks, cross-attention (T_q ≠ T_k), 1 head, d_head = 1, float64",
                     2, compare_cases(*hidden_cases), hidden=True),
            SubCheck("weights sum to 1 over the keys; masked weights are exactly 0; padded keys do not leak",
                     1, properties, hidden=True),
            SubCheck("gradients reach query, key/value and every parameter", 1, _mha_gradients, hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# head_diversity_penalty
# ---------------------------------------------------------------------------


def _penalty_case(shape: tuple[int, ...], seed: int, dtype: torch.dtype, kind: str = "softmax") -> Case:
    """A (..., H, T_k): softmax rows of random scores, or one-hot rows ('onehot')."""

    def make(device: torch.device) -> dict:
        scores = randn(shape, seed, dtype, device)
        if kind == "onehot":
            A = F.one_hot(scores.argmax(-1), shape[-1]).to(dtype)
        else:
            A = torch.softmax(2 * scores, dim=-1)
        return {"A": A}

    rows = "one-hot rows" if kind == "onehot" else "softmax rows"
    return Case(f"A {shape} {dtype_name(dtype)} with {rows}", make)


def _hand_penalty_case() -> Case:
    def make(device: torch.device) -> dict:
        return {"A": torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.5, 0.5]], device=device)}

    return Case("the hand example A = [[0.5, 0.5, 0], [0, 0.5, 0.5]] (2 heads, 3 keys)", make)


def _penalty(transposed=False, entry=lambda e: e.pow(2), reduce=lambda p: p.sum(dim=(-2, -1))):
    """A wrong penalty: Aᵀ A instead of A Aᵀ, another function of the entries of the Gram matrix
    minus I, another reduction."""

    def penalty(A):
        gram = A.transpose(-2, -1) @ A if transposed else A @ A.transpose(-2, -1)
        return reduce(entry(gram - torch.eye(gram.size(-1), dtype=A.dtype, device=A.device)))

    return penalty


PENALTY_MISTAKES = (
    Mistake("Aᵀ A instead of A Aᵀ", _penalty(transposed=True),
            "You computed Aᵀ A (keys against keys, T_k × T_k); the penalty compares heads with heads: "
            "A Aᵀ is H × H (A @ A.transpose(-2, -1))."),
    Mistake("norm not squared", _penalty(reduce=lambda p: p.sum(dim=(-2, -1)).sqrt()),
            "You returned the Frobenius norm ‖A Aᵀ − I‖_F; the penalty is its square (no square root)."),
    Mistake("identity not subtracted", lambda A: (A @ A.transpose(-2, -1)).pow(2).sum(dim=(-2, -1)),
            "The identity is missing: the penalty is ‖A Aᵀ − I‖_F², subtract torch.eye(H) before squaring."),
    Mistake("summed over the batch", _penalty(reduce=lambda p: p.sum()),
            "You summed over every axis and returned one number; sum over the last two axes only, "
            "so that A (..., H, T_k) gives a penalty of shape (...)."),
    Mistake("absolute values instead of squares", _penalty(entry=torch.abs),
            "You summed absolute values; the squared Frobenius norm sums the squares of the entries."),
)


def _penalty_spec() -> ItemSpec:
    return ItemSpec(
        name="head_diversity_penalty", reference=ref.head_diversity_penalty, mistakes=PENALTY_MISTAKES,
        subchecks=(
            # (the hand example is public: with it, one the student has not seen)
            SubCheck("matches the reference on the hand example and a random input of its shape", 1,
                     compare_cases(_hand_penalty_case(), _penalty_case((2, 3), 305, f32))),
            SubCheck("a batch A (2, 3, 5)", 1, compare_cases(_penalty_case((2, 3, 5), 300, f32))),
            SubCheck("other shapes (extra batch axes, H > T_k, one head), one-hot heads, float64", 1,
                     compare_cases(_penalty_case((2, 3, 4, 6), 310, f64), _penalty_case((5, 3), 320, f32),
                                   _penalty_case((2, 4, 4), 330, f64, "onehot"), _penalty_case((3, 1, 7), 340, f64)),
                     hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# mha_parameter_count
# ---------------------------------------------------------------------------


def _count_case(d_model: int, num_heads: int, bias: bool | None = None) -> Case:
    kwargs = {"d_model": d_model, "num_heads": num_heads}
    label = f"d_model = {d_model}, num_heads = {num_heads}"
    if bias is not None:
        kwargs["bias"] = bias
        label += f", bias = {bias}"
    return Case(label, lambda device: dict(kwargs))


def count_per_head_full(d_model, num_heads, bias=True):
    return num_heads * (3 * d_model * d_model + (3 * d_model if bias else 0)) + d_model * d_model + (d_model if bias else 0)


COUNT_MISTAKES = (
    Mistake("output map forgotten",
            lambda d_model, num_heads, bias=True: 3 * d_model * d_model + (3 * d_model if bias else 0),
            "You counted w_q, w_k and w_v but not the output map w_o: there are four d_model × d_model maps."),
    Mistake("full-size maps per head", count_per_head_full,
            "You gave every head full d_model × d_model maps; the heads share them, each using d_model / num_heads "
            "of the outputs, so the count does not grow with num_heads."),
    Mistake("biases forgotten", lambda d_model, num_heads, bias=True: 4 * d_model * d_model,
            "The biases are missing: each of the four maps has d_model biases when bias=True."),
    Mistake("bias argument ignored", lambda d_model, num_heads, bias=True: 4 * d_model * d_model + 4 * d_model,
            "With bias=False there are no biases: count 4·d_model² only."),
    Mistake("float result",
            lambda d_model, num_heads, bias=True: float(4 * d_model * d_model + (4 * d_model if bias else 0)),
            "Return a Python int (use // or int(...)), not a float."),
)


def _fresh_count_case() -> Case:
    """A size no notebook shows, another at each grading (the Transformer-base layer is public)."""
    heads = fresh(71, 1, 8)
    return _count_case(heads * fresh(72, 2, 24), heads)


def _count_spec() -> ItemSpec:
    return ItemSpec(
        name="mha_parameter_count", reference=ref.mha_parameter_count, mistakes=COUNT_MISTAKES,
        subchecks=(
            SubCheck("the Transformer-base layer (d_model = 512, num_heads = 8) and a fresh size", 1,
                     lambda t: t.compare([_count_case(512, 8), _fresh_count_case()])),
            SubCheck("other sizes, one head, and bias = False", 1,
                     compare_cases(_count_case(64, 4, True), _count_case(12, 1), _count_case(512, 8, False),
                                   _count_case(48, 6, False)),
                     hidden=True),
        ),
    )


SPECS = {
    spec.name: spec
    for spec in (_split_spec(), _merge_spec(), _mha_spec(), _penalty_spec(), _count_spec())
}
