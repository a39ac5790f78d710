"""``workbook similarity ASSIGNMENT``: which answers of a class look copied, per graded item,
offline.

For every graded item of the assignment (each solution cell's nbgrader ``grade_id``: a code
item, or a written answer), each student's answer is compared with every other student's
and, for a code item, with course_lib's reference of it (``get_spec(item).reference``,
its source: students have course_lib, so copying it is the first case to catch). What the
released notebook already holds (the stub, the code and text around it) and what a large
part of the class wrote alike count for nothing; the engine and its rules are in
:mod:`autograder.reports.similarity_index`, the normalisation (names, literals, comments,
the order of independent statements) in :mod:`autograder.reports.similarity_tokens`, the
CSV, the HTML page, the terminal summary and the command itself in
:mod:`autograder.reports.similarity_report`.

Submissions are read as ``autograde`` reads them, through the intake door
(:func:`autograder.pipeline.prepare.read_submission`); a student rejected at collect, or
whose notebook breaks an intake limit, is left out and named.
"""

from __future__ import annotations

import inspect
import os
import re
import textwrap
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..course import Course, CourseError, read_json
from ..course.settings import intake_limits
from ..inside.cells import item_of, nbgrader_meta
from ..pipeline.prepare import read_submission
from .similarity_index import (CODE, REFERENCE, TEXT, Fingerprints, ItemIndex, Pair, Settings, class_frequency, clusters,
                               fingerprints, kgram_hashes)
from .similarity_tokens import Tokens, code_tokens, text_tokens

__all__ = ["Item", "ItemResult", "ClassAnswers", "read_class", "reference_source", "compare_item", "compare_class",
           "frequencies", "DEFAULT_THRESHOLD"]

DEFAULT_THRESHOLD = 0.5


@dataclass
class Item:
    """One graded item and the class's answers to it."""

    name: str
    notebook: str
    kind: str  # "code" or "text" (a written answer)
    template: np.ndarray  # every k-gram of the released notebook's cells of this kind (sorted)
    canonical: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.uint64))  # the solution's k-grams
    answers: dict[str, str] = field(default_factory=dict)  # student -> the answer cell's source
    prints: dict[str, Fingerprints] = field(default_factory=dict)  # student -> its fingerprints, once taken
    reference: str | None = None  # course_lib's reference (source), code items only

    @property
    def settings(self) -> Settings:
        return CODE if self.kind == "code" else TEXT

    def tokens(self, source: str) -> Tokens:
        return code_tokens(source) if self.kind == "code" else text_tokens(source)

    def fingerprints(self, source: str) -> Fingerprints:
        """The fingerprints of an answer, less every k-gram of the released notebook."""
        return fingerprints(self.tokens(source).words, self.settings, self.template)


@dataclass
class ClassAnswers:
    assignment: str
    items: list[Item]
    students: list[str]  # every student read
    unread: dict[str, str]  # student -> why their work was left out
    refused: list[str] = field(default_factory=list)  # submission folders whose name is no student id (why)


@dataclass
class ItemResult:
    """The pairs of one item at or above the listing floor (flagged ones judged), its
    clusters, and what the HTML page shows of the flagged ones."""

    item: str
    notebook: str
    kind: str
    answered: int  # students whose answer holds anything beyond the released notebook
    pairs: list[Pair]
    clusters: list[list[str]]
    shown: dict[str, Tokens] = field(default_factory=dict)  # the answers of flagged pairs (and the reference)
    marks: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # shared tokens


def reference_source(item: str) -> str | None:
    """course_lib's reference of ``item`` as source (a class's whole source for a module
    item), followed by the source of every function and class of its own module that it
    uses, and those use (a reference that hands its work to a helper is copied with the
    helper); None when there is none."""
    import ast
    import sys

    from course_lib.grading.judge.registry import all_specs
    spec = all_specs().get(item)
    if spec is None:
        return None
    module = sys.modules.get(getattr(spec.reference, "__module__", ""), None)
    parts, seen, todo = [], set(), [spec.reference]
    while todo and len(parts) < 20:
        obj = todo.pop(0)
        try:
            source = textwrap.dedent(inspect.getsource(obj))
        except (OSError, TypeError):
            if not parts:
                return None
            continue
        parts.append(source)
        seen.add(id(obj))
        try:
            names = {n.id for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Name)}
        except SyntaxError:
            continue
        for name in sorted(names):
            used = getattr(module, name, None)
            if (inspect.isfunction(used) or inspect.isclass(used)) and id(used) not in seen \
                    and getattr(used, "__module__", None) == getattr(module, "__name__", "") and used not in todo:
                todo.append(used)
    return "\n\n".join(parts)


def _released_items(course: Course, assignment: str) -> list[Item]:
    """The graded items of the released notebooks, each with its notebook's cells as template."""
    import nbformat
    items = []
    for notebook, path in course.released_notebooks(assignment).items():
        nb = nbformat.read(str(path), as_version=4)
        code = [c.source for c in nb.cells if c.cell_type == "code"]
        text = [c.source for c in nb.cells if c.cell_type == "markdown"]
        templates: dict[str, np.ndarray] = {}
        for cell in nb.cells:
            meta = nbgrader_meta(cell)
            gid = meta.get("grade_id")
            if not meta.get("solution") or not isinstance(gid, str) or cell.cell_type not in ("code", "markdown"):
                continue
            kind = "code" if cell.cell_type == "code" else "text"
            if kind not in templates:
                settings, tokens = (CODE, code_tokens) if kind == "code" else (TEXT, text_tokens)
                templates[kind] = np.unique(np.concatenate(
                    [kgram_hashes(tokens(t).words, settings.k) for t in (code if kind == "code" else text)]
                    + [np.empty(0, dtype=np.uint64)]))
            items.append(Item(gid, notebook, kind, templates[kind],
                              reference=reference_source(gid) if kind == "code" else None,
                              canonical=_solution_kgrams(course, assignment, notebook, gid) if kind == "code"
                              else np.empty(0, dtype=np.uint64)))
    return items


def _solution_kgrams(course: Course, assignment: str, notebook: str, gid: str) -> np.ndarray:
    """The k-grams of the item's cell in the course's solution notebook (the instructor's own
    answer), empty where there is none."""
    import nbformat
    path = course.source_dir / assignment / f"{notebook}.ipynb"
    if not path.is_file():
        return np.empty(0, dtype=np.uint64)
    nb = nbformat.read(str(path), as_version=4)
    sources = [c.source for c in nb.cells if c.cell_type == "code" and nbgrader_meta(c).get("grade_id") == gid]
    return np.unique(np.concatenate([kgram_hashes(code_tokens(s).words, CODE.k) for s in sources]
                                    + [np.empty(0, dtype=np.uint64)]))


def _read_students(course: Course, assignment: str, items: list[Item], students: list[str]) \
        -> tuple[dict[tuple[str, str], dict[str, tuple[str, Fingerprints]]], list[str], dict[str, str]]:
    """``students``' answers (source and fingerprints) by item, the students read, and why
    the others were not."""
    by_cell = {(i.notebook, i.name): i for i in items}
    limits = intake_limits(course)
    rejected = (read_json(course.collect_log_path(assignment), {}) or {}).get("rejected", {})
    found: dict[tuple[str, str], dict[str, tuple[str, Fingerprints]]] = {}
    read, unread = [], {}
    for student in students:
        if student in rejected:
            unread[student] = "rejected at collect"
            continue
        why, mine = [], {}
        for notebook in sorted({i.notebook for i in items}):
            nb, problems = read_submission(course.submission_dir(student, assignment) / f"{notebook}.ipynb", limits)
            if nb is None:
                why += [p["message"] for p in problems]
                continue
            mine.update(_answers(nb, notebook, by_cell))
        if why:
            unread[student] = "; ".join(why)
            continue
        read.append(student)
        for key, source in mine.items():
            found.setdefault(key, {})[student] = (source, by_cell[key].fingerprints(source))
    return found, read, unread


def _answers(nb, notebook: str, by_cell: dict) -> dict[tuple[str, str], str]:
    """Each item's answer as grading runs it: for a code item, the code that ran before its test
    cell since the previous one (its solution cells and any cell the student added: a copy pasted
    below the answer cell counts, a decoy after the test cell does not); for a written one, its
    answer cell (the last, as nbgrader keeps it)."""
    out: dict[tuple[str, str], str] = {}
    segment: list[tuple[str | None, str]] = []  # (item, source) of the code cells since the last test cell
    for cell, meta in zip(nb.cells, _kept_metadata(nb.cells)):
        source = cell.source if isinstance(cell.source, str) else ""
        item = by_cell.get((notebook, meta.get("grade_id")))
        if item is not None and meta.get("solution"):
            if item.kind != "code" and cell.cell_type == "markdown":
                out[(notebook, item.name)] = source
            elif item.kind == "code" and cell.cell_type == "code":
                segment.append((item.name, source))
        elif cell.cell_type == "code" and not meta:
            segment.append((None, source))
        elif cell.cell_type == "code" and meta.get("grade") and not meta.get("solution"):  # a test cell
            tested = item_of(str(meta.get("grade_id", "")))
            code = [s for name, s in segment if name in (tested, None)]
            if (notebook, tested) in by_cell and code:
                out[(notebook, tested)] = _in_effect(tested, code)
            segment = []
    return out


def _kept_metadata(cells: list) -> list[dict]:
    """Each cell's nbgrader metadata as grading keeps it: of the cells that share a grade_id, only
    the last keeps it (nbgrader's DeduplicateIds); the others are ordinary cells, and run as such."""
    last = {}
    for index, cell in enumerate(cells):
        meta = nbgrader_meta(cell)
        if meta.get("grade_id") and (meta.get("grade") or meta.get("solution") or meta.get("locked")):
            last[meta["grade_id"]] = index
    kept = []
    for index, cell in enumerate(cells):
        meta = nbgrader_meta(cell)
        kept.append(meta if last.get(meta.get("grade_id"), index) == index else {})
    return kept


def _in_effect(name: str, sources: list[str]) -> str:
    """The code of ``name`` in effect when its test cell runs: from the last of ``sources`` (in
    the order they run) that defines it to the end (the helpers added after it count too), after
    the earlier cells that define the helpers it calls."""
    defines = re.compile(rf"^[ \t]*(?:(?:async[ \t]+)?def|class)[ \t]+{re.escape(name)}\b|^{re.escape(name)}[ \t]*=",
                         re.M)
    last = max((k for k, s in enumerate(sources) if defines.search(s)), default=0)
    code = "\n".join(sources[last:])
    return _unwrapped("\n".join(_helpers_called(code, sources[:last], defines) + [code]))


_DEFINED = re.compile(r"^(?:async[ \t]+)?def[ \t]+(\w+)", re.M)


def _helpers_called(code: str, earlier: list[str], defines: re.Pattern) -> list[str]:
    """The cells of ``earlier`` (in order) that define a function ``code`` calls, and not the item
    itself (an earlier draft of the answer is not in effect): helpers the answer runs with."""
    called = set(re.findall(r"(?<![\w.])(\w+)[ \t]*\(", code))
    return [s for s in earlier if not defines.search(s) and called & set(_DEFINED.findall(s))]


_RUNS_A_STRING = {"exec", "eval", "compile"}


def _unwrapped(source: str) -> str:
    """``source`` with the code it hands to ``exec``, ``eval`` or ``compile`` as a string written
    out after it, marked (the page shows it): an answer hidden in a string reads as the code."""
    import ast
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return source
    hidden = [(node.func.id, node.args[0].value) for node in ast.walk(tree)
              if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _RUNS_A_STRING
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and len(node.args[0].value.strip()) >= 40]
    return source + "".join(f"\n# the string this answer passes to {name}(), read as code:\n{text}"
                            for name, text in hidden)


def _read_share(args: tuple[Path, str, list[Item], list[str]]):
    root, assignment, items, students = args
    return _read_students(Course(root), assignment, items, students)


def default_jobs() -> int:
    """One process per core this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def read_class(course: Course, assignment: str, students: list[str] | None = None,
               jobs: int | None = None) -> ClassAnswers:
    """Every collected submission of ``assignment`` read through the intake door, each graded
    item's answer taken as grading runs it (:func:`_answers`) and fingerprinted; ``jobs`` processes
    (default: one per core, and one per 50 students at most) read a share of the students each."""
    import multiprocessing
    items = _released_items(course, assignment)
    if not items:
        raise CourseError(f"{assignment} has no released notebook with graded cells in {course.release_dir}")
    students = list(students or course.submitted_students(assignment))
    jobs = min(jobs or min(default_jobs(), len(students) // 50), len(students))  # a process is worth 50 students
    if jobs <= 1:
        parts = [_read_students(course, assignment, items, students)]
    else:
        fork = "fork" in multiprocessing.get_all_start_methods()  # (then nothing is imported again)
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork" if fork else None)) as pool:
            parts = list(pool.map(_read_share, [(course.root, assignment, items, students[i::jobs])
                                                for i in range(jobs)]))
    read, unread = [], {}
    by_cell = {(i.notebook, i.name): i for i in items}
    for found, some_read, some_unread in parts:
        read += some_read
        unread.update(some_unread)
        for key, answers in found.items():
            for student, (source, prints) in answers.items():
                by_cell[key].answers[student] = source
                by_cell[key].prints[student] = prints
    return ClassAnswers(assignment, items, sorted(read), unread, course.refused_folders(assignment))


def compare_item(item: Item, threshold: float, frequency: tuple[np.ndarray, np.ndarray] | None = None) -> ItemResult:
    """One item's pairs: every two answers (and each answer with the reference) at least
    half the threshold similar, judged against the threshold, with its clusters;
    ``frequency``: how many students wrote each fingerprint in any item (:func:`frequencies`)."""
    students, prints = [], []
    for student, source in sorted(item.answers.items()):
        fp = item.prints.get(student) or item.fingerprints(source)
        if len(fp.hashes):
            students.append(student)
            prints.append(fp)
    tokens: dict[str, Tokens] = {}  # of the answers judged (tokenized again: only those)

    def words(who: str) -> list[str]:
        if who not in tokens:
            tokens[who] = item.tokens(item.reference if who == REFERENCE else item.answers[who])
        return tokens[who].words
    reference = item.fingerprints(item.reference) if item.reference is not None else None
    index = ItemIndex(students, prints, words, item.settings, reference, item.template, frequency, item.canonical)
    floor = threshold / 2
    pairs = [index.judge(p, threshold) for p in index.similar_pairs(floor) + index.reference_pairs(floor)]
    pairs.sort(key=lambda p: (-p.similarity, p.a, p.b))
    result = ItemResult(item.name, item.notebook, item.kind, len(students), pairs, clusters(pairs))
    for p in pairs:
        if p.flagged:
            result.marks[(p.a, p.b)] = index.covered(p.a, p.b)
            result.shown.update({who: tokens[who] for who in (p.a, p.b)})
    return result


def frequencies(items: list[Item]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """For each kind of item (code, text): how many students wrote each fingerprint in any item."""
    out = {}
    for kind in {i.kind for i in items}:
        by_student: dict[str, list[np.ndarray]] = {}
        for item in items:
            if item.kind == kind:
                for student, source in item.answers.items():
                    prints = item.prints.get(student) or item.fingerprints(source)
                    item.prints[student] = prints
                    by_student.setdefault(student, []).append(prints.hashes)
        out[kind] = class_frequency(list(by_student.values()))
    return out


def compare_class(answers: ClassAnswers, threshold: float = DEFAULT_THRESHOLD) -> list[ItemResult]:
    """Every item of the class compared (the fingerprints are taken: what is left is cheap),
    what the class wrote alike in any item of the same kind counting for as little as it does
    in its own."""
    common = frequencies(answers.items)
    return [compare_item(item, threshold, common[item.kind]) for item in answers.items]
