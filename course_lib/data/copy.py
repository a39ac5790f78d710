"""The copy task: reproduce a random string of digits (or reverse it).

A fixed-context encoder-decoder must squeeze the whole input into one vector, so its
accuracy falls as the strings get longer; attention does not have that bottleneck.
"""

from __future__ import annotations

import random
from typing import Sequence

import torch

from .vocab import Seq2SeqBatch, Vocab, make_seq2seq_batch

__all__ = ["CopyTask"]


class CopyTask:
    """Random strings over ``symbols`` with lengths in ``[min_len, max_len]``.

    The target is the input itself (``reverse=False``) or the input reversed.
    ``src_vocab`` and ``tgt_vocab`` are the same character vocabulary.
    """

    def __init__(self, min_len: int = 4, max_len: int = 24, symbols: str = "0123456789",
                 reverse: bool = False) -> None:
        if not 1 <= min_len <= max_len:
            raise ValueError(f"need 1 <= min_len <= max_len, got min_len={min_len}, max_len={max_len}")
        if len(set(symbols)) < 2:
            raise ValueError("symbols must contain at least two distinct characters")
        self.min_len, self.max_len, self.reverse = min_len, max_len, reverse
        self.symbols = symbols
        self.src_vocab = Vocab.build(symbols)
        self.tgt_vocab = self.src_vocab

    def example(self, rng: random.Random, length: int | None = None) -> tuple[str, str]:
        """One ``(input, target)`` pair; a random length unless ``length`` is given."""
        n = rng.randint(self.min_len, self.max_len) if length is None else length
        s = "".join(rng.choice(self.symbols) for _ in range(n))
        return s, s[::-1] if self.reverse else s

    def batch(self, pairs: Sequence[tuple[str, str]], device: torch.device | str | None = None) -> Seq2SeqBatch:
        """Encode and pad ``(input, target)`` pairs."""
        return make_seq2seq_batch(pairs, self.src_vocab, self.tgt_vocab, device)

    def sample_batch(self, batch_size: int, rng: random.Random, length: int | None = None,
                     device: torch.device | str | None = None) -> Seq2SeqBatch:
        """A random batch (all of length ``length`` when given)."""
        return self.batch([self.example(rng, length) for _ in range(batch_size)], device)

    def __repr__(self) -> str:
        kind = "reverse" if self.reverse else "copy"
        return f"CopyTask({kind}, lengths {self.min_len}-{self.max_len}, symbols {self.symbols!r})"
