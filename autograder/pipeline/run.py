"""Run: one submitted notebook in the sandbox, served from the grader's side.

:class:`Supervisor` starts the runner (autograder/inside/notebook_runner.py) sealed off
(autograder/sealing/sandbox.py) with the notebook without its hidden tests, the submission's
other files and the limits, then serves it over one socket until it is done or out of
time: it stores each cell's outputs (:class:`Run`: validated, stripped to safe types,
capped again here), answers each test cell's plan request with that item's plan
(:func:`course_lib.grading.runner.plan_item`, inputs salted with the submission's
secret salt), collects the answers, and runs course_lib's references for the notebook's
stubs in the oracle (autograder/pipeline/reference_oracle.py), refused until the item has been graded.
Nothing the student's process sends is read as a score: judging comes after
(autograder/pipeline/judge.py).
"""

from __future__ import annotations

import functools
import json
import os
import select
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from course_lib.grading import get_spec
from course_lib.grading.calls import Subject
from course_lib.grading.runner import judge_item, plan_item
from course_lib.grading.wire import WireLimits
from course_lib.grading.wire import decode

from ..inside.cells import is_test_cell, nbgrader_meta
from ..doors.outbound import clean_output, clean_text
from ..course.problems import problem
from ..sealing import container, sandbox
from ..inside.channel import MAX_FRAME, FrameReader, ProtocolError
from .reference_oracle import Oracle
from ..sealing.course_copy import reference_targets

__all__ = ["Supervisor", "Run", "RUNNER", "ISOLATIONS", "isolation_of", "cell_errors", "exit_words", "known_item",
           "cell_label"]

RUNNER = Path(__file__).resolve().parents[1] / "inside" / "notebook_runner.py"  # its folder is all the sandbox sees of autograder/

ISOLATIONS = ("bubblewrap", "container", "none")  # how a runner is sealed off (none: --unsafe-no-sandbox)

GRACE = 10.0  # seconds a cell may overrun its limit before the sandbox is stopped

MEMORY_CHECK = 0.25  # seconds between two looks at the memory all of a sandbox's processes use

MAX_FILES_MB = 100


MAX_ANSWERS = 256 * 2**20  # all the answers of one item

STRICT = WireLimits(max_bytes=MAX_FRAME, max_header=4 * 2**20, max_nodes=200_000)  # what the sandbox may send



def isolation_of(job: dict) -> str:
    """A job's isolation: its ``isolation``, else ``none`` for ``unsafe_no_sandbox``, else bubblewrap."""
    found = job.get("isolation") or ("none" if job.get("unsafe_no_sandbox") else "bubblewrap")
    if found not in ISOLATIONS:
        raise ValueError(f"unknown isolation {found!r}; one of {', '.join(ISOLATIONS)}")
    return found


def cell_label(index: int, cell: dict) -> str:
    gid = nbgrader_meta(cell).get("grade_id", "")
    return f"cell {index}" + (f" ({gid})" if gid else "")



def _size(output: dict) -> int:
    if output["output_type"] == "stream":
        return len(output["text"])
    if output["output_type"] == "error":
        return len(output["evalue"]) + sum(len(t) for t in output["traceback"])
    return sum(len(v) for v in output["data"].values())



@dataclass
class Run:
    cells: list[dict]
    limits: sandbox.Limits
    outputs: dict[int, list[dict]] = field(default_factory=dict)
    counts: dict[int, int | None] = field(default_factory=dict)
    status: dict[int, str] = field(default_factory=dict)
    events: list[dict] = field(default_factory=list)
    used: dict[int, int] = field(default_factory=dict)
    total: int = 0
    truncated: set[int] = field(default_factory=set)
    current: int | None = None
    last_cell: int = -1
    cell_started: float = 0.0
    ended: str = ""  # why the run stopped early (empty when it finished)
    ended_at: int | None = None
    plans: dict[str, Any] = field(default_factory=dict)
    answers: dict[str, list[list[Any]]] = field(default_factory=dict)
    answer_bytes: dict[str, int] = field(default_factory=dict)
    open_items: set[str] = field(default_factory=set)
    requested: set[str] = field(default_factory=set)
    done: bool = False

    def event(self, kind: str, index: int | None, message: str) -> None:
        cell = self.cells[index] if index is not None and 0 <= index < len(self.cells) else {}
        where = cell_label(index, cell) + ": " if index is not None else ""
        self.events.append(problem(kind, clean_text(where + message), clean_text(nbgrader_meta(cell).get("grade_id", ""))))

    def truncate(self, index: int) -> None:
        """Drop the rest of cell ``index``'s output: a notice in the cell and a problem."""
        self.truncated.add(index)
        self.outputs.setdefault(index, []).append(
            {"output_type": "stream", "name": "stdout",
             "text": f"\n... output truncated: this cell printed more than {self.limits.max_output_kb} kB ...\n"})
        self.event("output_truncated", index, f"the cell printed more than {self.limits.max_output_kb} kB; "
                                              "the rest was dropped")

    def add_output(self, index: Any, output: Any) -> None:
        if not isinstance(index, int) or not 0 <= index < len(self.cells) or index != self.current:
            return
        if is_test_cell(self.cells[index]):
            return  # a test cell shows the grader's report only
        clean = clean_output(output)
        if clean is None or index in self.truncated:
            return
        size = _size(clean)
        cell_cap = self.limits.max_output_kb * 1024
        nb_cap = self.limits.max_notebook_output_kb * 1024
        used = self.used.get(index, 0)
        if used + size > cell_cap or self.total + size > nb_cap:
            room = max(0, min(cell_cap - used, nb_cap - self.total))
            if clean["output_type"] == "stream" and room > 0:
                clean["text"] = clean["text"][:room]
                self.outputs.setdefault(index, []).append(clean)
                self.total += room
            self.truncate(index)
            return
        self.used[index] = used + size
        self.total += size
        self.outputs.setdefault(index, []).append(clean)



class Supervisor:
    def __init__(self, job: dict, course_copy: Path, job_dir: Path, uid: int) -> None:
        self.job = job
        self.course_copy = course_copy
        self.job_dir = job_dir
        self.uid = uid
        self.nb = json.loads(job["notebook"])
        self.limits = sandbox.Limits(**job["limits"])
        self.device = torch.device(job.get("device", "cpu"))
        self.salts: dict[str, int] = job.get("salts", {})
        self.tests: dict[str, str] = {}  # grade_id -> item
        self.test_cell: dict[str, int] = {}  # item -> index of its (first) test cell
        for index, cell in enumerate(self.nb["cells"]):
            if is_test_cell(cell):
                gid = str(nbgrader_meta(cell).get("grade_id", ""))
                self.tests[gid] = gid.removeprefix("test_")
                self.test_cell.setdefault(gid.removeprefix("test_"), index)
        self.items = [i for i in self.tests.values() if known_item(i)]
        self.run = Run(self.nb["cells"], self.limits)
        self.oracle = Oracle(reference_targets(self.items), memory_mb=self.limits.memory_mb,
                             timeout=min(60.0, float(self.limits.cell_timeout)))
        self.process: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self.visible_plans: dict[str, Any] = {}
        self.survivors: list[int] = []  # processes of the student's user still alive after stop (container mode)

    # -- starting -----------------------------------------------------------
    def _setup_message(self) -> dict:
        cells = []
        for cell in self.nb["cells"]:
            meta = nbgrader_meta(cell)
            source = "".join(cell.get("source", "")) if isinstance(cell.get("source"), list) else str(cell.get("source", ""))
            if is_test_cell(cell):
                source = "# (checked by the grader)"  # hidden tests never enter the sandbox
            elif cell.get("cell_type") != "code":
                source = ""  # the runner runs code cells only (a 3 MB written answer is no concern of its)
            entry = {"cell_type": cell.get("cell_type"), "source": source,
                     "metadata": {"nbgrader": {k: meta[k] for k in ("grade", "solution", "grade_id", "locked")
                                               if k in meta}}}
            if len(source) > 2**19:  # past the wire's cap on one string: as bytes
                entry["source"] = ""
                entry["source_bytes"] = torch.frombuffer(bytearray(source.encode("utf-8")), dtype=torch.uint8)
            cells.append(entry)
        files = {}
        budget = MAX_FILES_MB * 2**20
        for rel, path in self.job.get("extra_files", []):
            data = Path(path).read_bytes()[:budget]
            budget -= len(data)
            files[rel] = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
            if budget <= 0:
                break
        return {"type": "setup", "cells": cells, "files": files, "limits": self.limits.__dict__.copy()}

    @property
    def isolation(self) -> str:
        """How the runner is sealed off: ``bubblewrap``, ``container`` (autograder/sealing/container.py)
        or ``none`` (``--unsafe-no-sandbox``)."""
        return isolation_of(self.job)

    def start(self) -> None:
        parent, child = socket.socketpair()
        self.sock = parent
        limits = self.limits
        preexec = functools.partial(sandbox.apply_limits, limits)
        if self.isolation == "none":
            argv = [os.sys.executable, "-s", str(RUNNER)]
            env = _unsafe_env(self.course_copy, child.fileno(), self.job.get("threads", 1), self.job_dir)
            cwd = self.job_dir / "work"
            cwd.mkdir(parents=True, exist_ok=True)
        elif self.isolation == "container":
            user = container.ContainerUser(self.job["container_user"])
            folders = container.make_job_dir(self.job_dir, user, RUNNER.parent)
            argv, env = container.command(folders["runner"] / RUNNER.name, self.course_copy, folders, user,
                                          child.fileno(), threads=self.job.get("threads", 1))
            cwd = folders["home"]
            preexec = functools.partial(container.preexec, limits)
        else:
            argv = sandbox.command(RUNNER, self.course_copy, self.job_dir, self.limits, self.uid, child.fileno(),
                                   gpu=self.job.get("gpu", False), threads=self.job.get("threads", 1))
            env, cwd = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, self.job_dir
        log = open(self.job_dir / "sandbox.log", "wb")
        self.process = subprocess.Popen(argv, pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL, stdout=log,
                                        stderr=log, env=env, cwd=cwd, start_new_session=True, preexec_fn=preexec)
        log.close()
        child.close()
        from ..inside.channel import Channel
        Channel(parent).send(self._setup_message())

    def stop(self) -> int | None:
        """Stop the sandbox and everything in it; its exit status (None if killed here)."""
        code = None
        if self.process is not None:
            try:
                code = self.process.wait(timeout=2 if self.run.done else 0.1)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                try:
                    self.process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
                code = None
        if self.isolation == "container":  # no PID namespace: whatever the user started, wherever it went
            user = container.ContainerUser(self.job["container_user"])
            self.survivors = container.kill_user(user.uid)
            container.remove_user_files(user.uid)
        if self.sock is not None:
            self.sock.close()
        self.oracle.close()
        return code

    def memory_mb(self) -> float:
        """Memory in use by all of the notebook's processes."""
        if self.isolation == "container":  # a process that left the tree is still the user's
            return container.user_memory_mb(int(self.job["container_user"]["uid"]))
        return sandbox.tree_memory_mb(self.process.pid)

    # -- serving --------------------------------------------------------------
    def serve(self) -> None:
        run = self.run
        reader = FrameReader(max_frame=MAX_FRAME, limits=STRICT)
        started = time.monotonic()
        deadline = started + self.limits.notebook_timeout
        next_memory_check = started
        while not run.done:
            now = time.monotonic()
            if self.limits.memory_mb and now >= next_memory_check:
                # RLIMIT_AS caps each process; the notebook's processes together share
                # the same limit, checked here
                next_memory_check = now + MEMORY_CHECK
                used = self.memory_mb()
                if used > self.limits.memory_mb:
                    run.ended = (f"the notebook's processes together used {used:.0f} MB, more than the "
                                 f"{self.limits.memory_mb} MB limit, and were stopped")
                    run.event("memory", run.current, run.ended)
                    run.ended_at = run.current
                    return
            # the deadlines are checked on every turn: a sandbox that never stops sending
            # cannot keep its notebook running
            if now >= deadline:
                run.ended = f"the notebook time limit ({self.limits.notebook_timeout} s) was reached"
                run.event("notebook_timeout", run.current, run.ended)
                run.ended_at = run.current
                return
            if run.current is not None and now >= run.cell_started + self.limits.cell_timeout + GRACE:
                run.ended = (f"the cell ran longer than the {self.limits.cell_timeout} s limit and did not "
                             "stop when interrupted")
                run.event("cell_timeout", run.current, run.ended)
                run.ended_at = run.current
                return
            waits = [deadline - now] + ([next_memory_check - now] if self.limits.memory_mb else [])
            if run.current is not None:
                waits.append(run.cell_started + self.limits.cell_timeout + GRACE - now)
            ready, _, _ = select.select([self.sock], [], [], max(0.0, min(waits)))
            if not ready:
                continue
            try:
                data = self.sock.recv(1 << 20)
            except OSError:
                data = b""
            if not data:
                run.ended_at = run.current
                run.ended = "the notebook's process ended"
                return
            reader.feed(data)
            try:
                for message in reader.frames():
                    self.handle(message)
                    if run.done:
                        break
            except (ProtocolError, KeyError, TypeError, ValueError) as exc:
                run.ended_at = run.current
                if self._ended(1.0):  # it did not break the protocol, it died (killed: out of memory?)
                    run.ended = "the notebook's process ended"
                    return
                run.ended = f"the grader stopped the notebook: its process broke the grading protocol ({exc})"
                run.event("protocol", run.current, run.ended)
                return

    def _ended(self, wait: float) -> bool:
        """Whether the runner's process has ended (waiting up to ``wait`` seconds for it)."""
        try:
            self.process.wait(timeout=wait)
            return True
        except subprocess.TimeoutExpired:
            return False

    def reply(self, message: dict) -> None:
        """Send a reply; a runner that stops reading cannot block the grader."""
        from ..inside.channel import Channel
        self.sock.settimeout(30)
        try:
            Channel(self.sock).send(message)
        except OSError as exc:
            raise ProtocolError(f"the notebook's process does not read its replies ({exc})") from None
        finally:
            self.sock.settimeout(None)

    def handle(self, message: dict) -> None:
        run = self.run
        kind = message["type"]
        if kind == "output":
            run.add_output(message.get("index"), message.get("output"))
        elif kind == "cell_start":
            index = message["index"]
            if not isinstance(index, int) or not 0 <= index < len(run.cells) or index <= run.last_cell:
                raise ProtocolError("cells run in order, each once")
            run.current, run.cell_started, run.last_cell = index, time.monotonic(), index
        elif kind == "cell_end":
            index = message.get("index")
            if index == run.current and index is not None:
                count = message.get("execution_count")
                run.counts[index] = count if isinstance(count, int) and not isinstance(count, bool) else None
                status = message.get("status")
                run.status[index] = status if isinstance(status, str) else "ok"
                if status == "timeout":
                    run.event("cell_timeout", index,
                              f"the cell ran longer than the {self.limits.cell_timeout} s limit and was interrupted")
                run.current = None
        elif kind == "plan_request":
            self.plan(message)
        elif kind == "answer":
            self.answer(message)
        elif kind == "plan_done":
            run.open_items.discard(message.get("item"))
        elif kind == "visible_plan":
            self.visible_plan(message)
        elif kind == "visible_answers":
            self.visible_answers(message)
        elif kind == "oracle":
            self.reply({"type": "oracle_result", **self.oracle.ask(message, self.not_yet_graded())})
        elif kind == "exit":
            run.ended_at = message.get("index") if isinstance(message.get("index"), int) else run.current
            run.ended = "the notebook called exit()"
            run.done = True
        elif kind == "done":
            run.done = True
        elif kind == "hello":
            pass
        elif kind == "truncated":  # the runner dropped output before sending it
            index = message.get("index")
            if index == run.current and index is not None and index not in run.truncated:
                run.truncate(index)
        else:
            raise ProtocolError(f"unknown message {kind[:40]!r}")

    def not_yet_graded(self) -> set[str]:
        """Items whose test cell has not finished: their references are refused, so that
        nothing computed with course_lib's answer (a lookup table made in an earlier cell,
        a function captured early) can stand in for the student's own code."""
        run = self.run
        done_up_to = run.last_cell if run.current is None else run.current - 1
        return {item for item, index in self.test_cell.items() if index > done_up_to} | run.open_items

    def plan(self, message: dict) -> None:
        run = self.run
        gid = message.get("grade_id")
        item = self.tests.get(gid) if isinstance(gid, str) else None
        run.open_items.clear()  # a new request closes any plan still open
        current = run.cells[run.current] if run.current is not None else {}
        if not is_test_cell(current) or nbgrader_meta(current).get("grade_id") != gid:
            item = None  # a plan is given only while its own test cell runs
        if item is None or item not in self.items or item in run.requested:
            self.reply({"type": "no_plan"})
            return
        run.requested.add(item)
        spec = get_spec(item)
        try:
            plan = plan_item(spec, hidden=True, device=self.device, salt=self.salts.get(item, 0))
            subject = Subject.of(spec).as_data()
        except Exception as exc:  # a fault of the grader's, not of the submission
            run.events.append(problem("grader_error", f"{item}: the grader could not plan its checks "
                                                      f"({type(exc).__name__}: {exc})", gid))
            self.reply({"type": "no_plan"})
            return
        run.plans[item] = plan
        run.answers[item] = [[None] * len(seg) for seg in plan.segments]
        run.answer_bytes[item] = 0
        run.open_items.add(item)
        segments = [[decode(data, kind="call") for data in seg] for seg in plan.segments]
        self.reply({"type": "plan", "item": item, "subject": subject, "segments": segments})

    def visible_plan(self, message: dict) -> None:
        """The visible checks of an item, for ``working_or_reference`` in the notebook (no
        points depend on them: the notebook's own inputs, salt 0)."""
        item = message.get("item")
        if item not in self.items:
            self.reply({"type": "no_plan"})
            return
        spec = get_spec(item)
        if item not in self.visible_plans:
            self.visible_plans[item] = plan_item(spec, hidden=False, device=self.device, salt=0)
        plan = self.visible_plans[item]
        segments = [[decode(data, kind="call") for data in seg] for seg in plan.segments]
        self.reply({"type": "plan", "item": item, "subject": Subject.of(spec).as_data(), "segments": segments})

    def visible_answers(self, message: dict) -> None:
        item, answers = message.get("item"), message.get("answers")
        passed = False
        if item in self.visible_plans and isinstance(answers, list):
            rows = [[a if isinstance(a, dict) else None for a in row] if isinstance(row, list) else []
                    for row in answers]
            # pass or fail is all the notebook needs: no search of the mistake catalogue (it can
            # take seconds for a wrong module, and this runs on the cell's clock)
            result = judge_item(get_spec(item), self.visible_plans[item], rows, device=self.device, salt=0,
                                name_mistakes=False)
            passed = not result.reference_used and all(r.passed for r in result.results)
        self.reply({"type": "verdict", "passed": passed})

    def answer(self, message: dict) -> None:
        run = self.run
        item, s, i = message.get("item"), message.get("segment"), message.get("index")
        if item not in run.open_items or not isinstance(s, int) or not isinstance(i, int):
            return
        table = run.answers[item]
        if not (0 <= s < len(table) and 0 <= i < len(table[s])) or table[s][i] is not None:
            return
        answer = message.get("answer")
        run.answer_bytes[item] += _nbytes(answer)
        if run.answer_bytes[item] > MAX_ANSWERS:
            answer = {"ok": False, "kind": "no_answer", "text": "the answers are too large"}
        table[s][i] = answer if isinstance(answer, dict) else {"ok": False, "kind": "no_answer",
                                                               "text": "the answer could not be read"}



def _nbytes(value: Any, depth: int = 0) -> int:
    """Bytes held by the tensors in a decoded value."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if depth > 30:
        return 0
    if isinstance(value, dict):
        return sum(_nbytes(v, depth + 1) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v, depth + 1) for v in value)
    return 0



def known_item(item: str) -> bool:
    try:
        get_spec(item)
        return True
    except KeyError:
        return False



def _unsafe_env(course_copy: Path, fd: int, threads: int, job_dir: Path) -> dict[str, str]:
    home = job_dir / "home"
    home.mkdir(parents=True, exist_ok=True)
    runner_dir = str(RUNNER.parent)
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "TMPDIR": str(job_dir),
            "LANG": "C.UTF-8", "PYTHONPATH": f"{course_copy}:{runner_dir}", "PYTHONNOUSERSITE": "1",
            "PYTHONDONTWRITEBYTECODE": "1", "WORKBOOK_GRADING": "1", "NBGRADER_EXECUTION": "autograde",
            "MPLBACKEND": "Agg", "MPLCONFIGDIR": str(job_dir / "mpl"), "OMP_NUM_THREADS": str(threads),
            "MKL_NUM_THREADS": str(threads), "OPENBLAS_NUM_THREADS": str(threads), "WORKBOOK_CHANNEL_FD": str(fd),
            "CUDA_VISIBLE_DEVICES": ""}



def exit_words(code: int | None) -> str:
    if code is None:
        return ""
    if code > 128:
        try:
            return f", killed by {signal.Signals(code - 128).name}"
        except ValueError:
            return f", killed by signal {code - 128}"
    if code < 0:
        try:
            return f", killed by {signal.Signals(-code).name}"
        except ValueError:
            return f", killed by signal {-code}"
    return f", exit code {code}"



def cell_errors(run: Run) -> None:
    """One ``error`` problem for each cell (not a test cell) that raised.

    A cell stopped by an unfinished item or by a reference that is not available while
    grading is not a problem, and neither is a later cell's ``NameError`` (a name the
    stopped cell would have defined, as in notebook 05's demonstration of relative
    positions)."""
    skipped = False
    for index, outputs in sorted(run.outputs.items()):
        if is_test_cell(run.cells[index]) or run.status.get(index) == "timeout":
            continue
        for output in outputs:
            if output["output_type"] == "error" and output["ename"] not in ("KeyboardInterrupt",):
                if (output["ename"] in ("NotImplementedError", "ReferenceUnavailable")
                        or "not available while this notebook is graded" in output["evalue"]):
                    skipped = True
                    break  # an unfinished item, or a demonstration of this notebook's references: not a new problem
                if skipped and output["ename"] == "NameError":
                    break
                run.event("error", index, f"raised {output['ename']}: {output['evalue'][:300]}")
                break

