"""Build a course folder and a generated class of submissions for autograder tests.

The class is made from a released notebook and its solution notebook: correct,
partial, mistaken, broken and malicious submissions, each with the score it must
get: the test cells' points, or, where a cell is broken, stubbed or mistaken,
``course_lib.grading.grade`` run here in-process on the solution cells that would
have run (no kernel, no nbgrader).
"""

from __future__ import annotations

import copy
import shutil
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parents[1]


def make_course(root: Path, notebook: str = "03_self_attention") -> tuple[Path, str]:
    """A course folder at ``root`` holding the repository's nbgrader configuration and
    the source of ``notebook`` (from ``solutions/``); returns (root, assignment)."""
    root.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(REPO / "nbgrader_config.py", root / "nbgrader_config.py")
    (root / "grading").mkdir(exist_ok=True)
    shutil.copytree(REPO / "solutions" / notebook, root / "solutions" / notebook,
                    ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    return root, notebook


# ---------------------------------------------------------------------------
# The generated class
# ---------------------------------------------------------------------------

def _gid(cell) -> str:
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id", "")


def _strip_solution(source: str) -> str:
    return "\n".join(line for line in source.splitlines()
                     if "### BEGIN SOLUTION" not in line and "### END SOLUTION" not in line)


@dataclass
class Student:
    id: str
    kind: str
    notebook: object  # NotebookNode, or bytes for a damaged file
    expected: dict[str, float]  # test grade_id -> expected points
    problems: set[str] = field(default_factory=set)  # problem kinds that must be reported
    file_name: str = ""
    zip_member: str = ""  # put the notebook in a per-student zip under this name
    nbformat3: bool = False


# A catalogued mistake made from an item's solution: (text, its replacement, the mistake's
# name in the item's catalogue).
MISTAKE_EDITS = {
    "scaled_dot_product_attention": ("torch.softmax(scores, dim=-1)", "torch.softmax(scores, dim=-2)",
                                     "softmax over the query axis"),
    "causal_mask": (".tril()", ".triu()", "upper triangle"),
}


class ClassBuilder:
    """Makes submissions from the released and the source notebook of one assignment."""

    def __init__(self, released: Path, source: Path) -> None:
        self.name = released.stem
        self.released = nbformat.read(str(released), as_version=4)
        src = nbformat.read(str(source), as_version=4)
        self.solutions = {_gid(c): _strip_solution(c.source) for c in src.cells
                          if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("solution")}
        self.tests = {}  # test grade_id -> (item, points)
        for c in self.released.cells:
            meta = c.metadata.get("nbgrader", {})
            if c.cell_type == "code" and meta.get("grade") and not meta.get("solution"):
                item = _gid(c).removeprefix("test_")
                self.tests[_gid(c)] = (item, float(meta["points"]))
        self.items = [item for item, _ in self.tests.values() if item in self.solutions]
        if len(self.items) < 2:
            raise ValueError(f"{released} needs at least two graded items with test_<item> cells")

    def filled(self, skip: tuple[str, ...] = (), replace: dict[str, str] | None = None,
               prepend: dict[str, str] | None = None) -> nbformat.NotebookNode:
        """The released notebook with solution cells filled in (except ``skip``)."""
        nb = copy.deepcopy(self.released)
        for cell in nb.cells:
            gid = _gid(cell)
            if cell.cell_type == "code" and gid in self.solutions and gid not in skip:
                cell.source = (replace or {}).get(gid, self.solutions[gid])
                if prepend and gid in prepend:
                    cell.source = prepend[gid] + "\n" + cell.source
            elif cell.cell_type == "markdown" and cell.metadata.get("nbgrader", {}).get("solution"):
                cell.source = "Because True means the query may attend to the key."
        return nb

    def full(self, except_items: tuple[str, ...] = ()) -> dict[str, float]:
        return {t: (0.0 if item in except_items else pts) for t, (item, pts) in self.tests.items()}

    def expected_in_process(self, nb, skip: tuple[str, ...] = (), dead_at: str | None = None) -> dict[str, float]:
        """Each test's points from ``course_lib.grading.grade`` run in this process on the
        notebook's set-up and solution cells (no kernel, no nbgrader), so that a later
        item built on a mistaken or missing earlier one loses its points too.

        ``skip``: solution cells that never finish in the kernel (their names stay
        undefined); ``dead_at``: the solution cell where the kernel dies (every test
        after it scores 0).
        """
        from course_lib.grading import get_spec, grade
        namespace: dict = {}
        order = [_gid(c) for c in nb.cells]
        setup = next(c for c in nb.cells if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("locked"))
        code = [setup.source] + [c.source for c in nb.cells if c.cell_type == "code"
                                 and c.metadata.get("nbgrader", {}).get("solution")
                                 and _gid(c) not in skip and _gid(c) != dead_at]
        for source in code:
            exec(compile(source, "<submission>", "exec"), namespace)  # our own test code
        expected = {}
        for test, (item, _) in self.tests.items():
            dead = dead_at is not None and order.index(test) > order.index(dead_at)
            if dead or item not in namespace:
                expected[test] = 0.0
            else:
                expected[test] = float(round(grade(get_spec(item), namespace[item], hidden=True).score, 4))
        return expected

    def mistake_student(self, sid: str) -> Student:
        """A catalogued mistake (:data:`MISTAKE_EDITS`) in the first item that has one, made
        from the solution; checked here to be named by the grader as that mistake; expected
        score from the check framework run in this process."""
        import math

        import torch
        from course_lib.grading import get_spec, grade
        for item in self.items:
            if item not in MISTAKE_EDITS:
                continue
            old, new, mistake = MISTAKE_EDITS[item]
            if old not in self.solutions[item]:
                raise ValueError(f"{old!r} is not in the solution of {item}")
            source = self.solutions[item].replace(old, new)
            namespace = {"math": math, "torch": torch}
            exec(compile(source, f"<{sid}: {item}>", "exec"), namespace)
            result = grade(get_spec(item), namespace[item], hidden=True, device="cpu")
            named = [r.mistake for r in result.results if getattr(r, "mistake", None)]
            if mistake not in named:
                raise ValueError(f"the grader does not name {item}'s edited solution {mistake!r} (it names {named})")
            nb = self.filled(replace={item: source})
            return Student(sid, "mistake", nb, self.expected_in_process(nb),
                           problems=set(), file_name=f"{sid}_{self.name}.ipynb")
        raise ValueError(f"none of {self.items} has an entry in MISTAKE_EDITS")

    def build(self) -> list[Student]:
        first, second = self.items[0], self.items[1]
        students: list[Student] = []

        def add(sid, kind, nb, expected, problems=(), **kw):
            kw.setdefault("file_name", f"{sid}_{self.name}.ipynb")
            students.append(Student(sid, kind, nb, expected, set(problems), **kw))

        setup_probe = ('import os\nfrom course_lib.device import grading_mode\n'
                       'print("working directory:", os.getcwd())\nprint("grading mode:", grading_mode())')
        add("s01", "correct", self.filled(prepend={first: setup_probe}), self.full())
        add("s02", "older nbformat, renamed", self.filled(), self.full(), {"old_format", "renamed"},
            nbformat3=True, file_name="s02_my homework (1).ipynb")
        nb = self.filled(skip=tuple(self.items[1:]))
        add("s03", "partial (zip)", nb, self.expected_in_process(nb),
            zip_member=f"{self.name}/{self.name}.ipynb", file_name=f"s03_{self.name}.zip")
        students.append(self.mistake_student("s04"))
        text = nbformat.writes(self.filled())
        add("s05", "invalid JSON", text[: len(text) // 2].encode(), self.full(tuple(self.items)),
            {"invalid_json"})
        nb = self.filled()
        nb.cells = [c for c in nb.cells if _gid(c) != f"test_{first}"]
        for c in nb.cells:
            if _gid(c) == f"test_{second}":
                c.source = "100.0  # full marks please"
        dup = next(i for i, c in enumerate(nb.cells) if _gid(c) == second)
        nb.cells.insert(dup, copy.deepcopy(nb.cells[dup]))
        nb.cells[dup].id = "duplicated-cell"
        add("s06", "deleted, edited and duplicated cells", nb, self.full(),
            {"deleted_cells", "edited_locked", "duplicate_cells"})
        deep = text.replace('"cells": [', '"deep": ' + "[" * 100_000 + "]" * 100_000 + ', "cells": [', 1)
        add("s13", "rejected: JSON nested 100,000 levels deep", deep.encode(), self.full(tuple(self.items)),
            {"rejected"})

        def hostile(sid, kind, prepend, problems, skip=(), dead_at=None):
            nb = self.filled(prepend=prepend)
            add(sid, kind, nb, self.expected_in_process(self.filled(), skip=skip, dead_at=dead_at), problems)

        hostile("s07", "infinite loop", {first: "while True:\n    pass"}, {"cell_timeout"}, skip=(first,))
        hostile("s08", "memory exhaustion", {first: "hog = bytearray(4 * 2**30)"}, {"error:MemoryError"},
                skip=(first,))
        hostile("s09", "os._exit", {second: "import os\nos._exit(3)"}, {"kernel_died"}, dead_at=second)
        hostile("s10", "sys.exit(), missing import",
                {first: "import sys\nsys.exit()", second: "import package_that_does_not_exist"},
                {"error:SystemExit", "error:ModuleNotFoundError"}, skip=(first, second))
        flood = ("import sys\nfrom IPython.display import display\nprint('x' * 10_000_000)\n"
                 "for i in range(100_000):\n    print(i)\nfor i in range(50_000):\n    sys.stderr.write(f'\\rstep {i}')\n"
                 "handle = display('0', display_id=True)\nfor i in range(2_000):\n    display(i)\n    handle.update(i)")
        hostile("s11", "an output flood: 10 MB at once, then prints, progress lines, displays and display updates "
                "as fast as it can", {first: flood}, {"output_truncated"})
        hostile("s12", "segfault", {second: "import ctypes\nctypes.string_at(0)"}, {"kernel_died"},
                dead_at=second)
        return students

    def write_lms_download(self, students: list[Student], path: Path) -> None:
        """A zip as an LMS gives it: one file per student, the id in the name, plus junk."""
        with zipfile.ZipFile(path, "w") as zf:
            for s in students:
                if isinstance(s.notebook, bytes):
                    data = s.notebook
                elif s.nbformat3:
                    data = nbformat.writes(nbformat.convert(s.notebook, 3), version=3).encode()
                else:
                    data = nbformat.writes(s.notebook).encode()
                if s.zip_member:
                    inner = Path(path).with_suffix(f".{s.id}.zip")
                    with zipfile.ZipFile(inner, "w") as z2:
                        z2.writestr(s.zip_member, data)
                        z2.writestr("__MACOSX/._" + Path(s.zip_member).name, b"junk")
                        z2.writestr("notes.txt", b"my notes")
                    zf.write(inner, s.file_name)
                    inner.unlink()
                else:
                    zf.writestr(s.file_name, data)
            zf.writestr("README.txt", b"downloaded from the LMS")
            zf.writestr("x99_" + self.name + ".ipynb", nbformat.writes(self.filled()).encode())


def write_roster(students: list[Student], path: Path) -> None:
    path.write_text("id\n" + "".join(f"{s.id}\n" for s in students), encoding="utf-8")
