"""The grader's side of the conversation with a notebook running sealed off: one message at a
time, as the runner (autograder/inside/notebook_runner.py) sends them.

Cells start and end in order, each once, and their outputs go into the
:class:`~autograder.pipeline.run_transcript.Transcript`. A test cell asks for its item's plan
(:func:`course_lib.grading.judge.runner.plan_item`, inputs salted with the submission's secret salt),
given only while that cell runs and only once, and answers each call with plain data, kept for
the judge. ``working_or_reference`` asks for an item's visible checks and a verdict (salt 0, no
points). A stub of a graded reference asks the oracle (autograder/pipeline/reference_oracle.py),
refused until its item has been graded. Nothing the notebook sends is read as a score.
"""

from __future__ import annotations

import inspect
import socket
import time
from typing import Any, Callable

import torch

from course_lib.grading import get_spec
from course_lib.grading.answer.calls import Subject
from course_lib.grading.judge.runner import plan_item
from course_lib.grading.answer.wire import decode

from ..course.problems import problem
from ..inside.cells import is_test_cell, nbgrader_meta
from ..inside.channel import Channel, ProtocolError
from ..sealing.course_copy import reference_targets
from ..sealing.sandbox import SandboxUnavailable
from .judge import visible_verdict
from .reference_oracle import Oracle
from .run_transcript import CELL_MESSAGES, Transcript

__all__ = ["Conversation", "HANDLERS", "MAX_ANSWERS"]

MAX_ANSWERS = 256 * 2**20  # all the answers of one item


class Conversation:
    """Answers the messages of one notebook's run (:meth:`handle`) over ``sock`` (set once the
    runner has started). Raises :class:`ProtocolError` for a message out of order or of an
    unknown kind, and when the runner does not read its replies."""

    def __init__(self, transcript: Transcript, tests: dict[str, str], items: list[str], test_cell: dict[str, int],
                 salts: dict[str, int], device: torch.device, on_ready: Callable[[], None] = lambda: None) -> None:
        self.sock: socket.socket | None = None
        self.on_ready = on_ready  # called once, when the runner is about to run the first cell
        self.stop_at = float("inf")  # when the run would be stopped (time.monotonic()), set before each message
        self.ready = False
        self.transcript = transcript
        self.tests = tests  # grade_id -> item
        self.items = items
        self.test_cell = test_cell  # item -> index of its (first) test cell
        self.salts = salts
        self.device = device
        self.oracle: Oracle | None = None  # made when a stub first asks
        self.oracle_calls = 0
        self.plans: dict[str, Any] = {}
        self.answers: dict[str, list[list[Any]]] = {}
        self.answer_bytes: dict[str, int] = {}
        self.open_items: set[str] = set()
        self.requested: set[str] = set()
        self.visible_plans: dict[str, Any] = {}
        self.seal: dict[str, str] = {}  # the seal as the runner found it (its first hello, before any cell)

    def handle(self, message: dict) -> None:
        """One message, by its ``type``: about the cells, to the transcript, which keeps their
        state (:data:`~autograder.pipeline.run_transcript.CELL_MESSAGES`); any other, to its
        handler here (:data:`HANDLERS`); a :class:`ProtocolError` for an unknown one."""
        kind = message["type"]
        if isinstance(kind, str) and kind in CELL_MESSAGES:
            CELL_MESSAGES[kind](self.transcript, message)
            return
        handler = HANDLERS.get(kind) if isinstance(kind, str) else None
        if handler is None:
            raise ProtocolError(f"unknown message {str(kind)[:40]!r}")
        handler(self, message)

    def ready_to_start(self, message: dict) -> None:
        """Sent once by the runner before the first cell (later ones are the notebook's): the
        grader measures what the run uses at rest, then lets it go on."""
        if not self.ready and self.transcript.before_first_cell:
            self.ready = True
            self.on_ready()
            self.reply({"type": "go"})

    def plan_done(self, message: dict) -> None:
        self.open_items.discard(message.get("item"))

    def oracle_call(self, message: dict) -> None:
        self.reply({"type": "oracle_result", **self.ask_oracle(message)})

    def source_request(self, message: dict) -> None:
        self.reply({"type": "reference_source", **self.reference_source(message)})

    def hello(self, message: dict) -> None:
        """The runner's first message, sent before any of the student's code runs: how it
        sealed itself (autograder/inside/lockdown.py). A run that could not install the syscall
        filter it was required to is the grader's failure, not the student's (the runner ran no
        cell). Later hellos come from the student's code: ignored."""
        if self.seal:
            return
        seal = message.get("seal")
        self.seal = {str(k)[:40]: str(v)[:1000] for k, v in seal.items()} if isinstance(seal, dict) else {"": ""}
        if self.seal.get("syscall_filter") == "failed" and self.seal.get("required") == "True":
            raise SandboxUnavailable(f"the sandbox could not install its syscall filter: {self.seal.get('error')}")

    def reply(self, message: dict) -> None:
        """Send a reply; a runner that stops reading cannot block the grader."""
        self.sock.settimeout(30)
        try:
            Channel(self.sock).send(message)
        except OSError as exc:
            raise ProtocolError(f"the notebook's process does not read its replies ({exc})") from None
        finally:
            self.sock.settimeout(None)

    def ask_oracle(self, message: dict) -> dict:
        """A stub's call of one of the notebook's graded references, answered by the oracle
        (its memory and time bounded as the notebook's), refused while the item is not graded."""
        refused = self.not_yet_graded()
        if self.oracle is None:
            limits = self.transcript.limits
            self.oracle = Oracle(reference_targets(self.items), memory_mb=limits.memory_mb,
                                 timeout=min(60.0, float(limits.cell_timeout)))
        answer = self.oracle.ask(message, refused, timeout=self.stop_at - time.monotonic())
        self.oracle_calls = self.oracle.calls
        return answer

    def reference_source(self, message: dict) -> dict:
        """The source of course_lib's class reference a stand-in asks for, once its item has
        been graded (course_lib's own code, public: the item's points are decided already, and
        the notebook's other references in that code are stand-ins still); refused before."""
        name = message.get("name")
        targets = reference_targets(self.items)
        if not isinstance(name, str) or name not in targets or not isinstance(targets[name][0], type):
            return {"ok": False, "text": "that is not one of this notebook's class references"}
        reference, item = targets[name]
        if item in self.not_yet_graded():
            return {"ok": False, "item": item,
                    "text": f"course_lib's {reference.__name__} (the reference for {item}) is not available "
                            f"before {item} has been graded (after its test cell): {item} must be your own code; "
                            "this cell does not count towards the grade."}
        return {"ok": True, "source": inspect.getsource(reference)}

    def close(self) -> None:
        """Stop the oracle's process, if one started."""
        if self.oracle is not None:
            self.oracle.close()

    def not_yet_graded(self) -> set[str]:
        """Items whose test cell has not finished: their references are refused, so that
        nothing computed with course_lib's answer (a lookup table made in an earlier cell,
        a function captured early) can stand in for the student's own code."""
        done_up_to = self.transcript.graded_up_to()
        return {item for item, index in self.test_cell.items() if index > done_up_to} | self.open_items

    def plan(self, message: dict) -> None:
        run = self.transcript
        gid = message.get("grade_id")
        item = self.tests.get(gid) if isinstance(gid, str) else None
        self.open_items.clear()  # a new request closes any plan still open
        current = run.cells[run.current] if run.current is not None else {}
        if item is None or not is_test_cell(current) or nbgrader_meta(current).get("grade_id") != gid:
            item = None  # a plan is given only while its own test cell runs
        if item is None or item not in self.items or item in self.requested:
            self.reply({"type": "no_plan"})
            return
        self.requested.add(item)
        spec = get_spec(item)
        try:
            plan = plan_item(spec, hidden=True, device=self.device, salt=self.salts.get(item, 0))
            subject = Subject.of(spec).as_data()
        except Exception as exc:  # a fault of the grader's, not of the submission
            run.events.append(problem("grader_error", f"{item}: the grader could not plan its checks "
                                                      f"({type(exc).__name__}: {exc})", gid))
            self.reply({"type": "no_plan"})
            return
        self.plans[item] = plan
        self.answers[item] = [[None] * len(seg) for seg in plan.segments]
        self.answer_bytes[item] = 0
        self.open_items.add(item)
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
        passed = item in self.visible_plans and isinstance(answers, list) and \
            visible_verdict(item, self.visible_plans[item], answers, self.device)
        self.reply({"type": "verdict", "passed": passed})

    def answer(self, message: dict) -> None:
        item, s, i = message.get("item"), message.get("segment"), message.get("index")
        if item not in self.open_items or not isinstance(s, int) or not isinstance(i, int):
            return
        table = self.answers[item]
        if not (0 <= s < len(table) and 0 <= i < len(table[s])) or table[s][i] is not None:
            return
        answer = message.get("answer")
        self.answer_bytes[item] += _nbytes(answer)
        if self.answer_bytes[item] > MAX_ANSWERS:
            answer = {"ok": False, "kind": "no_answer", "text": "the answers are too large"}
        table[s][i] = answer if isinstance(answer, dict) else {"ok": False, "kind": "no_answer",
                                                               "text": "the answer could not be read"}


# What each message of the runner's is handled by (its ``type`` -> a method of Conversation).
HANDLERS: dict[str, Callable[[Conversation, dict], None]] = {
    "hello": Conversation.hello, "ready": Conversation.ready_to_start,
    "plan_request": Conversation.plan, "answer": Conversation.answer, "plan_done": Conversation.plan_done,
    "visible_plan": Conversation.visible_plan, "visible_answers": Conversation.visible_answers,
    "oracle": Conversation.oracle_call, "reference_source": Conversation.source_request,
}


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
