"""Runs course_lib's references for a sandboxed submission, outside the sandbox.

The sandbox holds stubs instead of the references graded in its notebook
(:mod:`autograder.sealing.course_copy`); a stub's call arrives here as plain data. The reference
runs in a child process of the grading worker with a memory limit and a time limit
per call, so that a call cannot hang or exhaust the grader; the child is replaced
after a call that overruns.

Until an item's test cell has finished, its reference is refused, and so is any
reference whose computation would call it (watched with a profiler in this trusted
process): a notebook may build on an item's reference once that item is graded, never
before.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import sys
from typing import Any

from course_lib.device import full_precision
from course_lib.grading.answer.calls import realise
from course_lib.grading.answer.wire import GeneratorState, WireError, decode, encode

__all__ = ["Oracle"]

MAX_REQUEST = 64 * 2**20
MAX_REPLY = 64 * 2**20


def code_objects(obj: Any) -> set:
    from course_lib.grading.answer.watch import code_objects as codes
    return codes(obj)


def _flat_tensors(value: Any, out: list) -> None:
    import torch
    if isinstance(value, torch.Tensor):
        out.append(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _flat_tensors(v, out)
    elif isinstance(value, dict):
        for v in value.values():
            _flat_tensors(v, out)


_LEN = struct.Struct("<Q")


def _recv(sock: socket.socket) -> bytes:
    def exactly(n: int) -> bytes:
        chunks = []
        while n:
            chunk = sock.recv(min(n, 1 << 20))
            if not chunk:
                raise EOFError
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    (n,) = _LEN.unpack(exactly(_LEN.size))
    if n > MAX_REPLY + 2**20:
        raise EOFError("oversized message")
    return exactly(n)


def _send(sock: socket.socket, data: bytes) -> None:
    sock.sendall(_LEN.pack(len(data)) + data)


def _serve(conn: socket.socket, targets: dict[str, Any], memory_mb: int | None) -> None:
    """The oracle child: answer requests until the socket closes."""
    import resource

    import torch

    if memory_mb:  # on top of what this process maps with torch imported (3 GB for PyPI's Linux build)
        with open("/proc/self/status") as f:
            mapped = next((int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:")), 0)
        resource.setrlimit(resource.RLIMIT_AS, (mapped + memory_mb * 2**20, mapped + memory_mb * 2**20))
    torch.set_num_threads(1)
    while True:
        try:
            raw = _recv(conn)
        except (EOFError, OSError):
            return
        try:
            request = decode(raw)
            with full_precision():  # as the student's answer and the checks: no TF32 on a GPU
                reply = _answer(request, targets)
        except Exception as exc:  # report, never die
            reply = {"ok": False, "text": f"course_lib's reference failed: {type(exc).__name__}: {str(exc)[:300]}"}
        try:
            data = encode(reply)
        except Exception as exc:
            data = encode({"ok": False, "text": f"the reference's result could not be sent: {exc}"})
        if len(data) > MAX_REPLY:
            data = encode({"ok": False, "text": "the reference's result is too large to send while grading"})
        _send(conn, data)


def _plain(value: Any, depth: int = 0) -> bool:
    """Only data may reach a reference: no Build (it would construct objects here)."""
    from course_lib.grading.answer.wire import Build, Opaque
    if isinstance(value, (Build, Opaque)) or depth > 30:
        return False
    if isinstance(value, (list, tuple)):
        return all(_plain(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(_plain(k, depth + 1) and _plain(v, depth + 1) for k, v in value.items())
    return True


def _answer(request: dict, targets: dict[str, Any]) -> dict:
    import torch

    name = request["name"]
    reference = targets[name]
    watch = set()
    for other in request.get("watch", []):
        if other in targets:
            watch |= code_objects(targets[other])
    args, kwargs = realise(request.get("args", ())), realise(request.get("kwargs", {}))
    generators = [v for v in list(args) + list(kwargs.values()) if isinstance(v, torch.Generator)]
    touched: list[str] = []

    def profiler(frame, event, arg):
        if event == "call" and frame.f_code in watch:
            touched.append(frame.f_code.co_name)

    grad_outputs = request.get("grad_outputs")
    previous = sys.getprofile()
    sys.setprofile(profiler if watch else None)
    try:
        if grad_outputs is None:
            with torch.no_grad():
                value = reference(*args, **kwargs)
        else:
            inputs: list = []
            _flat_tensors((args, kwargs), inputs)
            with torch.enable_grad():
                value = reference(*args, **kwargs)
    finally:
        sys.setprofile(previous)
    if touched:
        return {"ok": False, "text": f"course_lib's {name.split(':')[-1]} is not available now: it would use "
                                     f"{touched[0]}, which is being graded"}
    if grad_outputs is None:
        return {"ok": True, "value": value, "generators": [GeneratorState.of(g) for g in generators]}
    outputs: list = []
    _flat_tensors(value, outputs)
    pairs = [(o, g) for o, g in zip(outputs, grad_outputs)
             if isinstance(o, torch.Tensor) and o.requires_grad and isinstance(g, torch.Tensor)]
    wanted = [t for t in inputs if t.requires_grad]
    grads_for = {}
    if pairs and wanted:
        got = torch.autograd.grad([o for o, _ in pairs], wanted,
                                  [g.to(o.dtype).expand_as(o) for o, g in pairs], allow_unused=True)
        grads_for = {id(t): g for t, g in zip(wanted, got)}
    return {"ok": True, "grads": [grads_for.get(id(t)) for t in inputs]}


class Oracle:
    """Course_lib's references for one submission: ``targets`` maps ``"module:Name"`` to
    ``(reference, item)``; :meth:`ask` answers a stub's message."""

    def __init__(self, targets: dict[str, tuple[Any, str]], memory_mb: int | None = 4096,
                 timeout: float = 60.0) -> None:
        self.targets = targets
        self.memory_mb = memory_mb
        self.timeout = timeout
        self.pid: int | None = None
        self.conn: socket.socket | None = None
        self.calls = 0

    def _start(self) -> None:
        parent, child = socket.socketpair()
        refs = {name: ref for name, (ref, _) in self.targets.items()}
        pid = os.fork()
        if pid == 0:  # the child: serve, then leave without running the parent's cleanup
            code = 0
            try:
                parent.close()
                from .pool import die_with_parent
                die_with_parent()
                _serve(child, refs, self.memory_mb)
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        child.close()
        self.pid, self.conn = pid, parent

    def _alive(self) -> bool:
        if self.pid is None:
            return False
        try:
            done, _ = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            return False
        return done == 0

    def close(self) -> None:
        if self.pid is not None:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        if self.conn is not None:
            self.conn.close()
        self.pid = self.conn = None

    def ask(self, message: dict, refused: set[str], timeout: float = float("inf")) -> dict:
        """The reply to a stub's ``oracle`` message (``{"ok": False, "text": ...}`` when
        refused). ``refused``: the items not graded yet, whose references are off limits;
        ``timeout``: what is left of the run's time (the call takes at most that, and at most
        the oracle's own limit)."""
        name = message.get("name")
        if not isinstance(name, str) or name not in self.targets:
            return {"ok": False, "text": "that is not one of this notebook's references"}
        item = self.targets[name][1]
        if item in refused:
            return {"ok": False, "item": item,
                    "text": f"course_lib's {name.split(':')[-1]} (the reference for {item}) is not "
                            f"available before {item} has been graded (after its test cell): "
                            f"{item} must be your own code"}
        args, kwargs = message.get("args", ()), message.get("kwargs", {})
        if not isinstance(args, (tuple, list)) or not isinstance(kwargs, dict) or not _plain((args, kwargs)):
            return {"ok": False, "text": "course_lib's reference takes plain data only (tensors, numbers, strings, "
                                         "lists) while this notebook is graded"}
        request = {"name": name, "args": tuple(args), "kwargs": kwargs,
                   "watch": [n for n, (_, it) in self.targets.items() if it in refused]}
        if "grad_outputs" in message:
            request["grad_outputs"] = message["grad_outputs"]
        try:
            data = encode(request)
        except Exception:
            return {"ok": False, "text": "the arguments could not be sent to the reference"}
        if len(data) > MAX_REQUEST:
            return {"ok": False, "text": "the arguments are too large for course_lib's reference while grading"}
        if not self._alive():
            self.close()
            self._start()
        self.calls += 1
        try:
            _send(self.conn, data)
            limit = max(0.05, min(self.timeout, timeout))
            self.conn.settimeout(limit)
            reply = decode(_recv(self.conn))
        except (socket.timeout, TimeoutError):
            self.close()
            return {"ok": False, "text": f"course_lib's reference took longer than {limit:g} s"}
        except (EOFError, OSError, WireError):
            self.close()
            return {"ok": False, "text": "course_lib's reference failed (out of memory?)"}
        return reply if isinstance(reply, dict) else {"ok": False, "text": "no reply"}
