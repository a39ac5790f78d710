"""Small synthetic sequence tasks, generated on the fly from a seeded generator.

- ``offset_digits_batch``: every output needs two tokens at fixed distances back, and
  which is which; a multi-head layer can give each distance its own head (notebook 04).
- ``shift_by_first_batch``: every output needs the first token of a long input, however
  far back it is; a sliding window alone cannot see it, a global token can (notebook 09).
- ``sortedness_batch``: "is this sequence sorted?", which only order can answer: the
  unsorted examples are permutations of the same multisets as the sorted ones (notebook 05).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["IGNORE_INDEX", "offset_digits_batch", "sortedness_batch", "is_sorted", "shift_by_first_batch"]

IGNORE_INDEX = -100  # targets with this value are left out of the loss (torch's default)


def _check_batch(batch_size: int, T: int) -> None:
    if batch_size < 1 or T < 1:
        raise ValueError(f"batch_size and T must be positive, got {batch_size} and {T}")


def offset_digits_batch(batch_size: int, T: int, offsets: tuple[int, ...] = (1, 3), vocab_size: int = 10,
                        generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """Random digit sequences and, at each position t, the number whose digits (base
    ``vocab_size``) are the tokens ``offsets`` steps back.

    With the default ``offsets=(1, 3)`` the target at t is ``10·x[t−1] + x[t−3]``, a class
    in 0 … 99: each output needs exactly two earlier tokens, and needs to know which is which.
    Returns ``tokens (B, T)`` and ``targets (B, T)`` (int64); positions ``t < max(offsets)``
    have no target (``IGNORE_INDEX``). There are ``vocab_size ** len(offsets)`` classes.
    """
    _check_batch(batch_size, T)
    if not offsets or min(offsets) < 1 or max(offsets) >= T:
        raise ValueError(f"offsets must be in 1 .. T-1 = {T - 1}, got {offsets}")
    x = torch.randint(0, vocab_size, (batch_size, T), generator=generator)
    start = max(offsets)
    y = torch.full_like(x, IGNORE_INDEX)
    number = torch.zeros_like(x[:, start:])
    for a in offsets:
        number = number * vocab_size + x[:, start - a:T - a]
    y[:, start:] = number
    return x, y


def is_sorted(tokens: Tensor) -> Tensor:
    """``(B,)`` bool: True where the row of ``tokens (B, T)`` is non-decreasing."""
    return (tokens[:, 1:] >= tokens[:, :-1]).all(dim=1)


def sortedness_batch(batch_size: int, T: int, vocab_size: int = 32,
                     generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """Sequences of ``T`` numbers in ``0 .. vocab_size − 1`` and labels 1 = sorted, 0 = not.

    Each row draws a random multiset and then, with probability 1/2 each, shows it sorted,
    fully shuffled (1/4) or sorted with one adjacent pair of different values swapped (1/4).
    Sorted and unsorted rows share the same multisets, so the bag of tokens says nothing
    about the label: only their order does. Returns ``tokens (B, T)`` and ``labels (B,)``
    (int64); labels are computed from the rows themselves.
    """
    _check_batch(batch_size, T)
    if T < 2:
        raise ValueError("sortedness needs T >= 2")
    values = torch.randint(0, vocab_size, (batch_size, T), generator=generator).sort(dim=1).values
    kind = torch.rand(batch_size, generator=generator)
    tokens = values.clone()
    shuffle = (kind >= 0.5) & (kind < 0.75)
    if bool(shuffle.any()):
        keys = torch.rand(int(shuffle.sum()), T, generator=generator)
        tokens[shuffle] = torch.gather(values[shuffle], 1, keys.argsort(dim=1))
    swap = kind >= 0.75
    for b in swap.nonzero().flatten().tolist():
        row = tokens[b]
        candidates = (row[1:] != row[:-1]).nonzero().flatten()
        if len(candidates):
            i = int(candidates[torch.randint(len(candidates), (1,), generator=generator)])
            row[i], row[i + 1] = row[i + 1].clone(), row[i].clone()
    return tokens, is_sorted(tokens).long()


def shift_by_first_batch(batch_size: int, T: int, n_shifts: int = 4, vocab_size: int = 8,
                         generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """Long inputs whose every answer depends on the first token.

    ``tokens[:, 0]`` is a shift token ``vocab_size + s`` (``s`` in ``0 .. n_shifts-1``), the
    others are digits in ``0 .. vocab_size-1``; the target at ``t ≥ 1`` is
    ``(tokens[t] + s) mod vocab_size`` (``IGNORE_INDEX`` at ``t = 0``). Without seeing the
    first token the best guess is right ``1 / n_shifts`` of the time. Returns ``tokens (B, T)``
    (``vocab_size + n_shifts`` token ids) and ``targets (B, T)``.
    """
    _check_batch(batch_size, T)
    x = torch.randint(0, vocab_size, (batch_size, T), generator=generator)
    s = torch.randint(0, n_shifts, (batch_size, 1), generator=generator)
    y = (x + s) % vocab_size
    x[:, :1] = vocab_size + s
    y[:, 0] = IGNORE_INDEX
    return x, y
