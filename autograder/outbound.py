"""Encoding on the way out: every string a student controls made safe for where it goes.

What comes in passes :mod:`autograder.intake`; what goes out passes here, whatever
came before it (a rule in intake is one wall, this is the second):

- **a terminal**: :func:`autograder.intake.shown` (control, invisible and bidirectional
  characters written as escapes, one line);
- **a CSV file** (:func:`csv_cell`, :func:`write_csv`): a cell that a spreadsheet would
  read as a formula (OWASP's rule: it starts with ``=``, ``+``, ``-``, ``@``, a tab or a
  carriage return, after any spaces) gets a leading ``'``; numbers stay numbers;
- **the autograded notebook** (:func:`clean_output`, :func:`clean_markdown`,
  :func:`clean_text`): only outputs of safe types are kept, a student's HTML in markdown
  is kept as text, messages lose their control characters;
- **an HTML page** (:func:`sanitize`, :func:`markdown_html`, :class:`SafeHTMLExporter`):
  everything a student wrote or printed is rendered, then cleaned by an allow-list
  sanitiser (nh3, the Python binding of the maintained Rust library ammonia): markdown's
  elements, tables and MathML only; links only to ``http(s)`` and ``mailto`` (checked by
  the sanitiser after it decodes entities); images only as embedded PNG, JPEG, GIF or
  WebP data. Every page the project writes carries :data:`CSP`, which lets no script
  run at all: the pages need none.
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path
from typing import Any, Iterable

import nh3

__all__ = ["csv_cell", "write_csv", "sanitize", "markdown_html", "tex_to_mathml", "CSP", "CSP_META",
           "with_csp", "SafeHTMLExporter", "ALLOWED_TAGS", "clean_output", "clean_markdown", "clean_text", "clean_attachments",
           "IMAGE_TYPES", "attachment_image"]

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
# HTML
# ---------------------------------------------------------------------------

CSP = ("default-src 'none'; img-src data:; style-src 'unsafe-inline'; font-src data:; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
CSP_META = f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'

_MATHML = {"math", "mrow", "mi", "mn", "mo", "ms", "mtext", "mspace", "msub", "msup", "msubsup", "mfrac", "msqrt",
           "mroot", "mstyle", "mpadded", "mphantom", "menclose", "mover", "munder", "munderover", "mtable", "mtr",
           "mtd", "semantics", "annotation", "merror"}
ALLOWED_TAGS = {"p", "br", "hr", "em", "strong", "b", "i", "u", "s", "del", "ins", "sub", "sup", "small", "mark",
                "code", "pre", "kbd", "samp", "var", "blockquote", "q", "cite", "abbr",
                "ul", "ol", "li", "dl", "dt", "dd", "h1", "h2", "h3", "h4", "h5", "h6",
                "a", "img", "span", "div", "table", "thead", "tbody", "tfoot", "tr", "th", "td", "caption",
                "details", "summary", *_MATHML}
_MATH_ATTRIBUTES = {"display", "mathvariant", "stretchy", "fence", "separator", "lspace", "rspace", "accent",
                    "accentunder", "movablelimits", "columnalign", "rowalign", "columnspacing", "rowspacing",
                    "width", "height", "depth", "linethickness", "scriptlevel", "displaystyle", "notation",
                    "encoding", "largeop", "symmetric", "minsize", "maxsize", "form", "voffset"}
_ATTRIBUTES = {
    "*": {"title", "lang", "dir"},
    "a": {"href"}, "img": {"src", "alt", "width", "height"},
    "h1": {"id"}, "h2": {"id"}, "h3": {"id"}, "h4": {"id"}, "h5": {"id"}, "h6": {"id"},
    "code": {"class"}, "pre": {"class"}, "span": {"class"}, "div": {"class"},
    "td": {"align", "colspan", "rowspan"}, "th": {"align", "colspan", "rowspan"}, "ol": {"start"},
    **{tag: _MATH_ATTRIBUTES for tag in _MATHML},
}
_DATA_IMAGE = re.compile(r"data:image/(png|jpeg|gif|webp);base64,[A-Za-z0-9+/=\s]*")


def _attribute_filter(element: str, attribute: str, value: str) -> str | None:
    if element == "img" and attribute == "src":
        return value if _DATA_IMAGE.fullmatch(value) else None  # no fetch from anywhere, local files included
    if attribute == "href" and value.strip().lower().startswith("data:"):
        return None  # data URLs only as images (the sanitiser lets the scheme through for img src)
    if attribute in ("class", "id"):
        return re.sub(r"[^\w\- ]", "", value)[:100] or None
    return value


def sanitize(fragment: str) -> str:
    """A fragment of HTML built from a student's text, cleaned by an allow-list:
    :data:`ALLOWED_TAGS` with a few attributes each, links to http(s) and mailto only
    (entities decoded first), images only as embedded data; everything else removed
    (``script`` and ``style`` with their content)."""
    return nh3.clean(fragment, tags=ALLOWED_TAGS, attributes=_ATTRIBUTES, url_schemes={"http", "https", "mailto", "data"},
                     attribute_filter=_attribute_filter, link_rel="noopener noreferrer nofollow",
                     clean_content_tags={"script", "style"}, strip_comments=True)


def tex_to_mathml(tex: str, display: bool) -> str:
    """MathML for a TeX formula (cleaned by :func:`sanitize` with the rest of the page), or
    the TeX shown as code when it cannot be converted."""
    import html

    from latex2mathml.converter import convert

    try:
        mathml = convert(tex, display="block" if display else "inline")
    except Exception:  # any TeX a student wrote
        return f"<code>{html.escape(tex)}</code>"
    return sanitize(mathml)


_MATH = re.compile(r"\$\$(.+?)\$\$|(?<![\\$])\$(?![\s$])([^$\n]+?)(?<![\s\\])\$", re.S)


def render_math(source: str) -> str:
    """Markdown whose ``$...$`` and ``$$...$$`` formulas are MathML (offline: no MathJax)."""
    if "$" not in source:
        return source
    return _MATH.sub(lambda m: tex_to_mathml(m.group(1) or m.group(2), m.group(1) is not None), source)


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
        if isinstance(data, str) and _DATA_IMAGE.fullmatch(f"data:{mime};base64,{data}"):
            return f"data:{mime};base64," + re.sub(r"\s", "", data)
    return None


def _renderer(attachments: dict):
    import html

    from nbconvert.filters.markdown_mistune import IPythonRenderer

    class Renderer(IPythonRenderer):
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


def markdown_html(source: str, attachments: dict | None = None) -> str:
    """A student's markdown as safe HTML: math as MathML, markdown rendered as nbconvert
    renders it (pasted images from ``attachments`` embedded), then :func:`sanitize`."""
    from nbconvert.filters.markdown_mistune import MarkdownWithMath

    renderer = _renderer(attachments if isinstance(attachments, dict) else {})
    return sanitize(MarkdownWithMath(renderer=renderer).render(render_math(str(source))))


def with_csp(page: str) -> str:
    """``page`` with :data:`CSP_META` first in its ``<head>`` (before anything the student
    wrote); a page without a head gets one."""
    m = re.search(r"<head(\s[^>]*)?>", page, re.I)
    if m:
        return page[:m.end()] + "\n" + CSP_META + page[m.end():]
    return f"<!DOCTYPE html>\n<html><head>{CSP_META}</head>\n" + page


from jinja2 import pass_context as _pass_context  # beside the one class that needs it


def _exporter_base():
    from nbconvert.exporters import HTMLExporter
    return HTMLExporter


class SafeHTMLExporter(_exporter_base()):
    """nbconvert's HTML exporter whose markdown (cells, and markdown outputs) goes through
    :func:`markdown_html` and whose ``clean_html`` is :func:`sanitize`: for the pages a
    person views a submission in (the student's feedback, the instructor's Formgrader)."""

    def from_notebook_node(self, nb, resources=None, **kw):
        """Render a copy whose outputs are only of safe types and whose raw cells are plain
        text (nbconvert would put a raw cell marked text/html into the page as it is)."""
        import copy
        nb = copy.deepcopy(nb)
        for cell in nb.cells:
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
        return markdown_html(source, attachments if isinstance(attachments, dict) else {})

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


_CODE_SPAN = re.compile(r"(```.*?```|~~~.*?~~~|`[^`]*`)", re.S)
_SCHEME = re.compile(r"(javascript|vbscript|data|file)\s*:", re.I)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_MARKDOWN_TAGS = {"p", "code", "pre", "em", "strong", "a", "ul", "ol", "li", "blockquote", "hr", "br", "img", "del",
                  "h1", "h2", "h3", "h4", "h5", "h6", "table", "thead", "tbody", "tr", "th", "td"}
_TAG = re.compile(r"<\s*/?\s*([A-Za-z][\w:-]*)([^>]*)>")
_SAFE_ATTRIBUTES = re.compile(r'^(\s+(href|src|alt|title|class|align|start)="[^"<>]*")*\s*/?$')


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def clean_markdown(text: str) -> str:
    """A student's markdown for the autograded notebook: HTML outside code is escaped (a
    person grading it sees what was written, as text), script-like link schemes are
    disabled. (The pages that show it clean their HTML again: :func:`markdown_html`.)

    Code spans keep their text (`<bos>` stays readable) only if nbconvert's renderer then
    makes nothing but markdown's own elements: escaped backticks or backticks in a link
    can make a guess at the spans wrong, and then everything is escaped."""
    parts = _CODE_SPAN.split(text)
    for i in range(0, len(parts), 2):  # the even parts are outside code
        parts[i] = _SCHEME.sub(r"\1-blocked:", _escape(parts[i]))
    cleaned = _CONTROL.sub("", "".join(parts))
    from nbconvert.filters.markdown_mistune import MarkdownWithMath
    try:  # (pasted images render as a note here: only the markup is being checked)
        rendered = MarkdownWithMath(renderer=_renderer({})).render(cleaned)
    except Exception:  # whatever the renderer makes of it, the text stays text
        rendered = "<unreadable>"
    for name, attributes in _TAG.findall(rendered):
        if name.lower() not in _MARKDOWN_TAGS or not _SAFE_ATTRIBUTES.match(attributes) \
                or _SCHEME.search(attributes):
            return _CONTROL.sub("", _SCHEME.sub(r"\1-blocked:", _escape(text)))
    return cleaned


def clean_attachments(attachments: Any, max_bytes: int = 4 * 2**20) -> dict:
    """A markdown cell's pasted images as the autograded notebook keeps them: PNG, JPEG,
    GIF and WebP only (no SVG: it can carry script), valid base64, ``max_bytes`` in all."""
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
    return _CONTROL.sub("", str(text))


def _is_base64(text: str) -> bool:
    return re.fullmatch(r"[A-Za-z0-9+/=\s]*", text) is not None
