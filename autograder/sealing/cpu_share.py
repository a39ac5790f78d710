"""A CPU share per sealed run: the run's processes in a cgroup of their own, capped at its
``threads`` CPUs, however many processes or sessions the student's code starts.

Without it the kernel shares the CPU between *tasks* (and, with ``sched_autogroup``, between
sessions): a cell that starts fifty busy processes, each in a session of its own, takes
nearly all of a machine from the notebooks graded beside it, and from the grader too. With
it a run's processes together get at most ``threads`` CPUs (cgroup v2's ``cpu.max``, v1's
``cpu.cfs_quota_us``), and the kernel shares the rest fairly between the groups.

:func:`cpu_groups` finds where groups can be made: under the grader's own cgroup in the
cgroup v2 hierarchy where its ``cpu`` controller can be delegated to children, else in the
v1 ``cpu`` hierarchy; None, with the reason, where neither can be written (a grader that is
not root, a cgroup v2 whose grader's group holds other processes). The seal then refuses
``setsid``/``setpgid`` instead (autograder/inside/lockdown.py), so that the kernel's
per-session sharing keeps one run to one share. ``WORKBOOK_CPU_GROUPS=off`` turns the groups
off (where another tool manages the grader's cgroups).

Each run's group is made by :meth:`CpuGroups.make` and removed by :meth:`CpuGroup.close`,
which kills whatever of the run is still in it first: nothing of one run outlives it in its
group. Groups left by a grader that died are removed when the next one starts.
"""

from __future__ import annotations

import functools
import os
import secrets
import signal
import time
from pathlib import Path

__all__ = ["CpuGroups", "CpuGroup", "cpu_groups", "found", "PERIOD_US"]

PERIOD_US = 100_000  # the quota's period: 0.1 s
PREFIX = "workbook-run-"


class CpuGroup:
    """One run's cgroup: :meth:`add` a process (its later children follow it), :meth:`close`
    when the run is over."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def add(self, pid: int) -> None:
        """Move process ``pid`` (all its threads) into the group."""
        (self.path / "cgroup.procs").write_text(f"{pid}\n")

    def add_self(self) -> None:
        """Move the calling process into the group (for a ``preexec_fn``, before the sealed
        program starts: everything it starts is in the group from the first instruction)."""
        self.add(os.getpid())

    def pids(self) -> list[int]:
        try:
            return [int(line) for line in (self.path / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []

    def throttled(self) -> int:
        """How many periods the group was held to its quota (``cpu.stat``'s ``nr_throttled``)."""
        try:
            for line in (self.path / "cpu.stat").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "nr_throttled":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def close(self, wait: float = 5.0) -> list[int]:
        """Kill what is left in the group and remove it; the PIDs that were still there."""
        left = self.pids()
        self._kill()
        deadline = time.monotonic() + wait
        while True:
            try:
                self.path.rmdir()
                return left
            except FileNotFoundError:
                return left
            except OSError:
                if time.monotonic() >= deadline:
                    return left
                self._kill()
                time.sleep(0.02)

    def _kill(self) -> None:
        """SIGKILL to every process in the group: by the kernel where it can (cgroup v2's
        ``cgroup.kill``: no PID read here can be another's by then), else to each PID listed."""
        try:
            (self.path / "cgroup.kill").write_text("1\n")
            return
        except OSError:
            pass
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


class CpuGroups:
    """Where runs' groups are made: ``base``, a folder of a cgroup hierarchy with the ``cpu``
    controller (``version`` 1 or 2)."""

    def __init__(self, base: Path, version: int) -> None:
        self.base = base
        self.version = version

    def make(self, threads: int) -> CpuGroup:
        """A new group for one run, capped at ``threads`` CPUs. Its name is this grader's PID (for
        :meth:`sweep`) and a random token: a forked run sees its group's path in
        ``/proc/self/cgroup``, which names no student, notebook or count of runs."""
        name = f"{PREFIX}{os.getpid()}-{secrets.token_hex(8)}"
        path = self.base / name
        path.mkdir(mode=0o755)
        quota = max(1, int(threads)) * PERIOD_US
        try:
            if self.version == 2:
                (path / "cpu.max").write_text(f"{quota} {PERIOD_US}\n")
            else:
                (path / "cpu.cfs_period_us").write_text(f"{PERIOD_US}\n")
                (path / "cpu.cfs_quota_us").write_text(f"{quota}\n")
        except OSError:
            path.rmdir()
            raise
        return CpuGroup(path)

    def words(self) -> str:
        return f"a CPU share per run (cgroup v{self.version} {'cpu.max' if self.version == 2 else 'cpu.cfs_quota_us'})"

    def sweep(self) -> None:
        """Remove the groups of graders no longer running (empty ones only)."""
        for path in self.base.glob(PREFIX + "*"):
            owner = path.name[len(PREFIX):].split("-", 1)[0]
            if owner.isdigit() and not Path(f"/proc/{owner}").exists():
                try:
                    path.rmdir()
                except OSError:
                    pass


def found() -> tuple[CpuGroups | None, str]:
    """:func:`cpu_groups`, looked for once per process (and again if ``WORKBOOK_CPU_GROUPS``
    changes)."""
    return _found(os.environ.get("WORKBOOK_CPU_GROUPS", ""))


@functools.lru_cache(maxsize=4)
def _found(setting: str) -> tuple[CpuGroups | None, str]:
    return cpu_groups()


def cpu_groups() -> tuple[CpuGroups | None, str]:
    """Where this grader can make a CPU group per run, or None and why not (in words)."""
    if os.environ.get("WORKBOOK_CPU_GROUPS", "").lower() in ("off", "0", "no"):
        return None, "WORKBOOK_CPU_GROUPS=off"
    reasons = []
    for find in (_v2, _v1):
        groups, why = find()
        if groups is not None:
            groups.sweep()
            return groups, ""
        reasons.append(why)
    return None, "; ".join(r for r in reasons if r)


def _own_path(controller: str) -> str | None:
    """This process's cgroup in the hierarchy of ``controller`` ('' for v2's unified one)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3 and (parts[1] == controller if controller == "" else controller in parts[1].split(",")):
            return parts[2]
    return None


def _mounts(fs_type: str) -> list[tuple[Path, set[str]]]:
    """Mount points of ``fs_type`` with their super options."""
    out = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) >= 5 and len(tail) >= 3 and tail[0] == fs_type:
            out.append((Path(fields[4].replace("\\040", " ")), set(tail[2].split(","))))
    return out


def _writable(base: Path, version: int) -> tuple[CpuGroups | None, str]:
    """Whether a capped group can be made under ``base`` (one is made and removed to know)."""
    groups = CpuGroups(base, version)
    try:
        groups.make(1).close(wait=1.0)
    except OSError as exc:
        return None, f"cgroup v{version} at {base}: {exc.strerror or exc}"
    return groups, ""


def _v2() -> tuple[CpuGroups | None, str]:
    own = _own_path("")
    mounts = _mounts("cgroup2")
    if own is None or not mounts:
        return None, ""
    base = mounts[0][0] / own.lstrip("/")
    try:
        if "cpu" not in (base / "cgroup.controllers").read_text().split():
            return None, ""  # the cpu controller is in v1 (a hybrid system) or not delegated here
        if "cpu" not in (base / "cgroup.subtree_control").read_text().split():
            (base / "cgroup.subtree_control").write_text("+cpu\n")
    except OSError as exc:
        return None, (f"cgroup v2 at {base}: the cpu controller cannot be given to child groups "
                      f"({exc.strerror or exc}; run the grader in a cgroup of its own with the controller "
                      "delegated, e.g. systemd-run --scope -p Delegate=yes)")
    return _writable(base, 2)


def _v1() -> tuple[CpuGroups | None, str]:
    own = _own_path("cpu")
    mount = next((path for path, options in _mounts("cgroup") if "cpu" in options), None)
    if own is None or mount is None:
        return None, "no cgroup with the cpu controller is mounted"
    return _writable(mount / own.lstrip("/"), 1)
