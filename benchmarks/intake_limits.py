"""What the largest notebook a student may hand in costs the instructor's side, and what one
just over the limits costs (it is refused before it is parsed).

For each shape of notebook at the limits of ``c.Intake`` (autograder/doors/intake.py) — the most
bytes, the most cells, the deepest JSON, the most JSON values — and for the same shape one
step over, each in a fresh process: reading it as ``collect`` and ``autograde`` do
(:func:`autograder.doors.intake.read_notebook`), and, for the accepted ones, rendering its
feedback page as ``workbook feedback`` does (the sanitising exporter with the page budget).
Printed: wall time and peak memory of the process, beside the course's own notebook 03 as
the baseline measured in the same run.

    PYTHONPATH=. .venv/bin/python benchmarks/intake_limits.py [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MEASURE = r"""
import json, re, sys, time
from pathlib import Path

def peak_mb():  # this process's own peak (ru_maxrss would include the parent's, carried over at exec)
    return int(re.search(r"VmHWM:\s*(\d+)", Path("/proc/self/status").read_text()).group(1)) / 1024

start = time.perf_counter()
from autograder.doors import intake
data = Path(sys.argv[1]).read_bytes()
try:
    nb, _ = intake.read_notebook(data, "nb.ipynb")
    outcome = "accepted"
except intake.Refused as exc:
    nb, outcome = None, "refused: " + str(exc)[:60]
read = time.perf_counter() - start
page = 0
if nb is not None and sys.argv[2] == "page":
    from traitlets.config import Config
    from autograder.reports.feedback import SafeOutputs
    from autograder.doors.outbound import SafeHTMLExporter
    cfg = Config()
    cfg.SafeOutputs.budget_mb = 5.0
    exporter = SafeHTMLExporter(config=cfg, template_name="classic")
    exporter.register_preprocessor(SafeOutputs(config=cfg), enabled=True)
    page = len(exporter.from_notebook_node(nb)[0])
print(json.dumps({"outcome": outcome, "read_s": read, "total_s": time.perf_counter() - start,
                  "peak_mb": peak_mb(), "page_mb": page / 2**20}))
"""


def _notebook(cells: list[str], metadata: str = "{}") -> bytes:
    return ('{"nbformat": 4, "nbformat_minor": 5, "metadata": %s, "cells": [%s]}' % (metadata, ",".join(cells))).encode()


def _markdown(i: int, text: str) -> str:
    return json.dumps({"cell_type": "markdown", "id": f"c{i}", "metadata": {}, "source": text})


def shapes(limits) -> dict[str, tuple[bytes, bytes]]:
    """``{shape: (at the limit, one step over)}``."""
    import base64
    import os

    def of_bytes(n: int) -> bytes:
        text = base64.b64encode(os.urandom(n * 3 // 4)).decode()
        return _notebook([_markdown(0, text)])

    def of_cells(n: int) -> bytes:
        per = limits.notebook_bytes // (n + 1) - 80
        return _notebook([_markdown(i, "w " * (per // 2)) for i in range(n)])

    def of_depth(n: int) -> bytes:  # the notebook and its metadata are two levels
        return _notebook([_markdown(0, "deep")], '{"x": %s}' % ("[" * (n - 2) + "]" * (n - 2)))

    def of_values(n: int) -> bytes:
        from autograder.doors.intake import IntakeLimits, scan_json
        around = scan_json(_notebook([_markdown(0, "wide")], '{"x": [1]}'), IntakeLimits(json_values=10**9))["values"]
        return _notebook([_markdown(0, "wide")], '{"x": [%s]}' % ",".join("1" * (n - around + 1)))

    size = limits.notebook_bytes
    return {"bytes": (of_bytes(size - 4096), of_bytes(size + 4096)),
            "cells": (of_cells(limits.cells), of_cells(limits.cells + 1)),
            "depth": (of_depth(limits.json_depth), of_depth(limits.json_depth + 1)),
            "values": (of_values(limits.json_values), of_values(limits.json_values + 1))}


def measure(data: bytes, folder: Path, page: bool) -> dict:
    path = folder / "nb.ipynb"
    path.write_bytes(data)
    proc = subprocess.run([sys.executable, "-c", MEASURE, str(path), "page" if page else "read"],
                          capture_output=True, text=True, cwd=ROOT, timeout=900)
    if proc.returncode:
        return {"outcome": "crashed: " + proc.stderr.strip().splitlines()[-1][:80], "read_s": 0, "total_s": 0,
                "peak_mb": 0, "page_mb": 0}
    return json.loads(proc.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from autograder.doors.intake import IntakeLimits

    limits = IntakeLimits()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        baseline = (ROOT / "notebooks" / "03_self_attention" / "03_self_attention.ipynb").read_bytes()
        rows.append(("notebook 03 (baseline)", len(baseline), measure(baseline, folder, True)))
        for shape, (at, over) in shapes(limits).items():
            rows.append((f"{shape}: at the limit", len(at), measure(at, folder, True)))
            rows.append((f"{shape}: one over", len(over), measure(over, folder, False)))
    base = rows[0][2]
    print(f"{'notebook':26} {'MB':>6} {'outcome':28} {'read s':>7} {'all s':>7} {'peak MB':>8} {'x base':>6} "
          f"{'page MB':>7}")
    for name, size, r in rows:
        print(f"{name:26} {size / 2**20:6.2f} {r['outcome'][:28]:28} {r['read_s']:7.2f} {r['total_s']:7.2f} "
              f"{r['peak_mb']:8.0f} {r['peak_mb'] / max(base['peak_mb'], 1):6.2f} {r['page_mb']:7.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps([{"notebook": n, "bytes": s, **r} for n, s, r in rows], indent=1))


if __name__ == "__main__":
    main()
