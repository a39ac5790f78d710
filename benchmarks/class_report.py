"""Class report speed: ``workbook report`` on a generated class of N gradings.

    PYTHONPATH=. .venv/bin/python benchmarks/class_report.py [--gradings 1000]

Builds a throw-away course with notebook 03 released and N generated students, each
with a planted mistake (tests/report_class.py: real judgements of catalogued and
uncatalogued implementations, written to the gradebook and the reports), then times
``workbook report`` (the whole command, start-up included) with and without
``--names``, against a baseline measured in the same run: ``workbook status`` on the
same course (a command that reads the same gradebook and reports). Target: the report
for 1,000 gradings in under 5 s on a laptop.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO)]


def _timed(cmd: list[str], env: dict) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gradings", type=int, default=1000)
    args = parser.parse_args()

    from autograder.course import Course as GradedCourse
    from nbtools import Course, kernel_env
    from report_class import ASSIGNMENT, write_class

    course = Course([ASSIGNMENT])
    try:
        course.workbook("release", ASSIGNMENT)
        start = time.perf_counter()
        write_class(GradedCourse(course.root), args.gradings)
        print(f"generated {args.gradings} gradings in {time.perf_counter() - start:.1f} s (setup, not timed)")
        env = kernel_env(grading=False)
        base = [sys.executable, "-m", "autograder.cli", "--course", str(course.root)]
        out = course.root / "report"
        rows = [("workbook status (baseline)", _timed(base + ["status"], env)),
                ("workbook report", _timed(base + ["report", "-o", str(out)], env)),
                ("workbook report --names", _timed(base + ["report", "--names", "-o", str(out)], env))]
        size = sum(p.stat().st_size for p in out.iterdir())
        baseline = rows[0][1]
        print(f"\n{'command':32s} {'wall s':>8s} {'vs status':>10s}")
        for name, seconds in rows:
            print(f"{name:32s} {seconds:8.2f} {seconds / baseline:9.2f}x")
        verdict = "meets" if rows[1][1] < 5.0 else "misses"
        print(f"\n{args.gradings} gradings: the report takes {rows[1][1]:.2f} s ({verdict} the 5 s target); "
              f"its files total {size / 1e6:.1f} MB")
    finally:
        course.close()


if __name__ == "__main__":
    os.environ.setdefault("MPLBACKEND", "Agg")
    main()
