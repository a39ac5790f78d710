"""A sealed run's outputs: what the student's cells print and display, streamed to the grader
as they appear (:class:`Outputs`), capped here to spare the channel (the grader enforces and
reports its own caps); ``sys.stdout``/``sys.stderr`` for the student's code (:class:`Stream`) and
the file descriptors 1 and 2 that C code and child processes write to (:func:`capture_fd`).
Runs in the student's process (autograder/inside/notebook_runner.py imports it as a top-level
module): the grader trusts none of it."""

from __future__ import annotations

import codecs
import os
import threading
import time

from channel import Channel  # this folder is on the sandbox's path



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

    def __init__(self, name: str, fd: int, outputs: Outputs) -> None:
        self.name, self._fd, self._outputs = name, fd, outputs

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        self._outputs.stream(self.name, text)
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


def capture_fd(fd: int, name: str, outputs: Outputs) -> None:
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
            outputs.stream(name, decoder.decode(data))

    threading.Thread(target=pump, name=f"capture-{name}", daemon=True).start()


def flusher(outputs: Outputs) -> None:
    """Send what was printed at least every quarter of a second (a thread's loop)."""
    while True:
        time.sleep(0.25)
        try:
            outputs.flush()
        except Exception:
            pass
