"""The one door through which what students hand in enters the instructor's side.

Everything a student hands in is hostile until it has come through here: archive members,
file and folder names, student ids, timestamps, notebook JSON and its size. ``collect``
reads every layout (nbgrader folders, a folder per student, LMS downloads, zips) through
this module, and ``autograde`` reads every submitted notebook through it, before anything
else touches the bytes. Each rule is an explicit limit (:class:`IntakeLimits`, set in
``nbgrader_config.py`` as ``c.Intake.<name>``, see :mod:`autograder.course.settings`); breaking one
raises :class:`Refused` with a reason that names the offending thing escaped
(:func:`shown`), and costs that student's submission, never the run.

- **Names and ids** (:func:`student_id`): a student id is 1-64 ASCII letters, digits and
  ``. _ - @``, starting with a letter or digit: what LMS exports and nbgrader use, and
  safe as a file name, in a terminal, a CSV cell, an HTML attribute and a plot label.
  Anything else (other scripts, invisible or bidirectional characters, control
  characters, ``..``, the project's own reserved names) is refused, never changed into
  something that looks like another student. :func:`same_student_key` tells ids apart
  the way a case-insensitive file system would.
- **Paths** (:func:`member_path`): an archive member or a file in a folder must stay
  inside its student's folder: no absolute paths, drive letters, ``..`` (a backslash
  separates folders, as some Windows archivers write it), control characters or
  over-long names.
- **Archives** (:func:`read_zip`): no links, devices or encrypted members; caps on the
  number of members, the unpacked bytes and the compression ratio, checked before a
  member is unpacked and again while it is.
- **Notebooks** (:func:`read_notebook`): byte size, JSON nesting depth, the number of
  JSON values and of cells are checked on the raw bytes before the JSON is parsed, then
  nbformat validates it.
- **Times** (:func:`parse_time`): a time a student wrote is parsed with a cap on its
  length and never raises: a bad one is ``None`` ("lateness unknown").
"""

from __future__ import annotations

import datetime as dt
import re
import stat
import unicodedata
import zipfile
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import IO, Any, Iterator

import numpy as np

__all__ = ["IntakeLimits", "Refused", "shown", "invisible", "scrub", "student_id", "same_student_key", "looks_like", "member_path",
           "ZipMember",
           "read_zip", "read_bounded", "scan_json", "read_notebook", "parse_time", "time_zone", "RESERVED_IDS", "ID_RULE"]

MB = 2**20


@dataclass(frozen=True)
class IntakeLimits:
    """What one student may hand in (``c.Intake.<name>`` in nbgrader_config.py)."""

    notebook_mb: float = 20.0  # one notebook file
    cells: int = 2_000  # cells in one notebook (the course's have under 100)
    json_depth: int = 64  # nesting of a notebook's JSON (a notebook nests about ten deep)
    json_values: int = 1_000_000  # lists, objects and list items in a notebook's JSON
    files: int = 200  # files one student hands in, archive members included
    unpacked_mb: float = 100.0  # all of one student's files together, unpacked
    compression_ratio: float = 200.0  # unpacked size / packed size of an archive member over 1 MB
    id_length: int = 64  # characters of a student id
    name_bytes: int = 150  # bytes of one file or folder name in a submission (file systems allow 255)
    feedback_mb: float = 5.0  # one feedback page; outputs past it are left out with a note

    @property
    def notebook_bytes(self) -> int:
        return int(self.notebook_mb * MB)

    @property
    def unpacked_bytes(self) -> int:
        return int(self.unpacked_mb * MB)


MAX_DEPTH = 8  # folders a submitted file may be nested in


class Refused(ValueError):
    """Something a student handed in breaks a rule; the message says which, with every
    student-controlled string in it escaped."""


# ---------------------------------------------------------------------------
# Showing student strings: control, invisible and bidirectional characters made visible
# ---------------------------------------------------------------------------

_VISIBLE_CATEGORIES = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}
# Unicode's Default_Ignorable_Code_Point (DerivedCoreProperties.txt), which fonts draw as nothing
# though some are letters (U+3164 HANGUL FILLER: `out` and `outㅤ` look alike), and U+2800 BRAILLE
# PATTERN BLANK, drawn as a space
_IGNORABLE = ((0x00AD, 0x00AD), (0x034F, 0x034F), (0x061C, 0x061C), (0x115F, 0x1160), (0x17B4, 0x17B5),
              (0x180B, 0x180F), (0x200B, 0x200F), (0x202A, 0x202E), (0x2060, 0x206F), (0x2800, 0x2800),
              (0x3164, 0x3164), (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8),
              (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A), (0xE0000, 0xE0FFF))


def invisible(ch: str) -> bool:
    """Whether a character shows as nothing (or not as itself): a control, format (zero-width,
    bidirectional), private-use, unassigned, line-separating or default-ignorable character
    (variation selectors, fillers, tags), or a lone surrogate."""
    if unicodedata.category(ch) in _VISIBLE_CATEGORIES:
        return True
    code = ord(ch)
    return code >= 0xAD and any(low <= code <= high for low, high in _IGNORABLE)


def _escape_char(ch: str) -> str:
    code = ord(ch)
    if ch == "\n":
        return "\\n"
    if ch == "\t":
        return "\\t"
    if ch == "\r":
        return "\\r"
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def shown(text: Any, limit: int = 200) -> str:
    """``text`` safe to print on a terminal and on one line: every :func:`invisible` character
    (controls, zero-width and bidirectional ones, fillers and variation selectors, lone
    surrogates: an undecodable byte of a file name) written as an escape (``\\x1b``,
    ``\\u202e``, ``\\u3164``, ``\\n``); cut at ``limit`` characters with "…"."""
    text = _SPACES.sub(" ", str(text))  # a run of spaces could push text onto a line of its own
    out = []
    for ch in text[:limit]:
        out.append(_escape_char(ch) if invisible(ch) else ch)
    return "".join(out) + ("…" if len(text) > limit else "")


_SPACES = re.compile(r"[^\S\n\r\t]{2,}")  # two or more spaces of any kind (a newline is escaped anyway)
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def scrub(value: Any) -> Any:
    """``value`` (JSON-like: dicts, lists, strings) with every lone surrogate in its strings
    replaced by U+FFFD: one ``"\\ud800"`` in a notebook or a printed ``chr(0xD800)`` would
    otherwise stop whatever writes it as UTF-8 (nbformat, nbgrader's checksums, a report)."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value) if _SURROGATE.search(value) else value
    if not isinstance(value, (dict, list)):
        return value
    stack = [value]
    while stack:
        node = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, item in list(items):
            if isinstance(item, str):
                if _SURROGATE.search(item):
                    node[key] = _SURROGATE.sub("\ufffd", item)
            elif isinstance(item, (dict, list)):
                stack.append(item)
            if isinstance(node, dict) and isinstance(key, str) and _SURROGATE.search(key):
                node[_SURROGATE.sub("\ufffd", key)] = node.pop(key)
    return value


# ---------------------------------------------------------------------------
# Student ids
# ---------------------------------------------------------------------------

ID_RULE = ("a student id is 1-64 ASCII letters, digits and . _ - @, starting with a letter or a digit "
           "(the login ids and numbers that LMS exports and nbgrader use)")
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]*")
# names the grading folders use for themselves, or that some file systems give a meaning
RESERVED_IDS = frozenset({"con", "prn", "aux", "nul", *(f"com{i}" for i in range(10)), *(f"lpt{i}" for i in range(10)),
                          "feedback", "submitted", "autograded", "reports", "class-report", "grades.csv",
                          "gradebook.db", "timestamp.txt", "index.html", "nbgrader_config.py"})


def same_student_key(student: str) -> str:
    """Ids with the same key are one student to a case-insensitive file system (and to a
    person reading the list): ``Alice`` and ``alice``."""
    return unicodedata.normalize("NFKC", student).casefold()


_LOOKALIKE = str.maketrans({"i": "l", "1": "l", "0": "o"})


def looks_like(student: str) -> str:
    """Ids with the same skeleton look alike to a reader though they differ (``alice`` and
    ``aIice``, ``bo0`` and ``boo``): case folded, then the letters and digits most often
    taken for each other folded together (``I l 1``, ``O 0``), ``rn`` as ``m`` and ``vv`` as
    ``w``."""
    return same_student_key(student).translate(_LOOKALIKE).replace("rn", "m").replace("vv", "w")


def student_id(raw: str, limits: IntakeLimits = IntakeLimits()) -> str:
    """``raw`` (a folder name, a part of a file name, a roster entry) as a student id, or
    :class:`Refused` saying why, with the name shown escaped. Nothing is changed into an
    id: a name that needs changing (other scripts, invisible characters) is refused."""
    if not isinstance(raw, str) or not raw:
        raise Refused("an empty student id; " + ID_RULE)
    why = None
    bad = [ch for ch in raw if not (ch.isascii() and (ch.isalnum() or ch in "._-@"))]
    if len(raw) > limits.id_length:
        why = f"it is {len(raw)} characters long, over {limits.id_length}"
    elif bad:
        names = []
        for ch in dict.fromkeys(bad):
            name = unicodedata.name(ch, "") if unicodedata.category(ch) != "Cs" else "an undecodable byte"
            names.append(f"'{ch if ch.isascii() and ch.isprintable() else _escape_char(ch)}'"
                         + (f" ({name})" if name else ""))
        why = "it holds " + ", ".join(names[:4]) + (" and more" if len(names) > 4 else "")
    elif not _ID.fullmatch(raw):
        why = "it does not start with a letter or a digit"
    elif raw.lower() in RESERVED_IDS or raw.lower().split(".")[0] in RESERVED_IDS:
        why = "it is a name the course's folders use themselves"
    if why:
        raise Refused(f"student id '{shown(raw, 80)}' refused: {why}; {ID_RULE}")
    return raw


# ---------------------------------------------------------------------------
# Paths inside a submission
# ---------------------------------------------------------------------------

def member_path(name: str, limits: IntakeLimits = IntakeLimits(), archive: bool = True) -> PurePosixPath:
    """The relative path of an archive member (``archive``: a backslash separates folders,
    as some Windows archivers write it) or of a file found in a folder (a backslash is
    refused), checked to stay inside its student's folder; :class:`Refused` otherwise."""
    if not isinstance(name, str) or not name.strip("/\\"):
        raise Refused(f"an empty file name '{shown(name)}'")
    if not archive and "\\" in name:
        raise Refused(f"'{shown(name)}' has a backslash in a name")
    posix = name.replace("\\", "/")
    if posix.startswith("/") or re.match(r"^[A-Za-z]:", posix):
        raise Refused(f"'{shown(name)}' is an absolute path")
    parts = [p for p in posix.split("/") if p not in ("", ".")]
    for part in parts:
        if part == "..":
            raise Refused(f"'{shown(name)}' climbs out of its folder (..)")
        if any(invisible(ch) for ch in part):
            raise Refused(f"'{shown(name)}' has control or invisible characters in its name")
        if len(part.encode("utf-8", "surrogatepass")) > limits.name_bytes:
            raise Refused(f"'{shown(name, 80)}' has a name of {len(part.encode('utf-8', 'surrogatepass'))} bytes, "
                          f"over {limits.name_bytes}")
    if not parts:
        raise Refused(f"an empty file name '{shown(name)}'")
    if len(parts) > MAX_DEPTH:
        raise Refused(f"'{shown(name, 80)}' is nested {len(parts)} folders deep, over {MAX_DEPTH}")
    return PurePosixPath(*parts)


# ---------------------------------------------------------------------------
# Archives
# ---------------------------------------------------------------------------

@dataclass
class ZipMember:
    name: str  # as written in the archive (checked: see member_path)
    path: PurePosixPath
    size: int
    date_time: tuple[int, ...]  # as the archive records it (no time zone)
    _zip: zipfile.ZipFile
    _info: zipfile.ZipInfo

    def read(self, budget: int) -> bytes:
        """The member's bytes; :class:`Refused` past ``budget`` bytes (whatever the
        archive declared)."""
        with self._zip.open(self._info) as f:
            return read_bounded(f, budget, f"'{shown(self.name)}'")


def read_bounded(f: IO[bytes], budget: int, what: str) -> bytes:
    """Read ``f`` to its end, refusing to hold more than ``budget`` bytes."""
    chunks, total = [], 0
    while True:
        chunk = f.read(min(1 << 20, budget + 1 - total))
        if not chunk:
            return b"".join(chunks)
        total += len(chunk)
        if total > budget:
            raise Refused(f"{what} unpacks to more than {budget / MB:.0f} MB")
        chunks.append(chunk)


def read_zip(zf: zipfile.ZipFile, where: str, limits: IntakeLimits = IntakeLimits(),
             budget: int | None = None) -> Iterator[ZipMember]:
    """The file members of ``zf`` (``where`` names it in messages), each checked before
    it is unpacked: a safe relative path, a regular file (no link, device or pipe), not
    encrypted, within the member count, the unpacked ``budget`` (default: the student's
    whole allowance) and the compression ratio. Directories are skipped. Raises
    :class:`Refused` at the first member that breaks a rule."""
    budget = limits.unpacked_bytes if budget is None else budget
    infos = zf.infolist()
    if len(infos) > limits.files:
        raise Refused(f"{where} holds {len(infos)} members, over the limit of {limits.files}")
    seen: set[str] = set()
    declared = 0
    members = []
    for info in infos:
        mode = info.external_attr >> 16
        path = member_path(info.filename.rstrip("/") if info.is_dir() else info.filename, limits)
        if info.is_dir() or (mode and stat.S_ISDIR(mode)):
            continue
        if mode and stat.S_IFMT(mode) and not stat.S_ISREG(mode):
            kind = "a symbolic link" if stat.S_ISLNK(mode) else "not a regular file (a device, pipe or socket)"
            raise Refused(f"{where}: '{shown(info.filename)}' is {kind}")
        if info.flag_bits & 0x1:
            raise Refused(f"{where}: '{shown(info.filename)}' is encrypted")
        key = same_student_key(str(path))
        if key in seen:
            raise Refused(f"{where}: '{shown(info.filename)}' appears twice")
        seen.add(key)
        declared += info.file_size
        if declared > budget:
            raise Refused(f"{where} unpacks to more than {budget / MB:.0f} MB")
        if info.file_size > MB and info.file_size > limits.compression_ratio * max(info.compress_size, 1):
            raise Refused(f"{where}: '{shown(info.filename)}' is compressed {info.file_size / max(info.compress_size, 1):.0f}"
                          f" to 1, over the limit of {limits.compression_ratio:g} to 1 (an archive bomb?)")
        members.append(ZipMember(info.filename, path, info.file_size, info.date_time, zf, info))
    yield from members


# ---------------------------------------------------------------------------
# Notebooks
# ---------------------------------------------------------------------------

_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)


def scan_json(data: bytes, limits: IntakeLimits = IntakeLimits()) -> dict[str, int]:
    """Measure a JSON document on its bytes, before parsing it: its nesting depth, its
    number of values (lists, objects and the items of lists and objects) and of cells;
    :class:`Refused` over a limit. Strings are taken out first (a bracket inside a
    string counts for nothing); cost: linear, about 0.05 s a MB."""
    skeleton = _JSON_STRING.sub(b'""', data)
    b = np.frombuffer(skeleton, dtype=np.uint8)
    opens = (b == ord("[")) | (b == ord("{"))
    steps = opens.astype(np.int32) - ((b == ord("]")) | (b == ord("}"))).astype(np.int32)
    depth = int(np.cumsum(steps).max()) if len(steps) else 0
    values = int(opens.sum()) + int((b == ord(",")).sum())
    cells = data.count(b'"cell_type"')
    if depth > limits.json_depth:
        raise Refused(f"its JSON is nested {depth} levels deep, over the limit of {limits.json_depth} "
                      "(a notebook nests about ten)")
    if values > limits.json_values:
        raise Refused(f"its JSON holds {values:,} values, over the limit of {limits.json_values:,}")
    if cells > limits.cells:
        raise Refused(f"it has {cells:,} cells, over the limit of {limits.cells:,}")
    return {"depth": depth, "values": values, "cells": cells}


def read_notebook(data: bytes, name: str, limits: IntakeLimits = IntakeLimits()) -> tuple[Any, int]:
    """A submitted notebook's bytes as a :class:`nbformat.NotebookNode` (nbformat 4) and the
    nbformat version it was written in. :class:`Refused` when it is over a limit (size,
    depth, values, cells: checked before parsing); ``ValueError`` when it is not valid
    JSON; ``TypeError`` when it is JSON but no notebook nbformat can read."""
    import json

    import nbformat

    if len(data) > limits.notebook_bytes:
        raise Refused(f"{shown(name)} is {len(data) / MB:.1f} MB, over the limit of {limits.notebook_mb:g} MB "
                      "for a notebook")
    scan_json(data, limits)
    text = data.decode("utf-8", errors="replace")
    try:
        raw = json.loads(text)
    except RecursionError:
        raise ValueError(f"nested more than {limits.json_depth} levels deep") from None
    raw = scrub(raw)  # lone surrogates ("\\ud800") cannot be written back as UTF-8
    version = raw.get("nbformat") if isinstance(raw, dict) else None
    if not isinstance(version, int) or isinstance(version, bool):
        raise TypeError("it is JSON but not a Jupyter notebook (no nbformat version)")
    try:
        from nbformat.reader import get_version
        major, minor = get_version(raw)
        if major not in nbformat.versions:
            raise ValueError(f"unknown nbformat version {major}")
        nb = nbformat.versions[major].to_notebook_json(raw, minor=minor)  # as nbformat.reads does
        if major < 4:
            nb = nbformat.convert(nb, 4)
        for index, cell in enumerate(nb.cells):  # older notebooks have no cell ids
            if not isinstance(cell.get("id"), str) or not cell.get("id"):
                cell["id"] = f"cell-{index}"
        nb.nbformat_minor = max(nb.get("nbformat_minor", 0) if isinstance(nb.get("nbformat_minor"), int) else 0, 5)
        nbformat.validate(nb)
    except Exception as exc:  # nbformat raises many kinds on damaged input
        raise TypeError(f"not a readable notebook: {type(exc).__name__}: {shown(str(exc), 300)}") from None
    return nb, version


# ---------------------------------------------------------------------------
# Times
# ---------------------------------------------------------------------------

_TIME = re.compile(r"(\d{4})-(\d\d)-(\d\d)[ T_-](\d\d)[:-](\d\d)(?:[:-](\d\d)(?:\.(\d{1,6}))?)?"
                   r"\s*(Z|UTC|GMT|[+-]\d\d:?\d\d|[A-Za-z][A-Za-z_+-]*(?:/[A-Za-z][A-Za-z0-9_+-]*){0,2})?")


def time_zone(text: str | None, default: dt.tzinfo | None = None) -> dt.tzinfo | None:
    """The zone ``text`` names (``Z``, ``UTC``, ``+01:00``, ``Europe/Berlin``), ``default`` (UTC if
    none) for no text, or ``None`` when it names no zone (never a file opened)."""
    if not text:
        return default or dt.timezone.utc
    if text in ("Z", "UTC", "GMT"):
        return dt.timezone.utc
    m = re.fullmatch(r"([+-])(\d\d):?(\d\d)", text)
    if m:
        offset = dt.timedelta(hours=int(m.group(2)), minutes=int(m.group(3)))
        return dt.timezone(offset if m.group(1) == "+" else -offset)
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError
    try:
        return ZoneInfo(text)  # a key only: zoneinfo refuses paths
    except (ZoneInfoNotFoundError, ValueError, OSError):
        return None


def parse_time(text: str | bytes, default_zone: dt.tzinfo | None = None) -> dt.datetime | None:
    """A date and time a student or an LMS wrote, in UTC (naive, as nbgrader stores it), or
    ``None`` when it cannot be read (never an exception, never a file opened): ``2026-11-21
    09:00:00.000000 UTC`` (nbgrader's timestamp.txt), ``2026-11-21T09:00:00+01:00``,
    ``2026-11-21 09:00 Europe/Berlin``, ``2026-11-21-09-00-00`` (Blackboard). A time without
    a zone is in ``default_zone`` (UTC if none)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    text = str(text).strip()
    m = _TIME.fullmatch(text) if len(text) <= 64 else None
    if m is None:
        return None
    zone = time_zone(m.group(8), default_zone)
    if zone is None:
        return None
    y, mo, d, h, mi, s = (int(g) if g else 0 for g in m.groups()[:6])
    micro = int((m.group(7) or "0").ljust(6, "0"))
    try:
        when = dt.datetime(y, mo, d, h, mi, s, micro, tzinfo=zone)
        return when.astimezone(dt.timezone.utc).replace(tzinfo=None)
    except (ValueError, OverflowError):
        return None
