"""The sandbox one submission runs in, seen from inside: one notebook of probes graded by
the real supervisor (bubblewrap, the runner, the plan and the judgement), then checked
from outside, both ways a notebook is sealed (a fresh sandbox; as root, also a child forked from
a pre-imported zygote). What one run could leave for the next is in tests/grading/test_seal.py,
the class-level attacks in tests/grading/test_hostile_class.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from autograder.sealing import sandbox
from autograder.sealing.course_copy import build_course_copy
from autograder.sealing.zygote import Zygotes
from autograder.pipeline.worker import grade_notebook
from conftest import ROOT
from hostile_cells import SWALLOWS

pytestmark = pytest.mark.slow

# the ways a notebook is sealed here: a child of a zygote needs the grader to be root
WAYS = ["fresh"] + (["zygote"] if os.geteuid() == 0 else [])


@pytest.fixture(scope="module")
def zygotes(tmp_path_factory):
    folder = tmp_path_factory.mktemp("zygotes")
    folder.chmod(0o711)
    kept = Zygotes(folder)
    yield kept
    kept.close()


def _sealed(way: str, zygotes: Zygotes) -> Zygotes | None:
    return zygotes if way == "zygote" else None

MARKER = "SANDBOX-PROBE-DAEMON-7f3a"

PROBES = r'''
import json, os, socket, subprocess, sys
facts = {"uid": os.getuid(), "cwd": os.getcwd(), "pid": os.getpid(), "home": os.listdir(os.path.expanduser("~")),
         "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit())}
facts["repo_visible"] = [n for n in ("course_lib", "solutions", "notebooks", "nbgrader_config.py", "grading")
                         if os.path.exists(os.path.join(REPO, n))]
facts["course_lib"] = __import__("course_lib").__file__
try:
    import course_lib.grading.items
    facts["items_importable"] = True
except ImportError:
    facts["items_importable"] = False
import course_lib.attention as att
facts["reference_is_stub"] = hasattr(att.causal_mask, "__workbook_reference__")
try:
    open("/opt/course/course_lib/attention.py", "a").write("# hacked\n")
    facts["course_writable"] = True
except OSError:
    facts["course_writable"] = False
try:
    socket.create_connection(("127.0.0.1", PORT), timeout=2).close()
    facts["host_port_reached"] = True
except OSError:
    facts["host_port_reached"] = False
try:
    socket.create_connection(("1.1.1.1", 53), timeout=2).close()
    facts["internet"] = True
except OSError:
    facts["internet"] = False
written = 0
try:
    with open("big", "wb") as f:
        for _ in range(200):
            f.write(b"\0" * 2**20)
            written += 1
except OSError:
    pass
facts["written_mb"] = written
os.remove("big")
pids = []
try:
    for _ in range(100):
        pid = os.fork()
        if pid == 0:
            import time; time.sleep(30); os._exit(0)
        pids.append(pid)
except OSError:
    pass
facts["forked"] = len(pids)
for pid in pids:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
try:
    hog = bytearray(3 * 2**30)
    facts["memory_hog"] = "allocated"
except MemoryError:
    facts["memory_hog"] = "MemoryError"
subprocess.Popen(["setsid", sys.executable, "-c", "import time; time.sleep(120)  # " + MARKER],
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
print("FACTS " + json.dumps(facts))
'''


@pytest.fixture(scope="module", params=WAYS)
def probed(request, tmp_path_factory, zygotes):
    sandbox.check_available()
    tmp = tmp_path_factory.mktemp("sandbox")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    released = nbformat.read(str(ROOT / "notebooks" / "03_self_attention" / "03_self_attention.ipynb"), as_version=4)
    setup = next(c for c in released.cells if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "setup")
    test = next(c for c in released.cells if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "test_causal_mask")
    solution = nbformat.v4.new_code_cell("def causal_mask(T, device=None):\n"
                                         "    return torch.ones(T, T, dtype=torch.bool, device=device).tril()\n")
    solution.metadata["nbgrader"] = {"grade": False, "solution": True, "locked": False, "grade_id": "causal_mask",
                                     "schema_version": 3}
    probe = nbformat.v4.new_code_cell(PROBES.replace("REPO", repr(str(ROOT))).replace("PORT", str(port))
                                      .replace("MARKER", repr(MARKER)))
    nb = nbformat.v4.new_notebook(cells=[setup, solution, probe, test])
    copy = build_course_copy(tmp / "course", ["causal_mask"])
    limits = sandbox.Limits(cell_timeout=60, notebook_timeout=240, memory_mb=2048, disk_mb=64, max_processes=24)
    job = {"notebook": nbformat.writes(nb), "limits": limits.__dict__.copy(), "salts": {"causal_mask": 99},
           "extra_files": []}
    try:
        result = grade_notebook(job, copy, tmp / "job", zygotes=_sealed(request.param, zygotes))
    finally:
        server.close()
    assert result["seal"]["how"].startswith("forked" if request.param == "zygote" else "a fresh sandbox")
    out = json.loads(result["notebook"])["cells"][2]["outputs"]
    text = "".join(o.get("text", "") for o in out)
    facts = json.loads(text.split("FACTS ", 1)[1].splitlines()[0]) if "FACTS " in text else {"outputs": out}
    return result, facts


def test_the_submission_is_graded_in_the_sandbox(probed):
    result, _ = probed
    assert result["cells"] == [{"grade_id": "test_causal_mask", "score": 2.0, "max_score": 2.0, "error": ""}]


def test_the_sandbox_sees_nothing_of_the_course_and_no_network(probed):
    _, facts = probed
    assert facts["cwd"] == sandbox.WORK_DIR and set(facts["home"]) <= {".ipython", ".cache"}
    assert facts["uid"] != 0
    assert facts["repo_visible"] == []  # (the virtual environment inside it is visible, read-only)
    assert facts["course_lib"].startswith(sandbox.COURSE_DIR)
    assert not facts["items_importable"]  # no check specs, hidden tests or mistakes inside
    assert facts["reference_is_stub"]
    assert not facts["course_writable"]
    assert not facts["host_port_reached"] and not facts["internet"]
    assert max(facts["pids"]) < 100  # its own process namespace


def test_the_sandbox_caps_disk_processes_and_memory(probed):
    _, facts = probed
    assert facts["written_mb"] <= 64  # the working folder is a 64 MB tmpfs (disk_mb)
    assert facts["forked"] < 24
    assert facts["memory_hog"] == "MemoryError"


def test_nothing_outlives_the_sandbox(probed):
    time.sleep(1)
    alive = subprocess.run(["pgrep", "-f", MARKER], capture_output=True, text=True).stdout.split()
    assert alive == [], f"processes left behind: {alive}"


def test_without_bubblewrap_grading_refuses_with_the_fix(monkeypatch):
    sandbox.check_available.cache_clear()
    monkeypatch.setattr(sandbox, "_bwrap", lambda: None)
    try:
        with pytest.raises(sandbox.SandboxUnavailable, match="apt-get install bubblewrap"):
            sandbox.check_available()
    finally:
        sandbox.check_available.cache_clear()


def test_the_cli_refuses_without_a_sandbox_and_names_the_escape_hatch(tmp_path):
    (tmp_path / "nbgrader_config.py").write_text((ROOT / "nbgrader_config.py").read_text())
    sub = tmp_path / "grading" / "submitted" / "s1" / "03_self_attention"
    sub.mkdir(parents=True)
    env = dict(os.environ, PATH=str(Path(sys.executable).parent), PYTHONPATH=str(ROOT))
    code = ("import autograder.sealing.sandbox as s; s._bwrap = lambda: None; "
            "from autograder.cli import main; raise SystemExit(main(['--course', %r, 'autograde', '03_self_attention']))"
            % str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2
    assert "bubblewrap" in proc.stderr and "--unsafe-no-sandbox" in proc.stderr


@pytest.mark.timeout(600)  # a guard against a grader that never returns, not a measure of its speed
@pytest.mark.parametrize("way", WAYS)
def test_a_notebook_that_floods_the_grader_still_stops_at_its_time_limit(tmp_path, way, zygotes):
    """A cell that ignores interrupts and keeps the grader's socket busy with messages is
    stopped at the notebook's time limit (the deadlines are checked on every message): the
    grader records that it stopped the notebook there, before the flood would have ended by
    itself (after 120 s, with a line of its own)."""
    flood = nbformat.v4.new_code_cell(
        "import signal, struct, time, workbook_runner\n"
        "from course_lib.grading.answer.wire import encode\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "frame = encode({'type': 'hello'}, kind='message')\n"
        "burst = (struct.pack('<I', len(frame)) + frame) * 2000\n"
        "t = time.time()\n"
        "while time.time() - t < 120:\n"
        "    workbook_runner._CHANNEL.sock.sendall(burst)\n"
        "print('the flood ended by itself')\n")
    nb = nbformat.v4.new_notebook(cells=[flood])
    copy = build_course_copy(tmp_path / "course", [])
    # the notebook's limit (10 s from the start) comes before the cell's (5 s + the grace, from the cell's start)
    limits = sandbox.Limits(cell_timeout=5, notebook_timeout=10, memory_mb=2048)
    job = {"notebook": nbformat.writes(nb), "limits": limits.__dict__.copy(), "salts": {}, "extra_files": []}
    result = grade_notebook(job, copy, tmp_path / "job", zygotes=_sealed(way, zygotes))
    stopped = [p for p in result["problems"] if p["kind"] == "notebook_timeout"]
    assert stopped and "the notebook time limit (10 s) was reached" in stopped[0]["message"], result["problems"]
    outputs = nbformat.reads(result["notebook"], as_version=4).cells[0].outputs
    assert not any("the flood ended by itself" in o.get("text", "") for o in outputs), outputs


def test_the_address_space_measured_for_the_batch_is_the_one_the_sandbox_gets(tmp_path, monkeypatch):
    """The dispatcher measures what a fresh Python maps once per batch and hands it in each job
    (each worker measured it again before its first sandbox: a Python importing torch, ~2.5 CPU-s).
    The sandbox's address-space limit is that floor plus ``memory_mb``: torch imports under it (the
    limit alone, 512 MB, is below what a Python with torch maps), a 1.5 GB allocation does not."""
    floor = sandbox.python_address_space_mb()

    def measured_again():
        raise AssertionError("the worker measured the address space again")
    monkeypatch.setattr(sandbox, "python_address_space_mb", measured_again)
    cells = [nbformat.v4.new_code_cell("import torch\nprint('torch', torch.ones(2).sum().item())"),
             nbformat.v4.new_code_cell("try:\n    block = bytearray(1536 * 2**20)\n    print('allocated')\n"
                                       "except MemoryError:\n    print('MemoryError')")]
    copy = build_course_copy(tmp_path / "course", [])
    limits = sandbox.Limits(cell_timeout=60, notebook_timeout=120, memory_mb=512)
    job = {"notebook": nbformat.writes(nbformat.v4.new_notebook(cells=cells)), "limits": limits.__dict__.copy(),
           "salts": {}, "extra_files": [], "address_space_mb": floor}
    result = grade_notebook(job, copy, tmp_path / "job")
    printed = ["".join(o.get("text", "") for o in c.outputs) for c in nbformat.reads(result["notebook"], as_version=4).cells]
    assert printed == ["torch 2.0\n", "MemoryError\n"], (printed, result["problems"])


def test_the_sealed_notebook_runs_in_full_precision(tmp_path):
    """The runner runs a submission's cells with TF32 off (course_lib.device.full_precision), as
    the grader computes the references: cuDNN's own default (TF32 on) does not reach them."""
    probe = nbformat.v4.new_code_cell(
        "import torch\n"
        "print('PRECISION', torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,\n"
        "      torch.get_float32_matmul_precision())\n")
    nb = nbformat.v4.new_notebook(cells=[probe])
    copy = build_course_copy(tmp_path / "course", [])
    limits = sandbox.Limits(cell_timeout=60, notebook_timeout=120, memory_mb=2048)
    job = {"notebook": nbformat.writes(nb), "limits": limits.__dict__.copy(), "salts": {}, "extra_files": []}
    result = grade_notebook(job, copy, tmp_path / "job")
    printed = "".join(o.get("text", "") for o in nbformat.reads(result["notebook"], as_version=4).cells[0].outputs)
    assert "PRECISION False False highest" in printed, (printed, result["problems"])


STARVED = r'''
import os
os.sched_setaffinity(0, {@CPU@})  # on the CPU the busy processes outside the sandbox hold
while True:
    pass
'''

# The cell's own processes keep its runner off the CPU (the run uses all of its share): the
# notebook's doing, which must not stretch its limit.
STARVES_ITSELF = r'''
import os, signal
for _ in range(8):
    if os.fork() == 0:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        while True:
            pass
''' + SWALLOWS

BUSY = """
import os, sys, time
os.sched_setaffinity(0, {int(sys.argv[1])})
print("busy", flush=True)
end = time.time() + 60
while time.time() < end:
    pass
"""


class _BusyMachine:
    """Twenty busy processes outside any sandbox, each in a session of its own, on one CPU: a
    grading machine busy with other work, which keeps a run pinned there waiting for the CPU.
    Each is on that CPU before the run starts: a run forked from a zygote starts at once, and some
    could still be starting when its cell's limit passed."""

    def __init__(self, cpu: int) -> None:
        self.processes = [subprocess.Popen([sys.executable, "-c", BUSY, str(cpu)], start_new_session=True,
                                           stdout=subprocess.PIPE, text=True) for _ in range(20)]
        if not all(process.stdout.readline() == "busy\n" for process in self.processes):
            self.__exit__()
            raise AssertionError("a busy process did not start")

    def __enter__(self) -> "_BusyMachine":
        return self

    def __exit__(self, *exc) -> None:
        for process in self.processes:
            process.kill()
            process.wait()
            process.stdout.close()


def _graded(tmp_path: Path, name: str, sources: list[str], limits: sandbox.Limits,
            zygotes: Zygotes | None = None) -> tuple[dict, list]:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    copy = build_course_copy(tmp_path / name / "course", [])
    job = {"notebook": nbformat.writes(nb), "limits": limits.__dict__.copy(), "salts": {}, "extra_files": []}
    result = grade_notebook(job, copy, tmp_path / name / "job", zygotes=zygotes)
    return result, nbformat.reads(result["notebook"], as_version=4).cells


@pytest.mark.timeout(600)  # a guard against a grader that never returns, not a measure of its speed
@pytest.mark.parametrize("way", WAYS)
def test_a_cell_kept_off_the_cpu_after_its_limit_still_gets_its_grace(tmp_path, monkeypatch, way, zygotes):
    """A busy grading machine can keep a sandbox waiting for a CPU right when its cell's limit
    passes: the interrupt is then handled late, through no fault of the student's. The grace
    (here 1 s) grows by the time the runner waited for a CPU the run was denied, so the cell
    ends as interrupted and the notebook goes on (it used to be stopped as "did not stop when
    interrupted", every later item 0: the CI run of the Python 3.12 suite saw it twice). A cell
    that swallows the interrupt while it has the CPU is still stopped."""
    from autograder.pipeline import run
    monkeypatch.setattr(run, "GRACE", 1.0)
    limits = sandbox.Limits(cell_timeout=2, notebook_timeout=150, memory_mb=2048)
    cpu = min(os.sched_getaffinity(0))
    with _BusyMachine(cpu):
        result, cells = _graded(tmp_path, "starved", [STARVED.replace("@CPU@", str(cpu)),
                                                      "print('the next cell ran')"], limits, _sealed(way, zygotes))
    kinds = [(p["kind"], p["message"]) for p in result["problems"]]
    assert any(k == "cell_timeout" and "was interrupted" in m for k, m in kinds), kinds
    assert not any("did not stop when interrupted" in m for _, m in kinds), kinds
    assert "the next cell ran" in "".join(o.get("text", "") for o in cells[1].outputs), kinds

    result, cells = _graded(tmp_path, "swallows", [SWALLOWS, "print('the next cell ran')"], limits,
                            _sealed(way, zygotes))
    stopped = [p for p in result["problems"] if p["kind"] == "cell_timeout"]
    assert stopped and "did not stop when interrupted" in stopped[0]["message"], result["problems"]
    assert not any(p["kind"] == "notebook_timeout" for p in result["problems"]), result["problems"]
    assert not any("the next cell ran" in o.get("text", "") for o in cells[1].outputs)


# The cell lowers its own runner's priority, on the CPU the busy processes hold, and swallows
# its interrupt: the runner then waits for a CPU whatever the machine does.
LOWERS_ITS_PRIORITY = r'''
import os
os.sched_setaffinity(0, {@CPU@})
os.nice(19)
''' + SWALLOWS


@pytest.mark.timeout(600)
@pytest.mark.parametrize("way", WAYS)
def test_a_runner_that_lowers_its_own_priority_gets_no_more_grace(tmp_path, monkeypatch, way, zygotes):
    """A runner at nice 19 beside busy processes waits for a CPU nearly all the time: its own
    doing, which adds nothing to the grace (it used to add up to STARVED_MAX to each cell that
    swallowed its interrupt). A thread cannot raise its priority again without privilege, so
    from then on none of its waits count."""
    from autograder.pipeline import run
    monkeypatch.setattr(run, "GRACE", 1.0)
    limits = sandbox.Limits(cell_timeout=2, notebook_timeout=150, memory_mb=2048)
    cpu = min(os.sched_getaffinity(0))
    with _BusyMachine(cpu):
        result, _ = _graded(tmp_path, "niced", [LOWERS_ITS_PRIORITY.replace("@CPU@", str(cpu))], limits,
                            _sealed(way, zygotes))
    stopped = [p["message"] for p in result["problems"] if p["kind"] == "cell_timeout"]
    assert stopped and "did not stop when interrupted" in stopped[0], result["problems"]
    assert "while its runner waited for a CPU" not in stopped[0], stopped


def _stopped_after(result: dict) -> float:
    """How long after its limit the grader stopped a cell that swallowed its interrupt (its problem says)."""
    stopped = [p["message"] for p in result["problems"] if p["kind"] == "cell_timeout"]
    assert stopped and "did not stop when interrupted" in stopped[0], result["problems"]
    return float(stopped[0].split("(stopped ", 1)[1].split(" s after", 1)[0])


@pytest.mark.timeout(600)
@pytest.mark.parametrize("way", WAYS)
def test_a_cell_that_keeps_its_own_runner_waiting_gets_no_more_grace(tmp_path, monkeypatch, way, zygotes):
    """Eight busy processes of the cell's own, beside a runner that swallows its interrupt: the
    runner waits for a CPU its own run holds, which adds nothing to the grace (it used to add
    all of STARVED_MAX to every cell: here 16 s, in grading 60). Stopped as late after its limit
    as the same cell without them, give or take the grace and half of STARVED_MAX: on a loaded
    machine the run does not get all of its share, and what it is denied is added (2.6 s seen
    beside another test's sandboxes)."""
    from autograder.pipeline import run
    monkeypatch.setattr(run, "GRACE", 2.0)
    monkeypatch.setattr(run, "STARVED_MAX", 16.0)
    limits = sandbox.Limits(cell_timeout=2, notebook_timeout=120, memory_mb=2048)
    alone = _stopped_after(_graded(tmp_path, "alone", [SWALLOWS], limits, _sealed(way, zygotes))[0])
    itself = _stopped_after(_graded(tmp_path, "itself", [STARVES_ITSELF], limits, _sealed(way, zygotes))[0])
    assert itself < alone + run.GRACE + run.STARVED_MAX / 2, \
        f"stopped {alone:.1f} s after its limit alone, {itself:.1f} s with its own processes"
