"""`workbook collect --exchange`: submissions handed in through nbgrader's exchange (a hub's
Assignments tab runs ``nbgrader submit`` as the student's Unix account) are imported with
every rule of the intake, the account that wrote them checked against the id in their
folder's name, and dated by the file system, never by the name the student's process wrote.

The students here are real accounts of the system (``daemon``, ``bin``) running nbgrader's
own submit, from a virtual environment made for them in a folder they can reach (this
checkout's own may lie in a folder only its owner may enter); the tests need root (to act as
them) and are skipped otherwise."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from autograder.pipeline.collect import collect_exchange
from autograder.pipeline.exchange import exchange_inbound
from autograder.course import Course, CourseError
from hubtools import Unreachable, accounts_env, can_act_as_others, runnable_python, shared_folder, umask

REPO = Path(__file__).resolve().parents[2]
A = "03_self_attention"
COURSE_ID = "attention-workbook"
ALICE, BOB = "daemon", "bin"  # two accounts every Debian system has, standing in for two students

ACCOUNTS_PYTHON, WHY_NOT = runnable_python() if not can_act_as_others() else (None, can_act_as_others())
pytestmark = pytest.mark.skipif(ACCOUNTS_PYTHON is None, reason=WHY_NOT or "")
PYTHON = ""  # the students' environment's python (students_env)


@pytest.fixture(scope="module", autouse=True)
def students_env():
    """The accounts' environment in a folder they can enter (hubtools.accounts_env)."""
    global PYTHON
    try:
        with accounts_env("workbook-exchange-env-", ACCOUNTS_PYTHON) as PYTHON:
            yield PYTHON
    except Unreachable as exc:
        pytest.skip(str(exc))
    finally:
        PYTHON = ""


def _run_as(account: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """``python ARGS`` as ``account``, in the students' environment (nbgrader)."""
    entry = pwd.getpwnam(account)
    return subprocess.run([PYTHON, *args], cwd=cwd, user=entry.pw_uid, group=entry.pw_gid, extra_groups=[],
                          env={"PATH": f"{Path(PYTHON).parent}:/usr/bin:/bin", "HOME": str(cwd), "LANG": "C.UTF-8"},
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def hub(monkeypatch):
    """An exchange as a hub has it (its root world-writable and sticky, the course's folder the
    instructor's), notebook 03 released into it, and a home for each student (made with umask
    022, as an administrator's, whatever this process's)."""
    with umask(0o022):
        yield from _hub(monkeypatch)


def _hub(monkeypatch):
    try:
        top = shared_folder("workbook-exchange-")
    except Unreachable as exc:
        pytest.skip(str(exc))
    try:
        exchange = top / "exchange"
        exchange.mkdir(mode=0o1777)
        exchange.chmod(0o1777)
        monkeypatch.setenv("WORKBOOK_EXCHANGE", str(exchange))
        root = top / "course"
        (root / "notebooks" / A).mkdir(parents=True)
        shutil.copy(REPO / "nbgrader_config.py", root / "nbgrader_config.py")
        shutil.copy(REPO / "notebooks" / A / f"{A}.ipynb", root / "notebooks" / A / f"{A}.ipynb")
        course = Course(root)
        release = subprocess.run([sys.executable, "-m", "nbgrader", "release_assignment", A, "--force"], cwd=root,
                                 capture_output=True, text=True, timeout=120,
                                 env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
        assert release.returncode == 0, release.stderr
        homes = {}
        for account in (ALICE, BOB):
            home = top / f"home-{account}"
            (home / A).mkdir(parents=True)
            shutil.copy(REPO / "notebooks" / A / f"{A}.ipynb", home / A / f"{A}.ipynb")
            entry = pwd.getpwnam(account)
            for path in [home, home / A, home / A / f"{A}.ipynb"]:
                os.chown(path, entry.pw_uid, entry.pw_gid)
            homes[account] = home
        yield {"course": course, "exchange": exchange, "homes": homes, "top": top}
    finally:
        shutil.rmtree(top, ignore_errors=True)


def submit(hub, account: str) -> None:
    """``nbgrader submit`` as the student's own account (what the Assignments tab's Submit runs)."""
    done = _run_as(account, ["-m", "nbgrader", "submit", A, "--course", COURSE_ID,
                             f"--Exchange.root={hub['exchange']}"], hub["homes"][account])
    assert done.returncode == 0, done.stderr


def forge(hub, account: str, name: str, files: dict[str, str | bytes]) -> Path:
    """A folder ``account`` writes into the inbound folder itself, named as it likes."""
    script = ("import os, sys, json\n"
              "folder = os.path.join(sys.argv[1], sys.argv[2]); os.mkdir(folder)\n"
              "for rel, data in json.loads(sys.argv[3]).items():\n"
              "    open(os.path.join(folder, rel), 'w').write(data)\n")
    inbound = exchange_inbound(hub["course"])
    files = {k: v.decode() if isinstance(v, bytes) else v for k, v in files.items()}
    done = _run_as(account, ["-c", script, str(inbound), name, json.dumps(files)], hub["homes"][account])
    assert done.returncode == 0, done.stderr
    return inbound / name


def _ctime(folder: Path) -> float:
    return max(os.lstat(p).st_ctime for p in [folder, *folder.iterdir()])


def _inbound(hub, account: str) -> list[Path]:
    return sorted(p for p in exchange_inbound(hub["course"]).iterdir() if p.name.startswith(account + "+"))


def test_the_exchange_is_collected_in_one_command_dated_by_the_file_system(hub):
    submit(hub, ALICE)
    submit(hub, BOB)
    result = collect_exchange(hub["course"], A)
    assert result.ok and result.imported == {ALICE: [A], BOB: [A]}, (result.errors, result.rejected)
    for account in (ALICE, BOB):
        [folder] = _inbound(hub, account)
        when = datetime.fromisoformat(result.times[account]["time"]).replace(tzinfo=timezone.utc).timestamp()
        assert result.times[account]["source"] == "files" and abs(when - _ctime(folder)) < 1
        # nbgrader's own files come along: its timestamp.txt as a claim, its secret for the feedback
        submitted = hub["course"].submission_dir(account, A)
        assert sorted(p.name for p in submitted.iterdir()) == [f"{A}.ipynb", "submission_secret.txt", "timestamp.txt"]
        assert (submitted / "submission_secret.txt").read_text() == (folder / "submission_secret.txt").read_text()
        assert (submitted / f"{A}.ipynb").read_bytes() == (folder / f"{A}.ipynb").read_bytes()
    log = json.loads(hub["course"].collect_log_path(A).read_text())
    assert set(log["times"]) == {ALICE, BOB} and not log["rejected"]


def test_the_time_in_the_folders_name_is_never_read_and_the_latest_change_counts(hub):
    submit(hub, ALICE)
    [first] = _inbound(hub, ALICE)
    time.sleep(0.05)
    # the student writes a second submission whose name claims it was handed in long ago
    second = json.loads((first / f"{A}.ipynb").read_text())
    second["cells"][0]["source"] = "the second submission"
    backdated = forge(hub, ALICE, f"{ALICE}+{A}+2020-01-01 00:00:00.000000 UTC+abc",
                      {f"{A}.ipynb": json.dumps(second), "timestamp.txt": "2020-01-01 00:00:00"})
    result = collect_exchange(hub["course"], A)
    assert result.imported == {ALICE: [A]}
    imported = json.loads((hub["course"].submission_dir(ALICE, A) / f"{A}.ipynb").read_text())
    assert imported["cells"][0]["source"] == "the second submission"  # the later one, whatever its name says
    when = datetime.fromisoformat(result.times[ALICE]["time"]).replace(tzinfo=timezone.utc).timestamp()
    assert abs(when - _ctime(backdated)) < 1 and when > datetime(2026, 1, 1).timestamp()  # not 2020
    assert [line for line in result.ignored if "earlier submission" in line] == \
        [f"{first.name}: an earlier submission of {ALICE} (the one whose files changed last counts: {backdated.name})"]
    assert [n["kind"] for n in result.notes[ALICE]] == ["timestamp_claim"]  # its claim, flagged


def test_a_folder_handed_in_under_another_students_id_is_refused_and_never_theirs(hub):
    submit(hub, BOB)
    [genuine] = _inbound(hub, BOB)
    time.sleep(0.05)
    forged = forge(hub, ALICE, f"{BOB}+{A}+2026-11-21 09:00:00.000000 UTC+xyz",
                   {f"{A}.ipynb": "{}", "timestamp.txt": "2026-11-21 09:00:00"})
    result = collect_exchange(hub["course"], A)
    assert result.imported == {BOB: [A]} and not result.rejected
    assert result.errors == [f"'{forged.name}': handed in under the id {BOB} by the account {ALICE} (theirs is {BOB}, "
                             "c.Workbook.exchange_account); not imported: a student hands in as themself only"]
    submitted = hub["course"].submission_dir(BOB, A) / f"{A}.ipynb"
    assert submitted.read_bytes() == (genuine / f"{A}.ipynb").read_bytes()  # bob's own work, not the forgery
    # on a hub where every student is one account, the names are believed: the forgery then counts
    # (as the later submission), which is why 'owner' is the default
    result = collect_exchange(hub["course"], A, identity="name")
    assert result.imported == {BOB: [A]} and submitted.read_text() == "{}"


def test_a_hub_that_names_accounts_after_its_users_maps_each_id_to_its_account(hub):
    """The Littlest JupyterHub runs the hub user alice as the account jupyter-alice; nbgrader's
    exchange names her folder alice: c.Workbook.exchange_account = "jupyter-{student}". Here the
    account daemon stands for the student 'emon' ("da{student}")."""
    student = ALICE[2:]
    forge(hub, ALICE, f"{student}+{A}+2026-11-21 09:00:00.000000 UTC+abc",
          {f"{A}.ipynb": (hub["homes"][ALICE] / A / f"{A}.ipynb").read_text()})
    submit(hub, ALICE)  # and one under the account's own name, which is no student's id here
    result = collect_exchange(hub["course"], A, account="da{student}")
    assert result.imported == {student: [A]}, (result.errors, result.rejected)
    assert [e for e in result.errors if "theirs is dadaemon" in e] and len(result.errors) == 1
    with pytest.raises(CourseError, match="exchange_account must hold"):
        from autograder.course.settings import workbook_settings
        workbook_settings(hub["course"], exchange_account="jupyter-")


def test_a_file_another_account_wrote_into_a_students_folder_rejects_that_submission(hub):
    submit(hub, ALICE)
    [folder] = _inbound(hub, ALICE)  # nbgrader leaves it writable by all (0777), hidden by its random name
    done = _run_as(BOB, ["-c", f"open({str(folder / 'extra.py')!r}, 'w').write('x = 1')"],
                   hub["homes"][BOB])
    assert done.returncode == 0, done.stderr
    result = collect_exchange(hub["course"], A)
    assert not result.imported
    assert "written by the account bin, not by the account that handed the submission in (daemon)" in \
        result.rejected[ALICE]
    assert list(hub["course"].submission_dir(ALICE, A).iterdir()) == []  # recorded: 0 with the reason


def test_links_and_strange_entries_in_the_inbound_folder_are_errors_naming_them(hub):
    submit(hub, ALICE)
    inbound = exchange_inbound(hub["course"])
    done = _run_as(BOB, ["-c", f"import os; os.symlink('/etc', {str(inbound / (BOB + '+' + A + '+t+r'))!r}); "
                                               f"open({str(inbound / 'notes.txt')!r}, 'w').write('x')"],
                   hub["homes"][BOB])
    assert done.returncode == 0, done.stderr
    result = collect_exchange(hub["course"], A)
    assert result.imported == {ALICE: [A]}
    assert sorted(result.errors) == sorted([f"'{BOB}+{A}+t+r': a symbolic link (never followed)",
                                            f"'notes.txt' in {inbound}: not a submission of nbgrader's exchange "
                                            "(<student>+<assignment>+<time>[+<random>])"])


def test_the_exchange_needs_a_time_the_student_cannot_write(hub):
    with pytest.raises(CourseError, match="the time in its folder's name was written by the student's process"):
        collect_exchange(hub["course"], A, time_from="name")
    with pytest.raises(CourseError, match="nothing was handed in through the exchange yet"):
        os.rmdir(exchange_inbound(hub["course"]))
        collect_exchange(hub["course"], A)


def test_workbook_collect_exchange_from_the_command_line(hub):
    submit(hub, ALICE)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = subprocess.run([sys.executable, "-m", "autograder.cli", "--course", str(hub["course"].root), "collect",
                           "--exchange", A], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert f"  {ALICE}: {A} (handed in " in done.stdout and "imported 1 students; 0 rejected" in done.stdout
    done = subprocess.run([sys.executable, "-m", "autograder.cli", "--course", str(hub["course"].root), "collect",
                           "somewhere", "--exchange", A], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2 and "SOURCE cannot be given with it" in done.stderr
    assert stat.S_IMODE(os.stat(hub["exchange"]).st_mode) == 0o1777  # nothing here changed the hub's exchange
