"""``workbook gradebook migrate``: move a course's gradebook to another database.

A course starts on the SQLite file ``grading/gradebook.db``; with several graders it moves
to PostgreSQL (``c.CourseDirectory.db_url`` in nbgrader_config.py). Changing the URL alone
would start an empty gradebook while the old one holds every grade: every ``workbook``
command refuses that state (:func:`check_switch`) and names both databases, and
:func:`migrate` copies every row of nbgrader's tables (students, assignments, notebooks,
cells, submissions, grades, comments) into the new one, which must be empty. Rows keep
their ids (nbgrader's primary keys are strings, so no sequence needs moving); the workbook's
history of grades (autograder/course/history.py) follows, numbered anew by the new database.
"""

from __future__ import annotations

from pathlib import Path

from . import history
from .course import Course, CourseError, open_gradebook

__all__ = ["default_sqlite_url", "migrate", "check_switch", "row_counts"]


def default_sqlite_url(course: Course) -> str:
    """The SQLite gradebook a course starts with: ``grading/gradebook.db``."""
    return f"sqlite:///{course.grading_dir / 'gradebook.db'}"


def _shown(url: str) -> str:
    from sqlalchemy.engine import make_url
    return make_url(url).render_as_string(hide_password=True)


def row_counts(url: str, course_id: str) -> dict[str, int]:
    """``{table: rows}`` of nbgrader's tables in the gradebook at ``url``."""
    from nbgrader.api import Base
    from sqlalchemy import func, select

    with open_gradebook(url, course_id) as gb:
        return {t.name: gb.db.execute(select(func.count()).select_from(t)).scalar_one()
                for t in Base.metadata.sorted_tables}


def _students(url: str, course_id: str) -> int:
    return row_counts(url, course_id).get("student", 0)


def check_switch(course: Course) -> None:
    """Refuse a course whose gradebook moved to a server while ``grading/gradebook.db`` still
    holds the grades: a :class:`CourseError` naming both, and what to run."""
    sqlite = default_sqlite_url(course)
    if course.db_url.startswith("sqlite") or not (course.grading_dir / "gradebook.db").is_file():
        return
    old = _students(sqlite, course.course_id)
    if old and not _students(course.db_url, course.course_id):
        raise CourseError(
            f"the gradebook is now {_shown(course.db_url)} (nbgrader_config.py), which is empty, but "
            f"{course.grading_dir / 'gradebook.db'} holds {old} students' grades: run `workbook gradebook migrate` "
            "to copy them over, or move that file away to start the new gradebook empty")


def migrate(course: Course, source: str | None = None, target: str | None = None) -> dict[str, int]:
    """Copy every row of the gradebook at ``source`` (default: ``grading/gradebook.db``) into
    the empty one at ``target`` (default: the course's ``db_url``); returns rows per table."""
    from nbgrader.api import Base
    from sqlalchemy import insert, select

    source = source or default_sqlite_url(course)
    target = target or course.db_url
    if source == target:
        raise CourseError(f"the gradebook is already {_shown(target)}; name the one to copy from with --from")
    if source.startswith("sqlite:///") and not Path(source.removeprefix("sqlite:///")).is_file():
        raise CourseError(f"no gradebook to copy: {source.removeprefix('sqlite:///')} does not exist")
    filled = {t: n for t, n in row_counts(target, course.course_id).items() if n and t != "course"}
    if filled:
        raise CourseError(f"{_shown(target)} is not empty ({', '.join(f'{n} {t}' for t, n in filled.items())}); "
                          "migrate only into a new gradebook")
    copied = {}
    with open_gradebook(source, course.course_id) as old, open_gradebook(target, course.course_id) as new:
        for table in Base.metadata.sorted_tables:  # parents before children
            rows = [dict(r) for r in old.db.execute(select(table)).mappings()]
            if table.name == "course":  # nbgrader made the course's row when it opened the new gradebook
                present = {r[0] for r in new.db.execute(select(table.c.id))}
                rows = [r for r in rows if r["id"] not in present]
            if rows:
                new.db.execute(insert(table), rows)
            copied[table.name] = len(rows)
        new.db.commit()
        copied[history.HISTORY.name] = _copy_history(old, new)
    return copied


def _copy_history(old, new) -> int:
    """The history of grades, oldest first, if the old gradebook has one."""
    from sqlalchemy import insert, inspect, select

    history.ensure(new)
    if not inspect(old.db.get_bind()).has_table(history.HISTORY.name):
        return 0
    rows = [{k: v for k, v in r.items() if k != "id"}
            for r in old.db.execute(select(history.HISTORY).order_by(history.HISTORY.c.id)).mappings()]
    if rows:
        new.db.execute(insert(history.HISTORY), rows)
        new.db.commit()
    return len(rows)
