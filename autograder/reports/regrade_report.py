"""What a regrade changed, for the instructor: ``grading/regrades/<UTC time>-<assignment>.csv``
(one row per item whose points moved, or would have but were kept) and an HTML page beside it,
every student string encoded on the way out (CSV formulas neutralised, markup escaped, the
pages' Content-Security-Policy)."""

from __future__ import annotations

import html
from pathlib import Path

from ..doors.allowlist import CSP_META
from ..doors.intake import shown
from ..doors.outbound import write_csv
from ..pipeline.regrade import Regrade, regrades_dir
from ..course import Course

__all__ = ["COLUMNS", "MISTAKE_COLUMNS", "write_regrade_report", "mistakes_path"]

COLUMNS = ["student", "assignment", "item", "old_points", "new_points", "old_mistake", "new_mistake", "kept"]
MISTAKE_COLUMNS = ["item", "mistake", "before", "after"]  # in how many regraded submissions each was named

_STYLE = """body{font:15px/1.45 system-ui,sans-serif;margin:2em auto;max-width:70em;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:.3em .6em;text-align:left;
vertical-align:top}th{background:#f4f4f4}td.n{text-align:right;font-variant-numeric:tabular-nums}
.up{color:#1a7f37}.down{color:#b42318}.kept{color:#8a6d00}p.note{background:#f6f8fa;padding:.6em 1em}"""


def _stem(outcome: Regrade) -> str:
    return f"{outcome.when:%Y%m%dT%H%M%SZ}-{outcome.assignment}" + ("-dry-run" if outcome.dry_run else "")


def _text(value: object, limit: int = 300) -> str:
    """A student string for the page: control and invisible characters as escapes, then markup
    escaped."""
    return html.escape(shown(str(value), limit))


def _rows(outcome: Regrade) -> list[dict]:
    return [{"student": c.student, "assignment": c.assignment, "item": c.item, "old_points": c.old_points,
             "new_points": c.new_points, "old_mistake": c.old_mistake, "new_mistake": c.new_mistake,
             "kept": c.kept} for c in outcome.changes]


def _page(outcome: Regrade, csv_name: str) -> str:
    title = f"Regrade of {_text(outcome.assignment)}, {outcome.when:%Y-%m-%d %H:%M} UTC"
    parts = [f"<!DOCTYPE html>\n<html lang=\"en\"><head>{CSP_META}<meta charset=\"utf-8\"><title>{title}</title>"
             f"<style>{_STYLE}</style></head><body>", f"<h1>{title}</h1>", f"<p>{_text(outcome.summary(), 600)}</p>"]
    choices = []
    if outcome.items:
        choices.append("only " + ", ".join(_text(i) for i in outcome.items))
    if outcome.keep_higher:
        choices.append("no item's points lowered (--keep-higher)")
    if outcome.resumed:
        choices.append("finished a regrade that had been interrupted")
    if choices:
        parts.append(f"<p>{'; '.join(choices)}.</p>")
    if outcome.note:
        parts.append(f"<p class=\"note\">Note shown to the students whose points moved: {_text(outcome.note, 2000)}</p>")
    if outcome.stale_exports:
        parts.append("<p><strong>Grade exports now out of date</strong> (export again and upload): "
                     + "; ".join(_text(e, 400) for e in outcome.stale_exports) + "</p>")
    parts.append(f"<p>The same rows as a CSV: <code>{_text(csv_name)}</code>.</p>")
    if outcome.changes:
        parts.append("<table><thead><tr><th>student</th><th>item</th><th>points</th><th>mistake before</th>"
                     "<th>mistake now</th><th></th></tr></thead><tbody>")
        for c in outcome.changes:
            kind = "kept" if c.kept else "up" if c.delta > 0 else "down" if c.delta < 0 else ""
            parts.append(f"<tr><td>{_text(c.student)}</td><td>{_text(c.item)}</td>"
                         f"<td class=\"n {kind}\">{c.old_points:g} → {c.new_points:g}</td>"
                         f"<td>{_text(c.old_mistake)}</td><td>{_text(c.new_mistake)}</td><td>{_text(c.kept)}</td></tr>")
        parts.append("</tbody></table>")
    else:
        parts.append("<p>No item's points moved.</p>")
    if outcome.mistakes:
        parts.append("<h2>Named mistakes in the regraded submissions</h2><table><thead><tr><th>item</th>"
                     "<th>mistake</th><th>before</th><th>after</th></tr></thead><tbody>")
        for (item, name), (before, after) in outcome.mistakes.items():
            parts.append(f"<tr><td>{_text(item)}</td><td>{_text(name)}</td><td class=\"n\">{before}</td>"
                         f"<td class=\"n\">{after}</td></tr>")
        parts.append("</tbody></table>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def mistakes_path(csv_path: Path) -> Path:
    """Beside a regrade's CSV: how often each named mistake was found before and after it."""
    return csv_path.with_name(csv_path.stem + "-mistakes.csv")


def write_regrade_report(course: Course, outcome: Regrade) -> tuple[Path, Path]:
    """The CSV, the mistakes' counts and the page of one assignment's regrade; returns the
    paths of the CSV and the page."""
    folder = regrades_dir(course)
    folder.mkdir(parents=True, exist_ok=True)
    csv_path, page_path = folder / f"{_stem(outcome)}.csv", folder / f"{_stem(outcome)}.html"
    write_csv(csv_path, _rows(outcome), COLUMNS)
    write_csv(mistakes_path(csv_path), [{"item": item, "mistake": name, "before": before, "after": after}
                                        for (item, name), (before, after) in outcome.mistakes.items()],
              MISTAKE_COLUMNS)
    page_path.write_text(_page(outcome, csv_path.name), encoding="utf-8")
    return csv_path, page_path
