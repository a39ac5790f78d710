"""Byte-pair encoding (BPE): learn subword merges from word counts, then split words.

Training (Sennrich et al.): every word starts as its characters (no end-of-word
symbol); at each step the most frequent pair of adjacent symbols, counted with the
words' frequencies, is merged into one symbol everywhere; ties go to the
lexicographically smallest pair. The list of merges, in the order they were learned,
is the model.

Encoding a word: start from its characters and repeatedly apply the highest-priority
(earliest learned) merge that occurs in the word, until none applies. So with the
merges learned on "related", "unrelated", "undo", ... the word "unrelated" becomes
``["un", "related"]``; WordPiece writes continuation pieces with ``##``:
``["un", "##related"]``.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable, Mapping, Sequence

__all__ = ["pair_counts", "merge_pair", "bpe_train", "bpe_encode", "wordpiece_display"]

Pair = tuple[str, str]


def pair_counts(words: Mapping[tuple[str, ...], int]) -> Counter:
    """Frequency of each adjacent symbol pair, each word counted ``count`` times."""
    counts: Counter = Counter()
    for symbols, count in words.items():
        for pair in zip(symbols, symbols[1:]):
            counts[pair] += count
    return counts


def merge_pair(symbols: Sequence[str], pair: Pair) -> tuple[str, ...]:
    """Replace every occurrence of ``pair`` in ``symbols`` (left to right) by the joined symbol."""
    a, b = pair
    out: list[str] = []
    i = 0
    while i < len(symbols):
        if i + 1 < len(symbols) and symbols[i] == a and symbols[i + 1] == b:
            out.append(a + b)
            i += 2
        else:
            out.append(symbols[i])
            i += 1
    return tuple(out)


def _check_word_counts(word_counts: Mapping[str, int]) -> None:
    if not isinstance(word_counts, Mapping):
        raise TypeError(f"word_counts must be a dict {{word: count}}, got {type(word_counts).__name__}")
    for word, count in word_counts.items():
        if not isinstance(word, str) or not word:
            raise ValueError(f"words must be non-empty strings, got {word!r}")
        if not isinstance(count, int) or count < 1:
            raise ValueError(f"counts must be positive ints, got {count!r} for {word!r}")


def bpe_train(word_counts: dict[str, int], num_merges: int) -> list[tuple[str, str]]:
    """Learn up to ``num_merges`` merges from ``{word: count}``.

    Returns the merges in the order learned, e.g. ``[("e", "s"), ("es", "t"), ...]``.
    Stops early when every word is a single symbol.
    """
    _check_word_counts(word_counts)
    if not isinstance(num_merges, int) or num_merges < 0:
        raise ValueError(f"num_merges must be an int >= 0, got {num_merges!r}")
    words: dict[tuple[str, ...], int] = {}
    for word, count in word_counts.items():
        symbols = tuple(word)
        words[symbols] = words.get(symbols, 0) + count
    merges: list[tuple[str, str]] = []
    for _ in range(num_merges):
        counts = pair_counts(words)
        if not counts:
            break
        best = max(counts.values())
        pair = min(p for p, c in counts.items() if c == best)
        merges.append(pair)
        merged: dict[tuple[str, ...], int] = {}
        for symbols, count in words.items():
            new = merge_pair(symbols, pair)
            merged[new] = merged.get(new, 0) + count
        words = merged
    return merges


def bpe_encode(word: str, merges: Iterable[tuple[str, str]]) -> list[str]:
    """Split ``word`` into subwords with the learned ``merges`` (earlier = higher priority).

    Repeatedly applies the highest-priority merge present among adjacent symbols
    (all its occurrences, left to right) until no merge applies.
    """
    if not isinstance(word, str):
        raise TypeError(f"word must be a string, got {type(word).__name__}")
    ranks: dict[Pair, int] = {}
    for rank, pair in enumerate(merges):
        ranks.setdefault(tuple(pair), rank)
    symbols: tuple[str, ...] = tuple(word)
    while len(symbols) > 1:
        candidates = [(ranks[p], p) for p in zip(symbols, symbols[1:]) if p in ranks]
        if not candidates:
            break
        symbols = merge_pair(symbols, min(candidates)[1])
    return list(symbols)


def wordpiece_display(pieces: Sequence[str]) -> list[str]:
    """WordPiece notation: every piece after the first of a word gets a ``##`` prefix."""
    return [p if i == 0 else "##" + p for i, p in enumerate(pieces)]
