"""A hand-made attention head for the sentence demo of notebook 03.

Words get small feature vectors (determiner, noun, animate, verb, pronoun, adjective,
conjunction, adverb), and the query/key matrices are written by hand so that the
head does one recognisable job: pronouns and adjectives look for an *animate noun*,
determiners and verbs look for nouns, nouns look for verbs. It shows what ``W_q`` and
``W_k`` mean before any training: a query asks a question, a key advertises an answer.
"""

from __future__ import annotations

import torch

from .attention import SelfAttention

__all__ = ["FEATURES", "SENTENCE", "featurize", "coreference_head"]

FEATURES = ("det", "noun", "animate", "verb", "pronoun", "adj", "conj", "adv")
SENTENCE = "The animal didn't cross the street because it was too tired"

_LEXICON = {
    "the": ("det",), "a": ("det",),
    "animal": ("noun", "animate"), "dog": ("noun", "animate"), "cat": ("noun", "animate"),
    "street": ("noun",), "road": ("noun",), "river": ("noun",),
    "didn't": ("verb",), "cross": ("verb",), "was": ("verb",),
    "because": ("conj",), "it": ("pronoun",),
    "too": ("adv",), "tired": ("adj",), "wide": ("adj",),
}


def featurize(tokens: list[str]) -> torch.Tensor:
    """``(T, 8)`` feature matrix for words of the small lexicon (unknown word -> error)."""
    x = torch.zeros(len(tokens), len(FEATURES))
    for i, word in enumerate(tokens):
        key = word.lower()
        if key not in _LEXICON:
            raise ValueError(f"'{word}' is not in the demo lexicon: {sorted(_LEXICON)}")
        for feature in _LEXICON[key]:
            x[i, FEATURES.index(feature)] = 1.0
    return x


def coreference_head(sentence: str = SENTENCE) -> tuple[list[str], torch.Tensor, SelfAttention]:
    """Tokens, features ``x (1, T, 8)`` and a hand-set ``SelfAttention(8, 4, 8)``.

    Query/key dimensions: 0 "animate noun?", 1 "noun?", 2 "verb?", 3 "anything" (a
    small constant so that every row has some spread). Values are the features
    themselves, so a pronoun's output carries the features of what it attends to.
    """
    tokens = sentence.split()
    x = featurize(tokens).unsqueeze(0)
    f = {name: i for i, name in enumerate(FEATURES)}
    head = SelfAttention(d_model=len(FEATURES), d_k=4, d_v=len(FEATURES))
    w_q = torch.zeros(4, len(FEATURES))
    w_k = torch.zeros(4, len(FEATURES))
    w_q[0, f["pronoun"]], w_q[1, f["pronoun"]] = 3.0, 1.0   # "it": which animate noun?
    w_q[0, f["adj"]] = 2.0                                  # "tired": who is tired?
    w_q[1, f["det"]] = 2.0                                  # "the": which noun?
    w_q[1, f["verb"]] = 1.5                                 # verbs look for their nouns
    w_q[2, f["noun"]] = 1.5                                 # nouns look for their verb
    w_k[0, f["animate"]] = 2.0
    w_k[1, f["noun"]] = 1.0
    w_k[2, f["verb"]] = 1.0
    with torch.no_grad():
        head.w_q.weight.copy_(w_q)
        head.w_k.weight.copy_(w_k)
        head.w_v.weight.copy_(torch.eye(len(FEATURES)))
    return tokens, x, head
