"""`python -m course_lib.workspace` on a shared lab machine, with a partner who plants links.

Two real Unix accounts (made with useradd, as tests/grading/test_hub.py makes them), in a group
of their own (a pair): the course's checkout lies in a pair-work folder both may write (mode
2775, the pair's group, umask 002), and the victim's home is theirs alone (0700), holding a
private file (``thesis.txt``, 0600) and a folder (``Documents``). The partner cannot read
either, but may plant links pointing at them, in ``work/`` (while the victim has it open to the
pair) and in ``notebooks/``; then the victim runs the workspace, as themselves, exactly as
``make lab`` does. Nothing of the victim's is written, created or copied through a link, a
``work/`` the partner can write is refused with the fix, and once fixed the links are skipped,
each with a line saying so.

JupyterLab is not started: the command is given ``--version``, which goes through to
JupyterLab as any other option does, so that the JupyterLab the workspace becomes prints its
version and exits.

Needs root (it makes Unix accounts and a group; skipped otherwise)."""

from __future__ import annotations

import grp
import importlib.metadata
import json
import os
import pwd
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

import course_lib.workspace
from hubtools import Accounts, Unreachable, accounts_env, can_act_as_others, runnable_python, shared_folder

REPO = Path(__file__).resolve().parents[2]
CODE = Path(course_lib.workspace.__file__).resolve().parent  # the course_lib under test (PYTHONPATH's, if set)
A, B = "03_self_attention", "04_multi_head_attention"
NB = f"{A}/{A}.ipynb"
THESIS = "my thesis, three years of it"
LAB_VERSION = importlib.metadata.version("jupyterlab")  # what the JupyterLab the workspace becomes prints


def _why_not() -> str:
    why = can_act_as_others()
    if not why:
        missing = [tool for tool in ("groupadd", "groupdel", "usermod") if shutil.which(tool) is None]
        why = f"{', '.join(missing)} not found" if missing else ""
    return why


WHY_NOT = _why_not()
ACCOUNTS_PYTHON, WHY_NOT = runnable_python() if not WHY_NOT else (None, WHY_NOT)
pytestmark = pytest.mark.skipif(ACCOUNTS_PYTHON is None, reason=WHY_NOT or "")
PYTHON = ""  # the accounts' environment (pair_env): JupyterLab and jupyter_server, nothing of the course


@pytest.fixture(scope="module", autouse=True)
def pair_env():
    """The accounts' environment in a folder they can enter (hubtools.accounts_env)."""
    global PYTHON
    try:
        with accounts_env("workbook-workspace-env-", ACCOUNTS_PYTHON) as PYTHON:
            yield PYTHON
    except Unreachable as exc:
        pytest.skip(str(exc))
    finally:
        PYTHON = ""


class Lab:
    """The pair's machine: ``victim`` and ``partner`` (both in the group ``pair``), the course's
    checkout at ``course`` in the pair-work folder, the victim's ``home``."""

    def __init__(self, top: Path, accounts: Accounts, pair: str, victim: str, partner: str) -> None:
        self.top, self.accounts, self.pair, self.victim, self.partner = top, accounts, pair, victim, partner
        self.home = accounts.home(victim)
        self.course = top / "pair" / "course"
        self.notebooks, self.work = self.course / "notebooks", self.course / "work"
        self.thesis, self.documents = self.home / "thesis.txt", self.home / "Documents"
        self.home_before: list[str] = []

    def run_as(self, account: str, args: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess:
        """``args`` run as ``account`` with its groups (as a login gives them) and umask 002."""
        entry = pwd.getpwnam(account)
        return subprocess.run(
            args, cwd=cwd or self.course, user=entry.pw_uid, group=entry.pw_gid,
            extra_groups=os.getgrouplist(account, entry.pw_gid), umask=0o002,
            env={"PATH": f"{Path(PYTHON).parent}:/usr/bin:/bin", "HOME": entry.pw_dir, "USER": account,
                 "LOGNAME": account, "LANG": "C.UTF-8"},
            capture_output=True, text=True, timeout=300)

    def python_as(self, account: str, code: str) -> subprocess.CompletedProcess:
        return self.run_as(account, [PYTHON, "-c", code])

    def plant(self, links: dict[Path, Path], folders: tuple[Path, ...] = ()) -> None:
        """The partner makes ``folders`` (open to all) and the links (name -> what it points at)."""
        code = "import os\n" + "".join(f"os.mkdir({str(f)!r}); os.chmod({str(f)!r}, 0o777)\n" for f in folders) + \
            "".join(f"os.symlink({str(target)!r}, {str(link)!r})\n" for link, target in links.items())
        done = self.python_as(self.partner, code)
        assert done.returncode == 0, done.stderr

    def workspace(self) -> subprocess.CompletedProcess:
        """What `make lab` runs, as the victim, in the checkout (the JupyterLab it becomes prints
        its version and exits)."""
        return self.run_as(self.victim, [PYTHON, "-m", "course_lib.workspace", "--version"])

    def the_fix(self, refused: subprocess.CompletedProcess) -> None:
        """The victim does what the refusal says."""
        fix = f"chmod -R go-w {self.work}"
        assert fix in refused.stderr, refused.stderr
        done = self.run_as(self.victim, fix.split())
        assert done.returncode == 0, done.stderr

    def assert_private_untouched(self) -> None:
        """The victim's private file as it was (its text, 0600, theirs), their folder empty, and
        nothing new in their home."""
        info = os.lstat(self.thesis)
        assert stat.S_ISREG(info.st_mode) and self.thesis.read_text() == THESIS, \
            f"the victim's thesis.txt was overwritten: {self.thesis.read_text()[:200]!r}"
        assert (stat.S_IMODE(info.st_mode), info.st_uid) == (0o600, pwd.getpwnam(self.victim).pw_uid)
        assert sorted(os.listdir(self.documents)) == [], "written into the victim's Documents through a link"
        assert sorted(os.listdir(self.home)) == self.home_before, "a file made in the victim's home through a link"

    def partner_reads(self, text: str) -> list[str]:
        """The files under the checkout the partner can read that hold ``text``."""
        code = (f"import os\nfor top, dirs, files in os.walk({str(self.course)!r}):\n"
                "    for name in files:\n"
                "        path = os.path.join(top, name)\n"
                "        try:\n"
                f"            if {text!r} in open(path, errors='replace').read(): print(path)\n"
                "        except OSError:\n"
                "            pass\n")
        done = self.python_as(self.partner, code)
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()

    def open_work_to_the_pair(self) -> None:
        """The victim's work/ (made by a first sync, or by hand) open to the partner: the pair's
        group, group-writable, as a pair-work folder under umask 002 makes it."""
        done = self.run_as(self.victim, ["sh", "-c", f"mkdir -p {self.work} && chmod -R g+w {self.work}"])
        assert done.returncode == 0, done.stderr
        assert grp.getgrgid(self.work.stat().st_gid).gr_name == self.pair and self.work.stat().st_mode & stat.S_IWGRP


def _chown(path: Path, user: str, group: str) -> None:
    uid, gid = pwd.getpwnam(user).pw_uid, grp.getgrnam(group).gr_gid
    for p in [path, *path.rglob("*")]:
        os.chown(p, uid, gid, follow_symlinks=False)


@pytest.fixture
def lab():
    """Two accounts in a pair's group, the course's checkout (course_lib, notebooks 03 and 04) in
    their pair-work folder, and the victim's private home; all removed afterwards."""
    try:
        top = shared_folder("workbook-workspace-")
    except Unreachable as exc:
        pytest.skip(str(exc))
    accounts = Accounts(top / "home")
    pair = f"pair-{accounts.tag}"
    made_group = False
    try:
        (top / "home").mkdir(mode=0o755)
        subprocess.run(["groupadd", pair], check=True, capture_output=True, timeout=60)
        made_group = True
        victim, partner = accounts.add("victim"), accounts.add("partner")
        for user in (victim, partner):
            subprocess.run(["usermod", "--append", "--groups", pair, user], check=True, capture_output=True,
                           timeout=60)
        lab = Lab(top, accounts, pair, victim, partner)

        # the victim's home: 0700 (Accounts makes it so), a private file and folder
        lab.thesis.write_text(THESIS)
        lab.thesis.chmod(0o600)
        lab.documents.mkdir(mode=0o700)
        _chown(lab.home, victim, victim)

        # the pair-work folder and the victim's checkout in it: the pair may write it and notebooks/
        # (the course's code itself is the victim's alone: a partner who may edit it needs no link)
        (top / "pair").mkdir()
        os.chmod(top / "pair", 0o2775)
        shutil.copytree(CODE, lab.course / "course_lib", ignore=shutil.ignore_patterns("__pycache__"))
        for a in (A, B):
            (lab.notebooks / a).mkdir(parents=True)
            shutil.copyfile(REPO / "notebooks" / a / f"{a}.ipynb", lab.notebooks / a / f"{a}.ipynb")
        _chown(top / "pair", victim, pair)
        for path in [top / "pair", *(top / "pair").rglob("*")]:
            if path.is_dir():
                path.chmod(0o755 if "course_lib" in path.parts else 0o2775)
            else:
                path.chmod(0o644 if "course_lib" in path.parts else 0o664)
        assert [p for p in (lab.thesis, lab.documents) if lab.python_as(partner, f"open({str(p)!r})").returncode == 0
                or lab.python_as(partner, f"import os; os.listdir({str(p)!r})").returncode == 0] == [], \
            "the partner can reach the victim's home"
        lab.home_before = sorted(os.listdir(lab.home))
        yield lab
    finally:
        accounts.remove()
        if made_group:
            subprocess.run(["groupdel", pair], capture_output=True, timeout=60)
        shutil.rmtree(top, ignore_errors=True)


def _refused_then_fixed(lab: Lab) -> subprocess.CompletedProcess:
    """The victim's first run, on a work/ the partner can write: nothing of theirs touched, the
    work/ refused saying how to fix it; then the fix, and the run again (returned)."""
    refused = lab.workspace()
    lab.assert_private_untouched()
    assert refused.returncode != 0, refused.stdout
    assert f"{lab.work} can be written by other accounts" in refused.stderr, refused.stderr
    lab.the_fix(refused)
    again = lab.workspace()
    lab.assert_private_untouched()
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[-1] == LAB_VERSION, again.stdout  # the sync's lines, then JupyterLab's
    return again


def test_a_partners_link_at_the_manifests_temporary_name_does_not_overwrite_the_victims_file(lab):
    lab.open_work_to_the_pair()
    lab.plant({lab.work / ".course-versions.tmp": lab.thesis})
    again = _refused_then_fixed(lab)
    assert f"new: {NB}" in again.stdout, again.stdout
    manifest = lab.work / ".course-versions.json"
    assert stat.S_ISREG(os.lstat(manifest).st_mode) and NB in json.loads(manifest.read_text())
    assert os.readlink(lab.work / ".course-versions.tmp") == str(lab.thesis)  # left as it was


def test_a_partners_dangling_link_at_a_notebooks_place_creates_nothing_in_the_victims_home(lab):
    """The link is in a notebook folder the partner made (theirs, open to all): once work/ is fixed,
    that folder is refused in turn, saying to move it away; moved, a folder of the victim's is made."""
    lab.open_work_to_the_pair()
    planted = lab.home / "created-by-a-link.ipynb"
    lab.plant({lab.work / NB: planted}, folders=(lab.work / A,))
    refused = lab.workspace()
    assert refused.returncode != 0 and f"{lab.work} can be written by other accounts" in refused.stderr, \
        refused.stderr
    lab.run_as(lab.victim, ["chmod", "-R", "go-w", str(lab.work)])  # (fails on the partner's folder)
    refused = lab.workspace()
    lab.assert_private_untouched()
    assert not os.path.lexists(planted)
    assert refused.returncode != 0, refused.stdout
    assert f"{lab.work / A} can be written by other accounts (it is {lab.partner}'s)" in refused.stderr and \
        f"move it away (e.g. mv {lab.work / A} {lab.work / A}.theirs)" in refused.stderr, refused.stderr
    moved = lab.run_as(lab.victim, ["mv", str(lab.work / A), f"{lab.work / A}.theirs"])
    assert moved.returncode == 0, moved.stderr
    again = lab.workspace()
    lab.assert_private_untouched()
    assert not os.path.lexists(planted)
    assert again.returncode == 0, again.stderr
    assert {f"new: {NB}", f"new: {B}/{B}.ipynb"} <= set(again.stdout.splitlines()), again.stdout
    assert os.lstat(lab.work / A).st_uid == pwd.getpwnam(lab.victim).pw_uid


def test_a_partners_dangling_link_at_the_next_course_update_name_creates_nothing_in_the_victims_home(lab):
    first = lab.workspace()  # the victim's first `make lab`, on a work/ of their own
    assert first.returncode == 0, first.stderr
    changed = lab.python_as(lab.victim, f"open({str(lab.work / NB)!r}, 'w').write('{{}}')")  # their own work
    assert changed.returncode == 0, changed.stderr
    lab.open_work_to_the_pair()
    (lab.notebooks / NB).write_text('{"cells": []}')  # a course update (a `git pull`)
    planted = lab.home / "created-by-a-link.ipynb"
    lab.plant({lab.work / A / f"{A} (course update 1).ipynb": planted})
    again = _refused_then_fixed(lab)
    assert not os.path.lexists(planted)
    assert f"course update: {A}/{A} (course update 2).ipynb (your {NB} is kept as it is)" in again.stdout, \
        again.stdout
    assert (lab.work / NB).read_text() == "{}"
    assert (lab.work / A / f"{A} (course update 2).ipynb").read_text() == '{"cells": []}'


def test_a_partners_link_in_place_of_a_notebook_folder_gets_nothing_written_into_the_victims_folder(lab):
    lab.open_work_to_the_pair()
    lab.plant({lab.work / A: lab.documents})
    again = _refused_then_fixed(lab)
    assert f"skipped: {A} in work/ is a link: not followed" in again.stdout.splitlines(), again.stdout
    assert os.readlink(lab.work / A) == str(lab.documents)
    assert f"new: {B}/{B}.ipynb" in again.stdout.splitlines(), again.stdout


def test_a_partners_link_in_notebooks_to_the_victims_private_file_is_not_copied_where_the_partner_can_read(lab):
    planted = lab.notebooks / "05_planted"
    lab.plant({planted / "05_planted.ipynb": lab.thesis}, folders=(planted,))
    done = lab.workspace()
    lab.assert_private_untouched()
    assert lab.partner_reads(THESIS) == [], "the partner reads the victim's private file in work/"
    assert done.returncode == 0, done.stderr
    assert not os.path.lexists(lab.work / "05_planted" / "05_planted.ipynb")
    assert "skipped: 05_planted/05_planted.ipynb in notebooks/ is a link, not a notebook of the course" in \
        done.stdout.splitlines(), done.stdout
    assert f"new: {NB}" in done.stdout.splitlines(), done.stdout


def test_a_work_folder_the_partner_can_write_or_made_is_refused_with_the_fix(lab):
    # the victim's, open to the pair: refused, nothing written into it
    lab.open_work_to_the_pair()
    refused = lab.workspace()
    assert os.listdir(lab.work) == [], f"written into a work/ the partner can write: {os.listdir(lab.work)}"
    assert refused.returncode != 0 and f"make it yours alone (chmod -R go-w {lab.work})" in refused.stderr, \
        refused.stderr
    lab.the_fix(refused)
    fixed = lab.workspace()
    assert fixed.returncode == 0 and f"new: {NB}" in fixed.stdout.splitlines(), (fixed.stdout, fixed.stderr)

    # made by the partner (theirs, open to all) before the victim's first run: refused too
    shutil.rmtree(lab.work)
    lab.plant({}, folders=(lab.work,))
    refused = lab.workspace()
    assert os.listdir(lab.work) == [], f"written into the partner's work/: {os.listdir(lab.work)}"
    assert refused.returncode != 0 and f"{lab.work} can be written by other accounts" in refused.stderr, \
        refused.stderr

    # a link the partner put in its place, to the victim's folder: refused
    os.rmdir(lab.work)
    lab.plant({lab.work: lab.documents})
    refused = lab.workspace()
    lab.assert_private_untouched()
    assert refused.returncode != 0 and f"{lab.work} is a link" in refused.stderr, refused.stderr


def test_a_notebook_folder_the_partner_can_write_is_refused_though_work_is_the_victims_alone(lab):
    first = lab.workspace()  # the victim's first `make lab`, on a work/ of their own
    assert first.returncode == 0, first.stderr
    opened = lab.run_as(lab.victim, ["chmod", "g+w", str(lab.work / A)])  # work/ itself stays theirs alone
    assert opened.returncode == 0, opened.stderr
    (lab.notebooks / NB).write_text('{"cells": []}')  # a course update, to be written into work/A
    before = sorted(os.listdir(lab.work / A))
    refused = lab.workspace()
    assert refused.returncode != 0, refused.stdout
    assert f"{lab.work / A} can be written by other accounts" in refused.stderr, refused.stderr
    assert sorted(os.listdir(lab.work / A)) == before, "written into a folder the partner can write"
    lab.the_fix(refused)
    again = lab.workspace()
    assert again.returncode == 0, again.stderr
    assert f"updated: {NB} (you had not changed it)" in again.stdout.splitlines(), again.stdout
