"""A regrade against the first grading: ``workbook regrade`` of N submissions of notebook 03
after a fix to the course, against ``workbook autograde`` of the same submissions the first
time, in the same run.

    PYTHONPATH=. .venv/bin/python benchmarks/regrade.py [--submissions 100] [--workers 2]

It builds a throw-away course with notebook 03 released and ``--submissions`` submissions
(correct, partial and empty ones, as tests/workbook_class.py makes them), grades
them (``autograde``), then regrades them with the course's grader tolerance loosened (a copy of
course_lib first on PYTHONPATH, as an instructor's fixed checkout would be). It prints both wall
times, the ratio, and what the regrade reported. A regrade does the first grading's work (every
notebook runs again, sealed off) plus reading the points before and after and writing its
report: the ratio should stay near 1. The machine should be otherwise idle. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from autograder.course import Course
from workbook_class import ClassBuilder, make_course

NOTEBOOK = "03_self_attention"


def _workbook(root: Path, args: list[str], library: Path | None = None) -> tuple[float, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(([str(library)] if library else []) + [str(REPO)])
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "autograder.cli", "--course", str(root), *args], env=env, cwd=root,
                          capture_output=True, text=True)
    if done.returncode:
        sys.exit(done.stdout + done.stderr)
    return time.perf_counter() - started, done.stdout


def _loosened(base: Path) -> Path:
    root = base / "fixed"
    shutil.copytree(REPO / "course_lib", root / "course_lib", ignore=shutil.ignore_patterns("__pycache__"))
    compare = root / "course_lib" / "grading" / "judge" / "compare.py"
    text = compare.read_text()
    text = text.replace("torch.float32: (1e-5, 1e-4)", "torch.float32: (1e-4, 1e-3)")
    compare.write_text(text)
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--submissions", type=int, default=100)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="workbook-regrade-bench-"))
    try:
        root, assignment = make_course(base / "course", NOTEBOOK)
        _workbook(root, ["release", assignment])
        course = Course(root)
        builder = ClassBuilder(course.release_dir / assignment / f"{NOTEBOOK}.ipynb",
                               course.source_dir / assignment / f"{NOTEBOOK}.ipynb")
        kinds = [builder.filled(), builder.filled(skip=("causal_mask",)), builder.released]  # correct, partial, empty
        for k in range(args.submissions):
            folder = course.submission_dir(f"s{k:03d}", assignment)
            folder.mkdir(parents=True)
            nbformat.write(kinds[k % len(kinds)], str(folder / f"{NOTEBOOK}.ipynb"))
        limits = ["-j", str(args.workers), "--quiet", "--memory-mb", "2048"]
        first, _ = _workbook(root, ["autograde", assignment, *limits])
        again, said = _workbook(root, ["regrade", assignment, *limits], library=_loosened(base))
        print(f"{args.submissions} submissions of {NOTEBOOK}, {args.workers} workers")
        print(f"  autograde, the first time   {first:7.1f} s")
        print(f"  regrade after a fix          {again:7.1f} s   ({again / first:.2f}× the first grading)")
        print("  " + said.splitlines()[0])
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
