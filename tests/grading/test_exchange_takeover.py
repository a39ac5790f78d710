"""A student who makes the course's folders in nbgrader's exchange before the hub is set up.

The exchange's root is world-writable (every student's server writes into it), so a student
account can make ``<exchange>/<course>/{inbound,outbound,feedback}`` first, open to all, with
an ``outbound/<assignment>/`` of their own. Then other students can hand in to a release that
never was, the squatter reads their hand-ins, and a collect would import from a folder the
squatter controls. Here the accounts are real (made with useradd, as tests/grading/test_hub.py
makes them): the squatter does all that, `workbook collect --exchange` and `workbook check`
refuse the exchange naming the squatter's folders, deploy/jupyterhub/setup_course.py takes
the exchange back (and repairs what an earlier set-up left), and then the grader releases,
a student hands in, the squatter sees nothing and collect imports the hand-in.

Needs root (it makes Unix accounts; skipped otherwise)."""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from autograder.cli import main
from autograder.pipeline.collect import collect_exchange
from autograder.pipeline.exchange import exchange_problems
from autograder.course import Course, CourseError
from hubtools import Accounts, Unreachable, accounts_env, can_act_as_others, runnable_python, shared_folder

REPO = Path(__file__).resolve().parents[2]
A = "03_self_attention"
COURSE_ID = "attention-workbook"

ACCOUNTS_PYTHON, WHY_NOT = runnable_python() if not can_act_as_others() else (None, can_act_as_others())
pytestmark = pytest.mark.skipif(ACCOUNTS_PYTHON is None, reason=WHY_NOT or "")
PYTHON = ""  # the accounts' environment (students_env)

SQUAT = f"""
import os, sys
course = os.path.join(sys.argv[1], {COURSE_ID!r})
for folder in (course, *(os.path.join(course, n) for n in ("inbound", "outbound", "feedback"))):
    os.mkdir(folder)
    os.chmod(folder, 0o777)
release = os.path.join(course, "outbound", {A!r})
os.mkdir(release)
os.chmod(release, 0o777)
with open(os.path.join(release, {A + ".ipynb"!r}), "w") as f:
    f.write(sys.stdin.read())
open(os.path.join(course, "planted.txt"), "w").write("mine")
"""


def _setup_course():
    """deploy/jupyterhub/setup_course.py, as a module (it uses the standard library only)."""
    spec = importlib.util.spec_from_file_location("setup_course", REPO / "deploy" / "jupyterhub" / "setup_course.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module", autouse=True)
def students_env():
    """The accounts' environment in a folder they can enter (hubtools.accounts_env)."""
    global PYTHON
    try:
        with accounts_env("workbook-takeover-env-", ACCOUNTS_PYTHON) as PYTHON:
            yield PYTHON
    except Unreachable as exc:
        pytest.skip(str(exc))
    finally:
        PYTHON = ""


def _run_as(account: str, args: list[str], cwd: Path, stdin: str = "") -> subprocess.CompletedProcess:
    entry = pwd.getpwnam(account)
    return subprocess.run([PYTHON, *args], cwd=cwd, user=entry.pw_uid, group=entry.pw_gid, extra_groups=[],
                          env={"PATH": f"{Path(PYTHON).parent}:/usr/bin:/bin", "HOME": str(cwd), "LANG": "C.UTF-8",
                               "WORKBOOK_EXCHANGE": os.environ["WORKBOOK_EXCHANGE"]},
                          input=stdin, capture_output=True, text=True, timeout=300)


def _nbgrader(account: str, cwd: Path, exchange: Path, *args: str) -> subprocess.CompletedProcess:
    return _run_as(account, ["-m", "nbgrader", *args, "--course", COURSE_ID, f"--Exchange.root={exchange}"], cwd)


def _mode(path: Path) -> tuple[str, int]:
    info = os.lstat(path)
    return pwd.getpwuid(info.st_uid).pw_name, stat.S_IMODE(info.st_mode)


def _check(course: Course, capsys) -> tuple[int, str]:
    """`workbook check`: its exit status and what it printed."""
    capsys.readouterr()
    status = main(["--course", str(course.root), "check"])
    return status, capsys.readouterr().out


@pytest.fixture
def hub(monkeypatch):
    """An exchange's root as a hub has it (root's, 1777), the course's checkout of the grader's
    account with notebook 03 released, and three accounts: the grader, a squatter, a student."""
    try:
        top = shared_folder("workbook-takeover-")
    except Unreachable as exc:
        pytest.skip(str(exc))
    accounts = Accounts(top / "home")
    try:
        (top / "home").mkdir(mode=0o755)
        exchange = top / "exchange"
        exchange.mkdir()
        exchange.chmod(0o1777)
        monkeypatch.setenv("WORKBOOK_EXCHANGE", str(exchange))
        grader, squatter, student = (accounts.add(n) for n in ("grader", "squatter", "alice"))
        root = accounts.home(grader) / "course"
        (root / "notebooks" / A).mkdir(parents=True)
        shutil.copy(REPO / "nbgrader_config.py", root / "nbgrader_config.py")
        shutil.copy(REPO / "notebooks" / A / f"{A}.ipynb", root / "notebooks" / A / f"{A}.ipynb")
        home = accounts.home(student)
        (home / A).mkdir()
        shutil.copy(REPO / "notebooks" / A / f"{A}.ipynb", home / A / f"{A}.ipynb")
        for account, folder in ((grader, root), (student, home / A)):
            entry = pwd.getpwnam(account)
            for path in [folder, *folder.rglob("*")]:
                os.chown(path, entry.pw_uid, entry.pw_gid)
        yield {"course": Course(root), "exchange": exchange, "grader": grader, "squatter": squatter,
               "student": student, "home": home}
    finally:
        accounts.remove()
        shutil.rmtree(top, ignore_errors=True)


def test_a_squatted_exchange_is_refused_then_taken_back_by_set_up(hub, capsys):
    course, exchange, ex = hub["course"], hub["exchange"], hub["exchange"] / COURSE_ID
    fake = (REPO / "notebooks" / A / f"{A}.ipynb").read_text()
    squat = _run_as(hub["squatter"], ["-c", SQUAT, str(exchange)], hub["home"].parent, stdin=fake)
    assert squat.returncode == 0, squat.stderr

    # the attack works on an exchange nobody took back: the student hands in to the squatter's
    # "release", and the squatter lists the hand-in
    handed = _nbgrader(hub["student"], hub["home"], exchange, "submit", A)
    assert handed.returncode == 0, handed.stderr
    listed = _run_as(hub["squatter"], ["-c", f"import os; print(os.listdir({str(ex / 'inbound')!r}))"], exchange)
    assert hub["student"] in listed.stdout

    # the grader's tools refuse it, naming the squatter's folder
    with pytest.raises(CourseError, match="nothing was imported") as refused:
        collect_exchange(course, A)
    assert f"{ex} belongs to the account {hub['squatter']}, not to the grader" in str(refused.value)
    status, printed = _check(course, capsys)
    assert status == 2 and "exchange: NOT READY" in printed, printed
    assert f"{ex} belongs to the account {hub['squatter']}" in printed
    # what the earlier set-up left (it took over the course's folder only): still refused, by the sub-folders
    os.chown(ex, pwd.getpwnam(hub["grader"]).pw_uid, -1)
    os.chmod(ex, 0o755)
    problems = "\n".join(exchange_problems(course))
    for name in ("inbound", "outbound", "feedback"):
        assert f"{ex / name} belongs to the account {hub['squatter']}" in problems, problems

    # set-up takes it back: every folder the grader's, nbgrader's modes, nothing of the squatter's left
    setup = _setup_course()
    grader = pwd.getpwnam(hub["grader"])
    lines = setup.exchange(exchange, grader)
    assert _mode(exchange) == ("root", 0o1777)
    assert _mode(ex) == (hub["grader"], 0o755)
    assert [_mode(ex / n) for n in ("outbound", "inbound", "feedback")] == \
        [(hub["grader"], 0o755), (hub["grader"], 0o3733), (hub["grader"], 0o711)]
    assert sorted(os.listdir(ex)) == ["feedback", "inbound", "outbound"]
    assert os.listdir(ex / "outbound") == [] and os.listdir(ex / "inbound") == []
    [aside] = [p for p in exchange.iterdir() if p.name.startswith(f".{COURSE_ID}-set-aside-")]
    assert _mode(aside) == ("root", 0o700) and len(list(aside.iterdir())) == 4  # its 3 folders, its file
    assert sum("exchange: set aside" in line for line in lines) == 4, lines
    assert exchange_problems(course) == []
    # once more: nothing to do, nothing set aside
    again = setup.exchange(exchange, grader)
    assert not [line for line in again if "set aside" in line or "made" in line], again

    # the grader releases, the student hands in, the squatter sees nothing of it, collect imports it
    released = _nbgrader(hub["grader"], course.root, exchange, "release_assignment", A, "--force")
    assert released.returncode == 0, released.stderr
    handed = _nbgrader(hub["student"], hub["home"], exchange, "submit", A)
    assert handed.returncode == 0, handed.stderr
    for folder in (ex / "inbound", aside):
        peek = _run_as(hub["squatter"], ["-c", f"import os; os.listdir({str(folder)!r})"], exchange)
        assert peek.returncode != 0 and "PermissionError" in peek.stderr, (folder, peek.stdout)
    plant = _run_as(hub["squatter"], ["-c", f"open({str(ex / 'outbound' / A / 'x.py')!r}, 'w')"], exchange)
    assert plant.returncode != 0 and "PermissionError" in plant.stderr
    result = collect_exchange(course, A)
    assert result.imported == {hub["student"]: [A]} and not result.errors, (result.errors, result.rejected)
    status, printed = _check(course, capsys)
    assert "exchange: ready" in printed and "exchange: NOT READY" not in printed, printed
