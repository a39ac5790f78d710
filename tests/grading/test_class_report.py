"""`workbook report`: what the class got wrong, on a generated class of 30 students with
planted mistakes (the ``generated_class`` fixture), and on the session's graded class."""

from __future__ import annotations

import csv
import json
import os
import re
from collections import Counter
from pathlib import Path

import pytest

from autograder.course import Course as GradedCourse
from browser import CHROMIUM, Chromium
from nbtools import Course
from report_class import ASSIGNMENT, UNRECOGNISED, judged
from test_nbgrader_03 import SUBMISSIONS  # noqa: F401  (its students join the session's graded class)


def _csv(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f))


def _planted_counts(students) -> Counter:
    return Counter((item, mistake) for _, item, mistake in students if mistake not in (None, UNRECOGNISED))


def test_mistake_counts_are_exactly_the_planted_ones(generated_class):
    for out in (generated_class["anonymous"], generated_class["named"]):
        rows = _csv(out / "mistakes.csv")
        got = {(r["item"], r["mistake"]): int(r["count"]) for r in rows}
        assert got == dict(_planted_counts(generated_class["students"]))
        assert all(r["of"] == "30" for r in rows)
    page = (generated_class["anonymous"] / "index.html").read_text()
    assert re.search(r"masked scores filled with 0</td><td class=\"n\">4 of 30", page)
    assert re.search(r"no scaling</td><td class=\"n\">5 of 30", page)


def test_named_report_lists_the_students_of_each_mistake(generated_class):
    data = json.loads((generated_class["named"] / "report.json").read_text())
    for row in data["mistakes"]:
        expected = sorted(s for s, item, m in generated_class["students"] if (item, m) == (row["item"], row["mistake"]))
        assert row["students"] == expected, row


def test_unrecognised_mistakes_are_shown_apart(generated_class):
    rows = _csv(generated_class["named"] / "unrecognised.csv")
    unknown = {s for s, _, m in generated_class["students"] if m == UNRECOGNISED}
    listed = {s for r in rows if r["item"] == "scaled_dot_product_attention" for s in r["students"].split("; ")}
    assert unknown <= listed
    by_title = {r["subcheck"]: r for r in rows if r["item"] == "scaled_dot_product_attention"}
    hand = next(r for t, r in by_title.items() if "hand example" in t)
    assert set(hand["students"].split("; ")) == unknown and hand["kind"] == "wrong values"
    # no catalogued mistake shows under "not recognised" on a sub-check where it was named
    named = _csv(generated_class["named"] / "mistakes.csv")
    assert not {s for r in named for s in r["students"].split("; ")} & set(hand["students"].split("; "))
    page = (generated_class["anonymous"] / "index.html").read_text()
    assert "Not recognised" in page and "wrong values" in page


def test_item_credit_and_subchecks_follow_the_judgements(generated_class):
    data = json.loads((generated_class["anonymous"] / "report.json").read_text())
    a = data["assignments"][ASSIGNMENT]
    with GradedCourse(generated_class["course"].root).gradebook() as gb:
        max_score = gb.find_notebook(ASSIGNMENT, ASSIGNMENT).max_score  # code and written answers
    assert a["students"] == 30 and a["max_score"] == max_score
    for item in a["items"]:
        earned = [_earned(judged(item["item"], m if wrong == item["item"] else None))
                  for _, wrong, m in generated_class["students"]]
        expected = Counter("full" if e >= item["points"] else "none" if e <= 0 else "partial" for e in earned)
        assert (item["full"], item["partial"], item["none"]) == (expected["full"], expected["partial"],
                                                                  expected["none"]), item["item"]
        rates = [s["rate"] for s in item["subchecks"]]
        assert rates == sorted(rates, reverse=True)
    sdpa = next(i for i in a["items"] if i["item"] == "scaled_dot_product_attention")
    worst = sdpa["subchecks"][0]
    assert worst["failed"] == 4 + 5 + 3 + 3 and worst["of"] == 30  # every wrong sdpa fails the random batch
    scores = _csv(generated_class["anonymous"] / "scores.csv")
    assert sorted(float(r["score"]) for r in scores) == sorted(
        sum(_earned(judged(i, m if i == wrong else None)) for i in ("scaled_dot_product_attention", "causal_mask",
                                                                     "padding_mask", "SelfAttention"))
        for _, wrong, m in generated_class["students"])
    assert all(float(r["manual"]) == 0 for r in scores)


def _earned(result: dict) -> float:
    return round(sum(r["earned"] for r in result["results"]), 4)


def test_without_names_no_student_id_appears(generated_class):
    ids = [s for s, _, _ in generated_class["students"]]
    for path in generated_class["anonymous"].iterdir():
        text = path.read_text()
        leaked = [s for s in ids if s in text]
        assert not leaked, (path.name, leaked[:3])
    named = "".join(p.read_text() for p in generated_class["named"].iterdir())
    assert all(s in named for s in ids)


def test_manual_points_are_counted_apart(generated_class, tmp_path):
    course = GradedCourse(generated_class["course"].root)
    student = generated_class["students"][0][0]
    with course.gradebook() as gb:
        grade = gb.find_grade("test_causal_mask", ASSIGNMENT, ASSIGNMENT, student)
        before = grade.auto_score
        grade.manual_score = 0.5
        gb.db.commit()
    try:
        generated_class["course"].workbook("report", "--names", "-o", str(tmp_path))
        rows = {r["student"]: r for r in _csv(tmp_path / "scores.csv")}
        assert float(rows[student]["manual"]) == 0.5
        assert float(rows[student]["score"]) == pytest.approx(float(rows[student]["auto"]) + 0.5)
        assert float(rows[student]["auto"]) == pytest.approx(sum(
            _earned(judged(i, None)) for i in ("scaled_dot_product_attention", "padding_mask", "SelfAttention")))
    finally:
        with course.gradebook() as gb:
            grade = gb.find_grade("test_causal_mask", ASSIGNMENT, ASSIGNMENT, student)
            grade.manual_score = None
            assert grade.auto_score == before
            gb.db.commit()


def test_report_without_grades_says_so(tmp_path):
    course = Course([ASSIGNMENT])
    try:
        course.workbook("release", ASSIGNMENT)
        with pytest.raises(RuntimeError, match="nothing graded yet"):
            course.workbook("report")
    finally:
        course.close()


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed")
def test_page_renders_offline_with_every_plot(generated_class, tmp_path):
    page = generated_class["named"] / "index.html"
    images = page.read_text().count("<img ")
    assert images == 3  # the class's mistakes, the scores, the credit per item (one notebook: no heat map)
    browser = Chromium(width=1200, height=3000)
    try:
        outside = browser.open_offline(page, ready="document.images.length > 0")
        sizes = browser.evaluate("Array.from(document.images).map(i => [i.complete, i.naturalWidth, i.naturalHeight])")
        assert len(sizes) == images
        assert all(done and w > 200 and h > 100 for done, w, h in sizes), sizes
        shot = Path(os.environ.get("WORKBOOK_REPORT_SCREENSHOT", tmp_path / "report.png"))
        browser.screenshot(shot)
        assert shot.stat().st_size > 20_000  # a rendered page, not a blank one
        assert not outside, outside
    finally:
        browser.close()


@pytest.mark.slow
def test_graded_class_report_names_the_suites_planted_mistakes(graded_class, tmp_path):
    """On the real graded class: the mistakes notebook 03's suite planted are named."""
    course = graded_class.course
    course.workbook("report", "03_self_attention", "--names", "-o", str(tmp_path))
    rows = {(r["item"], r["mistake"]): r["students"].split("; ") for r in _csv(tmp_path / "mistakes.csv")}
    expected = {("causal_mask", "upper triangle"): "mistakes_a",
                ("scaled_dot_product_attention", "masked scores filled with 0"): "mask_zero",
                ("SelfAttention", "scaled by √d_model"): "mistakes_a",
                ("scaled_dot_product_attention", "softmax over the query axis"): "softmax_queries"}
    for key, student in expected.items():
        assert student in rows.get(key, []), (key, rows)
    assert "correct" not in {s for students in rows.values() for s in students}


def test_several_assignments_get_a_heat_map_weakest_first():
    """Pure: two notebooks, three students; the heat map has a row per student (the
    weakest first, grey where nothing was handed in) and a column per notebook."""
    from autograder.reports.class_data import Grading, summarize
    from autograder.reports.class_report import render_html

    def g(assignment, student, score, items=None):
        return Grading(assignment, assignment, student, score, 10.0, score, 0.0,
                       {"test_x": (score, 10.0)}, "graded", [], items or {})

    wrong = {"x": {"item": "x", "graded": True, "total_points": 10.0, "reference_used": "", "notes": [],
                   "results": [{"title": "t", "points": 10.0, "earned": 0.0, "hidden": False,
                                "message": "On x: `out` has shape (2,), expected (3,).", "mistake": ""}]}}
    gradings = [g("01_a", "id_ann_71", 10), g("02_b", "id_ann_71", 9), g("01_a", "id_bob_72", 0, wrong),
                g("01_a", "id_cy_73", 5)]
    data = summarize(gradings, names=False)
    heat = data["heatmap"]
    assert heat["columns"] == ["01_a", "02_b"]
    assert [r["shares"] for r in heat["rows"]] == [[0.0, None], [0.5, None], [1.0, 0.9]]
    assert [r["student"] for r in heat["rows"]] == ["student 1", "student 2", "student 3"]
    unknown = data["assignments"]["01_a"]["unrecognised"]
    assert [(u["item"], u["kind"], u["count"], u["of"]) for u in unknown] == [("x", "wrong shape", 1, 3)]
    page = render_html(data)
    # the heat map, and per notebook its scores and credit per item (no named mistake: no bar chart)
    assert page.count("<img ") == 1 + 2 * 2 and "Who is falling behind" in page
    assert not any(name in page for name in ("id_ann_71", "id_bob_72", "id_cy_73"))


def test_stubs_are_not_attempted_counts_share_one_denominator_and_examples_end_on_a_word():
    """Pure: a student who left an item's stub as released is "not attempted" (not a failure
    to recognise); every count of an assignment is out of its students, also for a student
    whose notebook could not run; examples are cut at a word; the histogram counts whole
    students."""
    from autograder.reports.class_data import Grading, summarize
    from autograder.reports.class_plots import score_figure
    from autograder.reports.class_report import render_html

    def result(message: str, earned: float = 0.0) -> dict:
        return {"x": {"item": "x", "graded": True, "total_points": 2.0, "reference_used": "", "notes": [],
                      "results": [{"title": "t", "points": 2.0, "earned": earned, "hidden": False,
                                   "message": message, "mistake": ""}]}}

    stub = result("`x` raised NotImplementedError: it still contains the stub `raise NotImplementedError()`. "
                  "Replace it with your code.")
    long = "On q (2, 5, 4): `out` differs from the expected values " + "at position (0, 1) by 0.5 " * 20
    gradings = [Grading("01_a", "01_a", "s1", 2.0, 2.0, 2.0, 0.0, {"test_x": (2.0, 2.0)}, "graded", [],
                        result("", 2.0)),
                Grading("01_a", "01_a", "s2", 0.0, 2.0, 0.0, 0.0, {"test_x": (0.0, 2.0)}, "graded", [], stub),
                Grading("01_a", "01_a", "s3", 0.0, 2.0, 0.0, 0.0, {"test_x": (0.0, 2.0)}, "graded", [],
                        result(long)),
                Grading("01_a", "01_a", "s4", 0.0, 2.0, 0.0, 0.0, {"test_x": (0.0, 2.0)}, "failed",
                        ["kernel_died"], {})]
    data = summarize(gradings, names=True)
    a = data["assignments"]["01_a"]
    item = a["items"][0]
    assert (item["full"], item["none"], item["not_attempted"]) == (1, 3, 1)
    assert [(u["students"], u["of"]) for u in a["unrecognised"]] == [(["s3"], 4)]  # the stub is not "not recognised"
    assert [(s["failed"], s["of"]) for s in item["subchecks"]] == [(3, 4)]  # one denominator: the 4 students
    example = a["unrecognised"][0]["example"]
    assert example.endswith(" …") and len(example) <= 242 and example[:-2] == long[:len(example) - 2]
    assert long[len(example) - 2] == " "  # cut where a word ends
    page = render_html(data)
    assert "Every count below is out of these 4 students." in page
    assert "full credit 1 of 4, partial 0, none 2, not attempted 1 (the stub as released)." in page
    assert "3 of 4 (75%)" in page
    figure = score_figure(a, "01_a")
    ticks = figure.axes[0].get_yticks()
    assert len(ticks) > 1 and all(float(t).is_integer() for t in ticks)


def test_a_named_mistake_is_counted_once_and_waiting_answers_are_said():
    """The wrong-axis student: one sub-check names the mistake, a hidden one fails too; the student
    is counted under the mistake, not again under "not recognised". The page says how many points
    of written answers still wait for a person, and the legend sits below the bars."""
    from autograder.reports.class_data import Grading, summarize
    from autograder.reports.class_plots import score_figure
    from autograder.reports.class_report import render_html

    results = {"x": {"item": "x", "graded": True, "total_points": 2.0, "reference_used": "", "notes": [],
                     "results": [{"title": "visible", "points": 1.0, "earned": 0.0, "hidden": False,
                                  "message": "On q: differs\nLikely cause: the softmax axis", "mistake": "axis"},
                                 {"title": "hidden", "points": 1.0, "earned": 0.0, "hidden": True,
                                  "message": "On other shapes: differs", "mistake": ""}]}}
    gradings = [Grading("01_a", "01_a", "s1", 0.0, 14.0, 0.0, 0.0, {"test_x": (0.0, 2.0)}, "graded", [], results,
                        awaiting=12.0)]
    data = summarize(gradings, names=True)
    a = data["assignments"]["01_a"]
    assert [m["mistake"] for m in a["mistakes"]] == ["axis"] and a["unrecognised"] == []
    page = render_html(data)
    assert "up to 12 points of written answers still wait for a person" in page
    assert "workbook formgrader 01_a" in page
    legend = score_figure(a, "01_a").axes[0].get_legend()
    assert legend.get_bbox_to_anchor().y1 < legend.axes.bbox.y0 + 1  # (below the axes)
