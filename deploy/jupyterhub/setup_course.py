"""Set a machine up for the course hub (run as root; idempotent; the standard library only).

    sudo python3 deploy/jupyterhub/setup_course.py --course /home/grader-attention-workbook/attention-workbook \\
        --grader grader-attention-workbook --student-env /opt/attention-workbook/student

1. nbgrader's exchange: its root world-writable and sticky (nobody can rename or remove what
   another account made there), the course's folder and its outbound, inbound and feedback
   folders made now by set-up and owned by the grader with nbgrader's modes (so that no
   student can claim them before the first release); any of them a student made first, and
   anything there that is not the grader's, is set aside where only root may look and made
   anew (run set-up again to repair an exchange);
2. the student edition (`workbook student-edition`, run as the grader in the grader's
   checkout): the notebooks and course_lib without solutions, hidden tests or the autograder;
3. the students' environment: a virtual environment with the student edition installed
   (`pip install -c constraints.txt "EDITION[hub]"`: the pinned packages, JupyterHub's
   single-user server), or with ``--no-deps`` only the student edition reinstalled into an
   existing environment (after a course update; offline);
4. that environment's Jupyter configuration (deploy/jupyterhub/student/): nbgrader's
   Assignments tab on, Formgrader, Create Assignment, Course List and Validate off, no news
   fetched, the course id and the exchange in its nbgrader_config.py.

Then start the hub (jupyterhub_config.py) with WORKBOOK_HUB_COURSE, WORKBOOK_HUB_GRADER,
WORKBOOK_HUB_STUDENT_PYTHON and WORKBOOK_EXCHANGE as printed at the end.
"""

from __future__ import annotations

import argparse
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
COURSE_ID = "attention-workbook"


def _as(account: pwd.struct_passwd, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {"PATH": f"{Path(args[0]).parent}:/usr/local/bin:/usr/bin:/bin", "HOME": account.pw_dir,
           "USER": account.pw_name, "LANG": "C.UTF-8"}
    return subprocess.run(args, cwd=cwd, env=env, user=account.pw_uid, group=account.pw_gid, extra_groups=[],
                          capture_output=True, text=True, timeout=1800)


def _write_new(path: Path, data: bytes) -> None:
    """A fresh file (an existing one, perhaps a hard link, is replaced, never written through)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        path.unlink()
    path.write_bytes(data)
    path.chmod(0o644)


# the course's folders in nbgrader's exchange, with nbgrader's own modes (its release_assignment,
# submit and release_feedback make them so), inbound also sticky: a student can rename or remove
# only their own hand-ins there
EXCHANGE = (("outbound", 0o755), ("inbound", 0o3733), ("feedback", 0o711))
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _account(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


class _SetAside:
    """A folder only root may enter, beside the course's folder in the exchange, that takes what
    set-up did not make itself (kept, for the instructor to look at, never used)."""

    def __init__(self, root_fd: int, root: Path) -> None:
        self.root_fd, self.root, self.fd, self.name = root_fd, root, None, ""

    def take(self, parent_fd: int, name: str, where: Path, info: os.stat_result, lines: list[str]) -> None:
        if self.fd is None:
            self.name = f".{COURSE_ID}-set-aside-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
            os.mkdir(self.name, 0o700, dir_fd=self.root_fd)
            self.fd = os.open(self.name, _DIR, dir_fd=self.root_fd)
            os.fchown(self.fd, 0, 0)
            os.fchmod(self.fd, 0o700)
        target = f"{len(os.listdir(self.fd))}-{where.name}"
        try:
            os.rename(name, target, src_dir_fd=parent_fd, dst_dir_fd=self.fd)
        except OSError as exc:
            raise SystemExit(f"{where} is not the grader's ({_account(info.st_uid)}'s, mode "
                             f"{stat.S_IMODE(info.st_mode):04o}) and could not be set aside ({exc.strerror}): remove "
                             f"it (sudo rm -rf '{where}'), then run setup_course.py again") from None
        lines.append(f"exchange: set aside {where} ({'a folder' if stat.S_ISDIR(info.st_mode) else 'not a folder'} "
                     f"of {_account(info.st_uid)}'s, mode {stat.S_IMODE(info.st_mode):04o}: not made by set-up) into "
                     f"{self.root / self.name} (root's alone)")

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)


def _own_folder(parent_fd: int, name: str, where: Path, mode: int, grader: pwd.struct_passwd, aside: _SetAside,
                lines: list[str]) -> int:
    """``name`` in the folder open at ``parent_fd`` as a folder of the grader's with ``mode``,
    opened (never through a link): taken over when it is the grader's or root's, else set
    aside and made anew (a student may race to make it again in a folder everyone may write
    in: tried a few times, then refused with the fix)."""
    for _ in range(5):
        try:
            info = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
        except FileNotFoundError:
            try:
                os.mkdir(name, 0o700, dir_fd=parent_fd)
            except FileExistsError:
                continue
            lines.append(f"exchange: made {where}")
            info = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
        if stat.S_ISDIR(info.st_mode) and info.st_uid in (grader.pw_uid, 0):
            fd = os.open(name, _DIR, dir_fd=parent_fd)
            opened = os.fstat(fd)
            if (opened.st_dev, opened.st_ino) == (info.st_dev, info.st_ino):
                os.fchown(fd, grader.pw_uid, grader.pw_gid)
                os.fchmod(fd, mode)
                return fd
            os.close(fd)
            continue
        aside.take(parent_fd, name, where, info, lines)
    raise SystemExit(f"{where} keeps being made again by another account: stop the students' servers, then run "
                     "setup_course.py again")


def exchange(root: Path, grader: pwd.struct_passwd) -> list[str]:
    """nbgrader's exchange, the course's part of it made by set-up itself: its root root's,
    world-writable and sticky; ``<course>``, ``outbound``, ``inbound`` and ``feedback`` the
    grader's with nbgrader's modes. A folder of these that set-up did not make (a student's,
    made before set-up ran to read the hand-ins or to publish an assignment of their own; or
    not a folder) is set aside into a folder only root may enter, and made anew; so is anything
    in ``<course>``, ``outbound`` and ``feedback`` that is not the grader's (the students' own
    hand-ins in ``inbound`` stay: `workbook collect --exchange` checks each one's owner).
    Running it again repairs what an earlier run left."""
    if not root.exists():
        root.mkdir(parents=True)
    info = root.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0:
        raise SystemExit(f"{root} must be a folder owned by root (it is shared by every account)")
    root.chmod(0o1777)
    lines: list[str] = []
    root_fd = os.open(root, _DIR)
    aside = _SetAside(root_fd, root)
    try:
        course_fd = _own_folder(root_fd, COURSE_ID, root / COURSE_ID, 0o755, grader, aside, lines)
        try:
            for name in os.listdir(course_fd):  # the course's folder holds nbgrader's three folders
                info = os.stat(name, dir_fd=course_fd, follow_symlinks=False)
                if name not in dict(EXCHANGE) and info.st_uid != grader.pw_uid:
                    aside.take(course_fd, name, root / COURSE_ID / name, info, lines)
            for name, mode in EXCHANGE:
                where = root / COURSE_ID / name
                fd = _own_folder(course_fd, name, where, mode, grader, aside, lines)
                try:
                    if name == "inbound":
                        continue
                    for entry in os.listdir(fd):  # releases and feedback pages: the grader's alone
                        info = os.stat(entry, dir_fd=fd, follow_symlinks=False)
                        if info.st_uid not in (grader.pw_uid, 0):
                            aside.take(fd, entry, where / entry, info, lines)
                        elif stat.S_ISDIR(info.st_mode) and stat.S_IMODE(info.st_mode) & 0o022:
                            entry_fd = os.open(entry, _DIR, dir_fd=fd)
                            os.fchmod(entry_fd, stat.S_IMODE(info.st_mode) & ~0o022)
                            os.close(entry_fd)
                finally:
                    os.close(fd)
        finally:
            os.close(course_fd)
    finally:
        aside.close()
        os.close(root_fd)
    modes = ", ".join(f"{name} {mode:04o}" for name, mode in EXCHANGE)
    return lines + [f"exchange: {root} (1777, root), {root / COURSE_ID} (0755, {grader.pw_name}; {modes})"]


def student_edition(course: Path, grader: pwd.struct_passwd, python: Path) -> Path:
    out = Path(tempfile.mkdtemp(prefix="attention-workbook-edition-"))
    os.chown(out, grader.pw_uid, grader.pw_gid)
    done = _as(grader, [str(python), "-m", "autograder.cli", "--course", str(course), "student-edition",
                        str(out / "edition")], course)
    if done.returncode != 0:
        raise SystemExit(f"workbook student-edition failed:\n{done.stdout}{done.stderr}")
    return out / "edition"


def student_env(env: Path, edition: Path, base_python: str, no_deps: bool, with_hub: bool) -> list[str]:
    python = env / "bin" / "python"
    if not python.exists():
        if no_deps:
            raise SystemExit(f"--no-deps reinstalls the student edition into an environment, and {env} has none")
        subprocess.run([base_python, "-m", "venv", str(env)], check=True, timeout=600)
    target = f"{edition}[hub]" if with_hub else str(edition)
    if no_deps:
        args = ["install", "--quiet", "--no-deps", "--no-build-isolation", "--force-reinstall", str(edition)]
    else:
        args = ["install", "--quiet", "-c", str(edition / "constraints.txt"), target]
    done = subprocess.run([str(python), "-m", "pip", *args], capture_output=True, text=True, timeout=3600,
                          env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    if done.returncode != 0:
        raise SystemExit(f"pip {' '.join(args)} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    config = env / "etc" / "jupyter"
    for rel in ("jupyter_server_config.json", "labconfig/page_config.json", "nbgrader_config.py"):
        _write_new(config / rel, (HERE / "student" / rel).read_bytes())
    check = subprocess.run([str(python), "-c", "import course_lib, nbgrader, sys; print(course_lib.__file__)\n"
                                               "try:\n    import autograder\nexcept ImportError:\n    sys.exit(0)\n"
                                               "sys.exit('the autograder is importable in the students environment')"],
                           capture_output=True, text=True, timeout=300, cwd="/")
    if check.returncode != 0:
        raise SystemExit(f"the students' environment does not work: {check.stderr[-2000:]}")
    return [f"students' environment: {env} (course_lib from the student edition: {check.stdout.strip()})",
            f"its Jupyter configuration: {config}"]


def open_homes(course: Path) -> list[str]:
    """The roster's accounts (<course>/roster.txt, read as course.py reads it) whose home other
    accounts can enter: Debian and Ubuntu make homes 0755 or 0750, so a student could read
    another's notebooks there."""
    roster = course / "roster.txt"
    if not roster.is_file():
        return []
    ids = [line.split(",")[0].strip() for line in roster.read_text(encoding="utf-8").splitlines()]
    found = []
    for name in ids:
        if not name or name.startswith("#") or name.lower() in ("id", "student_id", "student"):
            continue
        try:
            home = Path(pwd.getpwnam(name).pw_dir)
            if home.stat().st_mode & 0o077:
                found.append(f"{home} ({name})")
        except (KeyError, OSError):
            continue
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--course", required=True, type=Path, help="the grader's checkout of the course")
    parser.add_argument("--grader", required=True, help="the grader's Unix account (owns the checkout)")
    parser.add_argument("--student-env", required=True, type=Path, help="the students' environment (a new folder, or "
                                                                         "an existing one with --no-deps)")
    parser.add_argument("--exchange", type=Path, default=Path(os.environ.get("WORKBOOK_EXCHANGE",
                                                                           "/srv/nbgrader/exchange")))
    parser.add_argument("--python", default=shutil.which("python3.11") or sys.executable,
                        help="the Python 3.11 that makes the students' environment")
    parser.add_argument("--grader-python", type=Path, help="the checkout's Python (default <course>/.venv/bin/python)")
    parser.add_argument("--no-deps", action="store_true", help="only reinstall the student edition (offline)")
    parser.add_argument("--without-hub", action="store_true",
                        help="leave JupyterHub out of the students' environment (The Littlest JupyterHub's user "
                             "environment has its own)")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        parser.error("run as root (it makes the exchange and installs the students' environment)")
    try:
        grader = pwd.getpwnam(args.grader)
    except KeyError:
        parser.error(f"no account {args.grader} (sudo useradd --create-home {args.grader})")
    course = args.course.resolve()
    if not (course / "nbgrader_config.py").is_file():
        parser.error(f"{course} is not the course (no nbgrader_config.py)")
    grader_python = args.grader_python or course / ".venv" / "bin" / "python"
    if not grader_python.exists():
        parser.error(f"{grader_python} does not exist: run `make setup` in {course} as {args.grader}")
    lines = exchange(args.exchange, grader)
    edition = student_edition(course, grader, grader_python)
    try:
        lines += student_env(args.student_env, edition, args.python, args.no_deps, not args.without_hub)
    finally:
        shutil.rmtree(edition.parent, ignore_errors=True)
    print("\n".join(lines))
    homes = open_homes(course)
    if homes:
        print(f"\nwarning: other accounts can enter these students' homes (run chmod 700 on each; for new accounts "
              f"set HOME_MODE 0700 in /etc/login.defs): {', '.join(homes)}")
    print("\nstart the hub with:\n"
          f"  WORKBOOK_HUB_COURSE={course} WORKBOOK_HUB_GRADER={args.grader} "
          f"WORKBOOK_HUB_STUDENT_PYTHON={args.student_env / 'bin' / 'python'} WORKBOOK_EXCHANGE={args.exchange} "
          "WORKBOOK_HUB_INSTRUCTORS=<names> jupyterhub -f deploy/jupyterhub/jupyterhub_config.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
