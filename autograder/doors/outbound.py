"""Encoding on the way out: every string a student controls made safe for where it goes.

What comes in passes :mod:`autograder.doors.intake`; what goes out passes here, whatever
came before it (a rule in intake is one wall, this is the second):

- **a terminal**: :func:`autograder.doors.intake.shown` (control, invisible and bidirectional
  characters written as escapes, one line);
- **a CSV file** (:func:`csv_cell`, :func:`write_csv`): a cell that a spreadsheet would
  read as a formula (OWASP's rule: it starts with ``=``, ``+``, ``-``, ``@``, a tab or a
  carriage return, after any spaces) gets a leading ``'``; numbers stay numbers;
- **the autograded notebook** (:func:`clean_output`, :func:`clean_markdown`,
  :func:`clean_text`): only outputs of safe types are kept, a student's HTML in markdown
  is kept as text, messages lose their control characters;
- **an HTML page** (:func:`markdown_html`, :class:`SafeHTMLExporter`): everything a student
  wrote or printed is rendered, then cleaned by the allow-list of
  :mod:`autograder.doors.allowlist`: markdown's elements, tables and MathML only; links only
  to ``http(s)`` and ``mailto`` (checked by the sanitiser after it decodes entities); images
  only as embedded PNG, JPEG, GIF or WebP data; its Content-Security-Policy on every page.
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path
from typing import Any, Iterable

from traitlets import Unicode

from .allowlist import DATA_IMAGE, sanitize

__all__ = ["csv_cell", "write_csv", "markdown_html", "tex_to_mathml", "SafeHTMLExporter", "clean_output",
           "clean_markdown", "clean_text", "clean_attachments", "IMAGE_TYPES", "attachment_image"]

# ---------------------------------------------------------------------------
# CSV
# ---------------------------------------------------------------------------

_FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "＝", "＋", "－", "＠")
_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")


def csv_cell(value: Any) -> Any:
    """``value`` as a CSV cell no spreadsheet runs: a string that would start a formula
    gets a leading ``'`` (numbers, and strings that are plain numbers, are kept)."""
    if not isinstance(value, str):
        return value
    if _NUMBER.fullmatch(value.strip()):
        return value
    if value.lstrip(" ").startswith(_FORMULA_START):
        return "'" + value
    return value


def write_csv(target: Path | io.StringIO, rows: Iterable[dict], columns: list[str]) -> str:
    """Write ``rows`` (dicts; floats as ``%g``) as CSV with every cell through
    :func:`csv_cell`; returns the text."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writerow({c: csv_cell(c) for c in columns})
    for row in rows:
        writer.writerow({k: csv_cell(f"{v:g}" if isinstance(v, float) else v) for k, v in row.items()})
    text = buffer.getvalue()
    if isinstance(target, io.StringIO):
        target.write(text)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    return text


# ---------------------------------------------------------------------------
# HTML (the allow-list and the CSP: autograder/doors/allowlist.py)
# ---------------------------------------------------------------------------

MAX_FORMULAS = 2_000  # formulas turned into MathML on one page; the rest are shown as TeX
MAX_SOURCE_SHOWN = 500_000  # characters of one cell shown on a page
MAX_FORMULA_CHARS = 2_000
MAX_MATHML_CHARS = 40_000
_MACRO = re.compile(r"\\(def|gdef|edef|xdef|newcommand|renewcommand|providecommand|let|DeclareMathOperator)\b")


def tex_to_mathml(tex: str, display: bool) -> str:
    """MathML for a TeX formula (cleaned by :func:`sanitize` with the rest of the page), or
    the TeX shown as code when it cannot be converted, is too long, defines macros (which
    latex2mathml expands: a few bytes of ``\\def`` can become megabytes) or converts to
    more than ``MAX_MATHML_CHARS``."""
    import html

    from latex2mathml.converter import convert

    as_code = f"<code>{html.escape(tex)}</code>"
    if len(tex) > MAX_FORMULA_CHARS or _MACRO.search(tex):
        return as_code
    try:
        mathml = convert(tex, display="block" if display else "inline")
    except Exception:  # any TeX a student wrote
        return as_code
    return sanitize(mathml) if len(mathml) <= MAX_MATHML_CHARS else as_code


_MATH = re.compile(r"\$\$(.+?)\$\$|(?<![\\$])\$(?![\s$])([^$\n]+?)(?<![\s\\])\$", re.S)


def render_math(source: str, budget: list[int] | None = None) -> str:
    """Markdown whose ``$...$`` and ``$$...$$`` formulas are MathML (offline: no MathJax), as
    many as ``budget[0]`` allows (default :data:`MAX_FORMULAS`; a page shares one budget);
    the others stay TeX."""
    if "$" not in source:
        return source
    budget = budget if budget is not None else [MAX_FORMULAS]

    def one(m: re.Match) -> str:
        if budget[0] <= 0:
            return m.group(0)
        budget[0] -= 1
        return tex_to_mathml(m.group(1) or m.group(2), m.group(1) is not None)
    return _MATH.sub(one, source)


IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")


def attachment_image(attachment: Any) -> str | None:
    """A pasted image (one entry of a markdown cell's ``attachments``) as a ``data:`` URL,
    or None when it holds no image of a type a page may show (SVG can carry script)."""
    if not isinstance(attachment, dict):
        return None
    for mime in IMAGE_TYPES:
        data = attachment.get(mime)
        if isinstance(data, list):
            data = "".join(d for d in data if isinstance(d, str))
        if isinstance(data, str) and DATA_IMAGE.fullmatch(f"data:{mime};base64,{data}"):
            return f"data:{mime};base64," + re.sub(r"\s", "", data)
    return None


def _renderer(attachments: dict, raw_urls: bool = False):
    import html

    from nbconvert.filters.markdown_mistune import IPythonRenderer

    class Renderer(IPythonRenderer):
        def safe_url(self, url: str) -> str:  # (raw_urls: show the check every address as it comes out)
            return url if raw_urls else super().safe_url(url)

        """nbconvert's renderer, with pasted images resolved here (a missing one is a note,
        not an error that loses the page) and no other image embedded from anywhere."""

        def image(self, text: str, url: str, title: str | None = None) -> str:
            if url.startswith("attachment:"):
                src = attachment_image(attachments.get(url[len("attachment:"):]))
                if src is None:
                    return f"<em>[image {html.escape(url[len('attachment:'):])} is missing]</em>"
                return f'<img src="{src}" alt="{text.replace(chr(34), "&quot;")}">'
            return super(IPythonRenderer, self).image(text, url, title)

    return Renderer(escape=False, attachments={}, exclude_anchor_links=True)


def markdown_html(source: str, attachments: dict | None = None, budget: list[int] | None = None) -> str:
    """A student's markdown as safe HTML: math as MathML (within ``budget``, see
    :func:`render_math`), markdown rendered as nbconvert renders it (pasted images from
    ``attachments`` embedded), then :func:`sanitize`."""
    from nbconvert.filters.markdown_mistune import MarkdownWithMath

    renderer = _renderer(attachments if isinstance(attachments, dict) else {})
    return sanitize(MarkdownWithMath(renderer=renderer).render(render_math(str(source), budget)))


from jinja2 import pass_context as _pass_context  # beside the one class that needs it


def _exporter_base():
    from nbconvert.exporters import HTMLExporter
    return HTMLExporter


class SafeHTMLExporter(_exporter_base()):
    """nbconvert's HTML exporter whose markdown (cells, and markdown outputs) goes through
    :func:`markdown_html` and whose ``clean_html`` is :func:`sanitize`: for the pages a
    person views a submission in (the student's feedback, the instructor's Formgrader)."""

    compiled_templates = Unicode("", config=True, help=(
        "a private folder where the page templates, once compiled, are kept for the next page "
        "(Jinja's bytecode cache: a page of a batch no longer compiles nbconvert's dozen templates "
        "again); empty: compiled for each page"))

    def _create_environment(self):
        environment = super()._create_environment()
        if self.compiled_templates:
            from jinja2 import FileSystemBytecodeCache
            environment.bytecode_cache = FileSystemBytecodeCache(self.compiled_templates)
        return environment

    def from_notebook_node(self, nb, resources=None, **kw):
        """Render a copy whose outputs are only of safe types and whose raw cells are plain
        text (nbconvert would put a raw cell marked text/html into the page as it is)."""
        import copy
        nb = copy.deepcopy(nb)
        self._formulas = [MAX_FORMULAS]  # one page, one budget of formulas
        for cell in nb.cells:
            source = cell.get("source", "")
            source = "".join(source) if isinstance(source, list) else str(source)
            if len(source) > MAX_SOURCE_SHOWN:
                cell["source"] = source[:MAX_SOURCE_SHOWN] + \
                    f"\n\n… ({len(source) - MAX_SOURCE_SHOWN:,} more characters not shown: open the notebook)"
            meta = cell.get("metadata", {}).get("nbgrader")
            if isinstance(meta, dict) and not re.fullmatch(r"[A-Za-z0-9_\-]{1,100}", str(meta.get("grade_id", "x"))):
                del cell["metadata"]["nbgrader"]  # templates put grade ids into attributes, unescaped
            if cell.get("cell_type") == "code":
                cell["outputs"] = [o for o in map(clean_output, cell.get("outputs", [])) if o is not None]
            elif cell.get("cell_type") == "raw":
                cell["metadata"].pop("format", None)
                cell["metadata"].pop("raw_mimetype", None)
        return super().from_notebook_node(nb, resources, **kw)

    @_pass_context
    def markdown2html(self, context, source):  # nbconvert's filter signature
        cell = context.get("cell", {})
        attachments = cell.get("attachments", {}) if hasattr(cell, "get") else {}
        return markdown_html(source, attachments if isinstance(attachments, dict) else {},
                             getattr(self, "_formulas", None))

    def default_filters(self):
        for name, function in super().default_filters():
            if name == "clean_html":
                yield name, sanitize
            elif name != "markdown2html":
                yield name, function
        yield "markdown2html", self.markdown2html


# ---------------------------------------------------------------------------
# What the autograded notebook keeps of a run
# ---------------------------------------------------------------------------

_OUTPUT_TYPES = {"stream", "display_data", "execute_result", "error"}
_SAFE_MIME = {"text/plain", "image/png", "image/jpeg"}


def clean_output(output: Any) -> dict | None:
    """The output as nbformat would store it, restricted to safe types (text, PNG and
    JPEG images, errors); None if nothing is left."""
    if not isinstance(output, dict) or output.get("output_type") not in _OUTPUT_TYPES:
        return None
    from .intake import scrub
    output = scrub(dict(output))  # a printed lone surrogate cannot be written as UTF-8
    kind = output["output_type"]
    if kind == "stream":
        name, text = output.get("name"), output.get("text")
        if isinstance(text, list):
            text = "".join(t for t in text if isinstance(t, str))
        if name not in ("stdout", "stderr") or not isinstance(text, str):
            return None
        return {"output_type": "stream", "name": name, "text": text}
    if kind == "error":
        tb = output.get("traceback")
        return {"output_type": "error", "ename": str(output.get("ename", "Error"))[:200],
                "evalue": str(output.get("evalue", ""))[:4000],
                "traceback": [str(t)[:4000] for t in tb[:200]] if isinstance(tb, list) else []}
    data = output.get("data")
    if not isinstance(data, dict):
        return None
    kept = {k: ("".join(v) if isinstance(v, list) and all(isinstance(x, str) for x in v) else v)
            for k, v in data.items() if k in _SAFE_MIME}
    kept = {k: v for k, v in kept.items() if isinstance(v, str)}
    if not kept and isinstance(data.get("application/vnd.jupyter.widget-view+json"), dict):
        kept = {"text/plain": "(an interactive widget: open the notebook in JupyterLab to use it)"}
    for mime in ("image/png", "image/jpeg"):
        if mime in kept and (len(kept[mime]) > 4_000_000 or not _is_base64(kept[mime])):
            del kept[mime]
    if not kept:
        return None
    clean = {"output_type": kind, "data": kept, "metadata": {}}
    if kind == "execute_result":
        count = output.get("execution_count")
        clean["execution_count"] = count if isinstance(count, int) and not isinstance(count, bool) else None
    return clean


# what markdown shows as written (its text is not markup): fenced and indented code, code
# spans (a backtick after a backslash opens none), display and inline math
_PROTECTED = re.compile(
    r"(?:^(?P<fence>`{3,}|~{3,})[^\n]*\n.*?(?:^(?P=fence)[ \t]*$|\Z))"
    r"|(?:(?:^(?: {4}|\t)[^\n]*(?:\n|\Z))+)"
    r"|(?:\$\$.+?\$\$)"
    r"|(?:(?<![\\$])\$(?![\s$])[^$\n]+?(?<![\s\\])\$)"
    r"|(?:(?<!\\)(?P<ticks>`+)(?!`).+?(?<!`)(?P=ticks)(?!`))",
    re.S | re.M)
_DESTINATION = re.compile(r"(\]\(\s*<?|^[ ]{0,3}\[[^\]\n]+\]:[ \t]*<?)([^\s)>]*)", re.M)
_ALLOWED_LINK = re.compile(r"(?:https?|mailto|attachment|blocked-remote-image):|[^:]*$|[^:]*[/?#]", re.I)
_REMOTE_IMAGE = re.compile(r"(!\[[^\]\n]*\]\(\s*<?)(?!attachment:)(?=[A-Za-z][\w+.-]*:|//)")
_SCHEME = re.compile(r"(javascript|vbscript|data|file)\s*:", re.I)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_MARKDOWN_TAGS = {"p", "code", "pre", "em", "strong", "a", "ul", "ol", "li", "blockquote", "hr", "br", "img", "del",
                  "h1", "h2", "h3", "h4", "h5", "h6", "table", "thead", "tbody", "tr", "th", "td"}
_TAG = re.compile(r"<\s*/?\s*([A-Za-z][\w:-]*)([^>]*)>")
_ATTRIBUTE = re.compile(r'\s+([\w:-]+)="([^"<>]*)"')


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _markup_ok(tag: str, attributes: str) -> bool:
    """An element markdown itself makes, with only the attributes it gives (links to web and
    mail addresses or anchors, images only pasted or with their address blocked)."""
    tag = tag.lower()
    if tag not in _MARKDOWN_TAGS or _ATTRIBUTE.sub("", attributes).strip(" /"):
        return False
    for name, value in _ATTRIBUTE.findall(attributes):
        if name == "href" and tag == "a" and not _SCHEME.search(value):
            continue
        if name in ("alt", "title") or (name == "id" and tag[0] == "h") or (name == "align" and tag in ("td", "th")):
            continue
        if name == "start" and tag == "ol" or name == "class" and tag == "code" and re.fullmatch(r"language-[\w+-]+", value):
            continue
        if name == "src" and tag == "img" and value.startswith(("attachment:", "blocked-remote-image:")):
            continue
        return False
    return True


def _safe_destinations(text: str) -> str:
    """Every link and image address of markdown text blocked unless, with its entities decoded
    (renderers decode them, twice over), it is a web, mail or pasted-image address or a
    relative one."""
    import html
    import urllib.parse

    def one(m: re.Match) -> str:
        address = m.group(2)
        decoded = address
        for _ in range(3):
            decoded = html.unescape(decoded)
        decoded = re.sub(r"[\x00-\x20\x7f]", "", urllib.parse.unquote(decoded))
        if _ALLOWED_LINK.match(decoded):
            return m.group(0)
        return m.group(1) + "blocked-link:" + urllib.parse.quote(decoded, safe="")
    return _DESTINATION.sub(one, text)


def clean_markdown(text: str) -> str:
    """A student's markdown for the autograded notebook, which a person grading it reads (in
    Formgrader, or opened in JupyterLab): HTML outside code and math is escaped (it shows as
    the text that was written), links to script-like schemes are disabled, and images from
    an address are not fetched (a pasted image is kept). Code, code spans and math are left
    exactly as written (``$d_k > 64$``, ``if i < j:``). (The pages that show it clean their
    HTML again: :func:`markdown_html`.)

    The result is rendered as nbconvert renders it, and kept only if that makes nothing but
    markdown's own elements; otherwise everything is escaped."""
    text = _CONTROL.sub("", text)
    parts, last = [], 0
    for m in _PROTECTED.finditer(text):
        parts += [("text", text[last:m.start()]), ("code", m.group(0))]
        last = m.end()
    parts.append(("text", text[last:]))
    cleaned = "".join(_safe_destinations(_REMOTE_IMAGE.sub(r"\1blocked-remote-image:", _escape(t)))
                      if kind == "text" else t for kind, t in parts)
    from nbconvert.filters.markdown_mistune import MarkdownWithMath
    try:  # (pasted images render as a note here: only the markup is being checked)
        rendered = MarkdownWithMath(renderer=_renderer({}, raw_urls=True)).render(cleaned)
    except Exception:  # whatever the renderer makes of it, the text stays text
        rendered = "<unreadable>"
    if all(_markup_ok(tag, attributes) for tag, attributes in _TAG.findall(rendered)):
        return cleaned
    return _SCHEME.sub(r"\1-blocked:", _escape(text))


def clean_attachments(attachments: Any, max_bytes: int = 24 * 2**20) -> dict:
    """A markdown cell's pasted images as the autograded notebook keeps them: PNG, JPEG,
    GIF and WebP only (no SVG: it can carry script), valid base64, ``max_bytes`` in all (more
    than a notebook may hold: an honest photo of a derivation is kept)."""
    kept, used = {}, 0
    for name, attachment in (attachments.items() if isinstance(attachments, dict) else []):
        src = attachment_image(attachment)
        if not isinstance(name, str) or src is None or used + len(src) > max_bytes:
            continue
        mime, data = src[len("data:"):].split(";base64,", 1)
        kept[name[:200]] = {mime: data}
        used += len(src)
    return kept


def clean_text(text: str) -> str:
    """A message from the student's side (an exception's text), without control or
    bidirectional characters, for the records that status, export and pages read."""
    from .intake import scrub
    return _CONTROL.sub("", scrub(str(text)))


def _is_base64(text: str) -> bool:
    return re.fullmatch(r"[A-Za-z0-9+/=\s]*", text) is not None
