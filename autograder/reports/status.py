"""``workbook status``: students × notebooks in a plain-text table, with every problem found
below it, for the instructor's terminal (every student string escaped).

The table fits the terminal: when all the assignments side by side would be wider, each
assignment gets a block of its own (``wide=True`` keeps one table). Students are shown with the
roster's name beside their id (the last ``collect --roster``), and the roster's students who
handed nothing in are listed. Only the marks that appear are explained under the table."""

from __future__ import annotations

import shutil

from nbgrader.api import MissingEntry

from ..course import Course, counted_points, read_json
from ..course.problems import FLAGS
from ..doors.intake import shown
from .grades import late_words, split_points

__all__ = ["status_table", "missing_words", "history_table"]

REJECTED_AT_COLLECT = "REJECTED at collect"


def _cell(course: Course, gb, a: str, n: str, student: str, collected: dict, state: dict) -> tuple[str, float, float]:
    """One student's cell for notebook ``n`` of ``a``, its score and its maximum; ``state`` gathers
    the problems (``notes``), the points awaiting a person (``waiting``) and unknown times."""
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
            state["unknown_time"] = True
        awaiting = split_points(sub)[2]
        if awaiting:
            cell += f" ✎{awaiting:g}"
            state["waiting"] += awaiting
    except MissingEntry:
        score, max_score = 0.0, float(gb.find_notebook(n, a).max_score)
        found, rejected = collected[a]
        cell = REJECTED_AT_COLLECT if student in rejected else "collected" if student in found else "—"
        if student in rejected:
            state["notes"].append(f"{course.shown_student(student, state['names'])} {n}: [rejected] "
                                  f"{shown(rejected[student], 500)}")
    if record is None and cell in ("collected", REJECTED_AT_COLLECT):
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
            note = f"{course.shown_student(student, state['names'])} {n}: [{p['kind']}] {shown(p['message'], 500)}"
            if note not in state["notes"]:  # (one line a problem, however often it was recorded)
                state["notes"].append(note)
    return cell, score, max_score


def _render(table: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def _legend(cells: list[str], state: dict, assignments: list[str]) -> list[str]:
    """What the marks that appear mean, each only where it appears."""
    lines: list[str] = []
    if any(" LATE " in c for c in cells):
        lines += ["LATE: handed in after the due date (`workbook due`); (-N): N points taken off by nbgrader's "
                  "late-submission plugin (LateSubmissionPlugin.penalty_method in nbgrader_config.py)."]
    if any(c.startswith("collected") for c in cells):
        lines += ["collected: handed in, not autograded yet (`workbook autograde`)."]
    if any(c.startswith(REJECTED_AT_COLLECT) for c in cells):
        lines += [f"{REJECTED_AT_COLLECT}: the submission broke a rule of what may be handed in (the reason is "
                  "below)."]
    if state["unknown_time"]:
        lines += ["LATE?: the assignment has a due date, but when this was handed in is not known (collected "
                  "without a trusted time: `workbook collect --time-from`); lateness was not checked."]
    if state["waiting"]:
        which = assignments[0] if len(assignments) == 1 else "ASSIGNMENT"
        lines += [f"✎N: N points of written answers await a person ({state['waiting']:g} points in all); totals are "
                  f"not final until they are graded: `workbook formgrader {which}`."]
    marks = [(" FAILED", "FAILED: nothing could be graded"),
             (" REJECTED", "REJECTED: the submission broke a rule of what may be handed in, and scores 0"),
             (" !", "!N: N problems"), (" UNVERIFIED", "UNVERIFIED: graded without the sandbox"),
             (" FLAG", "FLAG: for you to look at: uses or closely matches course_lib's reference, or a timestamp.txt "
                       "that disagrees")]
    graded = [c for c in cells if not c.startswith(REJECTED_AT_COLLECT)]
    shown_marks = [words for mark, words in marks if any(mark in c for c in graded)]
    if state["notes"]:
        lines += ["Problems" + (f" ({'; '.join(shown_marks)})" if shown_marks else "") + ":"]
        lines += ["  " + n for n in state["notes"]]
    return lines


def status_table(course: Course, assignments: list[str] | None = None, width: int | None = None,
                 wide: bool = False) -> str:
    """A plain-text table: students × notebooks, scores, and the problems below it; one block an
    assignment where one table would be wider than ``width`` (default: the terminal's)."""
    names = course.roster()
    state = {"notes": [], "waiting": 0.0, "unknown_time": False, "names": names}
    with course.gradebook() as gb:
        assignments = assignments or sorted(a.name for a in gb.assignments)
        by_assignment = {a: [nb.name for nb in gb.find_assignment(a).notebooks] for a in assignments}
        # the gradebook's students, those collected but not graded yet (or rejected at collect), the roster's
        collected = {a: (set(course.submitted_students(a)),
                         (read_json(course.collect_log_path(a), {}) or {}).get("rejected", {})) for a in assignments}
        students = sorted({s.id for s in gb.students} | set(names) |
                          {s for found, rejected in collected.values() for s in (*found, *rejected)})
        rows = {}
        for student in students:
            rows[student] = {(a, n): _cell(course, gb, a, n, student, collected, state)
                             for a in assignments for n in by_assignment[a]}

    def table(for_assignments: list[str]) -> list[list[str]]:
        keys = [(a, n) for a in for_assignments for n in by_assignment[a]]
        out = [["student"] + [n for _, n in keys] + ["total"]]
        for student in students:
            cells = [rows[student][k] for k in keys]
            total, max_total = sum(c[1] for c in cells), sum(c[2] for c in cells)
            out.append([course.shown_student(student, names)] + [c[0] for c in cells] + [f"{total:g}/{max_total:g}"])
        return out

    width = width or shutil.get_terminal_size((120, 24)).columns
    whole = _render(table(assignments))
    if wide or len(assignments) <= 1 or max(len(line) for line in whole) <= width:
        lines = whole
    else:
        lines = []
        for a in assignments:
            lines += ([""] if lines else []) + [f"{a}:"] + _render(table([a]))
    if names:
        lines += [""] + [missing_words(course, a, names) for a in assignments]
    cells = [c[0] for r in rows.values() for c in r.values()]
    legend = _legend(cells, state, assignments)
    if legend:
        lines += [""] + legend
    return "\n".join(lines)


def missing_words(course: Course, assignment: str, names: dict[str, str], imported: dict | None = None) -> str:
    """One line: the roster's students who have handed nothing in for ``assignment`` (``imported``:
    those a collect that has not written yet is importing)."""
    handed = set(course.submitted_students(assignment)) | set(imported or {})
    missing = [s for s in sorted(names) if s not in handed]
    if not missing:
        return f"{assignment}: every roster student has handed something in"
    listed = ", ".join(course.shown_student(s, names) for s in missing[:8]) + (", …" if len(missing) > 8 else "")
    return f"{assignment}: {len(missing)} roster student{'s' if len(missing) != 1 else ''} without a submission: {listed}"


def history_table(course: Course, student: str, assignments: list[str] | None = None) -> str:
    """``workbook status --history STUDENT``: how each of the student's scores came to be, every
    grade the autograder recorded for each graded cell (when, by which course, how: autograde or
    a regrade and its note), then the score as it counts now (a person's over the autograder's)."""
    from ..course import history
    with course.gradebook() as gb:
        rows = [r for r in history.history(gb, student) if not assignments or r["assignment"] in assignments]
    if not rows:
        return f"no grades recorded for {course.shown_student(student)}" + (
            f" in {', '.join(assignments)}" if assignments else "")
    now = {}
    for a in sorted({r["assignment"] for r in rows}):
        for s, notebook, cell, auto, manual, extra, max_score, *_ in course.gradebook_rows(a):
            if s == student:
                now[(a, notebook, cell)] = (manual, auto, extra, max_score)
    lines = [f"how the scores of {course.shown_student(student)} came to be (UTC):"]
    last = None
    for k, r in enumerate(rows):
        where = (r["assignment"], r["notebook"])
        if where != last:
            lines.append(f"{shown(r['assignment'], 80)} / {shown(r['notebook'], 80)}")
            last = where
        points = "—" if r["points"] is None else f"{r['points']:g}"
        of = "" if r["max_points"] is None else f" / {r['max_points']:g}"
        lines.append(f"  {shown(r['cell'], 40):<40} {r['recorded_at']:%Y-%m-%d %H:%M}  {points}{of}  "
                     f"{shown(r['how'], 200)} (course {r['course'][:8]})")
        following = rows[k + 1] if k + 1 < len(rows) else None
        if following is None or (following["assignment"], following["notebook"], following["cell"]) != \
                (r["assignment"], r["notebook"], r["cell"]):
            manual, auto, extra, _max = now.get((r["assignment"], r["notebook"], r["cell"]), (None, None, None, None))
            if manual is not None or extra:
                counted = counted_points(manual=manual, auto=auto, extra=extra)
                lines.append(f"  {'':<40} now {counted:g}: set by a person (manual grade"
                             + (f", {extra:g} extra credit" if extra else "") + ")")
    return "\n".join(lines)
