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

import html
import logging
import re
import shutil
from pathlib import Path

from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor
from nbgrader.converters import GenerateFeedback
from nbgrader.coursedir import CourseDirectory
import nbgrader as nbgrader_package
from nbgrader import utils as nbutils
from nbgrader.api import Gradebook
from nbgrader.preprocessors import ClearHiddenTests, GetGrades, NbGraderPreprocessor
from jinja2 import Environment, FileSystemLoader
from traitlets import Unicode
from traitlets.config import Config

from .problems import problem
from .course import Course, read_json

__all__ = ["generate_feedback", "grading_notes"]

_TEMPLATES = Path(__file__).resolve().parent / "templates"
_NBGRADER_TEMPLATES = Path(nbgrader_package.__file__).resolve().parent / "server_extensions" / "formgrader" / "templates"

_LOG = logging.getLogger("autograder.feedback")
_LOG.addHandler(logging.NullHandler())
_LOG.propagate = False


class HideTestTracebacks(NbGraderPreprocessor):
    """Error outputs of graded test cells keep only ``Name: message``: their
    tracebacks quote the cell's code, hidden tests included."""

    def preprocess_cell(self, cell, resources, index):  # noqa: ANN001, ANN201
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

    def preprocess(self, nb, resources):  # noqa: ANN001, ANN201
        info = resources["nbgrader"]
        with Gradebook(info["db_url"]) as gb:
            submission = gb.find_submission_notebook(info["notebook"], info["assignment"], info["student"])
            self._awaiting = {g.name for g in submission.grades
                              if g.manual_score is None and g.needs_manual_grade and g.cell.cell_type == "markdown"}
        return super().preprocess(nb, resources)

    def preprocess_cell(self, cell, resources, index):  # noqa: ANN001, ANN201
        if cell.cell_type == "markdown" and cell.metadata.get("nbgrader", {}).get("grade_id") in self._awaiting:
            cell.metadata["workbook_awaiting"] = True
        return cell, resources


_MATH = re.compile(r"\$\$(.+?)\$\$|(?<![\\$])\$(?![\s$])([^$\n]+?)(?<![\s\\])\$", re.S)
_MATHML_TAGS = {"math", "mrow", "mi", "mn", "mo", "ms", "mtext", "mspace", "msub", "msup", "msubsup", "mfrac",
                "msqrt", "mroot", "mstyle", "mpadded", "mphantom", "menclose", "mover", "munder", "munderover",
                "mtable", "mtr", "mtd", "semantics", "annotation", "merror"}
_UNSAFE_MATHML = re.compile(r"href|javascript:|<script|<iframe|\son\w+\s*=", re.I)


def tex_to_mathml(tex: str, display: bool) -> str:
    """MathML for a TeX formula, or the TeX shown as code when it cannot be converted
    (or the conversion holds anything that could act: links, scripts, handlers)."""
    from latex2mathml.converter import convert

    try:
        mathml = convert(tex, display="block" if display else "inline")
    except Exception:  # noqa: BLE001  (any TeX a student wrote)
        mathml = ""
    tags = set(re.findall(r"<\s*/?\s*([^\s>/]+)", mathml))
    if not mathml or _UNSAFE_MATHML.search(mathml) or not tags <= _MATHML_TAGS:  # e.g. \text{<img ...>}
        return f"<code>{html.escape(tex)}</code>"
    return mathml


class RenderMath(NbGraderPreprocessor):
    """Math in markdown cells becomes MathML when the page is written, so the feedback
    page shows formulas offline, with no MathJax to fetch."""

    def preprocess_cell(self, cell, resources, index):  # noqa: ANN001, ANN201
        if cell.cell_type == "markdown" and "$" in cell.source:
            cell.source = _MATH.sub(lambda m: tex_to_mathml(m.group(1) or m.group(2), m.group(1) is not None),
                                    cell.source)
        return cell, resources


def grading_notes(record: dict) -> dict:
    """What the top of a notebook's feedback page shows (templates/workbook_feedback/
    grading_notes.html.j2): its score, whether it is unverified, and the problems found
    while grading (flags meant for the instructor left out)."""
    return {"notebook": record["notebook"], "score": f"{record.get('score', 0):g}",
            "max_score": f"{record.get('max_score', 0):g}", "unverified": bool(record.get("unverified")),
            "problems": [p["message"] for p in record.get("problems", []) if p.get("kind") != "copied_reference"]}


class AddGradingNotes(NbGraderPreprocessor):
    """Puts the notebook's grading notes (from its report) in ``resources["workbook_notes"]``."""

    reports_dir = Unicode("", help="grading/reports of the course").tag(config=True)

    def preprocess(self, nb, resources):  # noqa: ANN001, ANN201
        ids = resources["nbgrader"]
        report = read_json(Path(self.reports_dir) / ids["assignment"] / f"{ids['student']}.json") or {}
        record = report.get("notebooks", {}).get(ids["notebook"])
        if record is not None:
            resources["workbook_notes"] = grading_notes(record)
        return nb, resources


def _failure_page(record: dict, assignment: str, student: str) -> str:
    env = Environment(loader=FileSystemLoader(str(_TEMPLATES / "workbook_feedback")), autoescape=True)
    return env.get_template("failure.html.j2").render(
        title=f"{assignment} / {record['notebook']} — feedback for {student}", notes=grading_notes(record)) + "\n"


def _nbgrader_feedback(course: Course, assignment: str, student: str) -> None:
    cfg = Config(course.config)
    cfg.GenerateFeedback.preprocessors = [HideTestTracebacks, ClearHiddenTests, GetGrades, MarkAwaitingAnswers,
                                            RenderMath, AddGradingNotes, CSSHTMLHeaderPreprocessor]
    cfg.AddGradingNotes.reports_dir = str(course.reports_dir)
    cfg.ClearHiddenTests.enforce_metadata = False
    cfg.HTMLExporter.template_name = "workbook_feedback"  # nbgrader's, with MathML and "not graded yet"
    cfg.HTMLExporter.template_file = "workbook.html.j2"
    cfg.HTMLExporter.extra_template_basedirs = [str(_TEMPLATES), str(_NBGRADER_TEMPLATES)]
    coursedir = CourseDirectory(config=cfg)
    coursedir.assignment_id = assignment
    coursedir.student_id = student
    converter = GenerateFeedback(coursedir=coursedir, config=cfg, log=_LOG)
    converter.force = True
    converter.start()


def generate_feedback(course: Course, assignment: str, students: list[str] | None = None) -> dict[str, list[Path]]:
    """Write ``grading/feedback/<student>/<assignment>/<notebook>.html``; return the files."""
    reports = course.reports_dir / assignment
    students = students or sorted(p.stem for p in reports.glob("*.json") if not p.stem.startswith("_"))
    written: dict[str, list[Path]] = {}
    for student in students:
        report = read_json(course.report_path(assignment, student))
        if report is None:
            raise FileNotFoundError(f"{student} has no autograding report for {assignment}: run "
                                    f"`workbook autograde {assignment}` first")
        out_dir = course.feedback_dir / student / assignment
        shutil.rmtree(out_dir, ignore_errors=True)
        graded = any(course.autograded_path(student, assignment, n).exists() for n in report["notebooks"])
        if graded:
            try:
                _nbgrader_feedback(course, assignment, student)
            except Exception as exc:  # report it on the page rather than stop the batch
                for record in report["notebooks"].values():
                    record.setdefault("problems", []).append(
                        problem("feedback", f"nbgrader could not render the feedback: {exc}"))
        out_dir.mkdir(parents=True, exist_ok=True)
        files = []
        for notebook, record in sorted(report["notebooks"].items()):
            page = out_dir / f"{notebook}.html"
            if not page.exists():  # nbgrader wrote none: the notebook could not be graded
                page.write_text(_failure_page(record, assignment, student), encoding="utf-8")
            files.append(page)
        written[student] = files
    return written
