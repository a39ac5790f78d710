"""Unix accounts and Python environments for tests that act as several people on one machine
(a hub's students, its instructor, the grader's account).

- :func:`runnable_python`: a Python of the virtualenv's version that an unprivileged account can
  run (the virtualenv's own may sit under a folder only its owner can enter, e.g. pyenv in ``/root``);
- :func:`make_env`: a virtual environment of that Python holding this virtualenv's pinned
  packages (hard links: seconds, no download), with or without the course's own code
  (``course_lib`` and ``autograder`` from this checkout), readable by every account wherever
  the checkout lies (a clone in a folder only its owner may enter, made under umask 077);
- :func:`shared_folder`: a new folder every account can enter, for what they need to reach;
- :class:`Accounts`: Unix accounts made with ``useradd`` (a password each, a private home),
  removed with ``userdel`` afterwards.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import secrets
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

VENV = Path(sys.prefix)
SITE = Path(sysconfig.get_paths()["purelib"])
SITE_REL = SITE.relative_to(VENV)
EDITABLE = ("__editable__", "attention_workbook-")  # the course's own code, installed from this checkout


def can_act_as_others() -> str:
    """Why tests cannot act as other Unix accounts here ('' when they can)."""
    if os.geteuid() != 0:
        return "making and acting as Unix accounts needs root"
    missing = [tool for tool in ("useradd", "userdel", "chpasswd") if shutil.which(tool) is None]
    return f"{', '.join(missing)} not found" if missing else ""


VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"  # the environments below hold this Python's packages


def runnable_python() -> tuple[str | None, str]:
    """(a Python of this virtualenv's version that every account can run, '') or (None, why not):
    the packages :func:`make_env` links in are built for this version only."""
    candidates = []
    base = getattr(sys, "_base_executable", None)
    for path in (base, sys.executable, f"/usr/bin/python{VERSION}", shutil.which(f"python{VERSION}")):
        if path and os.path.realpath(path) not in candidates:
            candidates.append(os.path.realpath(path))
    nobody = pwd.getpwnam("nobody")
    for path in candidates:
        try:
            done = subprocess.run([path, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                  user=nobody.pw_uid, group=nobody.pw_gid, extra_groups=[], capture_output=True,
                                  text=True, timeout=60, cwd="/")
        except OSError:
            continue
        if done.returncode == 0 and done.stdout.strip() == VERSION:
            return path, ""
    return None, (f"no Python {VERSION} (the virtualenv's) that an unprivileged account can run here "
                  f"(tried {', '.join(candidates)})")


def shared_folder(prefix: str) -> Path:
    """A new folder (mode 755) in the system's temporary folder, for what other accounts must
    reach. Raises :class:`Unreachable` where that lies under a folder they cannot enter."""
    top = Path(tempfile.mkdtemp(prefix=prefix))
    top.chmod(0o755)
    closed = [str(p) for p in [top, *top.parents] if not os.stat(p).st_mode & 0o001]
    if closed:
        shutil.rmtree(top, ignore_errors=True)
        raise Unreachable(f"other accounts cannot enter {closed[-1]}, where the temporary folder "
                          f"{tempfile.gettempdir()} lies: set TMPDIR to a folder they can enter (TMPDIR=/tmp)")
    return top


class Unreachable(RuntimeError):
    """What other accounts need cannot be placed where they can reach it (the message says what to change)."""


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    """Create files with ``umask(mask)`` in the block (this process and what it starts)."""
    before = os.umask(mask)
    try:
        yield
    finally:
        os.umask(before)


def _readable_by_all(mode: int) -> bool:
    """Whether a file of ``mode`` can be read (and, where anyone may run it, run) by every account."""
    return bool(mode & 0o004) and (not mode & 0o111 or bool(mode & 0o001))


def _link_tree(src: Path, dest: Path, skip=lambda name: False) -> None:
    """Hard-link every file of ``src`` into ``dest`` (folders made anew, mode 755, so that a file
    written into ``dest`` later never touches ``src``); copy it where ``dest`` is on another file
    system, or where other accounts may not read it (a checkout made under umask 077), the copy
    readable by all."""
    for top, dirs, files in os.walk(src):
        rel = Path(top).relative_to(src)
        if rel.parts and skip(rel.parts[0]):
            dirs[:] = []
            continue
        dirs[:] = [d for d in dirs if not (not rel.parts and skip(d)) and d != "__pycache__"]
        (dest / rel).mkdir(parents=True, exist_ok=True)
        (dest / rel).chmod(0o755)
        for name in files:
            if not rel.parts and skip(name):
                continue
            source, target = Path(top) / name, dest / rel / name
            if target.exists():
                continue
            mode = os.lstat(source).st_mode
            if stat.S_ISLNK(mode) or _readable_by_all(mode):
                try:
                    os.link(source, target, follow_symlinks=False)
                    continue
                except OSError as exc:  # another file system (EXDEV; /tmp on tmpfs): a copy
                    if exc.errno not in (errno.EXDEV, errno.EPERM):
                        raise
            shutil.copy2(source, target, follow_symlinks=False)
            if not stat.S_ISLNK(mode):
                target.chmod(0o755 if mode & 0o111 else 0o644)


def make_env(dest: Path, python: str, course_code: bool) -> Path:
    """A virtual environment at ``dest`` made by ``python``, with this virtualenv's packages and
    Jupyter data and configuration; with ``course_code`` also the course's own code (as the
    grader's checkout has it), without it nothing of the course (a student's environment
    installs the student edition into it). Returns its python. Every account may read and
    run it (its folders 755, whatever this process's umask)."""
    with umask(0o022):
        return _make_env(dest, python, course_code)


def _make_env(dest: Path, python: str, course_code: bool) -> Path:
    subprocess.run([python, "-m", "venv", "--without-pip", str(dest)], check=True, timeout=120)
    site = dest / SITE_REL
    _link_tree(SITE, site, skip=lambda name: not course_code and name.startswith(EDITABLE))
    for part in ("share/jupyter", "etc/jupyter"):
        if (VENV / part).is_dir():
            _link_tree(VENV / part, dest / part)
    python_here = dest / "bin" / "python"
    for script in sorted((VENV / "bin").iterdir()):  # console scripts (jupyter, nbgrader, ...), on its own python
        target = dest / "bin" / script.name
        if target.exists() or script.is_symlink() or not script.is_file():
            continue
        with script.open("rb") as f:
            first = f.readline()
        if first.startswith(b"#!") and first[2:].strip() in (str(VENV / "bin" / n).encode()
                                                             for n in ("python", "python3", f"python{VERSION}")):
            if not course_code and script.name == "workbook":
                continue
            write_new(target, f"#!{python_here}\n" + script.read_text(encoding="utf-8").split("\n", 1)[1], 0o755)
    return python_here


@contextlib.contextmanager
def accounts_env(prefix: str, python: str) -> Iterator[str]:
    """Other accounts' virtual environment (this virtualenv's packages, nbgrader among them, not the
    course's code) in a new folder every account can enter, as a hub's is: this checkout may lie
    where only its owner may go (a clone in ``mktemp -d``, a home of mode 750). Yields its python;
    raises :class:`Unreachable` where no such folder can be made."""
    top = shared_folder(prefix)
    try:
        yield str(make_env(top / "env", python, course_code=False))
    finally:
        shutil.rmtree(top, ignore_errors=True)


def write_new(path: Path, text: str, mode: int = 0o644) -> None:
    """Write ``path`` as a new file (a hard-linked one is unlinked first, never written through)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        path.unlink()
    path.write_text(text, encoding="utf-8")
    path.chmod(mode)


class Accounts:
    """Unix accounts for one test run, named ``<prefix><name>`` (short, unique per run), each
    with a password and a private home; :meth:`remove` deletes them and their homes."""

    def __init__(self, home_root: Path) -> None:
        self.tag = secrets.token_hex(2)
        self.home_root = home_root
        self.made: list[str] = []
        self.passwords: dict[str, str] = {}

    def add(self, name: str) -> str:
        user = f"{name}-{self.tag}"
        home = self.home_root / user
        subprocess.run(["useradd", "--create-home", "--home-dir", str(home), "--shell", "/bin/bash",
                        "--user-group", user], check=True, capture_output=True, timeout=60)
        self.made.append(user)
        home.chmod(0o700)
        password = secrets.token_urlsafe(12)
        subprocess.run(["chpasswd"], input=f"{user}:{password}\n", text=True, check=True, capture_output=True,
                       timeout=60)
        self.passwords[user] = password
        return user

    def home(self, user: str) -> Path:
        return Path(pwd.getpwnam(user).pw_dir)

    def processes(self) -> list[int]:
        """The processes running as one of these accounts."""
        uids = set()
        for user in self.made:
            try:
                uids.add(pwd.getpwnam(user).pw_uid)
            except KeyError:
                pass
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if os.stat(f"/proc/{entry}").st_uid in uids:
                        found.append(int(entry))
                except OSError:
                    pass
        return found

    def remove(self) -> None:
        """Stop what still runs as these accounts (each process by its id), then delete them."""
        for pid in self.processes():
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        for user in reversed(self.made):
            subprocess.run(["userdel", "--remove", "--force", user], capture_output=True, timeout=60)
        self.made.clear()


# ---------------------------------------------------------------------------
# A hub on localhost, and clients that talk to it as a user does
# ---------------------------------------------------------------------------

class Hub:
    """JupyterHub started with ``config`` on free localhost ports (public, the hub's API, the
    proxy's API), in its own process group; ``url`` is its public address."""

    def __init__(self, config: Path, data: Path, env: dict[str, str], log: Path, extra: list[str] = ()) -> None:
        import socket

        def free() -> int:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                return s.getsockname()[1]

        self.port, hub_port, api_port = free(), free(), free()
        self.proxy_api = f"http://127.0.0.1:{api_port}"
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        data.mkdir(parents=True, exist_ok=True)
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "jupyterhub", "-f", str(config), f"--JupyterHub.bind_url={self.url}/",
                 f"--JupyterHub.hub_bind_url=http://127.0.0.1:{hub_port}",
                 f"--ConfigurableHTTPProxy.api_url={self.proxy_api}", *extra],
                cwd=data, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def wait(self, timeout: float = 120) -> None:
        import time

        import requests
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"the hub exited ({self.process.returncode}):\n{self.tail()}")
            try:
                if requests.get(f"{self.url}/hub/api/", timeout=5).status_code == 200:
                    return
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the hub did not answer within {timeout:.0f} s:\n{self.tail()}")
            time.sleep(0.5)

    def tail(self, chars: int = 6000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def stop(self) -> None:
        import signal
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)  # the hub stops the users' servers, then itself
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)


class HubUser:
    """One person using the hub over HTTP: signs in through the hub's REST API with their
    password (the hub's authenticator checks it), starts their server, and calls it."""

    def __init__(self, hub: Hub, name: str, password: str) -> None:
        import requests
        self.hub, self.name = hub, name
        response = requests.post(f"{hub.url}/hub/api/users/{name}/tokens", timeout=60,
                                 json={"auth": {"username": name, "password": password}, "note": "test",
                                       "expires_in": 3600})
        if response.status_code != 201:
            raise RuntimeError(f"{name} could not sign in ({response.status_code}): {response.text[:500]}")
        self.token = response.json()["token"]
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"token {self.token}"

    def get(self, path: str, **kw):
        return self.session.get(f"{self.hub.url}{path}", timeout=kw.pop("timeout", 120), **kw)

    def post(self, path: str, **kw):
        return self.session.post(f"{self.hub.url}{path}", timeout=kw.pop("timeout", 300), **kw)

    def put(self, path: str, **kw):
        return self.session.put(f"{self.hub.url}{path}", timeout=kw.pop("timeout", 120), **kw)

    def start_server(self, timeout: float = 240) -> None:
        import time
        response = self.post(f"/hub/api/users/{self.name}/server")
        if response.status_code not in (201, 202, 400):  # 400: already running
            raise RuntimeError(f"{self.name}'s server did not start: {response.status_code} {response.text[:500]}")
        deadline = time.monotonic() + timeout
        while True:
            model = self.get(f"/hub/api/users/{self.name}").json()
            server = (model.get("servers") or {}).get("")
            if server and server.get("ready"):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}'s server was not ready within {timeout:.0f} s:\n{self.hub.tail()}")
            time.sleep(1)

    def kernel(self, prefix: str, path: str = "") -> "Kernel":
        """A kernel on the server at ``prefix`` (``/user/<name>`` or ``/services/<service>``), its
        working folder the folder of ``path`` (a notebook's, relative to the server's root)."""
        response = self.post(f"{prefix}/api/sessions", json={"path": path or "scratch.ipynb", "type": "notebook",
                                                               "name": "", "kernel": {"name": "python3"}})
        if response.status_code not in (200, 201):
            raise RuntimeError(f"no kernel on {prefix}: {response.status_code} {response.text[:500]}")
        return Kernel(self, prefix, response.json()["kernel"]["id"])


class Kernel:
    """A Jupyter kernel driven over its websocket (through the hub's proxy), as JupyterLab does."""

    def __init__(self, user: HubUser, prefix: str, kernel_id: str) -> None:
        import uuid

        import websocket
        self.user, self.prefix, self.id = user, prefix, kernel_id
        self.session = uuid.uuid4().hex
        url = user.hub.url.replace("http://", "ws://") + f"{prefix}/api/kernels/{kernel_id}/channels" \
            f"?session_id={self.session}"
        self.ws = websocket.create_connection(url, header=[f"Authorization: token {user.token}"], timeout=600,
                                              suppress_origin=True)

    def execute(self, code: str, timeout: float = 600) -> list[dict]:
        """Run ``code``; return its outputs as notebook outputs (stream, display, result, error)."""
        import datetime as dt
        import json
        import time
        import uuid

        import nbformat
        msg_id = uuid.uuid4().hex
        self.ws.send(json.dumps({
            "header": {"msg_id": msg_id, "username": self.user.name, "session": self.session,
                       "msg_type": "execute_request", "version": "5.3", "date": dt.datetime.now(dt.timezone.utc).isoformat()},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                        "allow_stdin": False, "stop_on_error": True}}))
        outputs, idle, replied = [], False, False
        deadline = time.monotonic() + timeout
        while not (idle and replied):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the kernel did not finish within {timeout:.0f} s: {code[:200]}")
            raw = self.ws.recv()
            if not raw:
                raise ConnectionError(f"the kernel's connection closed while it ran: {code[:200]}")
            message = json.loads(raw)
            if message.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind = message["msg_type"]
            if message["channel"] == "shell" and kind == "execute_reply":
                replied = True
            elif kind == "status" and message["content"]["execution_state"] == "idle":
                idle = True
            elif kind in ("stream", "display_data", "execute_result", "error"):
                outputs.append(nbformat.v4.output_from_msg(message))
        return outputs

    def run(self, code: str, timeout: float = 600) -> str:
        """Run ``code``; return what it printed (an error raises, with its traceback)."""
        outputs = self.execute(code, timeout)
        errors = [o for o in outputs if o["output_type"] == "error"]
        if errors:
            raise RuntimeError(f"{errors[0]['ename']}: {errors[0]['evalue']}\n" + "\n".join(errors[0]["traceback"]))
        return "".join(o.get("text", "") for o in outputs if o["output_type"] == "stream")

    def close(self) -> None:
        try:
            self.ws.close()
        finally:
            self.user.session.delete(f"{self.user.hub.url}{self.prefix}/api/kernels/{self.id}", timeout=60)
