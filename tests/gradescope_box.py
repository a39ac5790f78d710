"""A Gradescope autograder run the way Gradescope runs it, in a folder of this machine.

:class:`AutograderBox` unpacks an autograder zip as ``<root>/source``, runs its
``setup.sh`` as root on a clean environment (a fresh virtual environment from this
machine's Python 3.11, pip's own configuration for the registries; no ``/autograder``
touched: ``WORKBOOK_AUTOGRADER_ROOT`` names the root), then grades submissions one at a
time as Gradescope does: ``<root>/submission`` and ``submission_metadata.json`` written,
``<root>/run_autograder`` run as root, ``<root>/results/results.json`` read back.

A run can be measured in a control group of its own (:class:`Limits`): the CPU share and
memory limit Gradescope gives a container, and the peak memory of everything the run
started. Used by tests/test_gradescope.py and benchmarks/gradescope_container.py.
"""

from __future__ import annotations

import json
import math
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from autograder.sealing import trees
from autograder.sealing.sandbox import process_tree



def _everyone_may_run(path: Path) -> bool:
    """Whether every user may run ``path`` (each folder above it passable by all)."""
    path = path.resolve()
    return path.is_file() and all(os.stat(p).st_mode & 0o001 for p in [path, *path.parents])


def python311() -> str | None:
    """A Python 3.11 of this machine that the students' user may run too (the system's, as on
    Gradescope once setup.sh installed it), or None: setup.sh then finds or installs one itself."""
    candidates = ["/usr/bin/python3.11", "/usr/local/bin/python3.11", shutil.which("python3.11") or ""]
    for candidate in candidates:
        if candidate and _everyone_may_run(Path(candidate)):
            proc = subprocess.run([candidate, "-c", "import sys, venv, ensurepip; print(sys.version_info[:2])"],
                                  capture_output=True, text=True)
            if proc.returncode == 0 and proc.stdout.strip() == "(3, 11)":
                return candidate
    return None


PYTHON311 = python311()


def strict_json(text: str):
    """JSON as Gradescope reads it: no NaN or Infinity."""
    def refuse(name):
        raise ValueError(f"{name} is not JSON")
    return json.loads(text, parse_constant=refuse)


@dataclass
class Limits:
    """A container's resources: CPUs (a quota), memory in MB (None: unlimited)."""

    cpus: float | None = 0.5
    memory_mb: int | None = None


@dataclass
class Measured:
    results: dict
    seconds: float
    peak_mb: float | None = None  # the control group's peak (page cache included)
    peak_rss_mb: float | None = None  # sampled peak of anonymous memory (what a limit cannot reclaim)
    oom_kills: int = 0
    peak_pss_mb: float = 0.0  # sampled peak of all the run's processes together (no control group needed)
    stdout: str = ""
    user_processes_after: list[int] = field(default_factory=list)


class _Group:
    """A cgroup (v1 memory and cpu controllers, or v2) for one run."""

    def __init__(self, name: str, limits: Limits) -> None:
        self.dirs: list[Path] = []
        self.v2 = not Path("/sys/fs/cgroup/memory").is_dir()
        own = {line.split(":", 2)[1]: line.split(":", 2)[2].strip() for line in Path("/proc/self/cgroup").read_text().splitlines()}
        if self.v2:
            base = Path("/sys/fs/cgroup") / own[""].lstrip("/")
            self.mem = self.cpu = base / name
            self.mem.mkdir()
            self.dirs = [self.mem]
            if limits.memory_mb:
                (self.mem / "memory.max").write_text(str(limits.memory_mb * 2**20))
            if limits.cpus:
                (self.cpu / "cpu.max").write_text(f"{int(limits.cpus * 100_000)} 100000")
        else:
            self.mem = Path("/sys/fs/cgroup/memory") / own.get("memory", "/").lstrip("/") / name
            self.cpu = Path("/sys/fs/cgroup/cpu") / own.get("cpu,cpuacct", own.get("cpu", "/")).lstrip("/") / name
            for d in (self.mem, self.cpu):
                d.mkdir()
                self.dirs.append(d)
            if limits.memory_mb:
                (self.mem / "memory.limit_in_bytes").write_text(str(limits.memory_mb * 2**20))
                try:
                    (self.mem / "memory.memsw.limit_in_bytes").write_text(str(limits.memory_mb * 2**20))
                except OSError:
                    pass
            if limits.cpus:
                (self.cpu / "cpu.cfs_period_us").write_text("100000")
                (self.cpu / "cpu.cfs_quota_us").write_text(str(int(limits.cpus * 100_000)))
        self.peak_rss = 0
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def join(self) -> None:
        """In the child, before it runs anything: enter the group."""
        for d in self.dirs:
            (d / "cgroup.procs").write_text(str(os.getpid()))

    def _anon(self) -> int:
        stat = dict(line.split() for line in (self.mem / "memory.stat").read_text().splitlines())
        return int(stat["anon"]) if self.v2 else int(stat.get("total_rss", stat.get("rss", 0)))

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            try:
                self.peak_rss = max(self.peak_rss, self._anon())
            except (OSError, KeyError, ValueError):
                pass

    def close(self) -> tuple[float, float, int]:
        self._stop.set()
        self._sampler.join()
        if self.v2:
            peak = int((self.mem / "memory.peak").read_text()) if (self.mem / "memory.peak").exists() else 0
            events = dict(line.split() for line in (self.mem / "memory.events").read_text().splitlines())
            kills = int(events.get("oom_kill", 0))
        else:
            peak = int((self.mem / "memory.max_usage_in_bytes").read_text())
            control = dict(line.split() for line in (self.mem / "memory.oom_control").read_text().splitlines())
            kills = int(control.get("oom_kill", 0))
        for d in self.dirs:
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)
        return peak / 2**20, self.peak_rss / 2**20, kills


class AutograderBox:
    """``<root>``, playing ``/autograder``, and the virtual environment ``setup.sh`` makes."""

    def __init__(self, zip_path: Path, user: str, venv: Path | None = None) -> None:
        # everyone may pass through the parent (the virtual environment must be readable by the
        # student's user, as /opt/workbook/venv is on Gradescope); the root is the autograder's
        self.base = Path(tempfile.mkdtemp(prefix="workbook-gradescope-"))
        self.base.chmod(0o755)
        self.root = self.base / "autograder"
        self.root.mkdir()
        self.venv = venv or self.base / "venv"
        self.user = user
        (self.root / "source").mkdir()
        with zipfile.ZipFile(zip_path) as zf:
            zf.extractall(self.root / "source")
            for info in zf.infolist():  # the modes the zip records (Gradescope keeps them)
                mode = info.external_attr >> 16
                if mode:
                    (self.root / "source" / info.filename).chmod(mode & 0o777)
        self.setup_output = ""
        self.created_user = False

    def env(self, **extra: str) -> dict[str, str]:
        """A clean environment: what a fresh container's root has, pip's configuration of this
        machine (its registries, its cache), and the box's paths."""
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "HOME": os.environ.get("HOME", "/root"),  # (pip's own configuration and cache: the registries)
               "LANG": "C.UTF-8", "WORKBOOK_AUTOGRADER_ROOT": str(self.root), "WORKBOOK_VENV": str(self.venv),
               "WORKBOOK_STUDENT_USER": self.user}
        env.update({k: v for k, v in os.environ.items() if k.startswith("PIP_")})
        env.update(extra)
        return env

    def setup(self, timeout: float = 1200) -> subprocess.CompletedProcess:
        """``setup.sh`` as Gradescope runs it (as root, from the source folder), with this
        machine's Python 3.11 where every user may run it (else setup.sh installs one, as on
        Gradescope) and pip's own configuration; the run_autograder copied to the root as
        Gradescope copies it."""
        existed = _user_exists(self.user)
        proc = subprocess.run(["bash", str(self.root / "source" / "setup.sh")], cwd=self.root / "source",
                              env=self.env(**({"WORKBOOK_PYTHON": PYTHON311} if PYTHON311 else {}),
                                           WORKBOOK_TORCH_INDEX=torch_index()),
                              capture_output=True, text=True, timeout=timeout)
        self.created_user = not existed and _user_exists(self.user)
        self.setup_output = proc.stdout + proc.stderr
        shutil.copy2(self.root / "source" / "run_autograder", self.root / "run_autograder")
        return proc

    def submit(self, files: dict[str, bytes], metadata: dict | None = None, limits: Limits | None = None,
               isolation: str = "container", timeout: float = 900) -> Measured:
        """Grade one submission (``files``: relative name -> bytes) as Gradescope does."""
        for name in ("submission", "results", "work"):
            removal = trees.remove_tree(self.root / name)  # (the work folder: whatever the last student made)
            assert removal.complete, removal.left
        (self.root / "results").mkdir()
        for rel, data in files.items():
            path = self.root / "submission" / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        (self.root / "submission").mkdir(exist_ok=True)
        (self.root / "submission_metadata.json").write_text(json.dumps(metadata or {}))
        group = _Group(f"workbook-gradescope-{os.getpid()}-{time.monotonic_ns()}", limits) if limits else None
        started = time.monotonic()
        with tempfile.TemporaryFile("w+") as out:
            proc = subprocess.Popen([str(self.root / "run_autograder")], cwd=self.root, stdout=out,
                                    stderr=subprocess.STDOUT, env=self.env(WORKBOOK_ISOLATION=isolation),
                                    preexec_fn=group.join if group else None, text=True)
            sampler = _PssSampler(proc.pid, self.user)
            try:
                proc.wait(timeout=timeout)
            finally:
                sampler.stop()
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            out.seek(0)
            stdout = out.read()
        seconds = time.monotonic() - started
        peak = rss = None
        kills = 0
        if group:
            peak, rss, kills = group.close()
        text = (self.root / "results" / "results.json").read_text(encoding="utf-8")
        return Measured(strict_json(text), seconds, peak_mb=peak, peak_rss_mb=rss, oom_kills=kills,
                        peak_pss_mb=sampler.peak / 1024, stdout=stdout, user_processes_after=user_processes(self.user))

    def close(self) -> None:
        if self.created_user:
            subprocess.run(["userdel", self.user], capture_output=True)
        trees.remove_tree(self.base)


def _pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


class _PssSampler:
    """The peak, over a run, of the proportional set sizes of every process it started
    (run_autograder's descendants) and every process of the students' user, summed: what
    the run needs in memory, measured without a control group (page cache left out)."""

    def __init__(self, pid: int, user: str) -> None:
        self.pid, self.user, self.peak = pid, user, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _tree(self) -> set[int]:
        return set(process_tree(self.pid)) | set(user_processes(self.user))

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.peak = max(self.peak, sum(_pss_kb(pid) for pid in self._tree()))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def torch_index() -> str:
    """Where setup.sh takes torch from, so that it installs the CPU build of this machine's torch
    version: pip's own configuration (empty) where a CPU wheel of that version lies in one of its
    ``find-links`` folders (whichever build this suite's own torch is: PyPI's CUDA build where the
    suite runs on Python 3.12+) or this torch has no local label, else PyTorch's CPU index (the
    default, as on Gradescope: a CUDA build does not fit a container's memory limit)."""
    import torch
    version = torch.__version__
    base = version.split("+")[0]
    proc = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True)
    folders = [os.environ.get("PIP_FIND_LINKS", "")]
    folders += [line.split("=", 1)[1].strip("'\"") for line in proc.stdout.splitlines() if "find-links=" in line]
    for folder in " ".join(folders).split():
        if Path(folder).is_dir() and any(Path(folder).glob(f"torch-{base}+cpu-*.whl")):
            return ""
    if "+" not in version:
        return ""
    return "https://download.pytorch.org/whl/cpu"


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def user_processes(name: str) -> list[int]:
    """Live processes (not zombies) of the user ``name``."""
    try:
        uid = pwd.getpwnam(name).pw_uid
    except KeyError:
        return []
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if int(fields["Uid"].split()[0]) == uid and not fields["State"].strip().startswith("Z"):
            out.append(int(entry))
    return out


def finite_numbers(value) -> bool:
    """Every number in ``value`` is finite."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(finite_numbers(v) for v in value.values())
    if isinstance(value, list):
        return all(finite_numbers(v) for v in value)
    return True
