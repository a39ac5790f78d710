"""Unix accounts and Python environments for tests that act as several people on one machine
(a hub's students, its instructor, the grader's account).

- :func:`runnable_python`: a Python 3.11 that an unprivileged account can run (the virtualenv's
  own may sit under a folder only its owner can enter, e.g. pyenv in ``/root``);
- :func:`make_env`: a virtual environment of that Python holding this virtualenv's pinned
  packages (hard links: seconds, no download), with or without the course's own code
  (``course_lib`` and ``autograder`` from this checkout);
- :class:`Accounts`: Unix accounts made with ``useradd`` (a password each, a private home),
  removed with ``userdel`` afterwards.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import subprocess
import sys
import sysconfig
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


def runnable_python() -> tuple[str | None, str]:
    """(a Python 3.11 every account can run, '') or (None, why not)."""
    candidates = []
    base = getattr(sys, "_base_executable", None)
    for path in (base, sys.executable, "/usr/bin/python3.11", shutil.which("python3.11")):
        if path and os.path.realpath(path) not in candidates:
            candidates.append(os.path.realpath(path))
    nobody = pwd.getpwnam("nobody")
    for path in candidates:
        try:
            done = subprocess.run([path, "-c", "import sys; print(sys.version_info[:2] == (3, 11))"],
                                  user=nobody.pw_uid, group=nobody.pw_gid, extra_groups=[], capture_output=True,
                                  text=True, timeout=60, cwd="/")
        except OSError:
            continue
        if done.returncode == 0 and done.stdout.strip() == "True":
            return path, ""
    return None, f"no Python 3.11 that an unprivileged account can run (tried {', '.join(candidates)})"


def _link_tree(src: Path, dest: Path, skip=lambda name: False) -> None:
    """Hard-link every file of ``src`` into ``dest`` (folders made anew, so that a file written
    into ``dest`` later never touches ``src``)."""
    for top, dirs, files in os.walk(src):
        rel = Path(top).relative_to(src)
        if rel.parts and skip(rel.parts[0]):
            dirs[:] = []
            continue
        dirs[:] = [d for d in dirs if not (not rel.parts and skip(d)) and d != "__pycache__"]
        (dest / rel).mkdir(parents=True, exist_ok=True)
        for name in files:
            if not rel.parts and skip(name):
                continue
            target = dest / rel / name
            if not target.exists():
                os.link(Path(top) / name, target)


def make_env(dest: Path, python: str, course_code: bool) -> Path:
    """A virtual environment at ``dest`` made by ``python``, with this virtualenv's packages and
    Jupyter data and configuration; with ``course_code`` also the course's own code (as the
    grader's checkout has it), without it nothing of the course (a student's environment
    installs the student edition into it). Returns its python."""
    subprocess.run([python, "-m", "venv", "--without-pip", str(dest)], check=True, timeout=120)
    site = dest / SITE_REL
    _link_tree(SITE, site, skip=lambda name: not course_code and name.startswith(EDITABLE))
    for part in ("share/jupyter", "etc/jupyter"):
        if (VENV / part).is_dir():
            _link_tree(VENV / part, dest / part)
    return dest / "bin" / "python"


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
