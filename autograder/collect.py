"""Import submissions into ``grading/submitted/<student>/<assignment>/``.

Two sources are understood:

- an nbgrader-style folder ``<student>/<assignment>/<notebook>.ipynb`` (also with the
  assignment folder left out: ``<student>/<notebook>.ipynb``);
- an LMS download (a folder or a ``.zip``) with one file per student, a notebook or a
  zip of the student's files, the student id in the file name. With ``--roster`` the
  id is the name part that is on the roster, and only the roster's students are
  imported; without it the gradebook's students are looked for the same way, and a
  name with none of them (a new student) goes to ``--pattern`` (a regular expression
  with a ``student`` group, default: the name up to the first ``_``).

A notebook that is not valid JSON (truncated, damaged) is imported with a note saying
so: it scores 0 unless a readable copy is collected.

A notebook whose name is not the assignment's is identified by its graded cells
(a renamed copy such as ``attention (1).ipynb``) and the renaming is recorded for
the grade report. Every file of the source is accounted for: imported, ignored
(with the reason printed) or an error that names the file; errors never stop the
other students from being imported.
"""

from __future__ import annotations

import io
import re
import shutil
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Iterator

from . import untrusted
from .problems import problem
from .course import Course, CourseError, read_json, write_json_atomic

__all__ = ["collect", "CollectResult", "DEFAULT_PATTERN"]

DEFAULT_PATTERN = r"^(?P<student>[^_\s]+)_"
_JUNK = ("__MACOSX/", ".ipynb_checkpoints/", ".DS_Store", "Thumbs.db")


@dataclass
class CollectResult:
    imported: dict[str, list[str]] = field(default_factory=dict)  # student -> notebooks
    errors: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    notes: dict[str, list[dict]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.errors


@dataclass
class _File:
    name: str  # path of the file inside the source, for messages
    data: bytes | None  # None: a symbolic link, not followed


def _is_junk(name: str) -> bool:
    return any(j in name or PurePosixPath(name).name == j.rstrip("/") for j in _JUNK) or \
        PurePosixPath(name).name.startswith("._")


def _walk_source(source: Path) -> Iterator[_File]:
    if source.is_file():
        if source.suffix.lower() != ".zip":
            raise CourseError(f"{source} is neither a folder nor a .zip file")
        try:
            with zipfile.ZipFile(source) as zf:
                for info in zf.infolist():
                    if not info.is_dir():
                        yield _File(info.filename, zf.read(info))
        except zipfile.BadZipFile as exc:
            raise CourseError(f"{source} is not a readable zip file: {exc}") from None
    elif source.is_dir():
        for path in sorted(source.rglob("*")):
            if path.is_symlink():  # never followed: it could point at anything on this machine
                yield _File(path.relative_to(source).as_posix(), None)
            elif path.is_file():
                yield _File(path.relative_to(source).as_posix(), path.read_bytes())
    else:
        raise CourseError(f"{source} does not exist")


def _expand(item: _File) -> tuple[list[_File], list[str]]:
    """The files of one student's item: a notebook itself, or the members of a zip."""
    if not item.name.lower().endswith(".zip"):
        return [item], []
    try:
        with zipfile.ZipFile(io.BytesIO(item.data)) as zf:
            files, ignored = [], []
            for info in zf.infolist():
                if info.is_dir():
                    continue
                name = f"{item.name}!{info.filename}"
                if _is_junk(info.filename):
                    ignored.append(f"{name}: system file")
                else:
                    files.append(_File(name, zf.read(info)))
            return files, ignored
    except zipfile.BadZipFile as exc:
        raise ValueError(f"{item.name}: not a readable zip file ({exc})") from None


def _grade_ids(data: bytes) -> set[str]:
    try:
        nb = untrusted.loads(data.decode("utf-8", errors="replace"))
    except ValueError:
        return set()
    ids = set()
    cells = nb.get("cells") if isinstance(nb, dict) else None
    if cells is None and isinstance(nb, dict):  # nbformat 3 keeps cells in worksheets
        cells = [c for ws in nb.get("worksheets", []) for c in ws.get("cells", [])]
    for cell in cells or []:
        meta = cell.get("metadata", {}).get("nbgrader", {}) if isinstance(cell, dict) else {}
        if isinstance(meta, dict) and meta.get("grade_id"):
            ids.add(meta["grade_id"])
    return ids


def _is_notebook_json(data: bytes) -> bool:
    try:
        nb = untrusted.loads(data.decode("utf-8"))
    except ValueError:  # (UnicodeDecodeError is one)
        return False
    return isinstance(nb, dict) and ("cells" in nb or "worksheets" in nb)


class _Matcher:
    """Finds the student and the notebook that a file belongs to."""

    def __init__(self, course: Course, assignment: str, roster: set[str], pattern: str | None,
                 strict: bool = True) -> None:
        self.assignment = assignment
        self.roster = roster
        self.strict = strict  # an explicit roster: only its students are imported
        self.pattern = re.compile(pattern or DEFAULT_PATTERN)
        if "student" not in self.pattern.groupindex:
            raise CourseError(f"--pattern {self.pattern.pattern!r} needs a (?P<student>...) group")
        released = course.released_notebooks(assignment)
        if not released:
            raise CourseError(f"no released notebooks for {assignment!r} in {course.release_dir}: "
                              "run `workbook release` first")
        self.notebooks = {name: _grade_ids(path.read_bytes()) for name, path in released.items()}

    def student(self, name: str) -> str:
        """The student id in a file name (raises ValueError with the reason)."""
        base = PurePosixPath(name).name
        if self.roster:
            tokens = set(re.split(r"[_\-\s.()\[\]/]+", str(PurePosixPath(name).with_suffix(""))))
            found = sorted(tokens & self.roster)
            if len(found) == 1:
                return found[0]
            if found:
                raise ValueError(f"{name}: the name matches several students ({', '.join(found)})")
            if self.strict:
                raise ValueError(f"{name}: unrecognised student id (no part of the name is on the roster)")
            # the gradebook's students are only a hint: a new student is found by the pattern
        m = self.pattern.search(base) or self.pattern.search(name)
        if not m or not m.group("student"):
            raise ValueError(f"{name}: unrecognised file name (no student id matches "
                             f"the pattern {self.pattern.pattern!r}; use --pattern or --roster)")
        return m.group("student")

    def notebook(self, name: str, data: bytes) -> tuple[str, str]:
        """(notebook name, note) for a submitted notebook file (raises ValueError)."""
        stem = PurePosixPath(name.split("!")[-1]).stem
        if stem in self.notebooks:
            return stem, ""
        ids = _grade_ids(data)
        by_content = [nb for nb, want in self.notebooks.items() if want and len(ids & want) >= max(1, len(want) // 2)]
        base = PurePosixPath(name.split("!")[-1]).name
        in_name = [nb for nb in self.notebooks if nb in base]
        if in_name:
            best = max(in_name, key=len)
            if not by_content or best in by_content:
                return best, ""
        if len(by_content) == 1:
            return by_content[0], (f"submitted as {base!r}; identified as {by_content[0]}.ipynb "
                                   "by its graded cells")
        expected = ", ".join(f"{nb}.ipynb" for nb in self.notebooks)
        raise ValueError(f"{name}: unrecognised notebook name (expected {expected}, and its cells do not "
                         "match any of them)")


def collect(course: Course, source: str | Path, assignment: str | None = None,
            roster: set[str] | None = None, pattern: str | None = None, dry_run: bool = False) -> CollectResult:
    """Import every submission in ``source`` (a folder or a zip) for ``assignment``."""
    source = Path(source)
    known = set(course.released_assignments())
    result = CollectResult()
    files = list(_walk_source(source))
    if not files:
        raise CourseError(f"{source} holds no files")

    # nbgrader layout: <student>/<assignment>/<file> (assignment folder optional)
    def layout_assignment(name: str) -> str | None:
        parts = PurePosixPath(name).parts
        return parts[1] if len(parts) >= 3 and parts[1] in known else None

    assignments = {layout_assignment(f.name) for f in files} - {None}
    if assignment is None:
        if len(assignments) == 1:
            assignment = assignments.pop()
        else:
            raise CourseError("say which assignment these submissions are for (--assignment); "
                              f"released: {', '.join(sorted(known)) or 'none'}")
    if assignment not in known:
        raise CourseError(f"unknown assignment {assignment!r}; released: {', '.join(sorted(known)) or 'none'}")
    strict = bool(roster)  # an explicit roster restricts; the gradebook's students only help find ids
    if roster is None:
        with course.gradebook() as gb:
            roster = {s.id for s in gb.students}
    matcher = _Matcher(course, assignment, roster, pattern, strict=strict)

    # student -> notebook -> (file name, data, note); other files per student
    chosen: dict[str, dict[str, tuple[str, bytes, str]]] = {}
    extras: dict[str, list[_File]] = {}
    clashes: set[tuple[str, str]] = set()
    for item in files:
        if item.data is None:
            result.ignored.append(f"{item.name}: a symbolic link (not followed)")
            continue
        if _is_junk(item.name):
            result.ignored.append(f"{item.name}: system file")
            continue
        parts = PurePosixPath(item.name).parts
        layout = layout_assignment(item.name)
        try:
            student_folder = len(parts) == 2 and (parts[0] in roster if strict else not pattern)
            if layout is not None or student_folder:  # <student>/[<assignment>/]<file>
                if layout is not None and layout != assignment:
                    result.ignored.append(f"{item.name}: belongs to assignment {layout}")
                    continue
                student = parts[0]
                if strict and student not in roster:
                    raise ValueError(f"{item.name}: unrecognised student id {student!r} (not on the roster)")
            else:
                student = matcher.student(item.name)
            members, skipped = _expand(item)
            result.ignored.extend(skipped)
            for member in members:
                if not member.name.lower().endswith(".ipynb"):
                    extras.setdefault(student, []).append(member)
                    continue
                notebook, note = matcher.notebook(member.name, member.data)
                if not _is_notebook_json(member.data):
                    note = (f"{member.name} (as {notebook}.ipynb) is not valid notebook JSON (truncated or "
                            "damaged?): it was imported and scores 0 unless a readable copy is collected")
                slot = chosen.setdefault(student, {})
                if notebook in slot:
                    clashes.add((student, notebook))
                    result.errors.append(f"{member.name}: student {student} already has {notebook}.ipynb in "
                                         f"{slot[notebook][0]}; neither was imported, keep one and collect again")
                    continue
                slot[notebook] = (member.name, member.data, note)
        except ValueError as exc:
            result.errors.append(str(exc))

    for student, slot in sorted(chosen.items()):
        for notebook in list(slot):
            if (student, notebook) in clashes:
                del slot[notebook]
        if not slot:
            continue
        dest = course.submission_dir(student, assignment)
        if not dry_run and dest.exists():
            shutil.rmtree(dest)  # a new collection replaces the student's earlier one
        notes = []
        for notebook, (name, data, note) in sorted(slot.items()):
            if note:
                kind = "invalid_notebook" if "not valid notebook JSON" in note else "renamed"
                notes.append(problem(kind, note))
            if not dry_run:
                dest.mkdir(parents=True, exist_ok=True)
                (dest / f"{notebook}.ipynb").write_bytes(data)
            result.imported.setdefault(student, []).append(notebook)
        for extra in extras.get(student, []):
            rel = PurePosixPath(extra.name.split("!")[-1])
            if rel.name == "timestamp.txt" or len(rel.parts) == 1 or "!" in extra.name:
                target = rel.name
            else:
                target = str(PurePosixPath(*rel.parts[2:])) if layout_assignment(extra.name) else rel.name
            if not dry_run:
                (dest / target).parent.mkdir(parents=True, exist_ok=True)
                (dest / target).write_bytes(extra.data)
        if notes:
            result.notes[student] = notes
    for student, items in extras.items():
        if student not in result.imported:
            for extra in items:
                result.errors.append(f"{extra.name}: not a notebook, and student {student} submitted no notebook")

    if not dry_run:
        log_path = course.collect_log_path(assignment)
        log = read_json(log_path, {"notes": {}})
        for student in result.imported:
            log["notes"][student] = result.notes.get(student, [])
        write_json_atomic(log_path, log)
    return result
