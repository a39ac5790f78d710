"""What the class got wrong, counted from what grading recorded: the data of the class report
(autograder/reports/class_report.py draws it).

The grader already knows, for every failed sub-check, which catalogued mistake
reproduced the student's output (``mistake`` in each sub-check result of the stored
grading reports). :func:`summarize` counts them:

- per assignment: the score distribution (automatic and manual points apart) and the
  problems found while grading, by kind;
- per item: the share of full, partial and no credit, and its sub-checks ranked by
  failure rate;
- the most common mistakes, by name, across the class and per item;
- failures no catalogued mistake explains, grouped by sub-check and by how the output
  first differed (what to add to the catalogue next);
- over several assignments, a student × notebook heat map.

:func:`load_gradings` reads the gradebook (one query per assignment) and the grading reports
in ``grading/reports``; nothing here runs a notebook. Student ids appear only with
``names=True``: otherwise students are numbered, ordered by their results.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from ..course import Course, counted_points, read_json
from ..inside.cells import TEST_PREFIX, item_of

__all__ = ["Grading", "load_gradings", "summarize", "difference_kind"]


# ---------------------------------------------------------------------------
# What grading recorded
# ---------------------------------------------------------------------------

@dataclass
class Grading:
    """One student's graded notebook: gradebook points and the grader's item results."""

    assignment: str
    notebook: str
    student: str
    score: float
    max_score: float
    auto: float  # points set by the autograder (cells no person re-marked)
    manual: float  # points set or changed by a person (manual grading, extra credit)
    cells: dict[str, tuple[float, float]] = field(default_factory=dict)  # grade id -> (score, max)
    status: str = "missing"  # graded, failed, or missing (no report)
    problems: list[str] = field(default_factory=list)  # problem kinds
    items: dict[str, dict] = field(default_factory=dict)  # item -> ItemResult data
    awaiting: float = 0.0  # points of written answers no person has graded yet


def load_gradings(course: Course, assignments: list[str] | None = None) -> list[Grading]:
    """Every graded notebook of ``assignments`` (default: all with reports or grades)."""
    if not assignments:
        with course.gradebook() as gb:
            assignments = sorted(a.name for a in gb.assignments)
    out: list[Grading] = []
    for assignment in assignments:
        by_key: dict[tuple[str, str], Grading] = {}
        for student, notebook, cell, auto, manual, extra, max_score, needs, kind in course.gradebook_rows(assignment):
            g = by_key.setdefault((student, notebook), Grading(assignment, notebook, student, 0.0, 0.0, 0.0, 0.0))
            if needs and manual is None and kind == "MarkdownCell":  # a written answer nobody has graded yet
                g.awaiting += float(max_score or 0.0)
            person = manual is not None or extra is not None
            score = counted_points(auto, manual, extra)
            g.score += score
            g.max_score += float(max_score or 0.0)
            if person:
                g.manual += score
            else:
                g.auto += score
            g.cells[cell] = (score, float(max_score or 0.0))
        for (student, notebook), g in by_key.items():
            record = (read_json(course.report_path(assignment, student), {}) or {}).get("notebooks", {}).get(notebook)
            if record:
                g.status = record.get("status", "graded")
                g.problems = [p.get("kind", "") for p in record.get("problems", [])]
                g.items = record.get("items", {}) or {}
            out.append(g)
    return out


# ---------------------------------------------------------------------------
# Counting
# ---------------------------------------------------------------------------

_KINDS = (  # (pattern in the failure message, what it says), first match wins
    ("Checking failed with", "its output broke the check"),
    ("not available before", "called the reference"),
    ("is None", "returned None"),
    ("should be a torch tensor", "not a tensor"),
    ("should be a tuple", "wrong number of outputs"),
    ("has shape", "wrong shape"),
    ("has dtype", "wrong dtype"),
    (" is on ", "wrong device"),
    ("NaN or inf", "NaN or inf in the output"),
    ("differs from the expected values", "wrong values"),
    ("expected", "wrong value"),
)


def difference_kind(message: str) -> str:
    """How a failed sub-check's output first differed, in a few words (for grouping
    failures that no catalogued mistake explains)."""
    first = message.split("\n", 1)[0]
    for needle, kind in _KINDS:
        if needle in first:
            return kind
    return "other"


def _not_attempted(result: dict) -> bool:
    """The item's cell still holds the released stub (it raised NotImplementedError)."""
    return any("still contains the stub" in (r.get("message") or "") for r in result.get("results", []))


def _failed(result: dict) -> bool:
    return float(result.get("earned", 0.0)) < float(result.get("points", 0.0))


def _labels(gradings: list[Grading], names: bool) -> dict[str, str]:
    """Student id -> what the page calls them: the id with ``names``, otherwise
    "student N", numbered from the weakest overall result (ties in a fixed order)."""
    students = sorted({g.student for g in gradings})
    if names:
        return {s: s for s in students}
    share = defaultdict(lambda: [0.0, 0.0])
    for g in gradings:
        share[g.student][0] += g.score
        share[g.student][1] += g.max_score
    order = sorted(students, key=lambda s: (share[s][0] / share[s][1] if share[s][1] else 0.0,
                                            hashlib.sha256(s.encode()).hexdigest()))
    width = len(str(len(order)))
    return {s: f"student {i + 1:0{width}d}" for i, s in enumerate(order)}


def _mistake_rows(found: dict[tuple, set], labels: dict[str, str], of: dict[str, int], names: bool) -> list[dict]:
    rows = []
    for (assignment, item, name), students in found.items():
        row = {"assignment": assignment, "item": item, "mistake": name, "count": len(students),
               "of": of[assignment], "share": len(students) / of[assignment] if of[assignment] else 0.0}
        if names:
            row["students"] = sorted(labels[s] for s in students)
        rows.append(row)
    return sorted(rows, key=lambda r: (-r["count"], r["assignment"], r["item"], r["mistake"]))


def summarize(gradings: list[Grading], names: bool = False) -> dict[str, Any]:
    """The report's data (what the page shows, as plain JSON-able values)."""
    labels = _labels(gradings, names)
    redact = (lambda text: text) if names else _redactor(list(labels))
    by_assignment: dict[str, list[Grading]] = defaultdict(list)
    for g in gradings:
        by_assignment[g.assignment].append(g)
    of = {a: len({g.student for g in gs}) for a, gs in by_assignment.items()}
    out: dict[str, Any] = {"names": names, "students": len(labels), "assignments": {}}
    all_found: dict[tuple, set] = defaultdict(set)
    for assignment, gs in sorted(by_assignment.items()):
        students = sorted({g.student for g in gs}, key=lambda s: labels[s])
        totals = {s: [0.0, 0.0, 0.0, 0.0, 0.0] for s in students}  # score, max, auto, manual, awaiting
        kinds: Counter = Counter()
        with_problems = set()
        items: dict[str, dict] = {}
        found: dict[tuple, set] = defaultdict(set)
        unknown: dict[tuple, dict] = {}
        for g in gs:
            t = totals[g.student]
            t[0] += g.score
            t[1] += g.max_score
            t[2] += g.auto
            t[3] += g.manual
            t[4] += g.awaiting
            if g.problems:
                with_problems.add(g.student)
                kinds.update(set(g.problems))
            for cell, (score, max_score) in g.cells.items():
                if not cell.startswith(TEST_PREFIX):
                    continue
                item = item_of(cell)
                entry = items.setdefault(item, {"item": item, "notebook": g.notebook, "points": max_score,
                                                "full": 0, "partial": 0, "none": 0, "not_attempted": 0,
                                                "subchecks": {}})
                entry["full" if score >= max_score > 0 else "none" if score <= 0 else "partial"] += 1
                result = g.items.get(item)
                if not result:
                    continue
                if _not_attempted(result):  # the stub as released: nothing to recognise
                    entry["not_attempted"] += 1
                    continue
                # a student whose item a catalogued mistake explains is counted under that mistake only,
                # not again under "not recognised" for the item's other failing sub-checks
                explained = any(_failed(r) and r.get("mistake") for r in result.get("results", []))
                for r in result.get("results", []):
                    sub = entry["subchecks"].setdefault(r["title"], {"title": r["title"], "points": r["points"],
                                                                     "hidden": r.get("hidden", False),
                                                                     "failed": 0, "of": 0})
                    sub["of"] += 1
                    if not _failed(r):
                        continue
                    sub["failed"] += 1
                    message = r.get("message", "")
                    if r.get("mistake"):
                        found[(assignment, item, r["mistake"])].add(g.student)
                    elif message != "not run" and not result.get("reference_used") and not explained:
                        key = (item, r["title"], difference_kind(message))
                        group = unknown.setdefault(key, {"assignment": assignment, "item": item,
                                                         "subcheck": r["title"], "kind": key[2],
                                                         "example": _example(r, message, names, redact),
                                                         "students": set()})
                        group["students"].add(g.student)
        for key, students_found in found.items():
            all_found[key] |= students_found
        per_item_mistakes = defaultdict(list)
        for row in _mistake_rows(found, labels, of, names):
            per_item_mistakes[row["item"]].append(row)
        item_rows = []
        for item, entry in items.items():
            for s in entry["subchecks"].values():  # one denominator on the page: the assignment's students
                s["failed"] += of[assignment] - s["of"]  # (no result: not attempted, or the notebook not run)
                s["of"] = of[assignment]
                s["rate"] = s["failed"] / s["of"] if s["of"] else 0.0
            subs = sorted(entry["subchecks"].values(), key=lambda s: (-s["rate"], s["title"]))
            item_rows.append({**entry, "subchecks": subs, "mistakes": per_item_mistakes.get(item, [])})
        unrecognised = []
        for group in unknown.values():
            students_unknown = group.pop("students")
            group["count"] = len(students_unknown)
            group["of"] = of[assignment]
            if names:
                group["students"] = sorted(labels[s] for s in students_unknown)
            unrecognised.append(group)
        unrecognised.sort(key=lambda r: (-r["count"], r["item"], r["subcheck"]))
        max_total = max((t[1] for t in totals.values()), default=0.0)
        out["assignments"][assignment] = {
            "students": len(students), "max_score": max_total,
            "scores": [{"student": labels[s], "score": t[0], "max_score": t[1], "auto": t[2], "manual": t[3],
                        "awaiting": t[4]} for s, t in totals.items()],
            "with_problems": len(with_problems), "problem_kinds": dict(kinds.most_common()),
            "items": item_rows, "mistakes": _mistake_rows(found, labels, of, names),
            "unrecognised": unrecognised,
        }
    out["mistakes"] = _mistake_rows(all_found, labels, of, names)
    columns = sorted({(g.assignment, g.notebook) for g in gradings})
    cells = {(g.student, g.assignment, g.notebook): (g.score / g.max_score if g.max_score else 0.0) for g in gradings}
    out["heatmap"] = {"columns": [f"{a}/{n}" if a != n else a for a, n in columns],
                      "rows": [{"student": labels[s], "shares": [cells.get((s, a, n)) for a, n in columns]}
                               for s in sorted(labels, key=lambda s: labels[s])]}
    return out


def _example(result: dict, message: str, names: bool, redact) -> str:
    """The first line of a failure message; a hidden sub-check's inputs are not shown on a
    page meant for the class."""
    if result.get("hidden") and not names:
        return "(a hidden sub-check: run with --names to see an example)"
    return redact(_cut(message.split("\n", 1)[0], 240))


def _cut(text: str, limit: int) -> str:
    """``text`` cut at a word boundary before ``limit`` characters, with "…"."""
    if len(text) <= limit:
        return text
    cut = text[:limit].rsplit(" ", 1)[0]
    return (cut if len(cut) > limit // 2 else text[:limit]).rstrip(" ,;:") + " …"


def _redactor(ids: list[str]):
    """Replace student ids in a text (a failure message can quote what a notebook returned)."""
    if not ids:
        return lambda text: text
    pattern = re.compile("|".join(re.escape(i) for i in sorted(ids, key=len, reverse=True)))
    return lambda text: pattern.sub("[student]", text)
