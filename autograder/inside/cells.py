"""What a notebook cell is to the grader: its nbgrader metadata, its label in a message, and
whether it is a test cell (graded, not a solution). Used on both sides of the sandbox: by the runner inside it
(autograder/inside/notebook_runner.py, which imports it as a top-level module) and by the grader outside."""

from __future__ import annotations


def nbgrader_meta(cell: dict) -> dict:
    """The cell's ``metadata.nbgrader`` dict (empty when absent or not a dict)."""
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return meta if isinstance(meta, dict) else {}


def cell_label(index: int, cell: dict) -> str:
    """How the grader names a cell in a message: ``cell 4 (test_causal_mask)``."""
    gid = nbgrader_meta(cell).get("grade_id", "")
    return f"cell {index}" + (f" ({gid})" if gid else "")


def is_test_cell(cell: dict) -> bool:
    """A code cell with points that is not a solution cell: an autograder test."""
    meta = nbgrader_meta(cell)
    return cell.get("cell_type") == "code" and bool(meta.get("grade")) and not meta.get("solution")
