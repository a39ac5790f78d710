"""Measure the time and memory of attention as the sequence grows, and of generation with
and without a key/value cache as the output grows; count what each computes (floating-point
operations, positions), the cost that a busy machine cannot bend."""

from __future__ import annotations

import time
from typing import Callable, Sequence

import torch
from torch import Tensor

from .attention import scaled_dot_product_attention
from .device import torch_threads

__all__ = ["attention_cost", "compare_attention", "compare_generation", "count_flops", "count_operations",
           "loglog_slope", "largest_tensor_bytes", "seconds_per_call"]


def _timed_here(fn: Callable, what: str) -> None:
    """Refuse to time ``fn`` where it does not run here: while a notebook is graded, course_lib's
    references for that notebook's items are stubs that ask the grader to run them
    (autograder/inside/reference_stubs.py), so a timing would measure the round trip, not the
    function. The stub's own error says so in one line; the cell does not count."""
    if getattr(fn, "__workbook_reference__", None):
        from ._grading_oracle import ReferenceUnavailable  # (only in the course_lib of a graded notebook)
        raise ReferenceUnavailable(f"{what} is not timed while this notebook is graded (course_lib's reference "
                                   "runs in the grader there); this cell does not count towards the grade.")


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
    _timed_here(attend, "attention")
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


def compare_attention(
    methods: dict[str, Callable[[Tensor, Tensor, Tensor], Tensor]],
    lengths: Sequence[int],
    d_k: int = 64,
    heads: int = 1,
    device: torch.device | str = "cpu",
    threads: int | None = 1,
    max_seconds: float = 1.0,
    progress: bool = True,
) -> dict[str, dict[str, list]]:
    """Time and memory of several attention functions ``f(q, k, v) -> out`` as T grows.

    Inputs are ``(1, heads, T, d_k)``. For each method and length: the best of a few runs
    (as :func:`attention_cost`), the bytes of the largest tensor it creates
    (:func:`largest_tensor_bytes`, the score matrix for full attention) and the
    floating-point operations it computes (:func:`count_flops`: counted, the same on any
    machine). A method whose run at some length took more than ``max_seconds`` is not timed
    at longer lengths. Returns ``{name: {"T": [...], "seconds": [...], "largest_bytes":
    [...], "flops": [...]}}``.
    """
    from tqdm.auto import tqdm

    for name, attend in methods.items():
        _timed_here(attend, name)
    device = torch.device(device)
    results = {name: {"T": [], "seconds": [], "largest_bytes": [], "flops": []} for name in methods}
    g = torch.Generator().manual_seed(0)
    with torch_threads(threads if device.type == "cpu" else None), torch.no_grad():
        for T in tqdm(lengths, desc="sequence lengths", disable=not progress):
            q, k, v = (torch.randn(1, heads, T, d_k, generator=g).to(device) for _ in range(3))
            for name, attend in methods.items():
                r = results[name]
                if r["seconds"] and r["seconds"][-1] > max_seconds:
                    continue  # too slow already: the next length would only be slower
                flops = []  # counted during the same run as the largest tensor, which is also the warm-up
                r["largest_bytes"].append(largest_tensor_bytes(lambda: flops.append(count_flops(lambda: attend(q, k, v)))))
                r["flops"].append(flops[0])
                best, spent, runs = float("inf"), 0.0, 0
                while runs < 2 or (spent < 0.1 and runs < 20):
                    runs += 1
                    _sync(device)
                    start = time.perf_counter()
                    attend(q, k, v)
                    _sync(device)
                    elapsed = time.perf_counter() - start
                    best, spent = min(best, elapsed), spent + elapsed
                r["T"].append(int(T))
                r["seconds"].append(best)
    return results


def compare_generation(
    methods: dict[str, Callable],
    model: torch.nn.Module,
    prompt: Tensor,
    new_tokens: Sequence[int],
    num_threads: int | str | None = "auto",
    progress: bool = True,
) -> dict[str, list]:
    """Time several generation functions ``f(model, prompt, n, generator=...) -> (B, T0 + n)``
    for each count of new tokens, count the positions the model computed for each, and check
    that they write the same tokens.

    Every method gets the same seeded generator for a given ``n`` (so sampling draws the
    same numbers), and runs on ``num_threads`` CPU threads (``"auto"``: one for a small
    model, :func:`course_lib.device.threads_for`). ``positions`` counts, per sequence, the
    token positions passed to ``model`` over all its calls: the work of generation, counted
    rather than timed (without a cache step ``i`` passes all ``T0 + i`` positions, with one
    a single position). Returns ``{"new_tokens": [...], "seconds": {name: [...]},
    "positions": {name: [...]}, "same": [...]}``, where ``same[i]`` says whether every
    method wrote exactly the first method's tokens for ``new_tokens[i]``.
    """
    from tqdm.auto import tqdm

    result: dict = {"new_tokens": [], "seconds": {name: [] for name in methods},
                    "positions": {name: [] for name in methods}, "same": []}
    passed = [0]

    def count(module, args, kwargs) -> None:
        tokens = args[0] if args else next(iter(kwargs.values()), None)
        if isinstance(tokens, Tensor) and tokens.dim() >= 1:
            passed[0] += tokens.size(-1)

    hook = model.register_forward_pre_hook(count, with_kwargs=True)
    try:
        with torch_threads(num_threads, model):
            for n in tqdm(list(new_tokens), desc="generation lengths", disable=not progress):
                outputs = []
                for name, generate_fn in methods.items():
                    passed[0] = 0
                    start = time.perf_counter()
                    outputs.append(generate_fn(model, prompt, n, generator=torch.Generator().manual_seed(n)))
                    result["seconds"][name].append(time.perf_counter() - start)
                    result["positions"][name].append(passed[0])
                result["new_tokens"].append(int(n))
                result["same"].append(all(torch.equal(outputs[0], out) for out in outputs[1:]))
    finally:
        hook.remove()
    return result


def seconds_per_call(fn: Callable[[], object], min_runs: int = 20, budget: float = 0.2,
                     threads: int | None = 1, device: torch.device | str = "cpu") -> float:
    """The best time of ``fn()`` over at least ``min_runs`` runs (more, up to about ``budget`` seconds,
    for fast calls), after one warm-up, without gradients, on ``threads`` CPU threads (default 1: the
    steadiest clock on a busy machine; ``None`` keeps PyTorch's setting). The best run is the one least
    disturbed by other work on the machine."""
    device = torch.device(device)
    best, spent, runs = float("inf"), 0.0, 0
    with torch_threads(threads if device.type == "cpu" else None), torch.no_grad():
        fn()
        while runs < min_runs or (spent < budget and runs < 100 * min_runs):
            runs += 1
            _sync(device)
            start = time.perf_counter()
            fn()
            _sync(device)
            elapsed = time.perf_counter() - start
            best, spent = min(best, elapsed), spent + elapsed
    return best


def loglog_slope(x: Sequence[float], y: Sequence[float], last: int = 3) -> float:
    """Slope of ``log y`` against ``log x`` fitted on the ``last`` largest points: the
    exponent ``p`` of ``y ∝ x^p`` once constant costs no longer matter."""
    if len(x) != len(y) or len(x) < 2:
        raise ValueError("need at least two (x, y) points of equal count")
    lx = torch.tensor(x[-last:], dtype=torch.float64).log()
    ly = torch.tensor(y[-last:], dtype=torch.float64).log()
    lx, ly = lx - lx.mean(), ly - ly.mean()
    return float((lx * ly).sum() / (lx * lx).sum())


def count_flops(fn: Callable[[], object]) -> int:
    """Floating-point operations of the matrix products and attention kernels that ``fn()``
    runs, counted by PyTorch's ``FlopCounterMode`` (2 per multiply-add; element-wise work
    such as the softmax is not counted). PyTorch's fused attention on the CPU, which that
    counter leaves out, is counted as its kernels on a GPU are: ``2·T_q·T_k·(d_k + d_v)`` per
    head forward, the scores recomputed and four products backward. A count, not a time:
    the same on any machine, however busy."""
    from torch.utils.flop_counter import FlopCounterMode

    aten = torch.ops.aten
    cpu_kernels = {aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_flops,
                   aten._scaled_dot_product_flash_attention_for_cpu_backward: _sdpa_backward_flops}
    with FlopCounterMode(display=False, custom_mapping=cpu_kernels) as counter:
        fn()
    return int(counter.get_total_flops())


def count_operations(fn: Callable[[], object]) -> int:
    """How many PyTorch operations (each a kernel call: a product, an addition, a ``tanh``,
    a slice) ``fn()`` runs: a loop of ``T`` dependent steps runs ``T`` times as many as one
    batched expression of the same arithmetic. A count, not a time."""
    from torch.utils._python_dispatch import TorchDispatchMode

    calls = [0]

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            calls[0] += 1
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return calls[0]


def _sdpa_flops(q_shape, k_shape, v_shape, *args, out_shape=None, **kwargs) -> int:
    """``q (B, H, T_q, d_k)``, ``k (B, H, T_k, d_k)``, ``v (B, H, T_k, d_v)``: the scores
    ``q kᵀ`` and the output ``weights v``, 2 operations per multiply-add."""
    b, h, t_q, d_k = q_shape
    t_k, d_v = k_shape[-2], v_shape[-1]
    return 2 * b * h * t_q * t_k * (d_k + d_v)


def _sdpa_backward_flops(grad_shape, q_shape, k_shape, v_shape, *args, out_shape=None, **kwargs) -> int:
    """The backward pass: scores recomputed (``q kᵀ``), the gradients of the weights
    (``grad vᵀ``), of ``v`` (``weightsᵀ grad``), of ``q`` and of ``k`` (a product each)."""
    b, h, t_q, d_k = q_shape
    t_k, d_v = k_shape[-2], v_shape[-1]
    return 2 * b * h * t_q * t_k * (3 * d_k + 2 * d_v)


def largest_tensor_bytes(fn: Callable[[], object]) -> int:
    """Bytes of the largest tensor any operation makes while ``fn()`` runs (its inputs
    not counted): the size of attention's biggest intermediate, e.g. ``(T, T)`` scores."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    largest = [0]

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, Tensor):
                    largest[0] = max(largest[0], t.numel() * t.element_size())
            return out

    with Record():
        fn()
    return largest[0]
