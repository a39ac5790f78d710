"""course_lib's attention fast path against calling PyTorch's fused kernel directly.

    PYTHONPATH=. .venv/bin/python benchmarks/attention_fast_path.py [--T 512 1024 2048 4096] [--threads N]

For each sequence length T (self-attention, batch 1, d_model 64, 4 heads, causal mask,
forward only, no gradients) it times:

- ``kernel``: the same four projections as course_lib's ``MultiHeadAttention`` around a
  direct call of ``torch.nn.functional.scaled_dot_product_attention`` (the floor);
- ``fast``: course_lib's ``MultiHeadAttention`` through ``attention_output`` (the path
  every course model takes when nobody reads the weights);
- ``explicit``: the same module asked for its weights (softmax of the ``(T, T)`` scores).

It prints the medians and ``fast / kernel`` (target ≤ 1.1) and ``explicit / fast``. On a
machine with CUDA it repeats the table on the GPU. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.benchmark import Timer

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from course_lib.attention import causal_mask
from course_lib.multihead import MultiHeadAttention, attention_output, merge_heads, split_heads


def direct(mha: MultiHeadAttention, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The same computation written straight against PyTorch's kernel."""
    q, k, v = (split_heads(lin(x), mha.num_heads) for lin in (mha.w_q, mha.w_k, mha.w_v))
    return mha.w_o(merge_heads(F.scaled_dot_product_attention(q, k, v, attn_mask=mask)))


def median_seconds(fn, min_run_time: float) -> float:
    return Timer(stmt="fn()", globals={"fn": fn}).blocked_autorange(min_run_time=min_run_time).median


def table(device: torch.device, lengths: list[int], min_run_time: float) -> None:
    torch.manual_seed(0)
    mha = MultiHeadAttention(64, 4).to(device).eval()
    print(f"\n{device}: batch 1, d_model 64, 4 heads, causal, forward only")
    print(f"{'T':>6} {'kernel ms':>10} {'fast ms':>10} {'explicit ms':>12} {'fast/kernel':>12} {'explicit/fast':>14}")
    for T in lengths:
        x = torch.randn(1, T, 64, device=device)
        mask = causal_mask(T, device)

        def sync(fn):
            def run():
                fn()
                if device.type == "cuda":
                    torch.cuda.synchronize()
            return run

        with torch.no_grad():
            torch.testing.assert_close(attention_output(mha, x, x, x, mask), direct(mha, x, mask))
            kernel = median_seconds(sync(lambda: direct(mha, x, mask)), min_run_time)
            fast = median_seconds(sync(lambda: attention_output(mha, x, x, x, mask)), min_run_time)
            explicit = median_seconds(sync(lambda: mha(x, x, x, mask)), min_run_time)
        print(f"{T:>6} {kernel * 1e3:>10.2f} {fast * 1e3:>10.2f} {explicit * 1e3:>12.2f} "
              f"{fast / kernel:>12.3f} {explicit / fast:>14.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--T", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    parser.add_argument("--min-run-time", type=float, default=1.0, help="seconds of timing per measurement")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads")
    table(torch.device("cpu"), args.T, args.min_run_time)
    if torch.cuda.is_available():
        table(torch.device("cuda"), args.T, args.min_run_time)


if __name__ == "__main__":
    main()
