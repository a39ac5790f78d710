"""Folders a student's code made: walked and removed whatever is in them.

A student's code, or a submission, can leave any tree the file system allows: folders
thousands of levels deep (deeper than a path may be long), millions of entries wide,
names with control characters or bytes that are not UTF-8, folders without
permissions, links, FIFOs and sockets. Python's own tools recurse (``shutil.rmtree``,
``os.walk`` and ``Path.rglob`` in Python 3.11 raise ``RecursionError`` about a thousand
levels down) or need whole paths; these do neither:

- :func:`walk`: ``os.walk`` (top down, links never followed) without recursion;
- :func:`remove_tree`: one file or folder removed, working through open folders
  (``openat``/``unlinkat``, never a path, never a link followed), two descriptors at a
  time however deep, a folder its owner made unreadable opened up first, within a
  time budget;
- :func:`remove_owned`: everything one user owns in the folders every user may write
  (``/tmp``, ``/var/tmp``, ``/dev/shm``, ...), and in the folders there the user could
  write into.

Each returns a :class:`Removal` that says what went, what stayed and why, and never
raises for anything the tree holds: a tree it cannot remove is a note for the
instructor, not a failure of the grading.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

__all__ = ["Removal", "walk", "remove_tree", "remove_owned", "DEFAULT_BUDGET_S"]

DEFAULT_BUDGET_S = 60.0  # seconds one removal may take before it stops and says what is left
PENDING = 512  # sub-folders of one folder remembered at a time (a wider folder is read again)
NESTED = 16  # levels of other users' writable folders looked into (a system's are one or two deep)

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass
class Removal:
    """What a removal did: ``removed`` (the paths named, or found, that are gone),
    ``entries`` (files and folders removed in all), ``left`` (``"path: why"`` for what
    stayed) and ``timed_out`` (the budget ran out first)."""

    removed: list[str] = field(default_factory=list)
    entries: int = 0
    left: list[str] = field(default_factory=list)
    timed_out: bool = False

    @property
    def complete(self) -> bool:
        return not self.left and not self.timed_out

    def merge(self, other: "Removal") -> "Removal":
        self.removed += other.removed
        self.entries += other.entries
        self.left += other.left
        self.timed_out = self.timed_out or other.timed_out
        return self

    def summary(self, limit: int = 5) -> str:
        """One line for the instructor: what could not be removed."""
        parts = list(self.left[:limit]) + ([f"and {len(self.left) - limit} more"] if len(self.left) > limit else [])
        if self.timed_out:
            parts.append("the time allowed for removing them ran out")
        return "; ".join(parts)


class _OutOfTime(Exception):
    pass


def _shown(path: str) -> str:
    """A path for a message: control characters and undecodable bytes escaped."""
    return path.encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace")[:300]


def walk(top: str | Path) -> Iterator[tuple[str, list[str], list[str]]]:
    """``os.walk(top, followlinks=False)``, top down, without recursion: ``(folder, dirs,
    files)`` for each folder, links among ``files``; pruning ``dirs`` in place skips them.
    A folder that cannot be listed (unreadable, or a path past the system's limit) is
    left out, as ``os.walk`` does."""
    stack = [os.fspath(top)]
    while stack:
        folder = stack.pop()
        dirs, files = [], []
        try:
            with os.scandir(folder) as entries:
                for entry in entries:
                    try:
                        is_dir = entry.is_dir(follow_symlinks=False)
                    except OSError:
                        is_dir = False
                    (dirs if is_dir else files).append(entry.name)
        except OSError:
            continue
        yield folder, dirs, files
        stack.extend(os.path.join(folder, d) for d in reversed(dirs))


def _open_dir(name: str, dir_fd: int | None) -> int:
    """Open folder ``name`` (never a link); one that its owner made unreadable or
    unsearchable is given back its owner's permissions first (we are its owner or root)."""
    try:
        return os.open(name, _DIR, dir_fd=dir_fd)
    except PermissionError:
        handle = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            if not stat.S_ISDIR(os.fstat(handle).st_mode):
                raise NotADirectoryError(errno.ENOTDIR, "not a folder", name) from None
            os.chmod(f"/proc/self/fd/{handle}", 0o700)  # the folder itself: the handle never follows a link
        finally:
            os.close(handle)
        return os.open(name, _DIR, dir_fd=dir_fd)


def _retry_writable(fd: int, action) -> None:
    """``action()``, once more after making the folder open at ``fd`` writable to its owner
    if it was refused (a folder its owner made read-only)."""
    try:
        action()
    except PermissionError:
        os.fchmod(fd, stat.S_IMODE(os.fstat(fd).st_mode) | 0o700)
        action()


class _Remover:
    """Removes trees through open folders; counts, notes and the time budget."""

    def __init__(self, budget_s: float, out: Removal) -> None:
        self.deadline = time.monotonic() + budget_s
        self.out = out
        self.ticks = 0

    def tick(self) -> None:
        self.ticks += 1
        if self.ticks % 256 == 0 and time.monotonic() > self.deadline:
            raise _OutOfTime

    def note(self, path: str, why: str) -> None:
        if len(self.out.left) < 100:
            self.out.left.append(f"{_shown(path)}: {why}")

    def entry(self, parent_fd: int, name: str, path: str) -> bool:
        """Remove ``name`` of the folder open at ``parent_fd`` (a folder with all it holds;
        ``path`` names it in notes); whether it is gone."""
        try:
            info = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
        except FileNotFoundError:
            return True
        except OSError as exc:
            self.note(path, exc.strerror)
            return False
        try:
            if stat.S_ISDIR(info.st_mode):
                fd = _open_dir(name, parent_fd)
                if _key(os.fstat(fd)) != _key(info):
                    os.close(fd)
                    self.note(path, "it changed while it was being removed")
                    return False
                self.clear(fd, path)
                _retry_writable(parent_fd, lambda: os.rmdir(name, dir_fd=parent_fd))
            else:
                _retry_writable(parent_fd, lambda: os.unlink(name, dir_fd=parent_fd))
        except OSError as exc:
            if exc.errno != errno.ENOTEMPTY:  # (not empty: what stayed in it is noted already)
                self.note(path, exc.strerror)
            return False
        self.out.entries += 1
        return True

    def clear(self, fd: int, path: str) -> None:
        """Remove everything in the folder open at ``fd`` (and close ``fd``), depth first and
        without recursion: down into a sub-folder by name, back up through its ``..`` (checked
        to be the folder it came from), so that two descriptors are open at a time however
        deep the tree."""
        dev = os.fstat(fd).st_dev
        stuck: set[tuple[int, int]] = set()  # entries that could not be removed: not tried again
        # one frame per level below the top: (the folder's name, its parent's (dev, ino), the
        # parent's sub-folders still to visit)
        frames: list[tuple[str, tuple[int, int], list]] = []
        pending: list[tuple[str, tuple[int, int]]] = []
        try:
            while True:
                self.tick()
                where = "/".join([path] + [f[0] for f in frames[:2]] + (["…", frames[-1][0]] if len(frames) > 2 else []))
                if not pending:
                    pending = self._sweep(fd, stuck, dev, where)
                if pending:
                    name, key = pending.pop()
                    try:
                        child = _open_dir(name, fd)
                    except OSError as exc:
                        stuck.add(key)
                        self.note(f"{where}/{name}", exc.strerror)
                        continue
                    if _key(os.fstat(child)) != key:
                        os.close(child)
                        stuck.add(key)
                        self.note(f"{where}/{name}", "it changed while it was being removed")
                        continue
                    frames.append((name, _key(os.fstat(fd)), pending))
                    os.close(fd)
                    fd, pending = child, []
                    continue
                if not frames:  # the top holds nothing more that can go
                    return
                # this folder holds nothing more that can go: up to its parent, then remove it
                name, parent_key, pending = frames.pop()
                mine = _key(os.fstat(fd))
                parent = os.open("..", _DIR, dir_fd=fd)
                os.close(fd)
                fd = parent
                if _key(os.fstat(fd)) != parent_key:
                    raise OSError(errno.ESTALE, "the tree was moved while it was being removed")
                try:
                    _retry_writable(fd, lambda: os.rmdir(name, dir_fd=fd))
                    self.out.entries += 1
                except OSError as exc:
                    stuck.add(mine)
                    if exc.errno != errno.ENOTEMPTY:
                        self.note(f"{where}", exc.strerror)
        finally:
            os.close(fd)

    def _sweep(self, fd: int, stuck: set, dev: int, where: str) -> list[tuple[str, tuple[int, int]]]:
        """Unlink every entry of the folder at ``fd`` that is not a folder; return (up to
        :data:`PENDING` of) its sub-folders as ``(name, (dev, ino))``."""
        folders = []
        with os.scandir(fd) as entries:  # (a scandir of a descriptor rewinds the folder when it ends)
            for entry in entries:
                self.tick()
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                key = _key(info)
                if key in stuck:
                    continue
                if stat.S_ISDIR(info.st_mode):
                    if info.st_dev != dev:
                        stuck.add(key)
                        self.note(f"{where}/{entry.name}", "another file system is mounted there")
                    elif len(folders) < PENDING:
                        folders.append((entry.name, key))
                    continue
                try:
                    _retry_writable(fd, lambda: os.unlink(entry.name, dir_fd=fd))
                    self.out.entries += 1
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    stuck.add(key)
                    self.note(f"{where}/{entry.name}", exc.strerror)
        return folders


def _key(info: os.stat_result) -> tuple[int, int]:
    return info.st_dev, info.st_ino


def remove_tree(path: str | Path, budget_s: float = DEFAULT_BUDGET_S) -> Removal:
    """Remove ``path`` (a file, a link itself, or a folder with everything in it) however
    deep, wide or strangely named its tree; see the module docstring."""
    out = Removal()
    path = os.path.abspath(os.fspath(path))
    parent_path, name = os.path.split(path)
    remover = _Remover(budget_s, out)
    try:
        parent = os.open(parent_path, _DIR)
    except FileNotFoundError:
        return out
    except OSError as exc:
        out.left.append(f"{_shown(path)}: {exc.strerror}")
        return out
    try:
        if remover.entry(parent, name, path):
            out.removed.append(path)
    except _OutOfTime:
        out.timed_out = True
    finally:
        os.close(parent)
    return out


def remove_owned(uid: int, folders: tuple[str, ...] | list[str], gid: int | None = None,
                 budget_s: float = DEFAULT_BUDGET_S) -> Removal:
    """Remove everything user ``uid`` owns in ``folders`` (shared folders such as ``/tmp``):
    each entry it owns with all it holds, and what it owns in the folders there that it
    could write into (world-writable ones, or its group's, ``gid``), :data:`NESTED` levels
    down. Call when nothing of the user runs any more. A folder that is missing, a link,
    or given twice (``/var/lock`` and ``/run/lock``) is skipped."""
    out = Removal()
    remover = _Remover(budget_s, out)
    seen: set[tuple[int, int]] = set()
    try:
        for folder in folders:
            try:
                fd = os.open(folder, _DIR)
            except OSError:
                continue
            try:
                info = os.fstat(fd)
                if (info.st_dev, info.st_ino) in seen:
                    continue
                seen.add((info.st_dev, info.st_ino))
                _remove_owned_in(remover, fd, folder, uid, gid, 0)
            finally:
                os.close(fd)
    except _OutOfTime:
        out.timed_out = True
    return out


def _writable_by(info: os.stat_result, gid: int | None) -> bool:
    """Whether a user with only its own group ``gid`` may add entries to this folder."""
    mode = info.st_mode
    return bool(mode & 0o003 == 0o003 or (gid is not None and info.st_gid == gid and mode & 0o030 == 0o030))


def _remove_owned_in(remover: _Remover, fd: int, folder: str, uid: int, gid: int | None, depth: int) -> None:
    """:func:`remove_owned` in the one folder open at ``fd``."""
    with os.scandir(fd) as entries:
        for entry in entries:
            remover.tick()
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            path = os.path.join(folder, entry.name)
            if info.st_uid == uid:
                try:
                    if remover.entry(fd, entry.name, path):
                        remover.out.removed.append(path)
                except OSError as exc:
                    remover.note(path, exc.strerror)
            elif stat.S_ISDIR(info.st_mode) and depth < NESTED and _writable_by(info, gid):
                try:
                    child = os.open(entry.name, _DIR, dir_fd=fd)
                except OSError:
                    continue
                try:
                    _remove_owned_in(remover, child, path, uid, gid, depth + 1)
                finally:
                    os.close(child)
