"""What a Gradescope container needs to grade notebook 03 in container mode: peak memory
and wall time, measured the way Gradescope runs the autograder.

    PYTHONPATH=.:tests .venv/bin/python benchmarks/gradescope_container.py [--cpus 0.5]
        [--memory-mb 768 1024 1536] [--venv DIR] [--repeats 1] [--notebook 03_self_attention]
        [--submissions correct mistake empty]

Builds the autograder zip of notebook 03 (``workbook gradescope``), runs its setup.sh into a
fresh virtual environment (or reuses ``--venv``, where setup.sh only checks it), then grades
a correct, a mistaken and an empty submission with run_autograder in a control group of its
own, with the CPU share of a Gradescope container (``--cpus``, default 0.5) and, for each
``--memory-mb``, that memory limit (none: unlimited, measured). For every run it prints the
score, the wall time, the group's peak memory (page cache included: what the kernel charges
the container), the sampled peak of anonymous memory (what a limit cannot reclaim), the
sampled peak of all the run's processes' proportional set sizes, and the out-of-memory kills. Needs root (control groups, the student's user).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from gradescope_box import AutograderBox, Limits
from workbook_class import ClassBuilder, make_course

from autograder.cli import main as workbook
from autograder.course import Course

METADATA = {"id": 1, "created_at": "2026-11-20T10:00:00.000000+00:00",
            "assignment": {"due_date": "2026-11-21T10:00:00.000000+00:00", "late_due_date": None},
            "users": [{"email": "student@example.edu", "id": 101, "name": "A Student"}], "previous_submissions": []}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--notebook", default="03_self_attention", help="the assignment (default: notebook 03)")
    parser.add_argument("--cpus", type=float, default=0.5)
    parser.add_argument("--memory-mb", type=int, nargs="*", default=[], help="limits to try (besides none)")
    parser.add_argument("--venv", type=Path, help="a virtual environment setup.sh made before (reused)")
    parser.add_argument("--user", default="wbgs-bench")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--submissions", nargs="*", default=["correct", "mistake", "empty"],
                        choices=["correct", "mistake", "empty"])
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="workbook-gradescope-bench-") as tmp:
        root, assignment = make_course(Path(tmp) / "course", args.notebook)
        course = Course(root)
        assert workbook(["--course", str(root), "release", assignment]) == 0
        zip_path = Path(tmp) / "autograder.zip"
        assert workbook(["--course", str(root), "gradescope", assignment, "-o", str(zip_path)]) == 0
        builder = ClassBuilder(course.release_dir / assignment / f"{assignment}.ipynb",
                               course.source_dir / assignment / f"{assignment}.ipynb")
        made = {"correct": builder.filled, "mistake": lambda: builder.mistake_student("m").notebook,
                "empty": lambda: builder.released}
        submissions = {name: made[name]() for name in args.submissions}
        box = AutograderBox(zip_path, args.user, args.venv)
        try:
            proc = box.setup()
            if proc.returncode != 0:
                print(box.setup_output[-3000:])
                return 1
            print(f"{'submission':10} {'memory limit':>12} {'score':>6} {'wall s':>7} {'peak MB':>8} "
                  f"{'anon MB':>8} {'PSS MB':>7} {'OOM kills':>9}")
            for limit in [None, *args.memory_mb]:
                for name, nb in submissions.items():
                    for _ in range(args.repeats):
                        got = box.submit({f"{assignment}.ipynb": nbformat.writes(nb).encode()}, METADATA,
                                         Limits(cpus=args.cpus, memory_mb=limit))
                        print(f"{name:10} {str(limit or 'none'):>12} {got.results['score']:6g} {got.seconds:7.1f} "
                              f"{got.peak_mb:8.0f} {got.peak_rss_mb:8.0f} {got.peak_pss_mb:7.0f} {got.oom_kills:9d}",
                              flush=True)
        finally:
            box.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
