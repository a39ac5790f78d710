"""Each solution notebook's time, top to bottom, against its budget, with the quality it reached.

    .venv/bin/python benchmarks/notebook_times.py [NOTEBOOK ...] [--grading] [--threads N] [--cells K]
                                                  [--json OUT] [--compare BEFORE] [--attention fast|explicit]

Every notebook promises a student a run of at most a minute on an idle 2-core laptop CPU
(:data:`BUDGETS`); graded, it must run in well under half a minute (:data:`GRADING_BUDGET`).
For each notebook it prints the wall time, the CPU time of its kernel (user + system, all
threads: on a shared machine the steadier number) and the quality the notebook reached, read
from the lines it printed (the same lines its tests read), so that a faster notebook that
learns less shows at once. The test suite checks what the notebooks show, never how long
they take (shared machines are noisy); this is where the time is measured.

- ``--grading`` runs the notebooks as the autograder does (``WORKBOOK_GRADING=1``: short
  training; the autograder gives each kernel one thread, see ``--threads``).
- ``--threads N`` pins every kernel to ``N`` CPU threads: OpenMP's and PyTorch's, and
  course_lib's thread choice for small models (``WORKBOOK_THREADS``, see
  ``course_lib.device.threads_for``), for the thread study of docs/threads.md.
- ``--cells K`` also prints each notebook's ``K`` slowest cells (wall and CPU seconds).
- ``--json`` keeps the numbers; ``--compare`` prints an earlier run's beside them (before
  and after a change; files of earlier versions, which kept wall times only, are read too).
- ``--attention explicit`` turns course_lib's attention fast path off in the kernels (every
  course model computes its ``(T, T)`` weights, as before the fast path); with
  ``--attention fast`` (the same start-up, path left on) it gives the fast path's before and
  after::

      benchmarks/notebook_times.py --attention explicit --json before.json
      benchmarks/notebook_times.py --attention fast --compare before.json

Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
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

# What each notebook reached, as it printed it: (label, pattern whose group 1 is the value).
QUALITY = {
    "01_rnn_limitations": (
        ("exact match at length 4", r"length\s+4: exact match\s+([\d.]+%)"),
        ("at 20", r"length 20: exact match\s+([\d.]+%)"),
        ("c read back: first 4", r"context readout: first 4 positions ([\d.]+%)"),
        ("last 4", r"context readout: .*last 4 positions ([\d.]+%)"),
    ),
    "02_bahdanau_attention": (
        ("dates exact match, attention", r"held-out exact match \(attention\): ([\d.]+%)"),
        ("fixed context", r"held-out exact match \(fixed context\): ([\d.]+%)"),
    ),
    "03_self_attention": (
        ("difference from PyTorch's kernel", r"largest difference from PyTorch's kernel: ([\d.e+-]+)"),
    ),
    "04_multi_head_attention": (
        ("held-out accuracy", r"held-out accuracy \(both digits right\): ([\d.]+%)"),
    ),
    "05_positional_encoding": (
        ("sorted? none", r"^\s+none: ([\d.]+%)"),
        ("sinusoidal", r"^\s+sinusoidal: ([\d.]+%)"),
        ("learned", r"^\s+learned: ([\d.]+%)"),
        ("relative", r"^\s+relative: ([\d.]+%)"),
    ),
    "06_transformer": (
        ("BLEU greedy", r"held-out BLEU \(greedy\): ([\d.]+)"),
        ("beam", r"held-out BLEU \(beam 4\): ([\d.]+)"),
        ("loss post-LN", r"post-LN final loss \(mean of the last 20 steps\): ([\d.]+)"),
        ("pre-LN", r"pre-LN\s+final loss \(mean of the last 20 steps\): ([\d.]+)"),
    ),
    "07_bert_mlm_nsp": (
        ("MLM", r"held-out MLM accuracy: ([\d.]+%)"),
        ("unigram", r"unigram baseline, always '[^']+': ([\d.]+%)"),
        ("NSP", r"held-out NSP accuracy: ([\d.]+%)"),
        ("NSP curve", r"NSP accuracy during pre-training: (\d+: \d+%, \d+: \d+%)"),
        ("fine-tuned", r"pre-trained\s*: ([\d.]+%)"),
        ("scratch", r"from scratch\s*: ([\d.]+%)"),
    ),
    "08_gpt_in_context_learning": (
        ("ICL K=0", r"K =  0: transformer ([\d.]+%)"),
        ("K=1", r"K =  1: transformer ([\d.]+%)"),
        ("K=16", r"K = 16: transformer ([\d.]+%)"),
        ("repeat loss 2 layers", r"2-layer model: .*?([\d.]+) nats on the repeat"),
        ("1 layer", r"1-layer model: .*?([\d.]+) nats on the repeat"),
    ),
    "09_efficient_attention": (
        ("KV cache at 256 tokens", r"256 new tokens: .*?([\d.]+x) faster"),
        ("T = 1024: full", r"\nfull +\d+ +([\d.]+%)"),
        ("window", r"\nwindow +\d+ +([\d.]+%)"),
        ("window + global", r"\nwindow \+ global +\d+ +([\d.]+%)"),
    ),
    "10_attention_over_images": (
        ("captions exactly right", r"unseen scenes: captions exactly right ([\d.]+%)"),
        ("pointing", r"pointing accuracy of the captioner: +([\d.]+%)"),
        ("ViT", r"\nViT with positions +[\d,]+ +([\d.]+%)"),
        ("without positions", r"\nViT without positions +[\d,]+ +([\d.]+%)"),
        ("CNN", r"\nCNN \(same size\) +[\d,]+ +([\d.]+%)"),
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


def quality(name: str, printed: str) -> dict[str, str]:
    """``{label: value}`` of what notebook ``name`` printed (a missing line: ``"?"``)."""
    out = {}
    for label, pattern in QUALITY.get(name, ()):
        found = re.search(pattern, printed, re.M)
        out[label] = found.group(1) if found else "?"
    return out


def run_notebook(path: Path, grading: bool, timeout: int = 900) -> dict:
    """Execute a notebook in a fresh kernel as the tests do (``nbtools.kernel_env``): its
    wall time, its kernel's CPU time, every cell's, what it printed and how many cells raised."""
    import nbformat
    import psutil
    from nbclient import NotebookClient
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
    args = parser.parse_args(argv)
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be at least 1")
    if args.attention:
        startup = Path(tempfile.mkdtemp(prefix="workbook-bench-"))
        (startup / "sitecustomize.py").write_text(_STARTUP.format(explicit=args.attention == "explicit"))
        os.environ["PYTHONPATH"] = str(startup) + os.pathsep + os.environ.get("PYTHONPATH", "")
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

    mode = ("grading mode" if args.grading else "full run") + (f", {args.threads} threads" if args.threads else "") \
        + (f", {args.attention} attention" if args.attention else "")
    print(f"\nnotebook times ({mode}, {len(names)} notebooks; wall and kernel CPU seconds)")
    print(f"{'notebook':<30}{'wall':>7}{'cpu':>7}{'budget':>8}" + (f"{'before':>8}{'after/before':>14}" if before else "")
          + "   quality reached")
    for name in names:
        run = runs[name]
        budget = GRADING_BUDGET if args.grading else BUDGETS.get(name)
        line = f"{name:<30}{run['seconds']:>7.1f}{run['cpu_seconds']:>7.1f}{budget or '-':>8}"
        if before:
            old = _before(before.get(name))
            line += f"{old:>8.1f}{run['seconds'] / old:>14.2f}" if old else f"{'-':>8}{'-':>14}"
        shown = run["quality"] if not args.grading else {}
        line += "   " + (", ".join(f"{k} {v}" for k, v in shown.items()) or "-")
        if run["errors"]:
            line += f"   ({run['errors']} cells raised)"
        if budget and run["seconds"] > budget:
            line += "   OVER BUDGET"
        print(line)
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
