"""Judge: a notebook's answers, in the grader's process, after its sandbox is gone.

It reads what the run stage kept (:class:`~autograder.pipeline.handoffs.RunOutcome`), never
the running process, and what was read in the student's source (the forbidden callables its
solution cells name: autograder/pipeline/source_checks.py). :func:`judge` replays each item's
plan against the answers the runner gave (:func:`course_lib.grading.judge.runner.judge_item`) and
assigns the points; an item whose test cell never ran scores 0 with the reason. Then it
assembles the autograded notebook (:func:`assemble`): the grader's report and score in each
test cell, the outputs the run kept, the student's markdown kept as text.
"""

from __future__ import annotations

from typing import Any

from course_lib.grading import get_spec
from course_lib.grading.judge.results import ItemResult, SubResult, format_report
from course_lib.grading.judge.runner import judge_item

from ..course.problems import problem
from ..doors.outbound import clean_attachments, clean_markdown
from ..inside.cells import cell_label, is_test_cell, nbgrader_meta
from .handoffs import Judgement, RunOutcome

__all__ = ["judge", "visible_verdict", "assemble", "not_checked"]


def judge(outcome: RunOutcome, forbidden: dict[str, str]) -> Judgement:
    """Every item's result from the answers its plan got (or why its test cell did not run),
    none for an item whose solution cell names a forbidden callable (``forbidden``: item ->
    why); then the autograded notebook."""
    results = {}
    for gid, item in outcome.tests.items():
        if item not in outcome.items:
            continue
        spec = get_spec(item)
        if item in outcome.plans:
            results[item] = judge_item(spec, outcome.plans[item], outcome.answers[item], device=outcome.device,
                                       salt=outcome.salts.get(item, 0))
            reason = forbidden.get(item, "")
            if reason and not results[item].reference_used:
                results[item].reference_used = reason
        else:
            results[item] = _not_run(spec, _why_not_run(outcome))
    cells, problems = assemble(outcome, results)
    return Judgement(results, cells, problems)


def visible_verdict(item: str, plan: Any, answers: list, device: Any) -> bool:
    """Whether the notebook's answers to ``item``'s visible plan pass (for ``working_or_reference``
    while the notebook runs: no points, salt 0). Pass or fail is all the notebook needs: no search
    of the mistake catalogue (it can take seconds for a wrong module, on the cell's clock)."""
    rows = [[a if isinstance(a, dict) else None for a in row] if isinstance(row, list) else [] for row in answers]
    result = judge_item(get_spec(item), plan, rows, device=device, salt=0, name_mistakes=False)
    return not result.reference_used and all(r.passed for r in result.results)


def _why_not_run(outcome: RunOutcome) -> str:
    if outcome.reason:
        at = outcome.ended_at
        where = f" in {cell_label(at, outcome.cells[at])}" if at is not None else ""
        return f"This test cell did not run: {outcome.reason}{where}."
    return "This test cell did not run."


def _not_run(spec: Any, reason: str) -> ItemResult:
    subs = spec.subchecks
    results = [SubResult(s.title, s.points, 0.0, s.hidden, reason if k == 0 else "not run") for k, s in enumerate(subs)]
    return ItemResult(spec.name, results, graded=True, total_points=spec.points)



def assemble(outcome: RunOutcome, results: dict[str, ItemResult]) -> tuple[list[dict], list[dict]]:
    """The autograded notebook (``outcome.notebook``, changed in place): the student's markdown
    kept as text, pasted images kept if they are images, each code cell's outputs as the run
    left them, each test cell the grader's report and score. Returns the test cells' scores,
    and a problem for each test cell without a check."""
    nb = outcome.notebook
    cells_out, problems = [], []
    unchecked = {item: not_checked(result) for item, result in results.items()}  # (read before the cells)
    for index, cell in enumerate(nb["cells"]):
        if cell.get("cell_type") in ("markdown", "raw"):
            source = cell.get("source", "")
            cell["source"] = clean_markdown("".join(source) if isinstance(source, list) else str(source))
            attachments = clean_attachments(cell.pop("attachments", None))  # pasted images: kept, if images
            if attachments and cell.get("cell_type") == "markdown":
                cell["attachments"] = attachments
            cell.get("metadata", {}).pop("format", None)
            cell.get("metadata", {}).pop("raw_mimetype", None)
        if cell.get("cell_type") != "code":
            continue
        if is_test_cell(cell):
            gid = nbgrader_meta(cell)["grade_id"]
            item = outcome.tests[gid]
            result = results.get(item)
            if result is None:
                report = f"✗ {gid}: no check is defined for this test cell; it scores 0."
                score, max_score = 0.0, float(nbgrader_meta(cell).get("points", 0) or 0)
                problems.append(problem("no_check", f"{gid}: no check is defined for this test cell", gid))
            else:
                report, score, max_score = format_report(result), round(result.score, 4), float(result.total_points)
            cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": report + "\n"},
                               {"output_type": "execute_result", "execution_count": None,
                                "data": {"text/plain": f"{score:g} / {max_score:g} points"}, "metadata": {}}]
            cell["execution_count"] = None
            cells_out.append({"grade_id": gid, "score": score, "max_score": max_score,
                              "error": unchecked.get(item, not_checked(None))})
        else:
            outputs = outcome.outputs.get(index, [])
            if outcome.ended_at is not None and index > outcome.ended_at and not outputs:
                why = outcome.reason
                outputs = [{"output_type": "error", "ename": "NotRun",
                            "evalue": f"not run: {why}", "traceback": [f"NotRun: not run: {why}"]}]
            cell["outputs"] = outputs
            cell["execution_count"] = outcome.counts.get(index)
    return cells_out, problems


def not_checked(result: ItemResult | None) -> str:
    """Why an item could not be checked at all ("" when its checks ran, passing or not)."""
    if result is None:
        return "no check is defined for this test cell"
    first = next((r.message for r in result.results if r.message and r.message != "not run"), "")
    if first.startswith("This test cell did not run") or "is not defined when its test cell runs" in first:
        return first.splitlines()[0][:300]
    return ""

