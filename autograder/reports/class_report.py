"""What the class got wrong: one offline HTML page (and its data as JSON and CSV) built
from what grading recorded.

The grader already knows, for every failed sub-check, which catalogued mistake
reproduced the student's output (``mistake`` in each sub-check result of the stored
reports). This module counts them:

- per assignment: the score distribution (automatic and manual points apart) and the
  problems found while grading, by kind;
- per item: the share of full, partial and no credit, and its sub-checks ranked by
  failure rate;
- the most common mistakes, by name, across the class and per item;
- failures no catalogued mistake explains, grouped by sub-check and by how the output
  first differed (what to add to the catalogue next);
- over several assignments, a student × notebook heat map.

It reads the gradebook (one query per assignment) and the reports in
``grading/reports``; it never runs a notebook. Student ids appear only with
``names=True``: otherwise students are numbered, ordered by their results.
"""

from __future__ import annotations

import base64
import hashlib
import html
import io
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..course import Course, read_json, write_json_atomic
from ..doors.outbound import CSP_META, write_csv

__all__ = ["Grading", "load_gradings", "summarize", "write_report", "difference_kind"]


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


def _gradebook_rows(course: Course, assignment: str) -> list[tuple]:
    """(student, notebook, grade id, auto, manual, extra credit, max) for every grade of
    the assignment, in one query."""
    from nbgrader.api import Assignment, BaseCell, Grade, Notebook, SubmittedAssignment, SubmittedNotebook

    with course.gradebook() as gb:
        query = (gb.db.query(SubmittedAssignment.student_id, Notebook.name, BaseCell.name, Grade.auto_score,
                             Grade.manual_score, Grade.extra_credit, Grade.max_score)
                 .join(SubmittedNotebook, Grade.notebook_id == SubmittedNotebook.id)
                 .join(Notebook, SubmittedNotebook.notebook_id == Notebook.id)
                 .join(SubmittedAssignment, SubmittedNotebook.assignment_id == SubmittedAssignment.id)
                 .join(Assignment, SubmittedAssignment.assignment_id == Assignment.id)
                 .join(BaseCell, Grade.cell_id == BaseCell.id)
                 .filter(Assignment.name == assignment))
        return [tuple(row) for row in query.all()]


def load_gradings(course: Course, assignments: list[str] | None = None) -> list[Grading]:
    """Every graded notebook of ``assignments`` (default: all with reports or grades)."""
    if not assignments:
        with course.gradebook() as gb:
            assignments = sorted(a.name for a in gb.assignments)
    out: list[Grading] = []
    for assignment in assignments:
        by_key: dict[tuple[str, str], Grading] = {}
        for student, notebook, cell, auto, manual, extra, max_score in _gradebook_rows(course, assignment):
            g = by_key.setdefault((student, notebook), Grading(assignment, notebook, student, 0.0, 0.0, 0.0, 0.0))
            person = manual is not None or extra is not None
            score = (manual if manual is not None else (auto or 0.0)) + (extra or 0.0)
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
        totals = {s: [0.0, 0.0, 0.0, 0.0] for s in students}  # score, max, auto, manual
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
            if g.problems:
                with_problems.add(g.student)
                kinds.update(set(g.problems))
            for cell, (score, max_score) in g.cells.items():
                if not cell.startswith("test_"):
                    continue
                item = cell.removeprefix("test_")
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
                    elif message != "not run" and not result.get("reference_used"):
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
            "scores": [{"student": labels[s], "score": t[0], "max_score": t[1], "auto": t[2], "manual": t[3]}
                       for s, t in totals.items()],
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


# ---------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------

def _png(fig) -> str:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode()


def _score_plot(data: dict, assignment: str) -> str:
    return _png(_score_figure(data, assignment))


def _score_figure(data: dict, assignment: str):  # a matplotlib Figure
    import matplotlib.pyplot as plt

    scores = data["scores"]
    top = max(data["max_score"], 1.0)
    bins = [top * i / 20 for i in range(21)]
    fig, ax = plt.subplots(figsize=(7, 3))
    ax.hist([s["auto"] for s in scores], bins=bins, alpha=0.75, label="automatic points", color="#4477aa")
    if any(s["manual"] for s in scores):
        ax.hist([s["manual"] for s in scores], bins=bins, alpha=0.75, label="manual points", color="#ee6677")
    ax.hist([s["score"] for s in scores], bins=bins, histtype="step", lw=2, color="black", label="total")
    ax.yaxis.get_major_locator().set_params(integer=True)  # students are counted in whole numbers
    ax.set_xlabel(f"points (of {top:g})")
    ax.set_ylabel("students")
    ax.set_title(f"{assignment}: scores of {len(scores)} students")
    ax.legend()
    return fig


def _items_plot(data: dict, assignment: str) -> str:
    import matplotlib.pyplot as plt

    items = data["items"]
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(items) + 1.2))
    names = [i["item"] for i in items]
    left = [0.0] * len(items)
    for key, color, label in (("full", "#228833", "full credit"), ("partial", "#ccbb44", "partial"),
                              ("none", "#ee6677", "no credit")):
        shares = [i[key] / max(1, i["full"] + i["partial"] + i["none"]) for i in items]
        ax.barh(names, shares, left=left, color=color, label=label)
        left = [a + b for a, b in zip(left, shares)]
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of students")
    ax.set_title(f"{assignment}: credit per graded item")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=3, fontsize="small", frameon=False)
    return _png(fig)


def _mistakes_plot(rows: list[dict], title: str, top: int = 12) -> str:
    import matplotlib.pyplot as plt

    rows = rows[:top]
    fig, ax = plt.subplots(figsize=(8, 0.4 * len(rows) + 1.2))
    ax.barh([f"{r['item']}: {r['mistake']}" for r in rows], [r["count"] for r in rows], color="#aa3377")
    ax.invert_yaxis()
    ax.set_xlabel("students")
    ax.set_title(title)
    ax.xaxis.get_major_locator().set_params(integer=True)
    return _png(fig)


def _plain(label: Any) -> str:
    """A label matplotlib shows as it is: ``$`` would start its math mode (and bad math
    stops the whole plot)."""
    return str(label).replace("$", r"\$")


def _heatmap_plot(heatmap: dict) -> str:
    import matplotlib.pyplot as plt
    import numpy as np

    rows = heatmap["rows"]
    values = np.array([[np.nan if v is None else v for v in r["shares"]] for r in rows], dtype=float)
    fig, ax = plt.subplots(figsize=(1.1 * len(heatmap["columns"]) + 2.5, 0.22 * len(rows) + 1.5))
    cmap = plt.get_cmap("RdYlGn").copy()
    cmap.set_bad("#dddddd")
    image = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, vmin=0, vmax=1, aspect="auto",
                      interpolation="nearest")
    ax.set_xticks(range(len(heatmap["columns"])), heatmap["columns"], rotation=30, ha="right")
    ax.set_yticks(range(len(rows)), [_plain(r["student"]) for r in rows], fontsize=7 if len(rows) > 40 else 9)
    ax.set_title("share of points per notebook (grey: no submission)")
    fig.colorbar(image, ax=ax, fraction=0.04, pad=0.02, label="share of points")
    return _png(fig)


# ---------------------------------------------------------------------------
# The page and the files
# ---------------------------------------------------------------------------

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 70em; color: #222; }
h1 { border-bottom: 2px solid #444; } h2 { margin-top: 2em; border-bottom: 1px solid #aaa; }
table { border-collapse: collapse; margin: 0.6em 0 1.2em; } td, th { border: 1px solid #ccc; padding: 0.25em 0.6em; }
th { background: #f2f2f2; text-align: left; } td.n { text-align: right; font-variant-numeric: tabular-nums; }
img { max-width: 100%; display: block; margin: 0.5em 0; } .muted { color: #666; } .who { font-size: 0.85em; color: #555; }
"""


def _e(value: Any) -> str:
    return html.escape(str(value))


def _img(data: str, alt: str) -> str:
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{data}">'


def _mistake_table(rows: list[dict], names: bool, with_item: bool = True) -> str:
    if not rows:
        return '<p class="muted">No catalogued mistake was found.</p>'
    head = ("<th>item</th>" if with_item else "") + "<th>mistake</th><th>students</th>"
    body = ""
    for r in rows:
        who = f'<div class="who">{_e(", ".join(r["students"]))}</div>' if names else ""
        body += ("<tr>" + (f"<td>{_e(r['item'])}</td>" if with_item else "") +
                 f"<td>{_e(r['mistake'])}{who}</td><td class=\"n\">{r['count']} of {r['of']}</td></tr>")
    return f"<table><tr>{head}</tr>{body}</table>"


def render_html(data: dict) -> str:
    """The self-contained page (plots embedded as PNG; no script, no network)."""
    names = data["names"]
    parts = [f"<!DOCTYPE html><html><head>{CSP_META}<meta charset=\"utf-8\"><title>What the class got wrong</title>"
             f"<style>{_STYLE}</style></head><body>",
             "<h1>What the class got wrong</h1>",
             f"<p>{data['students']} students, {len(data['assignments'])} "
             f"assignment{'s' if len(data['assignments']) != 1 else ''}. "
             "Mistakes are named by the grader's catalogue: a student is counted under a mistake when that "
             "catalogued wrong variant reproduced their output on the grader's inputs.</p>"]
    if data["mistakes"] and len(data["assignments"]) > 1:  # with one, its own section says it
        parts += ["<h2>The most common mistakes</h2>",
                  _img(_mistakes_plot(data["mistakes"], "most common mistakes across the class"),
                       "most common mistakes"),
                  _mistake_table(data["mistakes"][:25], names)]
    if len(data["heatmap"]["columns"]) > 1:
        parts += ["<h2>Who is falling behind</h2>", _img(_heatmap_plot(data["heatmap"]), "students by notebook")]
    for assignment, a in data["assignments"].items():
        parts.append(f'<h2 id="{_e(assignment)}">{_e(assignment)}</h2>')
        mean = sum(s["score"] for s in a["scores"]) / max(1, len(a["scores"]))
        auto = sum(s["auto"] for s in a["scores"]) / max(1, len(a["scores"]))
        manual = sum(s["manual"] for s in a["scores"]) / max(1, len(a["scores"]))
        parts.append(f"<p>{a['students']} students; mean {mean:.1f} of {a['max_score']:g} points "
                     f"({auto:.1f} automatic, {manual:.1f} manual). {a['with_problems']} submissions had "
                     "problems while grading" + (": " + ", ".join(f"{_e(k)} ({n})" for k, n in
                                                                 a["problem_kinds"].items()) if a["problem_kinds"]
                                                  else "") + f". Every count below is out of these "
                     f"{a['students']} students.</p>")
        parts.append(_img(_score_plot(a, assignment), f"{assignment} scores"))
        if a["items"]:
            parts.append(_img(_items_plot(a, assignment), f"{assignment} credit per item"))
        parts.append("<h3>Most common mistakes</h3>")
        if a["mistakes"]:
            parts.append(_img(_mistakes_plot(a["mistakes"], f"{assignment}: most common mistakes"),
                              f"{assignment} most common mistakes"))
        parts.append(_mistake_table(a["mistakes"], names))
        for item in a["items"]:
            n = a["students"]
            tried = item["none"] - item["not_attempted"]
            parts.append(f"<h3>{_e(item['item'])} <span class=\"muted\">({item['points']:g} points)</span></h3>"
                         f"<p>full credit {item['full']} of {n}, partial {item['partial']}, none {tried}"
                         + (f", not attempted {item['not_attempted']} (the stub as released)" if item["not_attempted"]
                            else "") + ".</p>")
            failing = [s for s in item["subchecks"] if s["failed"]]
            if failing:
                parts.append("<table><tr><th>sub-check, by failure rate</th><th>failed</th></tr>" + "".join(
                    f"<tr><td>{_e(s['title'])}{' (hidden)' if s['hidden'] else ''}</td>"
                    f"<td class=\"n\">{s['failed']} of {s['of']} ({s['rate']:.0%})</td></tr>" for s in failing)
                    + "</table>")
            if item["mistakes"]:
                parts.append(_mistake_table(item["mistakes"], names, with_item=False))
        parts.append("<h3>Not recognised</h3>")
        if a["unrecognised"]:
            parts.append("<p>Failed sub-checks that no catalogued mistake explains, grouped by how the output "
                         "first differed: candidates for the catalogue.</p><table><tr><th>item</th><th>sub-check"
                         "</th><th>how it differed</th><th>students</th><th>example</th></tr>" + "".join(
                             f"<tr><td>{_e(u['item'])}</td><td>{_e(u['subcheck'])}</td><td>{_e(u['kind'])}</td>"
                             f"<td class=\"n\">{u['count']} of {u['of']}</td><td class=\"who\">{_e(u['example'])}"
                             + (f"<br>{_e(', '.join(u['students']))}" if names else "") + "</td></tr>"
                             for u in a["unrecognised"]) + "</table>")
        else:
            parts.append('<p class="muted">Every failure was explained by a catalogued mistake.</p>')
    parts.append("</body></html>")
    return "\n".join(parts)


def _write_csv(path: Path, rows: list[dict], columns: list[str]) -> None:
    write_csv(path, [{k: "; ".join(v) if isinstance(v, list) else v for k, v in row.items()} for row in rows], columns)


def write_report(course: Course, out_dir: str | Path | None = None, assignments: list[str] | None = None,
                 names: bool = False) -> Path:
    """Write ``index.html``, ``report.json`` and CSV files (``mistakes.csv``,
    ``subchecks.csv``, ``unrecognised.csv``, ``scores.csv``) into ``out_dir``
    (default ``grading/class-report``); returns the page's path."""
    gradings = load_gradings(course, assignments)
    if not gradings:
        raise FileNotFoundError("nothing graded yet: run `workbook autograde` first")
    data = summarize(gradings, names=names)
    import matplotlib
    matplotlib.use("Agg")  # files only, no display
    out = Path(out_dir) if out_dir else course.grading_dir / "class-report"
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "report.json", data)
    who = ["students"] if names else []
    mistakes = [r for a in data["assignments"].values() for r in a["mistakes"]]
    _write_csv(out / "mistakes.csv", mistakes, ["assignment", "item", "mistake", "count", "of", *who])
    subchecks = [{"assignment": name, "item": i["item"], **s} for name, a in data["assignments"].items()
                 for i in a["items"] for s in i["subchecks"]]
    _write_csv(out / "subchecks.csv", subchecks, ["assignment", "item", "title", "hidden", "points", "failed",
                                                  "of", "rate"])
    unrecognised = [u for a in data["assignments"].values() for u in a["unrecognised"]]
    _write_csv(out / "unrecognised.csv", unrecognised, ["assignment", "item", "subcheck", "kind", "count", "of",
                                                        "example", *who])
    scores = [{"assignment": name, **s} for name, a in data["assignments"].items() for s in a["scores"]]
    _write_csv(out / "scores.csv", scores, ["assignment", "student", "score", "max_score", "auto", "manual"])
    page = out / "index.html"
    page.write_text(render_html(data), encoding="utf-8")
    return page
