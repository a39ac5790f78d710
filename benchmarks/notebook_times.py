"""Each solution notebook's time, top to bottom, against its budget, with the quality it reached.

    .venv/bin/python benchmarks/notebook_times.py [NOTEBOOK ...] [--grading] [--threads N] [--cells K]
                                                  [--json OUT] [--compare BEFORE] [--attention fast|explicit]
                                                  [--salt N] [--optimizer fused|plain] [--device cpu|cuda]
    .venv/bin/python benchmarks/notebook_times.py --spread RUN.json ...

Every notebook promises a student a run of at most a minute on an idle 2-core laptop CPU
(:data:`BUDGETS`); graded, it must run in well under half a minute (:data:`GRADING_BUDGET`).
For each notebook it prints the wall time, the CPU time of its kernel (user + system, all
threads: on a shared machine the steadier number) and the quality the notebook reached, read
from the lines it printed (the same lines its tests read), so that a faster notebook that
learns less shows at once. The test suite checks what the notebooks show, never how long
they take (shared machines are noisy); this is where the time is measured, and where the
notebooks' claims about time (:data:`COST_CLAIMS`: the KV cache's speed-up, the slopes of
attention's time, ...) are checked, ✓ or ✗, on what each printed (the tests check the counted
costs printed beside them: operations, positions, bytes).

- ``--grading`` runs the notebooks as the autograder does (``WORKBOOK_GRADING=1``: short
  training; the autograder gives each kernel one thread, see ``--threads``).
- ``--threads N`` pins every kernel to ``N`` CPU threads: OpenMP's and PyTorch's, and
  course_lib's thread choice for small models (``WORKBOOK_THREADS``, see
  ``course_lib.device.threads_for``), for the thread study of docs/threads.md.
- ``--cells K`` also prints each notebook's ``K`` slowest cells (wall and CPU seconds).
- ``--json`` keeps the numbers; ``--compare`` prints an earlier run's beside them (before
  and after a change; files of earlier versions, which kept wall times only, are read too).
- ``--salt N`` mixes ``N`` into every seed the notebooks set (PyTorch's, Python's, NumPy's:
  weights, batches and generated data sets change, the code stays as it is); ``--optimizer``
  makes every Adam/AdamW take PyTorch's fused kernel or its plain loop. With ``--threads``
  they measure how far each claim lies from its threshold: run a few salts, thread counts and
  optimizer paths with ``--json``, then ``--spread`` prints each number's lowest and highest
  value over the runs (docs/claims.md holds the last such measurement).
- ``--attention explicit`` turns course_lib's attention fast path off in the kernels (every
  course model computes its ``(T, T)`` weights, as before the fast path); with
  ``--attention fast`` (the same start-up, path left on) it gives the fast path's before and
  after::

      benchmarks/notebook_times.py --attention explicit --json before.json
      benchmarks/notebook_times.py --attention fast --compare before.json

- ``--device cpu|cuda`` makes every kernel use that device (``WORKBOOK_DEVICE``, which
  ``course_lib.device.get_device`` and ``training_device`` obey); the run prints the device, and
  the GPU's name (docs/gpu.md). ``cuda`` is refused where PyTorch sees no GPU.

Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

# Imported by every kernel at start-up (``sitecustomize``) with --attention: both modes import
# the same modules, so that only the attention path differs between the two runs.
_STARTUP = """
import torch.nn.functional as F
import course_lib.attention as _attention
import course_lib.multihead as _multihead

if {explicit}:
    def _explicit_attention(q, k, v, mask=None, dropout_p=0.0):
        out, weights = _attention.scaled_dot_product_attention(q, k, v, mask)
        return out if dropout_p == 0.0 else F.dropout(weights, p=dropout_p) @ v

    _attention.fused_attention = _multihead.fused_attention = _explicit_attention
"""

# With --salt: every seed a notebook (or course_lib for it) gives PyTorch, Python's random or
# NumPy is mixed with the salt, so that weights, batches and generated data sets all change
# while the notebook's code stays as it is (salt 0 is the notebook as written).
_SALT = """
import hashlib as _hashlib
import random as _random

import numpy as _np
import torch as _torch

def _salted(seed, salt={salt}):
    if seed is None:
        return None
    return int.from_bytes(_hashlib.sha256(f"{{salt}}:{{seed!r}}".encode()).digest()[:4], "little")

_manual_seed = _torch.manual_seed
_torch.manual_seed = _torch.random.manual_seed = lambda seed: _manual_seed(_salted(int(seed)))

class _SaltedGenerator(_torch.Generator):
    def manual_seed(self, seed):
        return super().manual_seed(_salted(int(seed)))

_torch.Generator = _SaltedGenerator
_seed = _random.Random.seed
_random.Random.seed = lambda self, a=None, version=2: _seed(self, _salted(a), version)
_random.seed = _random._inst.seed
_np_seed = _np.random.seed
_np.random.seed = lambda seed=None: _np_seed(_salted(seed))
"""

# With --optimizer: every Adam and AdamW (AdamW calls Adam's constructor) takes PyTorch's fused
# kernel ("fused") or its loop over the parameters ("plain"), whatever the code asked for.
_OPTIMIZER = """
import torch as _torch

_adam_init = _torch.optim.Adam.__init__

def _init(self, params, *args, **kwargs):
    kwargs.update(fused={fused}, foreach=False)
    _adam_init(self, params, *args, **kwargs)

_torch.optim.Adam.__init__ = _init
"""

# seconds, top to bottom on an idle 2-core CPU: the promise of every notebook
BUDGETS = {
    "01_rnn_limitations": 60,
    "02_bahdanau_attention": 60,
    "03_self_attention": 60,
    "04_multi_head_attention": 60,
    "05_positional_encoding": 60,
    "06_transformer": 60,
    "07_bert_mlm_nsp": 60,
    "08_gpt_in_context_learning": 60,
    "09_efficient_attention": 60,
    "10_attention_over_images": 60,
    "11_modern_decoder": 60,
}
GRADING_BUDGET = 30  # seconds, any notebook, as the autograder runs it

# What each notebook reached, as it printed it: (label, pattern whose group 1 is the value, or a
# function of the printed text giving it). Every number a notebook's test checks against a
# threshold is here, so that --spread shows how far each lies from its threshold over runs.
def _least(pattern: str, pair=lambda a, b: a - b):
    """A function of the printed text: the least ``pair(a, b)`` over the matches' two groups."""
    def value(printed: str) -> str:
        pairs = [pair(float(a), float(b)) for a, b in re.findall(pattern, printed)]
        return f"{min(pairs):.1f}" if pairs else "?"
    return value


def _least_step(pattern: str, sign: int):
    """The least step between consecutive matches, a fall (``sign`` -1) or a rise (+1);
    negative where one goes the other way."""
    def value(printed: str) -> str:
        values = [float(v) for v in re.findall(pattern, printed)]
        return f"{min(sign * (b - a) for a, b in zip(values, values[1:])):.1f}" if len(values) > 1 else "?"
    return value


def _extreme(pattern: str, pick=min):
    """``pick`` (min or max) of the numbers in every match of ``pattern``'s group 1."""
    def value(printed: str) -> str:
        values = [float(v) for m in re.findall(pattern, printed, re.M) for v in re.findall(r"\d+(?:\.\d+)?", m)]
        return f"{pick(values):g}" if values else "?"
    return value


def _row(name: str, column: int):
    """Column ``column`` of notebook 05's extrapolation table for ``name`` (T = 8, 16, 24, 32, 48)."""
    def value(printed: str) -> str:
        found = re.search(rf"^\s*{name} \| ([\d.%| ]+)$", printed, re.M)
        return found.group(1).split("|")[column].strip() if found else "?"
    return value


def _beyond_training(name: str, pick):
    """``pick`` of notebook 05's accuracies for ``name`` at the lengths beyond training (24, 32, 48)."""
    def value(printed: str) -> str:
        found = re.search(rf"^\s*{name} \| ([\d.%| ]+)$", printed, re.M)
        return f"{pick(float(v.strip(' %')) for v in found.group(1).split('|')[2:]):.1f}%" if found else "?"
    return value


QUALITY = {
    "01_rnn_limitations": (
        ("exact match at length 4", r"length\s+4: exact match\s+([\d.]+%)"),
        ("at 20", r"length 20: exact match\s+([\d.]+%)"),
        ("token accuracy's least fall between lengths",
         _least_step(r"length\s+\d+: exact match\s+[\d.]+%, token accuracy\s+([\d.]+)%", -1)),
        ("first 4 outputs over the last 4, least gap",
         _least(r"length \d+: first 4 output positions ([\d.]+)%, last 4 output positions ([\d.]+)%")),
        ("c read back: first 4", r"context readout: first 4 positions ([\d.]+%)"),
        ("last 4", r"context readout: .*last 4 positions ([\d.]+%)"),
        ("gradient norm, radius 0.5", r"spectral radius 0\.5: ‖∂h_30/∂h_1‖ = ([\d.e+-]+)"),
        ("radius 1", r"spectral radius 1\.0: ‖∂h_30/∂h_1‖ = ([\d.e+-]+)"),
        ("radius 3", r"spectral radius 3\.0: ‖∂h_30/∂h_1‖ = ([\d.e+-]+)"),
    ),
    "02_bahdanau_attention": (
        ("dates exact match, attention", r"held-out exact match \(attention\): ([\d.]+%)"),
        ("fixed context", r"held-out exact match \(fixed context\): ([\d.]+%)"),
        ("worst length bin, attention", r"attention\s*: worst length bin ([\d.]+%)"),
        ("fixed context's", r"fixed context\s*: worst length bin ([\d.]+%)"),
        ("least attention on a field's own digits", _extreme(r"(?:day|month|year)\s* digits put (\d+)% of their attention")),
    ),
    "03_self_attention": (
        ("std of A @ B.T, raw", r"std of A @ B\.T.*?: ([\d.]+)"),
        ("scaled", _extreme(r"std of A @ B\.T.*?: ([\d.]+)", max)),
        ("difference from PyTorch's kernel", r"largest difference from PyTorch's kernel: ([\d.e+-]+)"),
        ("'it' attends most to", r"'it' attends most to '(\w+)'"),
    ),
    "04_multi_head_attention": (
        ("held-out accuracy", r"held-out accuracy \(both digits right\): ([\d.]+%)"),
        ("most weight 1 back", _extreme(r"head \d: \d+% of its weight on the token \d step\(s\) back \(1 back: (\d+)%", max)),
        ("3 back", _extreme(r"\(1 back: \d+%, 3 back: (\d+)%\)", max)),
        ("ablation none", r"^\s*none \|\s+([\d.]+%)"),
        ("a head's ablation, least tens", _extreme(r"^\s*head \d \|\s+[\d.]+% \|\s+([\d.]+)%", min)),
        ("all heads' ablation", r"^\s*all heads \|\s+([\d.]+%)"),
    ),
    "05_positional_encoding": (
        ("sorted? none", r"^\s+none: ([\d.]+%)"),
        ("sinusoidal", r"^\s+sinusoidal: ([\d.]+%)"),
        ("learned", r"^\s+learned: ([\d.]+%)"),
        ("relative", r"^\s+relative: ([\d.]+%)"),
        ("beyond 16: relative, least", _beyond_training("relative", min)),
        ("sinusoidal, most", _beyond_training("sinusoidal", max)),
        ("learned, most", _beyond_training("learned", max)),
    ),
    "06_transformer": (
        ("BLEU greedy", r"held-out BLEU \(greedy\): ([\d.]+)"),
        ("beam", r"held-out BLEU \(beam 4\): ([\d.]+)"),
        ("exact match greedy", r"held-out exact match \(greedy\): ([\d.]+%)"),
        ("verb's cross-attention on the source verb", r"attending most to the source verb: ([\d.]+%)"),
        ("loss post-LN", r"post-LN final loss \(mean of the last 20 steps\): ([\d.]+)"),
        ("pre-LN", r"pre-LN\s+final loss \(mean of the last 20 steps\): ([\d.]+)"),
    ),
    "07_bert_mlm_nsp": (
        ("MLM", r"held-out MLM accuracy: ([\d.]+%)"),
        ("unigram", r"unigram baseline, always '[^']+': ([\d.]+%)"),
        ("NSP", r"held-out NSP accuracy: ([\d.]+%)"),
        ("NSP curve", r"NSP accuracy during pre-training: (\d+: \d+%, \d+: \d+%)"),
        ("NSP at the curve's start", r"NSP accuracy during pre-training: \d+: (\d+%)"),
        ("NSP at the curve's end", r"NSP accuracy during pre-training: .*\b(\d+%)\s*$"),
        ("fine-tuned", r"pre-trained\s*: ([\d.]+%)"),
        ("scratch", r"from scratch\s*: ([\d.]+%)"),
        ("probe: [CLS] embeddings", r"^cls (\d+%)"),
        ("[CLS] last layer", r"^cls (?:\d+% )*(\d+%)\s*$"),
        ("mean of embeddings", r"^mean (\d+%)"),
    ),
    "08_gpt_in_context_learning": (
        ("ICL K=0", r"K =  0: transformer ([\d.]+%)"),
        ("K=1", r"K =  1: transformer ([\d.]+%)"),
        ("K=16", r"K = 16: transformer ([\d.]+%)"),
        ("least rise with K", _least_step(r"K = +\d+: transformer ([\d.]+)%", +1)),
        ("baseline K=0", r"K =  0: transformer [\d.]+%   nearest-centroid baseline ([\d.]+%)"),
        ("baseline K=16", r"K = 16: transformer [\d.]+%   nearest-centroid baseline ([\d.]+%)"),
        ("prompts: description, K=0", r"description +([\d.]+%)"),
        ("none, K=0", r"no descr\. +([\d.]+%)"),
        ("none, K=4", r"no descr\. +(?:[\d.]+% +){3}([\d.]+%)"),
        ("repeat loss 2 layers", r"2-layer model: .*?([\d.]+) nats on the repeat"),
        ("first half", r"2-layer model: mean loss ([\d.]+) nats on the first half"),
        ("1 layer", r"1-layer model: .*?([\d.]+) nats on the repeat"),
        ("best induction score", _extreme(r"layer 1, induction score per head: +\[([^\]]*)\]", max)),
        ("control's", r"1-layer control, best induction score: ([\d.]+)"),
    ),
    "09_efficient_attention": (
        ("KV cache at 256 tokens", r"256 new tokens: .*?([\d.]+x) faster"),
        ("T = 1024: full", r"\nfull +\d+ +[\d.]+ +([\d.]+%)"),
        ("window", r"\nwindow +\d+ +[\d.]+ +([\d.]+%)"),
        ("window + global", r"\nwindow \+ global +\d+ +[\d.]+ +([\d.]+%)"),
        ("Performer error, smooth", r"smooth +relative error at m = 1024: ([\d.e+-]+)"),
        ("sharp", r"sharp \(scores x 9\) +relative error at m = 1024: ([\d.e+-]+)"),
    ),
    "10_attention_over_images": (
        ("captions exactly right", r"unseen scenes: captions exactly right ([\d.]+%)"),
        ("words right", r"unseen scenes: captions exactly right [\d.]+%, words right ([\d.]+%)"),
        ("pointing", r"pointing accuracy of the captioner: +([\d.]+%)"),
        ("centre map", r"a map that always peaks at the centre: +([\d.]+%)"),
        ("uniform", r"uniform attention \(a random region\): +([\d.]+%)"),
        ("penalty: captions", r"\npenalty, lambda = 0.02 +([\d.]+%)"),
        ("penalty: words", r"\npenalty, lambda = 0.02 +[\d.]+% +([\d.]+%)"),
        ("penalty: pointing", r"\npenalty, lambda = 0.02 +[\d.]+% +[\d.]+% +([\d.]+%)"),
        ("ViT", r"\nViT with positions +[\d,]+ +([\d.]+%)"),
        ("without positions", r"\nViT without positions +[\d,]+ +([\d.]+%)"),
        ("CNN", r"\nCNN \(same size\) +[\d,]+ +([\d.]+%)"),
        ("objects' share of patches", r"the objects cover ([\d.]+%) of the patches"),
        ("rollout, mean", r"rollout of \[CLS\], heads fused by mean: ([\d.]+%)"),
        ("heads: most", _extreme(r"head \d ([\d.]+)%", max)),
        ("least", _extreme(r"head \d ([\d.]+)%", min)),
    ),
    "11_modern_decoder": (
        ("loss GPT-2 block", r"\nGPT-2 block +[\d,]+ +([\d.]+) nats"),
        ("ModernBlock", r"\nModernBlock +[\d,]+ +([\d.]+) nats"),
        ("with LayerNorm", r"\nModernBlock with LayerNorm +[\d,]+ +([\d.]+) nats"),
        ("rotary at 32", r"\nrotary +([\d.]+) +[\d.]+ +[\d.]+ +[\d.]+\n"),
        ("at 128", r"\nrotary +[\d.]+ +[\d.]+ +[\d.]+ +([\d.]+)\n"),
        ("GQA", r"\nGQA \(2\) +[\d,]+ +([\d.]+) nats"),
        ("MQA", r"\nMQA \(1\) +[\d,]+ +([\d.]+) nats"),
    ),
}


def _floats(pattern: str, printed: str) -> list[float]:
    return [float(x) for x in re.findall(pattern, printed)]


def _slopes(printed: str) -> dict[str, float]:
    """Notebook 09's time slopes per method (section 5), and of full attention (section 1)."""
    out = {name.strip(): float(t) for name, t in
           re.findall(r"\n([\w (),]+?) +slope of time ([\d.e+-]+), of memory", printed)}
    found = re.search(r"slope of time: ([\d.e+-]+)", printed)
    if found:
        out["full attention"] = float(found.group(1))
    return out


def _step_ms(printed: str) -> dict[str, float]:
    """Notebook 09's milliseconds per training step at T = 1024, per attention."""
    return {kind: float(ms) for kind, ms in re.findall(r"\n(full|window|window \+ global) +(\d+) +[\d.]+ +[\d.]+%",
                                                        printed)}


def _kv_speedups(printed: str) -> dict[int, float]:
    return {int(n): float(x) for n, x in re.findall(r"(\d+) new tokens: .*?([\d.]+)x faster", printed)}


# What the notebooks' texts say about time: measured, so never a test (shared machines are
# noisy; the tests check the counted costs beside them), but checked here on what each
# notebook printed, ✓ or ✗ beside its quality: (claim, function of the printed text -> bool).
COST_CLAIMS = {
    "01_rnn_limitations": (
        ("the loop >5x slower than one product at T = 1024",
         lambda out: _floats(r"\(\s*([\d.]+)× slower\)", out)[-1] > 5),
    ),
    "09_efficient_attention": (
        ("full attention's time slope > 1.3", lambda out: _slopes(out)["full attention"] > 1.3),
        ("time slopes: full and tiled > 1.3, window 0.2 below both",
         lambda out: min(_slopes(out)["full (explicit weights)"], _slopes(out)["tiled, block 256"]) > 1.3
         and _slopes(out)["sliding window 64"] < min(_slopes(out)["full (explicit weights)"],
                                                     _slopes(out)["tiled, block 256"]) - 0.2),
        ("KV cache >= 5x faster at 256 tokens, more than at 32",
         lambda out: _kv_speedups(out)[256] >= 5 and _kv_speedups(out)[256] > _kv_speedups(out)[32]),
        ("window + global: a step < half of full attention's",
         lambda out: _step_ms(out)["window + global"] < 0.5 * _step_ms(out)["full"]),
    ),
}


def cost_claims(name: str, printed: str) -> dict[str, str]:
    """``{claim: "✓" | "✗" | "?"}`` for notebook ``name``'s time claims ("?": not printed)."""
    out = {}
    for label, holds in COST_CLAIMS.get(name, ()):
        try:
            out[label] = "✓" if holds(printed) else "✗"
        except (KeyError, IndexError, ValueError):
            out[label] = "?"
    return out


def quality(name: str, printed: str) -> dict[str, str]:
    """``{label: value}`` of what notebook ``name`` printed (a missing line: ``"?"``)."""
    out = {}
    for label, pattern in QUALITY.get(name, ()):
        if callable(pattern):
            out[label] = pattern(printed)
            continue
        found = re.search(pattern, printed, re.M)
        out[label] = found.group(1) if found else "?"
    return out


def run_notebook(path: Path, grading: bool, timeout: int = 900) -> dict:
    """Execute a notebook in a fresh kernel as the tests do (``nbtools.kernel_env``): its
    wall time, its kernel's CPU time, every cell's, what it printed and how many cells raised."""
    import nbformat
    import psutil
    from course_lib.notebook_client import NotebookClient
    from nbtools import all_text, errors, kernel_env

    nb = nbformat.read(str(path), as_version=4)
    cells: list[tuple[int, float, float, str]] = []
    clock: dict = {}

    def kernel_cpu() -> float:
        if "kernel" not in clock:
            clock["kernel"] = psutil.Process(client.km.provisioner.process.pid)
        t = clock["kernel"].cpu_times()
        return t.user + t.system + t.children_user + t.children_system

    def started(cell, cell_index, **_) -> None:
        clock["cell"] = (time.perf_counter(), kernel_cpu())

    def finished(cell, cell_index, **_) -> None:
        wall, cpu = clock["cell"]
        clock["cpu"] = kernel_cpu()
        cells.append((cell_index, time.perf_counter() - wall, clock["cpu"] - cpu, cell.source.split("\n", 1)[0]))

    saved = dict(os.environ)
    os.environ.update({k: v for k, v in kernel_env(grading).items() if k in ("PYTHONPATH", "MPLBACKEND")})
    if grading:
        os.environ["WORKBOOK_GRADING"] = "1"
    else:
        os.environ.pop("WORKBOOK_GRADING", None)
    try:
        with tempfile.TemporaryDirectory(prefix="workbook-bench-") as cwd:
            client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                                    resources={"metadata": {"path": cwd}},
                                    on_cell_execute=started, on_cell_executed=finished)
            start = time.perf_counter()
            client.execute()
            seconds = time.perf_counter() - start
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return {"seconds": seconds, "cpu_seconds": clock.get("cpu", 0.0), "cells": cells,
            "printed": all_text(nb), "errors": len(errors(nb))}


def _number(value: str) -> float | None:
    """The number in a printed value (``"90.0%"``, ``"7.8x"``, ``"0.93"``), or None."""
    found = re.match(r"-?[\d.]+(?:e[+-]?\d+)?", value)
    return float(found.group(0)) if found else None


def print_spread(files: list[str]) -> None:
    """Each claim's lowest and highest value over runs written by ``--json`` (read again from
    what each notebook printed, with this version's patterns)."""
    runs = [json.loads(Path(f).read_text()) for f in files]
    names = sorted({name for run in runs for name in run})
    print(f"spread over {len(files)} runs: " + ", ".join(Path(f).stem for f in files))
    for name in names:
        printed = [run[name]["printed"] for run in runs if isinstance(run.get(name), dict) and "printed" in run[name]]
        if not printed:
            continue
        print(f"\n{name} ({len(printed)} runs)")
        values = [quality(name, text) for text in printed]
        for label, _ in QUALITY.get(name, ()):
            numbers = [n for n in (_number(v[label]) for v in values) if n is not None]
            shown = ", ".join(v[label] for v in values)
            if numbers:
                print(f"  {label:<40} min {min(numbers):>9g}  max {max(numbers):>9g}   ({shown})")
            else:
                print(f"  {label:<40} ({shown})")
        for label, _ in COST_CLAIMS.get(name, ()):
            verdicts = [cost_claims(name, text)[label] for text in printed]
            print(f"  time: {label:<60} " + " ".join(verdicts))


def describe_run_device(choice: str | None) -> str | None:
    """The device the kernels will use, in words (``"cuda (NVIDIA H200)"``), or None when
    ``choice`` is ``"cuda"`` and PyTorch sees no GPU."""
    import torch

    if choice == "cuda" and not torch.cuda.is_available():
        return None
    if choice == "cpu":
        return "cpu"
    if choice == "cuda" or torch.cuda.is_available():
        return f"cuda ({torch.cuda.get_device_name(0)}, PyTorch {torch.__version__})" + (
            "" if choice else ", each notebook's own choice")
    return "cpu" if choice else "each notebook's own choice (no CUDA here)"


def _before(entry) -> float | None:
    """Wall seconds of a ``--json`` entry (this version's dict or an older file's number)."""
    if isinstance(entry, dict):
        return entry.get("seconds")
    return entry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", help="default: every notebook in solutions/")
    parser.add_argument("--grading", action="store_true", help="run as the autograder does (short training)")
    parser.add_argument("--threads", type=int, help="pin every kernel to this many CPU threads")
    parser.add_argument("--cells", type=int, default=0, metavar="K", help="also print each notebook's K slowest cells")
    parser.add_argument("--json", help="write the times to this file")
    parser.add_argument("--compare", help="a file written by --json earlier: show its times beside")
    parser.add_argument("--attention", choices=("fast", "explicit"),
                        help="course_lib's attention fast path on (fast) or off (explicit), for before/after")
    parser.add_argument("--salt", type=int, default=0,
                        help="mix this number into every seed the notebooks set (0: the notebooks as written)")
    parser.add_argument("--optimizer", choices=("fused", "plain"),
                        help="every Adam/AdamW fused, or every one plain (default: as the code asks)")
    parser.add_argument("--device", choices=("cpu", "cuda"),
                        help="the device every kernel uses (WORKBOOK_DEVICE); default: each notebook's own choice")
    parser.add_argument("--spread", nargs="+", metavar="JSON",
                        help="files written by --json: print each claim's lowest and highest value over them")
    args = parser.parse_args(argv)
    if args.spread:
        print_spread(args.spread)
        return 0
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be at least 1")
    device = describe_run_device(args.device)
    if device is None:
        parser.error("--device cuda: PyTorch sees no CUDA device here")
    if args.device:
        os.environ["WORKBOOK_DEVICE"] = args.device
    print(f"device: {device}", flush=True)
    startup = [_STARTUP.format(explicit=args.attention == "explicit")] if args.attention else []
    startup += [_SALT.format(salt=args.salt)] if args.salt else []
    startup += [_OPTIMIZER.format(fused=args.optimizer == "fused")] if args.optimizer else []
    if startup:
        folder = Path(tempfile.mkdtemp(prefix="workbook-bench-"))
        (folder / "sitecustomize.py").write_text("\n".join(startup))
        os.environ["PYTHONPATH"] = str(folder) + os.pathsep + os.environ.get("PYTHONPATH", "")
    if args.threads:
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "WORKBOOK_THREADS"):
            os.environ[name] = str(args.threads)

    from tqdm import tqdm

    names = args.notebooks or sorted(p.name for p in (REPO / "solutions").iterdir()
                                     if (p / f"{p.name}.ipynb").is_file())
    unknown = [n for n in names if not (REPO / "solutions" / n / f"{n}.ipynb").is_file()]
    if unknown:
        parser.error(f"no solution notebook {', '.join(unknown)}")
    before = json.loads(Path(args.compare).read_text()) if args.compare else {}

    runs = {}
    for name in tqdm(names, desc="notebooks", unit="nb"):
        runs[name] = run_notebook(REPO / "solutions" / name / f"{name}.ipynb", grading=args.grading)
        runs[name]["quality"] = quality(name, runs[name]["printed"])

    mode = ("grading mode" if args.grading else "full run") + f", {device}" + (f", {args.threads} threads" if args.threads else "") \
        + (f", {args.attention} attention" if args.attention else "") + (f", salt {args.salt}" if args.salt else "") \
        + (f", {args.optimizer} optimizer" if args.optimizer else "")
    print(f"\nnotebook times ({mode}, {len(names)} notebooks; wall and kernel CPU seconds)")
    print(f"{'notebook':<30}{'wall':>7}{'cpu':>7}{'budget':>8}" + (f"{'before':>8}{'after/before':>14}" if before else ""))
    for name in names:
        run = runs[name]
        budget = GRADING_BUDGET if args.grading else BUDGETS.get(name)
        line = f"{name:<30}{run['seconds']:>7.1f}{run['cpu_seconds']:>7.1f}{budget or '-':>8}"
        if before:
            old = _before(before.get(name))
            line += f"{old:>8.1f}{run['seconds'] / old:>14.2f}" if old else f"{'-':>8}{'-':>14}"
        if run["errors"]:
            line += f"   ({run['errors']} cells raised)"
        if budget and run["seconds"] > budget:
            line += "   OVER BUDGET"
        print(line)
        if not args.grading:
            shown = ", ".join(f"{k} {v}" for k, v in run["quality"].items()) or "-"
            print(textwrap.fill(shown, 120, initial_indent=f"{'':<30}quality: ", subsequent_indent=" " * 39))
            for label, verdict in cost_claims(name, run["printed"]).items():
                print(f"{'':<30}time: {verdict} {label}")
    total = sum(r["seconds"] for r in runs.values())
    print(f"{'all':<30}{total:>7.1f}{sum(r['cpu_seconds'] for r in runs.values()):>7.1f}")
    if args.cells:
        for name in names:
            print(f"\n{name}: the {args.cells} slowest cells (wall, cpu seconds)")
            for index, wall, cpu, first_line in sorted(runs[name]["cells"], key=lambda c: -c[1])[:args.cells]:
                print(f"  cell {index:2d} {wall:7.1f} {cpu:7.1f}  {first_line[:70]}")
    if args.json:
        Path(args.json).write_text(json.dumps({name: {k: v for k, v in run.items()} for name, run in runs.items()},
                                              indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
