"""The course folder as nbgrader sees it: configuration, paths and the gradebook.

Every ``workbook`` command works on one course folder (the folder holding
``nbgrader_config.py``); :class:`Course` loads that configuration once and
answers questions about assignments, notebooks and submissions.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

import nbgrader
import nbgrader.api
from nbgrader.api import Gradebook
from nbgrader.coursedir import CourseDirectory
from traitlets.config import Config, PyFileConfigLoader

from ..doors.intake import shown

__all__ = ["Course", "CourseError", "counted_points", "find_course_root", "write_json_atomic", "read_json", "open_gradebook",
           "with_retry"]

CONFIG_NAME = "nbgrader_config.py"


class CourseError(RuntimeError):
    """A problem with the course folder that the instructor must fix (clear message)."""


def find_course_root(start: str | os.PathLike | None = None) -> Path:
    """The nearest folder at or above ``start`` (default: the working directory)
    that holds ``nbgrader_config.py``."""
    here = Path(start or os.getcwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / CONFIG_NAME).is_file():
            return folder
    raise CourseError(
        f"no {CONFIG_NAME} in {here} or any folder above it: run workbook inside the "
        "course folder or pass --course DIR"
    )


@functools.cache
def alembic_head() -> str:
    """nbgrader's newest gradebook migration, which it writes into every gradebook it creates:
    what ``alembic heads`` prints first, read in this process."""
    from alembic.config import Config as AlembicConfig
    from alembic.script import ScriptDirectory
    config = AlembicConfig()
    config.set_main_option("script_location", str(Path(nbgrader.__file__).resolve().parent / "alembic"))
    return ScriptDirectory.from_config(config).get_current_head()


# nbgrader starts an `alembic` process for it each time it creates a gradebook (2 to 5 s: once per
# course, and once per assignment released or checked in a throw-away copy of the course)
nbgrader.api.get_alembic_version = alembic_head


def _tools_on_path() -> None:
    """Put this Python's scripts folder on PATH: nbgrader runs ``alembic`` from there
    when it creates a gradebook, also when the virtual environment is not activated."""
    scripts = os.path.dirname(sys.executable)
    if scripts not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = os.pathsep.join([scripts, os.environ.get("PATH", "")])


def write_json_atomic(path: Path, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` so that readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, sort_keys=True, ensure_ascii=False)
    os.replace(tmp, path)


def read_json(path: Path, default: Any = None) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return default


def open_gradebook(db_url: str, course_id: str) -> Gradebook:
    """Open nbgrader's gradebook; a :class:`CourseError` naming the database (never its
    password) when the URL's driver is missing or the server cannot be reached."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError, OperationalError
    try:
        shown = make_url(db_url).render_as_string(hide_password=True)
    except ArgumentError:
        raise CourseError(f"db_url {db_url!r} is not a database URL (e.g. sqlite:///grading/gradebook.db "
                          "or postgresql://user:password@host/database)") from None
    try:
        return Gradebook(db_url, course_id)
    except NoSuchModuleError:
        raise CourseError(f"db_url {shown}: no SQLAlchemy dialect for this URL; a PostgreSQL gradebook "
                          "is written postgresql://user:password@host/database") from None
    except ModuleNotFoundError as exc:
        raise CourseError(f"db_url {shown}: the database driver is not installed ({exc.name}); "
                          "install the course's requirements (pip install -c constraints.txt -e .)") from None
    except OperationalError as exc:
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else type(exc).__name__
        raise CourseError(f"cannot open the gradebook {shown}: {reason}") from None


def with_retry(gb: Gradebook, create: Callable[[], Any]) -> Any:
    """``create()`` (an nbgrader update_or_create call) once more when another process
    created the same row at the same moment (a shared database server)."""
    from nbgrader.api import InvalidEntry
    try:
        return create()
    except InvalidEntry:
        gb.db.rollback()
        return create()


def counted_points(auto: float | None, manual: float | None, extra: float | None) -> float:
    """A grade's points as they count: a person's score over the autograder's, plus extra credit."""
    return float((manual if manual is not None else (auto or 0.0)) + (extra or 0.0))


class Course:
    """One course folder: its nbgrader configuration, folders and gradebook."""

    def __init__(self, root: str | os.PathLike | None = None) -> None:
        _tools_on_path()
        self.root = Path(root).resolve() if root is not None else find_course_root()
        config_file = self.root / CONFIG_NAME
        if not config_file.is_file():
            raise CourseError(f"{self.root} has no {CONFIG_NAME}")
        loader = PyFileConfigLoader(CONFIG_NAME, path=str(self.root))
        self.config: Config = loader.load_config()
        self.config.CourseDirectory.root = str(self.root)
        self.coursedir = CourseDirectory(config=self.config)
        self._grading: Path | None = None  # set by writing_to

    def writing_to(self, where: Path) -> "Course":
        """This course as it is (its sources, releases, submissions and settings), with all that
        grading writes under ``where`` instead: the gradebook (a SQLite file there), the autograded
        notebooks, the grading reports, feedback and the locks. A dry run's course."""
        import copy

        elsewhere = copy.copy(self)
        elsewhere.config = copy.deepcopy(self.config)
        elsewhere.config.CourseDirectory.db_url = f"sqlite:///{where / 'grading' / 'gradebook.db'}"
        elsewhere.config.CourseDirectory.autograded_directory = str(where / "autograded")
        elsewhere.config.CourseDirectory.feedback_directory = str(where / "feedback")
        elsewhere.coursedir = CourseDirectory(config=elsewhere.config)
        elsewhere._grading = where / "grading"
        return elsewhere

    # -- folders ----------------------------------------------------------
    def _dir(self, name: str) -> Path:
        return self.root / getattr(self.coursedir, name)

    @property
    def source_dir(self) -> Path:
        return self._dir("source_directory")

    @property
    def release_dir(self) -> Path:
        return self._dir("release_directory")

    @property
    def submitted_dir(self) -> Path:
        return self._dir("submitted_directory")

    @property
    def autograded_dir(self) -> Path:
        return self._dir("autograded_directory")

    @property
    def feedback_dir(self) -> Path:
        return self._dir("feedback_directory")

    @property
    def grading_dir(self) -> Path:
        """Where the workbook's own records live (next to nbgrader's folders)."""
        return self._grading or self.submitted_dir.parent

    @property
    def reports_dir(self) -> Path:
        return self.grading_dir / "reports"

    @property
    def db_url(self) -> str:
        return self.coursedir.db_url

    @property
    def course_id(self) -> str:
        return self.coursedir.course_id

    def submission_dir(self, student: str, assignment: str) -> Path:
        return self.submitted_dir / student / assignment

    def autograded_path(self, student: str, assignment: str, notebook: str) -> Path:
        return self.autograded_dir / student / assignment / f"{notebook}.ipynb"

    def report_path(self, assignment: str, student: str) -> Path:
        return self.reports_dir / assignment / f"{student}.json"

    def collect_log_path(self, assignment: str) -> Path:
        return self.reports_dir / assignment / "_collect.json"

    @property
    def roster_path(self) -> Path:
        """The roster of the last ``collect --roster``: every id, with the name it gives."""
        return self.grading_dir / "roster.json"

    def roster(self) -> dict[str, str]:
        """``{student id: display name}`` of the last roster collect was given ({} without one);
        the names are the LMS's, shown through the outbound door like every student string."""
        data = read_json(self.roster_path, {}) or {}
        students = data.get("students", {}) if isinstance(data, dict) else {}
        return {str(k): str(v) for k, v in students.items()} if isinstance(students, dict) else {}

    def shown_student(self, student: str, names: dict[str, str] | None = None) -> str:
        """A student id for the terminal, with the roster's name beside it where there is one."""
        from ..doors.intake import shown
        name = (self.roster() if names is None else names).get(student, "")
        return shown(student, 64) + (f" ({shown(name, 60)})" if name else "")

    def setting(self, section: str, name: str, default: Any) -> Any:
        """A value from nbgrader_config.py (``c.<section>.<name>``), or ``default``."""
        if section in self.config and name in self.config[section]:
            return self.config[section][name]
        return default

    # -- gradebook --------------------------------------------------------
    @contextlib.contextmanager
    def gradebook(self) -> Iterator[Gradebook]:
        """nbgrader's gradebook at ``db_url``: a SQLite file or a database server
        (``postgresql://user:password@host/database``, driver psycopg2)."""
        self.grading_dir.mkdir(parents=True, exist_ok=True)
        with open_gradebook(self.db_url, self.course_id) as gb:
            yield gb

    def gradebook_rows(self, assignment: str) -> list[tuple]:
        """(student, notebook, grade id, auto, manual, extra credit, max, needs a person, the cell's
        kind) for every grade of the assignment, in one query."""
        from nbgrader.api import Assignment, BaseCell, Grade, Notebook, SubmittedAssignment, SubmittedNotebook

        with self.gradebook() as gb:
            query = (gb.db.query(SubmittedAssignment.student_id, Notebook.name, BaseCell.name, Grade.auto_score,
                                 Grade.manual_score, Grade.extra_credit, Grade.max_score, Grade.needs_manual_grade,
                                 BaseCell.type)
                     .join(SubmittedNotebook, Grade.notebook_id == SubmittedNotebook.id)
                     .join(Notebook, SubmittedNotebook.notebook_id == Notebook.id)
                     .join(SubmittedAssignment, SubmittedNotebook.assignment_id == SubmittedAssignment.id)
                     .join(Assignment, SubmittedAssignment.assignment_id == Assignment.id)
                     .join(BaseCell, Grade.cell_id == BaseCell.id)
                     .filter(Assignment.name == assignment))
            return [tuple(row) for row in query.all()]

    def gradebook_ready(self) -> tuple[bool, str]:
        """Whether the gradebook opens (a SQLite file is made by the first ``workbook
        release``), and what to say about it: where it is, or what is wrong."""
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError
        try:
            url = make_url(self.db_url)
        except ArgumentError:  # open_gradebook below says what is wrong with it
            url = None
        if url is not None and url.get_backend_name() == "sqlite":
            return True, f"a SQLite file, {url.database} (made by the first `workbook release`)"
        try:
            with self.gradebook():
                pass
            return True, f"ready ({url.render_as_string(hide_password=True)})"
        except CourseError as exc:
            return False, f"NOT READY: {exc}"

    def released_assignments(self) -> list[str]:
        """Assignments with a released folder, in name order."""
        if not self.release_dir.is_dir():
            return []
        return sorted(p.name for p in self.release_dir.iterdir()
                      if p.is_dir() and any(p.glob("*.ipynb")))

    def check_assignments(self, assignments: list[str] | None, released: bool = False) -> None:
        """Raise a one-line CourseError naming what exists when an assignment is unknown: not in
        the gradebook, or (``released``: for ``autograde``, which records them) not released."""
        if not assignments:
            return
        if released:
            known, where = sorted(self.released_assignments()), "released"
        else:
            with self.gradebook() as gb:
                known, where = sorted(a.name for a in gb.assignments), "the gradebook has"
        unknown = [a for a in assignments if a not in known]
        if unknown:
            raise CourseError(f"unknown assignment{'s' if len(unknown) > 1 else ''} {', '.join(map(shown, unknown))}; "
                              f"{where}: {', '.join(known) or 'none (run `workbook release`)'}")

    def check_submitted(self, assignment: str, students: list[str] | None) -> None:
        """Raise a one-line CourseError naming who was collected when one of ``students`` has
        no submission of ``assignment``."""
        known = self.submitted_students(assignment)
        unknown = [s for s in students or [] if s not in known]
        if unknown:
            raise CourseError(f"no submission of {assignment} for: {', '.join(map(shown, unknown))} (collected: "
                              f"{', '.join(known[:8]) + (' …' if len(known) > 8 else '') if known else 'nobody'})")

    def released_notebooks(self, assignment: str) -> dict[str, Path]:
        """Released notebooks of ``assignment``: notebook name -> path."""
        folder = self.release_dir / assignment
        return {p.stem: p for p in sorted(folder.glob("*.ipynb"))}

    def submitted_assignments(self) -> list[str]:
        """Assignments that have at least one submission folder."""
        if not self.submitted_dir.is_dir():
            return []
        found = {p.name for student in self.submitted_dir.iterdir() if student.is_dir() and not student.is_symlink()
                 for p in student.iterdir() if p.is_dir()}
        return sorted(found)

    def submitted_students(self, assignment: str) -> list[str]:
        """Students with a submission folder of ``assignment``, whose folder name is a
        student id (:func:`autograder.doors.intake.student_id`; see :meth:`refused_folders`)."""
        return sorted(name for name, why in self._submission_folders(assignment) if not why)

    def refused_folders(self, assignment: str) -> list[str]:
        """Why each submission folder of ``assignment`` whose name is no student id is left
        alone (put there by hand, not by ``workbook collect``), its name escaped."""
        return [why for _, why in self._submission_folders(assignment) if why]

    def _submission_folders(self, assignment: str) -> list[tuple[str, str]]:
        from ..doors.intake import Refused, student_id
        if not self.submitted_dir.is_dir():
            return []
        found = []
        for folder in self.submitted_dir.iterdir():
            if folder.is_symlink() or not (folder / assignment).is_dir() or (folder / assignment).is_symlink():
                continue
            try:
                found.append((student_id(folder.name), ""))
            except Refused as exc:
                found.append((folder.name, f"grading/submitted/: {exc}; not graded"))
        return sorted(found)
