"""Per-student feedback HTML: nbgrader's feedback page without the hidden tests.

nbgrader's ``GenerateFeedback`` renders the autograded notebook, so its test cells
show the hidden test code. Here nbgrader's ``ClearHiddenTests`` preprocessor runs
first, and the tracebacks of failing test cells (which quote the cell's code) are
cut to the error's name and message: a student sees each test cell's visible call
and the report it printed (the check results and hint messages), never the hidden
code. The problems found
while grading are shown at the top; a notebook that could not be graded at all gets
a short page saying why.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import multiprocessing.connection
import re
import resource
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable

from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor
from nbgrader.converters import GenerateFeedback
from nbgrader.coursedir import CourseDirectory
import nbgrader as nbgrader_package
from nbgrader import utils as nbutils
from nbgrader.api import Gradebook
from nbgrader.preprocessors import ClearHiddenTests, GetGrades, NbGraderPreprocessor
from jinja2 import Environment, FileSystemLoader
from traitlets import Float, Unicode
from traitlets.config import Config

from ..course import Course, read_json
from ..course.problems import INSTRUCTOR_ONLY, problem
from ..doors.intake import shown
from ..doors.allowlist import with_csp
from ..doors.outbound import IMAGE_TYPES, SafeHTMLExporter, clean_output
from ..inside.cells import item_of
from ..inside.limits import vm_size

__all__ = ["generate_feedback", "grading_notes", "SOURCE_SHOWN"]

SOURCE_SHOWN = 100_000  # characters of one cell's source shown on a page
FEEDBACK_MEMORY_MB = 2048  # what rendering one student's pages may take
FEEDBACK_SECONDS = 300

_TEMPLATES = Path(__file__).resolve().parent / "templates"
_NBGRADER_TEMPLATES = Path(nbgrader_package.__file__).resolve().parent / "server_extensions" / "formgrader" / "templates"

_LOG = logging.getLogger("autograder.reports.feedback")
_LOG.addHandler(logging.NullHandler())
_LOG.propagate = False


class HideTestTracebacks(NbGraderPreprocessor):
    """Error outputs of graded test cells keep only ``Name: message``: their
    tracebacks quote the cell's code, hidden tests included."""

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type == "code" and nbutils.is_grade(cell) and not nbutils.is_solution(cell):
            for output in cell.get("outputs", []):
                if output.get("output_type") == "error":
                    value = str(output.get("evalue", "")).strip()
                    output["traceback"] = [f"{output.get('ename', 'Error')}: {value}" if value
                                           else str(output.get("ename", "Error"))]
        return cell, resources


class MarkAwaitingAnswers(NbGraderPreprocessor):
    """Written answers that still wait for a person (no manual score yet) get
    ``metadata.workbook_awaiting``: the page says "not graded yet" instead of a 0."""

    def preprocess(self, nb, resources):
        info = resources["nbgrader"]
        with Gradebook(info["db_url"]) as gb:
            submission = gb.find_submission_notebook(info["notebook"], info["assignment"], info["student"])
            self._awaiting = {g.name for g in submission.grades
                              if g.manual_score is None and g.needs_manual_grade and g.cell.cell_type == "markdown"}
        return super().preprocess(nb, resources)

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type == "markdown" and cell.metadata.get("nbgrader", {}).get("grade_id") in self._awaiting:
            cell.metadata["workbook_awaiting"] = True
        return cell, resources


class SafeOutputs(NbGraderPreprocessor):
    """What a person sees of a submission's cells stays within the page's budget: only
    outputs of safe types (text, PNG and JPEG images, errors; the autograded notebook
    holds no others, this makes sure), a cell's source cut at 100 kB for display, and,
    once the page would pass ``budget_mb``, sources cut and outputs left out, with a note.
    Graded cells (the grader's reports, the student's answers) are always shown whole."""

    budget_mb = Float(5.0, help="the page's size budget in MB").tag(config=True)

    def preprocess(self, nb, resources):
        self._left = int(self.budget_mb * 2**20)
        self._dropped = self._cut = 0
        nb, resources = super().preprocess(nb, resources)
        if self._dropped or self._cut:
            resources.setdefault("workbook_page_notes", []).append(
                f"{self._dropped} outputs or pasted images were left out of this page and {self._cut} cells "
                f"shortened: it would have been over {self.budget_mb:g} MB. Open the notebook in JupyterLab to see "
                "all of it.")
        return nb, resources

    def preprocess_cell(self, cell, resources, index):
        graded = nbutils.is_grade(cell) or nbutils.is_solution(cell)
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else str(source)
        shown_chars = SOURCE_SHOWN if graded else max(0, min(SOURCE_SHOWN, self._left))
        if len(source) > shown_chars:
            source = source[:shown_chars] + f"\n… ({len(source) - shown_chars:,} more characters not shown)"
            self._cut += 1
        cell["source"] = source
        self._left -= len(source)
        if cell.get("cell_type") == "markdown" and isinstance(cell.get("attachments"), dict):
            kept_images = {}
            for name, attachment in cell["attachments"].items():
                if not isinstance(name, str) or not isinstance(attachment, dict):
                    continue
                image = {m: v for m, v in attachment.items() if m in IMAGE_TYPES}
                size = sum(len(str(v)) for v in image.values())
                if size > self._left:  # a pasted photo past the page's budget: left out, with the note
                    self._dropped += 1
                    continue
                self._left -= size
                kept_images[name] = image
            cell["attachments"] = kept_images
        kept = []
        for output in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            clean = clean_output(output)
            if clean is None:
                continue
            size = len(json.dumps(clean))
            if size > self._left and not graded:
                self._dropped += 1
                continue
            self._left -= size
            kept.append(clean)
        if cell.get("cell_type") == "code":
            cell["outputs"] = kept
        return cell, resources


def regrade_words(regrades: list, notebook: str) -> list[str]:
    """"Regraded on 2026-12-02: item causal_mask 2 → 3 points. NOTE", one line per regrade that
    moved this notebook's points (the grading report's ``regrades``, autograder/pipeline/regrade.py)."""
    lines = []
    for entry in regrades if isinstance(regrades, list) else []:
        changes = [c for c in entry.get("changes", []) if c.get("notebook") == notebook]
        if not changes:
            continue
        moved = "; ".join(f"item {c['item']} {c['old']:g} → {c['new']:g} points" for c in changes)
        note = f" {entry['note']}" if entry.get("note") else ""
        lines.append(f"Regraded on {str(entry.get('when', ''))[:10]}: {moved}.{note}")
    return lines


def grading_notes(record: dict, late: dict | None = None, page_notes: list[str] = (),
                  regrades: list | None = None) -> dict:
    """What the top of a notebook's feedback page shows (templates/workbook_feedback/
    grading_notes.html.j2): its score (after a late penalty: ``late`` from
    :func:`lateness`), whether it is unverified, the regrades that moved its points, the
    problems found while grading (flags meant for the instructor left out) and notes on the
    page itself (outputs left out)."""
    late = late or {}
    score = record.get("score", 0) - late.get("penalty", 0.0)
    return {"notebook": record["notebook"], "score": f"{score:g}",
            "max_score": f"{record.get('max_score', 0):g}", "unverified": bool(record.get("unverified")),
            "late": late.get("words", ""),
            "problems": [p["message"] for p in record.get("problems", []) if p.get("kind") not in INSTRUCTOR_ONLY],
            "page_notes": list(page_notes), "regrades": regrade_words(regrades or [], record["notebook"])}


def lateness(db_url: str, assignment: str, notebook: str, student: str) -> dict:
    """``{"penalty": points taken off, "words": what the page says}`` from the gradebook: how
    late the submission was and what nbgrader's late-submission plugin took off, or that its
    lateness is unknown (a due date, but no trusted time for the submission)."""
    from nbgrader.api import MissingEntry

    from .grades import late_words
    with Gradebook(db_url) as gb:
        try:
            submission = gb.find_submission(assignment, student)
            penalty = float(gb.find_submission_notebook(notebook, assignment, student).late_submission_penalty or 0)
        except MissingEntry:
            return {}
        due = submission.assignment.duedate
        if due is None:
            return {}
        if submission.timestamp is None:
            return {"penalty": penalty, "words": "When this was handed in is not known (the course's download "
                                                 "carries no time), so lateness was not checked."}
        seconds = submission.total_seconds_late
        if seconds <= 0:
            return {"penalty": penalty, "words": ""}
        words = f"Handed in {late_words(seconds)} after the due date ({due:%Y-%m-%d %H:%M} UTC)"
        return {"penalty": penalty, "words": words + (f": {penalty:g} points were taken off (late-submission "
                                                      "penalty); the score above is after it." if penalty else ".")}


class AddGradingNotes(NbGraderPreprocessor):
    """Puts the notebook's grading notes (from its report and the gradebook) in
    ``resources["workbook_notes"]``."""

    reports_dir = Unicode("", help="grading/reports of the course").tag(config=True)

    def preprocess(self, nb, resources):
        ids = resources["nbgrader"]
        report = read_json(Path(self.reports_dir) / ids["assignment"] / f"{ids['student']}.json") or {}
        record = report.get("notebooks", {}).get(ids["notebook"])
        if record is not None:
            late = lateness(ids["db_url"], ids["assignment"], ids["notebook"], ids["student"])
            resources["workbook_notes"] = grading_notes(record, late, resources.get("workbook_page_notes", []),
                                                        report.get("regrades"))
        return nb, resources


def _failure_page(record: dict, assignment: str, student: str) -> str:
    env = Environment(loader=FileSystemLoader(str(_TEMPLATES / "workbook_feedback")), autoescape=True)
    return env.get_template("failure.html.j2").render(
        title=f"{assignment} / {record['notebook']} — feedback for {student}", notes=grading_notes(record)) + "\n"


def _nbgrader_feedback(course: Course, assignment: str, student: str, budget_mb: float,
                       compiled_templates: str = "") -> None:
    cfg = Config(course.config)
    cfg.GenerateFeedback.preprocessors = [HideTestTracebacks, ClearHiddenTests, GetGrades, MarkAwaitingAnswers,
                                            SafeOutputs, AddGradingNotes, CSSHTMLHeaderPreprocessor]
    cfg.GenerateFeedback.exporter_class = SafeHTMLExporter  # math as MathML, every student string sanitised
    cfg.AddGradingNotes.reports_dir = str(course.reports_dir)
    cfg.SafeOutputs.budget_mb = budget_mb
    cfg.ClearHiddenTests.enforce_metadata = False
    cfg.HTMLExporter.template_name = "workbook_feedback"  # nbgrader's, with MathML and "not graded yet"
    cfg.HTMLExporter.template_file = "workbook.html.j2"
    cfg.HTMLExporter.extra_template_basedirs = [str(_TEMPLATES), str(_NBGRADER_TEMPLATES)]
    cfg.HTMLExporter.embed_images = False  # never read a file a student's markdown names
    cfg.SafeHTMLExporter.compiled_templates = compiled_templates
    coursedir = CourseDirectory(config=cfg)
    coursedir.assignment_id = assignment
    coursedir.student_id = student
    errors: list[str] = []

    class Keep(logging.Handler):  # nbgrader logs the real error and raises a generic one
        def emit(self, record: logging.LogRecord) -> None:
            if record.exc_info and record.exc_info[1] is not None:
                errors.append(f"{type(record.exc_info[1]).__name__}: {record.exc_info[1]}")

    log = logging.getLogger(f"autograder.reports.feedback.{student}")
    log.propagate = False
    log.addHandler(Keep(level=logging.ERROR))
    converter = GenerateFeedback(coursedir=coursedir, config=cfg, log=log)
    converter.force = True
    try:
        converter.start()
    except Exception as exc:
        raise RuntimeError(errors[0] if errors else str(exc)) from None


def _bounded_child(conn, target, args, memory_mb: int) -> None:
    try:
        limit = vm_size() + memory_mb * 2**20  # on top of what this process already maps
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        target(*args)
        conn.send("")
    except BaseException as exc:  # reported to the parent, which goes on
        conn.send(f"{type(exc).__name__}: {exc}"[:500])
    finally:
        conn.close()


class _Bounded:
    """``target(*args)`` running in a forked process with ``memory_mb`` more address space
    than this one maps and ``seconds`` of time (see :func:`bounded_many`)."""

    def __init__(self, target, args: tuple, memory_mb: int, seconds: float) -> None:
        context = multiprocessing.get_context("fork")
        self.memory_mb, self.seconds = memory_mb, seconds
        self.conn, child = context.Pipe(duplex=False)
        self.process = context.Process(target=_bounded_child, args=(child, target, args, memory_mb), daemon=True)
        self.process.start()
        child.close()
        self.deadline = time.monotonic() + seconds

    def finish(self) -> str:
        """Wait for it (until its deadline at most): "" when it finished, else why not."""
        message = None
        ended = self.conn.poll(max(0.0, self.deadline - time.monotonic()))  # a message, or the pipe closed
        if ended:
            try:
                message = self.conn.recv()
            except EOFError:  # it died without a word: let it be reaped below
                message = None
        self.conn.close()
        self.process.join(5 if ended else 0)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
            return message if message is not None else f"it took longer than {self.seconds:g} s and was stopped"
        if message is None:
            return f"it stopped (exit code {self.process.exitcode}; out of its {self.memory_mb} MB?)"
        return message


def bounded_many(calls: list[tuple], workers: int, memory_mb: int = FEEDBACK_MEMORY_MB,
                 seconds: float = FEEDBACK_SECONDS, done: Callable[[], None] = lambda: None) -> list[str]:
    """Run each ``(target, args)`` of ``calls`` in a forked process with ``memory_mb`` more address
    space than this one maps and ``seconds`` of time, up to ``workers`` at once; for each, in order,
    "" when it finished, else why not (``done()`` hears of each as it ends). One student's pages can
    then never cost the others theirs."""
    results: list[str | None] = [None] * len(calls)
    running: dict[int, _Bounded] = {}
    queue = list(enumerate(calls))
    while queue or running:
        while queue and len(running) < max(1, workers):
            index, (target, args) = queue.pop(0)
            running[index] = _Bounded(target, args, memory_mb, seconds)
        soonest = min(r.deadline for r in running.values())
        ready = multiprocessing.connection.wait([r.conn for r in running.values()],
                                                timeout=max(0.0, soonest - time.monotonic()))
        for index, render in list(running.items()):
            if render.conn in ready or time.monotonic() >= render.deadline:
                results[index] = render.finish()
                del running[index]
                done()
    return [r if r is not None else "" for r in results]


_TOC = {"Test cell": "Test of {}", "Written response": "Written answer {}", "Coding free-response": "Code {}"}
_WRAP = ("<style>/* long report and hint lines wrap instead of scrolling */ div.output_area pre, div.output_text pre, "
         ".workbook-grading-notes li { white-space: pre-wrap; overflow-wrap: anywhere; }"
         " /* markdown tables as JupyterLab draws them */ .text_cell_render table { border-collapse: collapse; "
         "margin: 0.5em 0; } .text_cell_render th, .text_cell_render td { border: 1px solid #bbb; "
         "padding: 0.2em 0.6em; text-align: left; } .text_cell_render th { background: #f2f2f2; }</style>")


def _readable(text: str) -> str:
    """nbgrader's table of contents says "Test cell" for every test: name each item (grade ids
    are checked to be plain names before a page is rendered), and wrap long lines."""
    text = re.sub(r'<a href="#([A-Za-z0-9_-]+)">(Test cell|Written response|Coding free-response)</a>',
                  lambda m: f'<a href="#{m.group(1)}">{_TOC[m.group(2)].format(item_of(m.group(1)))}</a>',
                  text)
    return text.replace("</head>", _WRAP + "\n</head>", 1)


def _finish_page(page: Path, budget_mb: float) -> None:
    """The page with its Content-Security-Policy first in its head, its table of contents
    naming the items; a page still over twice the budget (the template's own weight, huge
    sources) is replaced by a short one."""
    text = _readable(page.read_text(encoding="utf-8"))
    if len(text) > 2 * budget_mb * 2**20:
        text = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{page.stem}</title></head><body>"
                f"<p>This feedback page would have been {len(text) / 2**20:.0f} MB, over the limit of "
                f"{2 * budget_mb:g} MB: ask your instructor for the autograded notebook.</p></body></html>")
    page.write_text(with_csp(text), encoding="utf-8")


def generate_feedback(course: Course, assignment: str, students: list[str] | None = None,
                      workers: int = 1, progress: Callable[[int], None] | None = None) -> dict[str, list[Path]]:
    """Write ``grading/feedback/<student>/<assignment>/<notebook>.html``; return the files.
    Each student's pages are rendered in a process of their own, within a memory and time
    budget, ``workers`` students at once; a page is kept under ``c.Intake.feedback_mb``
    (outputs past it left out). ``progress(n)`` is told how many students there are to render
    (n > 0), then once (n = 0) as each student's pages are done."""
    from ..course.settings import intake_limits
    budget = intake_limits(course).feedback_mb
    reports = course.reports_dir / assignment
    students = students or sorted(p.stem for p in reports.glob("*.json") if not p.stem.startswith("_"))
    records: dict[str, dict] = {}
    for student in students:
        report = read_json(course.report_path(assignment, student))
        if report is None:
            raise FileNotFoundError(f"{shown(student)} has no autograding report for {assignment}: run "
                                    f"`workbook autograde {assignment}` first")
        records[student] = report
        shutil.rmtree(course.feedback_dir / student / assignment, ignore_errors=True)
    graded = [s for s, report in records.items()
              if any(course.autograded_path(s, assignment, n).exists() for n in report["notebooks"])]
    # the batch's pages share their compiled templates (the folder is this run's own, mode 0700)
    if progress:
        progress(len(graded))
    with tempfile.TemporaryDirectory(prefix="workbook-feedback-templates-") as compiled:
        errors = bounded_many([(_nbgrader_feedback, (course, assignment, s, budget, compiled)) for s in graded],
                              workers, done=(lambda: progress(0)) if progress else (lambda: None))
    for student, error in zip(graded, errors):
        if error:  # reported on the page, and the batch goes on
            for record in records[student]["notebooks"].values():
                record.setdefault("problems", []).append(
                    problem("feedback", f"the feedback page could not be rendered: {shown(error, 300)}"))
            shutil.rmtree(course.feedback_dir / student / assignment, ignore_errors=True)
    written: dict[str, list[Path]] = {}
    for student, report in records.items():
        out_dir = course.feedback_dir / student / assignment
        out_dir.mkdir(parents=True, exist_ok=True)
        files = []
        for notebook, record in sorted(report["notebooks"].items()):
            page = out_dir / f"{notebook}.html"
            if not page.exists():  # nothing rendered: the notebook could not be graded (or its page failed)
                page.write_text(_failure_page(record, assignment, student), encoding="utf-8")
            _finish_page(page, budget)
            files.append(page)
        written[student] = files
    return written
