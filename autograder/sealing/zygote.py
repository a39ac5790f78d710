"""The grader's side of a zygote: a sealed process per worker slot and course copy that has
imported torch, matplotlib, IPython and the sealed course_lib once, and forks a child per notebook
(autograder/inside/zygote.py says what the child does to seal itself further).

A sealed run started fresh spends about 6 CPU-seconds before the first cell and after the last
(importing torch and the rest, and the interpreter's exit); a zygote's child spends a fraction of
a second. The zygote needs the grader to run as root (it mounts each child's own /tmp, home and
/proc, which a user namespace under bubblewrap's may not); :func:`zygote_possible` says whether a
job can use one, and :class:`Zygotes` keeps one per worker slot and course copy, started on first
use and started again after a failure.

What the grader keeps of a child (:class:`Child`): the runner's PID in the grader's own PID
namespace (the kernel writes it into the socket's credentials), its namespace's PID 1 (a
``pidfd``: killing it kills everything in the namespace, however it was forked or renamed), and the
zygote's process tree, whose memory is the run's: pages the child shares with the zygote count as
they would in a fresh process.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import struct
import subprocess
import time
from pathlib import Path

from . import sandbox
from .isolation import Isolation
from .sandbox import Limits, SandboxUnavailable

__all__ = ["Zygote", "Zygotes", "Child", "ZygoteFailed", "zygote_possible", "ZYGOTE"]

ZYGOTE = Path(__file__).resolve().parents[1] / "inside" / "zygote.py"
START_TIMEOUT = 300.0  # seconds a zygote may take to import everything (a cold disk, a busy machine)
REPLY_TIMEOUT = 30.0
_UCRED = struct.Struct("3i")  # pid, uid, gid


class ZygoteFailed(SandboxUnavailable):
    """The zygote did not start, or did not start a child (the message says why)."""


def zygote_possible(isolation: Isolation, gpu: bool) -> str:
    """Why a job cannot be forked from a zygote ("" when it can): only in bubblewrap, as root,
    without a GPU (the zygote never initialises CUDA; a GPU run keeps its own sandbox)."""
    if not isolation.namespaces:
        return f"the {isolation.value} seal starts each run itself"
    if os.geteuid() != 0:
        return "the grader does not run as root (an unprivileged user namespace cannot mount a fresh /proc)"
    if gpu:
        return "a run with a GPU gets a sandbox of its own"
    return ""


class Zygote:
    """One zygote: started sealed (:func:`autograder.sealing.sandbox.zygote_command`) in ``folder``
    (a private folder of the grader's: the seal's passwd and group files, the zygote's log)."""

    def __init__(self, course_copy: Path, uid: int, threads: int, folder: Path, limits: Limits) -> None:
        self.course_copy, self.uid, self.threads, self.folder = course_copy, uid, threads, folder
        folder.mkdir(parents=True, exist_ok=True)
        self.control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = sandbox.zygote_command(ZYGOTE, course_copy, folder, limits, uid, theirs.fileno(), threads)
        with open(folder / "zygote.log", "wb") as log:
            self.process = subprocess.Popen(argv, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=log, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                                            cwd=folder, start_new_session=True, preexec_fn=_no_core_dumps)
        theirs.close()
        self.busy: Child | None = None
        try:
            ready = self._receive(START_TIMEOUT)
        except ZygoteFailed:
            self.close()
            raise
        if ready.get("type") != "ready":
            self.close()
            raise ZygoteFailed(f"the zygote said {str(ready)[:300]} instead of being ready")
        self.ready = ready  # what the zygote said of itself once it had imported everything
        self.imported_s = float(ready.get("seconds", 0.0))
        self.anonymous_mb = _anonymous_mb(self.process.pid)  # read here, from the kernel

    def alive(self) -> bool:
        return self.process.poll() is None

    def _receive(self, timeout: float) -> dict:
        ready, _, _ = select.select([self.control], [], [], timeout)
        data = self.control.recv(65536) if ready else b""
        if not data:
            why = "did not answer" if not ready else "ended"
            raise ZygoteFailed(f"the zygote {why}: {self.log_tail()}")
        return json.loads(data)

    def log_tail(self) -> str:
        try:
            return (self.folder / "zygote.log").read_bytes()[-600:].decode("utf-8", "replace").strip() or "(no output)"
        except OSError:
            return "(no log)"

    def fork(self, job_id: str, limits: Limits, channel: socket.socket, log_fd: int) -> "Child":
        """A child for one notebook, talking to the grader on ``channel`` (the runner's end of
        the job's socket pair), its stray output to ``log_fd``."""
        if self.busy is not None and not self.busy.ended:
            raise ZygoteFailed("the zygote is still running another notebook")
        message = {"job": job_id, "uid": self.uid, "threads": self.threads, "limits": dict(limits.__dict__)}
        try:
            socket.send_fds(self.control, [json.dumps(message).encode()], [channel.fileno(), log_fd])
            reply = self._receive(REPLY_TIMEOUT)
        except OSError as exc:
            raise ZygoteFailed(f"the zygote could not be asked for a child: {exc}") from None
        if reply.get("type") != "started":
            raise ZygoteFailed(f"the zygote did not start a child: {str(reply.get('why', reply))[:300]}")
        self.busy = Child(self)
        return self.busy

    def close(self) -> None:
        try:
            self.control.close()
        finally:
            if self.process.poll() is None:
                try:
                    os.killpg(self.process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


def _no_core_dumps() -> None:
    import resource
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


class Child:
    """One notebook's process forked from a zygote, as the grader sees it: what
    :class:`~autograder.pipeline.run.Supervisor` needs of a sealed process."""

    def __init__(self, zygote: Zygote) -> None:
        self.zygote = zygote
        self.pid: int | None = None  # the runner, in the grader's PID namespace (None until it says hello)
        self.init_fd: int | None = None  # a pidfd of its namespace's PID 1
        self.ended = False
        self.code: int | None = None

    @property
    def memory_root(self) -> int:
        """The process whose tree holds the run's memory: the zygote's sandbox (the zygote's
        pages count with the child's, as they would in a fresh process)."""
        return self.zygote.process.pid

    def attach(self, sock: socket.socket, timeout: float = REPLY_TIMEOUT) -> bool:
        """Read the byte the runner sends first, with the credentials the kernel attached (its
        PID, translated into the grader's namespace); open a pidfd on its parent, the PID 1 of
        its namespaces. False if it ended first."""
        ready, _, _ = select.select([sock], [], [], timeout)
        if not ready:
            return False
        try:
            data, ancillary, _, _ = sock.recvmsg(1, socket.CMSG_SPACE(_UCRED.size))
        except OSError:  # it ended first (its log says why); the run then ends as its process ended
            return False
        finally:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 0)
        creds = [d for level, kind, d in ancillary if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS]
        if data != b"\0" or not creds:
            return False
        pid = _UCRED.unpack(creds[0][:_UCRED.size])[0]
        parent = _parent(pid)
        if parent is None:
            return False
        try:
            fd = os.pidfd_open(parent)
        except OSError:
            return False
        if _parent(pid) != parent or _ns_pid(parent) != 1:  # (the runner ended meanwhile and the pid was reused)
            os.close(fd)
            return False
        self.pid, self.init_fd = pid, fd
        return True

    def wait(self, timeout: float) -> int:
        """The run's exit status, waiting up to ``timeout`` seconds
        (:class:`subprocess.TimeoutExpired` otherwise), as the zygote reports it."""
        if self.ended:
            return self.code
        try:
            reply = self.zygote._receive(timeout)
        except ZygoteFailed:
            if self.zygote.alive():
                raise subprocess.TimeoutExpired("zygote child", timeout) from None
            self.ended, self.code = True, None  # the zygote itself is gone, and its children with it
            return self.code
        while reply.get("type") != "exited":  # (nothing else is sent while a child runs)
            reply = self.zygote._receive(timeout)
        self.ended, self.code = True, int(reply.get("status", 0))
        self._close_fd()
        return self.code

    def kill(self) -> None:
        """SIGKILL to the namespace's PID 1: the kernel then kills every process in it."""
        if self.init_fd is not None:
            try:
                signal.pidfd_send_signal(self.init_fd, signal.SIGKILL)
            except OSError:
                pass
        elif not self.ended:  # it never said hello: the whole zygote goes
            self.zygote.close()

    def _close_fd(self) -> None:
        if self.init_fd is not None:
            os.close(self.init_fd)
            self.init_fd = None


def _anonymous_mb(root: int) -> float:
    """The anonymous resident memory (MB) of the Python processes under ``root``: the zygote's own
    heap (its sandbox's other process, bubblewrap's, is not Python)."""
    total = 0
    for pid in sandbox.process_tree(root):
        try:
            with open(f"/proc/{pid}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        if fields.get("Name", "").strip().startswith("python"):
            total += int(fields.get("RssAnon", "0 kB").split()[0])
    return total / 1024


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _ns_pid(pid: int) -> int | None:
    """``pid``'s number in its innermost PID namespace (the last of /proc/PID/status's NSpid)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError, IndexError):
        pass
    return None


class Zygotes:
    """A worker's zygotes, one per (slot user, course copy, threads), started on first use; the
    others are closed when another is needed (a worker grades one assignment's notebooks after
    the other's). A zygote that failed to start is not tried again for that course copy: its
    notebooks get a fresh sandbox each, with the reason (:attr:`refused`)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.current: Zygote | None = None
        self.refused: dict[tuple, str] = {}

    def get(self, course_copy: Path, uid: int, threads: int, limits: Limits) -> Zygote | None:
        key = (str(course_copy), uid, threads)
        if key in self.refused:
            return None
        zygote = self.current
        if zygote is not None and ((str(zygote.course_copy), zygote.uid, zygote.threads) != key or not zygote.alive()):
            zygote.close()
            self.current = zygote = None
        if zygote is None:
            started = time.monotonic()
            try:
                zygote = Zygote(course_copy, uid, threads, self.folder / f"zygote-{uid}", limits)
            except ZygoteFailed as exc:
                self.refused[key] = f"the zygote could not start ({time.monotonic() - started:.0f} s): {exc}"
                return None
            self.current = zygote
        return zygote

    def refuse(self, course_copy: Path, uid: int, threads: int, why: str) -> str:
        """The zygote of this key failed: closed, and not started again (the reason, returned)."""
        self.close()
        self.refused[(str(course_copy), uid, threads)] = why = f"the zygote failed: {why}"
        return why

    def why_not(self, course_copy: Path, uid: int, threads: int) -> str:
        return self.refused.get((str(course_copy), uid, threads), "")

    def close(self) -> None:
        if self.current is not None:
            self.current.close()
            self.current = None
