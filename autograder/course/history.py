"""How each score came to be: every grade the autograder records for a graded cell, with when,
the course's fingerprint that produced it and how (``autograde``, ``regrade``, ``regrade, kept
higher``), in a table of the workbook's own beside nbgrader's in the gradebook
(``workbook_grade_history``), written in the same transaction as the grade itself.

``workbook status --history STUDENT`` reads it (:func:`history`); ``workbook gradebook migrate``
moves it with nbgrader's tables (:data:`TABLES`).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from nbgrader.api import Gradebook
from sqlalchemy import Column, DateTime, Float, Integer, MetaData, String, Table, select

__all__ = ["HISTORY", "TABLES", "ensure", "add", "history"]

_METADATA = MetaData()
HISTORY = Table(
    "workbook_grade_history", _METADATA,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("assignment", String(128), nullable=False, index=True),
    Column("notebook", String(128), nullable=False),
    Column("student", String(128), nullable=False, index=True),
    Column("cell", String(128), nullable=False),  # the graded cell's grade_id
    Column("points", Float),  # the autograder's points (None: a written answer it does not score)
    Column("max_points", Float),
    Column("recorded_at", DateTime, nullable=False),  # UTC
    Column("course", String(64), nullable=False),  # the course's fingerprint (autograder/course/manifest.py)
    Column("how", String(400), nullable=False),
)
TABLES = (HISTORY,)


def ensure(gb: Gradebook) -> None:
    """The history table in ``gb``'s database, made within its session (no second connection,
    which a SQLite file would lock out) and committed."""
    from sqlalchemy.exc import DBAPIError

    try:
        HISTORY.create(bind=gb.db.connection(), checkfirst=True)
        gb.db.commit()
    except DBAPIError:  # another grader made it at the same moment (a database server)
        gb.db.rollback()


def add(gb: Gradebook, assignment: str, notebook: str, student: str, grades: list[tuple[str, Any, Any]],
        course: str, how: str, when: dt.datetime | None = None) -> None:
    """One row per ``(cell, points, max_points)`` of a notebook just recorded, in the session's
    open transaction (committed with the grades themselves)."""
    when = when or dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    rows = [{"assignment": assignment, "notebook": notebook, "student": student, "cell": cell,
             "points": None if points is None else float(points),
             "max_points": None if max_points is None else float(max_points),
             "recorded_at": when, "course": course[:64], "how": how[:400]} for cell, points, max_points in grades]
    if rows:
        gb.db.execute(HISTORY.insert(), rows)


def history(gb: Gradebook, student: str, assignment: str | None = None) -> list[dict]:
    """Every recorded grade of ``student`` (of ``assignment`` only, if given), oldest first."""
    ensure(gb)
    query = select(HISTORY).where(HISTORY.c.student == student)
    if assignment:
        query = query.where(HISTORY.c.assignment == assignment)
    query = query.order_by(HISTORY.c.assignment, HISTORY.c.notebook, HISTORY.c.cell, HISTORY.c.id)
    return [dict(row) for row in gb.db.execute(query).mappings()]
