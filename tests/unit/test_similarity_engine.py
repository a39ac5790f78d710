"""The engine of ``workbook similarity`` on its own: what normalisation keeps and drops,
winnowing's guarantee, the weights of shared fingerprints, the index's pairs against a
direct computation, and groups."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from autograder.reports.similarity_index import (CODE, REFERENCE, Fingerprints, ItemIndex, Pair, Settings, clusters,
                                                  fingerprints, kgram_hashes)
from autograder.reports.similarity_tokens import MAX_CHARS, code_tokens, text_tokens

ORIGINAL = '''def attend(q, k, v, mask=None):
    """Attention."""
    d = q.size(-1)  # key size
    scores = q @ k.transpose(-2, -1) / math.sqrt(d)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights
'''


def words(source: str) -> list[str]:
    return code_tokens(source).words


def test_names_literals_comments_docstrings_and_layout_do_not_count():
    renamed = '''def f(a, b, c, m=None):
    # my own comment
    """Another docstring, longer,
    over two lines."""
    size = a.size(-2)
    s = a @ b.transpose(-3, -2) / math.sqrt(size)   # comment


    if m is not None:
        s = s.masked_fill(~m, float('-1e30'))
    w = torch.softmax(s,
                      dim=-7)
    return w @ c, w
'''
    assert words(renamed) == words(ORIGINAL)
    assert "V" in words(ORIGINAL) and "N" in words(ORIGINAL) and "S" in words(ORIGINAL)
    assert not {"d", "scores", "attend", "#"} & set(words(ORIGINAL))


def test_what_a_library_is_called_and_the_code_does_still_counts():
    assert words(ORIGINAL.replace(".softmax(", ".log_softmax(")) != words(ORIGINAL)
    assert words(ORIGINAL.replace(" @ v", " * v")) != words(ORIGINAL)
    assert words(ORIGINAL.replace("is not None", "is None")) != words(ORIGINAL)
    assert "masked_fill" in words(ORIGINAL) and "transpose" in words(ORIGINAL)


def test_attributes_a_cell_assigns_are_names_the_student_chose():
    a = "class M(nn.Module):\n    def __init__(self):\n        self.proj = nn.Linear(2, 2)\n" \
        "    def forward(self, x):\n        return self.proj(x)\n"
    b = a.replace("proj", "my_linear_layer")
    assert words(a) == words(b) and "Linear" in words(a)


def test_independent_statements_in_another_order_read_the_same():
    a = "def f(x):\n    a = x.sum()\n    b = x.mean()\n    c = x.max()\n    return a + b + c\n"
    b = "def f(x):\n    c = x.max()\n    a = x.sum()\n    b = x.mean()\n    return a + b + c\n"
    assert words(a) == words(b)
    # a statement moved into another block is a different program
    c = "def f(x):\n    a = x.sum()\n    if x:\n        b = x.mean()\n    c = x.max()\n    return a + b + c\n"
    assert words(c) != words(a)


def test_code_tokenize_cannot_read_is_read_line_by_line():
    broken = "def f(x):\n    y = (x +\n    return y\n%timeit f(1)\n"
    tokens = code_tokens(broken)
    assert tokens.words[:6] == ["def", "V", "(", "V", ")", ":"]
    assert "return" in tokens.words and "%" in tokens.words
    for word, (start, end) in zip(tokens.words, tokens.spans):
        if end > start and word not in ("V", "N", "S"):
            assert broken[start:end] == word


@pytest.mark.parametrize("source", [ORIGINAL, ORIGINAL.replace("# key size", "# key\u2028size\x0c\r\x1c")
                                    .replace('"-inf"', '"-\u2029inf"')])
def test_every_token_points_at_what_it_came_from(source):
    """Also where a student's comment or string holds characters other tools take for a
    line break (the highlighting must mark what was shared, not its neighbour)."""
    tokens = code_tokens(source)
    assert len(tokens.words) == len(code_tokens(ORIGINAL).words)
    for word, (start, end) in zip(tokens.words, tokens.spans):
        text = source[start:end]
        if word == "V":
            assert text.isidentifier()
        elif word == "S":
            assert text[0] in "'\"f"
        elif word == "N":
            assert text[0].isdigit()
        elif end > start:
            assert text == word


def test_written_answers_are_their_words_in_any_order_of_sentences():
    a = text_tokens("Scaling keeps the variance at one. Otherwise the softmax *saturates*!")
    b = text_tokens("otherwise the Softmax saturates.   Scaling keeps the variance at one")
    assert a.words == b.words
    assert "saturates" in a.words and "*" not in a.words


def test_an_answer_is_read_up_to_its_limit():
    huge = "x = 1\n" * (MAX_CHARS // 3)
    tokens = code_tokens(huge)
    assert tokens.cut and len(tokens.source) == MAX_CHARS and len(tokens.words) <= MAX_CHARS


def test_winnowing_keeps_a_fingerprint_of_every_long_enough_shared_fragment():
    rng = random.Random(0)
    vocabulary = [f"t{i}" for i in range(50)]
    settings = CODE
    for _ in range(200):
        shared = [rng.choice(vocabulary) for _ in range(settings.k + settings.window - 1)]
        a = [rng.choice(vocabulary) for _ in range(rng.randint(0, 40))] + shared + \
            [rng.choice(vocabulary) for _ in range(rng.randint(0, 40))]
        b = [rng.choice(vocabulary) for _ in range(rng.randint(0, 40))] + shared
        assert len(np.intersect1d(fingerprints(a, settings).hashes, fingerprints(b, settings).hashes)) >= 1
    # and keeps about 2 / (window + 1) of the k-grams, not all of them
    many = [rng.choice(vocabulary) for _ in range(5000)]
    kept = len(fingerprints(many, settings).hashes) / len(kgram_hashes(many, settings.k))
    assert 0.3 < kept < 0.5


def test_the_released_notebooks_k_grams_are_no_fingerprints():
    stub = words("def attend(q, k, v, mask=None):\n    raise NotImplementedError()\n")
    template = np.unique(kgram_hashes(stub, CODE.k))
    prints = fingerprints(words(ORIGINAL), CODE, template)
    assert len(prints.hashes) and not np.isin(prints.hashes, template).any()


def _index(answers: dict[str, list[str]], settings: Settings = CODE, reference: list[str] | None = None) -> ItemIndex:
    students = sorted(answers)
    return ItemIndex(students, [fingerprints(answers[s], settings) for s in students],
                     lambda who: reference if who == REFERENCE else answers[who], settings,
                     fingerprints(reference, settings) if reference else None)


def test_pairs_from_the_index_are_what_a_direct_computation_gives():
    """Every pair's similarity through the index equals the definition computed pair by pair."""
    rng = random.Random(1)
    pool = [[rng.choice("abcdefghij") for _ in range(30)] for _ in range(12)]  # shared pieces
    answers = {f"s{i:02d}": [w for _ in range(4) for w in rng.choice(pool)] for i in range(40)}
    index = _index(answers)
    found = {(p.a, p.b): p.similarity for p in index.similar_pairs(0.01)}
    students = index.students
    counted = [set(h for h in index.sets[i] if index.weight(index.df_of(np.array([h])))[0] > 0) for i in
               range(len(students))]
    checked = 0
    for i in range(len(students)):
        for j in range(i + 1, len(students)):
            shared = counted[i] & counted[j]
            weight = sum(index.weight(index.df_of(np.array([h])))[0] for h in shared)
            expected = weight / max(min(len(counted[i]), len(counted[j])), CODE.min_prints)
            assert found.get((students[i], students[j]), 0.0) == pytest.approx(expected if expected >= 0.01 else 0.0)
            checked += bool(shared)
    assert checked > 20
    # the same in blocks of rows and of pairs (a large class, a fingerprint many hold)
    blocked = {(p.a, p.b): p.similarity for p in index.similar_pairs(0.01, block_bytes=8 * 40 * 3, pair_limit=5)}
    assert blocked == pytest.approx(found)


def test_what_many_hold_weighs_less_and_what_too_many_hold_nothing():
    index = _index({f"s{i:03d}": ["x"] * 20 for i in range(200)})
    assert index.common == 20
    w = index.weight(np.array([1, 2, 5, 20, 21, 200]))
    assert w[0] == w[1] == 1.0
    assert 1.0 > w[2] > w[3] > 0.0
    assert w[4] == w[5] == 0.0
    small = _index({f"s{i}": ["x"] * 20 for i in range(12)})
    assert small.common == 5  # never fewer than min_common students


def test_a_copy_is_similar_and_short_answers_are_never_flagged():
    a = words(ORIGINAL)
    honest = words("def attend(q, k, v, mask=None):\n    s = torch.einsum('qd,kd->qk', q, k)\n"
                   "    return s.softmax(-1) @ v, s.softmax(-1)\n")
    answers = {"a": a, "b": a, "c": honest}
    index = _index(answers)
    pairs = {(p.a, p.b): index.judge(p, 0.5) for p in index.similar_pairs(0.25)}
    assert set(pairs) == {("a", "b")} and pairs[("a", "b")].similarity == pytest.approx(1.0)
    assert pairs[("a", "b")].flagged and pairs[("a", "b")].evidence >= CODE.min_tokens
    one_line = words("def causal(T):\n    return torch.ones(T, T, dtype=torch.bool).tril(diagonal=0)\n")
    short = _index({"a": one_line, "b": one_line})
    for pair in short.similar_pairs(0.01):
        assert not short.judge(pair, 0.01).flagged


def test_the_reference_is_compared_with_every_answer():
    reference = words(ORIGINAL)
    index = _index({"copied": reference, "other": words("def attend(q, k, v, mask=None):\n    return q, k\n")},
                   reference=reference)
    pairs = {p.a: p for p in index.reference_pairs(0.01)}
    assert pairs["copied"].similarity == pytest.approx(1.0) and index.judge(pairs["copied"], 0.5).flagged
    assert pairs["other"].b == REFERENCE and pairs["other"].similarity < 0.5  # the signature alone


def test_groups_of_three_or_more_are_named_once():
    pairs = [Pair("a", "b", 0.9, flagged=True), Pair("b", "c", 0.9, flagged=True), Pair("a", "c", 0.9, flagged=True),
             Pair("d", "e", 0.9, flagged=True), Pair("e", "f", 0.3), Pair("d", "f", 0.9, flagged=True),
             Pair("g", REFERENCE, 0.9, flagged=True), Pair("h", REFERENCE, 0.8, flagged=True),
             Pair("g", "h", 0.9, flagged=True), Pair("i", REFERENCE, 0.9, flagged=True)]
    assert clusters(pairs) == [["a", "b", "c"], [REFERENCE, "g", "h"]]


def test_a_group_is_students_who_all_match_each_other():
    """One student holding two classmates' code (x ~ a, x ~ b) makes no group of a, b and x: a and
    b share nothing. Two groups that share a member are two groups, and a chain is no group."""
    assert clusters([Pair("a", "x", 0.9, flagged=True), Pair("b", "x", 0.9, flagged=True),
                     Pair("a", "b", 0.0)]) == []
    square = [Pair(a, b, 0.9, flagged=True) for a, b in ("ab", "bc", "cd", "da")]
    assert clusters(square) == []
    two = [Pair(a, b, 0.9, flagged=True) for a, b in ("ab", "ac", "bc", "cd", "ce", "de")]
    assert clusters(two) == [["a", "b", "c"], ["c", "d", "e"]]


def test_fingerprints_are_the_same_in_every_process():
    """Token numbers come from the tokens' text, not from the order they were met in."""
    import subprocess
    import sys
    code = ("from autograder.reports.similarity_index import kgram_hashes; "
            "print(kgram_hashes(list('abcdefghijkl'), 8).tolist())")
    root = Path(__file__).resolve().parents[2]
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root,
                           env={"PYTHONHASHSEED": seed, "PATH": ""}).stdout for seed in ("1", "2")}
    assert len(runs) == 1
    assert runs.pop().strip() == str(kgram_hashes(list("abcdefghijkl"), 8).tolist())


def test_an_empty_class_and_empty_answers():
    index = ItemIndex([], [], lambda who: [], CODE)
    assert index.similar_pairs(0.1) == [] and index.reference_pairs(0.1) == []
    assert len(fingerprints([], CODE).hashes) == 0
    assert isinstance(fingerprints(["a"] * 3, CODE), Fingerprints)


def test_what_the_class_wrote_alike_in_another_item_is_no_evidence_here():
    """Two students share lines here that most of the class wrote in another item: with the
    assignment's frequencies they are no evidence, without them they are."""
    from autograder.reports.similarity_index import class_frequency

    canonical = words(ORIGINAL)
    here = {"a": canonical, "b": canonical}
    elsewhere = [[fingerprints(canonical, CODE).hashes] for _ in range(30)]  # 30 students, another item
    alone = _index(here)
    assert alone.judge(alone.similar_pairs(0.25)[0], 0.5).flagged
    students = sorted(here)
    common = ItemIndex(students, [fingerprints(here[s], CODE) for s in students], here.__getitem__, CODE,
                       frequency=class_frequency(elsewhere + [[fingerprints(canonical, CODE).hashes]] * 2))
    assert common.similar_pairs(0.01) == []
    hashes, counts = class_frequency([[np.array([3, 1], dtype=np.uint64), np.array([1], dtype=np.uint64)],
                                      [np.array([1, 2], dtype=np.uint64)], []])
    assert hashes.tolist() == [1, 2, 3] and counts.tolist() == [2, 1, 1]


def test_line_endings_and_letters_are_read_as_python_reads_them():
    """A copy written with lone carriage returns behind a leading comment (Python ends a line at
    each), or with its attributes in letters NFKC folds to ASCII (``x.𝗌𝗈𝖿𝗍𝗆𝖺𝗑`` is ``x.softmax``
    to Python), reads as the answer it is."""
    answer = "def f(x):\n    s = x @ x.transpose(-2, -1)\n    return s.softmax(-1)\n"
    assert code_tokens("# my own work\r" + answer.replace("\n", "\r")).words == code_tokens(answer).words
    assert code_tokens(answer.replace("\n", "\r\n")).words == code_tokens(answer).words
    folded = answer.replace("softmax", "\U0001d5cc\U0001d5c8\U0001d5bf\U0001d5cd\U0001d5c6\U0001d5ba\U0001d5d1")
    assert code_tokens(folded).words == code_tokens(answer).words
    tokens = code_tokens("# c\rx = 1\r")  # the spans still point into the answer as written
    assert tokens.words[:3] == ["V", "=", "N"] and [tokens.source[a:b] for a, b in tokens.spans[:3]] == ["x", "=", "1"]


def test_branches_that_never_run_are_no_tokens():
    """``if False:``, ``if 0:``, ``while False:`` (and the dead side of ``if True:``) add nothing:
    an answer with one after every line reads as the answer; a live ``else`` is kept as code."""
    answer = "def f(x):\n    s = x @ x.transpose(-2, -1)\n    w = s.softmax(-1)\n    return w @ x\n"
    padded = ("def f(x):\n    if False: print('debug')\n    s = x @ x.transpose(-2, -1)\n    if 0:\n"
              "        pass\n    w = s.softmax(-1)\n    while False:\n        print(w)\n    return w @ x\n"
              "    if None: x = 1\n")
    assert words(padded) == words(answer)
    assert words("if False:\n    x = 1\nelse:\n    y = x.sum()\n") == words("y = x.sum()\n")
    assert words("if True:\n    y = x.sum()\nelse:\n    x = 1\n") == words("y = x.sum()\n")
    assert words("if 0:\n    x = 1\nelif x:\n    y = x.sum()\n") == words("if x:\n    y = x.sum()\n")
    assert words("if x:\n    y = 1\n") != words("")  # a branch that may run stays
    tokens = code_tokens(padded)  # the spans still point into the answer as written
    assert [tokens.source[a:b] for a, b in tokens.spans[:3]] == ["def", "f", "("]


def test_helper_functions_are_read_where_they_are_called():
    """A helper defined in the cell and called by the answer reads as its body at the call: the
    answer split into helpers is the answer."""
    whole = ("def f(q, k):\n    d = q.shape[-1]\n    s = q @ k.transpose(-2, -1)\n    s = s / d ** 0.5\n"
             "    return s.softmax(-1)\n")
    split = ("def _scores(q, k):\n    d = q.shape[-1]\n    s = q @ k.transpose(-2, -1)\n    return s / d ** 0.5\n\n\n"
             "def f(q, k):\n    s = _scores(q, k)\n    return s.softmax(-1)\n")
    assert words(split) == words(whole)
    # a function only called at the top level (a test of the answer) is not read into that call
    assert words(whole + "print(f(1, 2))\n")[:len(words(whole))] == words(whole)
    recursive = "def g(n):\n    return g(n - 1) if n else 0\n"
    assert words(recursive)  # read, not inlined forever


@pytest.mark.parametrize("ring, size", [(6, 44), (60, 200)])
def test_a_ring_that_handed_in_the_same_long_answer_is_flagged_however_many(ring, size):
    """``ring`` students of ``size`` hold every fingerprint of one long answer (more than the common
    limit hold each): every pair of them is flagged, one group; students who share a short common
    line with them, or with each other, are not."""
    rng = random.Random(ring)
    vocabulary = [f"t{i}" for i in range(300)]
    generic = [rng.choice(vocabulary) for _ in range(14)]  # a line most of the class writes
    shared = [rng.choice(vocabulary) for _ in range(150)]
    answers = {f"s{i:03d}": [rng.choice(vocabulary) for _ in range(60)] + generic
               + [rng.choice(vocabulary) for _ in range(60)] for i in range(size - ring)}
    answers.update({f"r{i:02d}": shared + generic for i in range(ring)})
    index = _index(answers)
    assert index.common < ring
    pairs = [index.judge(p, 0.5) for p in index.similar_pairs(0.25)]
    members = sorted(s for s in answers if s.startswith("r"))
    assert {(p.a, p.b) for p in pairs if p.flagged} == {(a, b) for a in members for b in members if a < b}
    assert all(p.similarity > 0.9 for p in pairs if p.flagged)
    assert clusters(pairs) == [members]
