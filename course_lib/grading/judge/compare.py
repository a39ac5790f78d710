"""Compare an implementation's output with the expected one and describe the difference.

``describe_difference`` returns ``None`` when two outputs match and otherwise one
short paragraph for a student: the part of the output that differs, its shape and
dtype, and the first differing entry.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch
from torch import Tensor

__all__ = ["tolerance", "describe_difference", "describe_value", "fmt_num", "fmt_pair", "precision_hint"]

_TOL = {
    torch.float16: (1e-3, 1e-2),
    torch.bfloat16: (1e-2, 5e-2),
    torch.float32: (1e-5, 1e-4),
    torch.float64: (1e-10, 1e-8),
}


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """``(atol, rtol)`` used to compare tensors of ``dtype``."""
    return _TOL.get(dtype, (0.0, 0.0))


def fmt_num(x: Any) -> str:
    """A number in a short readable form."""
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, int):
        return str(x)
    x = float(x)
    if x != x or x in (float("inf"), float("-inf")):
        return str(x)
    return f"{x:.4g}"


def fmt_pair(expected: Any, got: Any) -> tuple[str, str]:
    """Two numbers with just enough digits to tell them apart (``1.383`` and ``1.383`` are
    shown as ``1.38294917`` and ``1.38294911``)."""
    if isinstance(expected, (bool, int)) or isinstance(got, (bool, int)):
        return fmt_num(expected), fmt_num(got)
    a, b = float(expected), float(got)
    if a != a or b != b or math.isinf(a) or math.isinf(b):
        return fmt_num(a), fmt_num(b)
    if fmt_num(a) != fmt_num(b):
        return fmt_num(a), fmt_num(b)
    for digits in range(5, 18):  # as many digits on both sides ("2.3170", "2.3171")
        sa, sb = f"{a:#.{digits}g}".rstrip("."), f"{b:#.{digits}g}".rstrip(".")
        if sa != sb:
            return sa, sb
    return sa, sb


def _float64_pairs(expected: Any, got: Any) -> list[tuple[Tensor, Tensor]]:
    pairs = list(zip(expected, got)) if isinstance(expected, tuple) and isinstance(got, (tuple, list)) else [(expected, got)]
    return [(e.detach(), g.detach()) for e, g in pairs
            if isinstance(e, Tensor) and isinstance(g, Tensor) and e.dtype == torch.float64 and g.dtype == e.dtype
            and e.shape == g.shape and e.device == g.device]


def precision_hint(expected: Any, got: Any, in_float32: Any) -> str | None:
    """A likely cause for float64 outputs that are off by no more than the same computation in
    float32 is (``in_float32``: the reference's output on the inputs cast to float32, cast back):
    an upcast to float32, complex64 or a hard-coded dtype on the way. None otherwise."""
    pairs = _float64_pairs(expected, got)
    rounded = dict((id(e), r.detach()) for (e, _), r in zip(pairs, [r for _, r in _float64_pairs(expected, in_float32)]))
    off = allowed = 0.0
    for e, g in pairs:
        r = rounded.get(id(e))
        if r is None or not bool(torch.isfinite(g).all()) or not bool(torch.isfinite(e).all()):
            return None
        off = max(off, (g - e).abs().max().item() if g.numel() else 0.0)
        allowed = max(allowed, (r - e).abs().max().item() if r.numel() else 0.0)
        if not bool(torch.isclose(g, e, atol=1e-3, rtol=1e-2).all()):
            return None  # more than rounding: a different computation
    if not pairs or allowed == 0.0 or not 0.0 < off <= 10 * allowed:
        return None
    return ("Part of the computation runs in float32: on float64 inputs the output is off by about as much as "
            "the same computation in float32 is. Keep the input's dtype throughout: no .float(), torch.float32 "
            "or complex64 (for complex RoPE, torch.view_as_complex on x itself), and create new tensors with "
            "dtype=x.dtype.")


def describe_value(x: Any) -> str:
    """``tensor (2, 3) float32 on cpu`` / ``float`` / ``tuple of 2`` ..."""
    if isinstance(x, Tensor):
        return f"tensor {tuple(x.shape)} {str(x.dtype).replace('torch.', '')} on {x.device.type}"
    if isinstance(x, (tuple, list)):
        return f"{type(x).__name__} of {len(x)}"
    if x is None:
        return "None"
    return type(x).__name__


def describe_difference(expected: Any, got: Any, names: Sequence[str] = (), what: str = "the output",
                        equal_nan: bool = False) -> str | None:
    """Return ``None`` if ``got`` matches ``expected``, else a message saying how it differs.

    ``equal_nan`` treats NaN as equal to NaN (used to match a student's output with a
    catalogued mistake that also produces NaN)."""
    if isinstance(expected, tuple):
        if got is None:
            return f"{what} should be a tuple of {len(expected)} ({_join(names, len(expected))}), but nothing was returned (did you forget `return`?)."
        if not isinstance(got, (tuple, list)):
            return (
                f"{what} should be a tuple of {len(expected)} ({_join(names, len(expected))}), "
                f"got a {describe_value(got)}."
            )
        if len(got) != len(expected):
            return f"{what} should be a tuple of {len(expected)} ({_join(names, len(expected))}), got {len(got)} items."
        for i, (e, g) in enumerate(zip(expected, got)):
            part = names[i] if i < len(names) else f"item {i} of the returned tuple"
            msg = describe_difference(e, g, (), what=f"`{part}`", equal_nan=equal_nan)
            if msg:
                return msg
        return None
    if isinstance(expected, Tensor):
        return _tensor_difference(expected, got, what, equal_nan)
    if isinstance(expected, float):
        if isinstance(got, Tensor) and got.numel() == 1:
            got = got.item()
        if not isinstance(got, (int, float)) or isinstance(got, bool):
            return f"{what} should be a number, got {describe_value(got)}."
        got = float(got)
        if math.isnan(got) or math.isnan(expected):  # NaN compares False with everything
            if math.isnan(got) and math.isnan(expected):
                return None
            return f"{what}: expected {fmt_num(expected)}, got {fmt_num(got)}."
        if got != expected and not abs(got - expected) <= 1e-8 + 1e-6 * abs(expected):
            shown_e, shown_g = fmt_pair(expected, got)
            return f"{what}: expected {shown_e}, got {shown_g}."
        return None
    if isinstance(expected, (int, bool)) or expected is None:
        if isinstance(expected, int) and not isinstance(expected, bool) and isinstance(got, Tensor) and got.numel() == 1:
            return f"{what} should be a Python int, got a {describe_value(got)} (use int(...) or .item())."
        if got != expected or type(got) is not type(expected):
            return f"{what}: expected {expected!r}, got {got!r}."
        return None
    if isinstance(expected, list):
        if not isinstance(got, list):
            return f"{what} should be a list, got {describe_value(got)}."
        if got != expected:
            for i, (e, g) in enumerate(zip(expected, got)):
                if e != g:
                    return f"{what}: first difference at position {i}: expected {e!r}, got {g!r}."
            return f"{what}: expected {len(expected)} items, got {len(got)}."
        return None
    if got != expected:
        return f"{what}: expected {expected!r}, got {got!r}."
    return None


def _join(names: Sequence[str], n: int) -> str:
    return ", ".join(names) if len(names) == n else f"{n} items"


def _tensor_difference(expected: Tensor, got: Any, what: str, equal_nan: bool = False) -> str | None:
    if got is None:
        return f"{what} is None: did you forget `return`?"
    if not isinstance(got, Tensor):
        return f"{what} should be a torch tensor {tuple(expected.shape)}, got a {describe_value(got)}."
    if got.shape != expected.shape:
        return f"{what} has shape {tuple(got.shape)}, expected {tuple(expected.shape)}."
    if got.dtype != expected.dtype:
        hint = ""
        if expected.dtype == torch.bool:
            hint = " Masks are boolean: build them with comparisons or dtype=torch.bool."
        elif expected.is_floating_point():
            hint = " Don't hard-code a dtype: new tensors should take dtype=x.dtype from the inputs."
        return (
            f"{what} has dtype {str(got.dtype).replace('torch.', '')}, "
            f"expected {str(expected.dtype).replace('torch.', '')}.{hint}"
        )
    if got.device != expected.device:
        return (
            f"{what} is on {got.device}, expected {expected.device}: don't call .cpu() or .cuda(); "
            "create new tensors with device=x.device."
        )
    e, g = expected.detach(), got.detach()
    if e.dtype == torch.bool or not e.is_floating_point():
        bad = e != g
    else:
        atol, rtol = tolerance(e.dtype)
        bad = ~torch.isclose(g, e, atol=atol, rtol=rtol, equal_nan=equal_nan)
    if not bool(bad.any()):
        return None
    n_bad, n = int(bad.sum()), bad.numel()
    first = tuple(int(i) for i in bad.nonzero()[0].tolist())
    shown_e, shown_g = fmt_pair(e[first].item(), g[first].item())
    index = first if len(first) != 1 else first[0]
    msg = (f"{what} differs from the expected values in {n_bad} of {n} entries; first at index {index}: "
           f"expected {shown_e}, got {shown_g}.")
    if g.is_floating_point() and not bool(torch.isfinite(g).all()):
        msg += " It contains NaN or inf."
    return msg
