"""Regressions for attacks on the grader found by trying them: each is refused where it
lands, in the grader's process (fast; the sandbox itself is in tests/grading/test_sandbox.py)."""

from __future__ import annotations

import os

import nbformat
import pytest
import torch

from autograder.doors import intake
from autograder.inside.channel import ProtocolError
from autograder.pipeline.prepare import extra_files, item_salt, read_submission
from autograder.pipeline.source_checks import find_copies, forbidden_uses
from autograder.pipeline.reference_oracle import Oracle
from autograder.sealing.course_copy import reference_targets
from autograder.doors.outbound import clean_markdown, clean_output, clean_text
from course_lib.grading import get_spec
from course_lib.grading.answer.calls import realise
from course_lib.grading.judge.compare import describe_difference
from course_lib.grading.answer.wire import Build, WireLimits, WireError, decode, encode


def test_the_oracle_runs_references_on_plain_data_only():
    oracle = Oracle(reference_targets(["causal_mask", "padding_mask"]), timeout=30)
    try:
        evil = Build("torch.utils.collect_env:run", ("id > /tmp/never-written",))
        refused = oracle.ask({"name": "course_lib.attention:causal_mask", "args": (evil,), "kwargs": {}}, set())
        assert not refused["ok"] and "plain data" in refused["text"]
        ok = oracle.ask({"name": "course_lib.attention:causal_mask", "args": (3,), "kwargs": {}}, set())
        assert ok["ok"] and torch.equal(ok["value"], torch.ones(3, 3, dtype=torch.bool).tril())
        during = oracle.ask({"name": "course_lib.attention:causal_mask", "args": (3,), "kwargs": {}}, {"causal_mask"})
        assert not during["ok"] and during["item"] == "causal_mask"
        other = oracle.ask({"name": "course_lib.attention:padding_mask", "args": (torch.tensor([2]), 3),
                            "kwargs": {}}, {"causal_mask"})
        assert other["ok"]  # another item's reference stays available
        assert not os.path.exists("/tmp/never-written")
    finally:
        oracle.close()


def test_builds_construct_grading_fixtures_only():
    with pytest.raises(ValueError, match="cannot use"):
        realise(Build("torch.utils.collect_env:run", ("true",)))
    model = realise(Build("course_lib.grading.answer.fixtures.gpt:ContextSumModel", (11, 4)))
    assert model.block_size == 4


def test_symlinked_submissions_and_files_are_not_followed(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("instructor only")
    folder = tmp_path / "s1" / "03"
    folder.mkdir(parents=True)
    (folder / "03.ipynb").symlink_to(secret)
    (folder / "notes.txt").symlink_to(secret)
    (folder / "data.csv").write_text("1,2\n")
    nb, problems = read_submission(folder / "03.ipynb")
    assert nb is None and problems[0]["kind"] == "symlink"
    files, links = extra_files(folder)
    assert [f for f, _ in files] == ["data.csv"] and links == ["notes.txt"]



def _nested(levels: int) -> str:
    return "[" * levels + "]" * levels


def test_a_deeply_nested_notebook_is_rejected_before_it_is_parsed(tmp_path):
    # json.loads raises RecursionError (not ValueError) a thousand levels down: unguarded,
    # 400 kB in one student's file stopped collect and autograde for the whole class. The
    # depth is now measured on the bytes, before anything parses them.
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1", metadata={"deep": "DEEP"})])
    text = nbformat.writes(nb).replace('"DEEP"', _nested(200_000))
    path = tmp_path / "s1" / "03" / "03.ipynb"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    got, problems = read_submission(path)
    assert got is None and [p["kind"] for p in problems] == ["rejected"]
    assert "its JSON is nested 200,004 levels deep, over the limit of 64" in problems[0]["message"] or \
        "levels deep, over the limit of 64" in problems[0]["message"]
    # the limit sits far above any real notebook, and counts exactly (brackets in strings count for nothing)
    assert intake.scan_json(nbformat.writes(nb).encode())["depth"] < 10
    assert intake.scan_json(_nested(64).encode())["depth"] == 64
    assert intake.scan_json(b'{"a": "[[[[[[[[\\"[[[[[", "b": [1, [2]]}')["depth"] == 3
    for levels in (65, 5_000):
        with pytest.raises(intake.Refused, match="levels deep"):
            intake.scan_json(_nested(levels).encode())


def test_student_markdown_and_messages_are_made_inert():
    md = clean_markdown("<script>alert(1)</script> [x](javascript:alert(1)) `<bos>` <img src=x onerror=y>")
    assert "<script" not in md and "<img" not in md and "javascript:" not in md and "`<bos>`" in md
    assert clean_text("\x1b[2J\x1b[Hfake line") == "[2J[Hfake line"
    assert clean_output({"output_type": "display_data", "data": {"text/html": "<script>x</script>"}}) is None
    shown = clean_output({"output_type": "execute_result", "data": {"text/plain": "1", "application/javascript": "x"},
                          "execution_count": 3})
    assert shown["data"] == {"text/plain": "1"}


def test_oversized_structures_are_refused_before_they_are_built():
    raw = encode([[]] * 1000)
    with pytest.raises(WireError, match="structure"):
        decode(raw, WireLimits(max_header=2000))


def test_forbidden_callables_are_found_in_the_code():
    ln = get_spec("LayerNorm").forbidden
    assert forbidden_uses("def f(x):\n    return torch.layer_norm(x, (3,))", ln)
    assert forbidden_uses("from torch.nn.functional import layer_norm", ln)
    assert forbidden_uses("g = getattr(F, 'layer_norm')", ln)
    assert not forbidden_uses("class LayerNorm(nn.Module):\n    def forward(self, x):\n        return x.mean(-1)", ln)
    rms = get_spec("RMSNorm").forbidden  # notebook 11: torch's function and its module
    assert forbidden_uses("class RMSNorm(nn.RMSNorm):\n    pass", rms)
    assert forbidden_uses("def forward(self, x):\n    return F.rms_norm(x, (x.size(-1),), self.weight, self.eps)", rms)
    assert not forbidden_uses("class RMSNorm(nn.Module):\n    def forward(self, x):\n        return x * x.pow(2).mean(-1, "
                              "keepdim=True).rsqrt()", rms)


def test_a_pasted_reference_is_flagged_and_a_written_one_is_not():
    import inspect
    import course_lib.multihead as ref
    pasted = inspect.getsource(ref.MultiHeadAttention).replace("MultiHeadAttention", "MyAttention")
    found = find_copies([("cell 3", pasted)], ["MultiHeadAttention"])
    assert found and found[0]["item"] == "MultiHeadAttention" and found[0]["similarity"] > 0.95
    written = "def split_heads(x, num_heads):\n    B, T, D = x.shape\n    return x.view(B, T, num_heads, -1).transpose(1, 2)\n"
    assert find_copies([("cell 3", written)], ["MultiHeadAttention", "split_heads"]) == []


def test_salts_are_secret_per_student_and_per_submission():
    a = item_salt(b"k" * 32, "03", "03", "ann", "causal_mask", "v1")
    assert a == item_salt(b"k" * 32, "03", "03", "ann", "causal_mask", "v1")
    assert len({a, item_salt(b"k" * 32, "03", "03", "bob", "causal_mask", "v1"),
                item_salt(b"k" * 32, "03", "03", "ann", "causal_mask", "v2"),
                item_salt(b"j" * 32, "03", "03", "ann", "causal_mask", "v1")}) == 4


@pytest.mark.parametrize("expected,got", [(0.5, float("nan")), (float("nan"), 0.5), (0.0, float("inf")),
                                          (0.25, torch.tensor(float("nan")))])
def test_nan_and_infinite_numbers_never_match_a_finite_answer(expected, got):
    """`abs(nan - x) > tol` is False: a NaN answer once matched every expected number."""
    assert describe_difference(expected, got) is not None
    assert describe_difference(float("nan"), float("nan")) is None  # NaN where NaN is expected is right


def test_a_process_trees_memory_is_counted_once_per_page():
    """The sandbox's memory watch sums its processes' proportional set sizes: 400 MB held
    by a child counts, the same pages shared by its forked grandchild do not count twice."""
    import subprocess
    import sys
    import time

    from autograder.sealing.sandbox import process_tree, tree_memory_mb

    code = ("import os, sys, time\nblock = bytearray(400 * 2**20)\nfor i in range(0, len(block), 4096):\n"
            "    block[i] = 1\nif os.fork() == 0:\n    time.sleep(60)\n    os._exit(0)\n"
            "sys.stdout.write('ready\\n'); sys.stdout.flush(); time.sleep(60)\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        time.sleep(0.2)
        assert len(process_tree(child.pid)) == 2
        held = tree_memory_mb(child.pid)  # (the tree alone: other tests' processes beside it come and go)
        assert 400 < held < 600, held  # once, not twice (800 MB of resident pages, with a Python's own)
    finally:
        for pid in reversed(process_tree(child.pid)):
            os.kill(pid, 9)
        child.wait()


def test_a_students_tex_cannot_put_markup_into_the_feedback_page():
    """Written answers' formulas become MathML in the feedback, through the sanitiser:
    TeX that would carry a link, a handler or raw markup keeps none of it."""
    from autograder.doors.outbound import tex_to_mathml

    for tex in (r"\href{javascript:alert(1)}{x}", r"\text{<img src=x onerror=alert(1)>}", r"\text{<b>bold</b>}"):
        out = tex_to_mathml(tex, False)
        assert "javascript" not in out and "onerror" not in out and "src=" not in out, out  # (<b> is allowed markup)
    assert tex_to_mathml(r"\sqrt{d_k}", False).startswith("<math")
    assert tex_to_mathml("<script>alert(1)</script>", False).count("<script") == 0


@pytest.mark.parametrize("answer", [
    "\\`<img src=x onerror=alert(1)>\\`",  # escaped backticks are not a code span
    "[a](`) <img src=x onerror=alert(1)> `",  # a backtick inside a link's address
])
def test_markdown_that_fools_the_code_span_guess_stays_inert(answer):
    """A written answer is shown in Formgrader (the instructor's browser) and the
    feedback: whatever the split into code spans guessed, the rendered page has no
    element the student wrote."""
    import nbconvert.filters.markdown as md

    rendered = md.markdown2html(clean_markdown(answer))
    assert "<img" not in rendered and "onerror" in rendered


@pytest.mark.parametrize("ch", ["\u3164", "\u115f", "\u1160", "\u034f", "\u17b4", "\u180b", "\ufe0f", "\U000e0100",
                                "\u200b", "\u2800", "\uffa0", "\u2066"])
def test_every_character_that_shows_as_nothing_is_written_as_its_escape(ch):
    """`out` and `out` with a Hangul filler, a variation selector or a tag look alike on a page
    and a terminal: every default-ignorable character is shown as its escape, wherever a
    student's string goes out (the terminal, the similarity page, file names at the door)."""
    from autograder.doors.intake import invisible, shown

    assert invisible(ch)
    assert shown(f"out{ch}") == "out" + (f"\\u{ord(ch):04x}" if ord(ch) <= 0xFFFF else f"\\U{ord(ch):08x}")


def test_letters_of_other_scripts_and_symbols_are_shown_as_they_are():
    from autograder.doors.intake import invisible, shown

    text = "héllo 日本語 Ωμέγα ∑ 🙂 Ω"
    assert not any(invisible(ch) for ch in text) and shown(text) == text


def _running_transcript(**limits):
    from autograder.pipeline.run_transcript import Transcript
    from autograder.sealing.sandbox import Limits
    run = Transcript([{"cell_type": "code", "source": "x", "metadata": {}} for _ in range(3)], Limits(**limits))
    run.start_cell(0)
    return run


def test_forged_cell_indices_in_the_runners_messages_are_ignored():
    """A cell's index as a tensor (which compares as it likes) used to raise out of the serve
    loop, and an exit() at cell 10**6 out of the judge: both a crash of the grader's."""
    run = _running_transcript()
    for forged in (torch.tensor([0, 1]), torch.tensor(0), True, 0.0):
        run.on_cell_end({"index": forged, "status": "ok", "execution_count": 1})
        run.on_truncated({"index": forged})
        run.on_output({"index": forged, "output": {"output_type": "stream", "name": "stdout", "text": "x"}})
        with pytest.raises(ProtocolError):
            run.on_cell_start({"index": forged})
    assert run.current == 0 and not run.counts and not run.truncated and not run.outputs
    run.on_exit({"index": 10**6})
    assert run.ended_at == 0 and run.done  # the running cell, not one that does not exist


def test_what_a_figure_carries_beside_its_image_counts_against_the_cell():
    """Each output: a 1x1 PNG and 256 kB of text/plain. The text used to count against the
    notebook's 4 MB only, never the cell's 256 kB (15 kept: 3.9 M characters in one cell)."""
    png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGP4//8/AAX+Av6nNYGEAAAAAElFTkSuQmCC"
    run = _running_transcript(max_output_kb=256, max_notebook_output_kb=4096)
    for _ in range(15):
        run.add_output(0, {"output_type": "display_data", "metadata": {},
                           "data": {"image/png": png, "text/plain": "T" * 200 * 1024}})
    kept = run.outputs[0]
    assert len(kept) == 15 and all(o["data"]["image/png"] == png for o in kept)  # every figure kept
    beside = sum(len(o["data"].get("text/plain", "")) for o in kept)
    assert beside == 200 * 1024, beside  # the first one's text fits; the others' is dropped
    run.add_output(0, {"output_type": "stream", "name": "stdout", "text": "y" * 100 * 1024})
    assert run.truncated == {0}  # and what the cell prints after it is counted on top


def test_a_sub_checks_message_is_cut_however_much_of_the_answer_it_quotes():
    """An answer whose state_dict names its parameters with megabyte-long names made the test
    cell's report 6.3 M characters (past every output cap: a report is the grader's)."""
    from course_lib.grading.judge.results import MAX_MESSAGE, ItemResult, SubResult, format_report
    huge = "parameter shapes differ: " + "W" * 3 * 2**20
    result = ItemResult("SelfAttention", [SubResult("layout", 1, 0.0, False, huge)], True, 1.0)
    assert len(result.results[0].message) == MAX_MESSAGE
    assert result.results[0].message.endswith(f"(cut: the message was {len(huge):,} characters)")
    assert len(format_report(result)) < MAX_MESSAGE + 1000
    again = ItemResult.from_data(result.as_data())  # as the instructor's side reads it back
    assert again.results[0].message == result.results[0].message


def test_frames_are_read_one_at_a_time():
    from autograder.inside.channel import _LEN, FrameReader
    frames = [encode({"type": "output", "index": i}, kind="message") for i in range(3)]
    reader = FrameReader()
    reader.feed(b"".join(_LEN.pack(len(f)) + f for f in frames) + _LEN.pack(100) + b"partial")
    assert [reader.next_frame()["index"] for _ in range(3)] == [0, 1, 2]
    assert reader.next_frame() is None and len(reader.buffer) == _LEN.size + len(b"partial")
