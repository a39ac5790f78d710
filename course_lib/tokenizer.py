"""A BERT-style subword tokenizer: BPE pieces plus ``[PAD] [UNK] [CLS] [SEP] [MASK]``.

Text is lower-cased and split into words and punctuation marks; each word is split
into BPE pieces (:mod:`course_lib.bpe`); each piece has an id. The special tokens come
first, so ``[PAD]`` is id 0. :meth:`SubwordTokenizer.pieces` shows a sentence in
WordPiece notation (continuation pieces start with ``##``).
"""

from __future__ import annotations

import re
from collections import Counter
from functools import lru_cache
from typing import Iterable, Sequence

from .bpe import bpe_encode, bpe_train, wordpiece_display

__all__ = ["PAD", "UNK", "CLS", "SEP", "MASK", "SPECIALS", "pre_tokenize", "SubwordTokenizer"]

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIALS = (PAD, UNK, CLS, SEP, MASK)

_WORD = re.compile(r"[a-z0-9]+|[^\sa-z0-9]")


def pre_tokenize(text: str) -> list[str]:
    """Lower-case words (letters and digits) and single punctuation marks."""
    return _WORD.findall(text.lower())


class SubwordTokenizer:
    """Subword tokenizer with a fixed list of merges.

    ``SubwordTokenizer.train(sentences, num_merges)`` learns the merges; the
    vocabulary is the special tokens, every character seen, then the merged symbols
    in the order learned.
    """

    def __init__(self, merges: Sequence[tuple[str, str]], alphabet: Iterable[str]) -> None:
        self.merges = [tuple(m) for m in merges]
        tokens = list(SPECIALS)
        for symbol in [*sorted(set(alphabet)), *(a + b for a, b in self.merges)]:
            if symbol not in tokens:
                tokens.append(symbol)
        self.tokens = tokens
        self.index = {t: i for i, t in enumerate(tokens)}
        self._encode_word = lru_cache(maxsize=100_000)(self._split)

    @classmethod
    def train(cls, sentences: Iterable[str], num_merges: int) -> "SubwordTokenizer":
        counts = Counter(w for s in sentences for w in pre_tokenize(s))
        if not counts:
            raise ValueError("cannot train a tokenizer on no text")
        merges = bpe_train(dict(counts), num_merges)
        return cls(merges, {c for w in counts for c in w})

    # ids of the special tokens
    pad_id = property(lambda self: self.index[PAD])
    unk_id = property(lambda self: self.index[UNK])
    cls_id = property(lambda self: self.index[CLS])
    sep_id = property(lambda self: self.index[SEP])
    mask_id = property(lambda self: self.index[MASK])

    @property
    def special_ids(self) -> list[int]:
        return [self.index[t] for t in SPECIALS]

    def __len__(self) -> int:
        return len(self.tokens)

    def _split(self, word: str) -> tuple[str, ...]:
        return tuple(bpe_encode(word, self.merges))

    def word_pieces(self, word: str) -> list[str]:
        """BPE pieces of one word."""
        return list(self._encode_word(word))

    def tokenize(self, text: str) -> list[str]:
        """The pieces of ``text`` (without ``##``)."""
        return [p for w in pre_tokenize(text) for p in self._encode_word(w)]

    def pieces(self, text: str) -> list[str]:
        """The pieces of ``text`` in WordPiece notation (``##`` marks a continuation)."""
        return [p for w in pre_tokenize(text) for p in wordpiece_display(self._encode_word(w))]

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; pieces outside the vocabulary become ``[UNK]``."""
        unk = self.unk_id
        return [self.index.get(p, unk) for p in self.tokenize(text)]

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        """Pieces of ``ids`` joined by spaces (special tokens dropped unless asked)."""
        out = []
        for i in ids:
            token = self.tokens[int(i)]
            if skip_special and token in (PAD, CLS, SEP):
                continue
            out.append(token)
        return " ".join(out)
