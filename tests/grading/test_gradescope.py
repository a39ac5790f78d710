"""``workbook gradescope``, tested the way Gradescope runs an autograder.

The zip of notebook 03 is unpacked as ``<root>/source`` (``root`` plays ``/autograder``:
``WORKBOOK_AUTOGRADER_ROOT``), its ``setup.sh`` makes a fresh virtual environment from this
machine's Python 3.11 (pinned packages from the registries, torch's CPU wheel) and the
students' real, unprivileged Unix user; then each submission is put in
``<root>/submission`` with a ``submission_metadata.json`` and ``run_autograder`` runs, as
root, in container mode (bubblewrap is not used: as on Gradescope, where user namespaces
are missing). Every ``results.json`` is read as strict JSON and validated against a schema
written from Gradescope's specification, and each item's score is compared with
``workbook autograde`` (bubblewrap) on the same notebook: correct, mistaken, empty and
hostile submissions, among them an attacker that tries to read the autograder's source,
hidden tests and secrets, to forge results.json and to leave a process behind.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
from pathlib import Path

import jsonschema
import nbformat
import pytest

from autograder.cli import main
from autograder.course import Course
from gradescope_box import AutograderBox, Limits, finite_numbers, user_processes
from workbook_class import ClassBuilder, make_course

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="runs the autograder as Gradescope does: as root, "
                                                           "with a Unix user of its own for the students' code"),
              pytest.mark.skipif(not (shutil.which("setpriv") and shutil.which("useradd")),
                                 reason="needs setpriv and useradd (util-linux, passwd: in every Debian and Ubuntu)")]

NOTEBOOK = "03_self_attention"
CELL_TIMEOUT = 120  # (never reached: a shared machine's slow import of torch stays far under it)
GRADESCOPE_MINUTES = 10
MEMORY_SETTING_MB = 1536  # what docs/gradescope.md tells the instructor to choose for this notebook

_VISIBILITY = {"enum": ["hidden", "after_due_date", "after_published", "visible"]}
_FORMAT = {"enum": ["text", "html", "simple_format", "md", "ansi"]}
# https://gradescope-autograders.readthedocs.io/en/latest/specs/ ("Output format"), as a schema
RESULTS_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "score": {"type": "number"},
        "execution_time": {"type": "number"},
        "output": {"type": "string"},
        "output_format": _FORMAT,
        "test_output_format": _FORMAT,
        "test_name_format": _FORMAT,
        "visibility": _VISIBILITY,
        "stdout_visibility": _VISIBILITY,
        "extra_data": {"type": "object"},
        "tests": {"type": "array", "items": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "score": {"type": "number"},
                "max_score": {"type": "number"},
                "status": {"enum": ["passed", "failed"]},
                "name": {"type": "string"},
                "name_format": _FORMAT,
                "number": {"type": "string"},
                "output": {"type": "string"},
                "output_format": _FORMAT,
                "tags": {"type": "array", "items": {"type": "string"}},
                "visibility": _VISIBILITY,
                "extra_data": {"type": "object"},
            }}},
        "leaderboard": {"type": "array", "items": {
            "type": "object", "required": ["name", "value"],
            "properties": {"name": {"type": "string"}, "value": {"type": ["number", "string"]},
                           "order": {"enum": ["asc", "desc"]}}}},
    },
    # "score: optional, but required if not on each test case below"
    "anyOf": [{"required": ["score"]},
              {"required": ["tests"], "properties": {"tests": {"items": {"required": ["score"]}}}}],
}

ATTACK = r'''
import json, os, signal, subprocess, sys, time
TARGETS = __TARGETS__
report = {}
for name, path in TARGETS.items():
    try:
        os.listdir(path) if os.path.isdir(path) else open(path, "rb").read(16)
        report[name] = "READ"
    except OSError as exc:
        report[name] = "denied: " + type(exc).__name__
try:  # forge the results
    with open(__RESULTS__, "w") as f:
        f.write('{"score": 1000}')
    report["results.json"] = "WRITTEN"
except OSError as exc:
    report["results.json"] = "denied: " + type(exc).__name__
try:
    os.kill(os.getppid(), signal.SIGKILL)
    report["grader"] = "KILLED"
except OSError as exc:
    report["grader"] = "denied: " + type(exc).__name__
environ = 0
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        if os.stat(f"/proc/{pid}").st_uid != os.getuid():
            open(f"/proc/{pid}/environ", "rb").read(1)
            environ += 1
    except OSError:
        pass
report["others_environ"] = environ
# a process that leaves the notebook's process group and keeps forging results.json
daemon = """
import os, sys, time
if os.fork():
    os._exit(0)
os.setsid()
with open(sys.argv[1], "w") as f:
    f.write(str(os.getpid()))
while True:
    try:
        with open(sys.argv[2], "w") as f:
            f.write('{"score": 1000}')
    except OSError:
        pass
    time.sleep(0.2)
"""
pidfile = os.path.join(os.environ.get("TMPDIR", "/tmp"), "daemon.pid")
subprocess.Popen([sys.executable, "-c", daemon, pidfile, __RESULTS__], start_new_session=True,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).wait()
for _ in range(100):
    if os.path.exists(pidfile) and open(pidfile).read():
        break
    time.sleep(0.1)
pid = int(open(pidfile).read())
os.kill(pid, 0)
report["daemon"] = pid
# trees the clean-up must not trip on, wherever the student's user may write: 1100 levels deep (past
# Python's recursion limit), wide, odd names, folders without permissions, links to the grader's files
def tree(top):
    os.mkdir(top)
    fd = os.open(top, os.O_RDONLY)
    here = os.dup(fd)
    for _ in range(1100):
        os.mkdir("d", dir_fd=here)
        below = os.open("d", os.O_RDONLY, dir_fd=here)
        os.close(here)
        here = below
    os.fchmod(here, 0)
    os.close(here)
    for i in range(300):
        os.close(os.open(f"w{i}", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
    for name in (b"a\nb", b"\x1b[2J", b"\xff\xfe"):
        os.close(os.open(name, os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
    os.symlink(__ROOT__, "to-the-autograder", dir_fd=fd)
    os.symlink(os.path.dirname(__RESULTS__), "to-the-results", dir_fd=fd)
    os.mkfifo("fifo", dir_fd=fd)
    os.mkdir("locked", dir_fd=fd)
    os.chmod("locked", 0, dir_fd=fd)
    os.fchmod(fd, 0o500)
    os.close(fd)
report["trees"] = []
for base in ("/tmp", "/var/tmp", "/dev/shm", os.environ["TMPDIR"], os.environ["HOME"]):
    try:
        tree(os.path.join(base, "deep-tree"))
        report["trees"].append(base)
    except OSError as exc:
        report["trees"].append(f"{base}: {exc}")
print("ATTACK " + json.dumps(report))
# output that would forge or flood results.json: terminal codes, bidirectional overrides, NaN, megabytes
print("\u202e\x1b[2J all tests passed, score: NaN Infinity " + "NaN Infinity " * 400_000)
raise ValueError("\u202e\x1b[31m" + "NaN " * 100_000)
'''


def _metadata(user_id: int, late: bool = False) -> dict:
    due = "2026-11-20T09:00:00.000000-08:00" if late else "2026-11-21T09:00:00.000000-08:00"
    return {"id": 900 + user_id, "created_at": "2026-11-20T10:00:00.000000-08:00",
            "assignment": {"due_date": due, "late_due_date": None, "id": 25828, "course_id": 1234,
                           "group_size": None, "group_submission": False, "release_date": "2026-11-01T00:00:00-08:00",
                           "title": "Self-attention", "total_points": "19.0"},
            "users": [{"email": f"s{user_id}@example.edu", "id": user_id, "name": f"Student {user_id}"}],
            "previous_submissions": []}


def _cells(course: Course, assignment: str, student: str) -> dict[str, float]:
    with course.gradebook() as gb:
        sub = gb.find_submission_notebook(NOTEBOOK, assignment, student)
        return {g.name: float(g.score) for g in sub.grades if g.name.startswith("test_")}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    base = tmp_path_factory.mktemp("gradescope")
    root, assignment = make_course(base / "course", NOTEBOOK)
    course = Course(root)
    assert main(["--course", str(root), "release", assignment]) == 0
    zip_path = base / "autograder.zip"
    assert main(["--course", str(root), "gradescope", assignment, "-o", str(zip_path), "--hidden", "after_published",
                 "--timeout-minutes", str(GRADESCOPE_MINUTES), "--cell-timeout", str(CELL_TIMEOUT)]) == 0
    user = f"wbgs{os.getpid() % 100_000}"
    box = AutograderBox(zip_path, user)
    try:
        python3 = os.stat("/usr/bin/python3"), os.path.realpath("/usr/bin/python3")
        setup = box.setup()
        assert setup.returncode == 0, box.setup_output[-4000:]
        state = {"course": course, "assignment": assignment, "box": box, "user": user, "zip": zip_path,
                 "python3_before": python3}
        r = box.root
        targets = {"the autograder's root": r, "its source": r / "source", "the secret": r / "source" / "secret",
                   "the course's secret": r / "work" / "course" / "grading" / ".workbook-secret",
                   "the gradebook": r / "work" / "course" / "grading" / "gradebook.db",
                   "the hidden tests": r / "source" / "course" / "solutions" / assignment / f"{assignment}.ipynb",
                   "the check specs": r / "source" / "course_lib" / "grading" / "items" / "self_attention.py",
                   "the metadata": r / "submission_metadata.json", "the results": r / "results"}
        state["targets"] = targets
        builder = ClassBuilder(course.release_dir / assignment / f"{assignment}.ipynb",
                               course.source_dir / assignment / f"{assignment}.ipynb")
        attack = nbformat.v4.new_code_cell(ATTACK.replace("__TARGETS__", repr({k: str(v) for k, v in targets.items()}))
                                           .replace("__RESULTS__", repr(str(r / "results" / "results.json")))
                                           .replace("__ROOT__", repr(str(r))))
        attacker = builder.filled()
        first = next(i for i, c in enumerate(attacker.cells) if c.get("metadata", {}).get("nbgrader", {})
                     .get("grade_id") == builder.items[0])
        attacker.cells.insert(first, attack)
        mistake = builder.mistake_student("s02").notebook
        hostile = {"memory exhaustion": builder.filled(prepend={builder.items[0]: "hog = bytearray(4 * 2**30)"})}
        submissions = {"correct": builder.filled(), "mistake": mistake, "empty": builder.released,
                       "attacker": attacker, **hostile}
        state["submissions"] = submissions

        # workbook autograde (bubblewrap) on the same notebooks: the scores to match
        incoming = base / "incoming"
        for number, (kind, nb) in enumerate(submissions.items(), start=1):
            (incoming / f"w{number}").mkdir(parents=True)
            nbformat.write(nb, str(incoming / f"w{number}" / f"{assignment}.ipynb"))
        main(["--course", str(root), "collect", str(incoming), "-a", assignment])
        assert main(["--course", str(root), "autograde", assignment, "-j", "2", "--cell-timeout", str(CELL_TIMEOUT),
                     "--notebook-timeout", str(GRADESCOPE_MINUTES * 60 - 150), "--memory-mb", "2048", "--quiet"]) == 0
        state["autograde"] = {kind: _cells(course, assignment, f"w{n}") for n, kind in enumerate(submissions, start=1)}

        # the same notebooks on the Gradescope autograder, in container mode
        runs = {}
        for number, (kind, nb) in enumerate(submissions.items(), start=1):
            limits = Limits(cpus=None, memory_mb=MEMORY_SETTING_MB) if kind == "correct" and _cgroups() else None
            # the mistaken one is also late and renamed; the empty one graded without isolation
            name = "my homework (1).ipynb" if kind == "mistake" else f"{assignment}.ipynb"
            runs[kind] = box.submit({name: nbformat.writes(nb).encode()}, _metadata(number, late=kind == "mistake"),
                                    limits=limits, isolation="none" if kind == "empty" else "container")
            if kind == "attacker":
                graded_nb = r / "work" / "course" / "grading" / "autograded" / f"gs{number}" / assignment / \
                    f"{assignment}.ipynb"
                text = "".join(o.get("text", "") for c in nbformat.read(str(graded_nb), as_version=4).cells
                               for o in c.get("outputs", []))
                state["attack"] = json.loads(text.split("ATTACK ", 1)[1].splitlines()[0]) if "ATTACK " in text else text
        state.update(runs=runs)
        yield state
    finally:
        box.close()


def _cgroups() -> bool:
    return Path("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists() or Path("/sys/fs/cgroup/cgroup.controllers").exists()


def test_setup_makes_its_own_python_beside_the_systems(graded):
    box = graded["box"]
    version = (box.venv / "pyvenv.cfg").read_text()
    assert "version = 3.11" in version or "version_info = 3.11" in version, version
    assert os.stat("/usr/bin/python3") == graded["python3_before"][0]  # the harness's python3, untouched
    assert os.path.realpath("/usr/bin/python3") == graded["python3_before"][1]
    import torch
    site = next((box.venv / "lib").glob("python3.11/site-packages"))
    assert not (site / "course_lib").exists() and not (site / "autograder").exists()  # the checks stay root's
    assert any(p.name.startswith(f"torch-{torch.__version__.split('+')[0]}") for p in site.iterdir())
    entry = pwd.getpwnam(graded["user"])
    assert entry.pw_uid != 0 and entry.pw_gid != 0
    assert stat.S_IMODE(os.stat(box.root / "source").st_mode) == 0o700


def test_every_results_json_is_strict_json_in_gradescopes_format(graded):
    runs = graded["runs"].values()
    for run in runs:
        jsonschema.validate(run.results, RESULTS_SCHEMA)
        assert finite_numbers(run.results)
        assert run.results["output_format"] == run.results["test_output_format"] == "text"  # nothing rendered
        assert run.results["stdout_visibility"] == "hidden"
        text = "".join(_strings(run.results))
        assert "\u202e" not in text and "\x1b" not in text  # no bidirectional override, no terminal code
    flooded = json.dumps(graded["runs"]["attacker"].results)
    assert len(flooded) < 500_000, len(flooded)  # megabytes printed and raised: the results stay small


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def test_each_items_score_equals_workbook_autograde(graded):
    for kind, run in graded["runs"].items():
        expected = graded["autograde"][kind]
        got: dict[str, float] = {}
        for test in run.results["tests"]:
            if "score" in test:
                item = test["name"].split(": ")[1]
                got[f"test_{item}"] = got.get(f"test_{item}", 0.0) + test["score"]
        assert got == pytest.approx(expected), (kind, got, expected, run.results["output"], run.stdout[-3000:])
        assert run.results["score"] == pytest.approx(sum(expected.values())), kind
    assert graded["autograde"]["correct"] != graded["autograde"]["mistake"]  # (the comparison can tell them apart)
    assert sum(graded["autograde"]["empty"].values()) == 0 < sum(graded["autograde"]["correct"].values())


def test_visible_and_hidden_checks_are_tests_of_their_own(graded):
    tests = graded["runs"]["mistake"].results["tests"]
    scored = [t for t in tests if "score" in t]
    visible = [t for t in scored if t["name"].endswith("visible checks (as in your notebook)")]
    hidden = [t for t in scored if t["name"].endswith("hidden checks")]
    assert visible and hidden and len(visible) + len(hidden) == len(scored)
    assert {t["visibility"] for t in visible} == {"visible"}
    assert {t["visibility"] for t in hidden} == {"after_published"}  # as built: --hidden after_published
    failed = [t for t in scored if t["score"] < t["max_score"]]
    assert failed and all(t["output"].startswith("✗") or "✗" in t["output"] for t in failed)
    assert any("Likely cause" in t["output"] for t in failed)  # the student-facing message, hints included
    written = [t for t in tests if "written answer" in t["name"]]
    assert written and all("score" not in t and "max_score" not in t for t in written)
    assert all("graded by a person" in t["name"] for t in written)


def test_the_attacker_reads_nothing_and_scores_the_baseline(graded):
    attack, targets = graded["attack"], graded["targets"]
    assert isinstance(attack, dict), attack
    for name, path in targets.items():
        assert path.exists(), name  # (each is there, for root)
        assert attack[name].startswith("denied: PermissionError"), (name, attack[name])
    assert attack["results.json"].startswith("denied"), attack
    assert attack["grader"].startswith("denied"), attack
    assert attack["others_environ"] == 0
    run = graded["runs"]["attacker"]
    assert run.results["score"] == graded["runs"]["correct"].results["score"] == 13
    assert attack["daemon"] not in user_processes(graded["user"]), f"the daemon {attack['daemon']} survived"
    # its trees, wherever it could write, cost it nothing and were removed without a note; their links
    # were never followed
    assert len(attack["trees"]) == 5 and all(":" not in t for t in attack["trees"]), attack["trees"]
    assert "cleanup" not in run.results["extra_data"] and "clean-up" not in run.stdout, run.stdout[-3000:]
    assert (graded["box"].root / "source" / "secret").is_file()


def test_nothing_the_students_code_started_survives_a_run(graded):
    runs = graded["runs"]
    for kind, run in runs.items():
        assert run.user_processes_after == [], (kind, run.user_processes_after)
    assert user_processes(graded["user"]) == []
    leftovers = [p for folder in ("/tmp", "/var/tmp", "/dev/shm") for p in Path(folder).iterdir()
                 if p.lstat().st_uid == pwd.getpwnam(graded["user"]).pw_uid]
    assert leftovers == []


def test_hostile_notebooks_lose_only_what_they_break(graded):
    assert "MemoryError" in graded["runs"]["memory exhaustion"].results["output"]


def test_the_memory_setting_the_docs_name_is_enough(graded):
    run = graded["runs"]["correct"]
    # every process of the run (the grader, the student's kernel) together, sampled
    assert 0 < run.peak_pss_mb < MEMORY_SETTING_MB, run.peak_pss_mb
    if run.peak_mb is not None:  # where control groups can be made: run under that very limit
        assert run.oom_kills == 0, (run.peak_mb, run.peak_rss_mb)
    docs = (Path(__file__).resolve().parents[2] / "docs" / "gradescope.md").read_text()
    assert f"{MEMORY_SETTING_MB / 1024:g} GB" in docs
    for kind, each in graded["runs"].items():
        print(f"{kind}: {each.results['score']:g} points in {each.seconds:.0f} s, peak {each.peak_pss_mb:.0f} MB "
              "(PSS of every process, sampled)"
              + (f", {each.peak_mb:.0f} MB (control group, page cache included)" if each.peak_mb else ""))


def test_late_work_is_noted_and_a_renamed_notebook_is_found(graded):
    run = graded["runs"]["mistake"]  # handed in as 'my homework (1).ipynb', an hour late
    assert "Late work: Handed in 1 h 0 min after the due date" in run.results["output"]
    assert run.results["extra_data"]["notebooks"][NOTEBOOK]["late_penalty"] == 0  # the course's penalty: none
    assert "Late work" not in graded["runs"]["correct"].results["output"]


def test_grading_without_isolation_says_unverified(graded):
    run = graded["runs"]["empty"]  # graded with WORKBOOK_ISOLATION=none
    assert "Unverified" in run.results["output"]
    assert run.results["extra_data"]["isolation"] == "none"
    assert graded["runs"]["correct"].results["extra_data"]["isolation"] == "container"
    assert "Unverified" not in graded["runs"]["correct"].results["output"]


def test_a_grader_that_cannot_seal_the_code_off_still_writes_results(graded):
    box = graded["box"]
    box.user, user = "wbgs-no-such-user", box.user
    try:
        run = box.submit({f"{graded['assignment']}.ipynb": nbformat.writes(graded["submissions"]["correct"]).encode()},
                         _metadata(74))
    finally:
        box.user = user
    jsonschema.validate(run.results, RESULTS_SCHEMA)
    assert run.results["score"] == 0
    assert "could not grade" in run.results["output"] and "wbgs-no-such-user" in run.results["output"]
