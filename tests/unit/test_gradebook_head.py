"""A gradebook that ``workbook`` creates carries nbgrader's newest migration, read in the
instructor's process (autograder/course/course.py ``alembic_head``) instead of by the
``alembic`` process nbgrader starts for it each time."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys

from autograder.course.course import alembic_head


def test_the_head_is_the_one_nbgraders_own_alembic_run_prints():
    scripts = os.path.dirname(sys.executable)
    env = {**os.environ, "PATH": os.pathsep.join([scripts, os.environ.get("PATH", "")])}
    printed = subprocess.run([sys.executable, "-c", "from nbgrader.api import get_alembic_version as v; print(v())"],
                             capture_output=True, text=True, env=env, check=True).stdout.strip()
    assert printed and alembic_head() == printed


def test_a_new_gradebook_is_stamped_with_it(tmp_path):
    import nbgrader.api
    from nbgrader.api import Gradebook
    assert nbgrader.api.get_alembic_version is alembic_head  # no alembic process started
    with Gradebook(f"sqlite:///{tmp_path / 'gradebook.db'}"):
        pass
    with sqlite3.connect(tmp_path / "gradebook.db") as db:
        assert db.execute("SELECT version_num FROM alembic_version").fetchall() == [(alembic_head(),)]
