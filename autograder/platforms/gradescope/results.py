"""Gradescope's ``results.json`` for one graded submission, from what grading recorded (the
gradebook, the grading report and the autograded notebook): per graded item one test for its
visible checks (always shown) and one for its hidden checks (shown as the instructor chose:
after the grades are published, after the due date, or never), per written answer one test
without points (a person grades it), the late-work and unverified notes and the problems
found, all as plain text (nothing a student wrote is rendered), numbers finite."""

from __future__ import annotations

import math
from typing import Any

from ...course import Course, read_json
from ...inside.cells import item_of

__all__ = ["results_for", "score_number", "plain_text", "MAX_OUTPUT"]

MAX_OUTPUT = 20_000  # characters of one test's output (a written answer, a report)


def score_number(value: Any) -> float:
    """A score as results.json may hold it: finite, 4 decimals (strict JSON has no NaN)."""
    value = float(value or 0.0)
    return round(value, 4) if math.isfinite(value) else 0.0


def plain_text(value: Any, limit: int = MAX_OUTPUT) -> str:
    """A string for results.json: no control or bidirectional characters but newlines and
    tabs, no lone surrogates, cut at ``limit``."""
    from ...doors.outbound import clean_text
    text = clean_text(str(value))
    return text if len(text) <= limit else text[:limit] + "\n… (cut here)"


def _parts(item: str, data: dict | None, score: float, max_score: float) -> list[tuple[str, float, float, str]]:
    """An item's tests: ``(which, score, max_score, output)`` for its visible checks and for
    its hidden ones (either left out when it has none)."""
    from course_lib.grading import get_spec
    from course_lib.grading.judge.results import ItemResult, format_report

    from ...pipeline.judge import not_checked
    if data is None:  # nothing ran (a rejected or unreadable submission): the spec's points
        try:
            subs = [(s.hidden, float(s.points)) for s in get_spec(item).subchecks]
        except KeyError:
            subs = [(False, max_score)]
        out = []
        for hidden in (False, True):
            points = sum(p for h, p in subs if h == hidden)
            if points or any(h == hidden for h, _ in subs):
                out.append(("hidden" if hidden else "visible", 0.0, points, "Not graded: see the notes above."))
        return out
    result = ItemResult.from_data(data)
    reason = not_checked(result)
    out = []
    visible_score = 0.0
    for hidden in (False, True):
        subs = [r for r in result.results if r.hidden == hidden]
        if not subs:
            continue
        points = float(sum(r.points for r in subs))
        part = ItemResult(result.item, subs, True, points, result.reference_used,
                          list(result.notes) if not hidden else [])
        if hidden:  # the rest of the item's score as the gradebook holds it
            earned = min(max(score - visible_score, 0.0), points)
        else:
            earned = visible_score = min(part.earned, score)
        text = format_report(part)
        if reason and reason not in text:
            text = reason + "\n" + text
        out.append(("hidden" if hidden else "visible", earned, points, text))
    return out


def results_for(course: Course, assignment: str, student: str, hidden_visibility: str) -> dict:
    """Gradescope's results of ``student``'s graded ``assignment`` (as the gradebook, the
    report and the autograded notebook hold it): see the module docstring."""
    import nbformat
    from nbgrader import utils as nbutils
    from nbgrader.api import MissingEntry

    from ...reports.feedback import grading_notes, lateness
    from ...course.release import recorded_notebooks
    report = read_json(course.report_path(assignment, student), {}) or {}
    tests: list[dict] = []
    notes: list[str] = []
    total = 0.0
    extra: dict[str, Any] = {"student": student, "notebooks": {}}
    with course.gradebook() as gb:
        for notebook in recorded_notebooks(course, assignment):
            record = report.get("notebooks", {}).get(notebook, {})
            cells = {c["grade_id"]: c for c in record.get("cells", [])}
            items = record.get("items", {})
            try:
                sub = gb.find_submission_notebook(notebook, assignment, student)
                penalty = float(sub.late_submission_penalty or 0.0)
                scores = {g.name: float(g.score or 0.0) for g in sub.grades}
                score = float(sub.score) - penalty
            except MissingEntry:
                penalty, scores, score = 0.0, {}, 0.0
            total += score
            released = nbformat.read(str(course.release_dir / assignment / f"{notebook}.ipynb"), as_version=4)
            graded_path = course.autograded_path(student, assignment, notebook)
            answers = {}
            if graded_path.is_file():
                for cell in nbformat.read(str(graded_path), as_version=4).cells:
                    gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
                    if cell.cell_type == "markdown" and gid:
                        answers[gid] = cell.source
            written = 0.0
            for cell in released.cells:
                meta = cell.get("metadata", {}).get("nbgrader", {})
                gid = meta.get("grade_id", "")
                if not nbutils.is_grade(cell):
                    continue
                points = float(meta.get("points", 0) or 0)
                number = len({t["number"].split(".")[0] for t in tests}) + 1
                if cell.cell_type == "markdown":
                    written += points
                    answer = answers.get(gid, "").strip()
                    tests.append({"name": f"{notebook}: written answer {gid} ({points:g} points, graded by a person)",
                                  "number": str(number), "visibility": "visible",
                                  "output": plain_text(answer or "(no answer was written)")})
                    continue
                item = item_of(gid)
                got = scores.get(gid, float(cells.get(gid, {}).get("score", 0.0)))
                for which, earned, max_score, output in _parts(item, items.get(item), got, points):
                    label = "visible checks (as in your notebook)" if which == "visible" else "hidden checks"
                    tests.append({"name": f"{notebook}: {item}: {label}", "number": f"{number}.{1 + (which == 'hidden')}",
                                  "score": score_number(earned), "max_score": score_number(max_score),
                                  "visibility": "visible" if which == "visible" else hidden_visibility,
                                  "output": plain_text(output)})
            automatic = sum(float(c.get("max_score", 0)) for c in record.get("cells", [])) or \
                sum(float(c.metadata.nbgrader.get("points", 0) or 0) for c in released.cells
                    if nbutils.is_grade(c) and c.cell_type == "code")
            line = f"{notebook}: {score:g} of {automatic:g} points from the checks"
            if written:
                line += f"; the written answers ({written:g} points) are graded by a person"
            notes.append(line + ".")
            late = lateness(course.db_url, assignment, notebook, student) if record else {}
            shown = grading_notes(record or {"notebook": notebook}, late)
            if shown["late"]:
                notes.append(f"Late work: {shown['late']}")
            if record.get("unverified"):
                notes.append("Unverified: this submission was graded without sealing its code off from the grader; "
                             "the score may change when it is graded again.")
            problems = [p for p in shown["problems"] if p]
            if problems:
                notes.append("Found while grading:\n" + "\n".join(f"- {p}" for p in problems))
            extra["notebooks"][notebook] = {"score": score_number(score), "late_penalty": score_number(penalty),
                                            "status": record.get("status", "not graded")}
    return {"score": score_number(total), "output": plain_text("\n\n".join(notes)), "tests": tests, "extra_data": extra}
