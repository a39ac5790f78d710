"""An offline English corpus of documents for pre-training a small BERT.

Nothing is downloaded: :func:`story_corpus` writes short stories on the machine, each
a *document* of several *sentences* about one topic (the kitchen, the farm, the sea,
...) with a main character who stays the same through the story. Topic words and the
character tie the sentences of a document together, which is what next-sentence
prediction can pick up, and the templates give masked-language modelling something to
learn. :func:`load_text_documents` reads your own text file instead (documents
separated by blank lines).

A corpus is a ``list[list[str]]``: documents, each a list of sentences.
"""

from __future__ import annotations

import random
import re
import tomllib
from pathlib import Path

__all__ = ["TOPICS", "story_corpus", "topic_sentences", "topic_classification", "load_text_documents",
           "split_sentences"]

Corpus = list[list[str]]


def _load_topics(path: Path) -> dict[str, tuple[list[str], list[str], list[str], list[str]]]:
    """``topic -> (nouns, past-tense verbs, adjectives, places)`` from ``topics.toml``,
    in the file's order (the order of the topic labels)."""
    with path.open("rb") as f:
        tables = tomllib.load(f)
    return {topic: (t["nouns"], t["verbs"], t["adjectives"], t["places"]) for topic, t in tables.items()}


TOPICS = _load_topics(Path(__file__).with_name("topics.toml"))

NAMES = [("anna", "she"), ("ben", "he"), ("clara", "she"), ("david", "he"), ("emma", "she"),
         ("felix", "he"), ("grace", "she"), ("henry", "he"), ("iris", "she"), ("jack", "he"),
         ("lena", "she"), ("max", "he"), ("nora", "she"), ("oscar", "he"), ("paula", "she"),
         ("quinn", "he"), ("rosa", "she"), ("sam", "he"), ("tara", "she"), ("victor", "he"),
         ("wendy", "she"), ("yusuf", "he"), ("zoe", "she"), ("leo", "he")]

# Short sentences, mostly topic words: what a story is about shows in nearly every token,
# so that a small model can tell two stories apart (next-sentence prediction).
_TEMPLATES = [
    "{name} {verb} the {adj} {noun} in {place}.",
    "{name} {verb} the {noun} and the {noun2}.",
    "the {noun} was {adj}, so {name} {verb} the {noun2}.",
    "{name} and {friend} {verb} a {adj} {noun} near the {noun2}.",
    "in {place} {name} {verb} the {adj} {noun2}.",
    "{friend} {verb} the {noun} while {name} {verb2} the {noun2}.",
]


def topic_sentences(rng: random.Random, topic: str, n: int, name: tuple[str, str] | None = None,
                    friend: str | None = None) -> list[str]:
    """``n`` sentences about ``topic`` with one main character (and a friend); each
    sentence takes up a thing that the sentence before it mentioned."""
    if topic not in TOPICS:
        raise ValueError(f"unknown topic {topic!r}; topics: {', '.join(TOPICS)}")
    nouns, verbs, adjs, places = TOPICS[topic]
    if name is None:
        name = rng.choice(NAMES)
    if friend is None:
        friend = rng.choice([n for n, _ in NAMES if n != name[0]])
    out = []
    previous = None
    for _ in range(n):
        noun, noun2 = rng.sample(nouns, 2)
        if previous is not None and previous != noun2:
            noun = previous  # the story goes on about what the last sentence mentioned
        previous = noun2
        out.append(rng.choice(_TEMPLATES).format(
            name=name[0], friend=friend, noun=noun, noun2=noun2, verb=rng.choice(verbs), verb2=rng.choice(verbs),
            adj=rng.choice(adjs), place=rng.choice(places)))
    return out


def story_corpus(num_documents: int, seed: int = 0, min_sentences: int = 4,
                 max_sentences: int = 8) -> tuple[Corpus, list[str]]:
    """``num_documents`` stories and the topic of each: ``(documents, topics)``.

    Each document has between ``min_sentences`` and ``max_sentences`` sentences about
    one topic, with one main character; the same seed gives the same corpus.
    """
    if num_documents < 1 or not 1 <= min_sentences <= max_sentences:
        raise ValueError("need num_documents >= 1 and 1 <= min_sentences <= max_sentences")
    rng = random.Random(seed)
    docs, topics = [], []
    names = list(TOPICS)
    for _ in range(num_documents):
        topic = rng.choice(names)
        docs.append(topic_sentences(rng, topic, rng.randint(min_sentences, max_sentences)))
        topics.append(topic)
    return docs, topics


def topic_classification(per_topic: int, seed: int = 0) -> tuple[list[str], list[int]]:
    """A labelled task: ``per_topic`` sentences of every topic and their labels (the
    topic's index in :data:`TOPICS`). Every sentence comes from a new story with a new
    character, so that a name never gives the topic away."""
    if per_topic < 1:
        raise ValueError(f"per_topic must be >= 1, got {per_topic}")
    rng = random.Random(seed)
    sentences, labels = [], []
    for label, topic in enumerate(TOPICS):
        for _ in range(per_topic):
            sentences += topic_sentences(rng, topic, 1)
            labels.append(label)
    return sentences, labels


def split_sentences(text: str) -> list[str]:
    """Split a paragraph into sentences at ``.``, ``!`` or ``?`` followed by white space."""
    text = " ".join(text.split())
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if s.strip()]


def load_text_documents(path: str | Path, min_sentences: int = 2) -> Corpus:
    """Read a UTF-8 text file into documents: paragraphs separated by blank lines,
    split into sentences; documents with fewer than ``min_sentences`` sentences are
    dropped (next-sentence prediction needs at least two)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no text file at {path}")
    paragraphs = re.split(r"\n\s*\n", path.read_text(encoding="utf-8"))
    docs = [split_sentences(p) for p in paragraphs]
    docs = [d for d in docs if len(d) >= min_sentences]
    if len(docs) < 2:
        raise ValueError(f"{path} holds fewer than 2 documents of {min_sentences}+ sentences; "
                         "separate documents with a blank line")
    return docs
