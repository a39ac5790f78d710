"""Check specs for notebook 09 (efficient attention): sliding_window_mask,
dilated_window_mask, add_global_tokens, sliding_window_attention,
online_softmax_attention, KVCache, cached_generate, performer_features and
linear_attention, with their mistake catalogues.

Two built-in probes serve this notebook: ``memory`` (the largest tensor made during a
call, reported to the student as advice for tiled attention) and ``methods`` (a
``KVCache`` driven through ``append`` and ``len``). Windowed attention's memory is
graded by the machine: at T = 262,144 a ``(T, T)`` tensor cannot be allocated.
"""

from __future__ import annotations

import math
from functools import partial

import torch
import torch.nn.functional as F

from ... import attention as ref_attention
from ... import efficient_attention as ref
from ..answer.calls import Invoke, Probe
from ..judge.compare import describe_difference
from ..judge.properties import (call_and_inspect, compare_cases, dtype_name, fresh, generator, gradients_reach, randn,
                          reference_state)
from ..judge.properties import seed as salted_seed
from ..answer.fixtures.efficient import CountingGPT, EluFeatures, GraderCache, PositiveFeatures, StrictCacheGPT  # noqa: F401
from ..judge.spec import Case, CheckFailed, ItemSpec, Mistake, SubCheck
from ..answer.wire import Build, GeneratorState

f32, f64 = torch.float32, torch.float64
_HERE = "course_lib.grading.answer.fixtures.efficient"

# What a check measures inside the student's process (the largest tensor made, the positions a
# model ran on) is reported to the student as advice but earns no points: that process can
# disturb any measurement of itself, and points are decided outside it. The windowed
# attention's memory is graded by the machine instead (_no_room_for_a_square).
ADVICE = "advice, no points (measured in your own process): "


# ---------------------------------------------------------------------------
# sliding_window_mask
# ---------------------------------------------------------------------------


def _window_case(T: int, window: int, causal: bool | None = True) -> Case:
    def make(device):
        out = {"T": T, "window": window, "device": device}
        if causal is not None:
            out["causal"] = causal
        return out

    words = "causal (default)" if causal is None else f"causal={causal}"
    return Case(f"T = {T}, window = {window}, {words}", make)


def _distance(T, device):
    idx = torch.arange(T, device=device)
    return idx[:, None] - idx[None, :]


def _window(T, window, causal, device):
    """The correct window, written here (mistake variants never call a reference)."""
    d = _distance(T, device)
    return ((d >= 0) & (d < window)) if causal else (d.abs() < window)


def _wrong_window(causal_rule=lambda d, w: (d >= 0) & (d < w), full_rule=lambda d, w: d.abs() < w,
                  then=lambda mask: mask):
    """A wrong window: ``causal_rule(d, window)`` / ``full_rule`` on the distances d = i - j, then ``then``."""

    def sliding_window_mask(T, window, causal=True, device=None):
        d = _distance(T, device)
        return then(causal_rule(d, window) if causal else full_rule(d, window))

    return sliding_window_mask


window_off_by_one = _wrong_window(lambda d, w: (d >= 0) & (d <= w), lambda d, w: d.abs() <= w)
window_never_causal = _wrong_window(lambda d, w: d.abs() < w)

WINDOW_MISTAKES = (
    Mistake("off-by-one window", window_off_by_one,
            "Each query sees one key too many: a window of w covers the keys i-w+1 .. i (distance 0 .. w-1), "
            "so compare the distance with < window, not <= window."),
    Mistake("window not causal", window_never_causal,
            "Your causal window also looks into the future (|i - j| < window): with causal=True keep only the keys "
            "with 0 <= i - j < window."),
    Mistake("window over the future", _wrong_window(lambda d, w: (d <= 0) & (d > -w)),
            "Your window covers the next keys instead of the previous ones: query i sees i-w+1 .. i, "
            "so the distance i - j (query minus key) is between 0 and window - 1."),
    Mistake("diagonal excluded", _wrong_window(lambda d, w: (d > 0) & (d <= w), lambda d, w: (d.abs() <= w) & (d != 0)),
            "A query must see itself (distance 0): the window covers distances 0 .. window-1."),
    Mistake("inverted", _wrong_window(then=lambda mask: ~mask), "Your mask is inverted: True means 'may attend'."),
    Mistake("float mask", _wrong_window(then=lambda mask: mask.float()),
            "Return a boolean mask (dtype=torch.bool): True means 'may attend'."),
    Mistake("non-causal window halved", _wrong_window(full_rule=lambda d, w: d.abs() < (w + 1) // 2),
            "Without causality the window reaches window-1 keys on each side (|i - j| < window), not half of it."),
)


def _window_device(trial) -> None:
    device = trial.device
    got = trial.student({"T": 3, "window": 2, "device": device}, f"T = 3, window = 2, device = {device}")
    if not isinstance(got, torch.Tensor) or got.device.type != device.type:
        raise CheckFailed(f"sliding_window_mask(3, 2, device={device!s}) returned a mask elsewhere: "
                          "pass device= to the tensors you create.")


def _fresh_window_case(window: int, causal: bool, value: int = 901) -> Case:
    """A size this grading picks (5 to 11, from its salted seed ``value``, drawn when the case
    is made, not when the spec is built): a different T for every submission."""
    def make(device):
        return {"T": 5 + salted_seed(value) % 7, "window": window, "causal": causal, "device": device}

    return Case(f"a fresh T (5 to 11, this grading's own), window = {window}, causal={causal}", make)


def _window_edges_and_device(trial) -> None:
    """Window 1, a window longer than T and T = 1, causal or not, match the reference; the device argument works."""
    trial.compare([_window_case(5, 1, True), _window_case(4, 9, True), _window_case(1, 3, False),
                   _window_case(9, 4, False), _window_case(12, 5, True)])
    _window_device(trial)


def _window_spec() -> ItemSpec:
    return ItemSpec(
        name="sliding_window_mask", reference=ref_attention.sliding_window_mask, mistakes=WINDOW_MISTAKES,
        subchecks=(
            SubCheck("causal window: T = 6, window = 3 (default causal) and a fresh size", 1,
                     compare_cases(_window_case(6, 3, None), _fresh_window_case(2, True))),
            SubCheck("non-causal window: T = 6, window = 2, and a fresh size", 1,
                     compare_cases(_window_case(6, 2, False), _fresh_window_case(3, False, 902))),
            SubCheck("window 1, a window longer than T, T = 1, both kinds; the device argument", 1,
                     _window_edges_and_device, hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# dilated_window_mask
# ---------------------------------------------------------------------------


def _dilated_case(T, window, dilation, causal=True) -> Case:
    return Case(f"T = {T}, window = {window}, dilation = {dilation}, causal={causal}",
                lambda device: {"T": T, "window": window, "dilation": dilation, "causal": causal, "device": device})


def _dilated(span=lambda w, k: w * k, gap=lambda w, k: k, inclusive=False, always_abs=False):
    """A wrong dilated window: distances below ``span(window, dilation)`` (up to it when ``inclusive``),
    multiples of ``gap(window, dilation)``, not causal (``always_abs``)."""

    def dilated_window_mask(T, window, dilation, causal=True, device=None):
        d = _distance(T, device)
        d = d.abs() if always_abs or not causal else d
        limit = span(window, dilation)
        return (d >= 0) & (d % gap(window, dilation) == 0) & ((d <= limit) if inclusive else (d < limit))

    return dilated_window_mask


DILATED_MISTAKES = (
    Mistake("window is a span", _dilated(span=lambda w, k: w),
            "`window` is the number of keys each query sees (distances 0, dilation, …, (window-1)·dilation), "
            "not the span of distances: allow distance < window · dilation."),
    Mistake("off by one", _dilated(inclusive=True),
            "One key too many: the last key is at distance (window-1)·dilation, so compare with < window · dilation."),
    Mistake("dilation ignored",
            lambda T, window, dilation, causal=True, device=None: _window(T, window, causal, device),
            "The dilation has no effect: keep only the distances that are multiples of `dilation` (distance % dilation == 0)."),
    Mistake("not causal", _dilated(always_abs=True),
            "With causal=True a query sees only earlier keys: the distance i - j must be ≥ 0."),
    Mistake("window and dilation swapped", _dilated(gap=lambda w, k: w),
            "The gaps between keys are `dilation`, and there are `window` keys: test distance % dilation, not % window."),
)


def _dilated_spec() -> ItemSpec:
    return ItemSpec(
        name="dilated_window_mask", reference=ref.dilated_window_mask, mistakes=DILATED_MISTAKES,
        subchecks=(
            SubCheck("causal: T = 10, window = 3, dilation = 2, and a fresh size", 1,
                     lambda t: t.compare([_dilated_case(10, 3, 2), _dilated_case(fresh(903, 11, 18), 3, 2)])),
            SubCheck("non-causal, dilation 1 (the sliding window), dilation 3, window 1", 1,
                     compare_cases(_dilated_case(9, 2, 3, False), _dilated_case(7, 3, 1), _dilated_case(7, 3, 1, False),
                                   _dilated_case(12, 4, 3), _dilated_case(5, 1, 2, False)), hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# add_global_tokens
# ---------------------------------------------------------------------------


def _global_case(T, window, positions, batch=None, tensor=False) -> Case:
    def make(device):
        mask = _window(T, window, True, device)
        if batch:
            mask = mask.expand(batch, T, T).clone()
        pos = torch.tensor(positions, device=device) if tensor else list(positions)
        return {"mask": mask, "global_positions": pos}

    shape = f"({batch}, {T}, {T})" if batch else f"({T}, {T})"
    kind = "a LongTensor" if tensor else "a list"
    return Case(f"a causal window mask {shape} (window {window}), global_positions = {list(positions)} as {kind}",
                make)


def _global(rows=True, cols=True, keep_window=True, causal_cols=False):
    """Wrong global tokens: only their rows or only their columns set, the window lost, the
    columns kept causal (only the queries after a global token see it)."""

    def add_global_tokens(mask, global_positions):
        out = mask.clone() if keep_window else torch.zeros_like(mask)
        g = torch.as_tensor(global_positions, dtype=torch.long)
        if rows:
            out[..., g, :] = True
        if causal_cols:
            out[..., :, g] |= (torch.arange(mask.size(-1))[:, None] >= g[None, :]).to(mask.device)
        elif cols:
            out[..., :, g] = True
        return out

    return add_global_tokens


GLOBAL_MISTAKES = (
    Mistake("rows only", _global(cols=False),
            "The global tokens see every key, but the other queries do not see them: set their columns to True too "
            "(mask[..., :, g] = True)."),
    Mistake("columns only", _global(rows=False),
            "Every query sees the global tokens, but they do not see every key: set their rows to True too "
            "(mask[..., g, :] = True)."),
    Mistake("the window is lost", _global(keep_window=False),
            "Your mask keeps only the global pattern: start from a copy of `mask` (mask.clone()) and add the rows "
            "and columns of the global positions."),
    Mistake("global columns kept causal", _global(causal_cols=True),
            "Every query attends to a global token, including the queries before it: set its whole column to True."),
)


def _global_leaves_input(trial) -> None:
    case = _global_case(6, 2, [0])
    _, after = call_and_inspect(trial, case.make(trial.device), ["mask"], case.label)
    before, after = case.make(trial.device)["mask"], after.get("mask")
    if not isinstance(after, torch.Tensor) or not torch.equal(after.cpu(), before.cpu()):
        raise CheckFailed(f"On {case.label}: the `mask` you were given was modified: work on a copy (mask.clone()), "
                          "so that the caller's window mask stays as it was.")


def _global_spec() -> ItemSpec:
    return ItemSpec(
        name="add_global_tokens", reference=ref.add_global_tokens, mistakes=GLOBAL_MISTAKES,
        subchecks=(
            SubCheck("one global token (position 0) on a causal window mask (8, 8), and on a fresh one", 1,
                     lambda t: t.compare([_global_case(8, 2, [0]), _global_case(fresh(904, 9, 14), 2, [fresh(905, 0, 4)])])),
            SubCheck("several global positions, a batch of masks, positions as a LongTensor", 1,
                     compare_cases(_global_case(9, 3, [0, 4]), _global_case(7, 2, [6], batch=2),
                                   _global_case(10, 1, [2, 3, 9], tensor=True)), hidden=True),
            SubCheck("the input mask is left unchanged", 1, _global_leaves_input, hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# sliding_window_attention
# ---------------------------------------------------------------------------


def _swa_case(seed, batch, T, d, window, causal, dtype, d_v=None) -> Case:
    def make(device):
        return {"q": randn((*batch, T, d), seed, dtype, device), "k": randn((*batch, T, d), seed + 1, dtype, device),
                "v": randn((*batch, T, d_v or d), seed + 2, dtype, device), "window": window, "causal": causal}

    shape = (*batch, T, d)
    return Case(f"q, k {shape}, v {(*batch, T, d_v or d)} {dtype_name(dtype)}, window = {window}, causal={causal}",
                make)


def _swa(window_mask=_window, scale=True):
    """Wrong windowed attention: full attention masked by ``window_mask(T, window, causal, device)``,
    the scores unscaled unless ``scale``."""

    def sliding_window_attention(q, k, v, window, causal=True):
        s = q @ k.transpose(-2, -1)
        s = s / math.sqrt(q.size(-1)) if scale else s
        mask = window_mask(q.size(-2), window, causal, q.device)
        return torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1) @ v

    return sliding_window_attention


def swa_padding_attended(q, k, v, window, causal=True):
    """Zero-padded keys outside the sequence are not masked: they get weight exp(0)."""
    left, right = window - 1, (0 if causal else window - 1)
    kp = F.pad(k, (0, 0, left, right)).unfold(-2, left + right + 1, 1).transpose(-2, -1)
    vp = F.pad(v, (0, 0, left, right)).unfold(-2, left + right + 1, 1).transpose(-2, -1)
    s = (q.unsqueeze(-2) @ kp.transpose(-2, -1)).squeeze(-2) / math.sqrt(q.size(-1))
    return (torch.softmax(s, dim=-1).unsqueeze(-2) @ vp).squeeze(-2)


SWA_MISTAKES = (
    Mistake("off-by-one window", _swa(window_off_by_one),
            "Each query attends to one key too many: the causal window is the keys i-window+1 .. i (window keys "
            "including itself), the non-causal one |i - j| < window."),
    Mistake("window not causal", _swa(window_never_causal),
            "With causal=True the queries also attend to the next keys: keep only keys i-window+1 .. i."),
    Mistake("no scaling", _swa(scale=False), "The scores are not scaled: divide q·k by √d_k."),
    Mistake("padding attended", swa_padding_attended,
            "The first queries (and, without causality, the last ones) attend to the zero padding outside the "
            "sequence: mask the window positions that fall before 0 or after T-1 with -inf before the softmax."),
    Mistake("window ignored", _swa(_wrong_window(lambda d, w: d >= 0, lambda d, w: torch.ones_like(d, dtype=torch.bool))),
            "Your output is full attention: restrict each query to its window of keys."),
)


def _no_square(case: Case):
    def run(trial) -> None:
        inputs = case.make(trial.device)
        T = inputs["q"].size(-2)
        got = trial.student(inputs, case.label, probe=Probe("memory"))
        largest = got.get("largest") if isinstance(got, dict) else None
        if not isinstance(largest, list):
            raise CheckFailed(f"On {case.label}: the call could not be measured.")
        if math.prod(largest) >= T * T // 2:
            raise CheckFailed(
                f"On {case.label}: your code made a tensor of shape {tuple(largest)}, as big as a (T, T) = ({T}, {T}) "
                "matrix. Compute the scores of one block of block_size keys at a time, so that no more than "
                "(T_q, block_size) scores exist at once: memory then grows like T · block_size.")
        problem = describe_difference(trial.reference(case.make(trial.device)), got.get("output"))
        if problem:
            raise CheckFailed(f"On {case.label}: {problem}")

    return run


def _no_room_for_a_square(case: Case):
    """A sub-check decided by the machine, not by a measurement in the student's process
    (which the student's code could disturb): at this T a ``(T, T)`` float32 tensor
    needs hundreds of GiB, far above any sandbox's memory, while windowed attention
    needs a few MiB. The call either returns the right output or it fails."""

    def run(trial) -> None:
        inputs = case.make(trial.device)
        T = inputs["q"].size(-2)
        square = f"a (T, T) tensor of float32 at T = {T:,} would need {T * T * 4 / 2**30:,.0f} GiB"
        try:
            got = trial.student(inputs, case.label)
        except CheckFailed as failed:
            raise CheckFailed(f"{failed} ({square}: compute the scores of each query against its own window "
                              "only, e.g. unfold the padded keys into (…, T, window, d), so that memory grows "
                              "like T · window.)", cause=failed.cause) from None
        problem = describe_difference(trial.reference(case.make(trial.device)), got)
        if problem:
            raise CheckFailed(f"On {case.label}: {problem}")

    return run


def _swa_spec() -> ItemSpec:
    huge = _swa_case(90, (1,), 2**18, 4, 4, True, f32)
    return ItemSpec(
        name="sliding_window_attention", reference=ref.sliding_window_attention, mistakes=SWA_MISTAKES,
        subchecks=(
            SubCheck("equals masked full attention: causal, q, k, v (2, 12, 4), window 3", 1,
                     compare_cases(_swa_case(10, (2,), 12, 4, 3, True, f32))),
            SubCheck("equals masked full attention without causality", 1,
                     compare_cases(_swa_case(20, (2,), 10, 4, 3, False, f32))),
            SubCheck("other shapes: heads, float64, window 1, a window longer than T, d_v ≠ d_k", 1,
                     compare_cases(_swa_case(30, (2, 3), 9, 5, 2, True, f64, d_v=3),
                                   _swa_case(40, (1,), 6, 4, 1, False, f32), _swa_case(50, (2,), 5, 4, 8, True, f64),
                                   _swa_case(60, (1, 2), 16, 8, 5, False, f64)), hidden=True),
            SubCheck("no (T, T) tensor: T = 262,144, window 4 (a (T, T) one would need 256 GiB)", 1,
                     _no_room_for_a_square(huge), hidden=True),
            SubCheck("gradients reach q, k and v", 1,
                     lambda t: gradients_reach(t, _swa_case(70, (2,), 8, 4, 3, True, f64), ("q", "k", "v"), None),
                     hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# online_softmax_attention
# ---------------------------------------------------------------------------


def _os_case(seed, batch, T_q, T_k, d, block, causal, dtype, scale=1.0, d_v=None) -> Case:
    def make(device):
        return {"q": scale * randn((*batch, T_q, d), seed, dtype, device),
                "k": randn((*batch, T_k, d), seed + 1, dtype, device),
                "v": randn((*batch, T_k, d_v or d), seed + 2, dtype, device), "block_size": block, "causal": causal}

    sharp = f", sharp scores (q × {scale:g})" if scale != 1.0 else ""
    return Case(f"q {(*batch, T_q, d)}, k {(*batch, T_k, d)}, v {(*batch, T_k, d_v or d)} {dtype_name(dtype)}, "
                f"block_size = {block}, causal={causal}{sharp}", make)


def _tiles(q, k, v, block_size, causal=False, *, rescale_acc=True, rescale_sum=True, use_max=True, scale=True,
           drop_last=False, local_cols=False):
    """The online softmax with one part left out (for the catalogue)."""
    T_q, T_k = q.size(-2), k.size(-2)
    m = torch.full((*q.shape[:-1], 1), float("-inf"), dtype=q.dtype, device=q.device)
    l = torch.zeros_like(m)
    acc = torch.zeros((*q.shape[:-1], v.size(-1)), dtype=v.dtype, device=v.device)
    rows = torch.arange(T_q, device=q.device)[:, None]
    stop = T_k - block_size if drop_last and T_k > block_size else T_k
    for start in range(0, stop, block_size):
        kb, vb = k[..., start:start + block_size, :], v[..., start:start + block_size, :]
        s = q @ kb.transpose(-2, -1)
        if scale:
            s = s / math.sqrt(q.size(-1))
        if causal:
            cols = torch.arange(kb.size(-2), device=q.device)[None, :] + (0 if local_cols else start)
            s = s.masked_fill(cols > rows, float("-inf"))
        m_new = torch.maximum(m, s.amax(-1, keepdim=True)) if use_max else torch.zeros_like(m)
        m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        p = torch.exp(s - m_safe)
        r = torch.exp(m - m_safe) if use_max else torch.ones_like(m)
        l = (l * r if rescale_sum else l) + p.sum(-1, keepdim=True)
        acc = (acc * r if rescale_acc else acc) + p @ vb
        m = m_new
    return acc / l


ONLINE_MISTAKES = (
    Mistake("running max not rescaled", partial(_tiles, rescale_acc=False, rescale_sum=False),
            "When a block raises the running max from m to m', what was accumulated so far was computed with "
            "exp(s - m): multiply both the running sum and the output accumulator by exp(m - m') before adding the "
            "new block."),
    Mistake("only the sum rescaled", partial(_tiles, rescale_acc=False),
            "You rescale the running sum but not the output accumulator: multiply the accumulator by exp(m - m') too."),
    Mistake("only the accumulator rescaled", partial(_tiles, rescale_sum=False),
            "You rescale the output accumulator but not the running sum: multiply the sum by exp(m - m') too."),
    Mistake("no scaling", partial(_tiles, scale=False), "The scores are not scaled: divide q kᵀ by √d_k."),
    Mistake("last block dropped", partial(_tiles, drop_last=True),
            "The last block of keys is left out: loop over range(0, T_k, block_size), and let the last block be "
            "shorter when block_size does not divide T_k."),
    Mistake("causal mask per block", partial(_tiles, local_cols=True),
            "The causal mask compares the query with the key's position inside its block: use the key's position "
            "in the whole sequence (start + j)."),
    Mistake("no running max", partial(_tiles, use_max=False),
            "Without subtracting a running max, exp(score) overflows on sharp attention (inf/inf = nan): keep the "
            "largest score seen so far and compute exp(s - max)."),
)


def _os_spec() -> ItemSpec:
    big = _os_case(95, (1,), 256, 256, 8, 16, False, f32)
    return ItemSpec(
        name="online_softmax_attention", reference=ref.online_softmax_attention, mistakes=ONLINE_MISTAKES,
        forbidden={F.scaled_dot_product_attention:
                   "it calls torch.nn.functional.scaled_dot_product_attention; compute the blocks yourself"},
        subchecks=(
            SubCheck("equals full attention: q, k, v (2, 16, 4), block_size 4", 1,
                     compare_cases(_os_case(10, (2,), 16, 16, 4, 4, False, f32))),
            SubCheck("block sizes that do not divide T (5), of 1 and larger than T; causal", 1,
                     compare_cases(_os_case(20, (2,), 13, 13, 4, 5, True, f32), _os_case(30, (1,), 7, 7, 4, 1, False, f64),
                                   _os_case(40, (2,), 6, 6, 4, 32, True, f32))),
            SubCheck("cross-attention (T_q ≠ T_k), heads, float64, d_v ≠ d_k, sharp scores", 1,
                     compare_cases(_os_case(50, (2, 2), 5, 19, 6, 4, False, f64, d_v=3),
                                   _os_case(60, (2,), 12, 12, 8, 3, False, f32, scale=40.0),
                                   _os_case(70, (1, 3), 20, 20, 4, 6, True, f64, scale=20.0)), hidden=True),
            SubCheck(f"{ADVICE}never more than (T_q, block_size) scores: T = 256, block_size 16", 0,
                     _no_square(big), hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# KVCache
# ---------------------------------------------------------------------------


def _cache_case(seed: int, steps: tuple[int, ...], B=2, H=3, d_k=4, d_v=5, dtype=f32) -> Case:
    def make(device):
        calls = [["len", {}]]
        for i, t in enumerate(steps):
            calls.append(["append", {"k": randn((B, H, t, d_k), seed + 2 * i, dtype, device),
                                     "v": randn((B, H, t, d_v), seed + 2 * i + 1, dtype, device)}])
            calls.append(["len", {}])
        return {"calls": calls}

    return Case(f"a new KVCache(), len, then append(k, v) of {list(steps)} time steps (k (B={B}, H={H}, t, {d_k}), "
                f"v (…, {d_v}) {dtype_name(dtype)}), len after each", make)


class _Cache:
    """A key/value cache that goes wrong as its class attributes say: returning only the new keys,
    prepending them, counting calls as its length, keeping the first append only."""

    returns_new = prepends = counts_calls = keeps_first = False

    def __init__(self):
        self.k = self.v = None
        self.calls = 0

    def append(self, k, v):
        self.calls += 1
        if self.k is None:
            self.k, self.v = k, v
        elif not self.keeps_first:
            self.k = torch.cat([k, self.k] if self.prepends else [self.k, k], dim=-2)
            self.v = torch.cat([v, self.v] if self.prepends else [self.v, v], dim=-2)
        return (k, v) if self.returns_new else (self.k, self.v)

    def __len__(self):
        return self.calls if self.counts_calls else (0 if self.k is None else self.k.size(-2))


def _cache(name: str, **wrong: bool) -> type:
    return type(name, (_Cache,), {**wrong, "__module__": __name__})


CACHE_MISTAKES = (
    Mistake("returns only the new keys", _cache("CacheReturnsNew", returns_new=True),
            "append must return everything cached so far (the old keys and values followed by the new ones), so that "
            "the new token attends to all earlier positions."),
    Mistake("prepends", _cache("CachePrepends", prepends=True),
            "The new keys go before the cached ones: concatenate in time order, torch.cat([self.k, k], dim=-2)."),
    Mistake("len counts calls", _cache("CacheCountsCalls", counts_calls=True),
            "len(cache) must be the number of cached time steps (K.size(-2)), not the number of append calls: "
            "a prompt appends many positions at once."),
    Mistake("keeps the first append only", _cache("CacheKeepsFirst", keeps_first=True),
            "Later appends are dropped: concatenate every new k and v onto the cache."),
)


def _cache_differ(expected, got):
    """Where the results of a cache's calls first differ (None when they all match)."""
    if not isinstance(got, (list, tuple)) or len(got) != len(expected):
        return f"expected {len(expected)} results (one per call), got {type(got).__name__}"
    appends = 0
    for e, g in zip(expected, got):
        if isinstance(e, int):
            if not isinstance(g, int) or isinstance(g, bool) or g != e:
                return f"len(cache) after {appends} append(s) should be {e}, got {g!r}"
            continue
        appends += 1
        problem = describe_difference(e, g, ("K", "V"), what=f"the result of append number {appends}")
        if problem:
            return problem
    return None


def _cache_spec() -> ItemSpec:
    return ItemSpec(
        name="KVCache", reference=ref.KVCache, mistakes=CACHE_MISTAKES,
        forbidden={GraderCache: "it uses the grader's own cache (course_lib.grading.answer.fixtures); write the cache "
                                "yourself"},
        subchecks=(
            SubCheck("a prompt of 3 positions then two single steps: append returns everything so far, len counts "
                     "positions", 1, compare_cases(_cache_case(10, (3, 1, 1)), probe=Probe("methods"), differ=_cache_differ)),
            SubCheck("one position first, then 4 at once, then 1; float64; a batch of 1 with 1 head", 1,
                     compare_cases(_cache_case(20, (1, 4, 1), dtype=f64), _cache_case(30, (2, 1, 1, 1), B=1, H=1, d_k=8, d_v=2),
                                   probe=Probe("methods"), differ=_cache_differ),
                     hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# cached_generate
# ---------------------------------------------------------------------------


def _gen_case(seed: int, B: int, T: int, new: int, block: int, temperature: float = 0.0, top_k=None,
              num_layers: int = 2, strict: bool = False) -> Case:
    def make(device):
        args = (17, block, 16, num_layers, 2)
        state = {k: (v if k.startswith(("ln", "blocks.0.ln", "blocks.1.ln")) or v.dtype == torch.long else 10 * v)
                 for k, v in reference_state(CountingGPT, args, seed).items()}  # sharper than GPT's 0.02 init
        model = Build(f"{_HERE}:{'StrictCacheGPT' if strict else 'CountingGPT'}", args, state=state,
                      device=str(device), train=False)
        idx = torch.randint(0, 17, (B, T), generator=generator(seed)).to(device)
        out = {"model": model, "idx": idx, "max_new_tokens": new, "temperature": temperature, "top_k": top_k}
        if temperature > 0:
            out["generator"] = GeneratorState.of(torch.Generator().manual_seed(salted_seed(seed)))
        return out

    how = "greedy" if temperature == 0 else f"sampled at temperature {temperature:g}" + (f", top_k={top_k}" if top_k else "")
    model = ("a GPT that answers right only when fed the newest token with its caches" if strict else
             f"a small GPT ({num_layers} blocks, block_size={block})")
    return Case(f"{model}, idx ({B}, {T}), max_new_tokens={new}, {how}", make)


def _gen_loop(step):
    def gen(model, idx, max_new_tokens, temperature=1.0, top_k=None, generator=None):
        from ...sampling import sample_next_token
        with torch.no_grad():
            return step(model, idx, max_new_tokens,
                        lambda logits: sample_next_token(logits, temperature, top_k, generator))

    return gen


def _cached(whole=False, position=-1, new_only=False, recompute=False):
    """A wrong cached generation: the whole sequence run at each step with the caches
    (``whole``) or without any (``recompute``), the first token read at ``position``, only
    the new tokens returned."""

    def step(model, idx, n, sample):
        caches = [_Cache() for _ in model.blocks]
        prompt = idx.size(1)
        if recompute:
            for _ in range(n):
                idx = torch.cat([idx, sample(model(idx[:, -model.block_size:])[:, -1, :])[:, None]], 1)
            return idx
        if whole:
            for _ in range(n):
                idx = torch.cat([idx, sample(model(idx, caches=caches)[:, -1, :])[:, None]], 1)
            return idx
        logits = model(idx, caches=caches)[:, position, :]
        for i in range(n):
            nxt = sample(logits)
            idx = torch.cat([idx, nxt[:, None]], 1)
            if i < n - 1:
                logits = model(nxt[:, None], caches=caches)[:, -1, :]
        return idx[:, prompt:] if new_only else idx

    return _gen_loop(step)


WHOLE_SEQUENCE_HINT = (
    "Each step runs the model on the whole sequence: without a cache that repeats all the work (no speed-up), and "
    "with the cache it appends the keys of the earlier tokens again. After the prompt, run the model on the one new "
    "token only (idx[:, -1:]) with the caches.")

RECOMPUTE_HINT = (
    "Each step runs the model on the whole sequence again, without caches: the tokens are right but nothing is saved, "
    "every step recomputes the keys and values of every earlier position. Keep one KVCache per block and, after the "
    "prompt, run the model on the newest token only: model(idx[:, -1:], caches=caches).")

GENERATE_MISTAKES = (
    Mistake("recomputes every step", _cached(recompute=True), RECOMPUTE_HINT),
    Mistake("cache re-appends the prompt", _cached(whole=True), WHOLE_SEQUENCE_HINT),
    Mistake("first position's logits", _cached(position=0),
            "The first token comes from the logits of the prompt's first position: use the last one, logits[:, -1, :]."),
    Mistake("returns only the new tokens", _cached(new_only=True),
            "Return the whole sequence, the prompt followed by the new tokens: shape (B, T + max_new_tokens)."),
)


def _cached_generate_spec() -> ItemSpec:
    return ItemSpec(
        name="cached_generate", reference=ref.cached_generate, mistakes=GENERATE_MISTAKES,
        # judged on its own: while it runs, the notebook's KVCache is the grader's cache
        invoke=Invoke(names=(("KVCache", f"{_HERE}:GraderCache"),)),
        subchecks=(
            SubCheck("greedy: the same tokens as generate while the sequence fits in the block", 1,
                     compare_cases(_gen_case(10, 4, 3, 8, 64))),
            SubCheck("one new token per step with the caches: prompt 4, 6 steps", 1,
                     compare_cases(_gen_case(20, 2, 4, 6, 64, strict=True), _gen_case(25, 1, 3, 9, 6, strict=True))),
            SubCheck("sampling with a generator (temperature, top_k) gives generate's tokens", 1,
                     compare_cases(_gen_case(30, 3, 2, 6, 16, temperature=1.0),
                                   _gen_case(40, 2, 5, 5, 16, temperature=0.7, top_k=4)), hidden=True),
            SubCheck("past the block size (the window slides), a prompt longer than the block, max_new_tokens = 0, "
                     "one block", 1,
                     compare_cases(_gen_case(50, 2, 3, 9, 6), _gen_case(60, 1, 9, 3, 6), _gen_case(70, 2, 3, 0, 8),
                                   _gen_case(80, 2, 2, 5, 16, num_layers=1)), hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# performer_features
# ---------------------------------------------------------------------------


def _features_case(seed, shape, m, dtype, scale=0.5) -> Case:
    def make(device):
        return {"x": scale * randn(shape, seed, dtype, device), "projection": randn((m, shape[-1]), seed + 1, dtype, device)}

    return Case(f"x {tuple(shape)} {dtype_name(dtype)}, projection ({m}, {shape[-1]})", make)


def _features(half=0.5, squared=True, divide="sqrt", scale_inside=False, stabilise=None, eps=0.0):
    """Wrong random features: exp(x Wᵀ − half·|x|² (|x| unless ``squared``)) divided by √m, m or 1,
    with x scaled by d^(-1/4) first (``scale_inside``); ``stabilise`` as Performer's code does, the
    maximum of x Wᵀ subtracted per row ("row", its queries) or over all rows ("all", its keys), and
    ``eps`` added to the exponential."""

    def features(x, projection):
        if scale_inside:
            x = x * x.size(-1) ** -0.25
        norm = (x * x).sum(-1, keepdim=True) if squared else x.norm(dim=-1, keepdim=True)
        dash = x @ projection.T
        if stabilise == "row":
            dash = dash - dash.amax(-1, keepdim=True)
        elif stabilise == "all":
            dash = dash - dash.amax(dim=(-2, -1), keepdim=True)
        f = (torch.exp(dash - half * norm) if half else torch.exp(dash)) + eps
        m = projection.size(0)
        return f / math.sqrt(m) if divide == "sqrt" else (f / m if divide == "m" else f)

    return features


_STABILISED = ("You subtract the maximum of x Wᵀ before the exponential (Performer's numerical stabilisation"
               "{more}): that multiplies φ by a factor which cancels in linear attention but changes the features "
               "themselves. performer_features returns exp(x Wᵀ − |x|²/2) / √m exactly, nothing subtracted or added.")

FEATURES_MISTAKES = (
    Mistake("features without the |x|²/2 term", _features(half=0),
            "exp(x Wᵀ) alone estimates exp(|a + b|²/2), not exp(a·b): subtract |x|²/2 inside the exponential, "
            "exp(x Wᵀ − |x|²/2) / √m."),
    Mistake("|x|² instead of |x|²/2", _features(half=1.0),
            "Subtract half the squared norm, |x|²/2 = 0.5 * (x * x).sum(-1, keepdim=True), not |x|²."),
    Mistake("|x| instead of |x|²", _features(squared=False),
            "The correction is half the squared norm |x|²/2, not half the norm: use (x * x).sum(-1, keepdim=True)."),
    Mistake("no 1/√m", _features(divide=None),
            "Divide by √m (m = projection.size(0)) so that φ(a)·φ(b), a sum over m features, averages them."),
    Mistake("divided by m", _features(divide="m"),
            "Divide each feature by √m, not m: the product φ(a)·φ(b) then carries the 1/m of an average."),
    Mistake("x scaled inside", _features(scale_inside=True),
            "performer_features takes x as it is; the d^(-1/4) scaling of q and k belongs to the caller (so that "
            "a·b = q·k/√d)."),
    *(Mistake(f"stabilised features ({where}{', + ε' if eps else ''})", _features(stabilise=how, eps=eps),
              _STABILISED.format(more=f", {where}" + (", and an ε of 1e-6 added" if eps else "")))
      for how, where in (("row", "the maximum per row"), ("all", "the maximum over all rows")) for eps in (0.0, 1e-6)),
    Mistake("ε added to the features", _features(eps=1e-6),
            "You add an ε to the exponential (Performer's numerical stabiliser): performer_features returns "
            "exp(x Wᵀ − |x|²/2) / √m exactly."),
)


def _features_spec() -> ItemSpec:
    return ItemSpec(
        name="performer_features", reference=ref.performer_features, mistakes=FEATURES_MISTAKES,
        subchecks=(
            SubCheck("x (5, 4), projection (8, 4)", 1, compare_cases(_features_case(10, (5, 4), 8, f32))),
            SubCheck("batched x (2, 3, 6, 8) float64, projection (16, 8); m < d", 1,
                     compare_cases(_features_case(20, (2, 3, 6, 8), 16, f64), _features_case(30, (7, 6), 3, f32)),
                     hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# linear_attention
# ---------------------------------------------------------------------------


def _linear_case(seed, batch, T_q, T_k, d, causal, dtype, kind="positive", m=16) -> Case:
    def make(device):
        if kind == "positive":
            fmap = Build(f"{_HERE}:PositiveFeatures", (m, d), state={"projection": randn((m, d), seed + 3, f32, "cpu")},
                         device=str(device), dtype=str(dtype).replace("torch.", ""))
        else:
            fmap = Build(f"{_HERE}:EluFeatures", (), device=str(device))
        return {"q": 0.5 * randn((*batch, T_q, d), seed, dtype, device),
                "k": 0.5 * randn((*batch, T_k, d), seed + 1, dtype, device),
                "v": randn((*batch, T_k, d), seed + 2, dtype, device), "feature_map": fmap, "causal": causal}

    what = f"positive random features (m = {m})" if kind == "positive" else "elu(x) + 1 features"
    return Case(f"q {(*batch, T_q, d)}, k, v {(*batch, T_k, d)} {dtype_name(dtype)}, {what}, causal={causal}", make)


def _linear(normaliser="kernel", ignore_causal=False, inclusive=True):
    """Wrong kernel attention: not normalised ("none") or by the sum of φ(q) ("sum"), causal ignored,
    causal prefix sums that leave out the query's own key (not ``inclusive``)."""

    def linear_attention(q, k, v, feature_map, causal=False):
        fq, fk = feature_map(q), feature_map(k)
        if causal and not ignore_causal:
            kv, z = torch.cumsum(fk.unsqueeze(-1) * v.unsqueeze(-2), dim=-3), torch.cumsum(fk, dim=-2)
            if not inclusive:
                kv, z = kv - fk.unsqueeze(-1) * v.unsqueeze(-2), z - fk
            out, norm = (fq.unsqueeze(-2) @ kv).squeeze(-2), (fq * z).sum(-1, keepdim=True)
        else:
            out, norm = fq @ (fk.transpose(-2, -1) @ v), fq @ fk.sum(-2).unsqueeze(-1)
        if normaliser == "none":
            return out
        return out / (fq.sum(-1, keepdim=True) if normaliser == "sum" else norm)

    return linear_attention


LINEAR_MISTAKES = (
    Mistake("no normalisation", _linear(normaliser="none"),
            "The output is not normalised: divide φ(q)(φ(k)ᵀv) by φ(q)·Σ_j φ(k_j), the kernel's version of the "
            "softmax's denominator."),
    Mistake("causal ignored", _linear(ignore_causal=True),
            "With causal=True query i may use keys 0 .. i only: accumulate φ(k_j) v_jᵀ and φ(k_j) with prefix sums "
            "(torch.cumsum over time) instead of summing over all keys."),
    Mistake("causal sums exclude the query's own key", _linear(inclusive=False),
            "Your prefix sums stop at key i-1: query i also sees its own key, so include position i (torch.cumsum "
            "is inclusive)."),
    Mistake("normalised by the sum of φ(q)", _linear(normaliser="sum"),
            "The denominator is φ(q_i)·Σ_j φ(k_j) (one number per query), not the sum of φ(q_i)'s entries."),
)


def _linear_spec() -> ItemSpec:
    return ItemSpec(
        name="linear_attention", reference=ref.linear_attention, mistakes=LINEAR_MISTAKES,
        subchecks=(
            SubCheck("equals normalised kernel attention: q, k, v (2, 6, 4), positive random features", 1,
                     compare_cases(_linear_case(10, (2,), 6, 6, 4, False, f32))),
            SubCheck("causal, by prefix sums", 1, compare_cases(_linear_case(20, (2,), 7, 7, 4, True, f32))),
            SubCheck("elu + 1 features, heads, float64, T_q ≠ T_k, causal with heads", 1,
                     compare_cases(_linear_case(30, (2, 2), 5, 9, 4, False, f64, kind="elu"),
                                   _linear_case(40, (1, 3), 8, 8, 6, True, f64, m=32),
                                   _linear_case(50, (2,), 10, 10, 4, True, f32, kind="elu")), hidden=True),
            SubCheck("gradients reach q, k and v", 1,
                     lambda t: gradients_reach(t, _linear_case(60, (2,), 6, 6, 4, True, f64), ("q", "k", "v"), None),
                     hidden=True),
        ),
    )


SPECS = {
    spec.name: spec
    for spec in (_window_spec(), _dilated_spec(), _global_spec(), _swa_spec(), _os_spec(), _cache_spec(),
                 _cached_generate_spec(), _features_spec(), _linear_spec())
}
