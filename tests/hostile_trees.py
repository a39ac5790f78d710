"""A tree with every kind of entry a student's code can make (tests/unit/test_trees.py,
tests/grading/test_gradescope.py build it; the standard library only, so that any user's
Python can import it)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

DEEP = 1100  # levels of one-letter folders: past Python's recursion limit (1000)
LONG = 100  # levels of 50-byte names: a path past PATH_MAX (4096 bytes)
WIDE_FILES, WIDE_FOLDERS = 600, 600  # entries of one folder
ODD_NAMES = (b"a\nb", b"\x1b[2J", b"\xff\xfe", b"\x01\x02 \x7f", b"-rf", b" ", b"\xe2\x80\xae.txt")


def chain(fd: int, depth: int, name: str) -> None:
    """``depth`` nested folders named ``name`` under the folder open at ``fd``, a file at the
    bottom, the bottom folder left without any permission."""
    here = os.dup(fd)
    for _ in range(depth):
        os.mkdir(name, dir_fd=here)
        below = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=here)
        os.close(here)
        here = below
    os.close(os.open("bottom", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=here))
    os.fchmod(here, 0)
    os.close(here)


def hostile_tree(root: Path, outside: Path) -> None:
    """Every kind of entry a student's code can make, at ``root``: very deep, very long paths,
    very wide, names with control characters and bytes that are not UTF-8, folders without
    permissions, links (to ``outside``, which must survive), a hard link, a FIFO, a socket."""
    root.mkdir()
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        chain(fd, DEEP, "d")
        chain(fd, LONG, "l" * 50)
        os.mkdir("wide", dir_fd=fd)
        wide = os.open("wide", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        for i in range(WIDE_FILES):
            os.close(os.open(f"f{i}", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=wide))
        for i in range(WIDE_FOLDERS):
            os.mkdir(f"d{i}", dir_fd=wide)
        os.close(wide)
        for name in ODD_NAMES:
            os.close(os.open(name, os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
        os.mkdir(b"\xff\nfolder", dir_fd=fd)
        os.symlink(outside / "keep.txt", "to-a-file", dir_fd=fd)
        os.symlink(outside, "to-a-folder", dir_fd=fd)
        os.symlink("/nonexistent", "dangling", dir_fd=fd)
        try:
            os.link(outside / "keep.txt", "hard-link", dst_dir_fd=fd)
        except PermissionError:  # (a system that protects hard links, for a user who does not own it)
            pass
        os.mkfifo("fifo", dir_fd=fd)
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(str(root / "socket"))
        os.mkdir("locked", dir_fd=fd)  # a folder without permissions holding a read-only one
        os.mkdir("locked/read-only", dir_fd=fd)
        os.close(os.open("locked/read-only/f", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
        os.chmod("locked/read-only", 0o500, dir_fd=fd)
        os.chmod("locked", 0, dir_fd=fd)
    finally:
        os.close(fd)
