"""Grading throughput through a Dask cluster against the local process pool, on the same
submissions, in the same run.

    PYTHONPATH=.:tests .venv/bin/python benchmarks/dask_throughput.py [--submissions 8] [--workers 2]

It builds two throw-away courses with notebook 03 released and the same ``--submissions``
complete and partial submissions, then measures, one after the other:

1. ``pool``: ``workbook autograde -j N`` (the local process pool, the default);
2. ``dask``: ``workbook autograde --scheduler ADDRESS`` on a ``dask scheduler`` with N
   ``dask worker`` processes (one thread each) on this machine, started before the clock
   starts (a standing cluster) but not yet warmed (their first task imports the grader,
   as the pool's fresh processes do).

It prints the wall times, the per-submission overhead of going through Dask
(``(dask - pool) * N / submissions``: seconds of a worker's time per submission), checks
that both give the same scores, and projects the wall time of a course of 7,200
submissions on 1 to 64 machines of ``--cores`` cores (one worker per core) from the
measured seconds per submission. The machine should be otherwise idle.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from autograder.cli import main as workbook  # noqa: E402
from autograder.course import Course  # noqa: E402
from servers import DaskCluster  # noqa: E402
from workbook_class import ClassBuilder, make_course  # noqa: E402

NOTEBOOK = "03_self_attention"
COURSE_SIZE = 7_200


def _course(base: Path, name: str, submissions: dict[str, nbformat.NotebookNode]) -> Course:
    root, assignment = make_course(base / name, NOTEBOOK)
    course = Course(root)
    assert workbook(["--course", str(root), "release", assignment]) == 0
    for student, nb in submissions.items():
        folder = course.submission_dir(student, assignment)
        folder.mkdir(parents=True)
        nbformat.write(nb, str(folder / f"{NOTEBOOK}.ipynb"))
    return course


def _scores(course: Course) -> dict[str, float]:
    with course.gradebook() as gb:
        return {s.id: gb.find_submission_notebook(NOTEBOOK, NOTEBOOK, s.id).score for s in gb.students}


def _autograde(course: Course, *flags: str) -> float:
    start = time.perf_counter()
    subprocess.run([str(Path(sys.executable).parent / "workbook"), "--course", str(course.root), "autograde",
                    NOTEBOOK, "--quiet", *flags], check=True, capture_output=True)
    return time.perf_counter() - start


def run(n_submissions: int, workers: int, base: Path) -> dict:
    builder = ClassBuilder(REPO / "notebooks" / NOTEBOOK / f"{NOTEBOOK}.ipynb",
                           REPO / "solutions" / NOTEBOOK / f"{NOTEBOOK}.ipynb")
    submissions = {f"student{i:02d}": builder.filled(skip=() if i % 2 == 0 else tuple(builder.items[2:]))
                   for i in range(n_submissions)}
    pool_course = _course(base, "pool", submissions)
    dask_course = _course(base, "dask", submissions)
    timings = {"pool": _autograde(pool_course, "-j", str(workers))}
    with DaskCluster(cwd=dask_course.root, log_dir=base) as cluster:
        for i in range(workers):
            cluster.start_worker(f"w{i + 1}")
        timings["dask"] = _autograde(dask_course, "--scheduler", cluster.address)
    return {"timings": timings, "same_scores": _scores(pool_course) == _scores(dask_course),
            "scores": _scores(dask_course)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--submissions", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cores", type=int, default=16, help="cores of a grading machine, for the projection")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="workbook-dask-bench-") as tmp:
        result = run(args.submissions, args.workers, Path(tmp))
    t, n, w = result["timings"], args.submissions, args.workers
    print(f"{n} submissions of {NOTEBOOK}, {w} workers")
    for name, seconds in t.items():
        print(f"  {name:5s} {seconds:7.1f} s   {n / seconds * 60:5.1f} submissions/min")
    overhead = (t["dask"] - t["pool"]) * w / n
    print(f"Dask overhead per submission: {overhead:+.2f} s of a worker's time (target < 0.2 s)")
    print(f"same scores: {result['same_scores']}")
    per_submission = t["dask"] * w / n  # seconds of one worker (one core) per submission
    print(f"projected wall time for {COURSE_SIZE} submissions ({per_submission:.1f} s of one core each), "
          f"machines of {args.cores} cores:")
    for machines in (1, 4, 16, 64):
        minutes = COURSE_SIZE * per_submission / (machines * args.cores) / 60
        print(f"  {machines:3d} machine(s): {minutes:7.1f} min")
    if not result["same_scores"]:
        sys.exit("the pool and the cluster gave different scores")


if __name__ == "__main__":
    main()
