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


TEST_PREFIX = "test_"


def item_of(grade_id: str) -> str:
    """The graded item a test cell's grade_id names: ``test_causal_mask`` → ``causal_mask``."""
    return grade_id.removeprefix(TEST_PREFIX)


def test_id_of(item: str) -> str:
    """The grade_id of an item's test cell: ``causal_mask`` → ``test_causal_mask``."""
    return TEST_PREFIX + item
