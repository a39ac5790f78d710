"""Check specs for notebook 05 (positional encoding): sinusoidal_positional_encoding,
pe_shift_matrix, relative_position_index and RelativeSelfAttention, with their mistake
catalogues."""

from __future__ import annotations

import math

import torch
from torch import nn

from ... import positional as ref
from ..judge.compare import describe_difference, fmt_num
from ..answer.calls import Invoke
from ..answer.watch import unwatched
from ..judge.properties import (compare_cases, dtype_name, fresh, masked_weights_zero, module_case, module_gradients,
                          parameter_shapes, randn, variant)
from ..judge.spec import Case, CheckFailed, ItemSpec, Mistake, SubCheck

f32, f64 = torch.float32, torch.float64

# ---------------------------------------------------------------------------
# sinusoidal_positional_encoding
# ---------------------------------------------------------------------------


def _pe_case(T: int, d: int) -> Case:
    return Case(f"num_positions = {T}, d_model = {d}", lambda device: {"num_positions": T, "d_model": d})


def _angles(T: int, d: int, exponent, base: float = 10000.0, start: int = 0) -> torch.Tensor:
    """(T, d/2) angles pos / base^{exponent(i)} for pair index i (float64)."""
    pos = torch.arange(start, start + T, dtype=f64)[:, None]
    i = torch.arange(d // 2, dtype=f64)[None, :]
    return pos / base ** exponent(i, d)


def _pe(exponent=lambda i, d: 2 * i / d, cos_exponent=None, base=10000.0, start=0, swapped=False, halves=False,
        dtype=None):
    """A wrong encoding: another ``exponent(i, d)`` (for the cosines ``cos_exponent``), base or first
    position, sine and cosine swapped, in halves instead of interleaved, left in ``dtype``."""

    def encoding(num_positions, d_model):
        a = _angles(num_positions, d_model, exponent, base, start)
        b = _angles(num_positions, d_model, cos_exponent, base, start) if cos_exponent else a
        even, odd = (b.cos(), a.sin()) if swapped else (a.sin(), b.cos())
        if halves:
            return torch.cat([even, odd], dim=-1).to(torch.get_default_dtype())
        pe = torch.stack([even, odd], dim=-1).flatten(-2)
        return pe.to(dtype or torch.get_default_dtype())

    return encoding


PE_MISTAKES = (
    Mistake("sin and cos swapped", _pe(swapped=True),
            "Sine and cosine are swapped: even columns 2i hold sin(pos / 10000^{2i/d}), odd columns 2i+1 the cosine."),
    Mistake("sine half and cosine half concatenated", _pe(halves=True),
            "You put all sines in the first half and all cosines in the second (as some illustrations do); "
            "Vaswani et al. interleave them: column 2i is the sine and column 2i+1 the cosine of the same frequency."),
    Mistake("exponent i/d", _pe(lambda i, d: i / d),
            "The exponent is i/d; it is 2i/d, where i = 0 … d/2 − 1 indexes the sine/cosine pair "
            "(equivalently: the even column index divided by d)."),
    Mistake("cosine frequency from its own column", _pe(cos_exponent=lambda i, d: (2 * i + 1) / d),
            "The cosine in column 2i+1 uses exponent (2i+1)/d; it must use the same frequency as the sine in "
            "column 2i, exponent 2i/d."),
    Mistake("wrong base", _pe(base=math.e),
            "The frequencies use base e (exp); the base is 10000: pos / 10000^{2i/d}."),
    Mistake("multiplied by the power", _pe(lambda i, d: -2 * i / d),
            "You multiplied pos by 10000^{2i/d}; divide by it, so that the frequencies fall from 1 to about 1/10000."),
    Mistake("positions start at 1", _pe(start=1),
            "Your positions start at 1; the first row is position 0 (sin 0 = 0, cos 0 = 1)."),
    Mistake("float64 result", _pe(dtype=f64),
            "The values are right but the result is float64: return torch's default dtype (float32), "
            "e.g. with .float() or by computing with torch tensors."),
)


def _pe_spec() -> ItemSpec:
    return ItemSpec(
        name="sinusoidal_positional_encoding", reference=ref.sinusoidal_positional_encoding, mistakes=PE_MISTAKES,
        subchecks=(
            # (the notebook's sizes are public: with each, one the student has not seen)
            SubCheck("the small example (3 positions, d_model = 4) and a fresh small size", 1,
                     lambda t: t.compare([_pe_case(3, 4), _pe_case(fresh(81, 4, 9), 2 * fresh(82, 1, 6))])),
            SubCheck("50 positions, d_model = 16, and a fresh larger size", 1,
                     lambda t: t.compare([_pe_case(50, 16), _pe_case(fresh(83, 51, 90), 2 * fresh(84, 4, 20))])),
            SubCheck("other sizes: one position, d_model = 2, d_model = 64", 1,
                     compare_cases(_pe_case(1, 8), _pe_case(9, 2), _pe_case(20, 64), _pe_case(64, 6)),
                     hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# pe_shift_matrix
# ---------------------------------------------------------------------------


def _shift_case(k: int, d: int) -> Case:
    return Case(f"k = {k}, d_model = {d}", lambda device: {"k": k, "d_model": d})


def _freqs(d):
    return 10000.0 ** (-torch.arange(0, d, 2, dtype=f64) / d)


def _blocks(angles, transpose=False):
    c, s = angles.cos(), angles.sin()
    blocks = [torch.tensor([[ci, si], [-si, ci]], dtype=f64) for ci, si in zip(c.tolist(), s.tolist())]
    if transpose:
        blocks = [b.T for b in blocks]
    return torch.block_diag(*blocks).to(torch.get_default_dtype())


def shift_no_frequency(k, d_model):
    return _blocks(torch.full((d_model // 2,), float(k), dtype=f64))


def shift_halves(k, d_model):
    a = k * _freqs(d_model)
    c, s = torch.diag(a.cos()), torch.diag(a.sin())
    return torch.cat([torch.cat([c, s], 1), torch.cat([-s, c], 1)], 0).to(torch.get_default_dtype())


SHIFT_MISTAKES = (
    Mistake("rotation the wrong way", lambda k, d_model: _blocks(k * _freqs(d_model), transpose=True),
            "Your matrix shifts by −k (it is the transpose of M_k): for a (sin, cos) pair, "
            "sin(a + b) = sin a cos b + cos a sin b, so the block is [[cos kω, sin kω], [−sin kω, cos kω]]."),
    Mistake("angle without the frequency", shift_no_frequency,
            "Every pair is rotated by the angle k; pair i turns by k·ω_i with ω_i = 1 / 10000^{2i/d}."),
    Mistake("k ignored", lambda k, d_model: _blocks(_freqs(d_model)),
            "Your matrix shifts by one position whatever k is: the angles are k·ω_i."),
    Mistake("built for sine and cosine halves", shift_halves,
            "Your matrix is laid out for a sine half and a cosine half; the encoding interleaves them "
            "(pair i sits in entries 2i, 2i+1), so M_k is block diagonal with 2 × 2 blocks."),
    Mistake("float64 result", lambda k, d_model: _blocks(k * _freqs(d_model)).to(f64),
            "The values are right but the result is float64: return torch's default dtype (float32)."),
)


def _shift_property(trial) -> None:
    """M_k PE[pos] = PE[pos + k] for all pos, with the reference encoding."""
    for k, d in ((2, 8), (-3, 6)):
        with unwatched():
            pe = ref.sinusoidal_positional_encoding(40, d, dtype=f64)
        M = trial.student({"k": k, "d_model": d}, f"k = {k}, d_model = {d}")
        if not isinstance(M, torch.Tensor) or M.shape != (d, d):
            got = tuple(M.shape) if isinstance(M, torch.Tensor) else type(M).__name__
            raise CheckFailed(f"pe_shift_matrix({k}, {d}) should be a ({d}, {d}) tensor, got {got}.")
        M = M.detach().cpu()
        if not M.is_floating_point():
            raise CheckFailed(f"pe_shift_matrix({k}, {d}) should be a float tensor, got {dtype_name(M.dtype)}.")
        pe = pe.to(M.dtype)  # compare at the precision of the student's matrix
        lo, hi = max(0, -k), 40 - max(0, k)
        moved = pe[lo:hi] @ M.T  # row pos: M_k PE[pos]
        target = pe[lo + k:hi + k]
        problem = describe_difference(target, moved, what="M_k PE[pos]")
        if problem:
            error = (moved - target).abs()
            bad = error.amax(-1).argmax().item() + lo
            raise CheckFailed(
                f"With k = {k}, d_model = {d}: M_k PE[pos] should equal PE[pos + k] for every pos, "
                f"but not for pos = {bad} (the largest error there is {fmt_num(error.max().item())})."
            )


def _shift_spec() -> ItemSpec:
    return ItemSpec(
        name="pe_shift_matrix", reference=ref.pe_shift_matrix, mistakes=SHIFT_MISTAKES,
        subchecks=(
            # a case the notebook never shows catches a function that reads a notebook global
            # instead of its argument; fixed (not salted), so that every submission gets the same points
            SubCheck("pe_shift_matrix(1, 4) and a fresh k, d_model match the reference", 1,
                     lambda t: t.compare([_shift_case(1, 4), _shift_case((1 - 2 * fresh(87, 0, 1)) * fresh(85, 2, 7),
                                                                         2 * fresh(86, 2, 6))])),
            SubCheck("other shifts and sizes: k = 0, negative k, k = 10, d_model = 2", 1,
                     compare_cases(_shift_case(3, 8), _shift_case(0, 6), _shift_case(-2, 8),
                                   _shift_case(10, 16), _shift_case(5, 2)), hidden=True),
            SubCheck("M_k PE[pos] = PE[pos + k] for every position", 1, _shift_property, hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# relative_position_index
# ---------------------------------------------------------------------------


def _rel_case(T_q: int, T_k: int, delta: int) -> Case:
    return Case(f"T_q = {T_q}, T_k = {T_k}, max_distance = {delta}",
                lambda device: {"T_q": T_q, "T_k": T_k, "max_distance": delta})


def _distance(T_q, T_k):
    return torch.arange(T_k)[None, :] - torch.arange(T_q)[:, None]


def rel_clipped_short(T_q, T_k, max_distance):
    return _distance(T_q, T_k).clamp(-max_distance + 1, max_distance - 1) + max_distance


def rel_int32(T_q, T_k, max_distance):
    return (_distance(T_q, T_k).clamp(-max_distance, max_distance) + max_distance).int()


REL_MISTAKES = (
    Mistake("sign flipped",
            lambda T_q, T_k, max_distance: (-_distance(T_q, T_k)).clamp(-max_distance, max_distance) + max_distance,
            "The distance has the wrong sign: entry [i, j] uses j − i (key position minus query position), "
            "so keys to the right of the query get indices above δ."),
    Mistake("not clipped", lambda T_q, T_k, max_distance: _distance(T_q, T_k) + max_distance,
            "The distance is not clipped: distances beyond ±δ must be clamped to [−δ, δ] "
            "(torch.clamp) before adding δ, so the indices stay in [0, 2δ]."),
    Mistake("not shifted by δ", lambda T_q, T_k, max_distance: _distance(T_q, T_k).clamp(-max_distance, max_distance),
            "The indices are the clipped distances in [−δ, δ]; add δ so they run over [0, 2δ] and can index an embedding."),
    Mistake("clipped at δ − 1", rel_clipped_short,
            "You clipped to [−(δ−1), δ−1]; the range is [−δ, δ]: clamp(j − i, −δ, δ) + δ."),
    Mistake("int32 indices", rel_int32,
            "The values are right but the dtype is int32: return a LongTensor (torch.long) that nn.Embedding accepts."),
)


def _rel_spec() -> ItemSpec:
    return ItemSpec(
        name="relative_position_index", reference=ref.relative_position_index, mistakes=REL_MISTAKES,
        subchecks=(
            SubCheck("relative_position_index(5, 5, 2) and fresh sizes match the reference", 1,
                     lambda t: t.compare([_rel_case(5, 5, 2), _rel_case(fresh(88, 2, 8), fresh(89, 6, 10),
                                                                     fresh(90, 1, 4))])),
            SubCheck("T_q ≠ T_k, δ = 0, δ larger than the sequence, one query", 1,
                     compare_cases(_rel_case(3, 7, 1), _rel_case(6, 3, 2), _rel_case(4, 4, 0),
                                   _rel_case(5, 5, 9), _rel_case(1, 6, 2)), hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# RelativeSelfAttention
# ---------------------------------------------------------------------------


def _half_relative(module: nn.Module) -> None:
    """``adjust``: smaller relative vectors keep the softmax away from saturation."""
    module.rel_k.weight.mul_(0.5)
    module.rel_v.weight.mul_(0.5)


def _relattn_case(seed: int, B: int, T: int, d_model: int, delta: int, dtype: torch.dtype, causal: bool) -> Case:
    def inputs(device: torch.device) -> dict:
        mask = torch.ones(T, T, dtype=torch.bool, device=device).tril() if causal else None
        return {"x": randn((B, T, d_model), seed, dtype, device), "mask": mask}

    m = "causal mask" if causal else "no mask"
    return module_case(f"RelativeSelfAttention(d_model={d_model}, max_distance={delta}) on x ({B}, {T}, {d_model}) "
                       f"{dtype_name(dtype)}, {m}", ref.RelativeSelfAttention, (d_model, delta),
                       2468 + 11 * d_model + delta, dtype, inputs, adjust=_half_relative)


class _RelLayout(nn.Module):
    """The contract's parameter layout, shared by the catalogued wrong variants."""

    def __init__(self, d_model: int, max_distance: int) -> None:
        super().__init__()
        self.max_distance = max_distance
        self.w_q = nn.Linear(d_model, d_model, bias=False)
        self.w_k = nn.Linear(d_model, d_model, bias=False)
        self.w_v = nn.Linear(d_model, d_model, bias=False)
        self.rel_k = nn.Embedding(2 * max_distance + 1, d_model)
        self.rel_v = nn.Embedding(2 * max_distance + 1, d_model)

    def index(self, T, device, sign=1):
        i = torch.arange(T, device=device)
        return (sign * (i[None, :] - i[:, None])).clamp(-self.max_distance, self.max_distance) + self.max_distance

    def run(self, x, mask, sign=1, use_ak=True, use_av=True, ak_on_query=False, scale=None, dim=-1, use_mask=True):
        q, k, v = self.w_q(x), self.w_k(x), self.w_v(x)
        idx = self.index(x.size(1), x.device, sign)
        a_k, a_v = self.rel_k(idx), self.rel_v(idx)
        if ak_on_query:
            s = torch.einsum("bijd,bjd->bij", q[:, :, None, :] + a_k[None], k)
        else:
            s = q @ k.transpose(-2, -1)
            if use_ak:
                s = s + torch.einsum("bid,ijd->bij", q, a_k)
        s = s / (math.sqrt(x.size(-1)) if scale is None else scale)
        if mask is not None and use_mask:
            s = s.masked_fill(~mask, float("-inf"))
        w = torch.softmax(s, dim=dim)
        out = w @ v
        if use_av:
            out = out + torch.einsum("bij,ijd->bid", w, a_v)
        return out, w


RELATTN_MISTAKES = (
    Mistake("relative index sign flipped", variant(_RelLayout, "RelSignFlipped", sign=-1),
            "The relative positions have the wrong sign: a^K_ij and a^V_ij use clip(j − i, −δ, δ) + δ "
            "(key minus query), as in relative_position_index."),
    Mistake("a^K missing", variant(_RelLayout, "RelNoKeyTerm", use_ak=False),
            "The scores ignore the relative keys: e_ij = q_i · (k_j + a^K_ij) / √d, add the term q_i · a^K_ij."),
    Mistake("a^V missing", variant(_RelLayout, "RelNoValueTerm", use_av=False),
            "The output ignores the relative values: out_i = Σ_j α_ij (v_j + a^V_ij), add Σ_j α_ij a^V_ij."),
    Mistake("a^K added to the query", variant(_RelLayout, "RelOnQuery", ak_on_query=True),
            "The relative vector is added to the query; Shaw et al. add it to the key: q_i · (k_j + a^K_ij)."),
    Mistake("no scaling", variant(_RelLayout, "RelNoScale", scale=1.0),
            "The scores are not scaled: divide by √d_model."),
    Mistake("mask ignored", variant(_RelLayout, "RelMaskIgnored", use_mask=False),
            "forward ignores its mask: fill disallowed scores with -inf before the softmax."),
    Mistake("softmax over the query axis", variant(_RelLayout, "RelSoftmaxQueries", dim=-2),
            "Your weights sum to 1 over the queries, not the keys: apply the softmax over the last axis (dim=-1)."),
)


def _relattn_advice(got: dict) -> str:
    advice = ""
    if got.get("rel_k.weight", (5,))[0] != 5:
        advice += " There are 2δ + 1 = 5 clipped distances −2 … 2, so the embeddings have 2·max_distance + 1 rows."
    return advice


def _relattn_parameters(trial) -> None:
    expected = {"w_q.weight": (6, 6), "w_k.weight": (6, 6), "w_v.weight": (6, 6),
                "rel_k.weight": (5, 6), "rel_v.weight": (5, 6)}
    parameter_shapes(trial, (6, 2), expected, "RelativeSelfAttention(d_model=6, max_distance=2)", _relattn_advice)


def _relattn_spec() -> ItemSpec:
    visible = _relattn_case(400, 2, 6, 8, 2, f32, False)
    hidden = (
        _relattn_case(410, 2, 7, 8, 2, f64, True),
        _relattn_case(420, 1, 5, 6, 1, f32, False),
        _relattn_case(430, 3, 4, 4, 6, f64, False),
        _relattn_case(440, 2, 9, 10, 3, f64, True),
    )
    causal = _relattn_case(450, 2, 5, 6, 2, f32, True)
    grad_case = _relattn_case(460, 2, 5, 6, 2, f64, True)

    def _masked_weights_and_gradients(t) -> None:
        """Causally masked weights are exactly 0, and gradients reach x and every parameter."""
        masked_weights_zero(t, causal)
        module_gradients(t, grad_case)

    return ItemSpec(
        name="RelativeSelfAttention", reference=ref.RelativeSelfAttention,
        invoke=Invoke(module=True, forward=("x", "mask")), output_names=("out", "weights"), mistakes=RELATTN_MISTAKES,
        subchecks=(
            SubCheck("parameters w_q, w_k, w_v (no bias) and rel_k, rel_v with 2δ + 1 rows", 1, _relattn_parameters),
            SubCheck("matches the reference (same weights) on a random batch", 1, compare_cases(visible)),
            SubCheck("matches with a causal mask, float64, δ = 1 and δ longer than the sequence", 1,
                     compare_cases(*hidden), hidden=True),
            SubCheck("masked weights are exactly 0; gradients reach x and every parameter", 1,
                     _masked_weights_and_gradients, hidden=True),
        ),
    )


SPECS = {
    spec.name: spec
    for spec in (_pe_spec(), _shift_spec(), _rel_spec(), _relattn_spec())
}
