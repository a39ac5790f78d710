"""A toy translation task generated offline from a small grammar.

The source language is English-like, subject–verb–object, adjectives before nouns::

    the big dog sees some red birds

The target language (invented words) differs in three ways, so a translator must
reorder and agree rather than copy word by word:

- **SOV order**: the verb comes last, after the object, which carries the particle ``ko``;
- **adjective after the noun**;
- **agreement**: determiners, adjectives and nouns take a plural form in a plural noun
  phrase, and the verb agrees with the *subject*'s number (not the object's)::

    lo kana mur ani doris kiri ko vide

Everything is seeded; the train, validation and test splits hold disjoint sentences.
One vocabulary serves both languages (as in the original Transformer's shared BPE
vocabulary), so the model can share its embeddings.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch
from torch import Tensor

from .vocab import BOS, EOS, PAD, UNK, Vocab, pad_sequences

__all__ = ["NOUNS", "ADJECTIVES", "VERBS", "sample_sentence", "translate", "verb_position", "TranslationBatch",
           "ToyTranslation", "make_translation_data"]

# source lemma -> (target singular, target plural); source plural adds "s"
NOUNS = {
    "dog": ("kana", "kanas"), "cat": ("miru", "mirus"), "bird": ("dori", "doris"),
    "fox": ("vulpa", "vulpas"), "horse": ("ekwa", "ekwas"), "child": ("pera", "peras"),
    "teacher": ("dosa", "dosas"), "farmer": ("agra", "agras"), "king": ("rega", "regas"),
    "queen": ("rena", "renas"), "friend": ("amika", "amikas"), "baker": ("pana", "panas"),
}
SOURCE_PLURAL = {"child": "children", "fox": "foxes"}
ADJECTIVES = {
    "big": ("mur", "muri"), "small": ("pik", "piki"), "red": ("kir", "kiri"), "old": ("vet", "veti"),
    "young": ("jun", "juni"), "happy": ("fel", "feli"), "tired": ("las", "lasi"), "clever": ("sag", "sagi"),
}
# source (3rd singular, plural) -> target (subject singular, subject plural)
VERBS = {
    ("sees", "see"): ("vide", "viden"), ("likes", "like"): ("ama", "aman"),
    ("follows", "follow"): ("sekwe", "sekwen"), ("helps", "help"): ("aju", "ajun"),
    ("finds", "find"): ("trova", "trovan"), ("calls", "call"): ("voka", "vokan"),
    ("watches", "watch"): ("gardi", "gardin"), ("greets", "greet"): ("sala", "salan"),
}
# source determiner -> (target singular, target plural); "a" is singular only, "some" plural only
DETERMINERS = {"the": ("lo", "los"), "a": ("un", None), "some": (None, "ani")}
OBJECT_PARTICLE = "ko"


def _noun_phrase(rng: random.Random) -> dict:
    plural = rng.random() < 0.5
    det = rng.choice(["the", "some"] if plural else ["the", "a"])
    adj = rng.choice([None, *ADJECTIVES]) if rng.random() < 0.6 else None
    return {"det": det, "adj": adj, "noun": rng.choice(list(NOUNS)), "plural": plural}


def sample_sentence(rng: random.Random) -> dict:
    """A random parse: subject and object noun phrases and a verb."""
    return {"subj": _noun_phrase(rng), "verb": rng.choice(list(VERBS)), "obj": _noun_phrase(rng)}


def _source_np(np_: dict) -> list[str]:
    noun = np_["noun"]
    if np_["plural"]:
        noun = SOURCE_PLURAL.get(noun, noun + "s")
    return [np_["det"]] + ([np_["adj"]] if np_["adj"] else []) + [noun]


def _target_np(np_: dict) -> list[str]:
    n = 1 if np_["plural"] else 0
    out = [DETERMINERS[np_["det"]][n], NOUNS[np_["noun"]][n]]
    if np_["adj"]:
        out.append(ADJECTIVES[np_["adj"]][n])
    return out


def translate(parse: dict) -> tuple[list[str], list[str]]:
    """``(source tokens, target tokens)`` of a parse: SVO → S O-ko V with agreement."""
    n = 1 if parse["subj"]["plural"] else 0
    src = _source_np(parse["subj"]) + [parse["verb"][n]] + _source_np(parse["obj"])
    tgt = _target_np(parse["subj"]) + _target_np(parse["obj"]) + [OBJECT_PARTICLE, VERBS[parse["verb"]][n]]
    return src, tgt


def verb_position(source: Sequence[str]) -> int:
    """Index of the verb in a source sentence (the first token that is a verb form)."""
    forms = {form for pair in VERBS for form in pair}
    for i, token in enumerate(source):
        if token in forms:
            return i
    raise ValueError(f"no verb in {' '.join(source)!r}")


def _all_words() -> list[str]:
    words = ["the", "a", "some", OBJECT_PARTICLE]
    for noun, forms in NOUNS.items():
        words += [noun, SOURCE_PLURAL.get(noun, noun + "s"), *forms]
    for adj, forms in ADJECTIVES.items():
        words += [adj, *forms]
    for src_forms, tgt_forms in VERBS.items():
        words += [*src_forms, *tgt_forms]
    words += [w for forms in DETERMINERS.values() for w in forms if w]
    return words


@dataclass
class TranslationBatch:
    """A padded batch for teacher forcing.

    - ``src (B, S)`` source ids, ``src_mask (B, 1, S)`` True on real tokens (a key
      padding mask that broadcasts over the queries);
    - ``tgt_in (B, T)``: ``<bos>`` followed by the target (the decoder's input);
    - ``tgt_out (B, T)``: the target followed by ``<eos>`` (what to predict at each
      position), ``<pad>`` after the end.
    """

    src: Tensor
    src_mask: Tensor
    tgt_in: Tensor
    tgt_out: Tensor

    def to(self, device: torch.device | str) -> "TranslationBatch":
        return TranslationBatch(self.src.to(device), self.src_mask.to(device), self.tgt_in.to(device),
                                self.tgt_out.to(device))

    def __len__(self) -> int:
        return self.src.size(0)


@dataclass
class ToyTranslation:
    """The toy translation data set: a shared :class:`Vocab` and three disjoint splits
    of ``(source tokens, target tokens)`` pairs."""

    vocab: Vocab
    train: list[tuple[list[str], list[str]]]
    valid: list[tuple[list[str], list[str]]]
    test: list[tuple[list[str], list[str]]]

    @property
    def pad_id(self) -> int:
        return self.vocab.pad_id

    @property
    def bos_id(self) -> int:
        return self.vocab.bos_id

    @property
    def eos_id(self) -> int:
        return self.vocab.id(EOS)

    def split(self, name: str) -> list[tuple[list[str], list[str]]]:
        if name not in ("train", "valid", "test"):
            raise ValueError(f"split must be 'train', 'valid' or 'test', got {name!r}")
        return getattr(self, name)

    def make_batch(self, pairs: Sequence[tuple[Sequence[str], Sequence[str]]],
                   device: torch.device | str | None = None) -> TranslationBatch:
        """Encode and pad pairs into a :class:`TranslationBatch` (teacher-forcing layout)."""
        if len(pairs) == 0:
            raise ValueError("make_batch needs at least one pair")
        v = self.vocab
        src, mask = pad_sequences([v.encode(s) for s, _ in pairs], self.pad_id)
        tgt = [v.encode(t) for _, t in pairs]
        tgt_in, _ = pad_sequences([[self.bos_id] + t for t in tgt], self.pad_id)
        tgt_out, _ = pad_sequences([t + [self.eos_id] for t in tgt], self.pad_id)
        batch = TranslationBatch(src, mask[:, None, :], tgt_in, tgt_out)
        return batch.to(device) if device is not None else batch

    def batches(self, split: str, batch_size: int, generator: torch.Generator | None = None,
                device: torch.device | str | None = None) -> Iterator[TranslationBatch]:
        """Endless stream of shuffled batches from ``split`` (an epoch is reshuffled each time)."""
        pairs = self.split(split)
        while True:
            order = torch.randperm(len(pairs), generator=generator).tolist()
            for i in range(0, len(order) - batch_size + 1, batch_size):
                yield self.make_batch([pairs[j] for j in order[i:i + batch_size]], device)

    def to_words(self, ids: Sequence[int] | Tensor) -> list[str]:
        """Tokens of an id sequence up to ``<eos>``, without ``<bos>``/``<pad>``."""
        out = []
        for i in (ids.tolist() if isinstance(ids, Tensor) else ids):
            token = self.vocab.tokens[int(i)]
            if token == EOS:
                break
            if token not in (PAD, BOS, UNK):
                out.append(token)
        return out


def make_translation_data(n_train: int = 8000, n_valid: int = 500, n_test: int = 500,
                          seed: int = 0) -> ToyTranslation:
    """Sample distinct sentences with a seeded generator and split them into disjoint
    train / valid / test sets."""
    total = n_train + n_valid + n_test
    if min(n_train, n_valid, n_test) < 0 or total == 0:
        raise ValueError("split sizes must be non-negative and not all zero")
    rng = random.Random(seed)
    seen: dict[tuple[str, ...], list[str]] = {}
    attempts = 0
    while len(seen) < total:
        attempts += 1
        if attempts > 50 * total:
            raise ValueError(f"the grammar cannot produce {total} distinct sentences")
        src, tgt = translate(sample_sentence(rng))
        seen.setdefault(tuple(src), tgt)
    pairs = [(list(s), t) for s, t in seen.items()]
    rng.shuffle(pairs)
    vocab = Vocab.build(_all_words(), specials=(PAD, BOS, EOS, UNK))
    return ToyTranslation(vocab, pairs[:n_train], pairs[n_train:n_train + n_valid], pairs[n_train + n_valid:])
