"""Real servers for tests and benchmarks, started on localhost and always stopped.

- :class:`DaskCluster`: a Dask scheduler and workers started as an instructor would
  (``workbook scheduler``, ``workbook worker``: Dask's with the grading settings) from this
  virtualenv's ``bin``, each in its own process group (so that one can be killed whole).
- :class:`PostgresServer`: a PostgreSQL server (Debian's ``postgresql`` package,
  ``make postgres``) in a temporary folder, run by an unprivileged user when the tests
  run as root (``initdb`` refuses root); :func:`postgres_bin` says where it is, or why not.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, proc: subprocess.Popen, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{what} did not listen on port {port} within {timeout:.0f} s")


def _stop(proc: subprocess.Popen) -> None:
    """Kill a process and everything in its process group."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(5)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(10)


class DaskCluster:
    """A scheduler on a free localhost port and named workers (one thread, no nanny: a
    killed worker stays dead). Use as a context manager; ``stop()`` ends everything."""

    def __init__(self, cwd: Path, log_dir: Path) -> None:
        self.cwd = cwd
        self.log_dir = log_dir
        self.port = free_port()
        self.address = f"tcp://127.0.0.1:{self.port}"
        self.scheduler: subprocess.Popen | None = None
        self.workers: dict[str, subprocess.Popen] = {}

    def _popen(self, args: list[str], name: str, env: dict[str, str] | None = None,
               cwd: Path | None = None) -> subprocess.Popen:
        log = open(self.log_dir / f"{name}.log", "wb")
        environment = dict(os.environ, **(env or {}))
        environment["PATH"] = os.pathsep.join([str(BIN), environment.get("PATH", "")])
        try:
            return subprocess.Popen([str(BIN / "workbook"), *args], cwd=cwd or self.cwd, env=environment, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            log.close()

    def __enter__(self) -> "DaskCluster":
        try:
            self.scheduler = self._popen(["scheduler", "--host", "127.0.0.1", "--port", str(self.port),
                                          "--dashboard-address", ":0", "--no-show"], "scheduler")
            _wait_for_port(self.port, self.scheduler, "dask scheduler")
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start_worker(self, name: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
        """Start ``dask worker`` named ``name`` and wait until the scheduler knows it."""
        args = ["worker", self.address, "--name", name, "--nthreads", "1", "--no-nanny",
                "--no-dashboard", "--host", "127.0.0.1"]
        proc = self._popen(args, f"worker-{name}", env, cwd)
        self.workers[name] = proc
        deadline = time.monotonic() + 120
        while name not in self.worker_names():
            if proc.poll() is not None:
                raise RuntimeError(f"dask worker {name} exited with code {proc.returncode}: "
                                   + (self.log_dir / f"worker-{name}.log").read_text()[-2000:])
            if time.monotonic() > deadline:
                raise RuntimeError(f"dask worker {name} did not join the scheduler")
            time.sleep(0.3)

    def worker_names(self) -> set[str]:
        with self.client() as client:
            return {str(w["name"]) for w in client.scheduler_info()["workers"].values()}

    def client(self):
        from distributed import Client
        return Client(self.address, timeout=30, set_as_default=False)

    def kill_worker(self, name: str) -> None:
        """SIGKILL a worker (and whatever it started in its process group)."""
        proc = self.workers.pop(name)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def stop(self) -> None:
        for proc in self.workers.values():
            _stop(proc)
        self.workers.clear()
        if self.scheduler is not None:
            _stop(self.scheduler)
            self.scheduler = None


# ---------------------------------------------------------------------------
# PostgreSQL
# ---------------------------------------------------------------------------

POSTGRES_DIRS = sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)


def postgres_bin() -> tuple[Path | None, str]:
    """The folder of ``initdb`` and ``pg_ctl`` (newest installed version), or (None, why not)."""
    for folder in POSTGRES_DIRS:
        if (folder / "initdb").is_file() and (folder / "pg_ctl").is_file():
            return folder, ""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).resolve().parent, ""
    return None, "no PostgreSQL server installed (make postgres, or: sudo apt-get install postgresql)"


class PostgresServer:
    """A throw-away PostgreSQL server on a free localhost port, trusting local
    connections, with one database; ``url`` is its SQLAlchemy URL."""

    USER = "workbook"

    def __init__(self, bin_dir: Path, database: str = "gradebook") -> None:
        self.bin = bin_dir
        self.database = database
        self.port = free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="workbook-postgres-"))
        self.data = self.folder / "data"
        self.url = f"postgresql://{self.USER}@127.0.0.1:{self.port}/{database}"
        self.owner = "nobody" if os.geteuid() == 0 else None  # initdb refuses root

    def _run(self, *args: str) -> subprocess.CompletedProcess:
        cmd = [str(a) for a in args]
        user = {}
        if self.owner:
            entry = pwd.getpwnam(self.owner)
            user = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=self.folder,
                              env={"PATH": os.environ.get("PATH", ""), "LC_ALL": "C.UTF-8"}, **user)

    def __enter__(self) -> "PostgresServer":
        try:
            if self.owner:
                os.chown(self.folder, pwd.getpwnam(self.owner).pw_uid, pwd.getpwnam(self.owner).pw_gid)
            done = self._run(self.bin / "initdb", "-D", self.data, "-U", self.USER, "--auth=trust",
                             "--encoding=UTF8", "--no-sync")
            if done.returncode:
                raise RuntimeError(f"initdb failed: {done.stderr.strip()[-1000:]}")
            done = self._run(self.bin / "pg_ctl", "-D", self.data, "-l", self.folder / "server.log", "-w",
                             "-t", "60", "-o", f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 "
                                               "-c fsync=off -c max_connections=100", "start")
            if done.returncode:
                log = (self.folder / "server.log")
                raise RuntimeError(f"pg_ctl start failed: {done.stderr.strip()[-500:]} "
                                   f"{log.read_text()[-1000:] if log.exists() else ''}")
            import psycopg
            with psycopg.connect(f"host=127.0.0.1 port={self.port} user={self.USER} dbname=postgres",
                                 autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{self.database}"')
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._run(self.bin / "pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.folder, ignore_errors=True)
