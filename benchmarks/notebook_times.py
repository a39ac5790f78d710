"""Each solution notebook's wall time, top to bottom, against its time budget.

    .venv/bin/python benchmarks/notebook_times.py [NOTEBOOK ...] [--grading] [--json OUT] [--compare BEFORE]
                                                  [--attention fast|explicit]

The budgets are what each notebook promises a student on a 2-core laptop CPU. The test
suite checks what the notebooks show, never how long they take (shared machines are
noisy); this is where the time is measured. ``--json`` keeps the numbers, ``--compare``
prints them beside an earlier run's (e.g. before and after a change to course_lib).
``--grading`` runs the notebooks as the autograder does (``WORKBOOK_GRADING=1``: short
training). ``--attention explicit`` turns course_lib's attention fast path off in the
kernels (every course model computes its ``(T, T)`` weights, as before the fast path):
with ``--attention fast`` (the same start-up, path left on) it gives the fast path's
before and after::

    benchmarks/notebook_times.py --attention explicit --json before.json
    benchmarks/notebook_times.py --attention fast --compare before.json

Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
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

# seconds, top to bottom on a quiet 2-core CPU
BUDGETS = {
    "01_rnn_limitations": 180,
    "02_bahdanau_attention": 180,
    "03_self_attention": 120,
    "04_multi_head_attention": 180,
    "05_positional_encoding": 180,
    "06_transformer": 240,
    "07_bert_mlm_nsp": 240,
    "08_gpt_in_context_learning": 240,
    "09_efficient_attention": 120,
    "10_attention_over_images": 60,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", help="default: every notebook in solutions/")
    parser.add_argument("--grading", action="store_true", help="run as the autograder does (short training)")
    parser.add_argument("--json", help="write the times to this file")
    parser.add_argument("--compare", help="a file written by --json earlier: show its times beside")
    parser.add_argument("--attention", choices=("fast", "explicit"),
                        help="course_lib's attention fast path on (fast) or off (explicit), for before/after")
    args = parser.parse_args(argv)
    if args.attention:
        startup = Path(tempfile.mkdtemp(prefix="workbook-bench-"))
        (startup / "sitecustomize.py").write_text(_STARTUP.format(explicit=args.attention == "explicit"))
        os.environ["PYTHONPATH"] = str(startup) + os.pathsep + os.environ.get("PYTHONPATH", "")

    from tqdm import tqdm
    from nbtools import execute

    names = args.notebooks or sorted(p.name for p in (REPO / "solutions").iterdir()
                                     if (p / f"{p.name}.ipynb").is_file())
    unknown = [n for n in names if not (REPO / "solutions" / n / f"{n}.ipynb").is_file()]
    if unknown:
        parser.error(f"no solution notebook {', '.join(unknown)}")
    before = json.loads(Path(args.compare).read_text()) if args.compare else {}

    times, errors = {}, {}
    for name in tqdm(names, desc="notebooks", unit="nb"):
        nb, seconds = execute(REPO / "solutions" / name / f"{name}.ipynb", timeout=900, grading=args.grading)
        times[name] = seconds
        errors[name] = sum(o.get("output_type") == "error" for c in nb.cells for o in c.get("outputs", []))

    mode = ("grading mode" if args.grading else "full run") + (f", {args.attention} attention" if args.attention else "")
    print(f"\nnotebook wall times ({mode}, {len(names)} notebooks)")
    print(f"{'notebook':<30}{'seconds':>9}{'budget':>8}{'share':>8}" + (f"{'before':>9}{'after/before':>14}" if before else ""))
    for name in names:
        budget = BUDGETS.get(name)
        share = f"{times[name] / budget:.0%}" if budget and not args.grading else "-"
        line = f"{name:<30}{times[name]:>9.1f}{(budget or 0) if not args.grading else '-':>8}{share:>8}"
        if before:
            old = before.get(name)
            line += f"{old:>9.1f}{times[name] / old:>14.2f}" if old else f"{'-':>9}{'-':>14}"
        if errors[name]:
            line += f"   ({errors[name]} cells raised)"
        if budget and not args.grading and times[name] > budget:
            line += "   OVER BUDGET"
        print(line)
    if args.json:
        Path(args.json).write_text(json.dumps(times, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
