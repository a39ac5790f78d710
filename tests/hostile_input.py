"""What a hostile (or careless) student can hand in *around* their code, as data: archives,
file and folder names, ids, notebook JSON, sizes, timestamps, written answers and outputs.
tests/grading/test_hostile_input.py delivers it through every collect layout and grades it.

Every payload that could run in a browser sets ``window.__pwned`` or the page title to
:data:`PWNED`, so that a test in Chromium can tell whether any of it ran.
"""

from __future__ import annotations

import io
import json
import os
import stat
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

PWNED = "PWNED-BY-STUDENT"
RUN = f"window.__pwned=1;document.title='{PWNED}'"

# markup a written answer (or any markdown cell) may carry: each would run script if a
# page let it through (raw HTML, obfuscated link schemes, math turned into markup, MathML
# and SVG namespace tricks, code spans the renderer may misread)
MARKUP = [
    f"<script>{RUN}</script>",
    f'<img src=x onerror="{RUN}">',
    f'<svg onload="{RUN}"><circle r=1 /></svg>',
    f"[click me](javascript:{RUN})",
    f"[click me](jav&#x61;script:{RUN})",
    f"[click me](&#106;avascript:{RUN})",
    f'<a href="jav&#x09;ascript:{RUN}">tab in the scheme</a>',
    f'<a href="data:text/html,<script>{RUN}</script>">a data link</a>',
    f"$\\text{{<img src=x onerror={RUN}>}}$",
    f"$$\\href{{javascript:{RUN}}}{{x}}$$",
    f"<math><mtext><table><mglyph><style><img src=x onerror={RUN}>",
    "<iframe srcdoc=\"<script>parent.__pwned=1</script>\"></iframe>",
    f'<details open ontoggle="{RUN}"><summary>x</summary></details>',
    '<base href="javascript:/">',
    f'<form action="javascript:{RUN}"><input autofocus onfocus="{RUN}"></form>',
    f"<style>body {{ background: url('javascript:{RUN}') }}</style>",
    f"`</code><img src=x onerror={RUN}>`",
    f"\\`<img src=x onerror={RUN}>\\`",
    "![local file](../../../../../etc/passwd) ![a pasted svg](attachment:evil.svg)",
    f'<object data="javascript:{RUN}"></object><embed src="javascript:{RUN}">',
]

# what a cell can display while it is graded: types a page would render as markup or script
DISPLAY_CELL = f'''
from IPython.display import display, HTML, Javascript, SVG, Markdown
display(HTML("<img src=x onerror=\\"{RUN}\\">"))
display(Javascript("{RUN}"))
display({{"text/html": "<script>{RUN}</script>", "text/plain": "plain"}}, raw=True)
display(SVG('<svg xmlns="http://www.w3.org/2000/svg" onload="{RUN}"><circle r="1"/></svg>'))
display(Markdown("[x](javascript:{RUN})"))
print("\\x1b]0;{PWNED}\\x07\\x1b[2J")
'''

# a message raised by the student's code: terminal escapes (window title, clipboard, clear),
# a newline that forges a line of `workbook status`, a spreadsheet formula, markup
HOSTILE_MESSAGE = ("=HYPERLINK(\"http://evil.example\",\"ok\")\x1b]52;c;ZXZpbA==\x07\x1b]0;" + PWNED + "\x07"
                   "\x1b[2J\nbob 03_self_attention: [forged] bob is fine\r<img src=x onerror=\"" + RUN + "\">")
MESSAGE_CELL = f"raise ValueError({HOSTILE_MESSAGE!r})"

EVIL_SVG = "PHN2ZyB4bWxucz0iaHR0cDovL3d3dy53My5vcmcvMjAwMC9zdmciIG9ubG9hZD0iYWxlcnQoMSkiLz4="
# a 1x1 PNG: an honest student's pasted screenshot
PASTED_PNG = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")


def with_written_answers(nb: nbformat.NotebookNode, answers: list[str],
                         attachments: dict | None = None) -> nbformat.NotebookNode:
    """``nb`` with its written answers (markdown solution cells) replaced by ``answers`` in
    turn (the last one repeated), each with ``attachments``."""
    k = 0
    for c in nb.cells:
        if c.cell_type == "markdown" and c.metadata.get("nbgrader", {}).get("solution"):
            c.source = answers[min(k, len(answers) - 1)]
            if attachments:
                c["attachments"] = attachments
            k += 1
    return nb


def add_cells(nb: nbformat.NotebookNode, cells: list[nbformat.NotebookNode]) -> nbformat.NotebookNode:
    """``nb`` with ``cells`` added after its first graded item's test cell (so that every
    item's own code has run when they do)."""
    at = next(i for i, c in enumerate(nb.cells)
              if c.metadata.get("nbgrader", {}).get("grade_id", "").startswith("test_")) + 1
    nb.cells[at:at] = cells
    return nb


# ---------------------------------------------------------------------------
# Archives
# ---------------------------------------------------------------------------

def zip_bytes(members: list[tuple[str, bytes]], *, mode: dict[str, int] | None = None,
              encrypted: set[str] = frozenset()) -> bytes:
    """A zip of ``members`` (name, data); ``mode`` sets a member's Unix mode (a link, a
    device), ``encrypted`` marks members as encrypted (flag bit 0)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members:
            info = zipfile.ZipInfo(name, date_time=(2026, 11, 20, 10, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            if mode and name in mode:
                info.external_attr = mode[name] << 16
            zf.writestr(info, data)
    raw = bytearray(buffer.getvalue())
    for name in encrypted:  # zipfile writes no encrypted member: set the flag in both headers
        info = zipfile.ZipFile(io.BytesIO(bytes(raw))).getinfo(name)
        raw[info.header_offset + 6] |= 0x1
        central = raw.index(b"PK\x01\x02")
        while raw[central + 46:central + 46 + len(name)] != name.encode():
            central = raw.index(b"PK\x01\x02", central + 4)
        raw[central + 8] |= 0x1
    return bytes(raw)


def zip_bomb(megabytes: int) -> bytes:
    """A zip whose one member unpacks to ``megabytes`` MB of zeros (about 1000 to 1)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        with zf.open("data.bin", "w", force_zip64=True) as f:
            block = bytes(2**20)
            for _ in range(megabytes):
                f.write(block)
    return buffer.getvalue()


# ---------------------------------------------------------------------------
# Notebooks over the limits
# ---------------------------------------------------------------------------

def notebook_of_size(megabytes: float) -> bytes:
    """A valid notebook of about ``megabytes`` MB (one big markdown cell of random text, which
    no archive compresses much)."""
    import base64
    text = base64.b64encode(os.urandom(int(megabytes * 2**20 * 3 / 4))).decode()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(text)])
    return nbformat.writes(nb).encode()


def notebook_of_cells(count: int) -> bytes:
    cells = ",".join('{"cell_type":"raw","metadata":{},"source":"","id":"c%d"}' % i for i in range(count))
    return ('{"nbformat":4,"nbformat_minor":5,"metadata":{},"cells":[%s]}' % cells).encode()


def notebook_nested(levels: int) -> bytes:
    return ('{"nbformat":4,"nbformat_minor":5,"metadata":{"x":%s},"cells":[]}'
            % ("[" * levels + "]" * levels)).encode()


def notebook_of_values(count: int) -> bytes:
    return ('{"nbformat":4,"nbformat_minor":5,"metadata":{"x":[%s]},"cells":[]}' % ",".join("0" * count)).encode()


# ---------------------------------------------------------------------------
# A class of submissions, delivered in any collect layout
# ---------------------------------------------------------------------------

@dataclass
class Hand:
    """What one student (or someone posing as one) hands in."""

    name: str  # the id as written into names (may be anything)
    files: list[tuple[str, bytes]]  # (path inside the student's submission, data)
    expect: str  # "imported", "rejected: <words>" or "error: <words>" (or "ignored")
    special: dict = field(default_factory=dict)  # {"symlink": target} / {"fifo": True} for folder layouts
    layouts: tuple[str, ...] = ("lms-zip", "lms-folder", "student-folders", "nbgrader", "nbgrader-zip")


LAYOUTS = ("lms-zip", "lms-folder", "student-folders", "nbgrader", "nbgrader-zip")


def deliver(hands: list[Hand], layout: str, assignment: str, target: Path) -> Path:
    """Write ``hands`` as ``layout`` at ``target`` (a folder, or ``target.zip``); return it.

    - ``lms-*``: one file per student, ``<name>_<file>`` (a student with several files
      hands in ``<name>_files.zip``);
    - ``student-folders``: ``<name>/<file>``;
    - ``nbgrader*``: ``<name>/<assignment>/<file>``."""
    entries: list[tuple[str, bytes, dict]] = []
    for hand in hands:
        if layout not in hand.layouts:
            continue
        if layout.startswith("lms"):
            if len(hand.files) == 1 and not hand.files[0][0].endswith(".zip"):
                path, data = hand.files[0]
                entries.append((f"{hand.name}_{Path(path).name}", data, hand.special))
            elif len(hand.files) == 1:
                entries.append((f"{hand.name}_{hand.files[0][0]}", hand.files[0][1], hand.special))
            else:
                entries.append((f"{hand.name}_files.zip", zip_bytes(hand.files), hand.special))
        else:
            prefix = f"{hand.name}/" if layout == "student-folders" else f"{hand.name}/{assignment}/"
            entries += [(prefix + path, data, hand.special) for path, data in hand.files]
    if layout.endswith("zip"):
        path = target.with_suffix(".zip")
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
            for name, data, special in entries:
                info = zipfile.ZipInfo(name, date_time=(2026, 11, 20, 10, 0, 0))
                info.compress_type = zipfile.ZIP_DEFLATED
                if special.get("symlink"):
                    info.external_attr = (stat.S_IFLNK | 0o777) << 16
                    data = special["symlink"].encode()
                zf.writestr(info, data)
        return path
    target.mkdir(parents=True)
    for name, data, special in entries:
        path = target / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if special.get("symlink"):
            path.symlink_to(special["symlink"])
        elif special.get("fifo"):
            os.mkfifo(path)
        else:
            path.write_bytes(data)
    return target


def canary_dir() -> Path:
    """Where an absolute path in an archive would write (must stay empty)."""
    return Path(os.environ.get("TMPDIR", "/tmp")) / "workbook-hostile-canary"


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def damaged_zip(member: bytes, how: str) -> bytes:
    """A zip of one notebook, damaged as an upload can be: ``crc`` (one bit flipped in the
    stored data), ``compression`` (a method zipfile cannot unpack, Zstandard's 93) or
    ``stream`` (a deflate stream of garbage)."""
    import struct
    import zlib
    buffer = io.BytesIO()
    method = zipfile.ZIP_STORED if how == "crc" else zipfile.ZIP_DEFLATED
    with zipfile.ZipFile(buffer, "w", method) as zf:
        zf.writestr("03_self_attention.ipynb", member)
    raw = bytearray(buffer.getvalue())
    info = zipfile.ZipFile(io.BytesIO(bytes(raw))).getinfo("03_self_attention.ipynb")
    start = info.header_offset + 30 + len(info.filename.encode())
    if how == "crc":
        raw[start + len(member) // 2] ^= 0x01
    elif how == "compression":
        raw[info.header_offset + 8:info.header_offset + 10] = struct.pack("<H", 93)
        central = raw.index(b"PK\x01\x02")
        raw[central + 10:central + 12] = struct.pack("<H", 93)
    elif how == "stream":
        size = info.compress_size
        raw[start:start + size] = bytes((i * 37 + 11) % 256 for i in range(size))
        assert zlib  # (the stream is nonsense to zlib)
    return bytes(raw)


# what a student's own code or answers can hold that cannot be written as UTF-8
SURROGATE_CELLS = ["print(chr(0xD800))", "raise ValueError(chr(0xDFFF))"]
