"""The sealed room a submission runs in: bubblewrap (Linux namespaces) plus resource limits.

:func:`command` builds the ``bwrap`` command line for one submission:

- its own user (a dedicated uid per worker when the grader runs as root), PID,
  network, IPC and UTS namespaces: no network at all, no view of other processes,
  no signals to the grader, nothing that outlives the sandbox (``--die-with-parent``
  and a private PID namespace: when its first process ends, every process in it is
  killed);
- a read-only view of the system and the Python installation, a filtered copy of
  ``course_lib`` (:mod:`autograder.sealing.course_copy`), the in-sandbox runner, and two small
  private tmpfs folders (``/work``, its working directory and HOME, and ``/tmp``),
  whose size caps what the submission can write;
- nothing else: no course folder, no ``grading/``, no ``solutions/``, no other
  submission, no gradebook, no kernel connection files.

The limits a process cannot lift itself (memory, processes, file size, open files,
core dumps) are set by the runner before any student code runs
(:func:`apply_limits`), and again here before ``bwrap`` starts.

:func:`check_available` tells whether bubblewrap can run here, and if not, why and
how to fix it.
"""

from __future__ import annotations

import functools
import os
import resource
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Limits", "SandboxUnavailable", "check_available", "command", "apply_limits", "tree_memory_mb",
           "python_address_space_mb",
           "process_tree", "SANDBOX_UID_BASE", "zygote_command",
           "RUNNER_DIR", "COURSE_DIR", "WORK_DIR"]

MB = 2**20
SANDBOX_UID_BASE = 100_000  # sandbox users (grader running as root) start here
RUNNER_DIR = "/opt/workbook"  # where autograder/inside/ (the runner and its modules) is mounted
COURSE_DIR = "/opt/course"  # where the filtered course_lib is mounted
WORK_DIR = "/home/student"  # the submission's working directory (and HOME)
MPL_DIR = "/tmp/matplotlib"  # MPLCONFIGDIR: matplotlib's font list, read-only, in a writable folder


@dataclass(frozen=True)
class Limits:
    """Resource limits for one submission (times in seconds, sizes in MB)."""

    cell_timeout: int = 300
    notebook_timeout: int = 1800
    memory_mb: int | None = 4096
    file_mb: int = 100
    disk_mb: int = 512
    tmp_mb: int = 256
    max_processes: int = 64
    max_open_files: int = 1024
    max_output_kb: int = 256
    max_notebook_output_kb: int = 4096

    def __post_init__(self) -> None:
        for name in ("cell_timeout", "notebook_timeout", "file_mb", "disk_mb", "tmp_mb", "max_processes",
                     "max_open_files", "max_output_kb", "max_notebook_output_kb"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"Limits.{name} must be a positive integer, got {value!r}")
        if self.memory_mb is not None and (not isinstance(self.memory_mb, int) or self.memory_mb <= 0):
            raise ValueError(f"Limits.memory_mb must be a positive integer or None, got {self.memory_mb!r}")


class SandboxUnavailable(RuntimeError):
    """bubblewrap cannot run here; the message says why and how to fix it."""


_ADDRESS_SPACE_PROBE = ("import re, torch, numpy\n"
                        "print(re.search(r'VmSize:\\s+(\\d+)', open('/proc/self/status').read()).group(1))")


@functools.cache
def python_address_space_mb() -> int:
    """The address space (MB) a fresh Python of this environment maps once it has imported
    torch: what a sandbox's runner maps before the submission's first allocation. About 600 MB
    with a CPU build of PyTorch; about 3,100 MB with PyPI's Linux build, whose CUDA libraries
    are mapped whether or not there is a GPU. A submission's ``memory_mb`` is allowed on top of
    it (the memory it really uses is watched apart: :func:`tree_memory_mb`). Measured once per
    process, before any child is started (:func:`apply_limits` runs between fork and exec)."""
    try:
        proc = subprocess.run([sys.executable, "-s", "-c", _ADDRESS_SPACE_PROBE], capture_output=True, text=True,
                              timeout=300, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                                                "CUDA_VISIBLE_DEVICES": ""})
        return int(proc.stdout.split()[-1]) // 1024 + 1
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return 4096  # cannot tell: as much as the largest build needs


RUNNER_MAPS_MB = 1024  # what the runner may map beyond a fresh Python with torch before its first cell (IPython,
#                        its threads): the runner then limits itself to ``memory_mb`` on top of what it maps


def apply_limits(limits: Limits, address_space_mb: int = 0) -> None:
    """Limit this process and everything it starts (inherited, and not raisable without
    privileges): address space (``limits.memory_mb`` on top of ``address_space_mb``, what the
    Python installation maps: :func:`python_address_space_mb`, and :data:`RUNNER_MAPS_MB`: a cap
    until the runner sets its own, ``memory_mb`` on top of what it maps at the first cell),
    processes, file size, open files, no core dumps."""
    def cap(kind: int, value: int) -> None:
        soft, hard = resource.getrlimit(kind)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(kind, (value, value))

    if limits.memory_mb:
        cap(resource.RLIMIT_AS, (limits.memory_mb + address_space_mb + RUNNER_MAPS_MB) * MB)
    cap(resource.RLIMIT_FSIZE, limits.file_mb * MB)
    cap(resource.RLIMIT_NOFILE, limits.max_open_files)
    cap(resource.RLIMIT_CORE, 0)


def _stat_fields(pid: int | str) -> list[bytes]:
    """The fields of ``/proc/PID/stat`` after the command's name (the name, in parentheses, may
    hold spaces and parentheses of its own): index 0 is field 3, the state; OSError if there
    is no such process."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parent = int(_stat_fields(entry)[1])
            except (OSError, ValueError, IndexError):
                continue
            out.setdefault(parent, []).append(int(entry))
    return out


def process_tree(root: int) -> list[int]:
    """``root`` and every process descended from it (a sandbox's processes: bubblewrap
    keeps them all under its own, even those that called ``setsid``)."""
    children, out, stack = _children(), [], [root]
    while stack:
        pid = stack.pop()
        out.append(pid)
        stack.extend(children.get(pid, ()))
    return out


def start_time(pid: int) -> int | None:
    """A process's start time (field 22 of /proc/PID/stat, which no process can change), None
    if there is no such process: with the pid, it names one process however pids are reused."""
    try:
        return int(_stat_fields(pid)[19])
    except (OSError, IndexError, ValueError):
        return None


def _runner(root: int) -> int | None:
    """The notebook's runner (the process that runs the cells and handles their interrupts):
    the first Python started in the tree under ``root``, before any process of the student's."""
    runner = None
    for pid in process_tree(root):
        try:
            with open(f"/proc/{pid}/comm", "rb") as f:
                name = f.read()
        except OSError:
            continue
        started = start_time(pid)
        if started is not None and name.startswith(b"python") and (runner is None or started < runner[0]):
            runner = (started, pid)
    return None if runner is None else runner[1]


def run_queue_seconds(root: int) -> float | None:
    """Seconds the notebook's runner (:func:`_runner`) has spent ready to run but kept off the
    CPU by other processes (its main thread's run-queue delay, ``/proc/PID/schedstat``); None
    where the kernel does not say. 0.0 once the runner has lowered its own priority below the
    grader's (a higher nice value, or the SCHED_BATCH or SCHED_IDLE policy: a thread cannot
    raise it again without privilege): its waits are then the notebook's doing."""
    pid = _runner(root)
    if pid is None:
        return None
    try:
        fields = _stat_fields(pid)  # [16]: its nice value (field 19), [38]: its policy (field 41)
        if int(fields[16]) > os.getpriority(os.PRIO_PROCESS, 0) or int(fields[38]) != os.sched_getscheduler(0):
            return 0.0
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def tree_cpu_seconds(root: int) -> float:
    """CPU-seconds the process tree under ``root`` has used: each live process's own and that of
    the children it has reaped (``/proc/PID/stat``'s utime, stime, cutime, cstime); a
    process reparented to a PID 1 in the tree is counted when that PID 1 reaps it."""
    ticks = 0
    for pid in process_tree(root):
        try:
            fields = _stat_fields(pid)
            ticks += sum(int(fields[k]) for k in (11, 12, 13, 14))
        except (OSError, ValueError, IndexError):
            continue
    return ticks / os.sysconf("SC_CLK_TCK")


def own_run_queue_seconds() -> float | None:
    """Seconds the calling thread (the grader's, serving a run) has spent ready to run but kept
    off the CPU (``/proc/thread-self/schedstat``); None where the kernel does not say."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def _memory_kb(pid: int, field: str) -> int:
    try:
        if field == "Rss":  # cheap: one line of statm
            with open(f"/proc/{pid}/statm") as f:
                return int(f.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def tree_memory_mb(root: int) -> float:
    """Memory in use by a process tree, in MB: the sum of its processes' proportional
    set sizes (pages shared after ``fork`` are counted once), read only when the cheaper
    sum of resident sizes, an upper bound, is large enough to matter."""
    pids = process_tree(root)
    rss = sum(_memory_kb(p, "Rss") for p in pids) / 1024
    if rss < 256:
        return rss
    return sum(_memory_kb(p, "Pss") for p in pids) / 1024


def _bwrap() -> str | None:
    return shutil.which("bwrap") or (os.path.exists("/usr/bin/bwrap") and "/usr/bin/bwrap") or None


@functools.lru_cache(maxsize=None)
def check_available() -> str:
    """The path of a working ``bwrap``; :class:`SandboxUnavailable` with the fix otherwise."""
    if not sys.platform.startswith("linux"):
        raise SandboxUnavailable(
            f"the grading sandbox needs Linux namespaces (bubblewrap); this is {sys.platform}. Grade on a "
            "Linux machine (a VM or a container with user namespaces), or pass --unsafe-no-sandbox to grade "
            "without it (grades are then marked unverified).")
    bwrap = _bwrap()
    if bwrap is None:
        raise SandboxUnavailable(
            "bubblewrap (bwrap) is not installed; it seals each submission off while it is graded. "
            "Install it with `sudo apt-get install bubblewrap` (Debian/Ubuntu; `dnf install bubblewrap` on "
            "Fedora), or run `make sandbox`. To grade without it, pass --unsafe-no-sandbox (grades are then "
            "marked unverified).")
    from ..inside import lockdown
    try:
        lockdown.build_filter()
    except lockdown.SealError as exc:
        raise SandboxUnavailable(f"the sandbox's syscall filter cannot be built here: {exc}") from None
    if os.geteuid() == 0 and not shutil.which("setpriv"):
        raise SandboxUnavailable("running as root, the sandbox drops to an unprivileged user with `setpriv` "
                                 "(util-linux), which is not installed.")
    probe = [bwrap, *_namespace_args(os.geteuid() == 0), "--ro-bind", "/", "/", "--proc", "/proc",
             "--dev", "/dev", "true"]
    try:
        proc = subprocess.run(probe, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxUnavailable(f"bubblewrap could not start: {exc}") from None
    if proc.returncode != 0:
        why = proc.stderr.strip() or f"exit status {proc.returncode}"
        raise SandboxUnavailable(
            f"bubblewrap is installed but cannot create namespaces here ({why}). Unprivileged user "
            "namespaces are probably disabled: enable them (`sudo sysctl -w kernel.unprivileged_userns_clone=1` "
            "on Debian, or allow bwrap in AppArmor on Ubuntu 24.04: `sudo sysctl -w "
            "kernel.apparmor_restrict_unprivileged_userns=0`), run the grader as root, or pass "
            "--unsafe-no-sandbox (grades are then marked unverified).")
    return bwrap


def _namespace_args(as_root: bool) -> list[str]:
    args = ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--hostname", "sandbox"]
    if not as_root:
        args[:0] = ["--unshare-user", "--disable-userns"]
    return args


def _ro_binds(paths: list[Path]) -> list[str]:
    """``--ro-bind`` for each existing path (and its parent folders made traversable)."""
    args: list[str] = []
    made: set[str] = set()
    for path in paths:
        if not path.exists():
            continue
        for parent in reversed(path.parents):
            if str(parent) not in ("/",) and str(parent) not in made:
                made.add(str(parent))
                args += ["--perms", "0755", "--dir", str(parent)]
        args += ["--ro-bind", str(path), str(path)]
    return args


def _system_binds() -> list[str]:
    args: list[str] = []
    for name in ("usr", "bin", "lib", "lib64", "lib32", "sbin"):
        p = Path("/") / name
        if p.is_symlink():
            args += ["--symlink", os.readlink(p), str(p)]
        elif p.is_dir():
            args += ["--ro-bind", str(p), str(p)]
    etc = [Path("/etc") / n for n in ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "alternatives",
                                     "fonts", "ssl/openssl.cnf", "mime.types")]
    args += _ro_binds([p for p in etc if p.exists()])
    return args


def python_paths() -> list[Path]:
    """The Python installation and virtual environment the sandbox needs (read-only)."""
    roots = {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(), Path(sys.prefix)}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        value = sysconfig.get_paths().get(key)
        if value:
            roots.add(Path(value).resolve())
    exe = Path(sys.executable)
    roots.add(exe.resolve().parent)
    # keep the outermost folders only
    out: list[Path] = []
    for p in sorted(roots, key=lambda p: len(p.parts)):
        if not any(p == q or q in p.parents for q in out):
            out.append(p)
    return out


def _sealed_args(runner_dir: Path, course_copy: Path, job_dir: Path, limits: Limits, uid: int, gpu: bool,
                 threads: int, fd_variable: str, fd: int) -> list[str]:
    """bubblewrap's arguments up to the command: the namespaces, the mounts and the
    environment of a sealed process (the runner, or a zygote: :mod:`autograder.sealing.zygote`)."""
    bwrap = check_available()
    as_root = os.geteuid() == 0
    uid = uid if as_root else os.getuid()
    (job_dir / "passwd").write_text(f"root:x:0:0::/:/bin/false\nstudent:x:{uid}:{uid}::{WORK_DIR}:/bin/false\n")
    (job_dir / "group").write_text(f"root:x:0:\nstudent:x:{uid}:\n")
    # the private writable folders first, so that read-only binds may sit inside them
    args = [bwrap, *_namespace_args(as_root),
            "--perms", "1777", "--size", str(limits.tmp_mb * MB), "--tmpfs", "/tmp",
            "--perms", "0755", "--dir", "/home",
            "--perms", "1777", "--size", str(limits.disk_mb * MB), "--tmpfs", WORK_DIR,
            *_system_binds(), *_ro_binds(python_paths()),
            "--ro-bind", str(job_dir / "passwd"), "/etc/passwd", "--ro-bind", str(job_dir / "group"), "/etc/group",
            "--perms", "0755", "--dir", "/opt",
            "--ro-bind", str(runner_dir), RUNNER_DIR,
            "--ro-bind", str(course_copy), COURSE_DIR,
            "--proc", "/proc", "--dev", "/dev",
            *_font_cache_binds(course_copy),
            "--chdir", WORK_DIR]
    if gpu:
        for dev in sorted(Path("/dev").glob("nvidia*")):
            args += ["--dev-bind", str(dev), str(dev)]
        for extra in ("/sys/bus/pci", "/sys/devices", "/sys/module/nvidia"):
            if Path(extra).exists():
                args += ["--ro-bind", extra, extra]
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": WORK_DIR, "TMPDIR": "/tmp",
        "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "USER": "student",
        "PYTHONPATH": f"{COURSE_DIR}:{RUNNER_DIR}", "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1", "PYTHONHASHSEED": "0",
        "WORKBOOK_GRADING": "1", "NBGRADER_EXECUTION": "autograde", "MPLBACKEND": "Agg",
        "MPLCONFIGDIR": MPL_DIR, "TQDM_DISABLE": "1",  # (progress bars: nobody watches a graded run)
        "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "OPENBLAS_NUM_THREADS": str(threads),
        fd_variable: str(fd),
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0") if gpu else "",
    }
    args += ["--clearenv"]
    for key, value in env.items():
        args += ["--setenv", key, value]
    return args


def _font_cache_binds(course_copy: Path) -> list[str]:
    """matplotlib's font list, built once with the course copy
    (:func:`autograder.sealing.course_copy.build_font_cache`), read-only in a writable
    ``MPLCONFIGDIR``: no sealed process runs ``fc-list`` or builds it again."""
    args = ["--perms", "1777", "--dir", MPL_DIR]
    for cache in sorted((course_copy / "matplotlib").glob("fontlist-*.json")):
        args += ["--ro-bind", str(cache), f"{MPL_DIR}/{cache.name}"]
    return args


def command(runner: Path, course_copy: Path, job_dir: Path, limits: Limits, uid: int, channel_fd: int,
            gpu: bool = False, threads: int = 1) -> list[str]:
    """The ``bwrap`` command line that runs ``runner`` (autograder/inside/notebook_runner.py) sealed off;
    its folder, autograder/inside/, is all of the autograder the sandbox sees.

    ``uid`` is the user the sandbox runs as when the grader is root (one per concurrent
    sandbox; otherwise the sandbox keeps the grader's own user, in a user namespace).
    ``course_copy`` holds the filtered ``course_lib`` folder; ``job_dir`` is a private
    folder of the grader's (two small files are written there: the sandbox's
    ``/etc/passwd`` and ``/etc/group``); ``channel_fd`` is the socket the runner talks
    to the grader on (kept open across ``bwrap``)."""
    args = _sealed_args(runner.parent, course_copy, job_dir, limits, uid, gpu, threads, "WORKBOOK_CHANNEL_FD",
                        channel_fd)
    command_line = [sys.executable, "-s", str(Path(RUNNER_DIR) / runner.name)]
    if os.geteuid() == 0:
        command_line = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs",
                        "--inh-caps=-all", "--bounding-set=-all", "--", *command_line]
    return [*args, *command_line]


def zygote_command(zygote: Path, course_copy: Path, folder: Path, limits: Limits, uid: int, control_fd: int,
                   threads: int = 1) -> list[str]:
    """The ``bwrap`` command line of a zygote (autograder/inside/zygote.py): the same seal as
    :func:`command`'s, as root inside it (it mounts each child's folders and drops each child
    to ``uid``); ``control_fd`` is its socket to the grader. The grader must be root."""
    if os.geteuid() != 0:
        raise SandboxUnavailable("a zygote needs the grader to run as root")
    args = _sealed_args(zygote.parent, course_copy, folder, limits, uid, False, threads, "WORKBOOK_ZYGOTE_FD",
                        control_fd)
    return [*args, sys.executable, "-s", str(Path(RUNNER_DIR) / zygote.name)]
