"""Run a notebook top to bottom in a kernel of *this* interpreter and print what its graded
test cells scored, as JSON. Tests run it with another Python's virtual environment
(tests/grading/test_python_versions.py), so it needs nothing but nbclient and nbformat:

    python tests/run_notebook.py NOTEBOOK.ipynb [--cwd FOLDER] [--timeout SECONDS]

prints ``{"seconds": …, "errors": ["cell N: Name: message", …], "python": "3.12.1",
"graded": {"test_<item>": {"points": 2.0, "score": 2.0, "stderr": "", "text": "…"}}}``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time

import nbformat
from nbclient import NotebookClient


def summary(nb: nbformat.NotebookNode) -> dict:
    errors, graded = [], {}
    for i, cell in enumerate(nb.cells):
        outputs = cell.get("outputs", [])
        errors += [f"cell {i}: {o.ename}: {o.evalue}" for o in outputs if o.output_type == "error"]
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.cell_type == "code" and meta.get("grade") and not meta.get("solution"):
            result = next((o.data.get("text/plain") for o in outputs if o.output_type == "execute_result"), None)
            graded[meta["grade_id"]] = {
                "points": float(meta.get("points", 0)),
                "score": None if result is None else float(result),
                "stderr": "".join(o.text for o in outputs if o.output_type == "stream" and o.name == "stderr"),
                "text": "".join(o.get("text", "") for o in outputs if o.output_type == "stream"),
            }
    return {"errors": errors, "graded": graded}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("notebook")
    parser.add_argument("--cwd", help="the kernel's working folder (default: a new temporary one)")
    parser.add_argument("--timeout", type=int, default=600, help="per cell, in seconds")
    args = parser.parse_args(argv)
    nb = nbformat.read(args.notebook, as_version=4)
    with tempfile.TemporaryDirectory(prefix="workbook-run-") as scratch:
        client = NotebookClient(nb, timeout=args.timeout, kernel_name="python3", allow_errors=True,
                                resources={"metadata": {"path": args.cwd or scratch}})
        start = time.perf_counter()
        client.execute()
        seconds = time.perf_counter() - start
    print(json.dumps({"seconds": round(seconds, 1), "python": platform.python_version(),
                      "executable": sys.executable, **summary(nb)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
