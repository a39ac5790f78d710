"""How one notebook's sealed process is started, one class per way (:func:`seal_for` chooses):

- :class:`Forked`: a child of the worker's zygote (autograder/sealing/zygote.py), bubblewrap
  as root: a fraction of a CPU-second to start and end;
- :class:`FreshSandbox`: a bubblewrap sandbox of its own (a grader without root, a GPU run, or
  where the zygote could not start);
- :class:`Contained`: container mode, the student's code as another Unix user
  (autograder/sealing/container.py);
- :class:`Unsealed`: ``--unsafe-no-sandbox``.

Each gives the run a handle with what the supervisor needs of the process (autograder/pipeline/run.py):
``pid`` (the runner's tree, for its wait for a CPU), ``wait(timeout)``, ``kill()``, and says how
the run's memory is counted and what to clean up after it. ``syscall_filter`` is what the runner
is asked to do with the seccomp filter (autograder/inside/lockdown.py): required in bubblewrap,
where the kernel allows it in container mode, not at all unsealed.

Every run gets a CPU share of its own (autograder/sealing/cpu_share.py): its processes in a
cgroup capped at its ``threads`` CPUs, made by :meth:`Seal.share_cpu` before the process
starts and removed, with whatever is left in it, by :meth:`Seal.release_cpu`; where no group
can be made, the runner's filter refuses new sessions instead (``sessions``: ``refused``).
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Protocol

from ..course.problems import problem
from ..doors.outbound import clean_text
from ..inside.channel import Channel
from ..sealing import container, cpu_share, sandbox
from ..sealing.isolation import Isolation
from ..sealing.zygote import Child, Zygote
from .handoffs import Job
from .run_transcript import Transcript

__all__ = ["Seal", "Forked", "FreshSandbox", "Contained", "Unsealed", "Started", "seal_for", "RUNNER"]

RUNNER = Path(__file__).resolve().parents[1] / "inside" / "notebook_runner.py"  # its folder is all the sandbox sees of autograder/


class Started:
    """A sealed process started here (bubblewrap, setpriv or Python itself), as a handle: its
    process group is killed as a whole."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.process = process
        self.pid: int | None = process.pid
        self.memory_root = process.pid

    def wait(self, timeout: float) -> int | None:
        return self.process.wait(timeout=timeout)

    def kill(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class Supervisor(Protocol):
    """What a seal needs of the run it starts (autograder/pipeline/run.py's ``Supervisor``)."""

    job: Job
    job_dir: Path
    course_copy: Path
    uid: int
    limits: sandbox.Limits
    process: Started | Child | None
    sock: socket.socket | None
    transcript: Transcript
    survivors: list[int]


class Seal:
    """One way of sealing a notebook off (the run's ``isolation`` is :attr:`isolation`)."""

    isolation = Isolation.BUBBLEWRAP
    how = ""  # the way within it, for the run's summary
    syscall_filter = "required"
    cpu: cpu_share.CpuGroup | None = None  # the run's CPU group (share_cpu), if one could be made
    cpu_words = ""  # how the run's CPU was shared, for the run's summary

    def share_cpu(self, job: Job) -> None:
        """Make the run's CPU group (before :meth:`start`), or say why there is none."""
        groups, why = cpu_share.found()
        if groups is not None:
            try:
                self.cpu = groups.make(int(job.get("threads", 1)))
                self.cpu_words = groups.words()
                return
            except OSError as exc:
                why = f"the run's group could not be made: {exc.strerror or exc}"
        self.cpu_words = f"new sessions refused (no CPU group: {why})" if self.syscall_filter != "off" else ""

    @property
    def sessions(self) -> str:
        """What the runner's filter does with ``setsid``/``setpgid``: refused without a CPU group."""
        return "allowed" if self.cpu is not None else "refused"

    def release_cpu(self) -> None:
        """Remove the run's CPU group, killing what is still in it."""
        group, self.cpu = self.cpu, None
        if group is not None:
            group.close()

    baseline_mb = 0.0  # what the run's processes used when its first cell was about to start

    def open(self, run: Supervisor, setup: dict) -> Started | Child:
        """Start the run's sealed process on a socket pair (the grader's end as ``run.sock``,
        closed by the supervisor whatever happens here) and hand it ``setup``, with what is
        asked of the runner's own seal: its CPU group first (:meth:`share_cpu`), then the
        process (:meth:`start`), then whatever the handle must learn from the runner (its first
        byte: :meth:`attach`), then the set-up message."""
        self.share_cpu(run.job)
        run.sock, child = socket.socketpair()
        try:
            handle = self.start(run, child)
        finally:
            child.close()
        self.attach(handle, run.sock)  # (a forked runner into its CPU group before it has its notebook)
        Channel(run.sock).send({**setup, "syscall_filter": self.syscall_filter, "sessions": self.sessions})
        return handle

    def start(self, run: Supervisor, channel: socket.socket) -> Started | Child:
        raise NotImplementedError

    def attach(self, handle: Started | Child, sock: socket.socket) -> None:
        """Before the set-up message is sent: whatever the handle must learn from the runner."""

    def memory_mb(self, handle: Started | Child, run: Supervisor) -> float:
        """What the run's processes use now, in MB."""
        return sandbox.tree_memory_mb(handle.memory_root)

    def measure_baseline(self, run: Supervisor) -> None:
        """When the first cell is about to start: what the runner, torch and IPython use (the
        grader's, not the notebook's)."""
        self.baseline_mb = self.memory_mb(run.process, run)

    def used_mb(self, run: Supervisor) -> float:
        """Memory the notebook's processes use together beyond the baseline, as the ``memory_mb``
        limit counts it; for a child of a zygote, less the pages it may have copied from its
        zygote by writing to them (a fresh process has them already: :meth:`slack_mb`)."""
        slack = self.slack_mb(run.process)
        return max(0.0, self.memory_mb(run.process, run) - self.baseline_mb - slack)

    def slack_mb(self, handle: Started | Child) -> float:
        """Memory the run may come to use that a fresh process would not (none but a forked one's)."""
        return 0.0

    def clean_up(self, run: Supervisor) -> None:
        """After the process is gone: what it left outside its seal."""

    def _popen(self, run: Supervisor, argv: list[str], env: dict, cwd: Path, channel: socket.socket,
               preexec) -> Started:
        log = open(run.job_dir / "sandbox.log", "wb")
        try:
            process = subprocess.Popen(argv, pass_fds=(channel.fileno(),), stdin=subprocess.DEVNULL, stdout=log,
                                       stderr=log, env=env, cwd=cwd, start_new_session=True,
                                       preexec_fn=functools.partial(_enter, self.cpu, preexec))
        finally:
            log.close()
        return Started(process)


def _enter(group: cpu_share.CpuGroup | None, preexec) -> None:
    """In the sealed process before its program starts: into the run's CPU group, then ``preexec``."""
    if group is not None:
        group.add_self()
    preexec()


def _floor(run: Supervisor) -> int:
    if not run.limits.memory_mb:
        return 0
    return run.job.get("address_space_mb") or sandbox.python_address_space_mb()


class FreshSandbox(Seal):
    def __init__(self, why: str = "") -> None:
        self.why = why  # why not a zygote's child
        self.how = "a fresh sandbox per notebook" + (f" ({why})" if why else "")

    def start(self, run: Supervisor, channel: socket.socket) -> Started:
        floor = _floor(run)
        argv = sandbox.command(RUNNER, run.course_copy, run.job_dir, run.limits, run.uid, channel.fileno(),
                               gpu=run.job.get("gpu", False), threads=run.job.get("threads", 1))
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        return self._popen(run, argv, env, run.job_dir, channel,
                           functools.partial(sandbox.apply_limits, run.limits, floor))


class Forked(Seal):
    how = "forked from a pre-imported zygote"

    def __init__(self, zygote: Zygote) -> None:
        self.zygote = zygote

    def start(self, run: Supervisor, channel: socket.socket) -> Child:
        run.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)  # before the child can send
        with open(run.job_dir / "sandbox.log", "wb") as log:
            return self.zygote.fork(run.job.get("job_id", "job"), run.limits, channel, log.fileno())

    def attach(self, handle: Child, sock: socket.socket) -> None:
        """The runner's PID (from its first byte), and the runner into the run's CPU group
        before it runs a cell (what it starts later is in the group with it)."""
        handle.attach(sock)
        if self.cpu is not None and handle.pid is not None:
            try:
                self.cpu.add(handle.pid)
            except ProcessLookupError:
                pass  # it ended first (its log says why): the run ends as its process ended

    def memory_mb(self, handle: Child, run: Supervisor) -> float:
        return sandbox.tree_memory_mb(handle.memory_root)  # the zygote's pages with the child's

    def slack_mb(self, handle: Child) -> float:
        """The zygote's anonymous memory: a page of it shared with the child becomes two when either
        writes it (Python's reference counts do), which a fresh process would not pay for."""
        return self.zygote.anonymous_mb


class Contained(Seal):
    isolation = Isolation.CONTAINER
    how = "as the container's student user"
    syscall_filter = "where_possible"

    def start(self, run: Supervisor, channel: socket.socket) -> Started:
        user = container.ContainerUser(run.job["container_user"])
        folders = container.make_job_dir(run.job_dir, user, RUNNER.parent)
        argv, env = container.command(folders["runner"] / RUNNER.name, run.course_copy, folders, user,
                                      channel.fileno(), threads=run.job.get("threads", 1))
        return self._popen(run, argv, env, folders["home"], channel,
                           functools.partial(container.preexec, run.limits, _floor(run)))

    def memory_mb(self, handle: Started, run: Supervisor) -> float:
        return container.user_memory_mb(int(run.job["container_user"]["uid"]))  # a process that left the tree too

    def clean_up(self, run: Supervisor) -> None:
        """Kill every process of the student's user and remove what it left where every user
        may write (no PID namespace here). Whatever the student made, grading goes on: what
        could not be done is a problem for the instructor (``cleanup``), never the student's."""
        user = container.ContainerUser(run.job["container_user"])
        try:
            run.survivors = container.kill_user(user.uid)
            removal = container.remove_user_files(user.uid, user.gid)
            left = "" if removal.complete else removal.summary()
        except Exception as exc:  # a fault of the grader's own
            left = f"{type(exc).__name__}: {exc}"
        if run.survivors:
            left = f"processes {run.survivors} survived SIGKILL" + (f"; {left}" if left else "")
        if left:
            run.transcript.events.append(problem("cleanup", clean_text(f"what the notebook's code left could not "
                                                                       f"all be removed: {left}")[:2000]))


class Unsealed(Seal):
    isolation = Isolation.NONE
    how = "without a seal"
    syscall_filter = "off"

    def start(self, run: Supervisor, channel: socket.socket) -> Started:
        home = run.job_dir / "home"
        home.mkdir(parents=True, exist_ok=True)
        cwd = run.job_dir / "work"
        cwd.mkdir(parents=True, exist_ok=True)
        threads = str(run.job.get("threads", 1))
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "TMPDIR": str(run.job_dir),
               "LANG": "C.UTF-8", "PYTHONPATH": f"{run.course_copy}:{RUNNER.parent}", "PYTHONNOUSERSITE": "1",
               "PYTHONDONTWRITEBYTECODE": "1", "WORKBOOK_GRADING": "1", "NBGRADER_EXECUTION": "autograde",
               "MPLBACKEND": "Agg", "MPLCONFIGDIR": str(run.job_dir / "mpl"), "TQDM_DISABLE": "1",
               "OMP_NUM_THREADS": threads,
               "MKL_NUM_THREADS": threads, "OPENBLAS_NUM_THREADS": threads,
               "WORKBOOK_CHANNEL_FD": str(channel.fileno()), "CUDA_VISIBLE_DEVICES": ""}
        return self._popen(run, [sys.executable, "-s", str(RUNNER)], env, cwd, channel,
                           functools.partial(sandbox.apply_limits, run.limits, _floor(run)))


def seal_for(isolation: Isolation, zygote: Zygote | None, why_not_zygote: str = "") -> Seal:
    """The seal of a run with ``isolation`` (autograder/sealing/isolation.py), forked from
    ``zygote`` where there is one."""
    if isolation in _ONE_WAY:
        return _ONE_WAY[isolation]()
    return Forked(zygote) if zygote is not None else FreshSandbox(why_not_zygote)


_ONE_WAY: dict[Isolation, type[Seal]] = {Isolation.CONTAINER: Contained, Isolation.NONE: Unsealed}
