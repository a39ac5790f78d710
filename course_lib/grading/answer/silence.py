"""Silence: the student's code never writes to stderr while it is checked; its warnings and
what it wrote there are captured (:func:`quiet`), Python- and C-level alike."""

from __future__ import annotations

import contextlib
import io
import os
import sys
import tempfile
import warnings
from dataclasses import dataclass, field
from typing import Iterator

__all__ = ["Captured", "quiet"]


@dataclass
class Captured:
    warnings: list[str] = field(default_factory=list)
    stderr: str = ""


@contextlib.contextmanager
def _fd2_to_file() -> Iterator[io.BufferedRandom | None]:
    """Point file descriptor 2 at a temporary file (catches C-level writes)."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, AttributeError, ValueError):
        yield None
        return
    tmp = tempfile.TemporaryFile()
    try:
        os.dup2(tmp.fileno(), 2)
        yield tmp
    finally:
        os.dup2(saved, 2)
        os.close(saved)


@contextlib.contextmanager
def quiet() -> Iterator[Captured]:
    """Capture warnings and everything written to stderr (Python- and C-level)."""
    captured = Captured()
    buffer = io.StringIO()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with _fd2_to_file() as tmp, contextlib.redirect_stderr(buffer):
            try:
                yield captured
            finally:
                if tmp is not None:
                    tmp.seek(0)
                    captured.stderr = tmp.read(1 << 20).decode(errors="replace")
                    tmp.close()
    captured.stderr = buffer.getvalue()[:1 << 20] + captured.stderr
    seen = []
    for w in caught:
        text = f"{w.category.__name__}: {w.message}"[:300]
        if text not in seen:
            seen.append(text)
    captured.warnings = seen
