"""Check specs for notebook 07 (BERT): bpe_train, bpe_encode, mask_tokens,
make_nsp_input, BertEmbeddings, mlm_loss and NSPHead, with their mistake catalogues.

``mask_tokens`` is random, so its checks are statistical: on a large batch drawn with
a fixed seed, the measured rates must lie within tolerances that a correct
implementation meets with overwhelming probability (every tolerance is more than
eight standard deviations wide), whatever random numbers it draws.

Every random input is drawn from a salted seed (:func:`~course_lib.grading.judge.properties.seed`):
in a notebook (salt 0) the inputs are those students see; when a submission is graded
they cannot be known in advance. Student-side code (``invoke``, the probes, the
catalogued wrong variants) uses torch only, never a reference of this notebook.
"""

from __future__ import annotations

import random
from collections import Counter
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from ... import bert as ref
from ... import bpe as ref_bpe
from ..judge.properties import (call_and_inspect, compare_cases, dtype_name, generator, ignored_get_no_gradient, layout,
                          module_case, parameter_shapes, randn, reproducible, type_name, variant)
from ..judge.properties import seed as salted_seed
from ..answer.calls import Invoke
from ..judge.spec import Case, CheckFailed, ItemSpec, Mistake, SubCheck

f32, f64 = torch.float32, torch.float64


# ---------------------------------------------------------------------------
# bpe_train
# ---------------------------------------------------------------------------


def _train_case(word_counts: dict[str, int], num_merges: int, label: str = "") -> Case:
    words = ", ".join(f"{w!r}: {c}" for w, c in list(word_counts.items())[:6])
    more = ", ..." if len(word_counts) > 6 else ""
    text = label or f"word_counts = {{{words}{more}}}, num_merges = {num_merges}"
    return Case(text, lambda device: {"word_counts": dict(word_counts), "num_merges": num_merges})


def _random_word_counts(seed: int, n_words: int, alphabet: str, salt: bool = True) -> dict[str, int]:
    """Random words and counts from the salted ``seed`` (call it while a check runs), or
    from ``seed`` itself when not ``salt``."""
    rng = random.Random(salted_seed(seed) if salt else seed)
    out: dict[str, int] = {}
    while len(out) < n_words:
        word = "".join(rng.choice(alphabet) for _ in range(rng.randint(2, 7)))
        out[word] = rng.randint(1, 9)
    return out


def _pairs(words: dict[tuple[str, ...], int], weighted: bool = True) -> dict:
    counts: dict = {}
    for symbols, count in words.items():
        for pair in zip(symbols, symbols[1:]):
            counts[pair] = counts.get(pair, 0) + (count if weighted else 1)
    return counts


def _merge(symbols: tuple[str, ...], pair: tuple[str, str]) -> tuple[str, ...]:
    out, i = [], 0
    while i < len(symbols):
        if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == pair:
            out.append(symbols[i] + symbols[i + 1])
            i += 2
        else:
            out.append(symbols[i])
            i += 1
    return tuple(out)


def _train_loop(word_counts, num_merges, choose=None, weighted=True, end_symbol=None):
    """BPE training with ``choose(counts)`` picking the pair (default: the most frequent, ties to the
    smallest), pairs counted per word (unless ``weighted``), an ``end_symbol`` on every word."""
    choose = choose or _smallest_of_best
    words: dict[tuple[str, ...], int] = {}
    for word, count in word_counts.items():
        symbols = tuple(word) + ((end_symbol,) if end_symbol else ())
        words[symbols] = words.get(symbols, 0) + count
    merges = []
    for _ in range(num_merges):
        counts = _pairs(words, weighted)
        if not counts:
            break
        pair = choose(counts)
        merges.append(pair)
        new: dict = {}
        for symbols, count in words.items():
            merged = _merge(symbols, pair)
            new[merged] = new.get(merged, 0) + count
        words = new
    return merges


def _smallest_of_best(counts):
    best = max(counts.values())
    return min(p for p, c in counts.items() if c == best)


def bpe_train_counted_once(word_counts, num_merges):
    words = {tuple(w): c for w, c in word_counts.items()}
    counts = _pairs(words)
    return sorted(counts, key=lambda p: (-counts[p], p))[:num_merges]


TIES_HINT = ("Ties are broken the wrong way: among pairs with the same count take the lexicographically "
             "smallest pair, e.g. min(p for p, c in counts.items() if c == best).")
BPE_TRAIN_MISTAKES = (
    Mistake("ties to the largest pair", partial(_train_loop, choose=lambda c: max(c, key=lambda p: (c[p], p))), TIES_HINT),
    Mistake("ties to the first pair seen", partial(_train_loop, choose=lambda c: Counter(c).most_common(1)[0][0]), TIES_HINT),
    Mistake("word frequencies ignored", partial(_train_loop, weighted=False),
            "Pairs are counted once per distinct word: add each word's count to the count of every pair in it."),
    Mistake("end-of-word symbol", partial(_train_loop, end_symbol="</w>"),
            "Your merges involve an end-of-word symbol: here words start as their characters only, with no '</w>'."),
    Mistake("pairs counted once", bpe_train_counted_once,
            "The pair counts are computed only once: after every merge, merge the pair inside every word and "
            "count the pairs again."),
)

SENNRICH = {"low": 5, "lower": 2, "newest": 6, "widest": 3}


def _bpe_train_random(trial) -> None:
    """Random vocabularies (drawn from the salted seeds when the check runs, so that the
    labels show the words actually used), more merges than possible, no merge at all."""
    trial.compare([_train_case(_random_word_counts(1, 30, "abcde"), 25),
                   _train_case(_random_word_counts(2, 12, "abcdefgh"), 40),
                   _train_case({"hello": 3, "help": 2}, 0),
                   _train_case({"aa": 1, "a": 7}, 5)])


def _bpe_train_spec() -> ItemSpec:
    return ItemSpec(
        name="bpe_train", reference=ref_bpe.bpe_train, mistakes=BPE_TRAIN_MISTAKES,
        subchecks=(
            # (the notebook's example is public: with it, a vocabulary the student has not seen)
            SubCheck("the low/lower/newest/widest example, 6 merges, and a fresh vocabulary", 1,
                     lambda t: t.compare([_train_case(SENNRICH, 6), _train_case(_random_word_counts(5, 8, "abcdef"), 6)])),
            SubCheck("ties go to the lexicographically smallest pair (also in a fresh vocabulary)", 1,
                     lambda t: t.compare([_train_case({"cd": 1, "ab": 1, "ef": 1}, 2),
                                          _train_case({"xyz": 2, "abc": 2}, 3),
                                          _train_case(dict.fromkeys(_random_word_counts(6, 6, "abcdefgh"), 1), 4)])),
            SubCheck("word frequencies count (a frequent word beats many rare ones)", 1,
                     compare_cases(_train_case({"ab": 1, "abx": 1, "aby": 1, "cd": 5}, 1),
                                   _train_case({"aaaa": 3, "ab": 4}, 3)), hidden=True),
            SubCheck("random vocabularies, more merges than possible, no merge at all", 1,
                     _bpe_train_random, hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# bpe_encode
# ---------------------------------------------------------------------------

HAND_MERGES = [("u", "n"), ("r", "e"), ("a", "t"), ("e", "d"), ("at", "ed"), ("l", "ated"),
               ("re", "lated"), ("d", "o")]


def _encode_case(word: str, merges: list[tuple[str, str]], name: str = "") -> Case:
    label = f"word = {word!r}, merges = {name or merges}"
    return Case(label, lambda device: {"word": word, "merges": list(merges)})


def bpe_encode_leftmost(word, merges):
    rank = {tuple(m): i for i, m in enumerate(merges)}
    symbols = tuple(word)
    while True:
        for i, pair in enumerate(zip(symbols, symbols[1:])):
            if pair in rank:
                symbols = symbols[:i] + (pair[0] + pair[1],) + symbols[i + 2:]
                break
        else:
            return list(symbols)


def bpe_encode_reversed(word, merges):
    symbols = tuple(word)
    for pair in reversed(list(merges)):
        symbols = _merge(symbols, tuple(pair))
    return list(symbols)


def bpe_encode_longest_first(word, merges):
    rank = {tuple(m): i for i, m in enumerate(merges)}
    symbols = tuple(word)
    while True:
        found = [(-len(p[0] + p[1]), rank[p], p) for p in zip(symbols, symbols[1:]) if p in rank]
        if not found:
            return list(symbols)
        symbols = _merge(symbols, min(found)[2])


def bpe_encode_first_occurrence(word, merges):
    symbols = list(word)
    for pair in merges:
        for i in range(len(symbols) - 1):
            if (symbols[i], symbols[i + 1]) == tuple(pair):
                symbols[i: i + 2] = [symbols[i] + symbols[i + 1]]
                break
    return symbols


ORDER_HINT = ("Merges are applied out of priority order: at each step apply the applicable merge that was "
              "learned first (lowest index in merges), wherever it is in the word, then look again.")
BPE_ENCODE_MISTAKES = (
    Mistake("leftmost pair first", bpe_encode_leftmost, ORDER_HINT),
    Mistake("last merge first", bpe_encode_reversed, ORDER_HINT),
    Mistake("longest merge first", bpe_encode_longest_first, ORDER_HINT),
    Mistake("first occurrence only", bpe_encode_first_occurrence,
            "Only the first occurrence of a pair is merged: merge every occurrence of the pair in the word."),
)


def _bpe_encode_random(trial) -> None:
    """12 random words (drawn from the salted seed when the check runs, so that the labels
    show the words used) and 'cfac', 'dfbadf', 'caea', encoded with 30 merges that the reference
    learns here (grader side) on a fixed random vocabulary; a single letter; no merges.

    The merges are not salted: with them the hand-picked words 'cfac' and 'dfbadf' show
    "longest merge first" and "first occurrence only", and 'caea' shows "leftmost pair
    first" and "last merge first" (with merges learned on a salted vocabulary, "longest
    merge first" would go unnoticed for most salts; the 12 salted words alone miss
    "leftmost pair first" for some salts)."""
    learned = ref_bpe.bpe_train(_random_word_counts(3, 40, "abcdef", salt=False), 30)
    rnd = random.Random(salted_seed(4))
    words = ["".join(rnd.choice("abcdef") for _ in range(rnd.randint(1, 9))) for _ in range(12)] + ["cfac", "dfbadf", "caea"]
    trial.compare([*(_encode_case(w, learned, "30 merges learned on random words") for w in words),
                   _encode_case("a", learned, "30 merges learned on random words"),
                   _encode_case("undo", [])])


def _fresh_encode_case() -> Case:
    """Merges the notebook never uses (learned by the reference on fixed random words), and a
    word of their letters drawn at each grading (the notebook's example is public: its
    answer could be typed in); the merges stay fixed, so that one word tells the ways of
    applying them apart as well at every grading as any other."""
    merges = ref_bpe.bpe_train(_random_word_counts(59, 12, "wxyz", salt=False), 6)
    rnd = random.Random(salted_seed(60))
    word = "".join(rnd.choice("wxyz") for _ in range(8))
    return _encode_case(word, merges, "6 merges learned on random words")


def _bpe_encode_spec() -> ItemSpec:
    return ItemSpec(
        name="bpe_encode", reference=ref_bpe.bpe_encode, mistakes=BPE_ENCODE_MISTAKES,
        subchecks=(
            SubCheck("'unrelated' with the notebook's merges, and a fresh word with fresh merges", 1,
                     lambda t: t.compare([_encode_case("unrelated", HAND_MERGES, "the notebook's hand-made merges"),
                                          _fresh_encode_case()])),
            SubCheck("priority order: ('s','t') before ('e','s') on 'est'; a repeated pair in 'banana'", 1,
                     compare_cases(_encode_case("est", [("s", "t"), ("e", "s")]),
                                   _encode_case("test", [("e", "s"), ("s", "t"), ("es", "t"), ("t", "est")]),
                                   _encode_case("banana", [("a", "n"), ("b", "an"), ("an", "a")]),
                                   _encode_case("abcd", [("c", "d"), ("b", "c"), ("a", "b"), ("ab", "cd")])),
                     hidden=True),
            SubCheck("15 random words with 30 merges learned by bpe_train; single letters; no merges", 1,
                     _bpe_encode_random, hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# mask_tokens (statistical checks)
# ---------------------------------------------------------------------------

SPECIAL_IDS = (0, 1, 2, 3, 4)  # [PAD] [UNK] [CLS] [SEP] [MASK]
PAD_ID, CLS_ID, SEP_ID, MASK_ID = 0, 2, 3, 4


def _mask_batch(seed: int, B: int, T: int, vocab_size: int) -> torch.Tensor:
    """Ids with [CLS] first, [SEP] in the middle and at the end, [PAD] after it (drawn
    from the salted ``seed``)."""
    g = generator(seed)
    ids = torch.randint(5, vocab_size, (B, T), generator=g)
    lengths = torch.randint(T // 2, T + 1, (B,), generator=g)
    for b, n in enumerate(lengths.tolist()):
        ids[b, 0] = CLS_ID
        ids[b, n // 2] = SEP_ID
        ids[b, n - 1] = SEP_ID
        ids[b, n:] = PAD_ID
    return ids


SPECIAL_HINT = ("Special tokens were selected: positions whose id is in special_ids ([CLS], [SEP], [PAD], ...) "
                "must never be selected, masked or labelled.")
SPLIT_HINT = ("The 80/10/10 split is wrong: of the selected tokens about 80% must become mask_id, 10% a random "
              "id drawn from range(vocab_size), and 10% keep their original id.")
UNSELECTED_HINT = ("Labels are set at positions that were not selected: labels must be -100 everywhere except at "
                   "the selected positions.")
CORRUPTED_LABEL_HINT = ("The labels hold the corrupted ids ([MASK] or the random token): they must hold the "
                        "original ids of the selected tokens.")
PROBABILITY_HINT = "mlm_probability is not used: select each non-special token with probability mlm_probability."
GENERATOR_HINT = ("The result does not follow `generator`: pass generator=generator to every random draw "
                  "(torch.rand, torch.bernoulli, torch.randint), so that the same seed gives the same masking.")


def _run_mask(trial, ids, vocab_size, p, seed, label):
    original = ids.clone()
    kwargs = {"input_ids": ids, "vocab_size": vocab_size, "mask_id": MASK_ID, "special_ids": list(SPECIAL_IDS),
              "mlm_probability": p, "generator": generator(seed)}
    out, after = call_and_inspect(trial, kwargs, ["input_ids"], label)
    after = after.get("input_ids")
    modified = not (isinstance(after, torch.Tensor) and after.shape == original.shape
                    and torch.equal(after.to(original.device), original))
    if not isinstance(out, tuple) or len(out) != 2:
        raise CheckFailed(f"On {label}: mask_tokens should return a tuple (masked_ids, labels), "
                          f"got {type_name(out)}.")
    masked, labels = out
    for name, t in (("masked_ids", masked), ("labels", labels)):
        if not isinstance(t, torch.Tensor) or t.shape != original.shape or t.dtype != torch.long:
            what = (f"{type_name(t)}" if not isinstance(t, torch.Tensor)
                    else f"shape {tuple(t.shape)}, dtype {dtype_name(t.dtype)}")
            raise CheckFailed(f"On {label}: {name} should be a LongTensor of shape {tuple(original.shape)} "
                              f"like input_ids; got {what}.")
    if modified:
        raise CheckFailed(f"On {label}: mask_tokens modified input_ids in place; work on a copy (input_ids.clone()).")
    return original, masked.cpu(), labels.cpu()


def _mask_label(B, T, V, p):
    return f"input_ids ({B}, {T}) with [CLS], [SEP] and [PAD], vocab_size = {V}, mlm_probability = {p}"


def _mask_consistency(trial) -> None:
    B, T, V, p = 8, 40, 100, 0.15
    label = _mask_label(B, T, V, p)
    ids, masked, labels = _run_mask(trial, _mask_batch(500, B, T, V).to(trial.device), V, p, 0, label)
    ids = ids.cpu()
    special = torch.isin(ids, torch.tensor(SPECIAL_IDS))
    selected = labels != -100
    if not selected.any():
        raise CheckFailed(f"On {label}: every label is -100, so no token was selected for prediction.")
    if selected.float().mean() > 0.6:
        raise trial.failed(f"On {label}: {selected.float().mean():.0%} of the labels are not -100.", UNSELECTED_HINT)
    wrong = selected & (labels != ids)
    if wrong.any():
        hint = CORRUPTED_LABEL_HINT if bool((labels[wrong] == masked[wrong]).all()) else ""
        raise trial.failed(f"On {label}: at selected positions the labels should be the original ids; "
                           f"{int(wrong.sum())} are not.", hint)
    changed = (masked != ids) & ~selected
    if changed.any():
        hint = SPECIAL_HINT if bool(special[changed].all()) else ""
        raise trial.failed(f"On {label}: {int(changed.sum())} tokens were changed at positions whose label is -100; "
                           "only selected positions may be corrupted.", hint)


def _mask_specials(trial) -> None:
    B, T, V, p = 64, 40, 100, 0.5
    label = _mask_label(B, T, V, p)
    ids, masked, labels = _run_mask(trial, _mask_batch(501, B, T, V).to(trial.device), V, p, 1, label)
    special = torch.isin(ids.cpu(), torch.tensor(SPECIAL_IDS))
    if (labels[special] != -100).any() or (masked[special] != ids.cpu()[special]).any():
        raise trial.failed(f"On {label}: special tokens were selected.", SPECIAL_HINT)


def _rates(trial, p, V, seed, B=400, T=500):
    label = _mask_label(B, T, V, p)
    ids, masked, labels = _run_mask(trial, _mask_batch(502 + seed, B, T, V).to(trial.device), V, p, seed, label)
    ids = ids.cpu()
    special = torch.isin(ids, torch.tensor(SPECIAL_IDS))
    selected = labels != -100
    if (selected & special).any():
        raise trial.failed(f"On {label}: special tokens were selected.", SPECIAL_HINT)
    n_sel = int(selected.sum())
    rate = n_sel / int((~special).sum())
    if n_sel == 0:
        raise CheckFailed(f"On {label}: no token was selected.")
    frac_mask = float((masked[selected] == MASK_ID).float().mean())
    frac_same = float((masked[selected] == ids[selected]).float().mean())
    frac_random = 1.0 - frac_mask - frac_same
    return label, rate, frac_mask, frac_random, frac_same, masked[selected & (masked != ids) & (masked != MASK_ID)]


def _mask_statistics(trial) -> None:
    V, p = 1000, 0.15
    label, rate, fm, fr, fs, _ = _rates(trial, p, V, 0)
    if not abs(rate - p) <= 0.01:
        msg = f"On {label}: {rate:.1%} of the non-special tokens were selected, expected {p:.0%} ± 1%."
        raise trial.failed(msg, UNSELECTED_HINT if rate > 0.5 else None)
    if not (abs(fm - 0.8) <= 0.02 and abs(fr - 0.1) <= 0.02 and abs(fs - 0.1) <= 0.02):
        raise trial.failed(f"On {label}: of the selected tokens {fm:.1%} became [MASK], {fr:.1%} a random token and "
                           f"{fs:.1%} stayed unchanged; expected 80%, 10%, 10% (± 2%).", SPLIT_HINT)


def _mask_probability_and_randomness(trial) -> None:
    V, p = 50, 0.3
    label, rate, fm, fr, fs, random_ids = _rates(trial, p, V, 7, B=200, T=500)
    if not abs(rate - p) <= 0.015:
        hint = PROBABILITY_HINT if abs(rate - 0.15) < 0.015 else ""
        raise trial.failed(f"On {label}: {rate:.1%} of the non-special tokens were selected, expected {p:.0%} ± 1.5%.",
                           hint)
    if random_ids.numel() and (random_ids.min() < 0 or random_ids.max() >= V):
        raise CheckFailed(f"On {label}: random replacement ids must lie in range(vocab_size) = range({V}).")
    seen = set(random_ids.tolist())
    if len(seen) < V - 5:
        raise CheckFailed(f"On {label}: the random replacements use only {len(seen)} different ids out of {V}; "
                          "draw them uniformly from range(vocab_size) (torch.randint).")
    B, T = 4, 30
    small = _mask_label(B, T, 100, 0.15)
    reproducible(trial, lambda: _run_mask(trial, _mask_batch(503, B, T, 100).to(trial.device), 100, 0.15, 11, small)[1:],
                 small, "results", GENERATOR_HINT)


def _masker(select_special=False, split=(0.8, 0.1), labels_everywhere=False, corrupted_labels=False,
            fixed_p=None, ignore_generator=False):
    """A wrong variant of mask_tokens, written out for the catalogue."""

    def mask_tokens(input_ids, vocab_size, mask_id, special_ids, mlm_probability=0.15, generator=None):
        g = None if ignore_generator else generator
        p = fixed_p if fixed_p is not None else mlm_probability
        special = torch.zeros_like(input_ids, dtype=torch.bool)
        if not select_special:
            for s in special_ids:
                special |= input_ids == s
        selected = (torch.rand(input_ids.shape, generator=g).to(input_ids.device) < p) & ~special
        u = torch.rand(input_ids.shape, generator=g).to(input_ids.device)
        to_mask = selected & (u < split[0])
        to_random = selected & (u >= split[0]) & (u < split[0] + split[1])
        masked = input_ids.clone()
        masked[to_mask] = mask_id
        masked[to_random] = torch.randint(vocab_size, input_ids.shape, generator=g).to(input_ids.device)[to_random]
        if labels_everywhere:
            labels = input_ids.clone()
        elif corrupted_labels:
            labels = torch.where(selected, masked, torch.full_like(input_ids, -100))
        else:
            labels = torch.where(selected, input_ids, torch.full_like(input_ids, -100))
        return masked, labels

    return mask_tokens


MASK_MISTAKES = (
    Mistake("special tokens selected", _masker(select_special=True), SPECIAL_HINT),
    Mistake("every selected token masked", _masker(split=(1.0, 0.0)), SPLIT_HINT),
    Mistake("80/20/0 split", _masker(split=(0.8, 0.2)), SPLIT_HINT),
    Mistake("10/10/80 split", _masker(split=(0.1, 0.1)), SPLIT_HINT),
    Mistake("labels on unselected positions", _masker(labels_everywhere=True), UNSELECTED_HINT),
    Mistake("labels hold the corrupted ids", _masker(corrupted_labels=True), CORRUPTED_LABEL_HINT),
    Mistake("mlm_probability ignored", _masker(fixed_p=0.15), PROBABILITY_HINT),
    Mistake("generator ignored", _masker(ignore_generator=True), GENERATOR_HINT),
)


def _mask_spec() -> ItemSpec:
    return ItemSpec(
        name="mask_tokens", reference=ref.mask_tokens, mistakes=MASK_MISTAKES, output_names=("masked_ids", "labels"),
        subchecks=(
            SubCheck("returns (masked_ids, labels); labels are the original ids where selected, -100 elsewhere; "
                     "only selected tokens change", 1, _mask_consistency),
            SubCheck("special tokens are never selected", 1, _mask_specials),
            SubCheck("on 200 000 tokens: 15% ± 1% selected; of those 80/10/10 (± 2%) masked/random/unchanged",
                     2, _mask_statistics, hidden=True),
            SubCheck("mlm_probability = 0.3 is respected; random ids cover the vocabulary; the generator makes "
                     "it reproducible", 1, _mask_probability_and_randomness, hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# make_nsp_input
# ---------------------------------------------------------------------------

def _nsp_input_case(a: list[int], b: list[int], cls_id: int = 2, sep_id: int = 3) -> Case:
    return Case(f"tokens_a = {a}, tokens_b = {b}, cls_id = {cls_id}, sep_id = {sep_id}",
                lambda device: {"tokens_a": list(a), "tokens_b": list(b), "cls_id": cls_id, "sep_id": sep_id})


def _fresh_nsp_input_case() -> Case:
    """Sentences and special ids no notebook shows, drawn at each grading (call it while a check runs)."""
    rnd = random.Random(salted_seed(61))
    a = [rnd.randint(20, 99) for _ in range(rnd.randint(1, 5))]
    b = [rnd.randint(20, 99) for _ in range(rnd.randint(1, 5))]
    return _nsp_input_case(a, b, cls_id=rnd.randint(4, 9), sep_id=rnd.randint(10, 19))


def _nsp_build(a, b, cls_id, sep_id, seg_a_end, seg_b_end, final_sep=True):
    ids = [cls_id, *a, sep_id, *b] + ([sep_id] if final_sep else [])
    seg = [0] * (len(a) + 1) + [seg_a_end] + [1] * len(b) + ([seg_b_end] if final_sep else [])
    return torch.tensor(ids, dtype=torch.long), torch.tensor(seg, dtype=torch.long)


def _nsp(seg_a_end=0, seg_b_end=1, final_sep=True, swapped=False):
    """A wrong BERT input: the [SEP]s in the wrong segments, no final [SEP], the segments swapped."""

    def make_nsp_input(tokens_a, tokens_b, cls_id, sep_id):
        ids, seg = _nsp_build(list(tokens_a), list(tokens_b), cls_id, sep_id, seg_a_end, seg_b_end, final_sep)
        return ids, (1 - seg if swapped else seg)

    return make_nsp_input


SEP_HINT = ("Segment ids are wrong around [SEP]: the first [SEP] closes sentence A and belongs to segment 0; "
            "the last [SEP] closes B and belongs to segment 1.")
NSP_INPUT_MISTAKES = (
    Mistake("first [SEP] in segment 1", _nsp(seg_a_end=1), SEP_HINT),
    Mistake("last [SEP] in segment 0", _nsp(seg_b_end=0), SEP_HINT),
    Mistake("no final [SEP]", _nsp(final_sep=False), "The input must end with a [SEP] after B: [CLS] A [SEP] B [SEP]."),
    Mistake("segments swapped", _nsp(swapped=True),
            "The segments are swapped: [CLS], A and the first [SEP] are segment 0; B and the last [SEP] segment 1."),
)


def _nsp_input_spec() -> ItemSpec:
    return ItemSpec(
        name="make_nsp_input", reference=ref.make_nsp_input, mistakes=NSP_INPUT_MISTAKES,
        output_names=("input_ids", "segment_ids"),
        subchecks=(
            SubCheck("[CLS] 10 11 [SEP] 12 13 14 [SEP], and fresh sentences", 1,
                     lambda t: t.compare([_nsp_input_case([10, 11], [12, 13, 14]), _fresh_nsp_input_case()])),
            SubCheck("other lengths (one-token sentences, long sentences) and other special ids", 1,
                     compare_cases(_nsp_input_case([7], [8]), _nsp_input_case(list(range(20, 35)), [40, 41]),
                                   _nsp_input_case([5, 6, 7], list(range(50, 62)), cls_id=101, sep_id=102)),
                     hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# BertEmbeddings
# ---------------------------------------------------------------------------

def _emb_norm(module: nn.Module) -> None:
    """``adjust``: non-trivial LayerNorm parameters."""
    module.norm.weight.uniform_(0.5, 1.5)
    module.norm.bias.uniform_(-0.5, 0.5)


def _emb_case(seed: int, B: int, T: int, vocab: int, d: int, max_len: int, dtype: torch.dtype) -> Case:
    def inputs(device: torch.device) -> dict:
        g = generator(seed)
        ids = torch.randint(vocab, (B, T), generator=g)
        split = torch.randint(1, T, (B,), generator=g)
        return {"input_ids": ids.to(device), "segment_ids": (torch.arange(T)[None, :] >= split[:, None]).long().to(device)}

    dims = (vocab, d, max_len)
    return module_case(f"BertEmbeddings(vocab_size={vocab}, d_model={d}, max_len={max_len}) on ids ({B}, {T}) "
                       f"with two segments, {dtype_name(dtype)}", ref.BertEmbeddings, dims, 700 + sum(dims), dtype,
                       inputs, _emb_norm)


# The submodules BertEmbeddings must have, with the torch class each must be an instance of.
_EMB_PARTS = {"token": nn.Embedding, "position": nn.Embedding, "segment": nn.Embedding, "norm": nn.LayerNorm}


class _EmbLayout(nn.Module):
    def __init__(self, vocab_size, d_model, max_len, num_segments=2, dropout=0.0):
        super().__init__()
        self.token = nn.Embedding(vocab_size, d_model)
        self.position = nn.Embedding(max_len, d_model)
        self.segment = nn.Embedding(num_segments, d_model)
        self.norm = nn.LayerNorm(d_model)

    def run(self, input_ids, segment_ids, norm=True, segment=True, position=True, norm_token_only=False,
            eps=None):
        x = self.token(input_ids)
        if norm_token_only:
            x = self.norm(x)
        if position:
            x = x + self.position(torch.arange(input_ids.size(1), device=input_ids.device))
        if segment:
            x = x + self.segment(segment_ids)
        if eps is not None:  # the LayerNorm with another eps (Hugging Face's BERT: 1e-12)
            return F.layer_norm(x, x.shape[-1:], self.norm.weight, self.norm.bias, eps)
        return self.norm(x) if norm and not norm_token_only else x


EMB_MISTAKES = (
    Mistake("no LayerNorm", variant(_EmbLayout, "EmbNoNorm", norm=False),
            "The LayerNorm is missing: return self.norm(token + position + segment)."),
    Mistake("no segment embedding", variant(_EmbLayout, "EmbNoSegment", segment=False),
            "The segment embedding is not added: add self.segment(segment_ids)."),
    Mistake("no position embedding", variant(_EmbLayout, "EmbNoPosition", position=False),
            "The position embedding is not added: add self.position(torch.arange(T)) (positions 0..T-1)."),
    Mistake("LayerNorm on the token embedding only", variant(_EmbLayout, "EmbNormTokenOnly", norm_token_only=True),
            "The LayerNorm is applied to the token embedding alone: apply it to the sum of the three embeddings."),
    Mistake("LayerNorm eps 1e-12", variant(_EmbLayout, "EmbNormEps", eps=1e-12),
            "The LayerNorm uses eps=1e-12 (Hugging Face's BERT); the contract's norm is nn.LayerNorm(d_model), "
            "with its default eps=1e-5."),
)


def _emb_parameters(trial) -> None:
    built = layout(trial, (30, 8, 16), attrs=tuple(_EMB_PARTS), label="BertEmbeddings(30, 8, 16)")
    found, state = built.get("attrs") or {}, built.get("state") or {}

    def instance(name: str) -> bool:
        cls = _EMB_PARTS[name]
        info = found.get(name)
        return isinstance(info, dict) and f"{cls.__module__}.{cls.__qualname__}" in (info.get("torch") or [])

    expected = {"token": (30, 8), "position": (16, 8), "segment": (2, 8)}
    for name, shape in expected.items():
        if not instance(name) or state.get(f"{name}.weight") != shape:
            raise CheckFailed(f"BertEmbeddings(vocab_size=30, d_model=8, max_len=16) needs `self.{name}` = "
                              f"nn.Embedding with weight {shape}.")
    if not instance("norm"):
        raise CheckFailed("BertEmbeddings needs `self.norm` = nn.LayerNorm(d_model).")


def _emb_spec() -> ItemSpec:
    return ItemSpec(
        name="BertEmbeddings", reference=ref.BertEmbeddings,
        invoke=Invoke(module=True, forward=("input_ids", "segment_ids")), mistakes=EMB_MISTAKES,
        subchecks=(
            SubCheck("parameters token, position, segment (nn.Embedding) and norm (nn.LayerNorm)", 1, _emb_parameters),
            SubCheck("matches the reference (same weights) on a batch of two-segment inputs", 1,
                     compare_cases(_emb_case(710, 2, 7, 30, 8, 16, f32))),
            SubCheck("matches for other sizes, T = max_len, float64", 1,
                     compare_cases(_emb_case(720, 3, 16, 50, 12, 16, f64), _emb_case(730, 1, 3, 10, 4, 32, f32)),
                     hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# mlm_loss
# ---------------------------------------------------------------------------

def _loss_case(seed: int, B: int, T: int, V: int, dtype: torch.dtype, frac: float = 0.2) -> Case:
    def make(device: torch.device) -> dict:
        g = generator(seed)
        logits = torch.randn(B, T, V, generator=g, dtype=dtype) * 2
        labels = torch.randint(V, (B, T), generator=g)
        keep = torch.rand(B, T, generator=g) < frac
        keep.view(-1)[0] = True
        labels[~keep] = -100
        return {"logits": logits.to(device), "labels": labels.to(device)}

    return Case(f"logits ({B}, {T}, {V}) {dtype_name(dtype)}, labels with about {frac:.0%} of positions selected "
                "(-100 elsewhere)", make)


def mlm_loss_all_positions(logits, labels):
    ce = F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=-100,
                         reduction="sum")
    return ce / labels.numel()


def mlm_loss_sum(logits, labels):
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=-100,
                           reduction="sum")


def mlm_loss_ignored_as_zero(logits, labels):
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.clamp_min(0).reshape(-1))


def mlm_loss_probabilities(logits, labels):
    logp = torch.softmax(logits, -1).log_softmax(-1)
    return F.nll_loss(logp.reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=-100)


MLM_LOSS_MISTAKES = (
    Mistake("averaged over all positions", mlm_loss_all_positions,
            "The loss is averaged over all positions: average only over the positions whose label is not -100 "
            "(F.cross_entropy(..., ignore_index=-100) does this)."),
    Mistake("summed", mlm_loss_sum, "The loss is a sum: take the mean over the selected positions."),
    Mistake("-100 treated as token 0", mlm_loss_ignored_as_zero,
            "Positions labelled -100 are scored as if their label were token 0: leave them out of the loss "
            "(ignore_index=-100)."),
    Mistake("softmax applied twice", mlm_loss_probabilities,
            "The logits went through a softmax before the cross-entropy: F.cross_entropy expects raw logits."),
)


def _loss_shapes_and_ignored_gradients(trial) -> None:
    """mlm_loss matches on other shapes and float64, and positions labelled -100 get no gradient."""
    trial.compare([_loss_case(810, 4, 12, 30, f64, 0.5), _loss_case(811, 1, 5, 7, f32, 0.0)])
    ignored_get_no_gradient(_loss_case(820, 2, 6, 9, f64), lambda inputs: inputs["labels"] == -100,
                            "positions labelled -100")(trial)


def _mlm_loss_spec() -> ItemSpec:
    return ItemSpec(
        name="mlm_loss", reference=ref.mlm_loss, mistakes=MLM_LOSS_MISTAKES,
        subchecks=(
            SubCheck("matches the reference on a random batch", 1, compare_cases(_loss_case(800, 2, 8, 11, f32))),
            SubCheck("other shapes, float64, one selected position; gradients only at selected positions", 1,
                     _loss_shapes_and_ignored_gradients, hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# NSPHead
# ---------------------------------------------------------------------------

def _nsp_case(seed: int, B: int, T: int, d: int, dtype: torch.dtype) -> Case:
    return module_case(f"NSPHead(d_model={d}) on hidden ({B}, {T}, {d}) {dtype_name(dtype)}", ref.NSPHead, (d,), 900 + d,
                       dtype, lambda device: {"hidden": randn((B, T, d), seed, dtype, device)})


class _NSPLayout(nn.Module):
    def __init__(self, d_model):
        super().__init__()
        self.pooler = nn.Linear(d_model, d_model)
        self.classifier = nn.Linear(d_model, 2)

    def run(self, hidden, pool=lambda h: h[:, 0], tanh=True, probabilities=False):
        pooled = self.pooler(pool(hidden))
        logits = self.classifier(torch.tanh(pooled) if tanh else pooled)
        return torch.softmax(logits, dim=-1) if probabilities else logits


NSP_MISTAKES = (
    Mistake("pooled from the last position", variant(_NSPLayout, "NSPLastPosition", pool=lambda h: h[:, -1]),
            "NSP is pooled from the wrong position: read the [CLS] state at position 0, hidden[:, 0]."),
    Mistake("mean-pooled", variant(_NSPLayout, "NSPMeanPooled", pool=lambda h: h.mean(1)),
            "The head averages over all positions: BERT's NSP reads only the [CLS] state, hidden[:, 0]."),
    Mistake("no tanh", variant(_NSPLayout, "NSPNoTanh", tanh=False),
            "The pooler's tanh is missing: classifier(tanh(pooler(hidden[:, 0])))."),
    Mistake("probabilities returned", variant(_NSPLayout, "NSPProbabilities", probabilities=True),
            "You return probabilities: return the logits (no softmax); the cross-entropy applies it."),
)


def _nsp_spec() -> ItemSpec:
    return ItemSpec(
        name="NSPHead", reference=ref.NSPHead, invoke=Invoke(module=True, forward=("hidden",)), mistakes=NSP_MISTAKES,
        subchecks=(
            SubCheck("parameters pooler = nn.Linear(d, d) and classifier = nn.Linear(d, 2)", 1,
                     lambda t: parameter_shapes(t, (6,), {"pooler.weight": (6, 6), "pooler.bias": (6,),
                                                          "classifier.weight": (2, 6), "classifier.bias": (2,)},
                                                "NSPHead(d_model=6)", label="NSPHead(6)")),
            SubCheck("matches the reference (same weights) on a random batch", 1, compare_cases(_nsp_case(910, 3, 5, 8, f32))),
            SubCheck("other sizes, one-token sequences, float64", 1,
                     compare_cases(_nsp_case(920, 2, 9, 16, f64), _nsp_case(930, 4, 1, 4, f32)), hidden=True),
        ),
    )


SPECS = {
    spec.name: spec
    for spec in (_bpe_train_spec(), _bpe_encode_spec(), _mask_spec(), _nsp_input_spec(), _emb_spec(),
                 _mlm_loss_spec(), _nsp_spec())
}
