"""The seal between one student's run and the next, attacked through the real grader
(autograder.pipeline.worker.grade_notebook: the seal, the runner, the plans, the judgement), both
ways a notebook is sealed as root: forked from the worker's pre-imported zygote, and in a fresh
bubblewrap sandbox of its own. One worker slot's user grades every notebook here, one after the
other, as a grading worker does.

- what the kernel offers a sealed process: new (user) namespaces, setns, mounts, keyrings,
  tracing, other processes' memory, BPF, io_uring, userfaultfd, perf events, personality
  changes, each refused with the errno programs expect, in the runner and in any process it
  starts;
- a key left in the slot user's keyring (planted by the test, as that user) is gone before the
  next student's first cell, and a notebook cannot plant one for the next;
- what one run leaves (files in /tmp, the home and /dev/shm, System V shared memory, an
  abstract socket and a pty held by a detached daemon, module state, the random generators'
  state) never reaches the next: each run sees a pristine world and draws other numbers;
- a forked run cannot reach its zygote or another run (no other process in sight, kill(-1) and
  signals to its namespace's PID 1 change nothing, no descriptor but its own channel);
- the memory limit holds for a forked run though most of its pages are the zygote's.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import nbformat
import pytest

from autograder.pipeline.worker import grade_notebook
from autograder.sealing import sandbox
from autograder.sealing.course_copy import build_course_copy
from autograder.sealing.zygote import Zygotes

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="the zygote and the slot users need the grader to be root")]

UID = sandbox.SANDBOX_UID_BASE + 4321  # the worker slot's user: every run of this file
WAYS = ("zygote", "fresh")
MARKER = "SEAL-PROBE-DAEMON-5c1e"


@pytest.fixture(scope="module")
def seal(tmp_path_factory):
    sandbox.check_available()
    tmp = tmp_path_factory.mktemp("seal")
    tmp.chmod(0o711)
    zygotes = Zygotes(tmp / "zygotes")
    state = {"copy": build_course_copy(tmp / "course", []), "zygotes": zygotes, "tmp": tmp, "n": 0}
    yield state
    zygotes.close()


def graded(seal: dict, way: str, sources: list[str], **limits) -> tuple[dict, list[str]]:
    """Grade a notebook of ``sources`` on the slot's user, ``way`` sealed; its result and what
    each cell printed."""
    seal["n"] += 1
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    chosen = dict(cell_timeout=60, notebook_timeout=240, memory_mb=2048)
    chosen.update(limits)
    job = {"notebook": nbformat.writes(nb), "limits": sandbox.Limits(**chosen).__dict__.copy(), "salts": {},
           "extra_files": [], "job_id": f"seal-{seal['n']}"}
    result = grade_notebook(job, seal["copy"], seal["tmp"] / f"job-{seal['n']}", uid=UID,
                            zygotes=seal["zygotes"] if way == "zygote" else None)
    assert not result.get("crash"), result
    expected = "forked from a pre-imported zygote" if way == "zygote" else "a fresh sandbox per notebook"
    assert result["seal"]["how"].startswith(expected), result["seal"]
    cells = nbformat.reads(result["notebook"], as_version=4).cells
    return result, ["".join(o.get("text", "") + o.get("evalue", "") for o in c.outputs) for c in cells]


def facts(printed: str) -> dict:
    assert "FACTS " in printed, printed
    return json.loads(printed.split("FACTS ", 1)[1].splitlines()[0])


SYSCALLS = r'''
import ctypes, errno, json, os, subprocess, sys
import pyseccomp
libc = ctypes.CDLL(None, use_errno=True)
def call(name, *args):
    number = pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name)
    done = libc.syscall(number, *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    return "ok" if done >= 0 else errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
got = {
    "unshare(CLONE_NEWUSER)": call("unshare", 0x10000000),
    "unshare(CLONE_NEWNET)": call("unshare", 0x40000000),
    "clone(CLONE_NEWUSER)": call("clone", 0x10000000 | 17, 0, 0, 0, 0),
    "clone3": call("clone3", 0, 0),
    "setns": call("setns", 0, 0),
    "mount": call("mount", b"none", b"/tmp", b"tmpfs", 0, 0),
    "umount2": call("umount2", b"/tmp", 0),
    "pivot_root": call("pivot_root", b"/tmp", b"/tmp"),
    "open_tree": call("open_tree", -100, b"/tmp", 0),
    "keyctl": call("keyctl", 0, -4, 0),
    "add_key": call("add_key", b"user", b"seal-plant", b"secret", 6, -4),
    "request_key": call("request_key", b"user", b"seal-plant", 0, 0),
    "ptrace(PTRACE_TRACEME)": call("ptrace", 0, 0, 0, 0),
    "process_vm_readv": call("process_vm_readv", 1, 0, 0, 0, 0, 0),
    "bpf": call("bpf", 0, 0, 0),
    "io_uring_setup": call("io_uring_setup", 1, 0),
    "userfaultfd": call("userfaultfd", 0),
    "perf_event_open": call("perf_event_open", 0, 0, -1, -1, 0),
    "personality(ADDR_NO_RANDOMIZE)": call("personality", 0x0040000),
    "personality(query)": call("personality", 0xFFFFFFFF),
}
status = {k: (v.split() or [""])[0] for k, v in (l.split(":", 1) for l in open("/proc/self/status") if ":" in l)}
got["Seccomp"], got["NoNewPrivs"], got["CapEff"] = status["Seccomp"], status["NoNewPrivs"], status["CapEff"]
child = subprocess.run(["unshare", "--user", "true"], capture_output=True, text=True)  # util-linux's, a new process
got["child unshare(CLONE_NEWUSER)"] = "ok" if child.returncode == 0 else child.stderr.strip()
print("FACTS " + json.dumps(got))
'''

REFUSED = {"unshare(CLONE_NEWUSER)": "EPERM", "unshare(CLONE_NEWNET)": "EPERM", "clone(CLONE_NEWUSER)": "EPERM",
           "clone3": "ENOSYS", "setns": "EPERM", "mount": "EPERM", "umount2": "EPERM", "pivot_root": "EPERM",
           "open_tree": "EPERM", "keyctl": "EPERM", "add_key": "EPERM", "request_key": "EPERM",
           "ptrace(PTRACE_TRACEME)": "EPERM", "process_vm_readv": "EPERM", "bpf": "EPERM", "io_uring_setup": "ENOSYS",
           "userfaultfd": "EPERM", "perf_event_open": "EPERM", "personality(ADDR_NO_RANDOMIZE)": "EPERM",
           "personality(query)": "ok", "Seccomp": "2", "NoNewPrivs": "1", "CapEff": "0000000000000000"}


@pytest.mark.parametrize("way", WAYS)
def test_the_kernel_refuses_what_a_notebook_never_needs(seal, way):
    result, printed = graded(seal, way, [SYSCALLS])
    got = facts(printed[0])
    assert {k: got[k] for k in REFUSED} == REFUSED
    assert "Operation not permitted" in got["child unshare(CLONE_NEWUSER)"]  # in a process it starts too
    assert result["seal"]["syscall_filter"] == "on" and result["seal"]["Seccomp"] == "2"


def _as_slot_user(code: str) -> str:
    """Run ``code`` (Python, with ``keyctl(*args)`` and ``add_key(...)`` defined) as the slot's
    user, outside any seal, the way a notebook run on that user would: its output."""
    prelude = ("import ctypes, errno, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
               "import pyseccomp\nnr = lambda n: pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, n)\n")
    out = subprocess.run(["setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups", os.sys.executable, "-c",
                          prelude + code], capture_output=True, text=True, timeout=60, cwd="/")
    assert out.returncode == 0, out.stderr
    return out.stdout


PLANT_KEY = ("k = libc.syscall(nr('add_key'), b'user', b'seal-planted-key', b'the last student', 16, "
             "ctypes.c_long(-4))\nprint('planted' if k > 0 else errno.errorcode[ctypes.get_errno()])\n")
FIND_KEY = ("k = libc.syscall(nr('keyctl'), 10, ctypes.c_long(-4), b'user', b'seal-planted-key', 0)\n"  # KEYCTL_SEARCH
            "print('found' if k > 0 else 'none')\n")
READ_KEYS = r'''
import json
keys = open("/proc/keys").read()
print("FACTS " + json.dumps({"seen": "seal-planted-key" in keys or "seal-plant" in keys}))
'''
ADD_KEY = r'''
import ctypes, errno, json, pyseccomp
libc = ctypes.CDLL(None, use_errno=True)
k = libc.syscall(pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, "add_key"), b"user", b"seal-plant", b"for the next",
                 12, ctypes.c_long(-4))
print("FACTS " + json.dumps({"add_key": "ok" if k > 0 else errno.errorcode[ctypes.get_errno()]}))
'''


@pytest.mark.parametrize("way", WAYS)
def test_a_key_in_the_slot_users_keyring_never_reaches_the_next_run(seal, way):
    """The gap found as root: the slot's user keyring outlived the run, and the next student
    graded on the slot found what the last one put there. A notebook can no longer add a key;
    one that is there anyway (planted here as the slot's user) is cleared before the next
    student's first cell, and the next student sees none."""
    _, printed = graded(seal, way, [ADD_KEY])
    assert facts(printed[0]) == {"add_key": "EPERM"}
    assert _as_slot_user(PLANT_KEY).strip() == "planted"
    assert _as_slot_user(FIND_KEY).strip() == "found"
    _, printed = graded(seal, way, [READ_KEYS])
    assert facts(printed[0]) == {"seen": False}
    assert _as_slot_user(FIND_KEY).strip() == "none"  # cleared, not just hidden


PLANT = r'''
import ctypes, json, os, random, socket, subprocess, sys, time
import numpy, torch, matplotlib
import course_lib.attention as attention
libc = ctypes.CDLL(None, use_errno=True)
planted = {}
for folder in ("/tmp", os.path.expanduser("~"), "/dev/shm"):
    try:
        open(os.path.join(folder, "seal-planted"), "w").write("from the last student")
        planted[folder] = True
    except OSError:
        planted[folder] = False
planted["shm"] = libc.shmget(0x5EED, 4096, 0o1666) >= 0  # IPC_CREAT | 0666, kept after the process ends
daemon = """
import os, socket, sys, time
s = socket.socket(socket.AF_UNIX); s.bind("\\0seal-planted"); s.listen(8)
master, slave = os.openpty()
time.sleep(60)
"""
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", daemon, "MARKER"])
    os._exit(0)
time.sleep(1.0)
planted["pts"] = sorted(os.listdir("/dev/pts"))
torch.add = lambda *a, **k: "patched"
numpy.seal_planted = True
attention.seal_planted = True
matplotlib.rcParams["lines.linewidth"] = 9.5
torch.manual_seed(1234)
planted["draws"] = [random.random(), float(numpy.random.rand()), float(torch.rand(1))]
print("FACTS " + json.dumps(planted))
'''

SEEK = r'''
import ctypes, json, os, random, socket
import numpy, torch, matplotlib
import course_lib.attention as attention
libc = ctypes.CDLL(None, use_errno=True)
seen = {folder: os.path.exists(os.path.join(folder, "seal-planted"))
        for folder in ("/tmp", os.path.expanduser("~"), "/dev/shm")}
seen["shm"] = libc.shmget(0x5EED, 0, 0) >= 0
s = socket.socket(socket.AF_UNIX)
try:
    s.connect("\0seal-planted")
    seen["socket"] = True
except OSError:
    seen["socket"] = False
seen["pts"] = sorted(os.listdir("/dev/pts"))
seen["daemon"] = any("MARKER" in open(f"/proc/{p}/cmdline").read() for p in os.listdir("/proc") if p.isdigit())
seen["patched"] = [torch.add(torch.ones(1), 1).tolist() != [2.0], hasattr(numpy, "seal_planted"),
                   hasattr(attention, "seal_planted"), matplotlib.rcParams["lines.linewidth"]]
seen["draws"] = [random.random(), float(numpy.random.rand()), float(torch.rand(1))]
print("FACTS " + json.dumps(seen))
'''.replace("MARKER", MARKER)


def _daemons() -> list[str]:
    return subprocess.run(["pgrep", "-f", MARKER], capture_output=True, text=True).stdout.split()


@pytest.mark.parametrize("way", WAYS)
def test_nothing_one_run_leaves_reaches_the_next(seal, way):
    _, printed = graded(seal, way, [PLANT.replace("MARKER", MARKER)])
    planted = facts(printed[0])
    assert planted["/tmp"] and planted["/home/student"] and planted["shm"]
    assert len(planted["pts"]) >= 2  # the daemon's pty was made
    time.sleep(0.5)
    assert _daemons() == [], "the detached daemon outlived its run"
    _, printed = graded(seal, way, [SEEK])
    seen = facts(printed[0])
    assert {k: seen[k] for k in ("/tmp", "/home/student", "/dev/shm", "shm", "socket", "daemon")} == dict.fromkeys(
        ("/tmp", "/home/student", "/dev/shm", "shm", "socket", "daemon"), False)
    assert seen["pts"] == ["ptmx"]
    assert seen["patched"] == [False, False, False, 1.5]
    assert all(a != b for a, b in zip(seen["draws"], planted["draws"])), (seen["draws"], planted["draws"])
    _, printed = graded(seal, way, [SEEK])
    again = facts(printed[0])
    assert all(a != b for a, b in zip(seen["draws"], again["draws"])), "two runs drew the same numbers"


REACH = r'''
import json, os, signal, socket, subprocess, sys, time
found = {"pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit())}
links = []
for fd in os.listdir("/proc/self/fd"):
    try:
        links.append(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:  # (the descriptor listdir itself used)
        pass
found["sockets"] = sorted(link for link in links if link.startswith("socket:"))
# what the sandbox bound under /tmp (matplotlib's font list) is there again, read-only, in the fresh /tmp
fonts = [n for n in os.listdir("/tmp/matplotlib") if n.startswith("fontlist-")]
found["font list"] = bool(fonts) and not os.access(os.path.join("/tmp/matplotlib", fonts[0]), os.W_OK)
found["/tmp"] = sorted(os.listdir("/tmp"))
try:
    os.kill(1, signal.SIGKILL)  # the namespace's PID 1: ignored
    found["kill 1"] = "sent"
except OSError as exc:
    found["kill 1"] = type(exc).__name__
try:
    open("/proc/1/mem", "rb").read(1)
    found["/proc/1/mem"] = "read"
except OSError as exc:
    found["/proc/1/mem"] = type(exc).__name__
print("FACTS " + json.dumps(found))
'''
KILL_ALL = r'''
import subprocess, sys, time
subprocess.run([sys.executable, "-c", "import os, signal\nos.kill(-1, signal.SIGKILL)"])
time.sleep(5)
'''


def test_a_forked_run_cannot_reach_its_zygote_or_another_run(seal):
    """The zygote and the worker are not in the run's PID namespace; a kill(-1) from the run's
    own processes ends the run (its runner is in there) but not the zygote, which forks the next
    run as before."""
    graded(seal, "zygote", ["print('warm')"])
    zygote = seal["zygotes"].current
    before = zygote.process.pid
    result, printed = graded(seal, "zygote", [KILL_ALL, "print('after the kill')"])
    kinds = [p["kind"] for p in result["problems"]]
    assert "kernel_died" in kinds, result["problems"]  # kill(-1) from inside took the runner with it
    assert "after the kill" not in printed[1]
    assert seal["zygotes"].current is zygote and zygote.alive() and zygote.process.pid == before
    _, printed = graded(seal, "zygote", [REACH])
    found = facts(printed[0])
    assert found["pids"] == [1, 2], found  # its namespace's PID 1 (the reaper) and the runner, nothing else
    assert len(found["sockets"]) == 1, found  # the channel to the grader: no descriptor of the zygote's
    assert found["kill 1"] == "sent" and found["/proc/1/mem"] in ("PermissionError", "FileNotFoundError")
    bound = {p.parts[2] for p in sandbox.python_paths() if p.parts[:2] == ("/", "tmp") and len(p.parts) > 2}
    assert found["font list"] and set(found["/tmp"]) == {"matplotlib"} | bound, found  # (a venv under /tmp stays)


HOG = r'''
import os, time
def touch(mb):
    block = bytearray(mb * 2**20)
    for i in range(0, len(block), 4096):
        block[i] = 1
    return block
if os.fork() == 0:
    kept = touch(500)
    time.sleep(20)
    os._exit(0)
kept = touch(500)
time.sleep(20)
print("never stopped")
'''


@pytest.mark.parametrize("way", WAYS)
def test_the_memory_limit_holds_for_all_of_a_runs_processes(seal, way):
    """Two processes of 500 MB each under a 640 MB limit: each fits its own address space (the
    limit on top of what the runner maps at the first cell), together they do not, and the
    notebook is stopped. A forked run's pages are mostly its zygote's: they count as a fresh
    process's imports would, in what it used before its first cell."""
    result, printed = graded(seal, way, [HOG], memory_mb=640)
    stopped = [p for p in result["problems"] if p["kind"] == "memory"]
    assert stopped and "more than the 640 MB limit" in stopped[0]["message"], result["problems"]
    assert "never stopped" not in printed[0]


ONE_HOG = r'''
blocks = []
try:
    while True:
        blocks.append(bytearray(32 * 2**20))  # zero-filled: every page touched
except MemoryError:
    print(f"MemoryError after {len(blocks) * 32} MB")
del blocks
'''


@pytest.mark.parametrize("way", WAYS)
def test_one_process_that_grows_gets_a_memory_error_and_the_notebook_goes_on(seal, way):
    """A single process reaches its address-space limit (MemoryError, which the notebook may
    catch) before the limit on all processes together stops the notebook: it got the whole
    allowance, ``memory_mb``, on top of what the runner used at its first cell."""
    result, printed = graded(seal, way, [ONE_HOG, "print('the next cell ran')"], memory_mb=1024)
    assert not [p for p in result["problems"] if p["kind"] == "memory"], result["problems"]
    grown = int(printed[0].split("MemoryError after ")[1].split()[0])
    assert 0.85 * 1024 <= grown <= 1024, printed[0]  # (the rest: what IPython and the threads' arenas map meanwhile)
    assert "the next cell ran" in printed[1]


def test_a_zygote_that_cannot_start_leaves_its_notebooks_to_fresh_sandboxes(seal, tmp_path, monkeypatch):
    """A zygote that fails is not tried again for that course copy: its notebooks are graded in a
    fresh sandbox each, with the reason in the run's seal."""
    from autograder.sealing import zygote as zmod
    zygotes = Zygotes(tmp_path / "zygotes")
    monkeypatch.setattr(zmod, "ZYGOTE", tmp_path / "missing_zygote.py")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(6 * 7)")])
    job = {"notebook": nbformat.writes(nb), "limits": sandbox.Limits(cell_timeout=60).__dict__.copy(), "salts": {},
           "extra_files": [], "job_id": "seal-fallback"}
    result = grade_notebook(job, seal["copy"], tmp_path / "job", uid=UID, zygotes=zygotes)
    assert result["seal"]["how"].startswith("a fresh sandbox per notebook (the zygote could not start"), result["seal"]
    assert "42" in "".join(o.get("text", "") for o in nbformat.reads(result["notebook"], as_version=4).cells[0].outputs)
    zygotes.close()


def test_the_zygote_holds_no_secret_and_one_thread(seal):
    """What the zygote was given is what it started with: no set-up message, no plan; it runs
    one thread, never dumpable, no CUDA."""
    graded(seal, "zygote", ["print('warm')"])
    zygote = seal["zygotes"].current
    inner = [p for p in sandbox.process_tree(zygote.process.pid) if _comm(p).startswith("python")]
    assert len(inner) == 1, inner  # the zygote, idle between runs: none of its children left
    status = Path(f"/proc/{inner[0]}/status").read_text()
    assert "Threads:\t1\n" in status
    env = Path(f"/proc/{inner[0]}/environ").read_bytes().split(b"\0")
    assert not any(e.startswith((b"WORKBOOK_CHANNEL_FD=", b"WORKBOOK_SECRET")) for e in env)
    assert b"CUDA_VISIBLE_DEVICES=" in env
    assert zygote.ready["dumpable"] == 0 and zygote.ready["threads"] == 1 and zygote.ready["cuda"] is False


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""
