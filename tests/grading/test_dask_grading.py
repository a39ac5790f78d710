"""Grading on a Dask cluster: a real scheduler and worker processes on localhost, started
with ``workbook scheduler`` and ``workbook worker`` (tests/servers.py), against the local
process pool on the same submissions.

One class of notebook 03 (correct, mistaken, empty) is graded with the local pool, then
on a cluster of two workers, one of which is killed while it grades; then a worker grades
alone with its own copy of course_lib, which is changed while it runs: it must refuse.
What a worker keeps between tasks (file digests, the sandbox's course copy) is tested
without a cluster at the end.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import os
import shutil
import threading
import time
from collections import Counter

import nbformat
import pytest

from autograder.pipeline.autograde import autograde
from autograder.pipeline.options import GradingOptions, Limits
from autograder.cli import main
from autograder.course import manifest as digests
from autograder.pipeline import cluster as worker_side
from autograder.pipeline.cluster import QUIET_DASK, dask_environment
from autograder.course.manifest import course_manifest, manifest_differences
from autograder.course import Course
from servers import REPO, DaskCluster, free_port
from workbook_class import ClassBuilder, make_course

NOTEBOOK = "03_self_attention"
LIMITS = Limits(cell_timeout=30, notebook_timeout=240, memory_mb=2048)


def _grades(course: Course, assignment: str, students) -> dict:
    with course.gradebook() as gb:
        out = {}
        for s in students:
            sub = gb.find_submission_notebook(NOTEBOOK, assignment, s)
            out[s] = ({g.name: g.score for g in sub.grades}, sub.score)
        return out


# A submission that reaches for the Dask scheduler it is graded through (its address known, as
# the default tcp://HOST:8786 would be) and has it run a task that writes outside the sandbox.
REACH_SCHEDULER = r'''
import socket
tries = {}
host, port = "@ADDRESS@".removeprefix("tcp://").rsplit(":", 1)
for where in (host, "localhost", "0.0.0.0"):
    try:
        socket.create_connection((where, int(port)), timeout=3).close()
        tries[where] = "connected"
    except OSError as exc:
        tries[where] = type(exc).__name__
try:
    from distributed import Client
    client = Client("@ADDRESS@", timeout=5)
    client.submit(lambda: open("@CANARY@", "w").write("a task sent from a submission ran")).result(timeout=20)
    print("REACHED THE SCHEDULER", tries)
except Exception as exc:
    print("no scheduler from the sandbox:", type(exc).__name__, tries)
'''


def _outputs(path) -> str:
    """Every stream and text output of a notebook."""
    nb = nbformat.read(str(path), as_version=4)
    return "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "")
                   for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))


def _kill_when_busy(cluster: DaskCluster, name: str, killed: dict) -> None:
    """Kill worker ``name`` as soon as the scheduler says it is grading something."""
    with cluster.client() as client:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            addresses = {str(w["name"]): a for a, w in client.scheduler_info()["workers"].items()}
            busy = client.processing().get(addresses.get(name), ())
            if busy:
                time.sleep(2)  # let it start the sandbox
                killed["task"] = list(busy)
                cluster.kill_worker(name)
                return
            time.sleep(0.2)


@pytest.fixture(scope="module")
def cluster_class(tmp_path_factory):
    base = tmp_path_factory.mktemp("dask")
    root, assignment = make_course(base / "course", NOTEBOOK)
    course = Course(root)
    assert main(["--course", str(root), "release", assignment]) == 0
    builder = ClassBuilder(course.release_dir / assignment / f"{NOTEBOOK}.ipynb",
                           course.source_dir / assignment / f"{NOTEBOOK}.ipynb")
    cluster = DaskCluster(cwd=root, log_dir=base)  # its port is chosen now, started below
    canary = base / "written-by-a-task-the-submission-sent"
    mistaken = builder.mistake_student("mistaken").notebook
    attacker = copy.deepcopy(mistaken)
    attacker.cells.append(nbformat.v4.new_code_cell(REACH_SCHEDULER.replace("@ADDRESS@", cluster.address)
                                                    .replace("@CANARY@", str(canary))))
    submissions = {"correct": builder.filled(), "mistaken": mistaken, "empty": builder.released,
                   "attacker": attacker}
    for student, nb in submissions.items():
        folder = course.submission_dir(student, assignment)
        folder.mkdir(parents=True)
        nbformat.write(nb, str(folder / f"{NOTEBOOK}.ipynb"))
    state = {"course": course, "assignment": assignment, "students": sorted(submissions), "base": base}

    autograde(course, assignment, GradingOptions(workers=2, limits=LIMITS))
    state["local"] = _grades(course, assignment, state["students"])

    with cluster:
        cluster.start_worker("w1")
        cluster.start_worker("w2")
        keys = list(QUIET_DASK)

        def quiet_settings() -> dict[str, str]:  # defined here: sent by value to the scheduler and workers
            import dask
            return {key: str(dask.config.get(key)) for key in keys}

        with cluster.client() as client:
            state["settings"] = [client.run_on_scheduler(quiet_settings), *client.run(quiet_settings).values()]
        killed: dict = {}
        killer = threading.Thread(target=_kill_when_busy, args=(cluster, "w2", killed))
        killer.start()
        records: list[dict] = []
        options = GradingOptions(limits=LIMITS, scheduler=cluster.address, force=True)
        autograde(course, assignment, options, progress=records.append)
        killer.join()
        state["canary"] = canary
        state["attacker_output"] = _outputs(course.autograded_path("attacker", assignment, NOTEBOOK))
        state["killed"], state["records"] = killed, records
        from autograder.pipeline.regrade import regrade  # the same course: a regrade on the cluster moves nothing
        state["regrade"] = regrade(course, [assignment], GradingOptions(limits=LIMITS, scheduler=cluster.address),
                                   students=["correct", "mistaken"])[0]
        state["after_regrade"] = _grades(course, assignment, state["students"])
        state["cluster"] = _grades(course, assignment, state["students"])
        state["rerun"] = []
        autograde(course, assignment, GradingOptions(limits=LIMITS, scheduler=cluster.address),
                  progress=state["rerun"].append)

        # a worker alone on the cluster whose course_lib is changed while it runs, after it
        # graded with it (its digests and course copy kept)
        cluster.kill_worker("w1")
        changed = base / "changed"
        shutil.copytree(REPO / "course_lib", changed / "course_lib",
                        ignore=shutil.ignore_patterns("__pycache__"))
        cluster.start_worker("w3", env={"PYTHONPATH": str(changed)})
        state["before_change"] = []
        autograde(course, assignment, GradingOptions(limits=LIMITS, scheduler=cluster.address, force=True,
                                                     students=["empty"]), progress=state["before_change"].append)
        with open(changed / "course_lib" / "attention.py", "a") as f:
            f.write("\n# a different version of the course\n")
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            state["refused_rc"] = main(["--course", str(root), "autograde", assignment, "--scheduler",
                                        cluster.address, "--force", "--quiet", "--cell-timeout", "30",
                                        "--memory-mb", "2048"])
        state["refused_err"] = err.getvalue()
        state["after_refusal"] = _grades(course, assignment, state["students"])
    return state


@pytest.mark.slow
def test_the_cluster_gives_exactly_the_grades_of_the_local_pool(cluster_class):
    assert cluster_class["cluster"] == cluster_class["local"]
    local = cluster_class["local"]
    assert local["correct"][1] > local["mistaken"][1] > local["empty"][1] == 0  # a class that tells them apart


@pytest.mark.slow
def test_a_worker_killed_mid_batch_loses_nothing_and_duplicates_nothing(cluster_class):
    assert cluster_class["killed"].get("task"), "worker w2 was never seen grading"
    records = cluster_class["records"]
    assert Counter(r["worker"] for r in records) and "w2" not in {r["worker"] for r in records}
    students = cluster_class["students"]
    assert sorted(r["notebook"] for r in records) == [NOTEBOOK] * len(students)  # each submission recorded once
    assert all(r["status"] == "graded" for r in records)
    # a rerun grades only what is missing: nothing
    assert [r["status"] for r in cluster_class["rerun"]] == ["kept"] * len(students)


@pytest.mark.slow
def test_a_worker_with_a_different_course_lib_is_refused(cluster_class):
    assert [(r["worker"], r["status"]) for r in cluster_class["before_change"]] == [("w3", "graded")]
    assert cluster_class["refused_rc"] == 2
    err = cluster_class["refused_err"]
    assert "worker w3 grades with a different course" in err and "course_lib/attention.py differs" in err
    assert cluster_class["after_refusal"] == cluster_class["cluster"]  # nothing recorded from it


@pytest.mark.slow
def test_a_submission_cannot_reach_the_scheduler_from_its_sandbox(cluster_class):
    """The sandbox has a network of its own: the scheduler's address leads nowhere, no task
    the submission sends runs, and the attack changes no grade."""
    output = cluster_class["attacker_output"]
    assert "no scheduler from the sandbox:" in output and "REACHED THE SCHEDULER" not in output, output
    assert "connected" not in output.split("no scheduler from the sandbox:")[1]
    assert not cluster_class["canary"].exists()
    grades = cluster_class["cluster"]
    assert grades["attacker"] == grades["mistaken"]


@pytest.mark.slow
def test_the_scheduler_and_workers_run_with_the_grading_settings(cluster_class):
    assert len(cluster_class["settings"]) == 3
    for settings in cluster_class["settings"]:
        assert settings == QUIET_DASK


def test_grading_settings_leave_a_variable_already_set_alone(tmp_path):
    env = dask_environment({"DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL": "50ms", "PATH": "/bin"}, tmp_path)
    assert env["DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL"] == "50ms"
    assert env["DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED"] == "False"
    assert env["DASK_DISTRIBUTED__SCHEDULER__ACTIVE_MEMORY_MANAGER__START"] == "False"
    assert env["WORKBOOK_COURSE"] == str(tmp_path) and env["PATH"] == "/bin"
    assert len([k for k in env if k.startswith("DASK_")]) == len(QUIET_DASK)


def test_manifest_differences_name_the_files():
    ours = {"course_lib/a.py": "1", "course_lib/b.py": "2", "solutions/x.ipynb": "3"}
    theirs = {"course_lib/a.py": "1", "course_lib/b.py": "9", "course_lib/c.py": "4"}
    assert manifest_differences(ours, theirs) == ["course_lib/b.py differs", "course_lib/c.py exists only on the worker",
                                                  "solutions/x.ipynb is missing on the worker"]
    assert manifest_differences(ours, dict(ours)) == []


@pytest.mark.slow
def test_an_unreachable_scheduler_is_a_one_line_error(tmp_path, capsys):
    root, assignment = make_course(tmp_path / "course", NOTEBOOK)
    assert main(["--course", str(root), "release", assignment]) == 0
    folder = Course(root).submission_dir("alice", assignment)
    folder.mkdir(parents=True)
    shutil.copy(Course(root).release_dir / assignment / f"{NOTEBOOK}.ipynb", folder)
    address = f"tcp://127.0.0.1:{free_port()}"
    rc = main(["--course", str(root), "autograde", assignment, "--scheduler", address, "--quiet"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1
    assert f"cannot reach the Dask scheduler at '{address}'" in err
    assert err.endswith("start one with `workbook scheduler` and workers with `workbook worker ADDRESS` in the "
                        "course folder")


# ---------------------------------------------------------------------------
# What a worker keeps between tasks
# ---------------------------------------------------------------------------

def _rewrite_keeping_size_and_mtime(path, text: str) -> None:
    before = path.stat()
    time.sleep(0.05)  # past the file system's timestamp tick
    path.write_text(text)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)


def test_a_kept_file_digest_is_never_used_for_a_changed_file(tmp_path, monkeypatch):
    monkeypatch.setattr(digests, "_DIGESTS", {})
    f = tmp_path / "attention.py"
    f.write_text("x = 1\n")
    assert digests._file_digest(f) == hashlib.sha256(b"x = 1\n").hexdigest()
    assert str(f) not in digests._DIGESTS  # just written: not kept (a second write may follow in its tick)
    monkeypatch.setattr(digests, "SETTLED_NS", 0)
    digests._file_digest(f)
    with monkeypatch.context() as m:  # kept: asked again, it is not read
        m.setattr(type(f), "read_bytes", lambda self: pytest.fail("read again"))
        assert digests._file_digest(f) == hashlib.sha256(b"x = 1\n").hexdigest()
    _rewrite_keeping_size_and_mtime(f, "x = 2\n")
    assert digests._file_digest(f) == hashlib.sha256(b"x = 2\n").hexdigest()


def test_a_worker_course_changed_between_tasks_is_seen_by_the_next_task(tmp_path, monkeypatch):
    monkeypatch.setattr(digests, "SETTLED_NS", 0)  # every digest kept, as on a long-running worker
    root, assignment = make_course(tmp_path / "course", NOTEBOOK)
    course = Course(root)
    expected = course_manifest(course)
    assert course_manifest(course) == expected
    source = course.source_dir / assignment / f"{NOTEBOOK}.ipynb"
    text = source.read_text()
    _rewrite_keeping_size_and_mtime(source, text.replace("import", "Import", 1))
    assert manifest_differences(expected, course_manifest(course)) == [
        f"solutions/{assignment}/{NOTEBOOK}.ipynb differs"]


def test_a_kept_course_copy_never_carries_a_change_to_the_next_task(tmp_path, monkeypatch):
    monkeypatch.setattr(worker_side, "_COPIES", {})
    monkeypatch.setattr(worker_side, "_COPIES_ROOT", [tmp_path])
    copy = worker_side.cached_course_copy("v1", ["causal_mask"])
    attention = (copy / "course_lib" / "attention.py").read_text()
    assert "_workbook_stub('course_lib.attention:causal_mask'" in attention
    assert worker_side.cached_course_copy("v1", ["causal_mask", "causal_mask"]) == copy  # kept
    changes = [lambda c: _rewrite_keeping_size_and_mtime(c / "course_lib" / "attention.py", attention.upper()),
               lambda c: (c / "course_lib" / "sitecustomize.py").write_text("print('left behind')\n"),
               lambda c: (c / "course_lib" / "attention.py").chmod(0o666)]
    for change in changes:
        change(copy)
        fresh = worker_side.cached_course_copy("v1", ["causal_mask"])
        assert fresh != copy and copy.exists()  # a new copy beside it: a copy in use is never rebuilt in place
        assert (fresh / "course_lib" / "attention.py").read_text() == attention
        assert not (fresh / "course_lib" / "sitecustomize.py").exists()
        assert (fresh / "course_lib" / "attention.py").stat().st_mode & 0o777 == 0o644
        copy = fresh
    assert worker_side.cached_course_copy("v2", ["causal_mask"]) != copy  # another version of the course
    unstubbed = worker_side.cached_course_copy("v1", [])  # another set of items
    assert "_workbook_stub" not in (unstubbed / "course_lib" / "attention.py").read_text()


@pytest.mark.slow
def test_a_regrade_runs_on_the_cluster(cluster_class):
    outcome = cluster_class["regrade"]
    assert outcome.notebooks == 2 and outcome.errors == 0 and outcome.changes == []
    assert cluster_class["after_regrade"] == cluster_class["local"]
