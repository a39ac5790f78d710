"""``workbook gradescope``: the zip of one assignment's Gradescope autograder, built on the
instructor's machine (what runs from it inside Gradescope's container: in_container.py).

    workbook gradescope 03_self_attention -o autograder.zip [--hidden after_published]

The zip is in Gradescope's documented format (``setup.sh`` and ``run_autograder`` at its
root; https://gradescope-autograders.readthedocs.io/en/latest/specs/):

===================  ======================================================================
``setup.sh``         run once, as root, when Gradescope builds the image (Ubuntu 22.04): Python
                     3.11 beside Ubuntu's ``python3`` (3.10, which runs Gradescope's own
                     harness and is left alone), a virtual environment with the course's
                     pinned packages (torch's CPU wheel), the student's user, bubblewrap where
                     apt has it, and the assignment released once (``in_container.prepare``)
``run_autograder``   run for every submission, as root, in ``/autograder``:
                     ``in_container.grade_submission``, which always leaves ``/autograder/results/results.json``
``autograder/``,     the grader and the checks, as the instructor has them
``course_lib/``
``course/``          ``nbgrader_config.py`` and ``solutions/<assignment>/``
``gradescope.json``  what was chosen at build: the assignment, its notebooks, the limits, when
                     the hidden checks are shown
``secret``           this autograder's own grading secret (hidden inputs are derived from it)
===================  ======================================================================
"""

from __future__ import annotations

import datetime as dt
import json
import os
import secrets
import stat
import time
import zipfile
from pathlib import Path

from ...course import Course, CourseError
from ...course.release import assignments
from . import SETTINGS

__all__ = ["build", "HIDDEN_VISIBILITIES", "STARTUP_MARGIN_S"]

ROOT = Path(__file__).resolve().parents[3]  # the repository: autograder/, course_lib/, constraints.txt
TEMPLATES = Path(__file__).resolve().parent / "templates"
HIDDEN_VISIBILITIES = ("after_published", "after_due_date", "hidden")
STARTUP_MARGIN_S = 150  # of Gradescope's time limit, kept for starting Python, torch, the release and the records


def _requirements() -> list[str]:
    """The course's dependencies and the grader's (its ``grader`` extra) as pyproject.toml
    declares them (setup.sh installs them with constraints.txt; the course's own packages stay
    out of the virtual environment, which the student's code can read)."""
    import tomllib
    with open(ROOT / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    return list(project["dependencies"]) + list(project["optional-dependencies"]["grader"])


def _add_tree(zf: zipfile.ZipFile, folder: Path, name: str) -> None:
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if path.is_file() and not any(p in ("__pycache__", ".ipynb_checkpoints") for p in rel.parts) \
                and path.suffix != ".pyc":
            zf.write(path, f"{name}/{rel.as_posix()}")


def _add_text(zf: zipfile.ZipFile, name: str, text: str | bytes, mode: int = 0o644) -> None:
    info = zipfile.ZipInfo(name, date_time=time.localtime()[:6])
    info.external_attr = (stat.S_IFREG | mode) << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    zf.writestr(info, text)


_GRADEBOOK_HERE = '''
# workbook gradescope: the gradebook of one submission, a SQLite file in the container
import os as _workbook_os
c.CourseDirectory.db_url = "sqlite:///" + _workbook_os.path.join(
    _workbook_os.path.dirname(_workbook_os.path.abspath(__file__)), "grading", "gradebook.db")
'''


def build(course: Course, assignment: str, out: Path, hidden: str = "after_published", timeout_minutes: int = 10,
          memory_mb: int = 2048, cell_timeout: int | None = None) -> dict:
    """Write ``out``, the Gradescope autograder of ``assignment``; return its settings.

    ``hidden``: when students see the hidden checks' results (one of
    :data:`HIDDEN_VISIBILITIES`); ``timeout_minutes``: the assignment's autograder timeout
    on Gradescope (the notebook's limit is that less :data:`STARTUP_MARGIN_S`);
    ``memory_mb``: the student's processes' memory limit (the container needs more: see
    docs/gradescope.md)."""
    if hidden not in HIDDEN_VISIBILITIES:
        raise CourseError(f"--hidden {hidden!r}: one of {', '.join(HIDDEN_VISIBILITIES)}")
    if assignment not in assignments(course):
        raise CourseError(f"no assignment {assignment!r} in {course.source_dir}; known: "
                          f"{', '.join(assignments(course)) or 'none'}")
    notebook_timeout = timeout_minutes * 60 - STARTUP_MARGIN_S
    if notebook_timeout < 60:
        raise CourseError(f"a Gradescope timeout of {timeout_minutes} min leaves no time to grade (at least "
                          f"{(STARTUP_MARGIN_S + 60) // 60 + 1} min)")
    cell = min(cell_timeout or int(course.setting("Execute", "timeout", 300)), notebook_timeout)
    source = course.source_dir / assignment
    settings = {
        "assignment": assignment,
        "notebooks": sorted(p.stem for p in source.glob("*.ipynb")),
        "hidden_visibility": hidden,
        "timeout_minutes": timeout_minutes,
        "limits": {"cell_timeout": cell, "notebook_timeout": notebook_timeout, "memory_mb": memory_mb},
        "threads": 1,
        "built": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        _add_text(zf, "setup.sh", (TEMPLATES / "setup.sh").read_text(), 0o755)
        _add_text(zf, "run_autograder", (TEMPLATES / "run_autograder").read_text(), 0o755)
        _add_tree(zf, ROOT / "autograder", "autograder")
        _add_tree(zf, ROOT / "course_lib", "course_lib")
        config = (course.root / "nbgrader_config.py").read_text(encoding="utf-8")
        _add_text(zf, "course/nbgrader_config.py", config + _GRADEBOOK_HERE)
        _add_tree(zf, source, f"course/{course.source_dir.name}/{assignment}")
        _add_text(zf, "requirements.txt", "\n".join(_requirements()) + "\n")
        _add_text(zf, "constraints.txt", (ROOT / "constraints.txt").read_text())
        _add_text(zf, SETTINGS, json.dumps(settings, indent=1) + "\n")
        _add_text(zf, "secret", secrets.token_bytes(32), 0o600)
    os.replace(tmp, out)
    return settings
