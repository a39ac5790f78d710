"""What a student's code can leave on disk, removed and walked without fail
(autograder/sealing/trees.py): trees deeper than Python's recursion limit and than a path may be
long, wider than one read of a folder, with names no terminal should print, folders
without permissions, links, FIFOs and sockets."""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from autograder.sealing import trees
from conftest import ROOT
from hubtools import runnable_python
from hostile_trees import DEEP, LONG, WIDE_FILES, WIDE_FOLDERS, chain, hostile_tree


@pytest.fixture
def scratch(tmp_path):
    """A folder for the trees: in memory (/dev/shm) where there is one, so that thousands of
    folders cost milliseconds, not the disk's seconds."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    folder = Path(tempfile.mkdtemp(prefix="workbook-trees-", dir=shm))
    try:
        yield folder
    finally:
        trees.remove_tree(folder)


@pytest.fixture
def outside(scratch):
    """What the tree's links point at: it must stay as it is."""
    folder = scratch / "outside"
    (folder / "inner").mkdir(parents=True)
    (folder / "keep.txt").write_text("keep")
    return folder


def _intact(outside: Path) -> bool:
    return (outside / "keep.txt").read_text() == "keep" and (outside / "inner").is_dir()


def test_a_hostile_tree_is_walked_and_removed_whole(scratch, outside):
    tree = scratch / "tree"
    hostile_tree(tree, outside)
    if sys.version_info < (3, 12):  # the control: 3.11's os.walk recurses and cannot go through it (3.12's
        limit = sys.getrecursionlimit()  # walk, and 3.13's shutil.rmtree, no longer recurse)
        sys.setrecursionlimit(1000)  # (Python's own; something else in the session may have raised it)
        try:
            with pytest.raises(RecursionError):
                for _ in os.walk(tree):
                    pass
        finally:
            sys.setrecursionlimit(limit)
    walked = {os.path.relpath(top, tree) for top, _, _ in trees.walk(tree)}
    assert {".", "wide", "locked", "/".join(["d"] * DEEP)} <= walked
    assert "to-a-folder" not in walked  # a link is never followed
    removal = trees.remove_tree(tree)
    assert removal.complete, removal.left
    assert not tree.exists() and not tree.is_symlink()
    assert removal.entries > DEEP + LONG + WIDE_FILES + WIDE_FOLDERS
    assert WIDE_FOLDERS > trees.PENDING  # (wider than the sub-folders remembered at once)
    assert _intact(outside)


def test_a_link_or_a_file_is_removed_itself(scratch, outside):
    link = scratch / "link"
    link.symlink_to(outside)
    assert trees.remove_tree(link).complete and not link.is_symlink() and _intact(outside)
    assert trees.remove_tree(scratch / "never-there").complete


def test_a_removal_that_runs_out_of_time_says_so_and_never_raises(scratch):
    tree = scratch / "tree"
    tree.mkdir()
    for i in range(WIDE_FILES):
        (tree / f"f{i}").touch()
    stopped = trees.remove_tree(tree, budget_s=0)
    assert stopped.timed_out and not stopped.complete and tree.exists()
    assert "the time allowed for removing them ran out" in stopped.summary()
    assert trees.remove_tree(tree).complete and not tree.exists()


PYTHON = runnable_python()[0] if os.geteuid() == 0 else None


def _nobody() -> pwd.struct_passwd:
    return pwd.getpwnam("nobody")


def _as_nobody(*command: str) -> list[str]:
    return ["setpriv", f"--reuid={_nobody().pw_uid}", f"--regid={_nobody().pw_gid}", "--clear-groups", *command]


def _can_switch_users() -> str:
    if os.geteuid() != 0:
        return "needs root (to act as another user)"
    readable = subprocess.run(_as_nobody("test", "-r", str(ROOT / "autograder" / "trees.py")),
                              capture_output=True) if shutil.which("setpriv") else None
    if readable is None or readable.returncode != 0:
        return "the checkout (or setpriv) is not usable by other users here"
    return "" if PYTHON else "no Python that another user can run"


@pytest.mark.skipif(bool(_can_switch_users()), reason=_can_switch_users() or "")
def test_the_trees_own_unprivileged_user_removes_it_whole(scratch, outside):
    """Without root's privileges the folders without permissions are opened up first."""
    nobody = _nobody()
    scratch.chmod(0o711)
    top = scratch / "nobody's"
    top.mkdir()
    if subprocess.run(_as_nobody("test", "-x", str(top)), capture_output=True).returncode != 0:
        pytest.skip(f"{top} cannot be reached by another user here")
    try:
        top.chmod(0o755)
        os.chown(top, nobody.pw_uid, nobody.pw_gid)
        make = ("import sys\nsys.path[:0] = [sys.argv[1], sys.argv[1] + '/tests']\nfrom pathlib import Path\n"
                "from hostile_trees import hostile_tree\nhostile_tree(Path(sys.argv[2]), Path(sys.argv[3]))\n"
                "from autograder.sealing.trees import remove_tree\nr = remove_tree(sys.argv[2])\n"
                "print(r.complete, r.left[:3])\n")
        shared = top / "outside"
        shutil.copytree(outside, shared)
        for p in (shared, shared / "inner", shared / "keep.txt"):
            os.chown(p, nobody.pw_uid, nobody.pw_gid)
        done = subprocess.run(_as_nobody(PYTHON, "-I", "-c", make, str(ROOT), str(top / "tree"), str(shared)),
                              capture_output=True, text=True, timeout=300, cwd="/")
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.split()[0] == "True", done.stdout
        assert not (top / "tree").exists() and _intact(shared)
    finally:
        trees.remove_tree(top)


def test_everything_a_user_owns_in_the_shared_folders_goes_and_nothing_else(scratch, outside):
    if os.geteuid() != 0:
        pytest.skip("needs root (to give files to another owner)")
    uid, gid = 64_001, 64_001  # (an owner no account has: only root can make its files)
    shared = scratch / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)

    def theirs(path: Path, link_to: Path | None = None) -> None:
        path.symlink_to(link_to) if link_to else path.touch()
        os.chown(path, uid, gid, follow_symlinks=False)

    (shared / "tree").mkdir()
    fd = os.open(shared / "tree", os.O_RDONLY)
    chain(fd, 50, "d")
    os.close(fd)
    os.chown(shared / "tree", uid, gid)  # the top of it is theirs: all of it goes, whoever owns what is inside
    theirs(shared / "file")
    theirs(shared / "link", link_to=outside / "keep.txt")
    (shared / "root's file").write_text("root's")
    (shared / "root's folder").mkdir()
    theirs(shared / "root's folder" / "inside")  # a folder they could not write in: not looked into
    public = shared / ".X11-unix"  # a world-writable folder of root's, as systems have: looked into
    public.mkdir()
    public.chmod(0o1777)
    theirs(public / "theirs")
    (public / "root's").touch()
    removal = trees.remove_owned(uid, [str(shared), str(shared), "/nonexistent"], gid=gid)
    assert removal.complete, removal.left
    assert sorted(os.listdir(shared)) == [".X11-unix", "root's file", "root's folder"]
    assert os.listdir(public) == ["root's"]
    assert os.listdir(shared / "root's folder") == ["inside"]
    assert sorted(removal.removed) == sorted(str(p) for p in (shared / "tree", shared / "file", shared / "link",
                                                              public / "theirs"))
    assert _intact(outside) and stat.S_IMODE(os.stat(public).st_mode) == 0o1777
