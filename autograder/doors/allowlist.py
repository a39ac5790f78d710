"""The allow-list every page's student content passes (:func:`sanitize`: nh3, the Python binding
of the maintained Rust library ammonia) and the Content-Security-Policy every page the project
writes carries (:data:`CSP`, :func:`with_csp`), which lets no script run at all: the pages need
none. :mod:`autograder.doors.outbound` renders a student's markdown and notebooks through it."""

from __future__ import annotations

import re

import nh3

__all__ = ["CSP", "CSP_META", "ALLOWED_TAGS", "DATA_IMAGE", "sanitize", "with_csp"]


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
DATA_IMAGE = re.compile(r"data:image/(png|jpeg|gif|webp);base64,[A-Za-z0-9+/=\s]*")


def _attribute_filter(element: str, attribute: str, value: str) -> str | None:
    if element == "img" and attribute == "src":
        return value if DATA_IMAGE.fullmatch(value) else None  # no fetch from anywhere, local files included
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


def with_csp(page: str) -> str:
    """``page`` with :data:`CSP_META` first in its ``<head>`` (before anything the student
    wrote); a page without a head gets one."""
    m = re.search(r"<head(\s[^>]*)?>", page, re.I)
    if m:
        return page[:m.end()] + "\n" + CSP_META + page[m.end():]
    return f"<!DOCTYPE html>\n<html><head>{CSP_META}</head>\n" + page
