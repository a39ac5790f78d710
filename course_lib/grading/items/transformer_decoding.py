"""Check specs for notebook 06's decoding and evaluation: greedy_decode and (corpus) bleu,
with their mistake catalogues."""

from __future__ import annotations

import math
import random
from collections import Counter
from functools import partial

import torch

from ... import decoding as ref
from ... import transformer as ref_transformer
from ... import bleu as bleu_ref
from ..judge.compare import fmt_num
from ..judge.properties import compare_cases, generator, padding, reference_state
from ..judge.properties import seed as salted_seed
from ..judge.spec import Case, CheckFailed, ItemSpec, Mistake, SubCheck
from ..answer.wire import Build

_FIXTURES = "course_lib.grading.answer.fixtures.transformer"  # Build targets (student side)

# ---------------------------------------------------------------------------
# greedy_decode
# ---------------------------------------------------------------------------

_TRANSFORMER_ARGS = (12, 16, 2, 1, 1, 32)  # vocab, d_model, heads, encoder layers, decoder layers, d_ff


def _transformer_model(seed: int, device: torch.device) -> Build:
    """A small random Transformer: the reference's initialisation (grader side), run by a
    :class:`PlainTransformer` on the student's side."""
    state = reference_state(ref_transformer.Transformer, (*_TRANSFORMER_ARGS, 0.0), seed)
    state["out_bias"][2] = 1.5  # EOS likely enough that some sentences end early
    state = {k.replace(".gamma", ".weight").replace(".beta", ".bias"): v for k, v in state.items()}
    return Build(f"{_FIXTURES}:PlainTransformer", _TRANSFORMER_ARGS, state=state, device=str(device), train=False)


def _greedy_case(kind: str, lengths: list[int], S: int, max_len: int, seed: int) -> Case:
    def make(device):
        g = generator(seed)
        src = torch.randint(3, 12, (len(lengths), S), generator=g).to(device)
        mask = padding(lengths, S, device)
        model = (Build(f"{_FIXTURES}:ScriptedModel", device=str(device), train=False) if kind == "scripted"
                 else _transformer_model(seed, device))
        return {"model": model, "src": src, "src_mask": mask, "bos_id": 1, "eos_id": 2, "max_len": max_len}

    what = ("a scripted model (sentence b predicts <eos> after as many tokens as its source has)" if kind == "scripted"
            else "a small random Transformer")
    return Case(f"{what}, src ({len(lengths)}, {S}) with lengths {lengths}, bos_id=1, eos_id=2, max_len={max_len}",
                make)


def _greedy(bos_column=True, fill_after_eos=True, whole_prefix=True, extra=0, batch_stop=False):
    """A wrong greedy loop: without the <bos> column, keeping predictions after <eos>, feeding
    only the last token, ``extra`` tokens too many, or stopping at the batch's first <eos>."""

    def greedy(model, src, src_mask, bos_id, eos_id, max_len):
        memory = model.encode(src, src_mask)
        ys = torch.full((src.size(0), 1), bos_id, dtype=torch.long, device=src.device)
        done = torch.zeros(src.size(0), dtype=torch.bool, device=src.device)
        while ys.size(1) < max_len + extra and not bool(done.all()):
            nxt = model.decode(ys if whole_prefix else ys[:, -1:], memory, src_mask)[:, -1].argmax(-1)
            if fill_after_eos:
                nxt = torch.where(done, torch.full_like(nxt, eos_id), nxt)
            ys = torch.cat([ys, nxt[:, None]], 1)
            done |= nxt == eos_id
            if batch_stop and bool(done.any()):
                break
        return ys if bos_column else ys[:, 1:]

    return greedy


GREEDY_MISTAKES = (
    Mistake("no <bos> column", _greedy(bos_column=False),
            "The returned sequences lack the <bos> column: return the whole decoded tensor, starting with bos_id."),
    Mistake("tokens after <eos> not filled", _greedy(fill_after_eos=False),
            "After a sentence has produced <eos> you keep its later predictions: once finished, fill its remaining "
            "positions with eos_id (torch.where(done, eos_id, next_token))."),
    Mistake("only the last token fed", _greedy(whole_prefix=False),
            "You feed only the last token to model.decode: the decoder needs the whole prefix so far "
            "(model.decode(ys, memory, src_mask)), then take the logits of the last position."),
    Mistake("max_len new tokens", _greedy(extra=1),
            "Your output can be one token too long: max_len counts the <bos> column, so stop when "
            "ys.size(1) == max_len."),
    Mistake("stops at the first <eos> of the batch", _greedy(fill_after_eos=False, batch_stop=True),
            "Decoding stops as soon as one sentence of the batch has finished: keep going until every sentence "
            "has produced <eos> (or max_len is reached)."),
)


def _greedy_int(trial) -> None:
    case = _greedy_case("scripted", [3, 5], 5, 10, 810)
    out = trial.student(case.make(trial.device), case.label)
    if not isinstance(out, torch.Tensor) or out.dtype != torch.long:
        what = out.dtype if isinstance(out, torch.Tensor) else type(out).__name__
        raise CheckFailed(f"greedy_decode should return a LongTensor (B, L), got {what}.")


def _greedy_spec() -> ItemSpec:
    return ItemSpec(
        name="greedy_decode", reference=ref.greedy_decode, mistakes=GREEDY_MISTAKES,
        forbidden={ref.beam_search: "it calls course_lib's beam_search; write the greedy loop yourself"},
        subchecks=(
            SubCheck("matches the reference on a scripted model (sentences of different lengths)", 1,
                     compare_cases(_greedy_case("scripted", [4, 2, 6], 6, 12, 800))),
            SubCheck("returns a LongTensor", 1, _greedy_int),
            SubCheck("max_len cuts sentences that have not ended; one-sentence batches", 1,
                     compare_cases(_greedy_case("scripted", [7, 5], 7, 5, 820), _greedy_case("scripted", [3], 3, 9, 830)),
                     hidden=True),
            SubCheck("matches the reference on small random Transformers", 1,
                     compare_cases(_greedy_case("transformer", [5, 3, 4, 2], 5, 9, 840),
                                   _greedy_case("transformer", [6, 6], 6, 7, 850)), hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# bleu
# ---------------------------------------------------------------------------

def _grams(tokens, n):
    return Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


def _bleu_core(candidates, references, max_n=4, clip=True, bp=True, geometric=True, bp_inverted=False,
               smooth=None):
    """A wrong BLEU; ``smooth`` as sentence-level BLEU smooths zero counts: "epsilon" (NLTK's
    method1, 0.1 matches for a zero count) or "add-one" (Lin and Och, method2, for n > 1)."""
    matches, totals, c, r = [0] * max_n, [0] * max_n, 0, 0
    for cand, ref_ in zip(candidates, references):
        c += len(cand)
        r += len(ref_)
        for n in range(1, max_n + 1):
            cc, rc = _grams(cand, n), _grams(ref_, n)
            matches[n - 1] += sum((min(k, rc[g]) if clip else (k if g in rc else 0)) for g, k in cc.items())
            totals[n - 1] += max(len(cand) - n + 1, 0)
    if smooth == "epsilon":
        ps = [(m if m else 0.1) / t if t else 0.0 for m, t in zip(matches, totals)]
    elif smooth == "add-one":
        ps = [(m + (n > 0)) / (t + (n > 0)) if t + (n > 0) else 0.0 for n, (m, t) in enumerate(zip(matches, totals))]
    else:
        ps = [m / t if t else 0.0 for m, t in zip(matches, totals)]
    if c == 0 or min(ps) == 0:
        return 0.0
    mean = math.exp(sum(map(math.log, ps)) / max_n) if geometric else sum(ps) / max_n
    penalty = 1.0
    if bp and c < r:
        penalty = math.exp(1 - c / r) if bp_inverted else math.exp(1 - r / c)
    return penalty * mean


def _bleu_sentence_average(candidates, references, max_n=4, smooth=None):
    return sum(_bleu_core([c], [r], max_n, smooth=smooth) for c, r in zip(candidates, references)) / len(candidates)


def _bleu_concatenated(candidates, references, max_n=4):
    """The corpus joined into one long sentence (n-grams across sentence boundaries count)."""
    return _bleu_core([[w for c in candidates for w in c]], [[w for r in references for w in r]], max_n)


_SENTENCE_LEVEL = ("You average sentence-level scores: corpus BLEU pools the clipped n-gram counts and the lengths "
                   "over the whole corpus first, then computes one score.")

BLEU_MISTAKES = (
    Mistake("no clipping", partial(_bleu_core, clip=False),
            "Your n-gram counts are not clipped: a candidate n-gram counts at most as often as it occurs in the "
            "reference, min(count in candidate, count in reference) (\"the the the the\" must not score 1)."),
    Mistake("no brevity penalty", partial(_bleu_core, bp=False),
            "The brevity penalty is missing: when the candidates' total length c is shorter than the references' "
            "r, multiply by exp(1 − r/c)."),
    Mistake("brevity penalty inverted", partial(_bleu_core, bp_inverted=True),
            "The brevity penalty is exp(1 − r/c) (r: reference length, c: candidate length), not exp(1 − c/r)."),
    Mistake("arithmetic mean of precisions", partial(_bleu_core, geometric=False),
            "You average the n-gram precisions arithmetically: BLEU uses the geometric mean, exp(mean of log p_n)."),
    Mistake("average of sentence scores", _bleu_sentence_average,
            _SENTENCE_LEVEL),
    Mistake("average of smoothed sentence scores (ε)", partial(_bleu_sentence_average, smooth="epsilon"),
            _SENTENCE_LEVEL + " (Smoothing, as NLTK's sentence_bleu does, is not part of corpus BLEU either.)"),
    Mistake("average of smoothed sentence scores (add-one)", partial(_bleu_sentence_average, smooth="add-one"),
            _SENTENCE_LEVEL + " (Smoothing, as NLTK's sentence_bleu does, is not part of corpus BLEU either.)"),
    Mistake("the corpus joined into one sentence", _bleu_concatenated,
            "You join the corpus into one long sentence, so n-grams across sentence boundaries count: pool the "
            "clipped counts of each (candidate, reference) pair instead."),
)


def _bleu_corpus(seed: int, n_sent: int, short: bool = False, repeat: bool = False,
                 distinct: bool = False) -> tuple[list, list]:
    """A random corpus; with ``distinct`` no word twice in a sentence, so that no n-gram count
    needs clipping (the visible check leaves clipping to the hidden one)."""
    rng = random.Random(salted_seed(seed))
    words = "a b c d e f".split() if not distinct else "a b c d e f g h i j k l m n o p".split()
    cands, refs = [], []
    for _ in range(n_sent):
        if distinct:
            ref_ = rng.sample(words, rng.randint(7, 11))
            spare = [w for w in words if w not in ref_]
            rng.shuffle(spare)
            cand = [w if rng.random() < 0.85 or not spare else spare.pop() for w in ref_]
            refs.append(ref_)
            cands.append(cand)
            continue
        ref_ = [rng.choice(words) for _ in range(rng.randint(5, 10))]
        cand = [w if rng.random() < 0.75 else rng.choice(words) for w in ref_]
        if short:
            cand = cand[:max(4, len(cand) - rng.randint(1, 4))]
        elif rng.random() < 0.3:
            cand = cand + [rng.choice(words)]
        if repeat:
            cand = cand + [cand[0]] * 3
        cands.append(cand)
        refs.append(ref_)
    return cands, refs


def _bleu_case(label: str, cands: list, refs: list, max_n: int = 4) -> Case:
    return Case(label, lambda device: {"candidates": [list(c) for c in cands],
                                       "references": [list(r) for r in refs], "max_n": max_n})


def _bleu_random_case(label: str, seed: int, n_sent: int, short: bool = False, repeat: bool = False,
                      max_n: int = 4, distinct: bool = False) -> Case:
    """A random corpus drawn when the case is made (so that it follows the grading salt). Short
    candidates are drawn again where they share no ``max_n``-gram with their references: BLEU is 0
    then with or without the brevity penalty, which the case is there to check."""

    def make(device) -> dict:
        for attempt in range(100):
            cands, refs = _bleu_corpus(seed + 1000 * attempt, n_sent, short=short, repeat=repeat, distinct=distinct)
            if not short or bleu_ref.bleu(cands, refs, max_n) > 0:
                break
        return {"candidates": cands, "references": refs, "max_n": max_n}

    return Case(label, make)


HAND_CANDS = [["the", "cat", "sat", "on", "the", "mat"], ["a", "dog", "ran", "in", "the", "park"]]
HAND_REFS = [["the", "cat", "sat", "on", "the", "mat"], ["the", "dog", "ran", "in", "the", "big", "park"]]


def _bleu_range(trial) -> None:
    # and a sentence of this grading's own (distinct words: backwards it shares no 4-gram with itself)
    rng = random.Random(salted_seed(950))
    fresh = rng.sample("abcdefghijklmnopqrstuvwxyz", rng.randint(4, 9))
    for label, cands, refs, expected in (
        ("identical candidates and references", [["a", "b", "c", "d", "e"]], [["a", "b", "c", "d", "e"]], 1.0),
        ("no 4-gram in common", [["a", "b", "c", "d"]], [["d", "c", "b", "a"]], 0.0),
        (f"a fresh sentence {fresh} as its own reference", [fresh], [list(fresh)], 1.0),
        (f"a fresh sentence {fresh} against itself backwards", [fresh], [fresh[::-1]], 0.0),
    ):
        got = trial.student({"candidates": cands, "references": refs, "max_n": 4}, label)
        if not isinstance(got, (int, float)) or not abs(float(got) - expected) <= 1e-9:  # NaN fails
            raise CheckFailed(f"On {label}: expected {fmt_num(expected)}, got {got!r}. BLEU is a number in [0, 1] "
                              "(no smoothing: a zero precision gives 0).")


def _bleu_spec() -> ItemSpec:
    return ItemSpec(
        name="bleu", reference=bleu_ref.bleu, mistakes=BLEU_MISTAKES,
        subchecks=(
            # (the notebook's example is public: with it, a corpus the student has not seen)
            SubCheck("the two-sentence example of the notebook, and a fresh corpus", 1,
                     compare_cases(_bleu_case("the notebook's example (2 sentences, the second one word short)",
                                              HAND_CANDS, HAND_REFS),
                                   _bleu_random_case("a random corpus of 3 sentences", 940, 3, distinct=True))),
            SubCheck("1 for a perfect match, 0 without a common 4-gram (also on a fresh sentence)", 1, _bleu_range),
            SubCheck("random corpora: longer candidates, repeated words (clipping), short candidates (brevity), "
                     "max_n=2", 1,
                     compare_cases(_bleu_random_case("a random corpus of 8 sentences", 900, 8),
                                   _bleu_random_case("candidates ending in repeated words", 920, 5, repeat=True),
                                   _bleu_random_case("candidates shorter than their references", 910, 6, short=True),
                                   _bleu_random_case("a random corpus with max_n=2", 900, 8, max_n=2)), hidden=True),
        ),
    )


SPECS = {spec.name: spec for spec in (_greedy_spec(), _bleu_spec())}
