"""Each solution notebook's peak memory, top to bottom in a fresh kernel: what a per-user
memory limit on a hub (The Littlest JupyterHub, Zero to JupyterHub) must leave room for.

    .venv/bin/python benchmarks/notebook_memory.py [NOTEBOOK ...] [--grading] [--json OUT]

For each notebook it reports the kernel's peak resident memory (``VmHWM`` in
``/proc/<pid>/status``: the high-water mark the Linux kernel keeps, so no peak is missed
between samples), the kernel's resident memory just after start-up, and the largest
resident memory of the kernel together with any processes it started (sampled after every
cell). Notebooks run as a student runs them (full training, torch's default threads), on
the CPU (``CUDA_VISIBLE_DEVICES`` empty). Linux only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

MB = 2**20


def _status_kb(pid: int, field: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _tree_rss_kb(pid: int) -> int:
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss // 1024
        except psutil.Error:
            pass
    return total


def measure(path: Path, grading: bool = False, timeout: int = 1800) -> dict:
    """Run one notebook; return its peak memory (MiB) and wall time."""
    import nbformat
    from course_lib.notebook_client import NotebookClient

    from nbtools import kernel_env

    nb = nbformat.read(str(path), as_version=4)
    env = kernel_env(grading)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU, as on a hub without GPUs
    seen = {"pid": None, "start_kb": 0, "tree_kb": 0, "hwm_kb": 0}

    def started(**_):
        seen["pid"] = client.km.provisioner.process.pid
        seen["start_kb"] = _status_kb(seen["pid"], "VmRSS")

    def after_cell(**_):
        if seen["pid"]:
            seen["tree_kb"] = max(seen["tree_kb"], _tree_rss_kb(seen["pid"]))
            seen["hwm_kb"] = max(seen["hwm_kb"], _status_kb(seen["pid"], "VmHWM"))

    with tempfile.TemporaryDirectory(prefix="workbook-memory-") as cwd:
        client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                                resources={"metadata": {"path": cwd}}, on_notebook_start=started,
                                on_cell_executed=after_cell, on_notebook_complete=after_cell)
        saved = dict(os.environ)
        os.environ.clear()
        os.environ.update(env)
        try:
            start = time.perf_counter()
            client.execute()
            seconds = time.perf_counter() - start
        finally:
            os.environ.clear()
            os.environ.update(saved)
    errors = sum(o.get("output_type") == "error" for c in nb.cells for o in c.get("outputs", []))
    return {"peak_mib": round(seen["hwm_kb"] / 1024), "start_mib": round(seen["start_kb"] / 1024),
            "tree_peak_mib": round(seen["tree_kb"] / 1024), "seconds": round(seconds, 1), "errors": errors}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", help="default: every notebook in solutions/")
    parser.add_argument("--grading", action="store_true", help="run as the autograder does (short training)")
    parser.add_argument("--json", help="write the numbers to this file (updated after each notebook)")
    args = parser.parse_args(argv)
    names = args.notebooks or sorted(p.name for p in (REPO / "solutions").iterdir()
                                     if (p / f"{p.name}.ipynb").is_file())
    unknown = [n for n in names if not (REPO / "solutions" / n / f"{n}.ipynb").is_file()]
    if unknown:
        parser.error(f"no solution notebook {', '.join(unknown)}")
    results = {}
    print(f"{'notebook':<30}{'peak MiB':>10}{'at start':>10}{'with children':>15}{'seconds':>9}", flush=True)
    for name in names:
        r = measure(REPO / "solutions" / name / f"{name}.ipynb", grading=args.grading)
        results[name] = r
        print(f"{name:<30}{r['peak_mib']:>10}{r['start_mib']:>10}{r['tree_peak_mib']:>15}{r['seconds']:>9.1f}"
              + (f"   ({r['errors']} cells raised)" if r["errors"] else ""), flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
