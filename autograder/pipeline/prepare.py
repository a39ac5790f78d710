"""Prepare: read each submission and make the job a grading worker runs.

The first stage of ``workbook autograde`` (autograder/pipeline/autograde.py), in the instructor's
process. A :class:`Batch` holds what every job of one assignment shares (the scratch folder,
the course's secret, the settings a fingerprint depends on, collect's log, the released
checksums, the sandbox's course copies). For each student and notebook (:meth:`Batch.tasks`)
the submitted notebook is read through :mod:`autograder.doors.intake` (its limits checked
before the JSON is parsed), cells claiming ids the assignment lacks become ordinary cells,
nbgrader's own steps repair it (locked cells and tests put back, outputs cleared), and the
job gets its fingerprint (a rerun grades only what changed) and its items' salts (derived
from the course's secret, which no sandbox sees): a :class:`~autograder.pipeline.handoffs.Task`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import hmac
import json
import logging
import os
import secrets
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat
from nbformat import NotebookNode
from nbgrader import utils as nbutils
from nbgrader.api import Gradebook
from nbgrader.preprocessors import CheckCellMetadata, ClearOutput, DeduplicateIds, OverwriteCells, OverwriteKernelspec
from traitlets.config import Config

from ..course import Course, CourseError, read_json
from ..course.manifest import course_manifest, manifest_fingerprint
from ..course.problems import WHOLE_SUBMISSION, problem
from ..course.release import recorded_notebooks
from ..course.settings import intake_limits
from ..doors import intake
from ..doors.intake import IntakeLimits, Refused, shown
from ..inside.cells import item_of
from ..sealing import sandbox, trees
from ..sealing.course_copy import build_course_copy
from .handoffs import Job, Task
from .options import GradingOptions

__all__ = ["Batch", "read_submission", "submission_time", "foreign_cells", "structural_problems",
           "sanitize", "released_checksums", "course_secret", "item_salt", "course_fingerprint", "extra_files",
           "test_items", "submission_fingerprint", "make_scratch", "sweep_stale_scratch"]

_QUIET = logging.getLogger("autograder.quiet")
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False


SCRATCH_PREFIX = "workbook-autograde-"
OWNER_FILE = ".owner"  # in a scratch folder: "<pid> <start time>" of the run that made it


def make_scratch() -> Path:
    """A private scratch folder for one run's jobs, marked with the run's process."""
    scratch = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX))
    (scratch / OWNER_FILE).write_text(f"{os.getpid()} {sandbox.start_time(os.getpid())}\n")
    return scratch


def sweep_stale_scratch(folder: str | Path | None = None) -> list[Path]:
    """Remove the scratch folders that runs killed before their own clean-up left behind (a
    SIGKILL gives them no chance): the folders of this user, in ``folder`` (the temporary
    folder), whose run has ended. A running one, another user's, a link or a folder that
    does not say which run made it is left alone; so is everything where /proc cannot tell
    whether a process runs. Returns what was removed."""
    if sandbox.start_time(os.getpid()) is None:
        return []
    removed = []
    for entry in Path(folder or tempfile.gettempdir()).glob(SCRATCH_PREFIX + "*"):
        try:
            info = entry.lstat()
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
                continue
            pid, started = (entry / OWNER_FILE).read_text().split()[:2]
            if str(sandbox.start_time(int(pid))) == started:
                continue
        except (OSError, ValueError):
            continue
        if trees.remove_tree(entry).complete:
            removed.append(entry)
    return removed


@dataclass
class Batch:
    """One assignment's grading, as the prepare stage sees it: what every job shares."""

    course: Course
    assignment: str
    options: GradingOptions
    notebooks: list[str]  # the assignment's, as the gradebook records them
    students: list[str]  # whose submissions are graded
    scratch: Path  # the jobs' folders and the sandbox's course copies (removed by :meth:`clean`)
    secret: bytes
    settings: str  # what a submission's fingerprint depends on besides its own files
    collect_log: dict
    checksums: dict[str, dict[str, str]]
    intake_rules: IntakeLimits
    container_user: dict | None = None  # container mode's user (autograder/sealing/container.py)
    digest: str = ""  # the course's fingerprint (autograder/course/manifest.py), in each grade's history
    copies: dict[str, Path] = field(default_factory=dict)

    @classmethod
    def start(cls, course: Course, assignment: str, options: GradingOptions,
              container_user: dict | None = None) -> "Batch":
        """A new batch of ``options.students`` (default: everyone who handed the assignment in),
        with its scratch folder (outside the course folder: no sandbox may see the course)."""
        notebooks = recorded_notebooks(course, assignment)
        students = options.students or course.submitted_students(assignment)
        unknown = [s for s in options.students or [] if not course.submission_dir(s, assignment).is_dir()]
        if unknown:
            raise CourseError(f"no submission of {assignment} for: {', '.join(unknown)}")
        checksums = {n: released_checksums(course, assignment, n) for n in notebooks}
        collect_log = read_json(course.collect_log_path(assignment), {}) or {}
        secret = course_secret(course)
        sealed_by = options.sealed_by()
        digest = course_fingerprint(course)
        settings = json.dumps({"limits": options.limits.__dict__, "unsafe": not sealed_by.sealed,
                               "container": sealed_by.one_user, "gpu": options.gpu,
                               "course": digest, "secret": hashlib.sha256(secret).hexdigest()[:8]},
                              sort_keys=True)
        rules = intake_limits(course)
        sweep_stale_scratch()
        scratch = make_scratch()
        if scratch.resolve().is_relative_to(course.root):
            raise CourseError(f"the scratch folder {scratch} is inside the course folder; set TMPDIR elsewhere")
        scratch.chmod(0o711)
        return cls(course, assignment, options, notebooks, students, scratch, secret, settings, collect_log, checksums,
                   rules, dict(container_user) if container_user else None, digest)

    def clean(self) -> None:
        trees.remove_tree(self.scratch)  # (the jobs' folders, which the submissions' code wrote in)

    def handed_in(self) -> dict[str, dt.datetime | None]:
        """When each student of the batch handed the assignment in (:func:`submission_time`)."""
        return {student: submission_time(self.collect_log, student) for student in self.students}

    def tasks(self, gb: Gradebook) -> dict[str, Task]:
        """Every student's notebooks read and repaired (cheap, sequential; the gradebook is only
        read here), keyed ``<student>/<notebook>``."""
        tasks: dict[str, Task] = {}
        for student in self.students:
            for notebook in self.notebooks:
                tasks[f"{student}/{notebook}"] = self.task(gb, student, notebook, len(tasks))
        return tasks

    def course_copy(self, nb: NotebookNode, notebook: str) -> Path:
        """The sandbox's course_lib for this notebook's items (references stubbed), built once."""
        if notebook not in self.copies:
            from course_lib.grading.judge.registry import all_specs

            known = all_specs()
            dest = self.scratch / f"course-{notebook}"
            build_course_copy(dest, [i for i in test_items(nb) if i in known])
            self.copies[notebook] = dest
        return self.copies[notebook]

    def kept(self, task: Task) -> bool:
        """Graded before with the same notebook, course and limits (and its autograded
        notebook still there): nothing to do unless ``force``."""
        old = ((read_json(self.course.report_path(self.assignment, task.student), {}) or {})
               .get("notebooks", {}).get(task.notebook))
        return bool(not self.options.force and old and old.get("fingerprint") == task.fingerprint
                    and old.get("status") in ("graded", "failed")
                    and self.course.autograded_path(task.student, self.assignment, task.notebook).exists()
                    == (old["status"] == "graded"))

    def task(self, gb: Gradebook, student: str, notebook: str, number: int) -> Task:
        """Read one submitted notebook and make its job (``task.job`` stays None when nothing
        can run: its problems say why; ``task.kept`` when it was graded before)."""
        course, assignment = self.course, self.assignment
        folder = course.submission_dir(student, assignment)
        path = folder / f"{notebook}.ipynb"
        extra, links = extra_files(folder)
        task = Task(assignment, student, notebook, [], submission_fingerprint(path, extra, self.settings))
        if self.kept(task):
            task.kept = True
            return task
        rejected = self.collect_log.get("rejected", {})
        if student in rejected:
            task.problems = [problem("rejected", f"rejected at collect: {rejected[student]}")]
            return task
        nb, problems = read_submission(path, self.intake_rules)
        problems += [problem("symlink", f"{link} is a symbolic link; it was not given to the notebook")
                     for link in links]
        collected = [note for note in self.collect_log.get("notes", {}).get(student, [])
                     if f"{notebook}.ipynb" in note["message"]  # e.g. a renamed file
                     or note["kind"] in WHOLE_SUBMISSION]  # e.g. its own timestamp.txt, disbelieved
        # what collect found already (damaged JSON: collect's note names the file handed in) is said once
        said = {note["kind"] for note in collected}
        problems[:] = collected + [p for p in problems if p["kind"] not in said]
        task.problems = problems
        if nb is None:
            return task
        resources = {"nbgrader": {"notebook": notebook, "assignment": assignment, "student": student,
                                  "db_url": course.db_url}}
        try:
            problems.extend(foreign_cells(nb, gb, notebook, assignment))
            problems.extend(structural_problems(nb, gb, notebook, assignment, self.checksums[notebook]))
            nb, more = sanitize(nb, course, resources)
            problems.extend(more)
        except Exception as exc:  # nbgrader raises many kinds on damaged metadata
            problems.append(problem("invalid_notebook", "nbgrader could not read the graded cells "
                                                        f"({type(exc).__name__}: {str(exc)[:200]})"))
            return task
        task.job = self.job(nb, student, notebook, extra, task.fingerprint, number)
        return task

    def job(self, nb: NotebookNode, student: str, notebook: str, extra: list[tuple[str, str]], fingerprint: str,
            number: int) -> Job:
        options, limits, sealed_by = self.options, self.options.limits, self.options.sealed_by()
        return {"job_id": f"{student}/{notebook}", "job_dir": str(self.scratch / f"job-{number}"),
                "notebook": nbformat.writes(nb), "extra_files": extra, "limits": limits.__dict__.copy(),
                "course_copy": str(self.course_copy(nb, notebook)),
                "salts": {i: item_salt(self.secret, self.assignment, notebook, student, i, fingerprint)
                          for i in test_items(nb)},
                "device": "cuda" if options.gpu else "cpu", "gpu": options.gpu, "threads": options.threads_per_kernel,
                "isolation": sealed_by.value, "container_user": self.container_user,
                "hard_timeout": limits.notebook_timeout + 180}


def read_submission(path: Path, limits: IntakeLimits | None = None) -> tuple[NotebookNode | None, list[dict]]:
    """Read a submitted notebook as nbformat 4 through :mod:`autograder.doors.intake` (its limits
    checked before the JSON is parsed); (None, reasons) when it cannot be read. A symbolic
    link is never followed (it could point at a solution or another student's work)."""
    limits = limits or IntakeLimits()
    if path.is_symlink() or any(p.is_symlink() for p in path.parents[:2]):
        return None, [problem("symlink", f"{path.name} is a symbolic link; it was not read")]
    if not path.is_file():
        return None, [problem("missing", f"no submitted notebook {path.name}")]
    size = path.stat().st_size
    if size > limits.notebook_bytes:
        return None, [problem("rejected", f"rejected: {path.name} is {size / 2**20:.1f} MB, over the limit of "
                                          f"{limits.notebook_mb:g} MB for a notebook")]
    try:
        nb, version = intake.read_notebook(path.read_bytes(), path.name, limits)
    except Refused as exc:
        return None, [problem("rejected", f"rejected: {path.name}: {exc}")]
    except ValueError as exc:
        return None, [problem("invalid_json", f"{path.name} is not valid notebook JSON ({exc}); "
                                              "the file is damaged or was not saved from Jupyter")]
    except TypeError as exc:
        return None, [problem("invalid_notebook", f"{path.name}: {exc}")]
    problems = []
    if version < 4:
        problems.append(problem("old_format", f"written by an older Jupyter (nbformat {version}); "
                                              "converted to nbformat 4 before grading"))
    return nb, problems


def submission_time(collect_log: dict, student: str) -> dt.datetime | None:
    """When ``student`` handed the assignment in, as ``collect`` determined it from a source
    the student cannot write (the LMS, the exchange's files, the moment of collect); None
    when nothing told (lateness unknown). A ``timestamp.txt`` the student wrote is never it."""
    text = ((collect_log.get("times") or {}).get(student) or {}).get("time")
    return intake.parse_time(text) if isinstance(text, str) else None


def source_cells(gb: Gradebook, notebook: str, assignment: str) -> dict[str, Any]:
    return {c.name: c for c in gb.find_notebook(notebook, assignment).source_cells}


def released_checksums(course: Course, assignment: str, notebook: str) -> dict[str, str]:
    """grade_id -> checksum of each locked cell as released to students (test cells
    without their hidden part)."""
    path = course.release_dir / assignment / f"{notebook}.ipynb"
    if not path.is_file():
        return {}
    released = nbformat.read(str(path), as_version=4)
    return {c.metadata.nbgrader["grade_id"]: nbutils.compute_checksum(c) for c in released.cells
            if nbutils.is_locked(c) and c.metadata.get("nbgrader", {}).get("grade_id")}


def foreign_cells(nb: NotebookNode, gb: Gradebook, notebook: str, assignment: str) -> list[dict]:
    """Cells whose nbgrader metadata names no cell of the assignment (or is not a dict)
    become ordinary cells: nbgrader would otherwise refuse the whole notebook over one
    stray (or forged) id. One problem for each."""
    known = set(source_cells(gb, notebook, assignment)) | \
        {c.name for c in gb.find_notebook(notebook, assignment).grade_cells}
    problems = []
    for index, cell in enumerate(nb.cells):
        meta = cell.get("metadata", {}).get("nbgrader")
        if meta is None:
            continue
        gid = meta.get("grade_id") if isinstance(meta, dict) else None
        if isinstance(gid, str) and gid in known:
            continue
        del cell["metadata"]["nbgrader"]
        problems.append(problem("foreign_cell", f"cell {index} claims the graded id '{shown(gid, 80)}', which "
                                                "this assignment does not have: it was graded as an ordinary cell"))
    return problems


def structural_problems(nb: NotebookNode, gb: Gradebook, notebook: str, assignment: str,
                         released: dict[str, str]) -> list[dict]:
    """Deleted, duplicated and edited locked cells, found before nbgrader repairs them."""
    source = source_cells(gb, notebook, assignment)
    grade_cells = {c.name for c in gb.find_notebook(notebook, assignment).grade_cells}
    ids: list[str] = []
    problems = []
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        gid = meta.get("grade_id") if isinstance(meta, dict) else None
        if not gid:
            continue
        ids.append(gid)
        src = source.get(gid)
        if src is not None and src.locked and ids.count(gid) == 1:
            try:
                edited = nbutils.compute_checksum(cell) != released.get(gid, src.checksum)
            except Exception:  # damaged metadata
                edited = True
            if edited:
                problems.append(problem("edited_locked", f"locked cell {gid!r} was edited; "
                                                         "the original was put back before grading", gid))
    for gid in sorted({i for i in ids if ids.count(i) > 1}):
        problems.append(problem("duplicate_cells", f"cell {gid!r} appears {ids.count(gid)} times; the last "
                                                   "copy keeps the grade id, the others run as ordinary cells",
                                gid))
    for gid in sorted(grade_cells - set(ids)):
        problems.append(problem("deleted_cells", f"graded cell {gid!r} was deleted; the original was "
                                                 "put back before grading", gid))
    return problems


def sanitize(nb: NotebookNode, course: Course, resources: dict) -> tuple[NotebookNode, list[dict]]:
    """nbgrader's sanitizing steps: clear outputs, de-duplicate ids, reset the
    kernelspec, overwrite locked and test cells from the gradebook (putting back
    deleted graded cells) and validate the nbgrader metadata."""
    problems = []
    cfg = Config(course.config)

    def run(add_missing: bool) -> NotebookNode:
        cfg.OverwriteCells.add_missing_cells = add_missing
        copy = nbformat.from_dict(json.loads(json.dumps(nb)))
        for cls in (ClearOutput, DeduplicateIds, OverwriteKernelspec, OverwriteCells, CheckCellMetadata):
            copy, _ = cls(config=cfg, log=_QUIET).preprocess(copy, resources)
            if cls is DeduplicateIds:  # a de-duplicated copy becomes an ordinary cell
                for cell in copy.cells:
                    if cell.get("metadata", {}).get("nbgrader") == {}:
                        del cell.metadata["nbgrader"]
        return copy

    try:
        return run(True), problems
    except Exception as exc:  # nbgrader could not put the deleted cells back
        problems.append(problem("deleted_cells", "deleted graded cells could not be put back "
                                                 f"({type(exc).__name__}); they score 0"))
        return run(False), problems


def course_secret(course: Course) -> bytes:
    """The course's grading secret (created on first use, readable by its owner only).
    Hidden inputs are derived from it; no sandbox ever sees it."""
    path = course.grading_dir / ".workbook-secret"
    if not path.exists():  # written whole, then linked: a concurrent run never reads half a secret
        course.grading_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=course.grading_dir, prefix=".workbook-secret.")
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(32))
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
        os.unlink(tmp)
    return path.read_bytes()


def item_salt(secret: bytes, assignment: str, notebook: str, student: str, item: str, submission: str = "") -> int:
    """The salt of one item's inputs for one student's submission (deterministic, never 0):
    grading the same submission again gives the same inputs; a resubmission gets new ones."""
    key = f"{assignment}/{notebook}/{student}/{item}/{submission}".encode()
    digest = hmac.new(secret, key, hashlib.sha256).digest()
    return int.from_bytes(digest[:6], "big") | 1


def course_fingerprint(course: Course) -> str:
    """A hash of what grading depends on: course_lib, the autograder, the assignment
    sources and the config (:func:`autograder.course.manifest.course_manifest`)."""
    return manifest_fingerprint(course_manifest(course))


def extra_files(folder: Path) -> tuple[list[tuple[str, str]], list[str]]:
    """The submission's other files (``(relative name, path)``) and the symbolic links
    found (never followed)."""
    files, links = [], []
    if not folder.is_dir() or folder.is_symlink():
        return files, links
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder)
        if any(part.startswith(".") for part in rel.parts):
            continue
        if p.is_symlink() or any(q.is_symlink() for q in p.parents if folder in q.parents):
            if p.suffix != ".ipynb":  # (a linked notebook is reported when it is read)
                links.append(str(rel))
        elif p.is_file() and p.suffix != ".ipynb" and p.name not in ("timestamp.txt", "submission_secret.txt"):
            files.append((str(rel), str(p)))
    return files, links


def test_items(nb: NotebookNode) -> list[str]:
    """The items of the notebook's test cells (``test_<item>``)."""
    return [item_of(c["metadata"]["nbgrader"]["grade_id"]) for c in nb.cells
            if c.get("cell_type") == "code" and nbutils.is_grade(c) and not nbutils.is_solution(c)]


def submission_fingerprint(path: Path, extra: list[tuple[str, str]], salt_key: str) -> str:
    h = hashlib.sha256(salt_key.encode())
    if path.is_file():
        h.update(path.read_bytes())
    for rel, full in extra:
        h.update(rel.encode())
        h.update(Path(full).read_bytes())
    return h.hexdigest()[:16]

