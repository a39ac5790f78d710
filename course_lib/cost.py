"""Measure the time and memory of attention as the sequence grows."""

from __future__ import annotations

import time
from typing import Callable, Sequence

import torch
from torch import Tensor

from .attention import scaled_dot_product_attention
from .device import torch_threads

__all__ = ["attention_cost"]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def attention_cost(
    lengths: Sequence[int],
    d_k: int = 64,
    heads: int = 4,
    repeats: int = 3,
    device: torch.device | str = "cpu",
    attend: Callable = scaled_dot_product_attention,
    threads: int | None = 1,
) -> dict[str, list]:
    """Time one attention pass and the size of its weights, per sequence length.

    The time is the best of at least ``repeats`` runs (more for fast lengths, up to
    about 0.1 s per length), which filters out noise from other work on the machine.

    Inputs are ``(1, heads, T, d_k)``. Returns ``{"T": [...], "seconds": [...],
    "weight_bytes": [...]}``; ``weight_bytes`` is the size of the ``(1, heads, T, T)``
    weight tensor actually returned. On the CPU the timing uses ``threads`` threads
    (default 1: single-thread timings are far less disturbed by other work on the
    machine); ``None`` keeps PyTorch's setting.
    """
    device = torch.device(device)
    with torch_threads(threads if device.type == "cpu" else None):
        return _measure(lengths, d_k, heads, repeats, device, attend)


def _measure(lengths, d_k, heads, repeats, device, attend) -> dict[str, list]:
    result: dict[str, list] = {"T": [], "seconds": [], "weight_bytes": []}
    g = torch.Generator().manual_seed(0)
    for T in lengths:
        q, k, v = (torch.randn(1, heads, T, d_k, generator=g).to(device) for _ in range(3))
        with torch.no_grad():
            attend(q, k, v)  # warm-up
            best, spent, runs = float("inf"), 0.0, 0
            while runs < repeats or (spent < 0.1 and runs < 50):
                runs += 1
                _sync(device)
                start = time.perf_counter()
                _, weights = attend(q, k, v)
                _sync(device)
                elapsed = time.perf_counter() - start
                best, spent = min(best, elapsed), spent + elapsed
        result["T"].append(int(T))
        result["seconds"].append(best)
        result["weight_bytes"].append(weights.numel() * weights.element_size())
    return result


def largest_tensor_bytes(fn: Callable[[], object]) -> int:
    """Bytes of the largest tensor any operation makes while ``fn()`` runs (its inputs
    not counted): the size of attention's biggest intermediate, e.g. ``(T, T)`` scores."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    largest = [0]

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, Tensor):
                    largest[0] = max(largest[0], t.numel() * t.element_size())
            return out

    with Record():
        fn()
    return largest[0]
