"""Check specs for notebook 03 (self-attention): scaled_dot_product_attention,
causal_mask, padding_mask and SelfAttention, with their mistake catalogues."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ... import attention as ref
from ..answer.calls import Invoke, earlier
from ..judge.properties import (compare_cases, sample_inputs, dtype_name, generator, gradients_reach, mask_words, masked_keys_ignored,
                          masked_weights_zero, module_case, module_gradients, parameter_shapes, randn, seed, variant,
                          weights_sum_to_one)
from ..judge.spec import Case, CheckFailed, ItemSpec, Mistake, SubCheck

f32, f64 = torch.float32, torch.float64

# ---------------------------------------------------------------------------
# scaled_dot_product_attention
# ---------------------------------------------------------------------------


def _sdpa_case(seed: int, batch: tuple[int, ...], t_q: int, t_k: int, d_k: int, d_v: int,
               dtype: torch.dtype, mask: str = "none") -> Case:
    """Random q, k, v of shape batch + (T, d); mask 'none', 'causal' or 'padding'."""

    def make(device: torch.device) -> dict:
        q = randn((*batch, t_q, d_k), seed, dtype, device)
        k = randn((*batch, t_k, d_k), seed + 1, dtype, device)
        v = randn((*batch, t_k, d_v), seed + 2, dtype, device)
        m = None
        if mask == "causal":
            m = torch.ones(t_q, t_k, dtype=torch.bool, device=device).tril()
        elif mask == "padding":
            b = batch[0] if batch else 1
            lengths = torch.tensor([max(1, t_k - 2 * i) for i in range(b)], device=device)
            m = torch.arange(t_k, device=device)[None, :] < lengths[:, None]  # (B, T_k)
            m = m.view(b, *([1] * (len(batch) - 1)), 1, t_k) if batch else m.view(1, t_k)
        return {"q": q, "k": k, "v": v, "mask": m}

    sample = sample_inputs(make)
    label = (f"q {tuple(sample['q'].shape)}, k {tuple(sample['k'].shape)}, v {tuple(sample['v'].shape)} "
             f"{dtype_name(dtype)}, {mask_words(sample['mask'])}")
    return Case(label, make)


def _hand_case() -> Case:
    def make(device: torch.device) -> dict:
        q = torch.tensor([[1.0, 0.0], [0.0, 2.0]], device=device)
        k = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], device=device)
        v = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], device=device)
        return {"q": q, "k": k, "v": v, "mask": None}

    return Case("the hand example q (2, 2), k (3, 2), v (3, 2), no mask (from the notebook)", make)


def _scores(q, k):
    return q @ k.transpose(-2, -1)


def _finish(scores, v, mask, dim=-1):
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    w = torch.softmax(scores, dim=dim)
    return w @ v, w


def _sdpa(scale=lambda q, k, v: math.sqrt(q.size(-1)), mask_as="-inf", dim=-1, transposed=False, swapped=False,
          all_axes_reversed=False):
    """A wrong attention: the scores divided by ``scale(q, k, v)`` (None: not scaled), the mask
    filled with -inf, inverted, ignored ("none"), applied "after" the softmax or filled with "0",
    the softmax over ``dim``, the weights transposed, the outputs swapped, ``k.T`` (every axis
    of a batched key tensor reversed: it raises on a batch)."""

    def sdpa(q, k, v, mask=None):
        if all_axes_reversed:
            s = q @ k.T  # every axis reversed beyond 2-D (deprecated there: torch warns, or will raise)
        else:
            s = _scores(q, k)
        s = s / scale(q, k, v) if scale else s
        if mask is not None and mask_as in ("-inf", "inverted", "0"):
            s = s.masked_fill(mask if mask_as == "inverted" else ~mask, 0.0 if mask_as == "0" else float("-inf"))
        w = torch.softmax(s, dim=dim)
        if mask is not None and mask_as == "after":
            w = w * mask
        out, w = w @ v, (w.transpose(-2, -1) if transposed else w)
        return (w, out) if swapped else (out, w)

    return sdpa


SDPA_MISTAKES = (
    Mistake("softmax over the query axis", _sdpa(dim=-2),
            "Your weights sum to 1 over the queries, not the keys: apply the softmax over the last axis (dim=-1)."),
    Mistake("no scaling", _sdpa(scale=None),
            "The scores are not scaled: divide q kᵀ by √d_k, with d_k = q.size(-1)."),
    Mistake("scaled by d_k", _sdpa(scale=lambda q, k, v: q.size(-1)),
            "The scores are divided by d_k instead of √d_k: use math.sqrt(q.size(-1))."),
    Mistake("scaled by √d_v", _sdpa(scale=lambda q, k, v: math.sqrt(v.size(-1))),
            "The scores are divided by √d_v (from v) instead of √d_k (the size of queries and keys): use q.size(-1)."),
    Mistake("scaled by √T_k", _sdpa(scale=lambda q, k, v: math.sqrt(k.size(-2))),
            "The scores are divided by the square root of the number of keys, not of the key dimension d_k = q.size(-1)."),
    Mistake("mask inverted", _sdpa(mask_as="inverted"),
            "Your mask is inverted: True means 'may attend', so fill the scores where the mask is False (~mask)."),
    Mistake("mask ignored", _sdpa(mask_as="none"),
            "The mask has no effect: set the scores of disallowed positions to -inf before the softmax."),
    Mistake("mask after softmax", _sdpa(mask_as="after"),
            "The mask is applied after the softmax, so the remaining weights no longer sum to 1: "
            "mask the scores (with -inf) before the softmax instead."),
    Mistake("masked scores filled with 0", _sdpa(mask_as="0"),
            "Masked scores are set to 0, but exp(0) = 1 still gives them weight: fill them with float('-inf')."),
    Mistake("weights transposed", _sdpa(transposed=True),
            "The output is right but the weights are transposed: return weights with shape (..., T_q, T_k), "
            "one row per query."),
    Mistake("outputs swapped", _sdpa(swapped=True),
            "You returned (weights, output): return (output, weights)."),
    Mistake("k.T on a batch", _sdpa(all_axes_reversed=True),
            "`k.T` reverses every axis of a batched k, not the last two: use k.transpose(-2, -1)."),
)


def _sdpa_spec() -> ItemSpec:
    hand = _hand_case()
    visible_random = _sdpa_case(10, (2,), 5, 5, 4, 4, f32, "causal")
    hidden_cases = (
        _sdpa_case(20, (2, 3), 4, 6, 8, 5, f64, "none"),
        _sdpa_case(30, (3,), 6, 6, 16, 16, f32, "padding"),
        _sdpa_case(40, (2, 2), 5, 5, 4, 7, f64, "causal"),
        _sdpa_case(50, (), 3, 7, 6, 2, f32, "none"),
        _sdpa_case(60, (2, 4), 1, 9, 3, 3, f32, "padding"),
    )
    pad = _sdpa_case(70, (3,), 5, 7, 4, 3, f64, "padding")
    causal = _sdpa_case(80, (2,), 6, 6, 5, 5, f32, "causal")

    def _weights_and_masks(t) -> None:
        """Weights sum to 1, masked weights are 0 (padding and causal), masked keys do not leak."""
        weights_sum_to_one(t, pad)
        masked_weights_zero(t, pad)
        masked_weights_zero(t, causal)
        masked_keys_ignored(t, pad)

    return ItemSpec(
        name="scaled_dot_product_attention", reference=ref.scaled_dot_product_attention,
        output_names=("out", "weights"), mistakes=SDPA_MISTAKES,
        forbidden={F.scaled_dot_product_attention:
                   "it calls torch.nn.functional.scaled_dot_product_attention; compute softmax(q kᵀ/√d_k) v yourself"},
        subchecks=(
            # (the hand example is public: with it, one the student has not seen)
            SubCheck("matches the reference on the hand example and a random input of its shape", 1,
                     compare_cases(hand, _sdpa_case(5, (), 2, 3, 2, 2, f32, "none"))),
            SubCheck("matches the reference on a random batch with a causal mask", 1, compare_cases(visible_random)),
            SubCheck("matches on other shapes, dtypes and masks (extra batch dims, T_q ≠ T_k, d_k ≠ d_v, float64)",
                     1, compare_cases(*hidden_cases), hidden=True),
            SubCheck("weights sum to 1 over the keys; masked weights are exactly 0; masked keys do not leak",
                     1, _weights_and_masks, hidden=True),
            SubCheck("gradients reach q, k and v", 1,
                     lambda t: gradients_reach(t, causal, ("q", "k", "v")), hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# causal_mask
# ---------------------------------------------------------------------------

def _causal_case(T: int) -> Case:
    return Case(f"T = {T}", lambda device: {"T": T, "device": device})


def _causal(dtype=torch.bool, upper=False, offset=0, inverted=False):
    """A wrong causal mask: the upper triangle, the diagonal excluded (``offset=-1``), inverted, not boolean."""

    def causal_mask(T, device=None):
        ones = torch.ones(T, T, dtype=dtype, device=device)
        mask = ones.triu() if upper else ones.tril(offset)
        return ~mask if inverted else mask

    return causal_mask


CAUSAL_MISTAKES = (
    Mistake("upper triangle", _causal(upper=True),
            "Your mask lets each query see the future (True above the diagonal): use torch.tril, so query i sees keys 0..i."),
    Mistake("diagonal excluded", _causal(offset=-1),
            "The diagonal is False: a token may attend to itself, so use tril() without an offset."),
    Mistake("inverted", _causal(inverted=True),
            "Your mask is inverted: True must mean 'may attend' (on and below the diagonal)."),
    Mistake("float mask", _causal(dtype=None),
            "Return a boolean mask (dtype=torch.bool), not floats: True means 'may attend'."),
    Mistake("integer mask", _causal(dtype=torch.long),
            "Return a boolean mask (dtype=torch.bool), not integers: True means 'may attend'."),
)


def _causal_device(trial) -> None:
    device = trial.device
    got = trial.student({"T": 3, "device": device}, f"T = 3, device = {device}")
    if not isinstance(got, torch.Tensor) or got.device.type != device.type:
        where = got.device if isinstance(got, torch.Tensor) else type(got).__name__
        raise CheckFailed(f"causal_mask(3, device={device!s}) returned a mask on {where}: pass device= to the tensor you create.")
    got = trial.student({"T": 3}, "T = 3 without a device")
    if not isinstance(got, torch.Tensor) or got.device.type != "cpu":
        raise CheckFailed("causal_mask(3) without a device should return a CPU tensor.")


def _causal_outputs_and_device(trial) -> None:
    """causal_mask matches the reference for T = 7, 2, 33, 1 and honours the device argument."""
    trial.compare([_causal_case(n) for n in (7, 2, 33, 1)])
    _causal_device(trial)


def _causal_spec() -> ItemSpec:
    return ItemSpec(
        name="causal_mask", reference=ref.causal_mask, mistakes=CAUSAL_MISTAKES,
        subchecks=(
            # the fresh length catches a function that reads a notebook global instead of T
            SubCheck("causal_mask(4) and a fresh length match the reference", 1,
                     lambda t: t.compare([_causal_case(4), _causal_case(5 + seed(41) % 8)])),
            SubCheck("other lengths (1, 2, 7, 33) and the device argument", 1,
                     _causal_outputs_and_device, hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# padding_mask
# ---------------------------------------------------------------------------

def _padding_case(lengths: list[int], T: int) -> Case:
    return Case(f"lengths = {lengths}, T = {T}",
                lambda device: {"lengths": torch.tensor(lengths, device=device), "T": T})


def _fresh_padding_case(value: int) -> Case:
    """Lengths and T the notebook never uses (so that no global of the same name holds them)."""
    g = generator(value)
    T = int(torch.randint(5, 10, (1,), generator=g))
    lengths = torch.randint(1, T + 1, (3,), generator=g).tolist()
    return _padding_case(lengths, T)


PADDING_MISTAKES = (
    Mistake("off by one",
            lambda lengths, T: (torch.arange(T, device=lengths.device)[None, :] <= lengths[:, None])[:, None, :],
            "One position too many is allowed: keys at positions 0..length-1 are real, so compare with < length, not <=."),
    Mistake("inverted",
            lambda lengths, T: (torch.arange(T, device=lengths.device)[None, :] >= lengths[:, None])[:, None, :],
            "Your mask is inverted: True must mean 'may attend', i.e. a real (non-padding) key."),
    Mistake("no query axis", lambda lengths, T: torch.arange(T, device=lengths.device)[None, :] < lengths[:, None],
            "The mask has shape (B, T); add a middle axis of size 1 (shape (B, 1, T)) so it broadcasts over the queries."),
    Mistake("query axis masked",
            lambda lengths, T: (torch.arange(T, device=lengths.device)[None, :] < lengths[:, None])[:, :, None],
            "The mask has shape (B, T, 1), which masks queries; padding masks the keys: return shape (B, 1, T)."),
)


def _padding_spec() -> ItemSpec:
    return ItemSpec(
        name="padding_mask", reference=ref.padding_mask, mistakes=PADDING_MISTAKES,
        subchecks=(
            SubCheck("padding_mask([2, 4], 4) and a fresh batch match the reference", 1,
                     lambda t: t.compare([_padding_case([2, 4], 4), _fresh_padding_case(seed(43))])),
            SubCheck("other batches: full length, length 1, T larger than every length", 1,
                     compare_cases(_padding_case([5, 1, 3], 5), _padding_case([1], 1),
                                   _padding_case([3, 6, 2, 6], 9)), hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# SelfAttention
# ---------------------------------------------------------------------------

def _selfattn_case(seed: int, B: int, T: int, d_model: int, d_k: int, d_v: int,
                   dtype: torch.dtype, causal: bool) -> Case:
    def inputs(device: torch.device) -> dict:
        mask = torch.ones(T, T, dtype=torch.bool, device=device).tril() if causal else None
        return {"x": randn((B, T, d_model), seed, dtype, device), "mask": mask}

    dims = (d_model, d_k, d_v)
    m = "causal mask" if causal else "no mask"
    return module_case(f"SelfAttention(d_model={d_model}, d_k={d_k}, d_v={d_v}) on x ({B}, {T}, {d_model}) "
                       f"{dtype_name(dtype)}, {m}", ref.SelfAttention, dims, 1234 + sum(dims), dtype, inputs)


class _SelfAttentionLayout(nn.Module):
    """The contract's parameter layout, shared by the catalogued wrong variants."""

    def __init__(self, d_model: int, d_k: int, d_v: int) -> None:
        super().__init__()
        self.w_q = nn.Linear(d_model, d_k, bias=False)
        self.w_k = nn.Linear(d_model, d_k, bias=False)
        self.w_v = nn.Linear(d_model, d_v, bias=False)

    def run(self, x, mask, scale="d_k", swapped=False, project_v=True, use_mask=True, dim=-1):
        q, k = (self.w_k(x), self.w_q(x)) if swapped else (self.w_q(x), self.w_k(x))
        s = _scores(q, k)
        if scale:
            s = s / math.sqrt(q.size(-1) if scale == "d_k" else x.size(-1))
        return _finish(s, self.w_v(x) if project_v else x, mask if use_mask else None, dim)


SELFATTN_MISTAKES = (
    Mistake("scaled by √d_model", variant(_SelfAttentionLayout, "SelfAttentionScaledByDModel", scale="d_model"),
            "The scores are divided by √d_model; divide by √d_k, the size of the queries and keys (after w_q, w_k)."),
    Mistake("no scaling", variant(_SelfAttentionLayout, "SelfAttentionNoScale", scale=None),
            "The scores are not scaled: divide q kᵀ by √d_k."),
    Mistake("queries and keys swapped", variant(_SelfAttentionLayout, "SelfAttentionQKSwapped", swapped=True),
            "Queries and keys are swapped: queries come from w_q(x), keys from w_k(x); "
            "your weights come out transposed."),
    Mistake("values not projected", variant(_SelfAttentionLayout, "SelfAttentionValuesFromX", project_v=False),
            "The values are x itself: project them with w_v(x)."),
    Mistake("mask ignored", variant(_SelfAttentionLayout, "SelfAttentionMaskIgnored", use_mask=False),
            "forward ignores its mask argument: pass it on to the attention."),
    Mistake("softmax over the query axis", variant(_SelfAttentionLayout, "SelfAttentionSoftmaxQueries", dim=-2),
            "Your weights sum to 1 over the queries, not the keys: apply the softmax over the last axis (dim=-1)."),
)


def _selfattn_spec() -> ItemSpec:
    visible = _selfattn_case(100, 2, 5, 8, 4, 6, f32, False)
    hidden = (
        _selfattn_case(110, 3, 7, 12, 6, 6, f64, True),
        _selfattn_case(120, 1, 4, 16, 8, 3, f32, False),
        _selfattn_case(130, 2, 6, 10, 10, 5, f64, True),
    )
    grad_case = _selfattn_case(140, 2, 5, 8, 4, 6, f64, True)

    return ItemSpec(
        name="SelfAttention", reference=ref.SelfAttention,
        invoke=Invoke(module=True, forward=("x", "mask"), names=earlier(ref.scaled_dot_product_attention)),
        output_names=("out", "weights"), mistakes=SELFATTN_MISTAKES,
        subchecks=(
            SubCheck("parameters w_q, w_k, w_v with the right shapes and no bias", 1,
                     lambda t: parameter_shapes(t, (6, 4, 5), {"w_q.weight": (4, 6), "w_k.weight": (4, 6),
                                                               "w_v.weight": (5, 6)},
                                                "SelfAttention(d_model=6, d_k=4, d_v=5)")),
            SubCheck("matches the reference (same weights) on a random batch", 1, compare_cases(visible)),
            SubCheck("matches with a causal mask, float64, d_model ≠ d_k ≠ d_v", 1, compare_cases(*hidden), hidden=True),
            SubCheck("gradients reach x, w_q, w_k and w_v", 1, lambda t: module_gradients(t, grad_case), hidden=True),
        ),
    )


SPECS = {
    spec.name: spec
    for spec in (_sdpa_spec(), _causal_spec(), _padding_spec(), _selfattn_spec())
}
