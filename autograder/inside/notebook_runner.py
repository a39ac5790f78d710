"""The runner inside the sandbox: executes a submitted notebook and answers the grader.

Started by :mod:`autograder.pipeline.run` through :mod:`autograder.sealing.sandbox` as the first
process of a sealed sandbox, with one socket to the grader (``WORKBOOK_CHANNEL_FD``).
It receives the notebook (hidden tests already removed) and the submission's other
files, limits itself, and runs every code cell (in
:func:`course_lib.device.full_precision`: no TF32 on a GPU) in an in-process IPython shell
(no Jupyter kernel, no ports, no connection files), streaming each cell's outputs
to the grader as they appear. At a test cell it runs nothing of the cell: it asks
the grader for that item's plan and answers each call with the student's object of
that name (:func:`course_lib.grading.answer.perform.perform`), as plain data.

Its outputs go through :mod:`outputs` (this folder's modules are top-level modules in the
sandbox), its limits are :mod:`limits`', its seccomp filter :mod:`lockdown`'s.

Everything here runs in the student's process and may be tampered with by the
student's code: the grader trusts none of it. It only produces answers and outputs,
which the grader validates, caps and judges in its own process.
"""

from __future__ import annotations

import _thread
import os
import socket
import sys
import threading
import time
from pathlib import Path

sys.modules.setdefault("workbook_runner", sys.modules[__name__])

from cells import is_test_cell, nbgrader_meta  # this folder is on the sandbox's path
from channel import Channel
from limits import apply_limits, limit_address_space
from outputs import Outputs, Stream, capture_fd, flusher

_OUT: "Outputs | None" = None
_CHANNEL: Channel | None = None


# ---------------------------------------------------------------------------
# The shell
# ---------------------------------------------------------------------------

def _make_shell():
    from IPython.core.displayhook import DisplayHook
    from IPython.core.displaypub import DisplayPublisher
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    class Hook(DisplayHook):
        def start_displayhook(self) -> None:
            pass

        def write_output_prompt(self) -> None:
            pass

        def write_format_data(self, format_dict, md_dict=None) -> None:
            _OUT.display({"output_type": "execute_result", "execution_count": self.prompt_count,
                          "data": dict(format_dict), "metadata": dict(md_dict or {})})

        def finish_displayhook(self) -> None:
            pass

    class Publisher(DisplayPublisher):
        def publish(self, data, metadata=None, source=None, *, transient=None, update=False, **kwargs):
            if not update:
                _OUT.display({"output_type": "display_data", "data": dict(data), "metadata": dict(metadata or {})})

        def clear_output(self, wait=False) -> None:
            pass

    class Shell(InteractiveShell):
        def _showtraceback(self, etype, evalue, stb) -> None:
            _OUT.display({"output_type": "error", "ename": getattr(etype, "__name__", "Error"),
                          "evalue": str(evalue)[:4000], "traceback": [str(line) for line in stb][:200]})

        def enable_gui(self, gui=None) -> None:
            pass

    config = Config()
    config.HistoryManager.enabled = False
    config.InteractiveShell.colors = "nocolor"
    config.InteractiveShell.xmode = "Context"
    config.InlineBackend.rc = {"figure.dpi": 72}  # the figures are for the feedback page, which has a size limit
    shell = Shell.instance(config=config, displayhook_class=Hook, display_pub_class=Publisher)
    try:  # figures shown as PNG images when a cell ends, as JupyterLab's kernel shows them
        shell.enable_matplotlib("inline")
    except Exception:  # (matplotlib or its inline backend missing: the cells run without their figures)
        pass
    return shell


# ---------------------------------------------------------------------------
# Running the notebook
# ---------------------------------------------------------------------------

class Timeout:
    """Interrupt the main thread (KeyboardInterrupt) when a cell runs too long."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.fired = False
        self.timer: threading.Timer | None = None

    def _fire(self) -> None:
        self.fired = True
        _thread.interrupt_main()

    def __enter__(self) -> "Timeout":
        self.timer = threading.Timer(self.seconds, self._fire)
        self.timer.daemon = True
        self.timer.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.timer is not None:
            self.timer.cancel()


def answer_plan(channel: Channel, shell, index: int, grade_id: str, cell_timeout: float) -> None:
    """Ask the grader for the plan of this test cell's item and answer every call."""
    from course_lib.grading.answer.answers import Kind, failure
    from course_lib.grading.answer.calls import Call, Subject
    from course_lib.grading.answer.perform import perform

    reply = channel.request({"type": "plan_request", "grade_id": grade_id, "cell": index})
    if reply.get("type") != "plan":
        return
    subject = Subject.from_data(reply["subject"])
    impl = shell.user_ns.get(subject.name)
    started = time.monotonic()
    stopped = ""
    for s, segment in enumerate(reply["segments"]):
        for k, call_data in enumerate(segment):
            if stopped:
                answer = failure(Kind.NO_ANSWER, stopped)
            elif time.monotonic() - started > cell_timeout:
                stopped = f"the checks ran longer than the {cell_timeout:g} s cell time limit"
                answer = failure(Kind.NO_ANSWER, stopped)
            else:
                try:
                    with Timeout(max(1.0, cell_timeout - (time.monotonic() - started))):
                        answer = perform(subject, impl, Call.from_data(call_data))
                except KeyboardInterrupt:
                    stopped = f"the checks ran longer than the {cell_timeout:g} s cell time limit"
                    answer = failure(Kind.NO_ANSWER, stopped)
                except BaseException as exc:  # SystemExit and the like from student code
                    answer = failure(Kind.ERROR, str(exc)[:300], type(exc).__name__)
            try:
                channel.send({"type": "answer", "item": subject.name, "segment": s, "index": k, "answer": answer})
            except Exception as exc:  # the answer could not be encoded or sent
                channel.send({"type": "answer", "item": subject.name, "segment": s, "index": k,
                              "answer": failure(Kind.ERROR, "the answer could not be sent to the grader",
                                                type(exc).__name__)})
    channel.send({"type": "plan_done", "item": subject.name})


def run(channel: Channel, setup: dict) -> None:
    global _OUT
    limits = setup["limits"]
    # twice the grader's caps: the grader enforces (and reports) them; these only spare the channel
    outputs = Outputs(channel, 2 * int(limits["max_output_kb"]) + 64, 2 * int(limits["max_notebook_output_kb"]) + 64)
    _OUT = outputs
    threading.Thread(target=flusher, args=(outputs,), daemon=True).start()
    capture_fd(1, "stdout", outputs)
    capture_fd(2, "stderr", outputs)
    sys.stdout, sys.stderr = Stream("stdout", 1, outputs), Stream("stderr", 2, outputs)
    sys.stdin = open(os.devnull)
    shell = _make_shell()
    limit_address_space(limits)
    channel.request({"type": "ready"})  # the grader measures what the notebook's allowance starts from
    cell_timeout = float(limits["cell_timeout"])
    for index, cell in enumerate(setup["cells"]):
        if "source_bytes" in cell:  # a long cell comes as bytes (the wire caps one string)
            cell["source"] = bytes(cell.pop("source_bytes").numpy().tobytes()).decode("utf-8", errors="replace")
        if cell.get("cell_type") != "code" or not str(cell.get("source", "")).strip():
            continue
        outputs.start(index)
        channel.send({"type": "cell_start", "index": index})
        started = time.monotonic()
        status = "ok"
        if is_test_cell(cell):
            try:
                answer_plan(channel, shell, index, str(nbgrader_meta(cell).get("grade_id", "")), cell_timeout)
            except BaseException as exc:
                status = f"answering failed: {type(exc).__name__}"
        else:
            timeout = Timeout(cell_timeout)
            try:
                with timeout:
                    result = shell.run_cell(str(cell["source"]), store_history=True)
            except KeyboardInterrupt:  # the interrupt arrived outside the cell's code
                result = None
            if timeout.fired:
                status = "timeout"
            elif result is None or not result.success:
                status = "error"
        outputs.flush()
        channel.send({"type": "cell_end", "index": index, "status": status,
                      "execution_count": shell.execution_count - 1 if not is_test_cell(cell) else None,
                      "seconds": round(time.monotonic() - started, 3)})
        if getattr(shell, "exit_now", False):
            channel.send({"type": "exit", "index": index})
            return
    channel.send({"type": "done"})


def _write_files(files: dict) -> None:
    """The submission's other files (data it reads), under the working directory."""
    import torch

    root = Path.cwd().resolve()
    for name, data in files.items():
        path = (root / str(name)).resolve()
        if not path.is_relative_to(root) or not isinstance(data, torch.Tensor):
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data.numpy().tobytes())


def _seal(setup: dict) -> dict:
    """The innermost layer of the seal (autograder/inside/lockdown.py), as the grader asks for it
    (``required`` in bubblewrap, ``where_possible`` in container mode, ``off`` unsealed): what
    the kernel then says of this process, or why it could not be done."""
    wanted = str(setup.get("syscall_filter", "off"))
    if wanted == "off":
        return {"syscall_filter": "off"}
    import lockdown
    try:
        return {"syscall_filter": "on", **lockdown.lock_down(refuse_sessions=setup.get("sessions") == "refused")}
    except lockdown.SealError as exc:
        return {"syscall_filter": "failed", "error": str(exc)[:1000], "required": wanted == "required"}


def main() -> None:
    """Run the notebook the grader sends, then leave at once (``os._exit``: the interpreter's own
    shutdown, mostly torch's, would cost a CPU-second and change nothing)."""
    global _CHANNEL
    fd = int(os.environ.pop("WORKBOOK_CHANNEL_FD"))
    channel = Channel(socket.socket(fileno=fd))
    _CHANNEL = channel
    setup = channel.recv()
    seal = _seal(setup)
    if seal.get("required") and seal["syscall_filter"] != "on":
        channel.send({"type": "hello", "pid": os.getpid(), "seal": seal})  # and not one cell of the student's
        os._exit(0)
    apply_limits(setup["limits"])
    _write_files(setup.get("files", {}))
    channel.send({"type": "hello", "pid": os.getpid(), "seal": seal})
    from course_lib.device import full_precision

    with full_precision():  # float32 in float32 on a GPU too (no TF32): the grades a CPU gives
        run(channel, setup)
    _leave()


def _leave() -> None:
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(0)


def visible_check(item: str, impl):
    """``(passed, reference)``: whether ``impl`` passes the item's visible checks, as the
    grader judges its answers, and course_lib's reference for the item (a stub here)."""
    from course_lib.grading.answer.answers import Kind, failure
    from course_lib.grading.answer.calls import Call, Subject, resolve
    from course_lib.grading.answer.perform import perform

    if _CHANNEL is None:
        return True, None
    reply = _CHANNEL.request({"type": "visible_plan", "item": str(item)})
    if reply.get("type") != "plan":
        return True, None
    subject = Subject.from_data(reply["subject"])
    answers = []
    for segment in reply["segments"]:
        row = []
        for call_data in segment:
            try:
                row.append(perform(subject, impl, Call.from_data(call_data)))
            except BaseException as exc:
                row.append(failure(Kind.ERROR, str(exc)[:300], type(exc).__name__))
        answers.append(row)
    verdict = _CHANNEL.request({"type": "visible_answers", "item": subject.name, "answers": answers})
    reference = None
    try:
        reference = resolve(reply["subject"]["reference"])
    except Exception:
        pass
    return bool(verdict.get("passed")), reference


def oracle(name: str, args: tuple, kwargs: dict, grad_outputs=None):
    """Ask the grader to run course_lib's reference ``name`` (see autograder.sealing.course_copy)."""
    if _CHANNEL is None:
        raise RuntimeError("the grader is not connected")
    message = {"type": "oracle", "name": name, "args": tuple(args), "kwargs": dict(kwargs)}
    if grad_outputs is not None:
        message["grad_outputs"] = grad_outputs
    return _CHANNEL.request(message)


def reference_source(name: str) -> dict:
    """Ask the grader for course_lib's class ``name``, refused until its item has been graded
    (autograder/inside/reference_stubs.py)."""
    if _CHANNEL is None:
        raise RuntimeError("the grader is not connected")
    return _CHANNEL.request({"type": "reference_source", "name": name})


if __name__ == "__main__":
    main()
