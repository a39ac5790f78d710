"""Grading throughput through a Dask cluster against the local process pool, on the same
submissions, in the same run.

    PYTHONPATH=.:tests .venv/bin/python benchmarks/dask_throughput.py [--submissions 4,12] [--workers 2]
        [--repeats 1]

It builds two throw-away courses with notebook 03 released and the same ``--submissions``
complete and partial submissions, then measures, one after the other:

1. ``pool``: ``workbook autograde -j N`` (the local process pool, the default);
2. ``dask``: ``workbook autograde --scheduler ADDRESS`` on a ``workbook scheduler`` with N
   ``workbook worker`` processes (one thread each) on this machine, started before the clock
   starts (a standing cluster) but not yet warmed (their first task imports the grader,
   as the pool's fresh processes do).

It prints the wall times and checks that both give the same scores. Going through Dask
costs something once per batch (the client imports ``distributed`` and connects, workers
warm up differently from the pool's processes) and something per submission (the task's
trip through the scheduler, the worker's course check). With two or more batch sizes
(``--submissions 4,12``, the default) the two are told apart: the extra time of Dask
over the pool, ``dask - pool``, is fitted as ``fixed + per_submission * n / N`` over the
sizes ``n`` (``N`` workers), so ``per_submission`` is seconds of a worker's time per
submission, free of the batch's fixed cost. With one size, all of the difference is
charged to the submissions.

The grading itself varies from run to run by more than Dask's cost, so the benchmark also
reads how long each submission's grading took on its worker (the report's ``seconds``:
sandbox, notebook and judgement) and fits the same line to the workers' time *not*
spent grading, ``workers * wall - sum(seconds)``: Dask's overhead free of that noise.
``--repeats`` alternates pool and Dask runs several times per size and averages them.
It projects the wall time of a course of 7,200 submissions on 1 to 64 machines of
``--cores`` cores (one worker per core) from the measured seconds per submission. The
machine should be otherwise idle.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from autograder.cli import main as workbook
from autograder.course import Course
from servers import DaskCluster
from workbook_class import ClassBuilder, make_course

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


def _autograde(course: Course, *flags: str) -> tuple[float, float]:
    """Grade every submission again: (wall seconds, sum of the submissions' grading seconds)."""
    start = time.perf_counter()
    subprocess.run([str(Path(sys.executable).parent / "workbook"), "--course", str(course.root), "autograde",
                    NOTEBOOK, "--quiet", "--force", *flags], check=True, capture_output=True)
    wall = time.perf_counter() - start
    reports = (course.root / "grading" / "reports" / NOTEBOOK).glob("*.json")
    graded = sum(n.get("seconds") or 0.0 for path in reports if not path.name.startswith("_")
                 for n in json.loads(path.read_text()).get("notebooks", {}).values())
    return wall, graded


def run(n_submissions: int, workers: int, repeats: int, base: Path) -> dict:
    builder = ClassBuilder(REPO / "notebooks" / NOTEBOOK / f"{NOTEBOOK}.ipynb",
                           REPO / "solutions" / NOTEBOOK / f"{NOTEBOOK}.ipynb")
    submissions = {f"student{i:02d}": builder.filled(skip=() if i % 2 == 0 else tuple(builder.items[2:]))
                   for i in range(n_submissions)}
    pool_course = _course(base, "pool", submissions)
    dask_course = _course(base, "dask", submissions)
    runs: dict[str, list[tuple[float, float]]] = {"pool": [], "dask": []}
    with DaskCluster(cwd=dask_course.root, log_dir=base) as cluster:
        for i in range(workers):
            cluster.start_worker(f"w{i + 1}")
        for _ in range(repeats):  # alternated, so that a slow spell of the machine hits both
            runs["pool"].append(_autograde(pool_course, "-j", str(workers)))
            runs["dask"].append(_autograde(dask_course, "--scheduler", cluster.address))
    mean = {mode: (sum(w for w, _ in r) / len(r), sum(g for _, g in r) / len(r)) for mode, r in runs.items()}
    return {"timings": {mode: m[0] for mode, m in mean.items()}, "graded": {mode: m[1] for mode, m in mean.items()},
            "same_scores": _scores(pool_course) == _scores(dask_course), "scores": _scores(dask_course)}


def _fit(sizes: list[int], extra: list[float], workers: int) -> tuple[float, float]:
    """Least squares ``extra = fixed + per_submission * n / workers``: (fixed seconds per
    batch, seconds of a worker's time per submission)."""
    x = [n / workers for n in sizes]
    mx, my = sum(x) / len(x), sum(extra) / len(extra)
    slope = sum((a - mx) * (b - my) for a, b in zip(x, extra)) / sum((a - mx) ** 2 for a in x)
    return my - slope * mx, slope


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--submissions", default="4,12", help="batch size, or several separated by commas")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cores", type=int, default=16, help="cores of a grading machine, for the projection")
    parser.add_argument("--repeats", type=int, default=1, help="pool and Dask runs per size, alternated")
    args = parser.parse_args()
    sizes = sorted({int(n) for n in args.submissions.split(",")})
    w = args.workers
    results = {}
    for n in sizes:
        with tempfile.TemporaryDirectory(prefix="workbook-dask-bench-") as tmp:
            results[n] = run(n, w, args.repeats, Path(tmp))
        t = results[n]["timings"]
        print(f"{n} submissions of {NOTEBOOK}, {w} workers")
        for name, seconds in t.items():
            graded = results[n]["graded"][name]
            print(f"  {name:5s} {seconds:7.1f} s   {n / seconds * 60:5.1f} submissions/min   "
                  f"grading {graded / n:5.2f} s per submission, not grading {(w * seconds - graded) / n:5.2f} s")
        print(f"  same scores: {results[n]['same_scores']}")
    extra = [results[n]["timings"]["dask"] - results[n]["timings"]["pool"] for n in sizes]
    idle = [(w * r["timings"]["dask"] - r["graded"]["dask"]) - (w * r["timings"]["pool"] - r["graded"]["pool"])
            for r in (results[n] for n in sizes)]  # workers' seconds not spent grading: Dask minus pool
    if len(sizes) > 1:
        fixed, overhead = _fit(sizes, extra, w)
        print(f"Dask's extra time once per batch: {fixed:+.2f} s")
        print(f"Dask overhead per submission: {overhead:+.2f} s of a worker's time (target < 0.2 s)")
        fixed_idle, overhead_idle = _fit(sizes, [x / w for x in idle], w)
        print(f"the same from the workers' time not spent grading: {overhead_idle:+.2f} s per submission, "
              f"{fixed_idle:+.2f} s once per batch")
    else:
        overhead = extra[0] * w / sizes[0]
        print(f"Dask overhead per submission (the batch's fixed cost included): {overhead:+.2f} s of a worker's time "
              "(target < 0.2 s)")
    n = sizes[-1]
    per_submission = results[n]["timings"]["dask"] * w / n  # seconds of one worker (one core) per submission
    print(f"projected wall time for {COURSE_SIZE} submissions ({per_submission:.1f} s of one core each), "
          f"machines of {args.cores} cores:")
    for machines in (1, 4, 16, 64):
        minutes = COURSE_SIZE * per_submission / (machines * args.cores) / 60
        print(f"  {machines:3d} machine(s): {minutes:7.1f} min")
    if not all(r["same_scores"] for r in results.values()):
        sys.exit("the pool and the cluster gave different scores")


if __name__ == "__main__":
    main()
