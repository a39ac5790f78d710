"""What the grader keeps of a notebook while it runs sealed off: each cell's outputs
(validated, stripped to safe types, capped again here), its execution counts and status, the
problems found, and how the run ended.

The sandbox's process sends outputs as it likes; nothing of it is believed:
:meth:`Transcript.add_output` takes an output only for the cell that is running, never for a
test cell (which shows the grader's report only), and cuts a cell past its output limit with
one notice and one problem. :func:`cell_errors` turns the cells that raised into problems once
the run is over.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..course.problems import problem
from ..doors.outbound import IMAGE_TYPES, clean_output, clean_text
from ..inside.cells import cell_label, is_test_cell, nbgrader_meta
from ..inside.channel import ProtocolError
from ..sealing.sandbox import Limits
from .handoffs import Ending

__all__ = ["Transcript", "CELL_MESSAGES", "cell_errors", "exit_words"]


@dataclass
class Transcript:
    """One notebook's run, as the grader records it."""

    cells: list[dict]
    limits: Limits
    outputs: dict[int, list[dict]] = field(default_factory=dict)
    counts: dict[int, int | None] = field(default_factory=dict)
    status: dict[int, str] = field(default_factory=dict)
    events: list[dict] = field(default_factory=list)
    used: dict[int, int] = field(default_factory=dict)
    total: int = 0
    truncated: set[int] = field(default_factory=set)
    ending: Ending | None = None  # why the run stopped early (None while it runs, and when it finished)
    reason: str = ""  # ... in words
    ended_at: int | None = None
    not_run: set[int] = field(default_factory=set)  # cells that stopped at what does not run while grading
    _current: int | None = None  # the cell running now
    _last_cell: int = -1
    _cell_started: float = 0.0
    _done: bool = False

    # -- the cells' state: written only here, as the runner's messages say (run_protocol.py) --
    @property
    def current(self) -> int | None:
        """The cell running now (None between cells)."""
        return self._current

    @property
    def cell_started(self) -> float:
        """When the running cell started (``time.monotonic()``)."""
        return self._cell_started

    @property
    def done(self) -> bool:
        """The notebook said it is done (or called exit())."""
        return self._done

    @property
    def before_first_cell(self) -> bool:
        return self._current is None and self._last_cell < 0

    def graded_up_to(self) -> int:
        """The last cell that has finished (-1 before the first)."""
        return self._last_cell if self._current is None else self._current - 1

    def start_cell(self, index: Any) -> None:
        """Cell ``index`` starts; a :class:`ProtocolError` unless it comes after the last one."""
        if not _cell_index(index) or not 0 <= index < len(self.cells) or index <= self._last_cell:
            raise ProtocolError("cells run in order, each once")
        self._current, self._cell_started, self._last_cell = index, time.monotonic(), index

    def end_cell(self, index: Any, count: Any, status: Any) -> None:
        """The running cell ``index`` ended (its execution count and status as the runner says;
        anything else is ignored)."""
        if not _cell_index(index) or index != self._current:
            return
        self.counts[index] = count if isinstance(count, int) and not isinstance(count, bool) else None
        self.status[index] = status if isinstance(status, str) else "ok"
        if status == "timeout":
            self.event("cell_timeout", index,
                       f"the cell ran longer than the {self.limits.cell_timeout} s limit and was interrupted")
        self._current = None

    def called_exit(self, index: Any) -> None:
        """The notebook called exit() (in cell ``index``, or the running one)."""
        self.end(Ending.EXIT_CALLED, "the notebook called exit()",
                 index if _cell_index(index) and 0 <= index < len(self.cells) else self._current)
        self._done = True

    def finished(self) -> None:
        """The runner says the notebook is done."""
        self._done = True

    def runner_dropped(self, index: Any) -> None:
        """The runner dropped output of the running cell before sending it."""
        if _cell_index(index) and index == self._current and index not in self.truncated:
            self.truncate(index)

    # -- the runner's messages about the cells (run_protocol.Conversation.handle hands them over) --
    def on_cell_start(self, message: dict) -> None:
        self.start_cell(message.get("index"))

    def on_output(self, message: dict) -> None:
        self.add_output(message.get("index"), message.get("output"))

    def on_truncated(self, message: dict) -> None:
        self.runner_dropped(message.get("index"))

    def on_cell_end(self, message: dict) -> None:
        self.end_cell(message.get("index"), message.get("execution_count"), message.get("status"))

    def on_exit(self, message: dict) -> None:
        self.called_exit(message.get("index"))

    def on_done(self, message: dict) -> None:
        self.finished()

    def event(self, kind: str, index: int | None, message: str) -> None:
        cell = self.cells[index] if index is not None and 0 <= index < len(self.cells) else {}
        where = cell_label(index, cell) + ": " if index is not None else ""
        self.events.append(problem(kind, clean_text(where + message), clean_text(nbgrader_meta(cell).get("grade_id", ""))))

    def end(self, ending: Ending, reason: str, at: int | None, kind: str = "") -> None:
        """The run stopped early (``kind``: the problem to record, with the reason)."""
        self.ending, self.reason, self.ended_at = ending, reason, at
        if kind:
            self.event(kind, at, reason)

    def truncate(self, index: int) -> None:
        """Drop the rest of cell ``index``'s output: a notice in the cell and a problem."""
        self.truncated.add(index)
        self.outputs.setdefault(index, []).append(
            {"output_type": "stream", "name": "stdout",
             "text": f"\n... output truncated: this cell printed more than {self.limits.max_output_kb} kB ...\n"})
        self.event("output_truncated", index, f"the cell printed more than {self.limits.max_output_kb} kB; "
                                              "the rest was dropped")

    def add_output(self, index: Any, output: Any) -> None:
        if not _cell_index(index) or index != self._current:
            return
        if is_test_cell(self.cells[index]):
            return  # a test cell shows the grader's report only
        clean = clean_output(output)
        if clean is None or index in self.truncated:
            return
        clean = self._quiet(index, clean)
        kind = clean["output_type"]
        size = (len(clean["text"]) if kind == "stream" else
                len(clean["evalue"]) + sum(len(t) for t in clean["traceback"]) if kind == "error" else
                sum(len(v) for v in clean["data"].values()))
        cell_cap = self.limits.max_output_kb * 1024
        nb_cap = self.limits.max_notebook_output_kb * 1024
        used = self.used.get(index, 0)
        if kind not in ("stream", "error") and set(clean["data"]) & set(IMAGE_TYPES):
            # a figure's image counts against the notebook's outputs, not the cell's (that limit is for
            # what a cell prints); what it carries beside the image (its text/plain, any HTML) is printed
            # matter and counts against the cell, dropped where it does not fit. A figure that does not
            # fit is left out whole, with a line, and the cell goes on
            beside = sum(len(v) for k, v in clean["data"].items() if k not in IMAGE_TYPES)
            if beside and used + beside > cell_cap:
                clean["data"] = {k: v for k, v in clean["data"].items() if k in IMAGE_TYPES}
                size, beside = size - beside, 0
            if self.total + size <= nb_cap:
                self.total += size
                self.used[index] = used + beside
                self.outputs.setdefault(index, []).append(clean)
                return
            clean = {"output_type": "stream", "name": "stdout",
                     "text": f"[a figure of {size // 1024} kB left out: the notebook's outputs would pass the "
                             f"{self.limits.max_notebook_output_kb} kB the grader keeps]\n"}
            size = len(clean["text"])
        if used + size > cell_cap or self.total + size > nb_cap:
            room = max(0, min(cell_cap - used, nb_cap - self.total))
            if clean["output_type"] == "stream" and room > 0:
                clean["text"] = clean["text"][:room]
                self.outputs.setdefault(index, []).append(clean)
                self.total += room
            self.truncate(index)
            return
        self.used[index] = used + size
        self.total += size
        self.outputs.setdefault(index, []).append(clean)

    def _quiet(self, index: int, output: dict) -> dict:
        """An error that says only that the cell cannot run while grading (course_lib's reference
        for one of the notebook's items is not there: a demonstration), and a ``NameError`` of a
        later cell that needed what such a cell would have made, become one line: what did not
        run and that it does not count, without a traceback (whose frames are the sandbox's)."""
        if output["output_type"] != "error":
            return output
        if output["ename"] == "ReferenceUnavailable":
            why = output["evalue"].strip().splitlines()[0] if output["evalue"].strip() else "not available"
        elif output["ename"] == "NameError" and self.not_run and min(self.not_run) < index:
            why = (f"{output['evalue'].strip()[:200]}: a cell above that does not run while the notebook is graded "
                   "would have made it; this cell does not count towards the grade.")
        else:
            return output
        self.not_run.add(index)
        return {"output_type": "stream", "name": "stdout", "text": f"[not run while graded] {why}\n"}

    def finish(self, exit_status: int | None) -> None:
        """The run is over (``exit_status``: its process's, None if killed here): how it ended,
        in words and as problems, and a problem for each cell that raised."""
        if self.ending is Ending.PROCESS_ENDED:
            self.reason += exit_words(exit_status)
            self.event("kernel_died", self.ended_at, self.reason + " (os._exit, exit(), a crash such as a "
                                                                   "segmentation fault, or running out of memory)")
        elif self.ending is Ending.EXIT_CALLED:
            self.event("kernel_died", self.ended_at, self.reason)
        if not self.done and self.ending is None:
            self.ending, self.reason = Ending.STOPPED, "the notebook stopped"
        cell_errors(self)


def _cell_index(value: Any) -> bool:
    """Whether the runner sent a cell's index as a plain int (its messages may be forged: a
    tensor, a bool or an int subclass compares as it likes)."""
    return type(value) is int


CELL_MESSAGES: dict[str, Callable[[Transcript, dict], None]] = {
    "cell_start": Transcript.on_cell_start, "output": Transcript.on_output, "truncated": Transcript.on_truncated,
    "cell_end": Transcript.on_cell_end, "exit": Transcript.on_exit, "done": Transcript.on_done,
}


def exit_words(code: int | None) -> str:
    if code is None:
        return ""
    if code > 128:
        try:
            return f", killed by {signal.Signals(code - 128).name}"
        except ValueError:
            return f", killed by signal {code - 128}"
    if code < 0:
        try:
            return f", killed by {signal.Signals(-code).name}"
        except ValueError:
            return f", killed by signal {-code}"
    return f", exit code {code}"


def cell_errors(transcript: Transcript) -> None:
    """One ``error`` problem for each cell (not a test cell) that raised.

    A cell stopped by an unfinished item or by a reference that is not available while
    grading is not a problem, and neither is a later cell's ``NameError`` (a name the
    stopped cell would have defined, as in notebook 05's demonstration of relative
    positions)."""
    skipped = False
    for index, outputs in sorted(transcript.outputs.items()):
        if is_test_cell(transcript.cells[index]) or transcript.status.get(index) == "timeout":
            continue
        if index in transcript.not_run:
            skipped = True  # (its error was made one quiet line: autograder/pipeline/run_transcript.py)
            continue
        for output in outputs:
            if output["output_type"] == "error" and output["ename"] not in ("KeyboardInterrupt",):
                if (output["ename"] in ("NotImplementedError", "ReferenceUnavailable")
                        or "not available while this notebook is graded" in output["evalue"]):
                    skipped = True
                    break  # an unfinished item, or a demonstration of this notebook's references: not a new problem
                if skipped and output["ename"] == "NameError":
                    break
                transcript.event("error", index, f"raised {output['ename']}: {output['evalue'][:300]}")
                break
