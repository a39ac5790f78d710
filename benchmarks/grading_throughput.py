"""Grading throughput: the sealed-off ``workbook autograde`` with 1 and N workers against
nbgrader's own sequential ``nbgrader autograde``, on the same submissions, in the same run.

    PYTHONPATH=. .venv/bin/python benchmarks/grading_throughput.py [--submissions 8] [--workers 2]

It builds a throw-away course with notebook 03 released, makes ``--submissions``
complete submissions (correct and partial ones: nbgrader itself cannot survive the
hostile kinds), then measures, one after the other:

1. ``bare``: each notebook executed by plain nbclient, no grading at all (the floor);
2. ``nbgrader``: ``nbgrader autograde`` (sequential, its own command line);
3. ``workbook -j 1 --unsafe-no-sandbox``: this project's grader without the sandbox;
4. ``workbook -j 1`` and ``workbook -j N``: this project's grader, each submission sealed
   off in bubblewrap and judged in the grader's process.

and prints the wall times, the throughput, the speed-up of ``-j N`` over nbgrader
and over ``-j 1``, the per-submission overhead beyond executing the notebook
(``(wall - bare) / submissions``: the sandbox, the plans and the trusted judgement
together), the cost of the sandbox alone (``-j 1`` against ``--unsafe-no-sandbox``), and
checks that all graders give the same scores. The machine should be otherwise idle; every kernel gets
``WORKBOOK_GRADING=1`` (short training) and one CPU thread (``OMP_NUM_THREADS=1``,
as ``workbook`` gives its kernels), so that the graders, not thread settings, are
compared.
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

import nbformat

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from autograder.cli import main as workbook
from autograder.course import Course
from workbook_class import ClassBuilder, make_course

NOTEBOOK = "03_self_attention"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["WORKBOOK_GRADING"] = "1"
    env["MPLBACKEND"] = "Agg"
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[name] = "1"  # as workbook gives each kernel: compare the graders, not thread settings
    return env


def _course(base: Path, name: str, submissions: dict[str, nbformat.NotebookNode]) -> Course:
    root, assignment = make_course(base / name, NOTEBOOK)
    course = Course(root)
    assert workbook(["--course", str(root), "release", assignment]) == 0
    for student, nb in submissions.items():
        folder = course.submission_dir(student, assignment)
        folder.mkdir(parents=True)
        nbformat.write(nb, str(folder / f"{NOTEBOOK}.ipynb"))
    return course


def _scores(course: Course) -> dict[str, dict[str, float]]:
    with course.gradebook() as gb:
        out = {}
        for s in gb.students:
            sub = gb.find_submission_notebook(NOTEBOOK, NOTEBOOK, s.id)
            out[s.id] = {g.name: g.score for g in sub.grades if g.name.startswith("test_")}
        return out


def bare_execution(submissions: dict[str, nbformat.NotebookNode]) -> float:
    """Seconds to execute every notebook once with plain nbclient (no grading)."""
    from course_lib.notebook_client import NotebookClient
    os.environ.update({k: v for k, v in _env().items()
                       if k in ("PYTHONPATH", "WORKBOOK_GRADING", "MPLBACKEND", "OMP_NUM_THREADS", "MKL_NUM_THREADS")})
    start = time.perf_counter()
    for nb in submissions.values():
        with tempfile.TemporaryDirectory() as cwd:
            NotebookClient(nbformat.from_dict(json.loads(json.dumps(nb))), timeout=600, kernel_name="python3",
                           allow_errors=True, resources={"metadata": {"path": cwd}}).execute()
    return time.perf_counter() - start


def run(n_submissions: int, workers: int, base: Path) -> dict:
    builder = ClassBuilder(REPO / "notebooks" / NOTEBOOK / f"{NOTEBOOK}.ipynb",
                           REPO / "solutions" / NOTEBOOK / f"{NOTEBOOK}.ipynb")
    submissions = {}
    for i in range(n_submissions):  # alternate complete and partial solutions
        skip = () if i % 2 == 0 else tuple(builder.items[len(builder.items) // 2:])
        submissions[f"student{i:02d}"] = builder.filled(skip=skip)

    timings: dict[str, float] = {}
    timings["bare"] = bare_execution(submissions)

    nb_course = _course(base, "nbgrader", submissions)
    start = time.perf_counter()
    subprocess.run([str(Path(sys.executable).parent / "nbgrader"), "autograde", NOTEBOOK, "--force"],
                   cwd=nb_course.root, env=_env(), check=True, capture_output=True)
    timings["nbgrader"] = time.perf_counter() - start

    results = {"nbgrader": _scores(nb_course)}
    for j, flags in ((1, ["--unsafe-no-sandbox"]), (1, []), (workers, [])):
        name = f"workbook -j {j}" + (" --unsafe-no-sandbox" if flags else "")
        course = _course(base, name.replace(" ", "_"), submissions)
        start = time.perf_counter()
        # the real command, as an instructor runs it (its worker processes then start from the
        # workbook entry point, not from this script)
        subprocess.run([str(Path(sys.executable).parent / "workbook"), "--course", str(course.root), "autograde",
                        NOTEBOOK, "-j", str(j), "--quiet", *flags], env=_env(), check=True, capture_output=True)
        timings[name] = time.perf_counter() - start
        results[name] = _scores(course)
        if flags:
            continue
        if j == 1:  # the workers' own execution time (kernel start to last cell), per notebook
            reports = [json.loads(p.read_text()) for p in (course.reports_dir / NOTEBOOK).glob("student*.json")]
            executing = sum(r["notebooks"][NOTEBOOK]["seconds"] for r in reports)

    n = n_submissions
    report = {
        "submissions": n, "workers": workers, "cpus": os.cpu_count(), "seconds": timings,
        "throughput_per_minute": {k: 60 * n / v for k, v in timings.items() if k != "bare"},
        "overhead_per_submission_s": {k: (v - timings["bare"]) / n for k, v in timings.items()
                                      if k in ("nbgrader", "workbook -j 1")},
        "sandbox_per_submission_s": (timings["workbook -j 1"] - timings["workbook -j 1 --unsafe-no-sandbox"]) / n,
        "workbook_overhead_beyond_own_execution_s": (timings["workbook -j 1"] - executing) / n,
        "speedup_vs_nbgrader": timings["nbgrader"] / timings[f"workbook -j {workers}"],
        "speedup_vs_one_worker": timings["workbook -j 1"] / timings[f"workbook -j {workers}"],
        "same_scores": all(r == results["nbgrader"] for r in results.values()),
    }
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--submissions", type=int, default=8)
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--out", help="also write the numbers as JSON here")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="workbook-bench-"))
    try:
        report = run(args.submissions, args.workers, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    t = report["seconds"]
    print(f"{report['submissions']} submissions of {NOTEBOOK}, {report['cpus']} CPUs")
    for name, seconds in t.items():
        rate = report["throughput_per_minute"].get(name)
        extra = f"  {rate:5.1f} submissions/min" if rate else "  (plain execution, no grading)"
        print(f"  {name:<34} {seconds:7.1f} s{extra}")
    for name, over in report["overhead_per_submission_s"].items():
        print(f"  overhead beyond executing the notebook, {name}: {over:+.2f} s per submission")
    print(f"  the sandbox alone (-j 1 against --unsafe-no-sandbox): {report['sandbox_per_submission_s']:+.2f} s "
          "per submission")
    print(f"  workbook -j 1 beyond its workers' execution time, same run: "
          f"{report['workbook_overhead_beyond_own_execution_s']:+.2f} s per submission")
    print(f"  speed-up of -j {report['workers']}: {report['speedup_vs_nbgrader']:.2f}x over nbgrader, "
          f"{report['speedup_vs_one_worker']:.2f}x over -j 1")
    print(f"  same scores from all graders: {report['same_scores']}")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 0 if report["same_scores"] else 1


if __name__ == "__main__":
    sys.exit(main())
