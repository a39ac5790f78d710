"""Messages between the grader and the sandboxed runner over one Unix socket.

A frame is a 4-byte length followed by a message encoded with
:mod:`course_lib.grading.answer.wire` (plain data only, no pickle). Both sides use this
module; the grader's side (:class:`FrameReader`) never blocks on a peer that stops
mid-frame, and refuses frames over its size limit.

The runner imports this file inside the sandbox as a top-level module (``channel``): it
imports nothing from the ``autograder`` package.
"""

from __future__ import annotations

import socket
import struct
import threading
from typing import Any

from course_lib.grading.answer.wire import WireLimits, WireError, decode, encode

__all__ = ["Channel", "FrameReader", "ProtocolError", "MAX_FRAME"]

_LEN = struct.Struct("<I")
MAX_FRAME = 128 * 2**20  # one frame, either way (the setup holds up to 100 MB of the submission's files)


class ProtocolError(RuntimeError):
    """The peer broke the protocol (an oversized or malformed frame)."""


class Channel:
    """Blocking, thread-safe frames over a connected socket (the runner's side)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._send = threading.Lock()
        self._request = threading.Lock()

    def send(self, message: dict) -> None:
        data = encode(message, kind="message")
        if len(data) > MAX_FRAME:
            raise ProtocolError(f"message of {len(data)} bytes is over the {MAX_FRAME} byte limit")
        with self._send:
            self.sock.sendall(_LEN.pack(len(data)) + data)

    def _read_exactly(self, n: int) -> bytes:
        chunks, left = [], n
        while left:
            chunk = self.sock.recv(min(left, 1 << 20))
            if not chunk:
                raise EOFError("the grader closed the channel")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def recv(self) -> dict:
        (n,) = _LEN.unpack(self._read_exactly(_LEN.size))
        if n > MAX_FRAME:
            raise ProtocolError("oversized frame")
        message = decode(self._read_exactly(n), kind="message")
        if not isinstance(message, dict):
            raise ProtocolError("a message must be a dict")
        return message

    def request(self, message: dict) -> dict:
        """Send ``message`` and wait for the one reply (requests are serialised)."""
        with self._request:
            self.send(message)
            return self.recv()


class FrameReader:
    """Incremental, non-blocking frame parsing for the grader's side."""

    def __init__(self, max_frame: int = MAX_FRAME, limits: WireLimits = WireLimits()) -> None:
        self.buffer = bytearray()
        self.max_frame = max_frame
        self.limits = limits

    def feed(self, data: bytes) -> None:
        self.buffer += data

    def next_frame(self) -> Any:
        """The first complete message in the buffer (decoded), None if there is none yet;
        :class:`ProtocolError` on a frame that is too big or malformed."""
        if len(self.buffer) < _LEN.size:
            return None
        (n,) = _LEN.unpack_from(self.buffer)
        if n > self.max_frame:
            raise ProtocolError(f"a frame of {n} bytes is over the {self.max_frame} byte limit")
        if len(self.buffer) < _LEN.size + n:
            return None
        raw = bytes(self.buffer[_LEN.size:_LEN.size + n])
        del self.buffer[:_LEN.size + n]
        try:
            message = decode(raw, self.limits, kind="message")
        except WireError as exc:
            raise ProtocolError(f"malformed message: {exc}") from None
        if not isinstance(message, dict) or not isinstance(message.get("type"), str):
            raise ProtocolError("a message must be a dict with a type")
        return message
