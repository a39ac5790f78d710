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

__all__ = ["tolerance", "describe_difference", "describe_value", "fmt_num"]

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
            return f"{what}: expected {fmt_num(expected)}, got {fmt_num(got)}."
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
    ev, gv = e[first].item(), g[first].item()
    index = first if len(first) != 1 else first[0]
    msg = f"{what} differs from the expected values in {n_bad} of {n} entries; first at index {index}: expected {fmt_num(ev)}, got {fmt_num(gv)}."
    if g.is_floating_point() and not bool(torch.isfinite(g).all()):
        msg += " It contains NaN or inf."
    return msg
