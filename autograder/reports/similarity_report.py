"""What ``workbook similarity`` writes: the CSV (``item,student_a,student_b,similarity,flagged``),
one offline HTML page with each flagged pair side by side and the fragments they share
highlighted (a group of three or more who are all flagged with each other shown once, all its
answers side by side; a pair no group holds shown on its own), and the summary printed on the
terminal.

Everything a student wrote (ids, code, written answers) goes out through
:mod:`autograder.doors.outbound` and :func:`autograder.doors.intake.shown`: CSV cells that
a spreadsheet would run are neutralised, the page is built from escaped text, cleaned by
the allow-list sanitiser and served under the feedback pages' Content-Security-Policy (no
script at all), and every invisible, control or bidirectional character in an answer is
shown as its escape (``\\u202e``) instead of reordering what the reader sees.
"""

from __future__ import annotations

import html
from pathlib import Path

import numpy as np

from ..course import Course, CourseError
from ..doors.intake import invisible, shown
from ..doors.allowlist import CSP_META, sanitize
from ..doors.outbound import write_csv
from .similarity import DEFAULT_THRESHOLD, ClassAnswers, ItemResult, compare_class, read_class
from .similarity_index import REFERENCE
from .similarity_tokens import MAX_CHARS, Tokens


__all__ = ["similarity_report", "COLUMNS", "csv_rows", "write_similarity_csv", "summary_lines", "render_page",
           "write_similarity_html", "MAX_PANELS"]

COLUMNS = ["item", "student_a", "student_b", "similarity", "flagged"]
MAX_PANELS = 100  # pairs and groups shown on the page per item; the CSV has them all


def csv_rows(results: list[ItemResult]) -> list[dict]:
    """One row per pair at or above half the threshold, most similar first within each item."""
    return [{"item": r.item, "student_a": p.a, "student_b": p.b, "similarity": round(p.similarity, 3),
             "flagged": "true" if p.flagged else "false"} for r in results for p in r.pairs]


def write_similarity_csv(path: Path, results: list[ItemResult]) -> str:
    return write_csv(path, csv_rows(results), COLUMNS)


def _in_group(result: ItemResult, pair) -> bool:
    """Whether one of the item's groups holds both answers of ``pair`` (it is shown there)."""
    return any(pair.a in group and pair.b in group for group in result.clusters)


def _named(who: str) -> str:
    return "course_lib's reference" if who == REFERENCE else who


def summary_lines(answers: ClassAnswers, results: list[ItemResult], threshold: float) -> list[str]:
    """What the terminal shows: per item, the groups (each once: students all flagged with each
    other) and every flagged pair no group holds."""
    lines = [f"{answers.assignment}: {len(answers.students)} students read, threshold {threshold:g}"]
    for student, why in sorted(answers.unread.items()):
        lines.append(f"  left out {shown(student, 80)}: {shown(why, 300)}")
    lines += [f"  left out {shown(why, 300)}" for why in answers.refused]
    for r in results:
        flagged = [p for p in r.pairs if p.flagged]
        if not flagged:
            continue
        lines.append(f"  {shown(r.item, 80)} ({r.kind}, {r.answered} answers): {len(flagged)} flagged "
                     + ("pair" if len(flagged) == 1 else "pairs"))
        for group in r.clusters:
            lines.append("    group of " + ", ".join(shown(_named(w), 80) for w in group))
        for p in flagged:
            if not _in_group(r, p):
                lines.append(f"    {shown(p.a, 80)} ~ {shown(_named(p.b), 80)}: {p.similarity:.2f}")
    if not any(p.flagged for r in results for p in r.pairs):
        lines.append("  nothing flagged")
    return lines


# ---------------------------------------------------------------------------
# The page
# ---------------------------------------------------------------------------

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; padding: 0 1.5em; max-width: 90em; color: #222; }
h1 { border-bottom: 2px solid #444; } h2 { margin-top: 2em; border-bottom: 1px solid #aaa; }
table { border-collapse: collapse; margin: 0.6em 0 1.2em; } td, th { border: 1px solid #ccc; padding: 0.25em 0.6em; }
th { background: #f2f2f2; text-align: left; } .muted { color: #666; }
.side { display: flex; gap: 1em; overflow-x: auto; } .side > div { flex: 1 1 0; min-width: 24em; }
pre { background: #f8f8f8; border: 1px solid #ddd; padding: 0.6em; white-space: pre-wrap; word-break: break-word;
      max-height: 40em; overflow: auto; font-size: 0.85em; }
mark { background: #ffd54f; } span.esc { color: #b00020; border: 1px dotted #b00020; }
"""


def _e(value: object) -> str:
    return html.escape(str(value))


def _visible(text: str) -> str:
    """``text`` escaped for HTML, every invisible, control or bidirectional character (but
    newlines and tabs) shown as its escape: code that reorders itself on screen does not."""
    if text.isascii() and text.isprintable():
        return html.escape(text)
    out = []
    for ch in text:
        if ch not in "\n\t" and invisible(ch):
            out.append(f'<span class="esc">{html.escape(shown(ch))}</span>')
        else:
            out.append(html.escape(ch))
    return "".join(out)


def _marked(tokens: Tokens, mask: np.ndarray) -> str:
    """The answer as a ``<pre>``, each run of tokens it shares (``mask``) in ``<mark>``."""
    spans = sorted((s, e, bool(m)) for (s, e), m in zip(tokens.spans, mask) if e > s)
    source, parts, at = tokens.source, [], 0
    i = 0
    while i < len(spans):
        start, end, shared = spans[i]
        if not shared:
            i += 1
            continue
        while i + 1 < len(spans) and spans[i + 1][2]:
            i += 1
            end = max(end, spans[i][1])
        if start >= at:
            parts += [_visible(source[at:start]), f"<mark>{_visible(source[start:end])}</mark>"]
            at = end
        i += 1
    parts.append(_visible(source[at:]))
    cut = f'\n<span class="muted">… cut at {MAX_CHARS:,} characters</span>' if tokens.cut else ""
    return f"<pre>{''.join(parts)}{cut}</pre>"


def _column(who: str, tokens: Tokens, mask: np.ndarray) -> str:
    return f"<div><h4>{_e(_named(who))}</h4>{_marked(tokens, mask)}</div>"


def _pair_panel(result: ItemResult, pair) -> str:
    ma, mb = result.marks[(pair.a, pair.b)]
    return (f"<h3>{_e(_named(pair.a))} and {_e(_named(pair.b))}: similarity {pair.similarity:.2f}</h3>"
            f'<div class="side">{_column(pair.a, result.shown[pair.a], ma)}'
            f"{_column(pair.b, result.shown[pair.b], mb)}</div>")


def _group_panel(result: ItemResult, group: list[str]) -> str:
    """A group once: its pairs' similarities, then every answer side by side, each with what
    it shares with any other member highlighted."""
    members = set(group)
    masks = {who: np.zeros(len(result.shown[who].words), dtype=bool) for who in group}
    rows = []
    for (a, b), (ma, mb) in result.marks.items():
        if a in members and b in members:
            masks[a] |= ma
            masks[b] |= mb
    for p in result.pairs:
        if p.a in members and p.b in members:
            rows.append(f"<tr><td>{_e(_named(p.a))}</td><td>{_e(_named(p.b))}</td><td>{p.similarity:.2f}</td>"
                        f"<td>{'flagged' if p.flagged else ''}</td></tr>")
    return (f"<h3>A group of {len(group)}: {_e(', '.join(_named(w) for w in group))}</h3>"
            f"<table><tr><th>answer</th><th>answer</th><th>similarity</th><th></th></tr>{''.join(rows)}</table>"
            f'<div class="side">{"".join(_column(w, result.shown[w], masks[w]) for w in group)}</div>')


def _item_section(result: ItemResult) -> str:
    flagged = [p for p in result.pairs if p.flagged]
    panels = [_group_panel(result, g) for g in result.clusters]
    panels += [_pair_panel(result, p) for p in flagged if not _in_group(result, p)]
    more = (f'<p class="muted">{len(panels) - MAX_PANELS} more pairs and groups are not shown here: '
            "the CSV lists them all.</p>") if len(panels) > MAX_PANELS else ""
    return (f'<h2 id="item-{_e(result.item)}">{_e(result.item)} <span class="muted">({_e(result.notebook)}, '
            f"{'code' if result.kind == 'code' else 'written answer'}, {result.answered} answers)</span></h2>"
            + "".join(panels[:MAX_PANELS]) + more)


def render_page(answers: ClassAnswers, results: list[ItemResult], threshold: float) -> str:
    """The whole page: a table of the items, then each item's groups and flagged pairs."""
    rows = []
    for r in results:
        flagged = sum(p.flagged for p in r.pairs)
        link = f'<a href="#item-{_e(r.item)}">{_e(r.item)}</a>' if flagged else _e(r.item)
        rows.append(f"<tr><td>{link}</td><td>{'code' if r.kind == 'code' else 'written'}</td><td>{r.answered}</td>"
                    f"<td>{flagged}</td><td>{len(r.clusters)}</td></tr>")
    unread = "".join(f"<li>{_e(s)}: {_visible(why)}</li>" for s, why in sorted(answers.unread.items())) + \
        "".join(f"<li>{_visible(why)}</li>" for why in answers.refused)
    body = (f"<h1>Similarity of {_e(answers.assignment)}</h1>"
            f"<p>{len(answers.students)} students read; pairs flagged at similarity {threshold:g} or more. "
            "Similarity is the part of the shorter answer that the other one also has, counting only what is "
            "evidence: names, literals, comments, the order of independent statements, the released notebook and "
            "code a large part of the class wrote alike do not count. A short answer is never flagged on its own. "
            "Highlighted: the fragments the answers share. A flag is a reason to look, not a verdict.</p>"
            "<table><tr><th>item</th><th>kind</th><th>answers</th><th>flagged pairs</th><th>groups of 3+</th></tr>"
            + "".join(rows) + "</table>"
            + (f"<p>Left out:</p><ul>{unread}</ul>" if unread else "")
            + "".join(_item_section(r) for r in results if any(p.flagged for p in r.pairs)))
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">" + CSP_META
            + f"<title>Similarity: {_e(answers.assignment)}</title><style>{_STYLE}</style></head>\n"
            + f"<body>{sanitize(body)}</body></html>\n")


def write_similarity_html(folder: Path, answers: ClassAnswers, results: list[ItemResult], threshold: float) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    page = folder / "index.html"
    page.write_text(render_page(answers, results, threshold), encoding="utf-8")
    return page


def similarity_report(course: Course, assignment: str, threshold: float = DEFAULT_THRESHOLD,
                      csv_path: Path | None = None, html_folder: Path | None = None,
                      jobs: int | None = None) -> tuple[list[str], Path, Path]:
    """``workbook similarity``: the class read, compared, and written as the CSV and the page
    (default: ``grading/similarity/<assignment>/similarity.csv`` and ``index.html``); returns
    the terminal's summary lines and the two paths."""
    if not 0 < threshold <= 1:
        raise CourseError(f"the threshold is a similarity between 0 and 1, not {threshold:g}")
    answers = read_class(course, assignment, jobs=jobs)
    results = compare_class(answers, threshold)
    folder = course.grading_dir / "similarity" / assignment
    csv_path = csv_path or folder / "similarity.csv"
    write_similarity_csv(csv_path, results)
    page = write_similarity_html(html_folder or folder, answers, results, threshold)
    return summary_lines(answers, results, threshold), csv_path, page
