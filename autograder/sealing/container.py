"""Container mode: a submission sealed off where bubblewrap cannot start.

Gradescope's containers (and many Docker set-ups) have no user namespaces, so bubblewrap
(autograder/sealing/sandbox.py) cannot start there. Container mode keeps the grade unforgeable
with what such a container does allow, the grader running as root:

- the student's code runs as a real, unprivileged Unix user of its own
  (:func:`check_user`), started through ``setpriv`` with no supplementary groups, no
  capabilities and ``no_new_privs`` (no set-user-id program gives anything back);
- it can read nothing of the grader's: the course, the check specs and hidden tests, the
  secret and the gradebook stay in folders only root may enter, which
  :func:`check_user` verifies from the student's own user before anything runs; its
  working folder, its ``TMPDIR`` and a copy of the runner (autograder/inside/, which holds
  no secret) are made for it (:func:`make_job_dir`); the sandbox's ``course_lib`` copy is
  the same filtered one bubblewrap mounts (autograder/sealing/course_copy.py);
- it cannot signal, trace or read the memory of the grader (another user's processes),
  and it talks to the grader over one socket, the same protocol as in bubblewrap;
- limits: address space, file size, open files and core dumps per process
  (:func:`autograder.sealing.sandbox.apply_limits`), processes per user (``RLIMIT_NPROC``, which
  counts every process of the user), the memory of all the user's processes together
  (:func:`user_memory_mb`, checked by the grader four times a second), and the kernel's
  out-of-memory killer told to take the student's processes first;
- when the notebook's grading ends, every process of the user is killed
  (:func:`kill_user`: ``kill(-1, SIGKILL)`` sent as that user, which reaches every process
  it has, double-forked, ``setsid`` or renamed, in one step the kernel does not let a fork
  escape), and what it left where every user may write is removed
  (:func:`remove_user_files`: its files and folders at any depth, however deep, wide or
  strangely named, without recursion and within a time budget, and its System V IPC
  objects); its own home and ``TMPDIR`` go with the job's folder
  (:func:`autograder.sealing.trees.remove_tree`). A removal that stays incomplete is a note for
  the instructor, never a failure of the grading.

What bubblewrap gives and this mode does not: a private network (the container's network
is the student's too: it carries nothing that could change a grade, as the points are
decided in the grader's process from plain data), a private ``/tmp`` of fixed size, and a
read-only view of the system (the student's user can write where any user may).
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from . import trees
from .sandbox import Limits, SandboxUnavailable, apply_limits

__all__ = ["ContainerUser", "check_user", "make_job_dir", "command", "preexec", "user_processes", "user_memory_mb",
           "kill_user", "remove_user_files", "SHARED_TMP", "SHARED_PLACES"]

SHARED_TMP = ("/tmp", "/var/tmp", "/dev/shm")  # where any user may write
# ... and the other folders a standard Debian or Ubuntu system lets every user write into
SHARED_PLACES = SHARED_TMP + ("/run/lock", "/var/lock", "/dev/mqueue", "/var/crash", "/var/metrics")


class ContainerUser(dict):
    """The student's user: ``{"name", "uid", "gid"}`` (plain data: it travels in a job)."""

    @property
    def uid(self) -> int:
        return int(self["uid"])

    @property
    def gid(self) -> int:
        return int(self["gid"])


def check_user(name: str, private: list[Path] = ()) -> ContainerUser:
    """The unprivileged user ``name`` that container mode runs submissions as, checked:
    the grader is root, ``setpriv`` is there, the user exists, is not root and belongs to no
    group but its own, and cannot read any of ``private`` (the course, the grader's files);
    :class:`SandboxUnavailable` says what to fix otherwise."""
    if os.geteuid() != 0:
        raise SandboxUnavailable("container mode runs the student's code as another user, which only root can do; "
                                 "run the grader as root (Gradescope runs run_autograder as root)")
    if not shutil.which("setpriv"):
        raise SandboxUnavailable("container mode needs `setpriv` (util-linux) to drop to the student's user")
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise SandboxUnavailable(f"there is no user {name!r} to run the student's code as: create one "
                                 f"(useradd --system --user-group --no-create-home --shell /usr/sbin/nologin "
                                 f"{name}; the autograder's setup.sh does)") from None
    if entry.pw_uid == 0 or entry.pw_gid == 0:
        raise SandboxUnavailable(f"the user {name!r} is root or in root's group: the student's code needs a user "
                                 "without privileges")
    extra = [g.gr_name for g in grp.getgrall() if name in g.gr_mem and g.gr_gid != entry.pw_gid]
    if extra:
        raise SandboxUnavailable(f"the user {name!r} belongs to other groups ({', '.join(extra)}); it should belong "
                                 "to its own group only")
    user = ContainerUser(name=name, uid=entry.pw_uid, gid=entry.pw_gid)
    readable = _readable_by(user, [Path(p) for p in private])
    if readable:
        raise SandboxUnavailable(f"the student's user {name!r} can read {', '.join(map(str, readable))}: make it "
                                 "root's alone (chmod o= on it, or on a folder above it)")
    return user


_PROBE = ("import os, sys\n"
          "for p in sys.argv[1:]:\n"
          "    try:\n"
          "        os.listdir(p) if os.path.isdir(p) else open(p, 'rb').close()\n"
          "        print(p)\n"
          "    except OSError:\n"
          "        pass\n")


def _readable_by(user: ContainerUser, paths: list[Path]) -> list[str]:
    """The paths among ``paths`` that ``user`` can list or open (asked as that user)."""
    paths = [p for p in paths if p.exists()]
    if not paths:
        return []
    proc = subprocess.run([*_drop(user), sys.executable, "-I", "-S", "-c", _PROBE, *map(str, paths)],
                          capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"}, cwd="/")
    if proc.returncode != 0:
        raise SandboxUnavailable(f"could not run Python as the student's user {user['name']!r} "
                                 f"({proc.stderr.strip()[-300:] or proc.returncode}): {sys.executable} and its "
                                 "virtual environment must be readable by every user")
    return [line for line in proc.stdout.splitlines() if line]


def _drop(user: ContainerUser) -> list[str]:
    return ["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--clear-groups", "--no-new-privs",
            "--inh-caps=-all", "--bounding-set=-all", "--"]


def make_job_dir(job_dir: Path, user: ContainerUser, runner_dir: Path) -> dict[str, Path]:
    """The folders one submission needs, in ``job_dir`` (root's, 0711: the student's user
    may pass through, not list): a copy of the runner (readable), and a home and a
    ``TMPDIR`` that are the user's alone. Returns their paths."""
    job_dir.mkdir(parents=True, exist_ok=True)
    job_dir.chmod(0o711)
    runner = job_dir / "runner"
    shutil.copytree(runner_dir, runner, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"), dirs_exist_ok=True)
    for p in [runner, *runner.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    out = {"runner": runner}
    for name in ("home", "tmp"):
        folder = job_dir / name
        folder.mkdir(exist_ok=True)
        os.chown(folder, user.uid, user.gid)
        folder.chmod(0o700)
        out[name] = folder
    return out


def command(runner: Path, course_copy: Path, folders: dict[str, Path], user: ContainerUser, channel_fd: int,
            threads: int = 1) -> tuple[list[str], dict[str, str]]:
    """The command line and environment that run ``runner`` as the student's user."""
    home, tmp = folders["home"], folders["tmp"]
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(home), "TMPDIR": str(tmp),
        "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "USER": user["name"], "LOGNAME": user["name"],
        "PYTHONPATH": f"{course_copy}:{runner.parent}", "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1", "PYTHONHASHSEED": "0",
        "WORKBOOK_GRADING": "1", "NBGRADER_EXECUTION": "autograde", "MPLBACKEND": "Agg",
        "MPLCONFIGDIR": str(tmp / "matplotlib"), "TQDM_DISABLE": "1",
        "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "OPENBLAS_NUM_THREADS": str(threads),
        "WORKBOOK_CHANNEL_FD": str(channel_fd), "CUDA_VISIBLE_DEVICES": "",
    }
    return [*_drop(user), sys.executable, "-s", str(runner)], env


def preexec(limits: Limits, address_space_mb: int = 0) -> None:
    """In the child, before it becomes the student's user: the per-process limits (the address
    space on top of ``address_space_mb``: :func:`autograder.sealing.sandbox.python_address_space_mb`),
    and the out-of-memory killer's choice (the student's processes first; they cannot lower it)."""
    apply_limits(limits, address_space_mb)
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass


def _status(pid: str) -> tuple[list[int], str] | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    uids, state = [], ""
    for line in lines:
        if line.startswith("Uid:"):
            uids = [int(x) for x in line.split()[1:]]
        elif line.startswith("State:"):
            state = line.split()[1]
    return uids, state


def user_processes(uid: int) -> list[int]:
    """Every live process (not a zombie) whose real, effective or saved user is ``uid``."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            found = _status(entry)
            if found and uid in found[0][:3] and found[1] != "Z":
                out.append(int(entry))
    return out


def user_memory_mb(uid: int) -> float:
    """Memory in use by all of ``uid``'s processes, in MB: their proportional set sizes
    (pages shared after ``fork`` counted once)."""
    total = 0
    for pid in user_processes(uid):
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1])
                        break
        except (OSError, ValueError, IndexError):
            pass
    return total / 1024


def kill_user(uid: int, timeout: float = 10.0) -> list[int]:
    """Kill every process of ``uid``: ``kill(-1, SIGKILL)`` sent by a child that has become
    that user (it reaches every process the user has, and the kernel lets no fork slip
    past it), repeated until none is left or ``timeout``; returns the survivors (none)."""
    deadline = time.monotonic() + timeout
    while True:
        alive = user_processes(uid)
        if not alive or time.monotonic() > deadline:
            return alive
        pid = os.fork()
        if pid == 0:  # the child: only system calls, then leave without any cleanup
            try:
                os.setgroups([])
                os.setresgid(uid, uid, uid)
                os.setresuid(uid, uid, uid)
                os.kill(-1, signal.SIGKILL)
            except BaseException:
                pass
            os._exit(0)
        os.waitpid(pid, 0)
        time.sleep(0.02)


def _ipc_objects(uid: int) -> dict[str, list[str]]:
    """The System V shared memory segments, semaphore sets and message queues that ``uid``
    owns or made (they outlive their processes): ``ipcrm``'s option -> ids."""
    found: dict[str, list[str]] = {}
    for name, option, column in (("shm", "-m", "shmid"), ("sem", "-s", "semid"), ("msg", "-q", "msqid")):
        try:
            lines = Path(f"/proc/sysvipc/{name}").read_text().splitlines()
        except OSError:
            continue
        if not lines:
            continue
        head = lines[0].split()
        for line in lines[1:]:
            row = dict(zip(head, line.split()))
            if str(uid) in (row.get("uid"), row.get("cuid")) and row.get(column, "").isdigit():
                found.setdefault(option, []).append(row[column])
    return found


def remove_user_files(uid: int, gid: int | None = None, folders: tuple[str, ...] = SHARED_PLACES,
                      budget_s: float = trees.DEFAULT_BUDGET_S) -> trees.Removal:
    """Remove everything ``uid`` left where it could write (call after :func:`kill_user`:
    nothing of the user's runs any more): what it owns in ``folders`` at any depth, however
    deep, wide or strangely named (:func:`autograder.sealing.trees.remove_owned`, within
    ``budget_s``), and its System V IPC objects. Never raises: what could not be removed
    is in the returned :class:`~autograder.sealing.trees.Removal`'s ``left``, for the instructor."""
    try:
        out = trees.remove_owned(uid, folders, gid=gid, budget_s=budget_s)
    except Exception as exc:  # (a fault of the grader's own: said, never raised into the grading)
        out = trees.Removal(left=[f"the shared folders: {type(exc).__name__}: {exc}"])
    ipc = _ipc_objects(uid)
    if ipc:
        args = [a for option, ids in ipc.items() for i in ids for a in (option, i)]
        try:
            done = subprocess.run(["ipcrm", *args], capture_output=True, text=True, timeout=30)
            if done.returncode != 0:
                out.left.append(f"System V IPC objects {' '.join(args)}: {done.stderr.strip()[-300:]}")
        except (OSError, subprocess.TimeoutExpired) as exc:
            out.left.append(f"System V IPC objects {' '.join(args)}: {exc}")
    return out
