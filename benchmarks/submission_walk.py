"""The walk of one submission: how often a reader following it through the instructor's
code has to change module, and come back to one already left.

    PYTHONPATH=. .venv/bin/python benchmarks/submission_walk.py [--notebook 03_self_attention]

It builds a throw-away course with one notebook released and one submission (the solution
notebook), then grades it twice with the code traced (``sys.setprofile``):

1. ``course``: ``workbook autograde`` from the command line (local worker processes): every
   function of ``autograder/`` that receives the course (as an argument, or as ``self``); also
   counted without the course's own methods (``Course.submission_dir`` and the like, which
   every stage asks);
2. ``job``: the same submission graded again in this process (``in_process``, ``force``):
   every function of ``autograder/`` called while the grading worker's entry point runs
   (the job's run in its sandbox, its judgement), from its first call into the worker module
   to that call's return. ``--from dispatch`` starts the job's walk one step earlier, at
   ``dispatch`` (which also records the result), and counts the grader's own calls into
   ``autograder/inside/`` (cells, the channel) as well: the walk issue 52 was measured with.

Each walk reads a function once, at its first call, as a reader follows the code (a
comprehension or a lambda is read where it stands); calls in a row in one module are one *stop*. It prints, per walk, the modules visited, the stops and the
*returns* (stops in a module already left), and the path itself. The code of
Otherwise ``autograder/inside/`` (the sandbox's side) is not part of either walk. Nothing here is timed.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PACKAGE = REPO / "autograder"
INSIDE = PACKAGE / "inside"


def _module(filename: str, inside: bool = False) -> str | None:
    path = Path(filename)
    if path.suffix != ".py" or not path.is_relative_to(PACKAGE) or (path.is_relative_to(INSIDE) and not inside):
        return None
    rel = path.relative_to(REPO).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


class Walk:
    """Modules of the first call of every traced function, in order."""

    def __init__(self) -> None:
        self.seen: set = set()
        self.path: list[tuple[str, str]] = []  # (module, function)

    def add(self, code, module: str) -> None:
        if code.co_name.startswith("<"):
            return  # a comprehension or a lambda is read where it stands
        if code not in self.seen:
            self.seen.add(code)
            self.path.append((module, code.co_qualname))

    def stops(self, leave_out: str = "") -> list[tuple[str, list[str]]]:
        out: list[tuple[str, list[str]]] = []
        for module, function in self.path:
            if leave_out and function.split(".")[0] == leave_out:
                continue
            if out and out[-1][0] == module:
                out[-1][1].append(function)
            else:
                out.append((module, [function]))
        return out

    def summary(self, name: str, leave_out: str = "") -> str:
        stops = self.stops()
        modules = {m for m, _ in stops}
        lines = [f"{name}: {len(modules)} modules, {len(stops)} stops, {len(stops) - len(modules)} returns"]
        if leave_out:
            fewer = self.stops(leave_out)
            kept = {m for m, _ in fewer}
            lines.append(f"  (without {leave_out}'s own methods: {len(kept)} modules, {len(fewer)} stops, "
                         f"{len(fewer) - len(kept)} returns)")
        left: set[str] = set()
        for module, functions in stops:
            mark = "  (return)" if module in left else ""
            left.add(module)
            lines.append(f"  {module}: {', '.join(functions)}{mark}")
        return "\n".join(lines)


def _follow_course(course) -> Walk:
    walk = Walk()

    def profile(frame, event, arg):
        if event != "call":
            return
        module = _module(frame.f_code.co_filename)
        if module and any(value is course for value in frame.f_locals.values()):
            walk.add(frame.f_code, module)
    sys.setprofile(profile)
    return walk


def _follow_job(start: str = "worker") -> Walk:
    walk = Walk()
    inside = start == "dispatch"
    entry: list = []  # the worker's entry frame, while it runs

    def profile(frame, event, arg):
        if event == "return" and entry and frame is entry[0]:
            entry.clear()
            sys.setprofile(None)
            return
        if event != "call":
            return
        module = _module(frame.f_code.co_filename, inside)
        if module is None:
            return
        if not entry and (frame.f_code.co_name == "dispatch" if inside else module.rpartition(".")[2] == "worker"):
            entry.append(frame)
        if entry:
            walk.add(frame.f_code, module)
    sys.setprofile(profile)
    return walk


def _grading_options():
    """``GradingOptions`` wherever this checkout keeps it."""
    import importlib
    for name in ("autograder.pipeline.options", "autograder.autograde"):
        try:
            return importlib.import_module(name).GradingOptions
        except (ImportError, AttributeError):
            continue
    raise ImportError("no GradingOptions")


def _autograde():
    import importlib
    for name in ("autograder.pipeline.autograde", "autograder.autograde"):
        try:
            return importlib.import_module(name).autograde
        except ImportError:
            continue
    raise ImportError("no autograde")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--notebook", default="03_self_attention")
    parser.add_argument("--from", dest="start", choices=("worker", "dispatch"), default="worker",
                        help="where the job's walk starts (dispatch: with the grader's calls into autograder/inside/)")
    args = parser.parse_args(argv)

    import nbformat
    from autograder.cli import main as workbook
    from autograder.course import Course

    base = Path(tempfile.mkdtemp(prefix="workbook-walk-"))
    try:
        root = base / "course"
        (root / "grading").mkdir(parents=True)
        shutil.copyfile(REPO / "nbgrader_config.py", root / "nbgrader_config.py")
        shutil.copytree(REPO / "solutions" / args.notebook, root / "solutions" / args.notebook)
        assert workbook(["--course", str(root), "release", args.notebook]) == 0
        course = Course(root)
        folder = course.submission_dir("alice", args.notebook)
        folder.mkdir(parents=True)
        source = nbformat.read(str(root / "solutions" / args.notebook / f"{args.notebook}.ipynb"), as_version=4)
        nbformat.write(source, str(folder / f"{args.notebook}.ipynb"))

        import autograder.cli as cli
        original = cli.Course

        def traced_course(*a, **k):  # the course the command line makes is the one followed
            made = original(*a, **k)
            walks.append(_follow_course(made))
            return made
        walks: list[Walk] = []
        cli.Course = traced_course
        try:
            code = workbook(["--course", str(root), "autograde", args.notebook, "-j", "1", "--quiet"])
        finally:
            sys.setprofile(None)
            cli.Course = original
        assert code == 0, code

        GradingOptions, autograde = _grading_options(), _autograde()
        job_walk = _follow_job(args.start)
        try:
            reports = autograde(course, args.notebook, GradingOptions(workers=1, in_process=True, force=True))
        finally:
            sys.setprofile(None)
        score = reports[0]["score"]
        print(f"alice scored {score:g} of {reports[0]['max_score']:g}\n")
        print(walks[0].summary("course through `workbook autograde`", leave_out="Course"))
        print()
        print(job_walk.summary("job through the grading worker" if args.start == "worker" else
                               "job from dispatch (with autograder/inside/)"))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
