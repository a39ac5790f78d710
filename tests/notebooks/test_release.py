"""notebooks/ is generated from solutions/, carries no outputs or solutions, and every
graded cell agrees with its check spec."""

from __future__ import annotations

import json

import nbformat

import pytest

from autograder.course.release import assignments, out_of_date
from course_lib.grading import all_specs
from conftest import ROOT

ASSIGNMENTS = assignments()


def _cells(folder: str, assignment: str) -> list[dict]:
    return json.loads((ROOT / folder / assignment / f"{assignment}.ipynb").read_text())["cells"]


def _meta(c: dict) -> dict:
    return c.get("metadata", {}).get("nbgrader", {})


def test_there_are_assignments():
    assert "03_self_attention" in ASSIGNMENTS


@pytest.mark.slow
def test_notebooks_are_in_sync_with_solutions():
    problems = out_of_date()
    assert not problems, "notebooks/ is out of date (run `make release`):\n" + "\n".join(problems)


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_student_notebook_has_no_outputs_or_solutions(assignment):
    text = (ROOT / "notebooks" / assignment / f"{assignment}.ipynb").read_text()
    for marker in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "hidden=True"):
        assert marker not in text, f"{marker!r} leaked into notebooks/{assignment}"
    for c in _cells("notebooks", assignment):
        assert not c.get("outputs"), f"saved outputs in notebooks/{assignment}"


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_graded_cells_agree_with_specs(assignment):
    specs = all_specs()
    cells = _cells("solutions", assignment)
    ids = [_meta(c).get("grade_id") for c in cells if _meta(c)]
    assert len(ids) == len(set(ids)), "duplicate grade_id"
    for i, c in enumerate(cells):
        meta = _meta(c)
        if c["cell_type"] == "code" and meta.get("solution"):
            item = meta["grade_id"]
            assert item in specs, f"solution cell {item!r} has no check spec"
            nxt = cells[i + 1]
            assert _meta(nxt).get("grade_id") == f"test_{item}", f"{item} is not followed by test_{item}"
            assert _meta(nxt).get("locked") and _meta(nxt).get("grade")
            assert float(_meta(nxt)["points"]) == specs[item].points
            src = "".join(nxt["source"])
            assert f'check("{item}", {item})' in src and f'check("{item}", {item}, hidden=True)' in src
            assert src.index("### BEGIN HIDDEN TESTS") > src.index(f'check("{item}", {item})')
        if c["cell_type"] == "markdown" and meta.get("grade"):
            assert meta.get("solution") and meta.get("points", 0) > 0  # manually graded answer
            # nbgrader replaces the whole answer cell with "YOUR ANSWER HERE": the question
            # must stand in the markdown cell just above it
            question = cells[i - 1]
            assert question["cell_type"] == "markdown" and not _meta(question).get("solution"), \
                f"answer cell {meta['grade_id']} needs its question in the cell above"
            assert "?" in "".join(question["source"]), f"no question above {meta['grade_id']}"


CONTRACT_03 = {"scaled_dot_product_attention": "(q, k, v, mask=None)", "causal_mask": "(T, device=None)",
               "padding_mask": "(lengths, T)", "SelfAttention": "(d_model, d_k, d_v)"}


def test_notebook_03_keeps_the_curriculum_contract():
    sources = {_meta(c)["grade_id"]: "".join(c["source"]) for c in _cells("notebooks", "03_self_attention")
               if _meta(c).get("solution") and c["cell_type"] == "code"}
    assert set(sources) == set(CONTRACT_03)
    for name, signature in CONTRACT_03.items():
        if name == "SelfAttention":
            assert "def __init__(self, d_model, d_k, d_v)" in sources[name]
        else:
            assert f"def {name}{signature}" in sources[name]
        assert "raise NotImplementedError()" in sources[name]


READING = ("notice", "look for", "what to read", "**see it.**")


def _plots_left_unread(assignment: str) -> list[int]:
    """Code cells that draw a plot with no reading of it: neither the markdown before them
    says what to look for, nor a markdown cell follows before the next heading."""
    cells = nbformat.read(str(ROOT / "solutions" / assignment / f"{assignment}.ipynb"), as_version=4).cells
    unread = []
    for i, c in enumerate(cells):
        if c.cell_type != "code" or not any(s in c.source for s in ("plt.show()", ".plot(", "heatmap(")):
            continue
        before = next((cells[k].source.lower() for k in range(i - 1, -1, -1) if cells[k].cell_type == "markdown"), "")
        after = next((cells[k].source for k in range(i + 1, len(cells)) if cells[k].cell_type == "markdown"), "#")
        if not any(r in before for r in READING) and after.lstrip().startswith("#"):
            unread.append(i)
    return unread


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_every_plot_is_followed_by_what_to_read_in_it(assignment):
    assert _plots_left_unread(assignment) == []


def test_release_follows_the_folders_of_nbgrader_config(tmp_path):
    """`workbook release` reads the source and release folders from nbgrader_config.py,
    generates into the release folder, records the assignment, and `--check` agrees."""
    import shutil
    import subprocess
    import sys

    from autograder.course import Course

    a = "03_self_attention"
    shutil.copytree(ROOT / "solutions" / a, tmp_path / "src" / a)
    (tmp_path / "nbgrader_config.py").write_text(
        "c = get_config()\nc.CourseDirectory.source_directory = 'src'\n"
        "c.CourseDirectory.release_directory = 'student'\n"
        f"c.CourseDirectory.db_url = 'sqlite:///{tmp_path / 'gradebook.db'}'\n")

    def workbook(*args):
        return subprocess.run([sys.executable, "-m", "autograder.cli", "--course", str(tmp_path), *args],
                              capture_output=True, text=True, timeout=300, cwd=ROOT)

    made = workbook("release", a)
    assert made.returncode == 0, made.stderr
    assert made.stdout.strip() == f"generated student/{a} and recorded it in the gradebook"
    released = (tmp_path / "student" / a / f"{a}.ipynb").read_text()
    assert released == (ROOT / "notebooks" / a / f"{a}.ipynb").read_text()  # the same student notebook
    assert not (tmp_path / "notebooks").exists() and not (tmp_path / "release").exists()
    with Course(tmp_path).gradebook() as gb:
        assert [nb.name for nb in gb.find_assignment(a).notebooks] == [a]
    check = workbook("release", "--check")
    assert check.returncode == 0 and check.stdout.strip() == "student/ is in sync with src/."


def test_no_notebook_holds_a_control_character_in_its_text():
    """A TeX command typed in a Python string (``"\\text{window}"``) becomes a tab and renders wrongly:
    no cell of a solution or student notebook holds a control character other than a newline."""
    bad = []
    for folder in ("solutions", "notebooks"):
        for path in sorted((ROOT / folder).glob("*/*.ipynb")):
            for i, c in enumerate(nbformat.read(str(path), as_version=4).cells):
                found = sorted({f"U+{ord(ch):04X}" for ch in c.source if ord(ch) < 32 and ch != "\n"})
                if found:
                    bad.append(f"{path.relative_to(ROOT)} cell {i}: {', '.join(found)}")
    assert not bad, bad


def test_every_written_answer_has_a_model_answer_labelled_the_same_way():
    """A written answer's solution holds the model answer, labelled as in every notebook
    ("*Model answer.* ..."), for the instructor who grades it in Formgrader."""
    for path in sorted((ROOT / "solutions").glob("*/*.ipynb")):
        for c in nbformat.read(str(path), as_version=4).cells:
            meta = c.metadata.get("nbgrader", {})
            if c.cell_type == "markdown" and meta.get("solution") and meta.get("grade"):
                assert "*Model answer.* " in c.source, (path.name, meta.get("grade_id"))
                assert "Model answer:" not in c.source, (path.name, meta.get("grade_id"))


def test_every_notebook_is_executed_by_a_test():
    """Each assignment's solution and student notebooks are run by a test in
    tests/notebooks: a new notebook without one fails here, not silently."""
    import ast
    covered: dict[str, set[str]] = {}
    for path in (ROOT / "tests" / "notebooks").glob("test_notebook_*.py"):
        tree = ast.parse(path.read_text())
        constants = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        calls = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        for a in ASSIGNMENTS:
            if a in constants:
                covered.setdefault(a, set()).update(calls)
    needed = {"assert_solution_full_points", "assert_student_notebook_reports_stubs"}
    missing = {a: sorted(needed - covered.get(a, set())) for a in ASSIGNMENTS if needed - covered.get(a, set())}
    assert not missing, f"notebooks without an execution test in tests/notebooks: {missing}"
