"""Every solution notebook runs top to bottom with every graded cell at full points;
every student notebook runs too, its test cells reporting the stub, not crashing."""

from __future__ import annotations

import pytest

from autograder.release import assignments
from nbtools import errors, executed_solution, result, stderr, graded_cells, text

ASSIGNMENTS = assignments()


@pytest.mark.slow
@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_solution_notebook_runs_with_full_points(assignment):
    nb, seconds = executed_solution(assignment)
    assert not errors(nb), errors(nb)
    cells = graded_cells(nb)
    assert cells, "no graded test cells"
    for c in cells:
        gid = c.metadata.nbgrader.grade_id
        points = float(c.metadata.nbgrader.points)
        assert result(c) is not None and float(result(c)) == points, f"{gid}: {text(c)}"
        shown = next(o.data.get("text/markdown") for o in c.outputs if o.output_type == "execute_result")
        assert shown == f"**{points:g} / {points:g} points**", shown  # what JupyterLab shows
        assert stderr(c) == "", f"{gid} wrote to stderr: {stderr(c)}"


@pytest.mark.slow
@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_student_notebook_runs_and_reports_stubs(assignment):
    nb, seconds = executed_solution(assignment, student=True)
    assert not errors(nb), "a cell crashed in the released notebook: " + "; ".join(errors(nb))
    for c in graded_cells(nb):
        gid = c.metadata.nbgrader.grade_id
        assert float(result(c)) == 0.0, gid
        assert "NotImplementedError" in text(c) and "stub" in text(c), f"{gid}: {text(c)}"
        assert stderr(c) == ""
