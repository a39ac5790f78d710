"""collect's sources: every file of a folder or a zip, named, checked and read within a budget
through autograder/doors/intake.py, never followed through a link (:class:`Entry`)."""

from __future__ import annotations

import datetime as dt
import os
import pwd
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Callable, Iterator

from ..doors import intake
from ..doors.intake import MAX_DEPTH, IntakeLimits, Refused, shown
from ..sealing import trees

__all__ = ["Entry", "is_junk", "zip_entries", "folder_entries", "account_name"]

_JUNK = ("__MACOSX", ".ipynb_checkpoints", ".DS_Store", "Thumbs.db", "desktop.ini")


@dataclass
class Entry:
    """One file of the source, not read yet."""

    name: str  # its path inside the source (may hold anything: show it with intake.shown)
    path: PurePosixPath | None  # checked relative path; None when its name broke a rule
    problem: str  # why it cannot be taken ("" when it can)
    read: Callable[[int], bytes]  # its bytes, refusing more than the budget given
    when: dt.datetime | None = None  # the time the source records for it (zip entry, change time)


def is_junk(path: PurePosixPath | None, name: str) -> bool:
    parts = path.parts if path is not None else tuple(name.replace("\\", "/").split("/"))
    return any(p in _JUNK or p.startswith("._") for p in parts)


def _zip_time(date_time: tuple[int, ...], zone: dt.tzinfo) -> dt.datetime | None:
    try:
        return dt.datetime(*date_time[:6], tzinfo=zone).astimezone(dt.timezone.utc).replace(tzinfo=None)
    except (ValueError, OverflowError):
        return None


def zip_entries(zf: zipfile.ZipFile, zone: dt.tzinfo, limits: IntakeLimits) -> Iterator[Entry]:
    for info in zf.infolist():
        if info.is_dir():
            continue
        mode = info.external_attr >> 16
        why = ""
        try:
            path = intake.member_path(info.filename, limits)
        except Refused as exc:
            path, why = None, str(exc)
        if not why and mode and stat.S_IFMT(mode) and not stat.S_ISREG(mode):
            why = "a symbolic link (never followed)" if stat.S_ISLNK(mode) else "not a regular file"
        if not why and info.flag_bits & 0x1:
            why = "encrypted"

        def read(budget: int, info: zipfile.ZipInfo = info) -> bytes:
            if info.file_size > budget:
                raise Refused(f"'{shown(info.filename)}' unpacks to more than {budget / intake.MB:.0f} MB")
            if info.file_size > intake.MB and \
                    info.file_size > limits.compression_ratio * max(info.compress_size, 1):
                raise Refused(f"'{shown(info.filename)}' is compressed "
                              f"{info.file_size / max(info.compress_size, 1):.0f} to 1, over the limit of "
                              f"{limits.compression_ratio:g} to 1 (an archive bomb?)")
            with zf.open(info) as f:
                return intake.read_bounded(f, budget, f"'{shown(info.filename)}'")
        yield Entry(info.filename, path, why, read, _zip_time(info.date_time, zone))


def account_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def folder_entries(source: Path, limits: IntakeLimits, owner: int | None = None) -> Iterator[Entry]:
    """Every file under ``source`` (never following a link); with ``owner``, a file another
    account wrote is a problem (it rejects its student)."""
    for top, dirs, files in trees.walk(source):  # (no recursion: a folder a thousand levels deep is fine)
        dirs.sort()
        if top != os.fspath(source) and len(Path(os.path.relpath(top, source)).parts) >= MAX_DEPTH:
            if dirs:  # deeper than any submission may nest: refused, never walked (it may go on for ever)
                rel = os.path.relpath(os.path.join(top, dirs[0]), source).replace(os.sep, "/")
                yield Entry(rel, None, f"nested more than {MAX_DEPTH} folders deep", lambda budget: b"")
                dirs[:] = []
        for name in sorted(files):
            full = os.path.join(top, name)
            rel = os.path.relpath(full, source).replace(os.sep, "/")
            why = ""
            try:
                path = intake.member_path(rel, limits, archive=False)
            except Refused as exc:
                path, why = None, str(exc)
            try:
                info = os.lstat(full)
            except OSError as exc:
                yield Entry(rel, path, f"cannot be read ({exc.strerror})", lambda budget: b"")
                continue
            if not why and stat.S_ISLNK(info.st_mode):
                why = "a symbolic link (never followed)"
            elif not why and not stat.S_ISREG(info.st_mode):
                why = "not a regular file"
            elif not why and owner is not None and info.st_uid != owner:
                why = (f"written by the account {shown(account_name(info.st_uid))}, not by the account that handed the "
                       f"submission in ({shown(account_name(owner))})")

            def read(budget: int, full: str = full) -> bytes:
                fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
                with os.fdopen(fd, "rb") as f:
                    if not stat.S_ISREG(os.fstat(fd).st_mode):
                        raise Refused(f"'{shown(full)}' is not a regular file")
                    return intake.read_bounded(f, budget, f"'{shown(rel)}'")
            when = dt.datetime.fromtimestamp(info.st_ctime, dt.timezone.utc).replace(tzinfo=None)
            yield Entry(rel, path, why, read, when)
