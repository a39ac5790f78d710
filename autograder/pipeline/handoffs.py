"""What one stage of grading hands the next, as data.

    prepare ──Task (its Job)──▶ worker: run ──RunOutcome──▶ judge ──Judgement──▶ WorkerResult ──▶ record

- :class:`Task`: one notebook of one student's submission in the instructor's process, from
  prepare to record: its problems so far, its fingerprint, and its :class:`Job` (or none);
- :class:`Job`: what a grading worker needs to grade it, plain data (it travels to a worker
  process or a Dask worker as it is);
- :class:`RunOutcome`: what the run stage kept of the notebook once its seal is gone, and how
  the run ended (:class:`Ending`); the judge reads this, never the live process;
- :class:`Judgement`: the items' results and the autograded notebook's test cells;
- :class:`WorkerResult`: what the worker sends back (plain data), recorded by the instructor's
  process alone.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, TypedDict

__all__ = ["Job", "Task", "Ending", "RunOutcome", "Judgement", "WorkerResult"]


class Job(TypedDict, total=False):
    """One notebook to grade, as prepare makes it. ``notebook`` and ``limits`` are needed; the
    rest have defaults (a test may give a notebook alone)."""

    job_id: str  # "<student>/<notebook>" (autograde: "<assignment>/<student>/<notebook>"): its result's key
    job_dir: str  # the grader's scratch folder for it (removed afterwards)
    notebook: str  # the sanitized notebook, JSON text, hidden tests included (they never enter the seal)
    extra_files: list[tuple[str, str]]  # (name in the submission, path) of its other files
    limits: dict[str, Any]  # autograder.sealing.sandbox.Limits as a dict
    course_copy: str  # the sandbox's course_lib (autograder.sealing.course_copy)
    salts: dict[str, int]  # item -> salt of its hidden inputs
    gpu: bool  # NVIDIA devices in the seal, checks judged on CUDA
    device: str  # "cuda" with gpu, else "cpu"
    threads: int  # CPU threads of the notebook
    isolation: str  # bubblewrap, container or none (autograder.sealing.isolation)
    container_user: dict | None  # container mode's user ({"name", "uid", "gid"})
    hard_timeout: float  # seconds after which its worker is stopped (autograder.pipeline.pool)
    address_space_mb: int  # what a fresh Python of the grader's environment maps, measured once per batch
    #                        (autograder.sealing.sandbox.python_address_space_mb); absent: the worker measures it


class WorkerResult(TypedDict, total=False):
    """What grading one job gave: the autograded notebook and its scores, or ``crash``."""

    job_id: str
    notebook: str  # the autograded notebook, JSON text
    cells: list[dict]  # per test cell: {"grade_id", "score", "max_score", "error"}
    items: dict[str, dict]  # item -> course_lib.grading.judge.results.ItemResult as data
    problems: list[dict]  # autograder.course.problems.Problem
    seconds: float
    oracle_calls: int  # calls of course_lib's references the notebook made (autograder.pipeline.reference_oracle)
    isolation: str
    seal: dict[str, str]  # how the run was sealed: "how" (forked from a zygote, a fresh sandbox, and why), the
    #                       syscall filter and what the kernel said of the runner before the first cell
    survivors: list[int]  # container mode: processes of the student's user still there after they were killed
    worker: str  # the Dask worker that graded it
    crash: str  # why nothing was graded (the worker died, timed out, or could not seal)
    hard_timeout: bool  # the crash was the job's hard timeout


@dataclass
class Task:
    """One notebook of one student's submission on its way through the stages: its problems
    so far, the fingerprint of what it was graded with, and its job (None: nothing to run;
    ``kept``: graded before with the same inputs, nothing to do)."""

    assignment: str
    student: str
    notebook: str
    problems: list[dict]
    fingerprint: str = ""
    job: Job | None = None
    kept: bool = False


class Ending(enum.Enum):
    """How a notebook's run ended."""

    FINISHED = "finished"  # every cell ran (some may have raised)
    EXIT_CALLED = "exit_called"  # the notebook called exit()
    PROCESS_ENDED = "process_ended"  # its process died: os._exit, a crash, out of memory
    OUT_OF_MEMORY = "out_of_memory"  # its processes together went past the memory limit
    NOTEBOOK_TIMEOUT = "notebook_timeout"
    CELL_TIMEOUT = "cell_timeout"  # a cell ran past its limit and did not stop when interrupted
    PROTOCOL_BROKEN = "protocol_broken"  # its process sent what the grader does not accept
    STOPPED = "stopped"  # it stopped without saying why


@dataclass
class RunOutcome:
    """What the run stage hands the judge once the notebook's seal is gone."""

    notebook: dict  # the submitted notebook (hidden tests included), as JSON data
    tests: dict[str, str]  # grade id of each test cell -> its item
    items: list[str]  # the items with a check spec, in the notebook's order
    salts: dict[str, int]
    device: str  # where answers are judged: "cpu" or "cuda"
    plans: dict[str, Any]  # item -> the plan its test cell was served (course_lib.grading.judge.trial.ItemPlan)
    answers: dict[str, list[list[Any]]]  # item -> the answers, per sub-check, per call (None: none came)
    outputs: dict[int, list[dict]]  # cell index -> its outputs, validated and capped
    counts: dict[int, int | None]  # cell index -> its execution count
    ending: Ending
    reason: str = ""  # how it ended, in words ("" when it finished)
    ended_at: int | None = None  # the cell it ended in
    events: list[dict] = field(default_factory=list)  # problems found while it ran
    isolation: str = "bubblewrap"
    survivors: list[int] = field(default_factory=list)
    oracle_calls: int = 0
    seal_how: str = ""  # the way within the isolation (autograder/pipeline/seals.py): forked, a fresh sandbox
    seal: dict[str, str] = field(default_factory=dict)  # what the runner said of its seal before the first cell

    @property
    def cells(self) -> list[dict]:
        return self.notebook["cells"]


@dataclass
class Judgement:
    """What the judge found: every item's result (course_lib.grading.judge.results.ItemResult), the
    test cells' scores as recorded (``{"grade_id", "score", "max_score", "error"}``), and the
    problems it found (a test cell without a check). The autograded notebook is the outcome's,
    filled in."""

    results: dict[str, Any]
    cells: list[dict]
    problems: list[dict]
