"""What a notebook writes straight to the runner's channel, as a student's code can: the grader
keeps its limits between any two messages, however many arrive in one read.

One sealed run of notebook 03 (fresh sandbox, the slot's user), about 30 s."""

from __future__ import annotations

import os

import nbformat
import pytest

from autograder.inside.cells import is_test_cell, item_of, nbgrader_meta
from autograder.pipeline import run
from autograder.pipeline.worker import grade_notebook
from autograder.sealing import sandbox
from autograder.sealing.course_copy import build_course_copy
from nbtools import filled

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="the slot's user needs the grader to be root")]

CALLS = 1000

# After causal_mask has been graded (so the oracle answers it), one write of CALLS oracle requests,
# each some tens of milliseconds of the reference's time outside the sandbox; a thread reads the
# replies (a grader whose replies are not read stops the run), and the cell swallows its interrupt.
BURST = r'''
import struct, threading, time
import workbook_runner
from course_lib.grading.answer.wire import encode
channel = workbook_runner._CHANNEL
def read_replies():
    for _ in range(@CALLS@):
        channel.recv()
threading.Thread(target=read_replies, daemon=True).start()
frame = encode({"type": "oracle", "name": "course_lib.attention:causal_mask", "args": (1500,), "kwargs": {}},
               kind="message")
channel.sock.sendall((struct.pack("<I", len(frame)) + frame) * @CALLS@)
while True:
    try:
        time.sleep(1)
    except KeyboardInterrupt:
        pass
'''.replace("@CALLS@", str(CALLS))


@pytest.mark.timeout(600)
def test_a_burst_of_oracle_calls_in_one_write_is_stopped_at_the_cells_limit(tmp_path, monkeypatch):
    """The serve loop used to handle every message of one read before it looked at the clock:
    a cell that wrote its requests in one go was served all of them (here 1,000 of the
    reference's calls, outside the sandbox; with slower calls, hours), past its cell's limit
    and its notebook's. Now the limits are checked after each message, and a call of the
    reference takes at most the time the run has left."""
    sandbox.check_available()
    monkeypatch.setattr(run, "GRACE", 1.0)
    monkeypatch.setattr(run, "STARVED_MAX", 2.0)
    nb = filled("03_self_attention", {})
    cells = []
    for cell in nb.cells:
        cells.append(cell)
        if is_test_cell(cell) and nbgrader_meta(cell)["grade_id"] == "test_causal_mask":
            cells.append(nbformat.v4.new_code_cell(BURST))
    nb.cells = cells
    items = sorted({item_of(nbgrader_meta(c)["grade_id"]) for c in nb.cells if is_test_cell(c)})
    items = [i for i in items if run.known_item(i)]
    tmp_path.chmod(0o711)
    copy = build_course_copy(tmp_path / "course", items)
    limits = sandbox.Limits(cell_timeout=8, notebook_timeout=180, memory_mb=3072)
    job = {"notebook": nbformat.writes(nb), "limits": limits.__dict__.copy(), "salts": {}, "extra_files": [],
           "job_id": "burst"}
    result = grade_notebook(job, copy, tmp_path / "job", uid=sandbox.SANDBOX_UID_BASE + 4322)
    assert not result.get("crash"), result
    stopped = [p["message"] for p in result["problems"] if p["kind"] == "cell_timeout"]
    assert stopped and "did not stop when interrupted" in stopped[0], result["problems"]
    late = float(stopped[0].split("(stopped ", 1)[1].split(" s after", 1)[0])
    assert late < run.GRACE + run.STARVED_MAX + 2.0, stopped[0]
    assert 0 < result["oracle_calls"] < CALLS, result["oracle_calls"]
    # what was graded before the burst kept its points
    scores = {c["grade_id"]: c["score"] for c in result["cells"]}
    assert scores["test_causal_mask"] > 0, scores
