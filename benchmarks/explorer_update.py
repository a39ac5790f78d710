"""How long the attention explorer takes to redraw when a slider moves, on a whole model.

    PYTHONPATH=. .venv/bin/python benchmarks/explorer_update.py [--T 32 64 128] [--repeats 5]

For each sequence length T: a one-layer, 4-head TinyTransformer (d_model 32, causal) in the
explorer (course_lib.widgets), the temperature slider moved ``repeats`` times with one head
shown and with the all-heads grid; each move reruns the model and redraws. It prints the
median and the fastest update in milliseconds and the all-heads / one-head ratio. A slider
feels live below about 100 ms. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from course_lib.tiny_models import TinyTransformer
from course_lib.widgets import ALL_HEADS, AttentionExplorer, ModelSource, describe_tokens


def explorer(T: int) -> AttentionExplorer:
    """The explorer on a seeded one-layer model and ``T`` random tokens."""
    torch.manual_seed(0)
    model = TinyTransformer(10, 100, d_model=32, num_heads=4, num_layers=1, max_len=T, causal=True).eval()
    tokens = torch.randint(0, 10, (1, T))
    source = ModelSource(model, lambda m, mask: m(tokens, attn_mask=mask),
                         lambda out: describe_tokens([str(p) for p in out[0].argmax(-1).tolist()]))
    return AttentionExplorer([str(t) for t in tokens[0].tolist()], source)


def update_seconds(ex: AttentionExplorer, head: int, repeats: int) -> list[float]:
    """Wall times of ``repeats`` temperature moves with ``head`` shown."""
    ex.head.value = head
    times = []
    for i in range(repeats):
        start = time.perf_counter()
        ex.temperature.value = (0.5, 1.0, 2.0)[i % 3] + 0.01 * i  # always a new value
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--T", type=int, nargs="+", default=[32, 64, 128])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"{'T':>5} {'one head (ms)':>22} {'all 4 heads (ms)':>22} {'all / one':>10}")
    for T in args.T:
        ex = explorer(T)
        one, grid = update_seconds(ex, 0, args.repeats), update_seconds(ex, ALL_HEADS, args.repeats)
        m1, m4 = statistics.median(one), statistics.median(grid)
        print(f"{T:>5} {m1 * 1e3:>10.0f} (min {min(one) * 1e3:>5.0f}) {m4 * 1e3:>10.0f} (min {min(grid) * 1e3:>5.0f})"
              f" {m4 / m1:>10.2f}")


if __name__ == "__main__":
    main()
