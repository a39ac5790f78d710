"""Generate the student notebooks from the nbgrader source notebooks, and check that
they are in sync.

    python -m autograder.course.release                 # regenerate every notebook
    python -m autograder.course.release 03_self_attention
    python -m autograder.course.release --check         # exit 1 if the student notebooks are out of date

The folders are the course's (``CourseDirectory.source_directory`` and
``release_directory`` in ``nbgrader_config.py``: ``solutions/`` and ``notebooks/``
here). Each assignment is generated once, by nbgrader's ``generate_assignment`` into a
throw-away folder, then copied over with stable JSON; the generated notebooks carry no
outputs. ``record=True`` (``workbook release``) records the assignment in the course's
gradebook in that same run; otherwise (and for ``--check``) nbgrader runs on a
temporary copy, so the gradebook is never touched.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Callable

from traitlets.config import Config

from .course import Course, CourseError

__all__ = ["ROOT", "assignments", "generate", "release", "out_of_date", "check", "recorded_notebooks"]

ROOT = Path(__file__).resolve().parents[2]


def _course(course: Course | None) -> Course:
    return course if course is not None else Course(ROOT)


def assignments(course: Course | None = None) -> list[str]:
    """Assignment ids: the folders of the source directory that hold a notebook, in order."""
    source = _course(course).source_dir
    return sorted(p.name for p in source.iterdir() if p.is_dir() and any(p.glob("*.ipynb")))


def _generate_into(course: Course, assignment: str, out: Path, record: bool) -> Path:
    """nbgrader's ``generate_assignment`` of ``assignment`` with ``out`` as the release
    folder: on the course itself (``record``: the gradebook learns the assignment) or on
    a temporary copy of its source. Returns ``out/<assignment>``."""
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory

    source = course.source_dir / assignment
    if not source.is_dir():
        raise CourseError(f"no assignment {assignment!r} in {course.source_dir}; known: "
                          f"{', '.join(assignments(course))}")
    cfg = Config(course.config)
    cfg.CourseDirectory.release_directory = str(out)
    if not record:
        copy = out.parent / "course"
        shutil.copytree(source, copy / "source" / assignment,
                        ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
        cfg.CourseDirectory.root = str(copy)
        cfg.CourseDirectory.source_directory = "source"
        cfg.CourseDirectory.db_url = f"sqlite:///{copy / 'gradebook.db'}"
        cfg.Exchange.root = str(copy / "exchange")
    else:
        course.grading_dir.mkdir(parents=True, exist_ok=True)
    api = NbGraderAPI(coursedir=CourseDirectory(config=cfg), config=cfg)
    api.log.setLevel("ERROR")
    result = api.generate_assignment(assignment, force=True, create=True)
    if not result["success"]:
        raise CourseError(f"nbgrader could not generate {assignment}:\n{result.get('error', '')}\n"
                          f"{result.get('log', '')}")
    return out / assignment


def generate(assignment: str, dest: Path | None, course: Course | None = None, record: bool = False) -> Path | None:
    """Generate the student version of ``assignment`` into ``dest/<assignment>/``
    (``dest=None``: only record it, with ``record``). Returns the folder written."""
    course = _course(course)
    with tempfile.TemporaryDirectory(prefix="workbook-release-") as tmp:
        made = _generate_into(course, assignment, Path(tmp) / "release", record)
        if dest is None:
            return None
        target = Path(dest) / assignment
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(made, target)
    for nb in target.glob("*.ipynb"):
        _normalise(nb)
    return target


def recorded_notebooks(course: Course, assignment: str) -> list[str]:
    """Notebook names of ``assignment`` in the gradebook (recorded by ``release``; recorded
    here from ``solutions/`` with nbgrader's ``generate_assignment`` when the gradebook does
    not have it yet, the release folder left as it is)."""
    from nbgrader.api import MissingEntry

    with course.gradebook() as gb:
        try:
            return [nb.name for nb in gb.find_assignment(assignment).notebooks]
        except MissingEntry:
            pass
    generate(assignment, None, course, record=True)  # released elsewhere: record it from solutions/
    with course.gradebook() as gb:
        return [nb.name for nb in gb.find_assignment(assignment).notebooks]


def _normalise(path: Path) -> None:
    """Stable JSON (sorted keys, one trailing newline) so that regeneration is diff-free."""
    data = json.loads(path.read_text())
    path.write_text(json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n")


def release(which: list[str] | None = None, course: Course | None = None, record: bool = False) -> list[Path]:
    """Regenerate the release folder's ``<assignment>/`` for ``which`` (default: all)."""
    course = _course(course)
    return [generate(a, course.release_dir, course, record) for a in (which or assignments(course))]


def out_of_date(which: list[str] | None = None, course: Course | None = None,
                progress: Callable[[str], None] = lambda assignment: None) -> list[str]:
    """Files of the release folder that differ from a fresh generation (empty if in sync);
    ``progress(assignment)`` hears of each assignment as its generation starts."""
    course = _course(course)
    source_name, release_name = course.source_dir.name, course.release_dir.name
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="workbook-check-") as tmp:
        for assignment in which or assignments(course):
            progress(assignment)
            fresh = generate(assignment, Path(tmp), course)
            committed = course.release_dir / assignment
            if not committed.is_dir():
                problems.append(f"{release_name}/{assignment}/ is missing")
                continue
            fresh_files = {p.relative_to(fresh) for p in fresh.rglob("*") if p.is_file()}
            committed_files = {p.relative_to(committed) for p in committed.rglob("*") if p.is_file()
                               and ".ipynb_checkpoints" not in p.parts}
            for rel in sorted(fresh_files | committed_files):
                a, b = fresh / rel, committed / rel
                if not b.exists():
                    problems.append(f"{release_name}/{assignment}/{rel} is missing")
                elif not a.exists():
                    problems.append(f"{release_name}/{assignment}/{rel} has no source in {source_name}/")
                elif not filecmp.cmp(a, b, shallow=False):
                    problems.append(f"{release_name}/{assignment}/{rel} differs from {source_name}/")
    return problems


def check(course: Course, which: list[str] | None, regenerate: str) -> int:
    """Print whether the release folder is in sync (naming each file that is not, and the
    ``regenerate`` command); 0 when it is, 1 when not."""
    release_name, source_name = course.release_dir.name, course.source_dir.name
    names = which or assignments(course)
    done = []

    shown = sys.stderr.isatty()  # on a terminal only: a log or a pipe gets the verdict alone

    def progress(assignment: str) -> None:  # one line that grows: nbgrader takes seconds an assignment
        done.append(assignment)
        if shown:
            print(f"\rchecking {release_name}/ against {source_name}/: {len(done)}/{len(names)} ({assignment})"
                  .ljust(100), end="", flush=True, file=sys.stderr)
    problems = out_of_date(names, course, progress)
    if shown:
        print("\r" + " " * 100 + "\r", end="", file=sys.stderr)
    if problems:
        print(f"{release_name}/ is out of date with {source_name}/:")
        print("\n".join(f"  - {p}" for p in problems))
        print(f"Regenerate with: {regenerate}")
        return 1
    print(f"{release_name}/ is in sync with {source_name}/.")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograder.course.release", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("assignments", nargs="*", help="assignment ids (default: all)")
    parser.add_argument("--check", action="store_true", help="only check that the student notebooks are up to date")
    args = parser.parse_args(argv)
    course = Course(ROOT)
    which = args.assignments or None
    try:
        if args.check:
            return check(course, which, "make release")
        for path in release(which, course):
            print(f"generated {path.relative_to(course.root)}")
    except CourseError as exc:
        print(f"release: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
