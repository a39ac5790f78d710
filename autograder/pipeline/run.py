"""Run: one submitted notebook in its seal, served from the grader's side.

:func:`run_notebook` starts the runner (autograder/inside/notebook_runner.py) sealed off
(autograder/sealing/: bubblewrap, container mode, or nothing with ``--unsafe-no-sandbox``)
with the notebook without its hidden tests, the submission's other files and the limits, then
serves it over one socket (:class:`~autograder.pipeline.run_protocol.Conversation`) until it
is done or out of time or memory, and stops everything it started. What it kept
(:class:`~autograder.pipeline.run_transcript.Transcript`: outputs, answers, how it ended)
is handed to the judge as a :class:`~autograder.pipeline.handoffs.RunOutcome`.
"""

from __future__ import annotations

import functools
import json
import select
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from course_lib.grading import get_spec
from course_lib.grading.answer.wire import WireLimits

from ..inside.cells import is_test_cell, item_of, nbgrader_meta
from ..inside.channel import MAX_FRAME, FrameReader, ProtocolError
from ..sealing import sandbox
from .handoffs import Ending, Job, RunOutcome
from .run_protocol import Conversation
from .run_transcript import Transcript
from .seals import RUNNER, Seal

__all__ = ["run_notebook", "Supervisor", "RUNNER", "known_item", "grace_extra"]

GRACE = 10.0  # seconds a cell may overrun its limit before the sandbox is stopped
STARVED_MAX = 60.0  # at most this much more for a sandbox kept waiting for a CPU meanwhile (a busy machine)
READ_EVERY = 0.5  # seconds between two readings of the runner's waits as a cell runs past its limit
FRESH = 0.1  # ... and at most this old when the grace is decided

MEMORY_CHECK = 0.25  # seconds between two looks at the memory all of a sandbox's processes use

MAX_FILES_MB = 100

STRICT = WireLimits(max_bytes=MAX_FRAME, max_header=4 * 2**20, max_nodes=200_000)  # what the sandbox may send


def run_notebook(job: Job, course_copy: Path, job_dir: Path, uid: int, seal: Seal) -> RunOutcome:
    """Run ``job``'s notebook sealed off by ``seal`` (the worker's choice:
    autograder/pipeline/seals.py), served until it ends; everything it started is stopped
    before this returns. ``uid``: the bubblewrap sandbox's user when the grader is root."""
    supervisor = Supervisor(job, course_copy, job_dir, uid, seal)
    try:
        supervisor.start()
        supervisor.serve()
    finally:
        outcome = supervisor.stop()
    return outcome


@dataclass
class _Grace:
    """What the supervisor knows of the running cell's grace, from when its limit passed."""

    cell: int | None = None
    since: float = 0.0  # when the limit passed (the grader's clock)
    runner_waited: float | None = None  # the runner's run-queue delay then (None: the kernel does not say)
    cpu: float = 0.0  # the CPU-seconds the run's processes had used then
    grader_waited: float | None = None  # the grader's own run-queue delay then
    extra: float = 0.0  # the grace added so far
    read_at: float = 0.0  # when the kernel was last asked


def grace_extra(extra: float, runner_waited: float | None, grader_waited: float) -> float:
    """The grace added so far (``extra``) once the runner has waited ``runner_waited`` seconds
    for a CPU since the cell's limit (None: unknown) and the grader ``grader_waited``: the
    longest wait of the runner's, less the grader's, so that the grace added and the grader's
    own lateness together never pass :data:`STARVED_MAX`."""
    longest = extra if runner_waited is None else max(extra, runner_waited)
    return max(0.0, min(STARVED_MAX - grader_waited, longest))


def _since(then: float | None, now: float | None) -> float:
    return max(0.0, now - then) if then is not None and now is not None else 0.0


def known_item(item: str) -> bool:
    try:
        get_spec(item)
        return True
    except KeyError:
        return False


class Supervisor:
    """One notebook's sealed process: started, watched (time, memory), served, stopped."""

    def __init__(self, job: Job, course_copy: Path, job_dir: Path, uid: int, seal: Seal) -> None:
        self.job = job
        self.course_copy = course_copy
        self.job_dir = job_dir
        self.uid = uid
        self.nb = json.loads(job["notebook"])
        self.device = torch.device(job.get("device", "cpu"))
        self.salts: dict[str, int] = job.get("salts", {})
        self.threads = int(job.get("threads", 1))  # the run's CPU share
        self.tests: dict[str, str] = {}  # grade_id -> item
        test_cell: dict[str, int] = {}  # item -> index of its (first) test cell
        for index, cell in enumerate(self.nb["cells"]):
            if is_test_cell(cell):
                gid = str(nbgrader_meta(cell).get("grade_id", ""))
                self.tests[gid] = item_of(gid)
                test_cell.setdefault(item_of(gid), index)
        self.items = [i for i in self.tests.values() if known_item(i)]
        self.process = None  # the sealed process's handle (autograder/pipeline/seals.py)
        self.sock: socket.socket | None = None
        self.survivors: list[int] = []  # processes of the student's user still alive after stop (container mode)
        self._grace = _Grace()  # the running cell's, once its limit has passed
        self.limits = sandbox.Limits(**job["limits"])
        self.transcript = Transcript(self.nb["cells"], self.limits)
        self.seal = seal  # how the process is sealed off (and how its memory is counted)
        self.conversation = Conversation(self.transcript, self.tests, self.items, test_cell, self.salts, self.device,
                                         on_ready=functools.partial(self.seal.measure_baseline, self))

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

    def start(self) -> None:
        """Start the sealed process and hand it the notebook (the seal adds what it asks of the
        runner's own seal)."""
        self.process = self.seal.open(self, self._setup_message())
        self.conversation.sock = self.sock

    def stop(self) -> RunOutcome:
        """Stop the sandbox and everything in it (and the oracle); what the run kept, and how
        it ended (with the runner's exit status, unless it was killed here)."""
        code = None
        if self.process is not None:
            try:
                code = self.process.wait(timeout=2 if self.transcript.done else 0.1)
            except subprocess.TimeoutExpired:
                self.process.kill()
                try:
                    self.process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
                code = None
        self.seal.clean_up(self)
        self.seal.release_cpu()
        if self.sock is not None:
            self.sock.close()
        run, talk = self.transcript, self.conversation
        run.finish(code)
        talk.close()
        return RunOutcome(self.nb, self.tests, self.items, self.salts, str(self.device), talk.plans, talk.answers,
                          run.outputs, run.counts, run.ending or Ending.FINISHED, run.reason, run.ended_at,
                          run.events, self.seal.isolation.value, self.survivors, talk.oracle_calls, self.seal.how,
                          {**talk.seal, "cpu": self.seal.cpu_words})

    # -- serving --------------------------------------------------------------
    def serve(self) -> None:
        """Answer the notebook's messages until it is done, or stop it: out of time (the
        notebook's, or a cell's that did not stop when interrupted), out of memory (all its
        processes together), dead, or breaking the protocol."""
        run = self.transcript
        reader = FrameReader(max_frame=MAX_FRAME, limits=STRICT)
        started = time.monotonic()
        deadline = started + self.limits.notebook_timeout
        next_memory_check = started
        while not run.done:
            now = time.monotonic()
            current, cell_started = run.current, run.cell_started
            if self.limits.memory_mb and now >= next_memory_check:
                # RLIMIT_AS caps each process; the notebook's processes together share
                # the same limit, checked here
                next_memory_check = now + MEMORY_CHECK
                used = self.seal.used_mb(self)
                if used > self.limits.memory_mb:
                    run.end(Ending.OUT_OF_MEMORY, f"the notebook's processes together used {used:.0f} MB (beyond "
                                                  "the grader's own, at the first cell), more than the "
                                                  f"{self.limits.memory_mb} MB limit, and were stopped",
                            current, "memory")
                    return
            # the deadlines are checked on every turn: a sandbox that never stops sending
            # cannot keep its notebook running
            if now >= deadline:
                run.end(Ending.NOTEBOOK_TIMEOUT, f"the notebook time limit ({self.limits.notebook_timeout} s) was "
                                                 "reached", current, "notebook_timeout")
                return
            if current is not None and now >= cell_started + self.limits.cell_timeout + GRACE:
                if self._past_grace(current, cell_started, now):
                    late = now - cell_started - self.limits.cell_timeout
                    added = f": a grace of {GRACE:g} s and {self._grace.extra:.1f} s more while its runner " \
                        "waited for a CPU" if self._grace.extra >= 0.1 else ""
                    run.end(Ending.CELL_TIMEOUT, f"the cell ran longer than the {self.limits.cell_timeout} s limit "
                                                 f"and did not stop when interrupted (stopped {late:.1f} s after "
                                                 f"the limit{added})", current, "cell_timeout")
                    return
            elif current is not None and now >= cell_started + self.limits.cell_timeout:
                self._starved(current, now)  # the run-queue delay counts from the cell's limit on
            try:
                message = reader.next_frame()
                if message is not None:  # one message a turn: the limits above are checked between any two
                    # (and what it asks of the grader may take until the run would be stopped, no longer)
                    self.conversation.stop_at = deadline if current is None else min(
                        deadline, cell_started + self.limits.cell_timeout + GRACE + self._grace.extra)
                    self.conversation.handle(message)
                    continue
            except (ProtocolError, KeyError, TypeError, ValueError) as exc:
                if self._ended(1.0):  # it did not break the protocol, it died (killed: out of memory?)
                    run.end(Ending.PROCESS_ENDED, "the notebook's process ended", run.current)
                    return
                run.end(Ending.PROTOCOL_BROKEN, "the grader stopped the notebook: its process broke the grading "
                                                f"protocol ({exc})", run.current, "protocol")
                return
            waits = [deadline - now] + ([next_memory_check - now] if self.limits.memory_mb else [])
            if current is not None:
                limit = cell_started + self.limits.cell_timeout
                waits.append((limit if now < limit and self._grace.cell != current else
                              limit + GRACE + self._grace.extra) - now)
            ready, _, _ = select.select([self.sock], [], [], max(0.0, min(waits)))
            if not ready:
                continue
            try:
                data = self.sock.recv(1 << 20)
            except OSError:
                data = b""
            if not data:
                run.end(Ending.PROCESS_ENDED, "the notebook's process ended", run.current)
                return
            reader.feed(data)

    def _past_grace(self, current: int, cell_started: float, now: float) -> bool:
        """Whether the current cell, started at ``cell_started``, has run past its limit and
        grace, decided on a fresh reading of the runner's waits (at most :data:`FRESH` old). A
        stale one, from before the runner's latest wait, would cut its grace short: a runner
        kept off the CPU most of the time was stopped a second or two into a grace that had
        grown since."""
        end = cell_started + self.limits.cell_timeout + GRACE
        return now >= end and now >= end + self._starved(current, now, FRESH)

    def _starved(self, current: int, now: float, within: float = READ_EVERY) -> float:
        """The seconds added to the current cell's grace: how long the notebook's runner, once
        the cell's limit had passed, waited for a CPU that the run was denied (the interrupt
        is handled by the runner's main thread; on a machine busy with other sandboxes it can
        wait longer than the grace itself). A wait while the run's own processes used its
        share (``threads`` CPUs) is the notebook's doing and adds nothing; what the grader
        itself waited for a CPU meanwhile counts against the bound (:func:`grace_extra`).
        The kernel is asked again when its last reading is ``within`` seconds old (twice a
        second as the run goes; :data:`FRESH` when the grace is being decided); 0 where it does
        not say."""
        grace, pid = self._grace, self.process.pid
        if grace.cell != current:
            self._grace = _Grace(current, now, sandbox.run_queue_seconds(pid) if pid else None,
                                 sandbox.tree_cpu_seconds(self.process.memory_root), sandbox.own_run_queue_seconds(),
                                 read_at=now)
            return 0.0
        if grace.runner_waited is not None and now - grace.read_at >= within:
            waited = sandbox.run_queue_seconds(pid) if pid else None
            denied = self.threads * (now - grace.since) - (sandbox.tree_cpu_seconds(self.process.memory_root) - grace.cpu)
            starved = None if waited is None else min(waited - grace.runner_waited, max(0.0, denied))
            grace.extra = grace_extra(grace.extra, starved, _since(grace.grader_waited, sandbox.own_run_queue_seconds()))
            grace.read_at = now
        return grace.extra

    def _ended(self, wait: float) -> bool:
        """Whether the runner's process has ended (waiting up to ``wait`` seconds for it)."""
        try:
            self.process.wait(timeout=wait)
            return True
        except subprocess.TimeoutExpired:
            return False
