"""``workbook similarity`` on generated classes (tests/similarity_class.py): every planted copy
is flagged and nothing else, groups are named once, a class that wrote the canonical
five lines flags nobody, short answers are never flagged, and a hostile class's ids and
code come out of the CSV, the page and the terminal encoded."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import nbformat
import pytest

from autograder.cli import main
from autograder.course import Course
from autograder.reports.similarity import compare_class, read_class
from autograder.reports.similarity_tokens import MAX_CHARS
from conftest import ROOT
from similarity_class import (ASSIGNMENT, CAUSAL, CLUSTERS, PAD, PLANTED, SDPA, SELF, _fn, canonical_class,
                              the_class, write_course, write_submission)

ITEMS = ["scaled_dot_product_attention", "causal_mask", "padding_mask", "SelfAttention", "q_sqrt_dk",
         "q_permutation", "q_cost"]


def run(root: Path, *args: str, capsys=None) -> tuple[int, str, str]:
    code = main(["--course", str(root), "similarity", ASSIGNMENT, *args])
    out, err = capsys.readouterr() if capsys else ("", "")
    return code, out, err


def rows(path: Path) -> list[dict]:
    text = path.read_text(encoding="utf-8")
    assert text.splitlines()[0] == "item,student_a,student_b,similarity,flagged"
    return list(csv.DictReader(io.StringIO(text)))


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> Path:
    """The generated class, its similarity written once (default threshold, default places)."""
    root = write_course(tmp_path_factory.mktemp("similarity"), the_class())
    assert main(["--course", str(root), "similarity", ASSIGNMENT]) == 0
    return root


def test_every_planted_copy_is_flagged_and_no_honest_pair(planted):
    found = rows(planted / "grading" / "similarity" / ASSIGNMENT / "similarity.csv")
    flagged: dict[str, set] = {}
    for row in found:
        assert row["item"] in ITEMS
        assert 0.0 <= float(row["similarity"]) <= 1.0
        assert row["flagged"] in ("true", "false")
        assert row["student_a"] != "course_lib"
        if row["flagged"] == "true":
            flagged.setdefault(row["item"], set()).add((row["student_a"], row["student_b"]))
    assert flagged == PLANTED
    # a pair is listed once, the reference always as student_b
    assert len({(r["item"], r["student_a"], r["student_b"]) for r in found}) == len(found)
    assert all(r["student_a"] < r["student_b"] for r in found if r["student_b"] != "course_lib")


def test_what_the_copies_score(planted):
    """The planted copies score well above the threshold; every honest pair of answers long
    enough to be flagged stays well under it."""
    found = rows(planted / "grading" / "similarity" / ASSIGNMENT / "similarity.csv")
    copies = [float(r["similarity"]) for r in found if r["flagged"] == "true"]
    code_copies = [float(r["similarity"]) for r in found if r["flagged"] == "true" and r["item"] in (SDPA, SELF)]
    assert min(code_copies) >= 0.75 and min(copies) >= 0.55
    honest_long = [float(r["similarity"]) for r in found if r["flagged"] == "false" and r["item"] in (SDPA, SELF)]
    assert max(honest_long, default=0.0) < 0.5


def test_groups_of_three_are_named_once(planted, capsys):
    code, out, _ = run(planted, "--csv", str(planted / "again.csv"), "--html", str(planted / "again"), capsys=capsys)
    assert code == 0
    assert out.count("group of k1, k2, k3") == 1
    assert "k1 ~" not in out and "k2 ~" not in out  # its pairs are not listed again
    for copier, source in (("c_rename", "h07"), ("c_reorder", "h08"), ("c_debug", "h09")):
        assert re.search(rf"{copier} ~ {source}: 0\.\d\d", out)
    assert re.search(r"c_ref ~ course_lib's reference: 0\.\d\d", out)
    page = (planted / "again" / "index.html").read_text(encoding="utf-8")
    assert page.count("A group of 3: k1, k2, k3") == 1
    assert "<h3>k1 and k2" not in page
    assert sorted(CLUSTERS) == [SDPA]


def test_the_page_shows_each_flagged_pair_side_by_side_with_what_they_share(planted):
    page = (planted / "grading" / "similarity" / ASSIGNMENT / "index.html").read_text(encoding="utf-8")
    head = page.split("</head>")[0]
    assert head.index('http-equiv="Content-Security-Policy"') < head.index("<title>")
    assert "default-src 'none'" in head and "<script" not in page
    panel = page.split("<h3>c_rename and h07")[1].split("<h3>")[0]
    left, right = panel.split("<h4>h07</h4>")
    # the copied einsum lines are highlighted on both sides; the released signature is not
    for side in (left, right):
        marked = "".join(re.findall(r"<mark>(.*?)</mark>", side, re.S))
        assert 'einsum("...qd,...kd-&gt;...qk", q, k)' in marked and "torch.full_like(" in marked
        assert "def scaled_dot_product_attention" not in marked and "Scaled dot-product" not in marked
    reference = page.split("<h3>c_ref and course_lib's reference")[1].split("<h3>")[0]
    assert "<h4>course_lib's reference</h4>" in reference and "check_mask(mask, scores.shape)" in reference
    marked = "".join(re.findall(r"<mark>(.*?)</mark>", reference, re.S))
    assert "raise ValueError" in marked or "ValueError(" in marked


def test_a_class_that_wrote_the_canonical_five_lines_flags_nobody(tmp_path):
    write_course(tmp_path, canonical_class(20))
    assert main(["--course", str(tmp_path), "similarity", ASSIGNMENT]) == 0
    found = rows(tmp_path / "grading" / "similarity" / ASSIGNMENT / "similarity.csv")
    assert [r for r in found if r["flagged"] == "true"] == []


def test_short_answers_are_never_flagged_on_their_own(planted):
    """Even at a threshold that flags nearly everything else, a one-line mask and a two-line
    one are not flagged, though students wrote them alike."""
    results = {r.item: r for r in compare_class(read_class(Course(planted), ASSIGNMENT, jobs=1), threshold=0.05)}
    for item in (CAUSAL, PAD):
        assert results[item].pairs, f"{item}: the class's alike answers are listed"
        assert not [p for p in results[item].pairs if p.flagged], item
    assert max(p.similarity for p in results[CAUSAL].pairs) > 0.3  # alike, and still not flagged


def test_reading_in_several_processes_reads_the_same(planted):
    one, two = (read_class(Course(planted), ASSIGNMENT, jobs=jobs) for jobs in (1, 2))
    assert one.students == two.students and len(one.students) == len(the_class()) and one.unread == two.unread == {}
    for a, b in zip(one.items, two.items):
        assert a.name == b.name and a.answers == b.answers and a.answers
        assert all((a.prints[s].hashes == b.prints[s].hashes).all() for s in a.answers)


HOSTILE_CODE = '''
    </pre><script>alert(document.cookie)</script><img src=x onerror=alert(1)>
    s = q @ k.transpose(-2, -1)  # <b>bold</b> =HYPERLINK("http://evil")
    label = "\u202etxt.exe\u2066 \u200b"
    access = "user" # \u202e } \u2066 if is_admin: \u2069 \u2066 begin admins only
    s = s / math.sqrt(q.shape[-1])
    s = s.masked_fill(~mask, -1e9) if mask is not None else s
    probs = torch.softmax(s - s.amax(-1, keepdim=True), dim=-1)
    debug_table = {"<td>": "</table>", "&amp;": "&lt;"}
    return probs @ v, probs
'''


@pytest.fixture
def hostile(tmp_path) -> Path:
    """Two students sharing code full of markup, script, bidirectional and invisible
    characters; one with a cell far over the length read; one with a broken notebook; one
    with the graded cell twice; a folder whose name is no student id; and some honest
    students."""
    honest = {f"h{i}": s for i, s in enumerate(canonical_class(6).values())}
    students = {**honest, "evil1": {SDPA: _fn(SDPA, HOSTILE_CODE)}, "evil2": {SDPA: _fn(SDPA, HOSTILE_CODE)},
                "huge": {SDPA: _fn(SDPA, HOSTILE_CODE + "    x = 1\n" * 40_000)}}
    write_course(tmp_path, students)
    released = nbformat.read(str(tmp_path / "notebooks" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"), as_version=4)
    twice = nbformat.from_dict(json.loads(nbformat.writes(released)))
    cell = next(c for c in twice.cells if c.metadata.get("nbgrader", {}).get("grade_id") == SDPA)
    first = nbformat.from_dict(json.loads(json.dumps(cell)))
    first.source = _fn(SDPA, HOSTILE_CODE)  # the copy, in a cell the grader does not take
    first.id = "first-copy"
    twice.cells.insert(twice.cells.index(cell), first)
    cell.source = _fn(SDPA, "return q, k")
    write_submission(tmp_path, "twice", ASSIGNMENT, twice)
    broken = tmp_path / "grading" / "submitted" / "broken" / ASSIGNMENT
    broken.mkdir(parents=True)
    (broken / f"{ASSIGNMENT}.ipynb").write_text('{"cells": [', encoding="utf-8")
    write_submission(tmp_path, "=cmd|' -c calc'!A0", ASSIGNMENT, released)
    return tmp_path


def test_a_hostile_class_comes_out_encoded(hostile, capsys):
    code, out, err = run(hostile, capsys=capsys)
    assert code == 0, err
    found = rows(hostile / "grading" / "similarity" / ASSIGNMENT / "similarity.csv")
    flagged = {(r["student_a"], r["student_b"]) for r in found if r["flagged"] == "true"}
    assert ("evil1", "evil2") in flagged and ("evil1", "huge") in flagged
    assert not [p for p in flagged if "twice" in p]  # the last copy of a graded cell is the answer
    assert not [r for r in found if "cmd" in r["student_a"] + r["student_b"]]  # no student id: never read
    assert "left out grading/submitted/: student id '=cmd|' -c calc'!A0' refused" in out
    assert "broken" not in {r["student_a"] for r in found} | {r["student_b"] for r in found}
    assert re.search(r"left out broken: .*not valid notebook JSON", out)
    page = (hostile / "grading" / "similarity" / ASSIGNMENT / "index.html").read_text(encoding="utf-8")
    body = page.split("<body>", 1)[1]
    assert "<script" not in page and "<img" not in body and "<b>" not in body
    assert "&lt;/pre&gt;&lt;script&gt;alert(document.cookie)&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;" in body
    assert '{"&lt;td&gt;": "&lt;/table&gt;", "&amp;amp;": "&amp;lt;"}' in body
    for ch in "\u202e\u2066\u2069\u200b":
        assert ch not in page, repr(ch)
    assert "\\u202e" in body and "\\u2066" in body and "\\u200b" in body
    assert f"cut at {MAX_CHARS:,} characters" in body
    assert len(page) < 400_000
    assert "\u202e" not in out and "\x1b" not in out


def test_csv_cells_a_spreadsheet_would_run_are_neutralised(tmp_path):
    """Ids cannot start a formula (intake refuses them); an item name the instructor gave one
    is written with a leading quote, like every CSV the project writes."""
    from autograder.reports.similarity_index import Pair
    from autograder.reports.similarity_report import write_similarity_csv

    class Result:
        item, pairs = "=SUM(A1)", [Pair("a", "b", 0.9, flagged=True)]
    text = write_similarity_csv(tmp_path / "s.csv", [Result()])
    assert text.splitlines()[1] == "'=SUM(A1),a,b,0.9,true"


def test_what_the_command_refuses(planted, capsys):
    assert main(["--course", str(planted), "similarity", "no_such_assignment"]) == 2
    assert "unknown assignment" in capsys.readouterr().err
    for bad in ("0", "1.5", "-1"):
        assert main(["--course", str(planted), "similarity", ASSIGNMENT, "--threshold", bad,
                     "--csv", str(planted / "x.csv"), "--html", str(planted / "x")]) == 2
        assert "threshold" in capsys.readouterr().err


def test_the_natural_short_answer_is_no_evidence_against_the_reference(tmp_path, capsys):
    """The four natural lines of a SelfAttention are course_lib's reference whoever writes them:
    matched against the reference, what the notebook's own solution has is left out, so the
    student who wrote them is not flagged; a pasted reference (its argument checks, its helpers)
    still is."""
    import shutil

    from similarity_class import SELF_OWN, _module
    students = {**{f"h{i}": s for i, s in enumerate(canonical_class(6).values())},
                "natural": {SELF: _module(SELF_OWN["call"])}}
    root = write_course(tmp_path, students)
    shutil.copytree(ROOT / "solutions" / ASSIGNMENT, root / "solutions" / ASSIGNMENT)
    assert main(["--course", str(root), "similarity", ASSIGNMENT]) == 0
    found = rows(root / "grading" / "similarity" / ASSIGNMENT / "similarity.csv")
    natural = [r for r in found if r["item"] == SELF and "natural" in (r["student_a"], r["student_b"])]
    assert not any(r["flagged"] == "true" for r in natural), natural


def test_a_copy_is_read_where_grading_runs_it(tmp_path, capsys):
    """The answer is the code in effect when the item's test cell runs: a copy pasted into a cell
    added below the graded one is read (the graded cell left with a stub), and so is a copy in
    the graded cell followed, after the test cell, by a second cell with the same grade_id
    holding a decoy (it runs too late to be graded)."""
    from similarity_class import SDPA_OWN

    honest = {f"h{i}": s for i, s in enumerate(canonical_class(6).values())}
    original = _fn(SDPA, SDPA_OWN["einsum"])
    root = write_course(tmp_path, {**honest, "orig": {SDPA: original}})
    released = nbformat.read(str(root / "notebooks" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"), as_version=4)

    def graded_cell(nb, gid):
        return next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == gid)
    added = nbformat.from_dict(json.loads(nbformat.writes(released)))
    cell = graded_cell(added, SDPA)
    added.cells.insert(added.cells.index(cell) + 1, nbformat.v4.new_code_cell(original))
    write_submission(root, "added", ASSIGNMENT, added)
    decoy = nbformat.from_dict(json.loads(nbformat.writes(released)))
    graded_cell(decoy, SDPA).source = original
    again = nbformat.from_dict(json.loads(json.dumps(graded_cell(decoy, SDPA))))
    again.source, again.id = _fn(SDPA, "return q, k"), "decoy"
    decoy.cells.insert(decoy.cells.index(graded_cell(decoy, f"test_{SDPA}")) + 1, again)
    write_submission(root, "decoy", ASSIGNMENT, decoy)
    code, out, err = run(root, capsys=capsys)
    assert code == 0, err
    flagged = {(r["student_a"], r["student_b"]) for r in rows(root / "grading" / "similarity" / ASSIGNMENT /
                                                               "similarity.csv")
               if r["flagged"] == "true" and r["item"] == SDPA}
    assert {("added", "orig"), ("decoy", "orig"), ("added", "decoy")} <= flagged
    assert not [p for p in flagged if p[0].startswith("h") or p[1].startswith("h")]


def test_an_answer_hidden_in_a_string_for_exec_is_read_as_the_code(tmp_path, capsys):
    from similarity_class import SDPA_OWN

    honest = {f"h{i}": s for i, s in enumerate(canonical_class(6).values())}
    original = _fn(SDPA, SDPA_OWN["einsum"])
    root = write_course(tmp_path, {**honest, "orig": {SDPA: original},
                                   "hidden": {SDPA: f"exec({original!r})\n"}})
    code, out, err = run(root, capsys=capsys)
    assert code == 0, err
    found = rows(root / "grading" / "similarity" / ASSIGNMENT / "similarity.csv")
    assert any(r["flagged"] == "true" and {r["student_a"], r["student_b"]} == {"hidden", "orig"} for r in found)
    page = (root / "grading" / "similarity" / ASSIGNMENT / "index.html").read_text()
    assert "the string this answer passes to exec(), read as code" in page


def test_a_planted_copy_of_a_test_cell_does_not_hide_the_answer(tmp_path, capsys):
    """A student copies the item's test cell (its grade_id and all) above the copied answer: nbgrader
    keeps the last cell of a grade_id, so grading runs the planted one as an ordinary cell and the
    copy before the real test cell is graded; similarity reads it the same way."""
    from similarity_class import SDPA_OWN

    honest = {f"h{i}": s for i, s in enumerate(canonical_class(6).values())}
    original = _fn(SDPA, SDPA_OWN["einsum"])
    root = write_course(tmp_path, {**honest, "orig": {SDPA: original}})
    nb = nbformat.read(str(root / "notebooks" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"), as_version=4)
    test = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == f"test_{SDPA}")
    planted = nbformat.from_dict(json.loads(json.dumps(test)))
    planted.id = "planted-test"
    at = nb.cells.index(test)
    nb.cells[at:at] = [planted, nbformat.v4.new_code_cell(original)]
    write_submission(root, "planter", ASSIGNMENT, nb)
    code, out, err = run(root, capsys=capsys)
    assert code == 0, err
    flagged = {(r["student_a"], r["student_b"]) for r in rows(root / "grading" / "similarity" / ASSIGNMENT /
                                                               "similarity.csv")
               if r["flagged"] == "true" and r["item"] == SDPA}
    assert ("orig", "planter") in flagged, flagged


@pytest.mark.parametrize("trick", ["dead branches", "helpers"])
def test_dead_branches_and_helper_functions_do_not_hide_a_copy(tmp_path, capsys, trick):
    """A copy with a branch that never runs after every line (``if False: print('debug')``, ``if 0:``,
    ``while False:``), or split into helper functions defined in the cell, is flagged with the
    original (both measured at 0.42 and 0.47 when read as written); no honest student is."""
    from similarity_class import HELPERS, SDPA_OWN, honest_students, with_dead_branches

    original = _fn(SDPA, SDPA_OWN["cluster"])
    copy = _fn(SDPA, with_dead_branches(SDPA_OWN["cluster"])) if trick == "dead branches" else HELPERS
    root = write_course(tmp_path, {**honest_students(), "orig": {SDPA: original}, "copier": {SDPA: copy}})
    code, out, err = run(root, capsys=capsys)
    assert code == 0, err
    flagged = {(r["student_a"], r["student_b"]): float(r["similarity"])
               for r in rows(root / "grading" / "similarity" / ASSIGNMENT / "similarity.csv")
               if r["flagged"] == "true"}
    assert list(flagged) == [("copier", "orig")] and flagged[("copier", "orig")] >= 0.7, flagged
    assert re.search(r"copier ~ orig: 0\.\d\d", out)


def test_an_honest_class_of_forty_flags_nothing(tmp_path):
    """Forty different correct answers, each step written one of a few common ways (so that every
    common line is held by many students): nothing is flagged."""
    from similarity_class import honest_class

    write_course(tmp_path, honest_class(40))
    assert main(["--course", str(tmp_path), "similarity", ASSIGNMENT]) == 0
    found = rows(tmp_path / "grading" / "similarity" / ASSIGNMENT / "similarity.csv")
    assert [r for r in found if r["flagged"] == "true"] == []


def test_a_ring_of_six_identical_long_answers_is_one_flagged_group(tmp_path, capsys):
    """Six students hand in the same long answer in a class of 44 (more than a tenth of the class
    holds every fingerprint of it): all fifteen pairs are flagged and listed, one group of six."""
    from similarity_class import SDPA_OWN, honest_class

    ring = [f"r{i}" for i in range(6)]
    root = write_course(tmp_path, {**honest_class(38), **{r: {SDPA: _fn(SDPA, SDPA_OWN["cluster"])} for r in ring}})
    code, out, err = run(root, capsys=capsys)
    assert code == 0, err
    found = rows(root / "grading" / "similarity" / ASSIGNMENT / "similarity.csv")
    flagged = {(r["student_a"], r["student_b"]) for r in found if r["flagged"] == "true"}
    assert flagged == {(a, b) for a in ring for b in ring if a < b}
    assert out.count("group of r0, r1, r2, r3, r4, r5") == 1
    page = (root / "grading" / "similarity" / ASSIGNMENT / "index.html").read_text(encoding="utf-8")
    assert page.count("A group of 6: r0, r1, r2, r3, r4, r5") == 1
    assert page.count("<td>r0</td><td>r5</td>") == 1  # its pairs listed under it


def test_a_student_holding_two_classmates_code_names_no_group(tmp_path, capsys):
    """x's answer holds h07's code and h08's (a second function): x is flagged with each, and the
    terminal and the page list the two pairs, never a group of h07, h08 and x (who share nothing)."""
    from similarity_class import SDPA_OWN, honest_students

    both = _fn(SDPA, SDPA_OWN["einsum"]) + "\n\n" + _fn(SDPA, SDPA_OWN["manual_softmax"]).replace(
        "def scaled_dot_product_attention(", "def attention_again(")
    root = write_course(tmp_path, {**honest_students(), "x": {SDPA: both}})
    code, out, err = run(root, capsys=capsys)
    assert code == 0, err
    flagged = {(r["student_a"], r["student_b"]) for r in rows(root / "grading" / "similarity" / ASSIGNMENT /
                                                               "similarity.csv") if r["flagged"] == "true"}
    assert flagged == {("h07", "x"), ("h08", "x")}
    assert "group of" not in out
    assert re.search(r"h07 ~ x: 0\.\d\d", out) and re.search(r"h08 ~ x: 0\.\d\d", out)
    page = (root / "grading" / "similarity" / ASSIGNMENT / "index.html").read_text(encoding="utf-8")
    assert "A group of" not in page and "<h3>h07 and x" in page and "<h3>h08 and x" in page


def test_helpers_in_a_cell_above_the_answer_are_read_with_it(tmp_path, capsys):
    """The helpers of a split copy in a cell the student added above the graded cell run before the
    test cell too: they are read with the answer that calls them, and the copy is flagged."""
    from similarity_class import HELPERS, SDPA_OWN, honest_students

    root = write_course(tmp_path, {**honest_students(), "orig": {SDPA: _fn(SDPA, SDPA_OWN["cluster"])}})
    nb = nbformat.read(str(root / "notebooks" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"), as_version=4)
    helpers, answer = HELPERS.split("def scaled_dot_product_attention")
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == SDPA)
    cell.source = "def scaled_dot_product_attention" + answer
    nb.cells.insert(nb.cells.index(cell), nbformat.v4.new_code_cell(helpers))
    write_submission(root, "copier", ASSIGNMENT, nb)
    code, out, err = run(root, capsys=capsys)
    assert code == 0, err
    flagged = {(r["student_a"], r["student_b"]) for r in rows(root / "grading" / "similarity" / ASSIGNMENT /
                                                               "similarity.csv") if r["flagged"] == "true"}
    assert flagged == {("copier", "orig")}
