"""``workbook feedback -j N``: students' pages rendered in forked, bounded processes, N at once
(autograder/reports/feedback.py ``bounded_many``). One student's render that fails, hangs or
dies never costs another theirs, and the results come back in the order asked."""

from __future__ import annotations

import os
import time
from pathlib import Path

from autograder.reports.feedback import bounded_many


def _write(path: str, text: str) -> None:
    Path(path).write_text(text)


def _fail(message: str) -> None:
    raise ValueError(message)


def _hang() -> None:
    time.sleep(60)


def _die() -> None:
    os._exit(3)


def _meet(folder: str, me: str, other: str) -> None:
    """Finishes only when the other render has started too (a rendezvous through files)."""
    Path(folder, me).write_text("")
    deadline = time.monotonic() + 20
    while not Path(folder, other).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{other} never started beside {me}")
        time.sleep(0.02)


def test_each_render_reports_its_own_ending_in_order(tmp_path):
    calls = [(_write, (str(tmp_path / "a"), "A")), (_fail, ("a student's name\u202e",)), (_hang, ()),
             (_die, ()), (_write, (str(tmp_path / "b"), "B"))]
    results = bounded_many(calls, workers=2, seconds=3)
    assert results[0] == "" and (tmp_path / "a").read_text() == "A"
    assert results[1] == "ValueError: a student's name\u202e"
    assert results[2] == "it took longer than 3 s and was stopped"
    assert results[3].startswith("it stopped (exit code 3;")
    assert results[4] == "" and (tmp_path / "b").read_text() == "B"  # after a hung and a dead one


def test_workers_render_side_by_side(tmp_path):
    """With two workers, two renders that wait for each other both finish; one at a time, the
    first cannot (it is stopped at its limit), so the renders really overlap."""
    pair = [(_meet, (str(tmp_path), "one", "two")), (_meet, (str(tmp_path), "two", "one"))]
    assert bounded_many(pair, workers=2, seconds=15) == ["", ""]
    alone = tmp_path / "alone"
    alone.mkdir()
    results = bounded_many([(_meet, (str(alone), "one", "two")), (_meet, (str(alone), "two", "one"))],
                           workers=1, seconds=2)
    assert results[0] == "it took longer than 2 s and was stopped", results
    assert results[1].startswith("TimeoutError") or results[1] == "", results  # "one" was there before it
