"""Corpus BLEU (Papineni et al., 2002) on token lists.

``BLEU = BP · exp( (1/N) Σ_n log p_n )`` with

- ``p_n``: the *clipped* n-gram precision pooled over the corpus: each candidate n-gram
  counts at most as often as it occurs in its reference, summed over all sentences,
  divided by the number of candidate n-grams;
- ``BP = exp(1 − r/c)`` when the candidates' total length ``c`` is shorter than the
  references' total length ``r``, else 1 (the brevity penalty).

No smoothing: if some ``p_n`` is 0 the score is 0. Equals sacrebleu's corpus BLEU with
``tokenize='none'`` and ``smooth_method='none'`` on whitespace-joined tokens (divided by 100).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Sequence

__all__ = ["ngrams", "bleu", "sentence_bleu_simple"]


def ngrams(tokens: Sequence, n: int) -> Counter:
    """Counts of the n-grams (tuples) of ``tokens``."""
    return Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


def _check(candidates: Sequence[Sequence], references: Sequence[Sequence]) -> None:
    if len(candidates) != len(references):
        raise ValueError(f"{len(candidates)} candidates but {len(references)} references")
    for name, corpus in (("candidates", candidates), ("references", references)):
        if isinstance(corpus, str) or any(isinstance(s, str) for s in corpus):
            raise TypeError(f"{name} must be a list of token lists (split your strings into tokens)")


def bleu(candidates: Sequence[Sequence], references: Sequence[Sequence], max_n: int = 4) -> float:
    """Corpus BLEU in ``[0, 1]`` of ``candidates`` against one reference each."""
    _check(candidates, references)
    if max_n < 1:
        raise ValueError(f"max_n must be at least 1, got {max_n}")
    matches = [0] * max_n
    totals = [0] * max_n
    c = r = 0
    for cand, ref in zip(candidates, references):
        c += len(cand)
        r += len(ref)
        for n in range(1, max_n + 1):
            cand_counts, ref_counts = ngrams(cand, n), ngrams(ref, n)
            matches[n - 1] += sum(min(k, ref_counts[g]) for g, k in cand_counts.items())
            totals[n - 1] += max(len(cand) - n + 1, 0)
    if c == 0 or min(matches) == 0:
        return 0.0
    log_precision = sum(math.log(m / t) for m, t in zip(matches, totals)) / max_n
    bp = 1.0 if c >= r else math.exp(1.0 - r / c)
    return bp * math.exp(log_precision)


def sentence_bleu_simple(candidate: Sequence, reference: Sequence, max_n: int = 4) -> float:
    """The lecture's simplified form for one sentence:
    ``min(1, |cand|/|ref|) · (Π_n p_n)^{1/N}`` with clipped precisions."""
    if not candidate:
        return 0.0
    precisions = []
    for n in range(1, max_n + 1):
        cand_counts, ref_counts = ngrams(candidate, n), ngrams(reference, n)
        total = max(len(candidate) - n + 1, 0)
        if total == 0:
            return 0.0
        precisions.append(sum(min(k, ref_counts[g]) for g, k in cand_counts.items()) / total)
    if min(precisions) == 0:
        return 0.0
    return min(1.0, len(candidate) / len(reference)) * math.exp(sum(map(math.log, precisions)) / max_n)
