"""Set a machine up for the course hub (run as root; idempotent; the standard library only).

    sudo python3 deploy/jupyterhub/setup_course.py --course /home/grader-attention-workbook/attention-workbook \\
        --grader grader-attention-workbook --student-env /opt/attention-workbook/student

1. nbgrader's exchange: its root world-writable and sticky (nobody can rename or remove what
   another account made there), the course's folder in it made now and owned by the grader
   (so that no student can claim the course's name before the first release);
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


def exchange(root: Path, grader: pwd.struct_passwd) -> list[str]:
    if not root.exists():
        root.mkdir(parents=True)
    info = root.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0:
        raise SystemExit(f"{root} must be a folder owned by root (it is shared by every account)")
    root.chmod(0o1777)
    course = root / COURSE_ID
    if not course.exists():
        course.mkdir()
    os.chown(course, grader.pw_uid, grader.pw_gid)
    course.chmod(0o755)
    return [f"exchange: {root} (1777, root), {course} (755, {grader.pw_name})"]


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
