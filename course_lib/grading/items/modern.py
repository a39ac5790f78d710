"""Check specs for notebook 11 (the modern decoder): RMSNorm, rope_angles, apply_rope, SwiGLU,
repeat_kv, GroupedQueryAttention, kv_cache_bytes and ModernBlock, with their mistake catalogues.

Module items are graded with the grader's weights (the reference's seeded initialisation, RMSNorm
weights moved away from ones so that a forgotten weight shows). The catalogued wrong variants are
written here, standalone: they never call or subclass their own item's reference (a variant of
GroupedQueryAttention rotates with course_lib's ``apply_rope``, an earlier item's reference).
``apply_rope`` is judged on its own: while it runs, the name ``rope_angles`` means the grader's own
(:func:`course_lib.grading.answer.fixtures.modern.grader_angles`; the reference is not available in the sandbox).
"""

from __future__ import annotations

import math
import types
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ... import modern as ref
from ... import positional as ref_positional
from ..answer.calls import Invoke, earlier
from ..judge.compare import describe_difference, fmt_num, precision_hint
from ..answer.fixtures.modern import grader_angles
from ..judge.properties import (call_and_inspect, compare_cases, dtype_name, fresh, generator, layout, module_case,
                          module_gradients, parameter_shapes, raises_value_error, randn, type_name, variant)
from ..judge.spec import Case, CheckFailed, ItemSpec, Mistake, SubCheck
from ..judge.trial import raised

f32, f64 = torch.float32, torch.float64


def _moved_norms(seed: int):
    """``adjust`` for :func:`reference_state`: every RMSNorm weight drawn around 1."""

    def adjust(module: nn.Module) -> None:
        g = generator(seed + 1)
        for key, value in module.state_dict().items():
            if key == "weight" or key.endswith("norm.weight"):
                value.copy_(1.0 + 0.3 * torch.randn(value.shape, generator=g))

    return adjust


def _layer_case(label: str, cls: type, args: tuple, seed: int, dtype: torch.dtype, inputs) -> Case:
    return module_case(label, cls, args, seed, dtype, inputs, adjust=_moved_norms(seed))


def _refuses(trial, args: tuple, label: str, why: str) -> None:
    """The student's class refuses to be built as ``impl(*args)`` with a ValueError."""
    try:
        layout(trial, args, label=label)
    except CheckFailed as failed:
        if raised(failed, "ValueError"):
            return
        raise CheckFailed(f"{label}: expected a ValueError ({why}); instead {failed}", cause=failed.cause) from None
    raise CheckFailed(f"{label} was built without complaint: raise a ValueError when {why}.")


def _no_future_leak(case: Case, index: int | None, hint: str):
    """Sub-check body: new random vectors at the last two positions of ``x`` leave the outputs
    (output ``index`` of a tuple, or the output) at earlier positions unchanged."""

    def run(trial) -> None:
        before = trial.student(case.make(trial.device), case.label)
        changed = case.make(trial.device)
        x = changed["x"].clone()
        x[:, -2:] = 3.0 * randn(x[:, -2:].shape, 999, x.dtype, x.device)
        changed["x"] = x
        after = trial.student(changed, case.label)
        a = before[index] if index is not None and isinstance(before, (tuple, list)) else before
        b = after[index] if index is not None and isinstance(after, (tuple, list)) else after
        if not isinstance(a, Tensor) or not isinstance(b, Tensor) or a.dim() != 3:
            raise CheckFailed(f"On {case.label}: expected an output tensor (B, T, d_model), got {type_name(a)}.")
        if describe_difference(a[:, :-2].detach(), b[:, :-2].detach()) is not None:
            raise CheckFailed(f"On {case.label}: changing the last two positions of x changed the outputs at "
                              f"earlier positions: {hint}")

    return run


# ---------------------------------------------------------------------------
# RMSNorm
# ---------------------------------------------------------------------------

class _RMSLayout(nn.Module):
    def __init__(self, d_model, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def run(self, x, center=False, std=False, eps_outside=False, use_eps=True, total=False, dim=-1, scale=True):
        if center:
            x = x - x.mean(dim, keepdim=True)
        if std:
            square = x.var(dim, keepdim=True, unbiased=False)
        else:
            square = x.pow(2).sum(dim, keepdim=True) if total else x.pow(2).mean(dim, keepdim=True)
        eps = self.eps if use_eps else 0.0
        out = x / (square.sqrt() + eps if eps_outside else torch.sqrt(square + eps))
        return out * self.weight if scale else out


RMS_MISTAKES = (
    Mistake("mean subtracted (LayerNorm)", variant(_RMSLayout, "RMSNormCentred", center=True),
            "You subtract the mean (x − mean): that is LayerNorm. RMSNorm leaves the mean alone and divides x by "
            "its root mean square, torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)."),
    Mistake("divided by the standard deviation", variant(_RMSLayout, "RMSNormStd", std=True),
            "You divide by the standard deviation (x.var() and x.std() subtract the mean first); RMSNorm divides "
            "by the root mean square of x itself, torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)."),
    Mistake("eps outside the square root", variant(_RMSLayout, "RMSNormEpsOutside", eps_outside=True),
            "eps is added after the square root: add it to the mean square, inside the root, "
            "x / sqrt(mean(x²) + eps)."),
    Mistake("eps left out", variant(_RMSLayout, "RMSNormNoEps", use_eps=False),
            "eps is missing: x / sqrt(mean(x²) + eps), so that a vector near zero is not divided by (nearly) 0."),
    Mistake("sum instead of mean", variant(_RMSLayout, "RMSNormSum", total=True),
            "You sum the squares over the features; RMSNorm takes their mean, x.pow(2).mean(dim=-1, keepdim=True)."),
    Mistake("over the positions", variant(_RMSLayout, "RMSNormWrongAxis", dim=-2),
            "You take the mean over the wrong axis: RMSNorm normalises the features of each position, the last "
            "axis (dim=-1, keepdim=True)."),
    Mistake("weight not applied", variant(_RMSLayout, "RMSNormNoWeight", scale=False),
            "The output is normalised but not multiplied by self.weight: return x / rms * self.weight."),
)


def _rms_case(shape: tuple, dtype: torch.dtype, seed: int, scale: float = 1.0, shift: float = 0.0,
              eps: float | None = None) -> Case:
    d = shape[-1]
    words = "" if scale == 1.0 else f" of tiny size (std {scale:g}, where eps matters)"
    if shift:
        words += f" around {shift:g}"
    args = (d,) if eps is None else (d, eps)
    made = f"RMSNorm({d})" if eps is None else f"RMSNorm({d}, eps={eps:g})"
    return _layer_case(f"{made} on x {shape} {dtype_name(dtype)}{words}", ref.RMSNorm, args, seed, dtype,
                       lambda device: {"x": randn(shape, seed, dtype, device) * scale + shift})


def _rms_parameters(trial) -> None:
    built = layout(trial, (6,), ("eps",), values=True, label="RMSNorm(6)")
    params = built.get("values", {})
    if set(params) != {"weight"} or tuple(params["weight"].shape) != (6,):
        extra = " RMSNorm has no bias." if any("bias" in k for k in params) else ""
        raise CheckFailed("RMSNorm(6) should have exactly one parameter, weight (6,); yours: "
                          f"{', '.join(f'{k} {tuple(v.shape)}' for k, v in params.items()) or 'none'}.{extra}")
    if not bool((params["weight"] == 1).all()):
        raise CheckFailed("weight starts at ones (torch.ones(d_model)), so that a new RMSNorm only normalises.")
    eps = built.get("attrs", {}).get("eps", None)
    other = layout(trial, (6,), ("eps",), kwargs={"eps": 1e-3}, values=True, label="RMSNorm(6, eps=1e-3)")
    if other.get("attrs", {}).get("eps", 1e-3) != 1e-3 or (eps is not None and eps != 1e-6):
        raise CheckFailed("eps defaults to 1e-6 and must be stored as given (RMSNorm(6, eps=1e-3)).")


def _rms_matches_torch(trial) -> None:
    x = randn((3, 4, 10), 77, f64, trial.device)
    weight = torch.linspace(0.5, 1.5, 10, dtype=f64)
    got = trial.student({"args": (10, 1e-5), "state": {"weight": weight}, "device": str(trial.device),
                         "dtype": f64, "x": x}, "RMSNorm(10, eps=1e-5) on x (3, 4, 10) float64")
    expected = F.rms_norm(x, (10,), weight.to(trial.device), 1e-5)
    problem = describe_difference(expected, got)
    if problem:
        in_float32 = F.rms_norm(x.float(), (10,), weight.float().to(trial.device), 1e-5).double()
        hint = precision_hint(expected, got, in_float32) if trial.name_mistakes else None
        raise trial.failed(f"Compared with torch.nn.functional.rms_norm on x (3, 4, 10) float64, eps 1e-5: {problem}",
                           hint)


def _rms_spec() -> ItemSpec:
    return ItemSpec(
        name="RMSNorm", reference=ref.RMSNorm, invoke=Invoke(module=True, forward=("x",)), mistakes=RMS_MISTAKES,
        forbidden={F.rms_norm: "it calls torch.nn.functional.rms_norm (or torch.nn.RMSNorm); compute the root mean "
                               "square yourself"},
        subchecks=(
            SubCheck("parameter weight (ones, no bias); eps stored, 1e-6 by default", 1, _rms_parameters),
            SubCheck("matches the reference on x (2, 3, 8)", 1, compare_cases(_rms_case((2, 3, 8), f32, 1100))),
            SubCheck("other shapes, float64, inputs far from a zero mean, tiny inputs where eps matters", 1,
                     compare_cases(_rms_case((5, 16), f64, 1110, shift=4.0), _rms_case((2, 2, 3, 12), f32, 1120),
                                   _rms_case((2, 4, 6), f64, 1130, scale=0.001),
                                   _rms_case((3, 8), f64, 1140, scale=0.03, eps=1e-2)), hidden=True),
            SubCheck("equals torch.nn.functional.rms_norm", 1, _rms_matches_torch, hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# rope_angles
# ---------------------------------------------------------------------------

def _angles_case(head_dim: int, positions, dtype: torch.dtype | None = None, base: float | None = None,
                 words: str = "") -> Case:
    def make(device):
        kw = {"head_dim": head_dim, "positions": torch.as_tensor(positions, dtype=torch.long).to(device)}
        if base is not None:
            kw["base"] = base
        if dtype is not None:
            kw["dtype"] = dtype
        return kw

    shape = tuple(torch.as_tensor(positions).shape)
    more = "".join(f", {k}={v}" for k, v in (("base", base), ("dtype", dtype and dtype_name(dtype))) if v)
    return Case(f"head_dim = {head_dim}, positions {words or shape}{more}", make)


def _wrong_angles(exponent=lambda i, d: 2 * i / d, sign=-1, by_position=True, per_feature=False, fixed_base=None,
                  fixed_dtype=None):
    """A wrong rope_angles: another exponent, a positive exponent, the position left out, one angle per
    feature, the base or the dtype ignored."""

    def rope_angles(head_dim, positions, base=10000.0, dtype=torch.float32):
        if head_dim % 2:
            raise ValueError("head_dim must be even")
        dtype = fixed_dtype or dtype
        i = torch.arange(head_dim // 2, dtype=dtype, device=positions.device)
        freq = (fixed_base or base) ** (sign * exponent(i, head_dim))
        if per_feature:
            freq = freq.repeat_interleave(2)
        pos = positions.to(dtype).unsqueeze(-1)
        return pos * freq if by_position else (pos * 0 + 1) * freq

    return rope_angles


ANGLE_MISTAKES = (
    Mistake("exponent i/head_dim", _wrong_angles(lambda i, d: i / d),
            "The exponent is i/head_dim; pair i turns by m · base^(−2i/head_dim), with i = 0 … head_dim/2 − 1 "
            "(torch.arange(0, head_dim, 2) / head_dim)."),
    Mistake("exponent over the number of pairs", _wrong_angles(lambda i, d: 2 * i / (d // 2)),
            "The exponent divides by the number of pairs: it is 2i/head_dim, so that the last pair's frequency is "
            "about 1/base, not 1/base²."),
    Mistake("positive exponent", _wrong_angles(sign=1),
            "Your angles grow with the pair index: m · base^(+2i/head_dim). The frequencies fall from 1 to about "
            "1/base: m · base^(−2i/head_dim)."),
    Mistake("position left out", _wrong_angles(by_position=False),
            "Every position gets the same angles: multiply each frequency by the position m."),
    Mistake("one angle per feature", _wrong_angles(per_feature=True),
            "Return one angle per pair, shape (..., T, head_dim // 2): apply_rope uses each angle for both features "
            "of its pair."),
    Mistake("base ignored", _wrong_angles(fixed_base=10000.0),
            "The base argument is ignored (10000 is only its default): use base ** (−2i/head_dim)."),
    Mistake("dtype ignored", _wrong_angles(fixed_dtype=f32),
            "The angles are float32 whatever dtype asks: compute them in dtype (torch.arange(..., dtype=dtype), "
            "positions.to(dtype))."),
)


def _angles_spec() -> ItemSpec:
    odd = Case("head_dim = 7 (odd), positions (3,)", lambda device: {"head_dim": 7, "positions": torch.arange(3).to(device)})

    def random_positions(seed, shape, high):
        return lambda device: torch.randint(0, high, shape, generator=generator(seed))

    def salted(seed, head_dim, shape, high, **kw):
        case = _angles_case(head_dim, torch.zeros(shape, dtype=torch.long), words=f"{shape} random in 0 … {high - 1}", **kw)

        def make(device):
            inputs = case.make(device)
            inputs["positions"] = random_positions(seed, shape, high)(device).to(device)
            return inputs

        return Case(case.label, make)

    def _hidden_angles_and_odd_head_dim(t) -> None:
        """Angles for (B, T) positions, float64, other bases and head_dims; a ValueError for an odd head_dim."""
        t.compare([salted(1210, 16, (2, 5), 40), salted(1220, 32, (7,), 5000, dtype=f64),
                   salted(1230, 64, (3, 4), 100, base=500000.0),
                   _angles_case(2, [0, 5, 9]), salted(1240, 12, (2, 3), 30, dtype=f64, base=100.0)])
        raises_value_error(odd, "RoPE rotates pairs: head_dim must be even")(t)

    return ItemSpec(
        name="rope_angles", reference=ref_positional.rope_angles, mistakes=ANGLE_MISTAKES,
        forbidden={grader_angles: "it uses the grader's own angles (course_lib.grading.answer.fixtures); compute them "
                                  "yourself"},
        subchecks=(
            # (the hand example is public: with it, positions drawn for this grading)
            SubCheck("the hand example: head_dim = 4, positions 0, 1, 2, 3, and 4 random positions", 1,
                     compare_cases(_angles_case(4, [0, 1, 2, 3]), salted(1250, 4, (4,), 20))),
            SubCheck("head_dim = 8, positions (6,)", 1, compare_cases(salted(1200, 8, (6,), 50))),
            SubCheck("positions (B, T), float64, base 500000 (Llama 3), head_dim 2 and 64; a ValueError for an odd "
                     "head_dim", 1,
                     _hidden_angles_and_odd_head_dim, hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# apply_rope
# ---------------------------------------------------------------------------

def _rotate(x, positions=None, base=10000.0, halves=False, sign=1, exponent=2.0, ignore_positions=False,
            head_axis=True, float32=False, put_back_halves=False):
    """A wrong apply_rope: the rotate-half layout, the wrong direction or exponent, the positions ignored,
    per-example positions across the heads, float32 angles, or the pairs put back as two halves."""
    T, d = x.size(-2), x.size(-1)
    if d % 2:
        raise ValueError("head_dim must be even")
    if positions is None or ignore_positions:
        positions = torch.arange(T, device=x.device)
    dtype = f32 if float32 else x.dtype
    i = torch.arange(d // 2, dtype=dtype, device=x.device)
    angles = positions.to(dtype).unsqueeze(-1) * base ** (-exponent * i / d)
    if positions.dim() == 2 and x.dim() == 4 and head_axis:
        angles = angles.unsqueeze(1)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = (x[..., :d // 2], x[..., d // 2:]) if halves else (x[..., 0::2], x[..., 1::2])
    r1, r2 = x1 * cos - sign * x2 * sin, sign * x1 * sin + x2 * cos
    if halves or put_back_halves:
        return torch.cat([r1, r2], dim=-1)
    return torch.stack([r1, r2], dim=-1).flatten(-2)


def _rope_variant(**options):
    def apply_rope(x, positions=None, base=10000.0):
        return _rotate(x, positions, base, **options)

    return apply_rope


ROPE_MISTAKES = (
    Mistake("rotate-half layout", _rope_variant(halves=True),
            "You pair feature i with feature i + head_dim/2 (the \"rotate half\" layout of GPT-NeoX and Hugging "
            "Face's Llama). This course's convention, RoFormer's and Meta's Llama's, rotates adjacent pairs "
            "(x_2i, x_2i+1): x[..., 0::2] and x[..., 1::2]."),
    Mistake("rotated the wrong way", _rope_variant(sign=-1),
            "You turn each pair by −angle: (x_2i cos + x_2i+1 sin, −x_2i sin + x_2i+1 cos). RoPE turns it by +angle: "
            "(x_2i cos − x_2i+1 sin, x_2i sin + x_2i+1 cos)."),
    Mistake("exponent i/head_dim", _rope_variant(exponent=1.0),
            "The angles use the wrong frequencies: pair i turns by m · base^(−2i/head_dim) (rope_angles)."),
    Mistake("positions ignored", _rope_variant(ignore_positions=True),
            "The positions passed in are ignored: rotate by the angles of `positions` (0 … T−1 only when it is None)."),
    Mistake("per-example positions across the heads", _rope_variant(head_axis=False),
            "Positions (B, T) hold one row per example: give the angles a head axis (angles[:, None] or "
            ".unsqueeze(1)), so that every head of example b turns by row b, not row h."),
    Mistake("angles in float32", _rope_variant(float32=True),
            "The angles are float32 for a float64 x: compute them in x's dtype (rope_angles(..., dtype=x.dtype)), "
            "so that far positions of a float64 input rotate by exact angles."),
    Mistake("pairs put back as halves", _rope_variant(put_back_halves=True),
            "You rotate the adjacent pairs but put the results back as two halves (torch.cat): interleave them "
            "again, torch.stack([first, second], dim=-1).flatten(-2), so that (x_2i, x_2i+1) stay neighbours."),
)


def _rope_case(seed: int, shape: tuple, dtype: torch.dtype = f32, positions=None, words: str = "",
               base: float | None = None) -> Case:
    """x of ``shape``; ``positions`` None (the default), or a function ``device -> LongTensor``;
    ``base`` passed when given."""

    def make(device):
        inputs = {"x": randn(shape, seed, dtype, device)}
        if positions is not None:
            inputs["positions"] = positions(device).to(device)
        if base is not None:
            inputs["base"] = base
        return inputs

    extra = f", base {base:g}" if base is not None else ""
    return Case(f"x {shape} {dtype_name(dtype)}, {words or 'positions None (0 … T−1)'}{extra}", make)


def _hand_rope_case() -> Case:
    def make(device):
        return {"x": torch.arange(1.0, 13.0).reshape(1, 1, 3, 4).to(device)}

    return Case("the hand example: x (1, 1, 3, 4) holding 1 … 12, positions None (0, 1, 2)", make)


def _rope_unchanged_and_odd(trial) -> None:
    case = _rope_case(1350, (2, 2, 4, 6), f64, lambda d: torch.tensor([3, 1, 4, 1]), "positions 3, 1, 4, 1")
    inputs = case.make(trial.device)
    _, after = call_and_inspect(trial, inputs, ["x"], case.label)
    x_after = after.get("x")
    if isinstance(x_after, Tensor) and describe_difference(case.make(trial.device)["x"], x_after) is not None:
        raise CheckFailed(f"On {case.label}: x was changed in place; return a new tensor and leave x as it was.")
    odd = _rope_case(1360, (1, 2, 3, 5), f32)
    raises_value_error(odd, "RoPE rotates pairs: head_dim must be even")(trial)


def _rope_spec() -> ItemSpec:
    def from_start(start, T):
        return lambda device: torch.arange(start, start + T)

    def per_example(seed, B, T, high):
        return lambda device: torch.randint(0, high, (B, T), generator=generator(seed))

    return ItemSpec(
        name="apply_rope", reference=ref_positional.apply_rope, mistakes=ROPE_MISTAKES,
        invoke=Invoke(names=(("rope_angles", "course_lib.grading.answer.fixtures.modern:grader_angles"),)),
        subchecks=(
            SubCheck("the hand example and x (2, 3, 5, 8), positions None", 1,
                     compare_cases(_hand_rope_case(), _rope_case(1300, (2, 3, 5, 8)))),
            SubCheck("positions (T,) given: 7 … 11", 1,
                     compare_cases(_rope_case(1310, (2, 2, 5, 8), positions=from_start(7, 5),
                                              words="positions 7 … 11"))),
            # (only what the contract gives: x (B, H, T, head_dim), positions (T,) or (B, T), a base)
            SubCheck("per-example positions (B, T) with B = H, float64 with positions near 10,000, another base "
                     "(500,000)", 1,
                     lambda t: t.compare([
                         _rope_case(1320, (2, 2, 4, 8), positions=per_example(1321, 2, 4, 60),
                                    words="positions (2, 4), one row per example"),
                         _rope_case(1330, (1, 3, 6, 16), f64, from_start(9990, 6), "positions 9990 … 9995"),
                         _rope_case(1340, (1, 2, 5, 4), f32, from_start(0, 5), "positions 0 … 4", base=500000.0),
                     ]), hidden=True),
            SubCheck("x is left unchanged; a ValueError for an odd head_dim", 1, _rope_unchanged_and_odd, hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# SwiGLU
# ---------------------------------------------------------------------------

class _SwiGLULayout(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.w1 = nn.Linear(d_model, d_ff, bias=False)
        self.w3 = nn.Linear(d_model, d_ff, bias=False)
        self.w2 = nn.Linear(d_ff, d_model, bias=False)

    def run(self, x, gate=F.silu, swapped=False, gated=True, both=False, outside=False):
        a, b = (self.w3(x), self.w1(x)) if swapped else (self.w1(x), self.w3(x))
        if outside:
            return self.w2(gate(a * b))
        if not gated:
            return self.w2(gate(a))
        return self.w2(gate(a) * (gate(b) if both else b))


SWIGLU_MISTAKES = (
    Mistake("w1 and w3 swapped", variant(_SwiGLULayout, "SwiGLUSwapped", swapped=True),
            "w1 is the gate and w3 the up projection: w2(silu(w1(x)) * w3(x)), not silu(w3(x)) * w1(x)."),
    Mistake("GELU gate (GeGLU)", variant(_SwiGLULayout, "SwiGLUGelu", gate=F.gelu),
            "The gate uses GELU (that is GeGLU); SwiGLU's gate is SiLU (Swish), F.silu(z) = z · σ(z)."),
    Mistake("sigmoid gate (GLU)", variant(_SwiGLULayout, "SwiGLUSigmoid", gate=torch.sigmoid),
            "The gate is a sigmoid (the original GLU); SwiGLU multiplies by silu(w1(x)) = w1(x) · σ(w1(x)): F.silu."),
    Mistake("no gate product", variant(_SwiGLULayout, "SwiGLUNoProduct", gated=False),
            "The product with w3(x) is missing: SwiGLU is w2(silu(w1(x)) * w3(x)), a gate times a second projection."),
    Mistake("SiLU on both projections", variant(_SwiGLULayout, "SwiGLUBoth", both=True),
            "Only the gate goes through SiLU: w2(silu(w1(x)) * w3(x)); w3(x) stays linear."),
    Mistake("SiLU after the product", variant(_SwiGLULayout, "SwiGLUOutside", outside=True),
            "SiLU is applied to the product; apply it to the gate alone, w2(silu(w1(x)) * w3(x))."),
)


def _swiglu_case(B: int, T: int, d: int, d_ff: int, dtype: torch.dtype, seed: int) -> Case:
    return module_case(f"SwiGLU({d}, {d_ff}) on x ({B}, {T}, {d}) {dtype_name(dtype)}", ref.SwiGLU, (d, d_ff), seed,
                       dtype, lambda device: {"x": randn((B, T, d), seed, dtype, device)})


def _swiglu_parameters(trial) -> None:
    expected = {"w1.weight": (10, 6), "w3.weight": (10, 6), "w2.weight": (6, 10)}
    parameter_shapes(trial, (6, 10), expected, "SwiGLU(d_model=6, d_ff=10)", values=True, label="SwiGLU(6, 10)")


def _swiglu_spec() -> ItemSpec:
    return ItemSpec(
        name="SwiGLU", reference=ref.SwiGLU, invoke=Invoke(module=True, forward=("x",)), mistakes=SWIGLU_MISTAKES,
        subchecks=(
            SubCheck("parameters w1, w3 (d_model → d_ff) and w2 (d_ff → d_model), no biases", 1, _swiglu_parameters),
            SubCheck("matches the reference on a random batch", 1, compare_cases(_swiglu_case(2, 5, 8, 16, f32, 1400))),
            SubCheck("other sizes and float64", 1,
                     compare_cases(_swiglu_case(3, 4, 12, 7, f64, 1410), _swiglu_case(1, 9, 6, 24, f32, 1420)),
                     hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# repeat_kv
# ---------------------------------------------------------------------------

def _kv_case(shape: tuple, n_rep: int, seed: int | None = None, dtype: torch.dtype = f32) -> Case:
    def make(device):
        if seed is None:  # the hand example: head h holds h + 1 everywhere
            x = torch.arange(1.0, shape[1] + 1).reshape(1, -1, 1, 1).expand(shape).clone()
        else:
            x = randn(shape, seed, dtype, device)
        return {"x": x.to(device), "n_rep": n_rep}

    what = "x " if seed is not None else "the hand example: x "
    fill = "" if seed is not None else " (head h holds h + 1)"
    return Case(f"{what}{shape} {dtype_name(dtype)}{fill}, n_rep = {n_rep}", make)


REPEAT_MISTAKES = (
    Mistake("key/value heads tiled", lambda x, n_rep: x.repeat(1, n_rep, 1, 1),
            "Your key/value heads are tiled, [k0, k1, k0, k1]: query head j must meet key/value head j // n_rep, so "
            "each head is repeated in place, [k0, k0, k1, k1] (x.repeat tiles; use "
            "x.repeat_interleave(n_rep, dim=1) or expand and reshape)."),
    Mistake("repeated along time", lambda x, n_rep: x.repeat_interleave(n_rep, dim=2),
            "You repeat along the time axis: repeat the heads, axis 1 of (B, H_kv, T, D)."),
    Mistake("repeated along the features", lambda x, n_rep: x.repeat_interleave(n_rep, dim=-1),
            "You repeat along the features: repeat the heads, axis 1 of (B, H_kv, T, D)."),
)


def _repeat_spec() -> ItemSpec:
    return ItemSpec(
        name="repeat_kv", reference=ref.repeat_kv, mistakes=REPEAT_MISTAKES,
        subchecks=(
            SubCheck("the hand example: 2 key/value heads, n_rep = 2, and random values of its shape", 1,
                     compare_cases(_kv_case((1, 2, 1, 2), 2), _kv_case((1, 2, 1, 2), 2, 1490))),
            SubCheck("x (2, 3, 4, 5), n_rep = 2", 1, compare_cases(_kv_case((2, 3, 4, 5), 2, 1500))),
            SubCheck("one key/value head (MQA), n_rep = 1 (the same values), float64", 1,
                     compare_cases(_kv_case((2, 1, 3, 4), 4, 1510), _kv_case((1, 4, 2, 3), 1, 1520),
                                   _kv_case((2, 2, 5, 6), 3, 1530, f64)), hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# GroupedQueryAttention
# ---------------------------------------------------------------------------

def _own_copy(fn, **names):
    """``fn`` as a function of its own, with ``names`` in place of its module's: the catalogue's
    wrong variants stand for a student's code, which runs where this notebook's references are
    unavailable (the sandbox), so they never call the reference objects themselves."""
    scope = {**fn.__globals__, **names}
    return types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, fn.__closure__)


_rope_copy = _own_copy(ref_positional.apply_rope, rope_angles=_own_copy(ref_positional.rope_angles))


class _GQALayout(nn.Module):
    """The contract's parameters; ``run`` computes grouped-query attention with its ways of going wrong."""

    def __init__(self, d_model, num_heads, num_kv_heads, rope_base=10000.0):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.rope_base = num_heads, num_kv_heads, rope_base
        self.head_dim = d_model // num_heads
        self.W_q = nn.Linear(d_model, d_model, bias=False)
        self.W_k = nn.Linear(d_model, num_kv_heads * self.head_dim, bias=False)
        self.W_v = nn.Linear(d_model, num_kv_heads * self.head_dim, bias=False)
        self.W_o = nn.Linear(d_model, d_model, bias=False)

    def run(self, x, positions=None, rotate="qk", before_split=False, tiled=False, causal=True, scale="head_dim",
            own_positions=False, base=None, halves=False):
        B, T, D = x.shape
        H, H_kv, hd = self.num_heads, self.num_kv_heads, self.head_dim
        base = base or self.rope_base
        if positions is None or own_positions:
            positions = torch.arange(T, device=x.device)
        q, k, v = self.W_q(x), self.W_k(x), self.W_v(x)

        def turn(t):
            return _rotate(t, positions, base, halves=True) if halves else _rope_copy(t, positions, base)

        if before_split:  # angles of head_dim = d_model, over the whole projection
            q, k = turn(q.unsqueeze(1)).squeeze(1), turn(k.unsqueeze(1)).squeeze(1)
        q = q.view(B, T, H, hd).transpose(1, 2)
        k = k.view(B, T, H_kv, hd).transpose(1, 2)
        v = v.view(B, T, H_kv, hd).transpose(1, 2)
        if not before_split:
            q = turn(q) if "q" in rotate else q
            k = turn(k) if "k" in rotate else k
            v = turn(v) if "v" in rotate else v
        n = H // H_kv
        k, v = (k.repeat(1, n, 1, 1), v.repeat(1, n, 1, 1)) if tiled else (k.repeat_interleave(n, 1),
                                                                            v.repeat_interleave(n, 1))
        s = q @ k.transpose(-2, -1)
        s = s / math.sqrt({"head_dim": hd, "d_model": D, "none": 1}[scale])
        if causal:
            s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool, device=x.device).tril(), float("-inf"))
        w = torch.softmax(s, dim=-1)
        return self.W_o((w @ v).transpose(1, 2).reshape(B, T, D)), w


GQA_MISTAKES = (
    Mistake("positions ignored (no RoPE)", variant(_GQALayout, "GQANoRope", rotate=""),
            "q and k are not rotated, so the attention ignores positions: after splitting the heads, "
            "q = apply_rope(q, positions, self.rope_base) and k = apply_rope(k, positions, self.rope_base)."),
    Mistake("rotate-half layout", variant(_GQALayout, "GQARotateHalf", halves=True),
            "q and k are rotated in the \"rotate half\" layout (feature i paired with i + head_dim/2, as in "
            "GPT-NeoX and Hugging Face's Llama); this course's apply_rope rotates adjacent pairs (x_2i, x_2i+1): "
            "use apply_rope(q, positions, self.rope_base) and the same for k."),
    Mistake("v rotated", variant(_GQALayout, "GQARotatesV", rotate="qkv"),
            "You rotate v too. RoPE puts positions into the scores q·k only: rotate q and k, and leave the values as "
            "they are."),
    Mistake("only q rotated", variant(_GQALayout, "GQAOnlyQ", rotate="q"),
            "Only q is rotated: rotate k by the same positions, so that q·k depends on the offset m − n."),
    Mistake("rotated before the heads are split", variant(_GQALayout, "GQARopeBeforeSplit", before_split=True),
            "You rotate the projections before splitting the heads, so the angles use d_model instead of head_dim: "
            "split into (B, H, T, head_dim) first, then apply_rope."),
    Mistake("key/value heads tiled", variant(_GQALayout, "GQATiled", tiled=True),
            "Your key/value heads are tiled, [k0, k1, k0, k1]: query head j must use key/value head j // n_rep "
            "(repeat_kv: each head repeated in place, [k0, k0, k1, k1])."),
    Mistake("not causal", variant(_GQALayout, "GQANotCausal", causal=False),
            "Every position sees the future: mask the scores of later keys (a causal mask, True on and below the "
            "diagonal) before the softmax."),
    Mistake("scaled by √d_model", variant(_GQALayout, "GQAScaleModel", scale="d_model"),
            "The scores are divided by √d_model: divide them by √head_dim, the size of one head's queries and keys."),
    Mistake("not scaled", variant(_GQALayout, "GQAUnscaled", scale="none"),
            "The scores are not scaled: divide q·k by √head_dim before the softmax."),
    Mistake("positions argument ignored", variant(_GQALayout, "GQAOwnPositions", own_positions=True),
            "The positions passed to forward are ignored: rotate by `positions` (0 … T−1 only when it is None)."),
)


def _gqa_case(seed: int, B: int, T: int, d: int, H: int, H_kv: int, dtype: torch.dtype = f32, positions=None,
              words: str = "", base: float = 10000.0) -> Case:
    def inputs(device):
        pos = positions(device).to(device) if positions is not None else None
        return {"x": randn((B, T, d), seed, dtype, device), "positions": pos}

    args = (d, H, H_kv) if base == 10000.0 else (d, H, H_kv, base)
    rope = "" if base == 10000.0 else f", rope_base={base:g}"
    return module_case(f"GroupedQueryAttention(d_model={d}, num_heads={H}, num_kv_heads={H_kv}{rope}) on x "
                       f"({B}, {T}, {d}) {dtype_name(dtype)}, {words or 'positions None'}", ref.GroupedQueryAttention,
                       args, seed, dtype, inputs)


def _gqa_parameters(trial) -> None:
    expected = {"W_q.weight": (16, 16), "W_k.weight": (8, 16), "W_v.weight": (8, 16), "W_o.weight": (16, 16)}
    parameter_shapes(trial, (16, 4, 2), expected, "GroupedQueryAttention(d_model=16, num_heads=4, num_kv_heads=2)",
                     advice=lambda got: (" W_k and W_v map to num_kv_heads · head_dim = 8 features: one key and one "
                                         "value head for each group of query heads."
                                         if got.get("W_k.weight") == (16, 16) else ""),
                     values=True, label="GroupedQueryAttention(16, 4, 2)")


def _gqa_refuses(trial) -> None:
    for args, why in (((10, 4, 2), "d_model = 10 is not a multiple of num_heads = 4"),
                      ((16, 4, 3), "num_heads = 4 is not a multiple of num_kv_heads = 3"),
                      ((12, 4, 2), "head_dim = 3 is odd, and RoPE rotates pairs")):
        _refuses(trial, args, f"GroupedQueryAttention{args}", why)


def _gqa_spec() -> ItemSpec:
    def from_start(start, T):
        return lambda device: torch.arange(start, start + T)

    def per_example(seed, B, T, high):
        return lambda device: torch.randint(0, high, (B, T), generator=generator(seed))

    causal = _gqa_case(1650, 2, 6, 16, 4, 2, f64)
    return ItemSpec(
        name="GroupedQueryAttention", reference=ref.GroupedQueryAttention,
        invoke=Invoke(module=True, forward=("x", "positions"), names=earlier(ref.apply_rope, ref.repeat_kv)),
        mistakes=GQA_MISTAKES, output_names=("out", "weights"),
        subchecks=(
            SubCheck("parameters W_q, W_k, W_v (num_kv_heads · head_dim outputs), W_o, no biases", 1, _gqa_parameters),
            SubCheck("matches the reference (same weights): 4 query heads sharing 2 key/value heads", 1,
                     compare_cases(_gqa_case(1600, 2, 5, 16, 4, 2))),
            SubCheck("a ValueError for d_model not a multiple of num_heads, num_heads not a multiple of num_kv_heads, "
                     "an odd head_dim", 1, _gqa_refuses, hidden=True),
            SubCheck("multi-head (num_kv_heads = num_heads) and multi-query (num_kv_heads = 1) attention, float64, "
                     "T = 1", 1,
                     compare_cases(_gqa_case(1610, 2, 4, 16, 4, 4, f64), _gqa_case(1620, 3, 5, 24, 6, 1),
                                   _gqa_case(1630, 2, 1, 16, 4, 2, f64)), hidden=True),
            SubCheck("positions given: (T,) from 5, (B, T) per example; another rope_base", 1,
                     compare_cases(_gqa_case(1640, 2, 5, 16, 4, 2, f64, from_start(5, 5), "positions 5 … 9"),
                                   _gqa_case(1645, 2, 4, 16, 4, 2, f32, per_example(1646, 2, 4, 40),
                                             "positions (2, 4), one row per example"),
                                   _gqa_case(1648, 1, 6, 16, 2, 1, f64, from_start(3, 6), "positions 3 … 8", 50.0)),
                     hidden=True),
            SubCheck("causal: changing the last two positions leaves the earlier outputs unchanged", 1,
                     _no_future_leak(causal, 0, "each position may only attend to itself and earlier ones (a causal "
                                                "mask)."), hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# kv_cache_bytes
# ---------------------------------------------------------------------------

def _cache_case(num_layers, num_kv_heads, head_dim, seq_len, **extra) -> Case:
    kw = {"num_layers": num_layers, "num_kv_heads": num_kv_heads, "head_dim": head_dim, "seq_len": seq_len, **extra}
    return Case(", ".join(f"{k}={v}" for k, v in kw.items()), lambda device: dict(kw))


def _fresh_cache_case(value: int) -> Case:
    """Sizes drawn for this grading (a hand example's answer could be typed in)."""
    def make(device):
        return {"num_layers": fresh(value, 1, 48), "num_kv_heads": fresh(value + 1, 1, 16),
                "head_dim": 2 * fresh(value + 2, 8, 80), "seq_len": fresh(value + 3, 1, 9000)}

    return Case("sizes drawn for this grading (layers, key/value heads, head_dim, positions)", make)


def _cache_count(num_layers, num_kv_heads, head_dim, seq_len, batch_size=1, bytes_per_value=2, *, kv=2, bits=False,
                 batch=True, width=None, layers=True, unit=1, as_float=False):
    n = kv * (num_layers if layers else 1) * num_kv_heads * head_dim * seq_len * (batch_size if batch else 1)
    n *= (width or bytes_per_value) * (8 if bits else 1)
    return n / unit if unit != 1 or as_float else n


CACHE_MISTAKES = (
    Mistake("keys only (the factor 2 forgotten)", partial(_cache_count, kv=1),
            "You count one tensor per layer: the cache holds keys and values, 2 · num_layers · num_kv_heads · "
            "head_dim · seq_len · batch_size · bytes_per_value."),
    Mistake("bits instead of bytes", partial(_cache_count, bits=True),
            "You count bits: bytes_per_value is already in bytes (2 for 16-bit numbers), so do not multiply by 8."),
    Mistake("batch_size ignored", partial(_cache_count, batch=False),
            "batch_size is ignored: every sequence of the batch has its own keys and values."),
    Mistake("bytes_per_value ignored", partial(_cache_count, width=2),
            "bytes_per_value is ignored (2 is only its default): multiply by it."),
    Mistake("layers ignored", partial(_cache_count, layers=False),
            "num_layers is ignored: every layer keeps its own keys and values."),
    Mistake("in KiB", partial(_cache_count, unit=1024),
            "You return KiB: return the number of bytes (the notebook divides by 2**10 or 2**20 to print them)."),
    Mistake("a float", partial(_cache_count, as_float=True),
            "Return a Python int (a byte count is whole): multiply ints, and avoid / (use // if you must divide)."),
)


def _cache_spec() -> ItemSpec:
    return ItemSpec(
        name="kv_cache_bytes", reference=ref.kv_cache_bytes, mistakes=CACHE_MISTAKES,
        subchecks=(
            SubCheck("the hand example (1 layer, 1 key/value head, head_dim 2, 3 positions) and sizes drawn for this "
                     "grading", 1,
                     compare_cases(_cache_case(1, 1, 2, 3), _fresh_cache_case(1600))),
            SubCheck("Llama 2 70B (80 layers, 8 key/value heads, head_dim 128) at 4096 tokens, and sizes drawn for "
                     "this grading",
                     1, compare_cases(_cache_case(80, 8, 128, 4096), _fresh_cache_case(1610))),
            SubCheck("8-bit numbers, a batch of 8 in 32-bit numbers, no positions yet, one key/value head", 1,
                     compare_cases(_cache_case(2, 4, 16, 64, batch_size=3, bytes_per_value=1),
                                   _cache_case(32, 8, 128, 1000, batch_size=8, bytes_per_value=4),
                                   _cache_case(4, 2, 8, 0), _cache_case(32, 1, 64, 2048, batch_size=2)), hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# ModernBlock
# ---------------------------------------------------------------------------

class _RMS(nn.Module):
    """An RMSNorm for the block's variants (the contract's parameter name)."""

    def __init__(self, d, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x, eps=None):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + (self.eps if eps is None else eps)) * self.weight


class _FFN(nn.Module):
    def __init__(self, d, d_ff):
        super().__init__()
        self.w1, self.w3 = nn.Linear(d, d_ff, bias=False), nn.Linear(d, d_ff, bias=False)
        self.w2 = nn.Linear(d_ff, d, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class _BlockLayout(nn.Module):
    def __init__(self, d_model, num_heads, num_kv_heads, d_ff, eps=1e-6, rope_base=10000.0):
        super().__init__()
        self.attn_norm = _RMS(d_model, eps)
        self.attn = _GQALayout(d_model, num_heads, num_kv_heads, rope_base)
        self.ffn_norm = _RMS(d_model, eps)
        self.ffn = _FFN(d_model, d_ff)

    def run(self, x, positions=None, post=False, residual=(True, True), from_normed=False, ffn_norm="ffn_norm",
            pass_positions=True, eps=None, base=None, norm_output=False):
        def attn(h):
            return self.attn.run(h, positions if pass_positions else None, base=base)[0]

        norms = (lambda h: self.attn_norm(h, eps), lambda h: getattr(self, ffn_norm)(h, eps))
        for (f, norm), res in zip(((attn, norms[0]), (self.ffn, norms[1])), residual):
            if post:
                x = norm((x if res else 0) + f(x))
            elif norm_output:  # OLMo 2: x + norm(f(x))
                x = (x if res else 0) + norm(f(x))
            else:
                h = norm(x)
                x = ((h if from_normed else x) if res else 0) + f(h)
        return x


BLOCK_MISTAKES = (
    Mistake("post-norm", variant(_BlockLayout, "ModernPostNorm", post=True),
            "This is post-norm (the norm after the residual sum, as in the original Transformer). Llama is pre-norm: "
            "x = x + attn(attn_norm(x), positions)[0], then x = x + ffn(ffn_norm(x))."),
    Mistake("norm after the sub-layer", variant(_BlockLayout, "ModernNormAfter", norm_output=True),
            "The norms are applied to each sub-layer's output, x = x + attn_norm(attn(x)) (OLMo 2's order). Llama "
            "normalises the sub-layer's input: x = x + attn(attn_norm(x), positions)[0], then "
            "x = x + ffn(ffn_norm(x))."),
    Mistake("no residual around the attention", variant(_BlockLayout, "ModernNoAttnResidual", residual=(False, True)),
            "The residual connection around the attention is missing: x = x + attn(attn_norm(x), positions)[0]."),
    Mistake("no residual around the FFN", variant(_BlockLayout, "ModernNoFFNResidual", residual=(True, False)),
            "The residual connection around the feed-forward network is missing: x = x + ffn(ffn_norm(x))."),
    Mistake("residual from the normalised input", variant(_BlockLayout, "ModernResidualNormed", from_normed=True),
            "The residual adds the normalised input: x = x + attn(attn_norm(x), ...)[0] adds x itself, not "
            "attn_norm(x)."),
    Mistake("attn_norm before the FFN too", variant(_BlockLayout, "ModernSameNorm", ffn_norm="attn_norm"),
            "The FFN reads attn_norm(x): each sub-layer has its own norm, ffn(ffn_norm(x))."),
    Mistake("positions not passed on", variant(_BlockLayout, "ModernNoPositions", pass_positions=False),
            "The block does not pass `positions` to its attention: self.attn(self.attn_norm(x), positions)."),
    Mistake("eps not passed to the norms", variant(_BlockLayout, "ModernDefaultEps", eps=1e-6),
            "The norms ignore the block's eps: build both with it, RMSNorm(d_model, eps)."),
    Mistake("rope_base not passed to the attention", variant(_BlockLayout, "ModernDefaultBase", base=10000.0),
            "The attention ignores the block's rope_base: GroupedQueryAttention(d_model, num_heads, num_kv_heads, "
            "rope_base)."),
)

_BLOCK_PARTS = {"attn_norm": "RMSNorm", "attn": "GroupedQueryAttention", "ffn_norm": "RMSNorm", "ffn": "SwiGLU"}


def _block_case(seed: int, B: int, T: int, d: int, H: int, H_kv: int, d_ff: int, dtype: torch.dtype = f32,
                positions=None, words: str = "", eps: float | None = None, base: float | None = None) -> Case:
    def inputs(device):
        pos = positions(device).to(device) if positions is not None else None
        return {"x": randn((B, T, d), seed, dtype, device), "positions": pos}

    args = (d, H, H_kv, d_ff) + (() if eps is None and base is None else (eps or 1e-6, base or 10000.0))
    more = "".join(f", {k}={v:g}" for k, v in (("eps", eps), ("rope_base", base)) if v is not None)
    return _layer_case(f"ModernBlock(d_model={d}, num_heads={H}, num_kv_heads={H_kv}, d_ff={d_ff}{more}) on x "
                       f"({B}, {T}, {d}) {dtype_name(dtype)}, {words or 'positions None'}", ref.ModernBlock, args,
                       seed, dtype, inputs)


def _block_parameters(trial) -> None:
    built = layout(trial, (16, 4, 2, 24), tuple(_BLOCK_PARTS) + ("attn_norm.eps", "ffn_norm.eps"),
                   label="ModernBlock(16, 4, 2, 24)")
    found = built.get("attrs") or {}
    missing = [n for n in _BLOCK_PARTS if not isinstance(found.get(n), dict)]
    if missing:
        wanted = ", ".join(f"`{n}` ({what})" for n, what in _BLOCK_PARTS.items())
        raise CheckFailed(f"ModernBlock(16, 4, 2, 24) needs the submodules {wanted}; missing: {', '.join(missing)}. "
                          "The grader copies weights into them by name.")
    expected = {k: tuple(v.shape) for k, v in ref.ModernBlock(16, 4, 2, 24).state_dict().items()}
    got = built.get("state", {})
    if got != expected:
        wrong = [f"{k} {got.get(k, 'missing')}" for k in expected if got.get(k) != expected[k]]
        extra = [f"{k} (not expected)" for k in got if k not in expected]
        raise CheckFailed("ModernBlock(d_model=16, num_heads=4, num_kv_heads=2, d_ff=24) should have exactly the "
                          "parameters " + ", ".join(f"{k} {v}" for k, v in expected.items())
                          + f". Different: {', '.join(wrong + extra)}.")
    other = layout(trial, (16, 4, 2, 24, 1e-3), ("attn_norm.eps", "ffn_norm.eps"),
                   label="ModernBlock(16, 4, 2, 24, eps=1e-3)").get("attrs") or {}
    for name in ("attn_norm.eps", "ffn_norm.eps"):
        if name in other and other[name] != 1e-3:
            raise CheckFailed(f"ModernBlock(16, 4, 2, 24, eps=1e-3) has {name} = {fmt_num(other[name])}: build "
                              "both norms with the block's eps, RMSNorm(d_model, eps).")


def _block_spec() -> ItemSpec:
    def per_example(seed, B, T, high):
        return lambda device: torch.randint(0, high, (B, T), generator=generator(seed))

    grads = _block_case(1760, 2, 5, 16, 4, 2, 24, f64)
    return ItemSpec(
        name="ModernBlock", reference=ref.ModernBlock,
        invoke=Invoke(module=True, forward=("x", "positions"),
                      names=earlier(ref.GroupedQueryAttention, ref.RMSNorm, ref.SwiGLU)),
        mistakes=BLOCK_MISTAKES,
        subchecks=(
            SubCheck("submodules attn_norm, attn, ffn_norm, ffn with the right parameters; eps passed to both norms",
                     1, _block_parameters),
            SubCheck("matches the reference (same weights) on a random batch", 1,
                     compare_cases(_block_case(1700, 2, 5, 16, 4, 2, 24))),
            SubCheck("multi-query attention, float64, positions (B, T), eps and rope_base passed on", 1,
                     compare_cases(_block_case(1710, 3, 6, 16, 4, 1, 40, f64),
                                   _block_case(1720, 2, 4, 16, 2, 2, 24, f32, per_example(1721, 2, 4, 30),
                                               "positions (2, 4), one row per example"),
                                   _block_case(1730, 2, 5, 16, 4, 2, 24, f64, eps=0.5, base=100.0)), hidden=True),
            SubCheck("causal: changing the last two positions leaves the earlier outputs unchanged", 1,
                     _no_future_leak(_block_case(1750, 2, 6, 16, 4, 2, 24, f64), None,
                                     "the attention must be causal."), hidden=True),
            SubCheck("gradients reach x and every parameter", 1, lambda t: module_gradients(t, grads), hidden=True),
        ),
    )


SPECS = {
    spec.name: spec
    for spec in (_rms_spec(), _angles_spec(), _rope_spec(), _swiglu_spec(), _repeat_spec(), _gqa_spec(),
                 _cache_spec(), _block_spec())
}
