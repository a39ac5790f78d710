"""A student's work is safe: `make lab` works on copies in work/ that course updates
never overwrite, and a second `make lab` points at the running JupyterLab."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from browser import free_port, wait_for_http
from course_lib.workspace import MANIFEST, sync

REPO = Path(__file__).resolve().parents[2]
A = "03_self_attention"


@pytest.fixture
def course(tmp_path) -> Path:
    notebooks = tmp_path / "notebooks"
    for a in (A, "04_multi_head_attention"):
        (notebooks / a).mkdir(parents=True)
        (notebooks / a / f"{a}.ipynb").write_bytes((REPO / "notebooks" / a / f"{a}.ipynb").read_bytes())
    return notebooks


def test_first_use_copies_every_notebook(course, tmp_path):
    work = tmp_path / "work"
    assert sorted(sync(course, work)) == [f"new: {A}/{A}.ipynb",
                                          "new: 04_multi_head_attention/04_multi_head_attention.ipynb"]
    assert (work / A / f"{A}.ipynb").read_bytes() == (course / A / f"{A}.ipynb").read_bytes()
    assert sync(course, work) == []  # nothing new: nothing written


def test_a_course_update_is_offered_beside_the_students_work(course, tmp_path):
    work = tmp_path / "work"
    sync(course, work)
    mine = work / A / f"{A}.ipynb"
    mine.write_text(mine.read_text().replace("# YOUR CODE HERE", "# my answer", 1))
    edited = mine.read_bytes()
    update = course / A / f"{A}.ipynb"
    update.write_text(update.read_text().replace("Self-attention", "Self-attention (revised)", 1))
    assert sync(course, work) == [f"course update: {A}/{A} (course update 1).ipynb (your {A}/{A}.ipynb is kept as it is)"]
    assert mine.read_bytes() == edited
    assert (work / A / f"{A} (course update 1).ipynb").read_bytes() == update.read_bytes()
    assert sync(course, work) == []  # offered once
    update.write_text(update.read_text().replace("(revised)", "(revised twice)", 1))
    assert sync(course, work)[0].startswith(f"course update: {A}/{A} (course update 2).ipynb")
    assert mine.read_bytes() == edited and len(json.loads((work / MANIFEST).read_text())[f"{A}/{A}.ipynb"]) == 3


def test_a_copy_the_student_never_changed_is_simply_refreshed(course, tmp_path):
    work = tmp_path / "work"
    sync(course, work)
    other = work / "04_multi_head_attention" / "04_multi_head_attention.ipynb"
    other.write_text(other.read_text().replace("# YOUR CODE HERE", "# mine", 1))  # worked on: kept
    for a in (A, "04_multi_head_attention"):
        update = course / a / f"{a}.ipynb"
        update.write_text(update.read_text().replace("attention", "attention (revised)", 1))
    assert sorted(sync(course, work)) == [
        "course update: 04_multi_head_attention/04_multi_head_attention (course update 1).ipynb "
        "(your 04_multi_head_attention/04_multi_head_attention.ipynb is kept as it is)",
        f"updated: {A}/{A}.ipynb (you had not changed it)"]
    assert (work / A / f"{A}.ipynb").read_bytes() == (course / A / f"{A}.ipynb").read_bytes()
    assert not list((work / A).glob("*course update*"))
    assert "# mine" in other.read_text()


def test_an_untouched_copy_of_the_same_version_gets_nothing_beside_it(course, tmp_path):
    work = tmp_path / "work"
    sync(course, work)
    (work / MANIFEST).unlink()  # e.g. a copy made by hand
    assert sync(course, work) == []


def test_a_deleted_copy_comes_back_and_nothing_is_ever_deleted(course, tmp_path):
    work = tmp_path / "work"
    sync(course, work)
    (work / A / f"{A}.ipynb").unlink()
    (work / A / "my_notes.txt").write_text("keep me")
    assert sync(course, work) == [f"copied again (yours was gone): {A}/{A}.ipynb"]
    assert (work / A / "my_notes.txt").read_text() == "keep me"


def test_the_repository_ignores_work():
    ignored = subprocess.run(["git", "check-ignore", "-q", "work/03_self_attention/x.ipynb"], cwd=REPO)
    assert ignored.returncode == 0


def test_a_second_make_lab_points_at_the_running_one(course, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "jupyter_server", "--no-browser", f"--port={port}",
                               "--ServerApp.ip=127.0.0.1", f"--ServerApp.root_dir={work}",
                               "--IdentityProvider.token=tok123", "--allow-root"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_http(f"http://127.0.0.1:{port}/api/status?token=tok123", timeout=90)
        deadline = time.monotonic() + 30
        while True:  # the server writes its runtime file just after it answers
            out = subprocess.run([sys.executable, "-m", "course_lib.workspace", "--notebooks", str(course),
                                  "--work", str(work), "--port", "1"], capture_output=True, text=True,
                                 timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
            if "already open" in out.stdout or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert out.returncode == 0, out.stderr
        assert f"JupyterLab is already open on {work}: http://127.0.0.1:{port}/lab?token=tok123" in out.stdout
        assert f"new: {A}/{A}.ipynb" in out.stdout
    finally:
        server.terminate()
        server.wait(timeout=20)


# The path without make: `python -m course_lib.workspace` is the whole of `make lab`, in
# PowerShell as on POSIX; nothing in it may assume a shell, /tmp, os.fork or "/" as the separator.

def test_the_manifest_names_notebooks_the_same_way_on_every_system(course, tmp_path):
    work = tmp_path / "work with spaces" / "and ünïcode"
    sync(course, work)
    keys = sorted(json.loads((work / MANIFEST).read_text()))
    assert keys == ["03_self_attention/03_self_attention.ipynb",
                    "04_multi_head_attention/04_multi_head_attention.ipynb"]
    # a manifest written on Windows reads the same: its keys are POSIX paths, never backslashes
    assert all("\\" not in key for key in keys)


def test_the_lab_command_passes_paths_as_single_arguments_and_allows_root_only_as_root(tmp_path, monkeypatch):
    from course_lib import workspace

    work = tmp_path / "a folder" / "work"
    monkeypatch.setattr(workspace, "_is_root", lambda: False)
    argv, env = workspace.lab_command(work, ["--port", "8890"])
    assert argv == [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={work}", "--port", "8890"]
    assert env["JUPYTER_CONFIG_PATH"].split(os.pathsep)[0] == str(workspace.LAB_CONFIG)
    monkeypatch.setattr(workspace, "_is_root", lambda: True)
    assert workspace.lab_command(work)[0][-1] == "--allow-root"  # containers and CI machines run as root
    assert workspace.lab_command(work, ["--allow-root"])[0].count("--allow-root") == 1


def test_on_windows_jupyterlab_runs_as_a_child_and_its_exit_code_is_returned(monkeypatch):
    from course_lib import workspace

    calls = []
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setattr(subprocess, "call", lambda command, env: calls.append(command) or 3)
    monkeypatch.setattr(os, "execve", lambda *a: pytest.fail("os.execve on Windows returns the console at once"))
    assert workspace._run(["python", "-m", "jupyterlab"], {}) == 3
    assert calls == [["python", "-m", "jupyterlab"]]


def test_nothing_a_student_runs_assumes_a_posix_system():
    """course_lib and the notebooks run in the student's own kernel, on Windows too."""
    sources = [p for p in (REPO / "course_lib").rglob("*.py")]
    sources += [p for p in (REPO / "notebooks").rglob("*.ipynb")]
    assert len(sources) > 50
    offending = {}
    for path in sources:
        text = path.read_text(encoding="utf-8")
        found = [word for word in ('"/tmp', "'/tmp", "os.fork(", "os.getuid(", "os.geteuid()", "import pwd",
                                   "import fcntl", "import resource", "shell=True", '"/".join', "'/'.join")
                 if word in text]
        if path.name == "workspace.py":  # geteuid behind hasattr(os, "geteuid"); pwd imported there only
            found = [w for w in found if w != "os.geteuid()" or 'hasattr(os, "geteuid")' not in text]
            found = [w for w in found if w != "import pwd" or "\nimport pwd" in text]
        if found:
            offending[str(path.relative_to(REPO))] = found
    assert not offending, offending


@pytest.fixture
def victim(tmp_path) -> Path:
    """A private file and folder of the student's that a planted link points at."""
    home = tmp_path / "home"
    (home / "Documents").mkdir(parents=True)
    (home / "thesis.txt").write_text("my thesis")
    return home


def _plant(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)


def test_a_link_planted_at_the_manifests_temporary_name_is_not_followed(course, tmp_path, victim):
    work = tmp_path / "work"
    _plant(work / ".course-versions.tmp", victim / "thesis.txt")
    sync(course, work)
    assert (victim / "thesis.txt").read_text() == "my thesis"
    assert json.loads((work / MANIFEST).read_text())  # written, as a file of its own
    assert not (work / MANIFEST).is_symlink()


def test_a_dangling_link_at_a_notebooks_place_is_not_followed(course, tmp_path, victim):
    work = tmp_path / "work"
    _plant(work / A / f"{A}.ipynb", victim / "created-by-a-link.ipynb")
    messages = sync(course, work)
    assert not (victim / "created-by-a-link.ipynb").exists()
    assert f"skipped: {A}/{A}.ipynb in work/ is a link: not followed" in messages


def test_a_dangling_link_at_the_next_course_update_name_is_not_followed(course, tmp_path, victim):
    work = tmp_path / "work"
    sync(course, work)
    (work / A / f"{A}.ipynb").write_text("{}")  # the student's own work
    (course / A / f"{A}.ipynb").write_text('{"cells": []}')  # a course update
    _plant(work / A / f"{A} (course update 1).ipynb", victim / "created-by-a-link.ipynb")
    messages = sync(course, work)
    assert not (victim / "created-by-a-link.ipynb").exists()
    assert messages == [f"course update: {A}/{A} (course update 2).ipynb (your {A}/{A}.ipynb is kept as it is)"]


def test_a_linked_notebook_folder_gets_nothing_written_into_it(course, tmp_path, victim):
    work = tmp_path / "work"
    _plant(work / A, victim / "Documents")
    messages = sync(course, work)
    assert list((victim / "Documents").iterdir()) == []
    assert f"skipped: {A} in work/ is a link: not followed" in messages


def test_a_link_in_notebooks_to_a_private_file_is_not_copied(course, tmp_path, victim):
    (victim / "thesis.txt").chmod(0o600)
    _plant(course / "05_planted" / "05_planted.ipynb", victim / "thesis.txt")
    work = tmp_path / "work"
    messages = sync(course, work)
    assert not (work / "05_planted" / "05_planted.ipynb").exists()
    assert "skipped: 05_planted/05_planted.ipynb in notebooks/ is a link, not a notebook of the course" in messages


def test_a_copy_keeps_its_notebooks_permissions(course, tmp_path):
    (course / A / f"{A}.ipynb").chmod(0o600)
    work = tmp_path / "work"
    sync(course, work)
    assert (work / A / f"{A}.ipynb").stat().st_mode & 0o777 == 0o600
    assert (work / "04_multi_head_attention" / "04_multi_head_attention.ipynb").stat().st_mode & 0o777 == \
        (course / "04_multi_head_attention" / "04_multi_head_attention.ipynb").stat().st_mode & 0o777


@pytest.mark.skipif(not hasattr(os, "geteuid"), reason="POSIX permissions")
def test_a_work_folder_others_can_write_is_refused_with_the_fix(course, tmp_path):
    """Writable by all, or by a group with other members (a pair-work folder): refused. Writable
    by the student's own group alone (Debian's umask 002): theirs."""
    import grp
    import pwd

    work = tmp_path / "it's our work"  # the fix printed is one a shell runs as it reads
    work.mkdir()
    work.chmod(0o777)
    with pytest.raises(SystemExit, match=r"chmod -R go-w") as refused:
        sync(course, work)
    assert f"chmod -R go-w '{tmp_path}/it'\"'\"'s our work'" in str(refused.value), str(refused.value)
    assert list(work.iterdir()) == []
    work.chmod(0o775)
    if set(grp.getgrgid(os.getegid()).gr_mem) - {pwd.getpwuid(os.geteuid()).pw_name}:
        pytest.skip("this account's group has other members")
    assert sync(course, work)  # its own group: accepted
    other = next((g.gr_gid for g in grp.getgrall() if g.gr_gid != os.getegid()), None)
    if os.geteuid() == 0 and other is not None:  # a group shared with other accounts (root can hand it over)
        os.chown(work, -1, other)
        with pytest.raises(SystemExit, match=r"chmod -R go-w"):
            sync(course, work)


def test_the_sync_messages_are_written_before_jupyterlab_takes_the_process_over(tmp_path):
    """With stdout a pipe (not a terminal, so block-buffered), what was printed before the
    exec still arrives."""
    script = ("import sys; from course_lib import workspace; print('synced: 03'); "
              "workspace._run([sys.executable, '-c', 'print(\"lab\")'], {})")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(REPO)}).stdout
    assert out.splitlines() == ["synced: 03", "lab"]


@pytest.mark.skipif(not hasattr(os, "geteuid"), reason="POSIX permissions")
def test_the_accounts_own_group_is_told_by_the_account_not_by_user(course, tmp_path, monkeypatch):
    """A group-writable work/ whose group holds another account is refused, even with $USER set to
    that account's name."""
    import grp
    import types

    work = tmp_path / "work"
    work.mkdir()
    work.chmod(0o775)
    os.chown(work, -1, os.getegid())
    real = grp.getgrgid
    monkeypatch.setattr(grp, "getgrgid", lambda gid: types.SimpleNamespace(gr_mem=["partner"]) if gid == os.getegid()
                        else real(gid))
    monkeypatch.setenv("USER", "partner")
    with pytest.raises(SystemExit, match=r"can be written by other accounts"):
        sync(course, work)
    assert list(work.iterdir()) == []


@pytest.mark.skipif(not hasattr(os, "fchmod"), reason="POSIX: the mode is set on the file written")
def test_a_temporary_file_swapped_for_a_link_before_its_mode_is_set_changes_nothing_it_points_at(
        course, tmp_path, victim, monkeypatch):
    """Whoever may write the folder swaps the new file for a link to the student's private file
    just before its permissions are set: those of the file written are set, never the link's."""
    thesis = victim / "thesis.txt"
    thesis.chmod(0o600)
    real_chmod = os.chmod

    def swapped_then_chmod(path, mode, *args, **kwargs):
        if isinstance(path, (str, os.PathLike)) and Path(path).name.startswith(".workspace-"):
            os.unlink(path)
            os.symlink(thesis, path)
        return real_chmod(path, mode, *args, **kwargs)

    monkeypatch.setattr(os, "chmod", swapped_then_chmod)
    sync(course, tmp_path / "work")
    assert stat.S_IMODE(os.stat(thesis).st_mode) == 0o600 and thesis.read_text() == "my thesis"


@pytest.mark.skipif(not hasattr(os, "O_NOFOLLOW"), reason="POSIX: folders held open")
def test_work_swapped_for_a_link_after_it_was_checked_gets_nothing_written_through_it(course, tmp_path, victim,
                                                                                     monkeypatch):
    """work/ checked, then (its parent being writable by others) renamed and a link to the
    student's private folder put in its place: what is written goes into the folder checked."""
    from course_lib import workspace

    work = tmp_path / "work"
    sync(course, work)
    (course / "05_new").mkdir()
    (course / "05_new" / "05_new.ipynb").write_text('{"cells": []}')
    real_loads = json.loads

    def swap_then_loads(text, *args, **kwargs):  # the manifest is read just after work/ is checked
        if not os.path.islink(work):
            work.rename(tmp_path / "work.checked")
            work.symlink_to(victim / "Documents")
        return real_loads(text, *args, **kwargs)

    monkeypatch.setattr(workspace, "json", types_with(json, loads=swap_then_loads))
    messages = sync(course, work)
    assert list((victim / "Documents").iterdir()) == [], "written through the link put in work/'s place"
    assert "new: 05_new/05_new.ipynb" in messages
    assert (tmp_path / "work.checked" / "05_new" / "05_new.ipynb").read_text() == '{"cells": []}'


def types_with(module, **names):
    """A stand-in for ``module`` with ``names`` replaced."""
    import types

    return types.SimpleNamespace(**{**vars(module), **names})


def test_a_notebooks_folder_that_is_a_link_is_not_read_through(course, tmp_path):
    linked = tmp_path / "elsewhere"
    course.rename(linked)
    course.symlink_to(linked)
    work = tmp_path / "work"
    with pytest.raises(SystemExit, match=r"is a link"):
        sync(course, work)
    assert not any(work.rglob("*.ipynb"))


def test_without_dir_fd_as_on_windows_the_sync_works_by_path(course, tmp_path, victim, monkeypatch):
    """Windows has no ``dir_fd``: folders are used by path there, each name checked for a link."""
    from course_lib import workspace

    monkeypatch.setattr(workspace, "_DIR_FD", False)
    work = tmp_path / "work"
    _plant(work / A, victim / "Documents")
    messages = sync(course, work)
    assert f"skipped: {A} in work/ is a link: not followed" in messages
    assert "new: 04_multi_head_attention/04_multi_head_attention.ipynb" in messages
    assert list((victim / "Documents").iterdir()) == []
    mine = work / "04_multi_head_attention" / "04_multi_head_attention.ipynb"
    mine.write_text("{}")
    (course / "04_multi_head_attention" / "04_multi_head_attention.ipynb").write_text('{"cells": []}')
    assert sync(course, work)[-1].startswith("course update: 04_multi_head_attention/04_multi_head_attention "
                                             "(course update 1).ipynb")
    assert mine.read_text() == "{}" and not any(work.rglob(".workspace-*"))
