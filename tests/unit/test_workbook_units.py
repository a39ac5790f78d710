"""Fast tests of the workbook CLI's parts: collecting, reading submissions, the
kernel sandbox and the worker pool (no notebook is executed)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import zipfile
from datetime import datetime, timezone
from pathlib import Path

import nbformat
import pytest

from autograder.pipeline.prepare import read_submission
from autograder.course.release import recorded_notebooks
from autograder.pipeline.collect import collect
from autograder.course import Course, CourseError
from autograder.pipeline.pool import WorkerPool
from pool_jobs import handler

REPO = Path(__file__).resolve().parents[2]
A = "03_self_attention"


@pytest.fixture
def course(tmp_path) -> Course:
    """A course folder with notebook 03 released (copied, not regenerated)."""
    root = tmp_path / "course"
    (root / "notebooks").mkdir(parents=True)
    (root / "nbgrader_config.py").write_text((REPO / "nbgrader_config.py").read_text())
    (root / "notebooks" / A).mkdir()
    (root / "notebooks" / A / f"{A}.ipynb").write_bytes((REPO / "notebooks" / A / f"{A}.ipynb").read_bytes())
    return Course(root)


def released(course: Course) -> bytes:
    return (course.release_dir / A / f"{A}.ipynb").read_bytes()


def test_collect_lms_folder_with_roster(course, tmp_path):
    lms = tmp_path / "lms"
    lms.mkdir()
    nb = released(course)
    (lms / f"Smith_s1_{A}.ipynb").write_bytes(nb)
    (lms / "Jones_s2_my work (1).ipynb").write_bytes(nb)  # renamed: found by its graded cells
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr(f"folder/{A}.ipynb", nb)
        z.writestr("folder/data.txt", "x")
        z.writestr("__MACOSX/._x", "junk")
    (lms / "Lee_s3_submission.zip").write_bytes(buf.getvalue())
    (lms / f"Nobody_s9_{A}.ipynb").write_bytes(nb)  # not on the roster
    (lms / "s4_essay.ipynb").write_text('{"cells": [], "nbformat": 4, "nbformat_minor": 5, "metadata": {}}')
    (lms / f"s5_{A}.ipynb").write_bytes(nb)
    (lms / "s5_copy.ipynb").write_bytes(nb)  # a second copy of the same notebook
    result = collect(course, lms, A, roster={"s1", "s2", "s3", "s4", "s5"})
    assert sorted(result.imported) == ["s1", "s2", "s3"]
    assert "renamed" in json.dumps(result.notes["s2"]) and "my work (1).ipynb" in result.notes["s2"][0]["message"]
    assert (course.submission_dir("s3", A) / "data.txt").read_text() == "x"
    assert any("__MACOSX" in line for line in result.ignored)
    assert result.errors == [f"'Nobody_s9_{A}.ipynb': unrecognised student id (no part of the name is on the roster)"]
    # a student whose files cannot be taken as they are is rejected with the reason, never silently left out
    assert "'s4_essay.ipynb': unrecognised notebook name" in result.rejected["s4"]
    assert "is a second copy of 03_self_attention.ipynb" in result.rejected["s5"]
    assert sorted(result.rejected) == ["s4", "s5"]
    assert list(course.submission_dir("s5", A).iterdir()) == []  # recorded as rejected: 0 with the reason
    log = json.loads(course.collect_log_path(A).read_text())
    assert log["notes"]["s1"] == [] and log["notes"]["s2"][0]["kind"] == "renamed"
    assert log["rejected"] == result.rejected


def test_collect_nbgrader_layout_and_pattern(course, tmp_path):
    src = tmp_path / "exchange"
    (src / "alice" / A).mkdir(parents=True)
    (src / "alice" / A / f"{A}.ipynb").write_bytes(released(course))
    (src / "alice" / A / "timestamp.txt").write_text("2026-01-01 10:00:00")
    result = collect(course, src, roster=set())
    assert result.ok and result.imported == {"alice": [A]}
    # the student wrote that timestamp.txt: it is recorded as a claim, never believed
    assert result.times["alice"] == {"time": None, "source": "none", "claimed": "2026-01-01 10:00:00"}
    assert not (course.submission_dir("alice", A) / "timestamp.txt").exists()
    # the exchange's files were written when the student submitted: their change time is a time
    # the student cannot set back, and the claim that disagrees with it is flagged
    result = collect(course, src, roster=set(), time_from="files")
    ctime = max(os.lstat(p).st_ctime for p in (src / "alice" / A).iterdir())
    assert result.times["alice"]["source"] == "files"
    assert abs(datetime.fromisoformat(result.times["alice"]["time"]).replace(tzinfo=timezone.utc).timestamp()
               - ctime) < 1
    assert [n["kind"] for n in result.notes["alice"]] == ["timestamp_claim"]
    assert "timestamp.txt says 2026-01-01 10:00:00 UTC, the file system says" in result.notes["alice"][0]["message"]
    written = (course.submission_dir("alice", A) / "timestamp.txt").read_text()
    assert written == f"{result.times['alice']['time']} UTC"
    # an LMS zip without a roster: the id comes from --pattern
    download = tmp_path / "download.zip"
    with zipfile.ZipFile(download, "w") as z:
        z.writestr(f"Doe Jane_12345_67890_{A}.ipynb", released(course))
        z.writestr("notes.pdf", b"%PDF")
    result = collect(course, download, A, roster=set(), pattern=r"_(?P<student>\d+)_\d+_")
    assert list(result.imported) == ["12345"]
    assert result.errors == ["'notes.pdf': unrecognised file name (no student id matches the pattern "
                             "'_(?P<student>\\\\d+)_\\\\d+_'; use --pattern or --roster)"]


def test_collect_rejects_unknown_assignment(course, tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "a_b.ipynb").write_text("{}")
    with pytest.raises(CourseError, match="unknown assignment 'nope'"):
        collect(course, tmp_path / "x", "nope", roster=set())


def test_without_a_roster_the_pattern_names_the_student_never_the_gradebook(course, tmp_path):
    """The gradebook's students never decide an id: a new student who names an upload after a
    known one (the LMS prefixes the file with the uploader's id) stays themself."""
    with course.gradebook() as gb:
        gb.update_or_create_student("s1")
    lms = tmp_path / "lms"
    lms.mkdir()
    (lms / f"mallory_s1_{A}.ipynb").write_bytes(released(course))  # uploaded by mallory as "s1_03_...ipynb"
    (lms / f"newcomer_{A}.ipynb").write_bytes(released(course))
    result = collect(course, lms, A)
    assert result.ok, result.errors
    assert sorted(result.imported) == ["mallory", "newcomer"]
    assert not course.submission_dir("s1", A).exists()
    folders = tmp_path / "folders"
    (folders / "latecomer").mkdir(parents=True)
    (folders / "latecomer" / f"{A}.ipynb").write_bytes(released(course))
    result = collect(course, folders, A)
    assert result.ok and result.imported == {"latecomer": [A]}, result.errors


def test_collect_student_folders_with_a_roster(course, tmp_path):
    src = tmp_path / "src"
    for student in ("alice", "mallory"):
        (src / student).mkdir(parents=True)
        (src / student / f"{A}.ipynb").write_bytes(released(course))
    result = collect(course, src, A, roster={"alice", "bob"})
    assert result.imported == {"alice": [A]}
    assert result.errors == [f"'mallory/{A}.ipynb': unrecognised student id (no part of the name is on the roster)"]


def test_a_one_column_roster_has_no_header_student(tmp_path):
    from autograder.platforms.lms_roster import roster_file_ids
    for header in ("id", "Student", "username"):
        (tmp_path / "roster.txt").write_text(f"{header}\nalice\nbob\n")
        assert roster_file_ids(str(tmp_path / "roster.txt")) == {"alice", "bob"}
    (tmp_path / "roster.txt").write_text("alice\nbob\n")
    assert roster_file_ids(str(tmp_path / "roster.txt")) == {"alice", "bob"}


def test_a_truncated_notebook_is_collected_with_a_note(course, tmp_path):
    lms = tmp_path / "lms"
    lms.mkdir()
    (lms / f"s1_{A}.ipynb").write_bytes(released(course)[:5000])
    result = collect(course, lms, A, roster={"s1"})
    assert result.imported == {"s1": [A]}
    assert [n["kind"] for n in result.notes["s1"]] == ["invalid_json"]
    assert "not valid notebook JSON" in result.notes["s1"][0]["message"]
    assert f"{A}.ipynb" in result.notes["s1"][0]["message"]  # autograde shows it for that notebook


def test_read_submission_reasons(tmp_path):
    good = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1")])
    path = tmp_path / "nb.ipynb"
    nb, problems = read_submission(path)
    assert nb is None and problems[0]["kind"] == "missing"
    path.write_text(nbformat.writes(good)[:40])
    nb, problems = read_submission(path)
    assert nb is None and problems[0]["kind"] == "invalid_json" and "not valid notebook JSON" in problems[0]["message"]
    path.write_text('{"hello": 1}')
    nb, problems = read_submission(path)
    assert nb is None and problems[0]["kind"] == "invalid_notebook"
    path.write_text(nbformat.writes(nbformat.convert(good, 3), version=3))
    nb, problems = read_submission(path)
    assert nb is not None and nb.nbformat == 4 and nb.cells[0].source == "1"
    assert [p["kind"] for p in problems] == ["old_format"]


# -- the worker pool: handlers must be importable by spawned workers -------------

@pytest.mark.timeout(300)  # a guard against a pool that never returns, not a measure of its speed
def test_pool_survives_crashes_hangs_and_errors():
    jobs = [{"job_id": i, "what": what, "x": i, "hard_timeout": 4 if what == "hang" else 60}
            for i, what in enumerate(["ok", "crash", "ok", "hang", "raise", "ok"])]
    results = {}
    with WorkerPool(2, handler) as pool:
        pool.work(jobs, lambda job, result: results.__setitem__(job["job_id"], result))
    assert sorted(results) == list(range(6))
    assert [results[i]["value"] for i in (0, 2, 5)] == [0, 4, 10]
    assert "exit code 7" in results[1]["crash"]
    # the hung job (its handler sleeps 60 s, then answers) was stopped by the pool at its own limit
    assert results[3].get("hard_timeout") and "within 4 s" in results[3]["crash"] and "value" not in results[3]
    assert results[4]["crash"] == "ValueError: bad job"


def test_pool_rejects_no_workers():
    with pytest.raises(ValueError, match="at least one worker"):
        WorkerPool(0, handler)


def test_output_past_the_cell_cap_is_cut_with_one_notice_and_one_problem():
    from autograder.sealing.sandbox import Limits
    from autograder.pipeline.run_transcript import Transcript
    cells = [{"cell_type": "code", "source": "print('x' * 10**6)", "metadata": {}}]
    run = Transcript(cells, Limits(max_output_kb=1))
    run.start_cell(0)
    for _ in range(3):
        run.add_output(0, {"output_type": "stream", "name": "stdout", "text": "x" * 700})
    texts = [o["text"] for o in run.outputs[0]]
    assert texts[0] == "x" * 700 and texts[1] == "x" * (1024 - 700)  # filled up to the cap, then cut
    assert texts[2].strip() == "... output truncated: this cell printed more than 1 kB ..." and len(texts) == 3
    assert [e["kind"] for e in run.events] == ["output_truncated"]
    assert "printed more than 1 kB" in run.events[0]["message"]


def _recorded(course: Course) -> Course:
    """The course with notebook 03's source, recorded in the gradebook (as `workbook release` does)."""
    (course.root / "solutions" / A).mkdir(parents=True)
    (course.root / "solutions" / A / f"{A}.ipynb").write_bytes((REPO / "solutions" / A / f"{A}.ipynb").read_bytes())
    recorded_notebooks(course, A)
    return course


def test_status_shows_who_was_collected_before_anything_is_graded(course, tmp_path):
    from autograder.reports.status import status_table
    _recorded(course)
    lms = tmp_path / "lms"
    lms.mkdir()
    (lms / f"s1_{A}.ipynb").write_bytes(released(course))
    (lms / f"s2_{A}.ipynb").write_bytes(b"[" * 200)  # nested too deep: rejected at collect
    result = collect(course, lms, A)
    assert sorted(result.imported) == ["s1"] and sorted(result.rejected) == ["s2"]
    table = status_table(course)
    rows = {line.split()[0]: line for line in table.splitlines()[2:] if line.strip() and not line.startswith(" ")}
    assert rows["s1"].split()[1] == "collected" and "REJECTED at collect" in rows["s2"]
    assert "collected: handed in, not autograded yet" in table
    assert table.count("s2 03_self_attention: [rejected]") == 1


def test_a_truncated_notebook_is_one_problem_in_the_status(course, tmp_path):
    """Collect finds the damaged JSON, autograde reads the same file: `workbook status` says it once."""
    from autograder.pipeline.autograde import GradingOptions, autograde
    from autograder.reports.status import status_table
    _recorded(course)
    lms = tmp_path / "lms"
    lms.mkdir()
    (lms / f"s1_{A}.ipynb").write_bytes(released(course)[:5000])
    collect(course, lms, A)
    report, = autograde(course, A, GradingOptions(workers=1, isolation="none", in_process=True))
    kinds = [p["kind"] for p in report["notebooks"][A]["problems"] if p["kind"] != "unverified"]
    assert kinds == ["invalid_json"], report["notebooks"][A]["problems"]
    notes = [line.strip() for line in status_table(course).splitlines() if line.strip().startswith(f"s1 {A}: [")]
    notes = [line for line in notes if "[unverified]" not in line]  # (graded without the sandbox, here)
    assert len(notes) == 1 and notes[0].startswith(f"s1 {A}: [invalid_json] 's1_{A}.ipynb'"), notes
    assert "not valid notebook JSON" in notes[0] and "scores 0 unless a readable copy is collected" in notes[0]


@pytest.mark.parametrize("args, words", [
    (["autograde", A, "-j", "0"], "argument -j/--workers: expected a positive integer, got 0"),
    (["autograde", A, "-s", "nobody", "--unsafe-no-sandbox"], "no submission of 03_self_attention for: nobody"),
    (["feedback", A, "-s", "nobody"], "no graded work of student 'nobody'"),
])
def test_bad_arguments_are_one_line_errors_that_name_them(course, args, words):
    _recorded(course)
    (course.submitted_dir / "s1" / A).mkdir(parents=True)
    (course.reports_dir / A).mkdir(parents=True)
    proc = subprocess.run([sys.executable, "-m", "autograder.cli", "--course", str(course.root), *args],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].endswith(words) or words in proc.stderr.strip().splitlines()[-1], \
        proc.stderr


def test_formgrader_as_a_hub_service_runs_jupyterhubs_single_user_server_and_only_under_a_hub(monkeypatch, capsys):
    """`workbook formgrader --hub` is JupyterHub's single-user server on the course folder, with
    JupyterLab's Formgrader panel (an iframe, which JupyterHub >= 4.1 forbids) off and Formgrader's
    own page as the start page; outside a hub (no JUPYTERHUB_SERVICE_NAME) it refuses."""
    from autograder.platforms.formgrader import CONFIG, HUB_CONFIG, formgrader_command, open_formgrader

    course = Course(Path(__file__).resolve().parents[2])
    monkeypatch.delenv("JUPYTERHUB_DEFAULT_URL", raising=False)
    argv, env = formgrader_command(course, "03_self_attention", ["--port", "10101"], hub=True)
    assert argv[1:4] == ["-m", "jupyterhub.singleuser", f"--ServerApp.root_dir={course.root}"]
    assert argv[-2:] == ["--port", "10101"]
    assert env["JUPYTERHUB_DEFAULT_URL"].startswith("/formgrader/gradebook/03_self_attention")
    assert env["JUPYTER_CONFIG_PATH"].split(os.pathsep)[:2] == \
        [str(CONFIG), str(HUB_CONFIG)]
    disabled = json.loads((HUB_CONFIG / "labconfig" / "page_config.json").read_text())["disabledExtensions"]
    assert disabled["@jupyter/nbgrader:formgrader"] and disabled["@jupyter/nbgrader:assignment-list"]
    monkeypatch.delenv("JUPYTERHUB_SERVICE_NAME", raising=False)
    assert open_formgrader(course, None, [], hub=True) == 2
    assert "runs as a JupyterHub service" in capsys.readouterr().err


def test_workbook_html_writes_an_offline_page_with_math_and_the_widgets_last_picture(tmp_path):
    """`workbook html`: formulas as MathML, a widget as the outputs its Output widget held when the
    notebook was saved (the explorer's picture), no script and nothing to fetch."""
    import base64
    import io

    import nbformat
    import PIL.Image

    from autograder.cli import main

    buffer = io.BytesIO()
    PIL.Image.new("RGB", (40, 30), (200, 30, 30)).save(buffer, format="PNG")
    png = base64.b64encode(buffer.getvalue()).decode()
    state = {"box": {"model_name": "VBoxModel", "state": {"children": ["IPY_MODEL_slider", "IPY_MODEL_out"]}},
             "slider": {"model_name": "IntSliderModel", "state": {"value": 3}},
             "out": {"model_name": "OutputModel", "state": {"outputs": [
                 {"output_type": "display_data", "data": {"image/png": png, "text/plain": "<Figure>"}, "metadata": {}}]}}}
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("The scale is $\\sqrt{d_k}$:\n\n$$\\mathrm{softmax}(QK^\\top)$$"),
        nbformat.v4.new_code_cell("explorer", outputs=[nbformat.v4.new_output(
            "display_data", {"application/vnd.jupyter.widget-view+json": {"model_id": "box", "version_major": 2},
                             "text/plain": "VBox(...)"})]),
    ])
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": state, "version_major": 2}}
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, str(path))
    assert main(["html", str(path)]) == 0
    page = (tmp_path / "nb.html").read_text(encoding="utf-8")
    assert "<math" in page and "$$" not in page and "\\sqrt" not in page.split("</math>")[-1]
    assert f"data:image/png;base64,{png}" in page  # the widget's last picture
    assert "<script" not in page.lower() and "Content-Security-Policy" in page
    assert main(["html", str(tmp_path / "missing.ipynb")]) == 2


def _graded_result(course: Course, points: dict[str, float]) -> dict:
    """A worker's result for the released notebook 03 with ``points`` per test cell."""
    nb = nbformat.read(str(course.release_dir / A / f"{A}.ipynb"), as_version=4)
    return {"notebook": nbformat.writes(nb), "problems": [], "items": {}, "seconds": 1.0, "seal": {},
            "cells": [{"grade_id": gid, "score": p, "error": ""} for gid, p in points.items()]}


def _test_points(course: Course, student: str) -> dict[str, float]:
    return {cell: auto for s, _n, cell, auto, *_ in course.gradebook_rows(A) if s == student and cell.startswith("test_")}


def test_a_notebook_recorded_half_way_is_rolled_back_whole(course, monkeypatch):
    """A notebook's grades, its late penalty and its history commit together: a failure after
    the first cells were written (here in nbgrader's late-penalty step) leaves the old grades,
    and the history holds only what was committed; a regrade's Rescore keeps what it is told."""
    from nbgrader.preprocessors import AssignLatePenalties

    from autograder.course import history
    from autograder.pipeline import record
    from autograder.pipeline.handoffs import Task

    _recorded(course)
    cells = ["test_scaled_dot_product_attention", "test_causal_mask", "test_padding_mask", "test_SelfAttention"]
    with course.gradebook() as gb:
        recorder = record.Recorder(course, A, gb, False, {}, digest="c1")
        recorder.enroll({"s1": None})
        record.write_result(course, gb, Task(A, "s1", A, []), _graded_result(course, dict.fromkeys(cells, 1.0)),
                            False, "c1")
    assert _test_points(course, "s1") == dict.fromkeys(cells, 1.0)

    def broken(self, nb, resources):
        raise RuntimeError("the late-penalty step failed")
    monkeypatch.setattr(AssignLatePenalties, "preprocess", broken)
    with course.gradebook() as gb, pytest.raises(RuntimeError):
        record.write_result(course, gb, Task(A, "s1", A, []), _graded_result(course, dict.fromkeys(cells, 2.0)),
                            False, "c2")
    assert _test_points(course, "s1") == dict.fromkeys(cells, 1.0)  # not one cell of the second run
    monkeypatch.undo()
    rescore = record.Rescore({("s1", A): dict.fromkeys(cells, 1.0)}, cells={"test_causal_mask"}, keep_higher=True,
                             note="fixed", when="2026-12-02T10:00:00")
    with course.gradebook() as gb:
        record.write_result(course, gb, Task(A, "s1", A, []),
                            _graded_result(course, {**dict.fromkeys(cells, 2.0), "test_causal_mask": 0.0}), False,
                            "c3", rescore)
        rows = history.history(gb, "s1", A)
    assert _test_points(course, "s1") == dict.fromkeys(cells, 1.0)  # not --item: old; --item but lower: kept
    assert rescore.kept[("s1", A)]["test_causal_mask"] == {"new": 0.0, "why": "kept higher"}
    assert rescore.kept[("s1", A)]["test_SelfAttention"] == {"new": 2.0, "why": "not among --item"}
    mask = [(r["points"], r["course"], r["how"]) for r in rows if r["cell"] == "test_causal_mask"]
    assert mask == [(1.0, "c1", "autograde"), (1.0, "c3", "regrade, kept higher: fixed")]
