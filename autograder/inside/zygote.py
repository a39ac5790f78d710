"""The zygote: one sealed process per worker slot and course copy that has imported, once, what
every graded notebook imports (torch, NumPy, matplotlib, IPython, the sealed course_lib and the
runner), and forks a child for each notebook.

It is started by the same bubblewrap command as a sealed run (autograder/sealing/zygote.py, the
grader running as root), so it sees what a sealed run sees and nothing more. It **holds no
secret**: its only input is the grader's control socket, on which each job is a job id, the
run's limits and user, and two file descriptors (the socket the runner will talk to the grader
on, and the file its stray output goes to). It never sees a set-up message, a plan, a hidden
input or the course secret: those travel later, on the job's own socket, to the child. It is
never dumpable, never initialises CUDA, runs no torch operation, and forks only while it has one
thread.

Each job's child (:func:`_monitor`, then :func:`_init`, then :func:`_runner`):

1. closes every other descriptor, dies with the zygote, starts a session and enters new mount,
   PID, network, IPC, UTS and cgroup namespaces;
2. forks the namespace's PID 1, which keeps the mounts private, mounts a fresh tmpfs on /tmp,
   the home and /dev/shm, a fresh /proc (its kernel knobs read-only) and devpts, names the host,
   brings up loopback, drops to the slot's user (no groups, no capabilities, none to regain) and
   reaps orphans until the runner ends, then exits with its status (everything left in the
   namespace dies with it);
3. forks the runner: every signal disposition as a fresh Python has it, every random generator
   reseeded (Python's, NumPy's global one, torch's), the CPU threads of the job, its PID sent to
   the grader in the socket's credentials (the kernel writes them), then the unchanged runner
   (autograder/inside/notebook_runner.py), which clears the user's keyrings and installs the
   seccomp filter (autograder/inside/lockdown.py) before it reads the set-up message.

What one child does cannot reach the next: its files were on tmpfs mounts that die with its
mount namespace, its processes with its PID namespace, its System V IPC and abstract sockets
with its IPC and network namespaces, its module state (monkeypatching, seeds, rcParams) with its
own copy-on-write memory, its keys with the keyring cleared by the next run.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import socket
import sys
import time

libc = ctypes.CDLL(None, use_errno=True)

PR_SET_PDEATHSIG, PR_GET_DUMPABLE, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_CAP_AMBIENT = 1, 3, 4, 24, 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS = 0x00020000, 0x02000000, 0x04000000
CLONE_NEWIPC, CLONE_NEWPID, CLONE_NEWNET = 0x08000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
SIOCSIFFLAGS, IFF_UP, IFF_LOOPBACK, IFF_RUNNING = 0x8914, 0x1, 0x8, 0x40
MB = 2**20
HOME = "/home/student"
PROC_READ_ONLY = ("sys", "sysrq-trigger", "irq", "bus")  # as bubblewrap's --proc leaves them
MAX_MESSAGE = 65536


class SetupFailed(RuntimeError):
    pass


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise SetupFailed(f"{what}: {os.strerror(err)}")


# ---------------------------------------------------------------------------
# The zygote
# ---------------------------------------------------------------------------

def preload() -> dict:
    """Import what a graded notebook imports (no torch operation, no CUDA)."""
    started = time.monotonic()
    import torch
    import numpy.random  # noqa: F401  (not imported by numpy itself everywhere: reseeded in each child)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot  # (and the font list, from the course copy's cache)
    from IPython.core.interactiveshell import InteractiveShell  # noqa: F401
    import importlib
    import pkgutil
    import course_lib
    for module in pkgutil.walk_packages(course_lib.__path__, "course_lib."):
        try:
            importlib.import_module(module.name)
        except Exception:  # a module a notebook may not need (its optional dependency missing)
            pass
    import notebook_runner  # noqa: F401  (also the notebooks' workbook_runner)
    return {"seconds": round(time.monotonic() - started, 3), "cuda": bool(torch.cuda.is_initialized())}


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _say(fd: int, text: str) -> None:
    try:
        os.write(fd, f"zygote: {text}\n".encode())
    except OSError:
        pass


def _send(control: socket.socket, message: dict) -> None:
    control.send(json.dumps(message).encode())


def main() -> None:
    control = socket.socket(fileno=int(os.environ.pop("WORKBOOK_ZYGOTE_FD")))
    _check(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(PR_SET_DUMPABLE)")
    loaded = preload()
    if loaded["cuda"]:
        raise SetupFailed("CUDA was initialised while importing: a zygote must not hold a GPU context")
    _send(control, {"type": "ready", "threads": _threads(), "dumpable": libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0),
                    **loaded})
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(control, MAX_MESSAGE, 2)
        except OSError:
            return
        if not data:
            return  # the grader is gone: so is this zygote
        try:
            job = json.loads(data)
            if len(fds) != 2:
                raise SetupFailed(f"a job needs two descriptors, {len(fds)} came")
            if _threads() != 1:
                raise SetupFailed(f"the zygote has {_threads()} threads: it forks only with one")
        except (ValueError, SetupFailed) as exc:
            for fd in fds:
                os.close(fd)
            _send(control, {"type": "refused", "why": str(exc)})
            continue
        pid = os.fork()
        if pid == 0:
            control.detach()  # (its descriptor is closed below; the object must not close another's)
            try:
                _monitor(job, fds[0], fds[1], os.getppid())
            except BaseException as exc:
                _say(2, f"the run's child could not start: {type(exc).__name__}: {exc}")
            os._exit(70)
        for fd in fds:
            os.close(fd)
        _send(control, {"type": "started", "job": job.get("job")})
        _, status = os.waitpid(pid, 0)
        _send(control, {"type": "exited", "job": job.get("job"), "status": os.waitstatus_to_exitcode(status)})


# ---------------------------------------------------------------------------
# A job's child
# ---------------------------------------------------------------------------

def _die_with_parent(parent: int | None) -> None:
    """SIGKILL when the parent ends; ``parent``: its PID, to check it did not end first (None
    for a namespace's PID 1, whose parent is outside it: if that ended first, the zygote's
    sandbox is ending, and every process in it, this one included)."""
    _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
    if parent is not None and os.getppid() != parent:  # the parent died before the line above
        os._exit(70)


def _only_descriptors(channel: int, log: int) -> int:
    """Standard output and error to ``log``, standard input from /dev/null, the channel kept
    (returned, as descriptor 3); every other descriptor closed."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.dup2(channel, 3)
    os.closerange(4, os.sysconf("SC_OPEN_MAX"))
    os.set_inheritable(3, True)
    return 3


def _monitor(job: dict, channel: int, log: int, zygote: int) -> None:
    """Outside the job's namespaces: make them, start their PID 1, wait for it, exit with its
    status."""
    _die_with_parent(zygote)
    channel = _only_descriptors(channel, log)
    os.setsid()
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP
    try:
        _check(libc.unshare(flags), "unshare")
    except SetupFailed as exc:
        print(f"zygote: {exc}", file=sys.stderr, flush=True)
        os._exit(71)
    me = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            _init(job, channel, me)
        except BaseException as exc:
            print(f"zygote: the run's namespace could not be set up: {exc}", file=sys.stderr, flush=True)
        os._exit(71)
    os.close(channel)
    _, status = os.waitpid(pid, 0)
    os._exit(_exit_code(status))


def _exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None, flags,
                      data.encode() if data else None), f"mount {target}")


def _fresh_mounts(limits: dict) -> None:
    """Private mounts; fresh tmpfs on /tmp, the home and /dev/shm (what the sandbox had mounted
    inside them, read-only, kept: a virtual environment under /tmp, matplotlib's font list); a
    fresh /proc and devpts."""
    _mount("none", "/", None, MS_REC | MS_PRIVATE)
    tmp = int(limits.get("tmp_mb", 256)) * MB
    _fresh_tmpfs("/tmp", f"size={tmp},mode=1777")
    _fresh_tmpfs(HOME, f"size={int(limits.get('disk_mb', 512)) * MB},mode=1777")
    _fresh_tmpfs("/dev/shm", f"size={tmp},mode=1777")
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for name in PROC_READ_ONLY:
        path = f"/proc/{name}"
        if os.path.exists(path):
            _mount(path, path, None, MS_BIND | MS_REC)
            _mount(path, path, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=620")


def _mount_points() -> list[str]:
    """Every mount point of this mount namespace (/proc/self/mountinfo's fifth field, its octal
    escapes decoded)."""
    points = []
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            raw = line.split()[4]
            points.append(re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]), raw).decode())
    return points


def _fresh_tmpfs(target: str, data: str) -> None:
    """A new, empty tmpfs on ``target``, with the mounts that were inside it (the sandbox's
    read-only binds) moved in again at their places, their folders as they were."""
    inside = sorted({p for p in _mount_points() if p.startswith(target.rstrip("/") + "/")})
    kept = [p for p in inside if not any(p.startswith(q + "/") for q in inside if q != p)]  # outermost
    folders = {}  # every folder between target and a kept mount: its mode, to make it again
    for point in kept:
        parent = os.path.dirname(point)
        while parent.startswith(target.rstrip("/") + "/"):
            folders[parent] = os.stat(parent).st_mode & 0o7777
            parent = os.path.dirname(parent)
    stage = "/.workbook-kept"
    if kept:
        os.mkdir(stage, 0o700)
    for i, point in enumerate(kept):
        place = f"{stage}/{i}"
        os.mkdir(place) if os.path.isdir(point) else open(place, "w").close()
        _mount(point, place, None, MS_BIND | MS_REC)
    _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, data)
    for folder in sorted(folders):
        os.mkdir(folder)
        os.chmod(folder, folders[folder])
    for i, point in enumerate(kept):
        place = f"{stage}/{i}"
        os.mkdir(point) if os.path.isdir(place) else open(point, "w").close()
        _mount(place, point, None, MS_BIND | MS_REC)  # (a bind of a read-only mount stays read-only)
        _check(libc.umount2(place.encode(), MNT_DETACH), f"umount {place}")
        os.rmdir(place) if os.path.isdir(place) else os.unlink(place)
    if kept:
        os.rmdir(stage)


def _loopback_up() -> None:
    import fcntl
    import struct
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", IFF_UP | IFF_LOOPBACK | IFF_RUNNING))


def _drop_to(uid: int) -> None:
    """The slot's user and group, no supplementary groups, an empty bounding set and no ambient
    capabilities: nothing of root's is left, and nothing can be regained."""
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    last = int(open("/proc/sys/kernel/cap_last_cap").read())
    for cap in range(last + 1):
        _check(libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), "prctl(PR_CAPBSET_DROP)")
    os.setresuid(uid, uid, uid)
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    with open("/proc/self/status") as f:
        caps = {k: v.strip() for k, _, v in (line.partition(":") for line in f) if k.startswith("Cap")}
    if any(int(caps[k], 16) for k in ("CapPrm", "CapEff", "CapInh", "CapAmb", "CapBnd")):
        raise SetupFailed(f"capabilities left after the drop: {caps}")


def _init(job: dict, channel: int, monitor: int) -> None:
    """PID 1 of the job's namespaces."""
    _die_with_parent(None)
    _fresh_mounts(job["limits"])
    libc.sethostname(b"sandbox", 7)
    _loopback_up()
    os.chdir(HOME)
    _drop_to(int(job["uid"]))
    for sig in signal.valid_signals():  # PID 1 ignores every signal its own namespace sends
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    me = os.getpid()
    runner = os.fork()
    if runner == 0:
        code = 70
        try:
            _die_with_parent(me)
            code = _runner(job, channel)
        except BaseException as exc:
            print(f"zygote: the runner could not start: {exc}", file=sys.stderr, flush=True)
        os._exit(code)
    os.close(channel)
    while True:  # reap everything orphaned in here, until the runner ends
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(70)
        if pid == runner:
            os._exit(_exit_code(status))


def _fresh_signals() -> None:
    """Every signal as a fresh Python has it: SIGINT raises KeyboardInterrupt (the runner's
    cell time limit relies on it), SIGPIPE and SIGXFSZ ignored, the rest the kernel's default."""
    for sig in signal.valid_signals():
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def _reseed() -> None:
    """No two children draw the same numbers: Python's, NumPy's global and torch's generators
    seeded again from the kernel's entropy."""
    import random

    import numpy.random
    import torch
    random.seed()
    numpy.random.seed()
    torch.seed()


def _runner(job: dict, channel: int) -> int:
    os.setsid()  # a session of its own, as bubblewrap's --new-session gives a fresh sandbox's runner
    _fresh_signals()
    _reseed()
    threads = str(int(job.get("threads", 1)))
    os.environ.update({"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "OPENBLAS_NUM_THREADS": threads,
                       "WORKBOOK_CHANNEL_FD": str(channel)})
    import torch
    torch.set_num_threads(int(threads))
    os.makedirs(os.environ.get("MPLCONFIGDIR", "/tmp/matplotlib"), exist_ok=True)
    sock = socket.socket(fileno=channel)
    sock.sendall(b"\0")  # the grader reads this process's PID from the credentials the kernel attaches
    sock.detach()  # (the runner makes its own socket object of this descriptor)
    import notebook_runner
    sys.argv = [notebook_runner.__file__]
    notebook_runner.main()
    return 0


if __name__ == "__main__":
    main()
