"""Token vocabularies and padding helpers shared by the sequence data sets."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

import torch
from torch import Tensor

__all__ = ["PAD", "BOS", "EOS", "UNK", "Vocab", "pad_sequences", "Seq2SeqBatch", "make_seq2seq_batch"]

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"


@dataclass(frozen=True)
class Vocab:
    """A fixed list of tokens; the index of a token is its id.

    ``Vocab.build(symbols)`` puts the special tokens first (``<pad>`` has id 0) and
    then the given symbols in order, without duplicates. Tokens are strings; a
    character-level vocabulary simply has one-character tokens.
    """

    tokens: tuple[str, ...]
    index: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(set(self.tokens)) != len(self.tokens):
            raise ValueError("a vocabulary cannot list the same token twice")
        object.__setattr__(self, "index", {t: i for i, t in enumerate(self.tokens)})

    @classmethod
    def build(cls, symbols: Iterable[str], specials: Sequence[str] = (PAD, BOS, EOS, UNK)) -> "Vocab":
        """Special tokens first, then ``symbols`` in first-seen order."""
        tokens = list(specials)
        for s in symbols:
            if s not in tokens:
                tokens.append(s)
        return cls(tuple(tokens))

    def __len__(self) -> int:
        return len(self.tokens)

    def __contains__(self, token: str) -> bool:
        return token in self.index

    def id(self, token: str) -> int:
        """The id of ``token``; unknown tokens map to ``<unk>`` when the vocabulary has one."""
        if token in self.index:
            return self.index[token]
        if UNK in self.index:
            return self.index[UNK]
        raise KeyError(f"token {token!r} is not in the vocabulary and there is no {UNK} token")

    @property
    def pad_id(self) -> int:
        return self.index[PAD]

    @property
    def bos_id(self) -> int:
        return self.index[BOS]

    def encode(self, tokens: Iterable[str]) -> list[int]:
        """Ids of a sequence of tokens (a string is a sequence of characters)."""
        return [self.id(t) for t in tokens]

    def decode(self, ids: Iterable[int], strip_special: bool = True, sep: str = "") -> str:
        """Tokens of ``ids`` joined with ``sep``; special tokens are dropped unless
        ``strip_special=False``; decoding stops at ``<eos>``."""
        out = []
        for i in ids:
            token = self.tokens[int(i)]
            if token == EOS and strip_special:
                break
            if strip_special and token in (PAD, BOS, EOS, UNK):
                continue
            out.append(token)
        return sep.join(out)


def pad_sequences(seqs: Sequence[Sequence[int]], pad_id: int = 0, length: int | None = None,
                  device: torch.device | str | None = None) -> tuple[Tensor, Tensor]:
    """Right-pad integer sequences into one batch.

    Returns ``ids (B, T)`` (int64, ``T`` = the longest sequence or ``length``) and
    ``mask (B, T)`` (bool, True on real tokens, False on padding).
    """
    if len(seqs) == 0:
        raise ValueError("pad_sequences needs at least one sequence")
    longest = max(len(s) for s in seqs)
    T = longest if length is None else length
    if T < longest:
        raise ValueError(f"length={length} is shorter than the longest sequence ({longest})")
    ids = torch.tensor([[int(t) for t in s] + [pad_id] * (T - len(s)) for s in seqs], dtype=torch.long)
    lengths = torch.tensor([len(s) for s in seqs])
    mask = torch.arange(T)[None, :] < lengths[:, None]
    return ids.to(device), mask.to(device)


@dataclass
class Seq2SeqBatch:
    """A padded batch for a sequence-to-sequence model (teacher forcing).

    - ``src (B, T_in)`` input ids, ``src_mask (B, T_in)`` True on real tokens;
    - ``tgt_in (B, T_out)`` decoder inputs: ``<bos>`` then the target shifted right;
    - ``tgt_out (B, T_out)`` the target ids, ``tgt_mask (B, T_out)`` True on real tokens;
    - ``src_text`` / ``tgt_text``: the examples as strings (for printing).
    """

    src: Tensor
    src_mask: Tensor
    tgt_in: Tensor
    tgt_out: Tensor
    tgt_mask: Tensor
    src_text: list[str]
    tgt_text: list[str]

    def to(self, device: torch.device | str) -> "Seq2SeqBatch":
        """The same batch with every tensor on ``device``."""
        return Seq2SeqBatch(self.src.to(device), self.src_mask.to(device), self.tgt_in.to(device),
                            self.tgt_out.to(device), self.tgt_mask.to(device), self.src_text, self.tgt_text)

    def __len__(self) -> int:
        return self.src.size(0)


def make_seq2seq_batch(pairs: Sequence[tuple[Sequence[str], Sequence[str]]], src_vocab: Vocab, tgt_vocab: Vocab,
                       device: torch.device | str | None = None) -> Seq2SeqBatch:
    """Encode and pad ``(source tokens, target tokens)`` pairs (strings count as
    character sequences) into a :class:`Seq2SeqBatch`."""
    if len(pairs) == 0:
        raise ValueError("make_seq2seq_batch needs at least one (source, target) pair")
    src_ids = [src_vocab.encode(s) for s, _ in pairs]
    tgt_ids = [tgt_vocab.encode(t) for _, t in pairs]
    src, src_mask = pad_sequences(src_ids, src_vocab.pad_id)
    tgt_out, tgt_mask = pad_sequences(tgt_ids, tgt_vocab.pad_id)
    tgt_in, _ = pad_sequences([[tgt_vocab.bos_id] + t[:-1] for t in tgt_ids], tgt_vocab.pad_id)
    batch = Seq2SeqBatch(src, src_mask, tgt_in, tgt_out, tgt_mask,
                         ["".join(s) for s, _ in pairs], ["".join(t) for _, t in pairs])
    return batch.to(device) if device is not None else batch
