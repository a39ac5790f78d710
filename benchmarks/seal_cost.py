"""What sealing one notebook costs: CPU-seconds per sealed run, a fresh bubblewrap sandbox per
notebook against a child forked from a pre-imported zygote, in the same run.

    sudo .venv/bin/python benchmarks/seal_cost.py [--runs 6]

A small notebook (torch, matplotlib, IPython's display, course_lib's attention, one plot) is
graded ``--runs`` times each way through the real grader (autograder.pipeline.worker.grade_notebook:
the seal, the runner, the plans and the judgement). The CPU is counted by a cgroup around the
grader and everything it starts: bubblewrap's monitor exits without reaping, so
``getrusage(RUSAGE_CHILDREN)`` misses most of a sandbox's CPU. The first run of each way is
left out (it starts the zygote, or fills the disk cache); the zygote's own start is reported
apart. The grader must run as root (the zygote needs it; cgroups are root's); without a
writable cgroup the wall time is all it reports. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

NOTEBOOK_CELLS = [
    "import torch\nimport matplotlib.pyplot as plt\nfrom IPython.display import display, Markdown\n"
    "from course_lib.attention import scaled_dot_product_attention",
    "q = torch.randn(2, 4, 16, 8)\nout, w = scaled_dot_product_attention(q, q, q)\nprint(out.shape, float(w.sum()))",
    "plt.plot(w[0, 0, 0].numpy())\nplt.show()\ndisplay(Markdown('**done**'))",
]

CHILD = r'''
import json, os, sys, time
from pathlib import Path
import nbformat
from autograder.sealing import sandbox
from autograder.sealing.course_copy import build_course_copy
from autograder.pipeline.worker import grade_notebook, worker_zygotes
mode, runs, folder = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
cells = json.loads(sys.argv[4])
copy = build_course_copy(folder / "course", [])
nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
job = {"notebook": nbformat.writes(nb), "limits": sandbox.Limits().__dict__.copy(), "salts": {}, "extra_files": [],
       "job_id": "bench"}
zygotes = worker_zygotes() if mode == "zygote" else None
usage = Path(sys.argv[5]) if sys.argv[5] != "-" else None
def cpu():
    if usage is None:
        return 0.0
    text = usage.read_text()
    return int(text.split()[1]) / 1e6 if usage.name == "cpu.stat" else int(text) / 1e9
times = []
for i in range(runs + 1):
    c0, t0 = cpu(), time.monotonic()
    result = grade_notebook(job, copy, folder / f"job{i}", uid=sandbox.SANDBOX_UID_BASE + 7, zygotes=zygotes)
    times.append((cpu() - c0, time.monotonic() - t0, result.get("seal", {}).get("how", "")))
    assert not result.get("crash"), result
started = zygotes.current.imported_s if zygotes and zygotes.current else 0.0
print(json.dumps({"runs": times, "zygote_import_s": started}))
if zygotes:
    zygotes.close()
'''


def _cgroup() -> tuple[Path, Path] | None:
    """A fresh cgroup for the measured process: (its folder, the file that counts its CPU):
    cgroup v2's ``cpu.stat`` (at /sys/fs/cgroup, or /sys/fs/cgroup/unified beside v1), else
    v1's ``cpuacct.usage``; None where none can be made."""
    for root, counter in ((Path("/sys/fs/cgroup"), "cpu.stat"), (Path("/sys/fs/cgroup/unified"), "cpu.stat"),
                          (Path("/sys/fs/cgroup/cpuacct"), "cpuacct.usage")):
        folder = root / f"workbook-bench-{os.getpid()}"
        try:
            folder.mkdir()
        except OSError:
            continue
        if (folder / counter).exists():
            return folder, folder / counter
        folder.rmdir()
    return None


def measure(mode: str, runs: int, base: Path) -> dict:
    group = _cgroup()
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-c", CHILD, mode, str(runs), str(base / mode), json.dumps(NOTEBOOK_CELLS),
                             str(group[1]) if group else "-"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=(lambda: (group[0] / "cgroup.procs").write_text(str(os.getpid())))
                            if group else None)
    out, err = proc.communicate()
    if group:
        for _ in range(50):  # the group empties once the last sandbox process is gone
            try:
                group[0].rmdir()
                break
            except OSError:
                time.sleep(0.1)
    if proc.returncode != 0:
        raise SystemExit(f"{mode}: the grader failed:\n{err[-3000:]}")
    data = json.loads(out.strip().splitlines()[-1])
    steady = data["runs"][1:]
    return {"cpu_s": sum(r[0] for r in steady) / len(steady) if group else None,
            "wall_s": sum(r[1] for r in steady) / len(steady), "first_wall_s": data["runs"][0][1],
            "how": steady[0][2], "zygote_import_s": data["zygote_import_s"], "counted": bool(group)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--out", help="also write the numbers as JSON here")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("note: not root: no zygote (it needs root) and no cgroup; both runs are fresh sandboxes", file=sys.stderr)
    base = Path(tempfile.mkdtemp(prefix="workbook-seal-bench-"))
    base.chmod(0o711)
    try:
        report = {mode: measure(mode, args.runs, base) for mode in ("fresh", "zygote")}
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"a small notebook graded {args.runs} times each way (the first run left out), {os.cpu_count()} CPUs")
    for mode, r in report.items():
        cpu = f"{r['cpu_s']:.2f} CPU-s" if r["cpu_s"] is not None else "CPU not counted"
        print(f"  {mode:<7} {cpu} and {r['wall_s']:.2f} s a run ({r['how']}); first run {r['first_wall_s']:.2f} s")
    if report["zygote"]["zygote_import_s"]:
        print(f"  the zygote imported everything in {report['zygote']['zygote_import_s']:.2f} s, once")
    fresh, forked = report["fresh"], report["zygote"]
    if fresh["cpu_s"] and forked["cpu_s"]:
        print(f"  a forked run costs {forked['cpu_s'] / fresh['cpu_s']:.2f}x the CPU of a fresh one "
              f"({fresh['cpu_s'] - forked['cpu_s']:+.2f} CPU-s saved a run)")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
