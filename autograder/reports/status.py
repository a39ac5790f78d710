"""``workbook status``: students × notebooks in a plain-text table, with every problem found
below it, for the instructor's terminal (every student string escaped)."""

from __future__ import annotations

from nbgrader.api import MissingEntry

from ..course import Course, read_json
from ..course.problems import FLAGS
from ..doors.intake import shown
from .grades import late_words, split_points

__all__ = ["status_table"]


def status_table(course: Course, assignments: list[str] | None = None) -> str:
    """A plain-text table: students × notebooks, scores, and the problems below it."""
    with course.gradebook() as gb:
        assignments = assignments or sorted(a.name for a in gb.assignments)
        notebooks = [(a, nb.name) for a in assignments for nb in gb.find_assignment(a).notebooks]
        # the gradebook's students, and those collected but not graded yet (or rejected at collect)
        collected = {a: (set(course.submitted_students(a)),
                         (read_json(course.collect_log_path(a), {}) or {}).get("rejected", {})) for a in assignments}
        students = sorted({s.id for s in gb.students} | {s for found, rejected in collected.values()
                                                          for s in (*found, *rejected)})
        header = ["student"] + [n for _, n in notebooks] + ["total"]
        table = [header]
        notes = []
        waiting = 0.0
        unknown_time = False
        for student in students:
            line = [shown(student, 64)]
            total = max_total = 0.0
            for a, n in notebooks:
                report = read_json(course.report_path(a, student), {}) or {}
                record = report.get("notebooks", {}).get(n)
                try:
                    sub = gb.find_submission_notebook(n, a, student)
                    taken = float(sub.late_submission_penalty or 0.0)
                    score, max_score = float(sub.score) - taken, float(sub.max_score)
                    cell = f"{score:g}/{max_score:g}"
                    submitted = gb.find_submission(a, student)
                    seconds = submitted.total_seconds_late
                    if seconds > 0:
                        cell += f" LATE {late_words(seconds).replace(' ', '')}" + (f" (-{taken:g})" if taken else "")
                    elif submitted.timestamp is None and submitted.assignment.duedate is not None and not \
                            any(p["kind"] == "rejected" for p in (record or {}).get("problems", [])):
                        cell += " LATE?"
                        unknown_time = True
                    awaiting = split_points(sub)[2]
                    if awaiting:
                        cell += f" ✎{awaiting:g}"
                        waiting += awaiting
                except MissingEntry:
                    score, max_score = 0.0, float(gb.find_notebook(n, a).max_score)
                    found, rejected = collected[a]
                    cell = "REJECTED at collect" if student in rejected else \
                        "collected" if student in found else "—"
                    if student in rejected:
                        notes.append(f"{shown(student, 64)} {n}: [rejected] {shown(rejected[student], 500)}")
                if record is None and cell in ("collected", "REJECTED at collect"):
                    pass  # not autograded yet: `workbook autograde` grades it
                elif record is None and cell != "—":
                    cell += " (not autograded)"
                elif record is not None:
                    problems = record.get("problems", [])
                    if any(p["kind"] == "rejected" for p in problems):
                        cell += " REJECTED"
                    elif record.get("status") == "failed":
                        cell += " FAILED"
                    elif problems:
                        cell += f" !{len(problems)}"
                    if record.get("unverified"):
                        cell += " UNVERIFIED"
                    if any(p["kind"] in FLAGS for p in problems):
                        cell += " FLAG"
                    for p in problems:
                        note = f"{shown(student, 64)} {n}: [{p['kind']}] {shown(p['message'], 500)}"
                        if note not in notes:  # (one line a problem, however often it was recorded)
                            notes.append(note)
                total += score
                max_total += max_score
                line.append(cell)
            line.append(f"{total:g}/{max_total:g}")
            table.append(line)
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if any(" LATE " in c for r in table for c in r):
        lines += ["", "LATE: handed in after the due date (`workbook due`); (-N): N points taken off by nbgrader's "
                  "late-submission plugin (LateSubmissionPlugin.penalty_method in nbgrader_config.py)."]
    if any(c.startswith(("collected", "REJECTED at collect")) for r in table[1:] for c in r[1:]):
        lines += ["", "collected: handed in, not autograded yet (`workbook autograde`); REJECTED at collect: the "
                  "submission broke a rule of what may be handed in (the reason is below)."]
    if unknown_time:
        lines += ["", "LATE?: the assignment has a due date, but when this was handed in is not known (collected "
                  "without a trusted time: `workbook collect --time-from`); lateness was not checked."]
    if waiting:
        lines += ["", f"✎N: N points of written answers await manual grading ({waiting:g} points in all); totals "
                  "are not final until a person grades them (nbgrader's Formgrader, or `nbgrader` on the command line)."]
    if notes:
        lines += ["", "Problems (FAILED: nothing could be graded; REJECTED: the submission broke a rule of what may "
                  "be handed in, and scores 0; !N: N problems; UNVERIFIED: graded without the sandbox; FLAG: for you "
                  "to look at: uses or closely matches course_lib's reference, or a timestamp.txt that disagrees):"
                  ] + ["  " + n for n in notes]
    return "\n".join(lines)
