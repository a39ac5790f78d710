"""What a notebook cell is to the grader: its nbgrader metadata, and whether it is a test
cell (graded, not a solution). Used on both sides of the sandbox: by the runner inside it
(autograder/inside/notebook_runner.py, which imports it as a top-level module) and by the grader outside."""

from __future__ import annotations


def nbgrader_meta(cell: dict) -> dict:
    """The cell's ``metadata.nbgrader`` dict (empty when absent or not a dict)."""
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return meta if isinstance(meta, dict) else {}


def is_test_cell(cell: dict) -> bool:
    """A code cell with points that is not a solution cell: an autograder test."""
    meta = nbgrader_meta(cell)
    return cell.get("cell_type") == "code" and bool(meta.get("grade")) and not meta.get("solution")
