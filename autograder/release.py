"""Generate the student notebooks in ``notebooks/`` from ``solutions/`` and check they
are in sync.

    python -m autograder.release                 # regenerate every notebook
    python -m autograder.release 03_self_attention
    python -m autograder.release --check         # exit 1 if notebooks/ is out of date

Generation runs nbgrader's ``generate_assignment`` in a temporary copy of the course,
so the instructor's gradebook is never touched, then copies the result into
``notebooks/``. The generated notebooks carry no outputs.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from traitlets.config import Config

__all__ = ["ROOT", "assignments", "ensure_tools_on_path", "generate", "release", "out_of_date"]

ROOT = Path(__file__).resolve().parent.parent
SOURCE = "solutions"
RELEASE = "notebooks"


def assignments(root: Path = ROOT) -> list[str]:
    """Assignment ids: the folders of ``solutions/`` that hold a notebook, in order."""
    source = root / SOURCE
    return sorted(p.name for p in source.iterdir() if p.is_dir() and any(p.glob("*.ipynb")))


def _nbgrader_config(course: Path) -> Config:
    config = Config()
    config.CourseDirectory.root = str(course)
    config.CourseDirectory.source_directory = SOURCE
    config.CourseDirectory.release_directory = RELEASE
    config.CourseDirectory.db_url = f"sqlite:///{course / 'gradebook.db'}"
    config.Exchange.root = str(course / "exchange")
    return config


def ensure_tools_on_path() -> None:
    """Put this interpreter's scripts folder on PATH: nbgrader runs ``alembic`` and
    ``jupyter`` as commands, which are missing when the virtualenv is not activated."""
    scripts = str(Path(sys.executable).parent)
    if scripts not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = scripts + os.pathsep + os.environ.get("PATH", "")


def generate(assignment: str, dest: Path, root: Path = ROOT) -> Path:
    """Generate the student version of ``assignment`` into ``dest/<assignment>/``."""
    from nbgrader.apps import NbGraderAPI

    ensure_tools_on_path()
    source = root / SOURCE / assignment
    if not source.is_dir():
        known = ", ".join(assignments(root))
        raise ValueError(f"no assignment {assignment!r} in {root / SOURCE}; known: {known}")
    with tempfile.TemporaryDirectory(prefix="workbook-release-") as tmp:
        course = Path(tmp)
        shutil.copytree(source, course / SOURCE / assignment,
                        ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
        api = NbGraderAPI(config=_nbgrader_config(course))
        api.log.setLevel("ERROR")
        result = api.generate_assignment(assignment, force=True, create=True)
        if not result["success"]:
            raise RuntimeError(f"nbgrader could not generate {assignment}:\n{result['error']}\n{result['log']}")
        target = dest / assignment
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(course / RELEASE / assignment, target)
    for nb in target.glob("*.ipynb"):
        _normalise(nb)
    return target


def _normalise(path: Path) -> None:
    """Stable JSON (sorted keys, one trailing newline) so that regeneration is diff-free."""
    data = json.loads(path.read_text())
    path.write_text(json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n")


def release(which: list[str] | None = None, root: Path = ROOT) -> list[Path]:
    """Regenerate ``notebooks/<assignment>/`` for ``which`` (default: all)."""
    return [generate(a, root / RELEASE, root) for a in (which or assignments(root))]


def out_of_date(which: list[str] | None = None, root: Path = ROOT) -> list[str]:
    """Files of ``notebooks/`` that differ from a fresh generation (empty if in sync)."""
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="workbook-check-") as tmp:
        for assignment in which or assignments(root):
            fresh = generate(assignment, Path(tmp), root)
            committed = root / RELEASE / assignment
            if not committed.is_dir():
                problems.append(f"{RELEASE}/{assignment}/ is missing")
                continue
            fresh_files = {p.relative_to(fresh) for p in fresh.rglob("*") if p.is_file()}
            committed_files = {p.relative_to(committed) for p in committed.rglob("*") if p.is_file()
                               and ".ipynb_checkpoints" not in p.parts}
            for rel in sorted(fresh_files | committed_files):
                a, b = fresh / rel, committed / rel
                if not b.exists():
                    problems.append(f"{RELEASE}/{assignment}/{rel} is missing")
                elif not a.exists():
                    problems.append(f"{RELEASE}/{assignment}/{rel} has no source in {SOURCE}/")
                elif not filecmp.cmp(a, b, shallow=False):
                    problems.append(f"{RELEASE}/{assignment}/{rel} differs from {SOURCE}/")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograder.release", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("assignments", nargs="*", help="assignment ids (default: all)")
    parser.add_argument("--check", action="store_true", help="only check that notebooks/ is up to date")
    args = parser.parse_args(argv)
    which = args.assignments or None
    if args.check:
        problems = out_of_date(which)
        if problems:
            print("notebooks/ is out of date with solutions/:")
            print("\n".join(f"  - {p}" for p in problems))
            print("Regenerate with: make release")
            return 1
        print("notebooks/ is in sync with solutions/.")
        return 0
    for path in release(which):
        print(f"generated {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
