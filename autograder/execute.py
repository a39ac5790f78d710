"""Execute one notebook under limits, with nbgrader's ``Execute`` preprocessor.

:class:`LimitedExecute` adds to nbgrader's executor:

- a whole-notebook time limit on top of the per-cell one (each cell gets the smaller
  of the cell limit and the time left; cells after the deadline are not run);
- a cap on the text a cell may print (the rest is dropped as it arrives, so that a
  student printing gigabytes cannot exhaust the grader's memory);
- a kernel that survives nothing silently: when it dies (``os._exit``, a segfault,
  ``exit()``), the cell and every later code cell get an error output, so that
  nbgrader scores their tests 0 instead of the full points it gives a test cell with
  no output;
- the kernel started through :mod:`autograder.sandbox` (memory and file-size limits,
  its process id recorded) in a working directory outside the course folder.

Every problem is recorded as an :class:`Event` (kind, cell, message) for the report.
"""

from __future__ import annotations

import math
import signal
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

from jupyter_client.manager import AsyncKernelManager
from nbclient.exceptions import DeadKernelError
from nbformat import NotebookNode
from nbgrader.preprocessors import Execute
from traitlets import List, Unicode
from traitlets.config import Config

__all__ = ["Limits", "Event", "LimitedExecute", "SandboxKernelManager", "execute_notebook"]


@dataclass
class Limits:
    """Resource limits for one notebook run (times in seconds, sizes as named)."""

    cell_timeout: int = 300
    notebook_timeout: int = 1800
    memory_mb: int | None = 4096
    file_mb: int | None = 100
    max_output_kb: int = 256
    startup_timeout: int = 120

    def __post_init__(self) -> None:
        for name in ("cell_timeout", "notebook_timeout", "max_output_kb", "startup_timeout"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"Limits.{name} must be a positive integer, got {value!r}")
        for name in ("memory_mb", "file_mb"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise ValueError(f"Limits.{name} must be a positive integer or None, got {value!r}")


@dataclass
class Event:
    """Something that went wrong while running a notebook."""

    kind: str  # cell_timeout | notebook_timeout | kernel_died | output_truncated | error
    cell: int | None  # index of the cell in the notebook
    message: str
    grade_id: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class SandboxKernelManager(AsyncKernelManager):
    """A kernel manager whose kernel command goes through :mod:`autograder.sandbox`."""

    sandbox_args = List(Unicode(), []).tag(config=True)

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        cmd = super().format_kernel_cmd(extra_arguments)
        return [sys.executable, "-m", "autograder.sandbox", *self.sandbox_args, "--", *cmd]


def _error_output(ename: str, evalue: str) -> NotebookNode:
    return NotebookNode(output_type="error", ename=ename, evalue=evalue,
                        traceback=[f"{ename}: {evalue}"])


def _grade_id(cell: NotebookNode) -> str:
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id", "") or ""


class LimitedExecute(Execute):
    """nbgrader's ``Execute`` with a notebook deadline, an output cap and crash handling."""

    def __init__(self, limits: Limits, **kwargs: Any) -> None:
        kwargs.setdefault("kernel_manager_class", SandboxKernelManager)
        super().__init__(**kwargs)
        self.limits = limits
        self.timeout = limits.cell_timeout
        self.startup_timeout = limits.startup_timeout
        self.timeout_func = self._cell_time_left
        self.events: list[Event] = []
        self._deadline: float | None = None
        self._dead = False
        self._printed: dict[int, int] = {}
        self._truncated: set[int] = set()

    # -- time -------------------------------------------------------------
    def _time_left(self) -> float:
        return math.inf if self._deadline is None else self._deadline - time.monotonic()

    def _cell_time_left(self, cell: NotebookNode) -> int:
        return max(1, min(self.limits.cell_timeout, math.ceil(self._time_left())))

    # -- running ----------------------------------------------------------
    def preprocess(self, nb: NotebookNode, resources: Any = None, km: Any = None):  # noqa: ANN201
        self._deadline = time.monotonic() + self.limits.notebook_timeout
        self._dead = False
        self.events = []
        self._printed = {}
        self._truncated = set()
        return super().preprocess(nb, resources, km)

    def _skip(self, cell: NotebookNode, index: int, kind: str, message: str) -> None:
        cell.outputs = [_error_output("NotRun", message)]
        cell.execution_count = None
        if not any(e.kind == kind for e in self.events):
            self.events.append(Event(kind, index, message, _grade_id(cell)))

    def preprocess_cell(self, cell: NotebookNode, resources: Any, index: int):  # noqa: ANN201
        if cell.cell_type != "code" or not cell.source.strip():
            return cell, resources
        if self._dead:
            self._skip(cell, index, "kernel_died", "not run: the kernel died in an earlier cell")
            return cell, resources
        if self._time_left() <= 0:
            self._skip(cell, index, "notebook_timeout",
                       f"not run: the notebook time limit ({self.limits.notebook_timeout} s) was reached")
            return cell, resources
        started = time.monotonic()
        allowed = self._cell_time_left(cell)
        try:
            cell, resources = super().preprocess_cell(cell, resources, index)
        except DeadKernelError:
            self._dead = True
            message = ("the kernel died while running this cell" + self._exit_status() +
                       " (os._exit, exit(), a crash such as a segmentation fault, or running out of memory)")
            cell.outputs = list(cell.get("outputs", [])) + [_error_output("DeadKernelError", message)]
            self.events.append(Event("kernel_died", index, message, _grade_id(cell)))
            return cell, resources
        timed_out = any(o.get("output_type") == "error" and o.get("ename") == "CellTimeoutError"
                        for o in cell.get("outputs", []))
        if timed_out:
            if allowed < self.limits.cell_timeout:
                kind = "notebook_timeout"
                message = f"the notebook time limit ({self.limits.notebook_timeout} s) was reached in this cell"
            else:
                kind = "cell_timeout"
                message = f"the cell ran longer than the {self.limits.cell_timeout} s limit and was interrupted"
            self.events.append(Event(kind, index, message, _grade_id(cell)))
        elif time.monotonic() - started > allowed + 5 and not self._dead:
            self.events.append(Event("cell_timeout", index, "the cell overran its time limit", _grade_id(cell)))
        return cell, resources

    def _exit_status(self) -> str:
        """``", exit code N"`` or ``", killed by SIGSEGV"`` when the kernel's status is known."""
        process = getattr(getattr(self.km, "provisioner", None), "process", None)
        code = None
        if process is not None:
            try:
                code = process.wait(timeout=2)
            except Exception:  # still running or already reaped
                code = process.poll()
        if code is None:
            return ""
        if code < 0:
            try:
                return f", killed by {signal.Signals(-code).name}"
            except ValueError:
                return f", killed by signal {-code}"
        return f", exit code {code}"

    # -- output cap -------------------------------------------------------
    def output(self, outs: list, msg: dict, display_id: str | None, cell_index: int):  # noqa: ANN201
        out = super().output(outs, msg, display_id, cell_index)
        if out is None or out.get("output_type") not in ("stream", "display_data"):
            return out
        size = len(out.get("text", "")) if out["output_type"] == "stream" else \
            sum(len(str(v)) for v in out.get("data", {}).values())
        budget = self.limits.max_output_kb * 1024
        used = self._printed.get(cell_index, 0)
        self._printed[cell_index] = used + size
        if used + size <= budget:
            return out
        # over the cap: keep what fits of this output, then one note, then nothing
        if outs and outs[-1] is out:
            outs.pop()
        left = budget - used
        if left > 0 and out["output_type"] == "stream":
            out["text"] = out["text"][:left]
            outs.append(out)
        if cell_index not in self._truncated:
            self._truncated.add(cell_index)
            note = (f"\n... output truncated: this cell printed more than "
                    f"{self.limits.max_output_kb} kB ...\n")
            outs.append(NotebookNode(output_type="stream", name="stdout", text=note))
            grade_id = _grade_id(self.nb.cells[cell_index]) if cell_index < len(self.nb.cells) else ""
            self.events.append(Event("output_truncated", cell_index,
                                     f"the cell printed more than {self.limits.max_output_kb} kB; "
                                     "the rest was dropped", grade_id))
        return None


def execute_notebook(nb: NotebookNode, workdir: str, limits: Limits, pid_file: str | None = None,
                     config: Config | None = None, log_file: str | None = None) -> tuple[NotebookNode, list[Event]]:
    """Run ``nb`` (in place) in a sandboxed kernel whose working directory is ``workdir``.

    Returns the executed notebook and the events. Never raises for anything the
    notebook's code does; a kernel that cannot start raises ``RuntimeError``.
    """
    cfg = Config(config or {})
    args = []
    if limits.memory_mb:
        args += ["--memory-mb", str(limits.memory_mb)]
    if limits.file_mb:
        args += ["--file-mb", str(limits.file_mb)]
    if pid_file:
        args += ["--pid-file", pid_file]
    if log_file:
        args += ["--log", log_file]
    cfg.SandboxKernelManager.sandbox_args = args
    executor = LimitedExecute(limits, config=cfg)
    try:
        executor.preprocess(nb, {"metadata": {"path": workdir}})
    except DeadKernelError as exc:  # died before the first cell (e.g. kernel_info)
        raise RuntimeError(f"the kernel died before running any cell: {exc}") from None
    return nb, executor.events
