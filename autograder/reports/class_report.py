"""``workbook report``: what the class got wrong, as one offline HTML page with its data beside
it (``report.json`` and CSV files), built from what grading recorded (the counting:
autograder/reports/class_data.py; the plots: autograder/reports/class_plots.py). The page has
no script and loads nothing: every plot is embedded, every string escaped.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from ..course import Course, write_json_atomic
from ..doors.allowlist import CSP_META
from ..doors.outbound import write_csv
from .class_data import load_gradings, summarize
from .class_plots import heatmap_plot, items_plot, mistakes_plot, score_plot

__all__ = ["render_html", "write_class_report", "compared_regrades"]


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; padding: 0 1.5em; max-width: 70em; color: #222; }
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


def compared_regrades(first: Path, second: Path) -> list[dict]:
    """The named mistakes of two regrades side by side (each regrade's CSV, or its
    ``-mistakes.csv``): ``{item, mistake, first, second}`` with the counts after each."""
    import csv

    def counts(path: Path) -> dict[tuple[str, str], str]:
        path = Path(path)
        if not path.name.endswith("-mistakes.csv"):
            path = path.with_name(path.stem + "-mistakes.csv")
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist: name the CSV a `workbook regrade` wrote")
        with open(path, newline="", encoding="utf-8") as f:
            return {(r["item"], r["mistake"]): r["after"] for r in csv.DictReader(f)}
    a, b = counts(first), counts(second)
    return [{"item": item, "mistake": name, "first": a.get((item, name), "0"), "second": b.get((item, name), "0")}
            for item, name in sorted(set(a) | set(b))]


def _compared_table(compared: dict) -> str:
    rows = "".join(f"<tr><td>{_e(r['item'])}</td><td>{_e(r['mistake'])}</td><td class=\"n\">{_e(r['first'])}</td>"
                   f"<td class=\"n\">{_e(r['second'])}</td></tr>" for r in compared["rows"])
    return (f"<h2>Named mistakes after two regrades</h2><p>In how many regraded submissions each mistake was named "
            f"after <code>{_e(compared['first'])}</code> and after <code>{_e(compared['second'])}</code>.</p>"
            f"<table><tr><th>item</th><th>mistake</th><th>first</th><th>second</th></tr>{rows}</table>")


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
                  _img(mistakes_plot(data["mistakes"], "most common mistakes across the class"),
                       "most common mistakes"),
                  _mistake_table(data["mistakes"][:25], names)]
    if len(data["heatmap"]["columns"]) > 1:
        parts += ["<h2>Who is falling behind</h2>", _img(heatmap_plot(data["heatmap"]), "students by notebook")]
    for assignment, a in data["assignments"].items():
        parts.append(f'<h2 id="{_e(assignment)}">{_e(assignment)}</h2>')
        mean = sum(s["score"] for s in a["scores"]) / max(1, len(a["scores"]))
        auto = sum(s["auto"] for s in a["scores"]) / max(1, len(a["scores"]))
        manual = sum(s["manual"] for s in a["scores"]) / max(1, len(a["scores"]))
        awaiting = max((s.get("awaiting", 0.0) for s in a["scores"]), default=0.0)
        waiting = (f"; up to {awaiting:g} points of written answers still wait for a person "
                   f"(<code>workbook formgrader {_e(assignment)}</code>), so the mean is not final"
                   if awaiting else "")
        parts.append(f"<p>{a['students']} students; mean {mean:.1f} of {a['max_score']:g} points "
                     f"({auto:.1f} automatic, {manual:.1f} manual{waiting}). {a['with_problems']} submissions had "
                     "problems while grading" + (": " + ", ".join(f"{_e(k)} ({n})" for k, n in
                                                                 a["problem_kinds"].items()) if a["problem_kinds"]
                                                  else "") + f". Every count below is out of these "
                     f"{a['students']} students.</p>")
        parts.append(_img(score_plot(a, assignment), f"{assignment} scores"))
        if a["items"]:
            parts.append(_img(items_plot(a, assignment), f"{assignment} credit per item"))
        parts.append("<h3>Most common mistakes</h3>")
        if a["mistakes"]:
            parts.append(_img(mistakes_plot(a["mistakes"], f"{assignment}: most common mistakes"),
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
    if data.get("regrades"):
        parts.append(_compared_table(data["regrades"]))
    parts.append("</body></html>")
    return "\n".join(parts)


def _write_csv(path: Path, rows: list[dict], columns: list[str]) -> None:
    write_csv(path, [{k: "; ".join(v) if isinstance(v, list) else v for k, v in row.items()} for row in rows], columns)


def write_class_report(course: Course, out_dir: str | Path | None = None, assignments: list[str] | None = None,
                       names: bool = False, regrades: tuple[Path, Path] | None = None) -> Path:
    """Write ``index.html``, ``report.json`` and CSV files (``mistakes.csv``,
    ``subchecks.csv``, ``unrecognised.csv``, ``scores.csv``) into ``out_dir``
    (default ``grading/class-report``); returns the page's path. ``regrades``: two regrades'
    CSVs whose named mistakes the page compares."""
    gradings = load_gradings(course, assignments)
    if not gradings:
        raise FileNotFoundError("nothing graded yet: run `workbook autograde` first")
    data = summarize(gradings, names=names)
    if regrades:
        data["regrades"] = {"first": Path(regrades[0]).name, "second": Path(regrades[1]).name,
                            "rows": compared_regrades(*regrades)}
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
