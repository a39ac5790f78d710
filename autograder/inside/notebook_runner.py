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

Everything here runs in the student's process and may be tampered with by the
student's code: the grader trusts none of it. It only produces answers and outputs,
which the grader validates, caps and judges in its own process.
"""

from __future__ import annotations

import _thread
import codecs
import os
import resource
import socket
import sys
import threading
import time
from pathlib import Path

sys.modules.setdefault("workbook_runner", sys.modules[__name__])

from cells import is_test_cell, nbgrader_meta  # this folder is on the sandbox's path
from channel import Channel

_OUT: "Outputs | None" = None
_CHANNEL: Channel | None = None


# ---------------------------------------------------------------------------
# Outputs: streamed to the grader as they appear, capped here (and again there)
# ---------------------------------------------------------------------------

class Outputs:
    def __init__(self, channel: Channel, cell_kb: int, notebook_kb: int) -> None:
        self.channel = channel
        self.cell: int | None = None
        self.lock = threading.RLock()
        self.pending: dict[str, list[str]] = {"stdout": [], "stderr": []}
        self.pending_size = 0
        self.cell_cap = cell_kb * 1024
        self.notebook_cap = notebook_kb * 1024
        self.cell_used = 0
        self.used = 0
        self.truncated = False

    def start(self, cell: int | None) -> None:
        with self.lock:
            self.flush()
            self.cell, self.cell_used, self.truncated = cell, 0, False

    def _room(self, size: int) -> int:
        """How much of an output of ``size`` may still be sent (a note once when it is cut)."""
        room = max(0, min(self.cell_cap - self.cell_used, self.notebook_cap - self.used))
        take = min(size, room)
        self.cell_used += take
        self.used += take
        if take < size and not self.truncated:
            self.truncated = True
        return take

    def _note(self) -> None:
        self._send({"output_type": "stream", "name": "stdout",
                    "text": "\n... output truncated: this cell printed more than the grader keeps ...\n"})
        try:
            self.channel.send({"type": "truncated", "index": self.cell})
        except Exception:
            pass

    def _send(self, output: dict) -> None:
        try:
            self.channel.send({"type": "output", "index": self.cell, "output": output})
        except Exception:  # the grader went away, or the output could not be encoded
            pass

    def stream(self, name: str, text: str) -> None:
        if not text:
            return
        with self.lock:
            if self.truncated:
                return
            self.pending[name].append(text)
            self.pending_size += len(text)
            if self.pending_size > 16384:
                self.flush()

    def flush(self) -> None:
        with self.lock:
            for name in ("stdout", "stderr"):
                if self.pending[name]:
                    text = "".join(self.pending[name])
                    self.pending[name] = []
                    if self.truncated:
                        continue
                    take = self._room(len(text))
                    if take:
                        self._send({"output_type": "stream", "name": name, "text": text[:take]})
                    if self.truncated:
                        self._note()
            self.pending_size = 0

    def display(self, output: dict) -> None:
        with self.lock:
            self.flush()
            if self.truncated:
                return
            size = sum(len(str(v)) for v in (output.get("data") or {}).values()) + \
                len(str(output.get("evalue", ""))) + sum(len(str(t)) for t in output.get("traceback", []))
            if any(str(k).startswith("image/") for k in (output.get("data") or {})):
                # a figure counts against the notebook's outputs only (a cell's limit is for what
                # it prints); one that does not fit is left out whole, with a line, and the cell goes on
                if self.used + size <= self.notebook_cap:
                    self.used += size
                    self._send(output)
                else:
                    self._send({"output_type": "stream", "name": "stdout",
                                "text": f"[a figure of {size // 1024} kB left out: the notebook's outputs passed "
                                        "what the grader keeps]\n"})
            elif self._room(size) == size:
                self._send(output)
            else:  # an output that does not fit whole is dropped
                self._send({"output_type": "stream", "name": "stdout",
                            "text": f"[a {output.get('output_type')} output of {size // 1024} kB left out: the "
                                    "cell's outputs passed what the grader keeps]\n"})
                self._note()


class Stream:
    """``sys.stdout``/``sys.stderr`` for the student's code."""

    encoding = "utf-8"
    errors = "replace"

    def __init__(self, name: str, fd: int) -> None:
        self.name, self._fd = name, fd

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        if _OUT is not None:
            _OUT.stream(self.name, text)
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self._fd

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False


def _capture_fd(fd: int, name: str) -> None:
    """Send what C code and child processes write to ``fd`` to the current cell."""
    read, write = os.pipe()
    os.dup2(write, fd)
    os.close(write)

    def pump() -> None:
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        while True:
            try:
                data = os.read(read, 65536)
            except OSError:
                return
            if not data:
                return
            if _OUT is not None:
                _OUT.stream(name, decoder.decode(data))

    threading.Thread(target=pump, name=f"capture-{name}", daemon=True).start()


def _flusher(outputs: Outputs) -> None:
    while True:
        time.sleep(0.25)
        try:
            outputs.flush()
        except Exception:
            pass


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
                answer = {"ok": False, "kind": "no_answer", "text": stopped}
            elif time.monotonic() - started > cell_timeout:
                stopped = f"the checks ran longer than the {cell_timeout:g} s cell time limit"
                answer = {"ok": False, "kind": "no_answer", "text": stopped}
            else:
                try:
                    with Timeout(max(1.0, cell_timeout - (time.monotonic() - started))):
                        answer = perform(subject, impl, Call.from_data(call_data))
                except KeyboardInterrupt:
                    stopped = f"the checks ran longer than the {cell_timeout:g} s cell time limit"
                    answer = {"ok": False, "kind": "no_answer", "text": stopped}
                except BaseException as exc:  # SystemExit and the like from student code
                    answer = {"ok": False, "kind": "error", "exc": type(exc).__name__, "text": str(exc)[:300],
                              "where": ""}
            try:
                channel.send({"type": "answer", "item": subject.name, "segment": s, "index": k, "answer": answer})
            except Exception as exc:  # the answer could not be encoded or sent
                channel.send({"type": "answer", "item": subject.name, "segment": s, "index": k,
                              "answer": {"ok": False, "kind": "error", "exc": type(exc).__name__,
                                         "text": "the answer could not be sent to the grader", "where": ""}})
    channel.send({"type": "plan_done", "item": subject.name})


def run(channel: Channel, setup: dict) -> None:
    global _OUT
    limits = setup["limits"]
    # twice the grader's caps: the grader enforces (and reports) them; these only spare the channel
    outputs = Outputs(channel, 2 * int(limits["max_output_kb"]) + 64, 2 * int(limits["max_notebook_output_kb"]) + 64)
    _OUT = outputs
    threading.Thread(target=_flusher, args=(outputs,), daemon=True).start()
    _capture_fd(1, "stdout")
    _capture_fd(2, "stderr")
    sys.stdout, sys.stderr = Stream("stdout", 1), Stream("stderr", 2)
    sys.stdin = open(os.devnull)
    shell = _make_shell()
    _limit_address_space(limits)
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


def _vm_size() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _apply_limits(limits: dict) -> None:
    """The per-process limits but the address space's (:func:`_limit_address_space`, at the
    first cell): processes, file size, open files, no core dumps."""
    cap(resource.RLIMIT_NPROC, int(limits["max_processes"]))
    cap(resource.RLIMIT_FSIZE, int(limits["file_mb"]) * 2**20)
    cap(resource.RLIMIT_NOFILE, int(limits["max_open_files"]))
    cap(resource.RLIMIT_CORE, 0)


def _limit_address_space(limits: dict) -> None:
    """The address space as ``memory_mb`` on top of what this process maps when the first cell
    starts (torch, IPython, the runner's threads: PyPI's Linux build of torch alone maps about
    3 GB of CUDA libraries, a CPU build about 600 MB; a zygote's child has mapped what its zygote
    imported): the same allowance for a submission whichever build and whichever seal grades it."""
    if limits.get("memory_mb"):
        cap(resource.RLIMIT_AS, _vm_size() + int(limits["memory_mb"]) * 2**20)


def cap(kind: int, value: int) -> None:
    """Lower a limit, soft and hard alike (never above the hard limit already set)."""
    soft, hard = resource.getrlimit(kind)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(kind, (value, value))


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
        return {"syscall_filter": "on", **lockdown.lock_down()}
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
    _apply_limits(setup["limits"])
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
                row.append({"ok": False, "kind": "error", "exc": type(exc).__name__, "text": str(exc)[:300],
                            "where": ""})
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
