"""The engine of ``workbook similarity``: fingerprints of the class's answers to one item, an
index from fingerprint to students, and the pairs that share more than chance explains.

- **Fingerprints** (:func:`fingerprints`): the hashes of every ``k`` consecutive normalised
  tokens (k-grams), thinned by *winnowing* (Schleimer, Wilkerson and Aiken, SIGMOD 2003: the
  smallest hash of every ``window`` consecutive ones, as MOSS, JPlag and Dolos do): any
  fragment of ``k + window - 1`` tokens two answers share leaves at least one fingerprint
  in both.
- **What is no evidence**: a k-gram of the released notebook (the stub, the code and text
  around it) counts for nothing; so does a fingerprint that more than ``common_share`` of
  the class holds (and more than ``min_common`` students), as MOSS ignores a passage found
  in many programs: what a large part of the class wrote alike. Below that limit a
  fingerprint counts the less the more students hold it (1 when two do; the inverse
  document frequency of a search engine, ``log(n / df) / log(n / 2)``, for more). How
  many hold it is counted in the item and in the whole assignment, whichever is more: the
  canonical lines of attention are common in every item that has them.
- **Rings**: what keeps a line many students wrote alike apart from a long answer many
  handed in alike. A fingerprint that three or more students hold weighs 1 after all (however
  many: past the limit too), between them, when the same students, and nobody else in any
  item, hold enough such fingerprints to cover ``ring_tokens`` tokens of each of their
  answers, outside the notebook's own solution: six, or sixty, copies of one long answer are
  one flagged group, where a common line is held each time by another set of students and
  covers a few tokens.
- **The index** (:class:`ItemIndex`): each fingerprint lists the students who hold it; the
  weights two students share are summed over the lists (never answer against answer), in
  blocks of rows so that a large class needs no n x n table at once.
- **Similarity** of a pair: the weight of the fingerprints they share over the number of
  fingerprints that count in the smaller answer (at least ``min_prints``): the part of the
  shorter answer the other one also has, so that a copy with lines added, or a reference
  copied with its checks left out, still scores near 1. It is *flagged* at the threshold
  only when the shared fragments cover at least ``min_tokens`` tokens of both answers,
  outside the released notebook: a short answer (a one-line mask) is never flagged on its
  own, however alike. Against course_lib's reference, the notebook's own solution is left out
  as well: it is what a natural answer looks like (the four lines of a ``SelfAttention`` are
  the reference's whoever wrote them), and only what a copy takes beyond it is evidence.

Why not copydetect (PyPI), the maintained Python engine of this kind: it compares every
pair of files (``CopyDetector`` loops over all of them; ``compare_files`` took 110 µs a
pair here, about 660 s of CPU for 1,000 students x 12 items, where this index takes
seconds), it removes boilerplate only as exact hashes (nothing for what many students
share), its normalisation (pygments) keeps numbers but makes ``.softmax`` and
``.transpose`` one name like any variable, it hashes with Python's ``hash`` (different in
every process), and its report loads Bootstrap's script from a CDN (no page of the project may
run a script or fetch anything). Its normalisation and winnowing are the same idea as
here, in fewer lines than adapting it would take.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Callable

import numpy as np

__all__ = ["Settings", "CODE", "TEXT", "Fingerprints", "fingerprints", "kgram_hashes", "ItemIndex", "Pair",
           "clusters", "class_frequency", "within", "REFERENCE"]

REFERENCE = "course_lib"  # the other side of a pair with course_lib's reference


@dataclass(frozen=True)
class Settings:
    """How answers of one kind (code, or written text) are fingerprinted and judged."""

    k: int  # tokens in a k-gram
    window: int  # winnowing window: a shared fragment of k + window - 1 tokens is always seen
    min_tokens: int  # tokens both answers' shared fragments must cover to be flagged
    min_prints: int  # an answer with fewer fingerprints that count is divided by this many
    common_share: float = 0.1  # a fingerprint more of the class than this holds is no evidence
    min_common: int = 5  # ... nor one more than this many hold (in a small class)
    ring_tokens: int = 100  # ... unless the same students hold all of so many tokens of a long answer (a ring)


CODE = Settings(k=8, window=4, min_tokens=40, min_prints=10, ring_tokens=100)
TEXT = Settings(k=3, window=1, min_tokens=20, min_prints=8, ring_tokens=60)

_BASE = np.uint64(0x9E3779B97F4A7C15)  # an odd 64-bit multiplier (the golden ratio's)
_IDS: dict[str, int] = {}
_STRUCTURE = frozenset({"{", "}", ";"})  # tokens of the layout, not of what was written


def _ids(words: list[str]) -> np.ndarray:
    """Each token as a number that is the same in every process (crc32 of its text)."""
    out = np.empty(len(words), dtype=np.uint64)
    for i, word in enumerate(words):
        value = _IDS.get(word)
        if value is None:
            value = _IDS[word] = zlib.crc32(word.encode("utf-8", "surrogatepass")) + 1
        out[i] = value
    return out


def kgram_hashes(words: list[str], k: int) -> np.ndarray:
    """The hash of every k-gram of ``words`` (position order; empty when fewer than k)."""
    n = len(words) - k + 1
    if n <= 0:
        return np.empty(0, dtype=np.uint64)
    ids = _ids(words)
    h = np.zeros(n, dtype=np.uint64)
    for j in range(k):
        h = h * _BASE + ids[j:j + n]  # wraps modulo 2**64
    return h


def within(values: np.ndarray, sorted_set: np.ndarray) -> np.ndarray:
    """Which of ``values`` are in ``sorted_set`` (sorted, unique): a binary search each."""
    if not len(sorted_set):
        return np.zeros(len(values), dtype=bool)
    at = np.minimum(np.searchsorted(sorted_set, values), len(sorted_set) - 1)
    return sorted_set[at] == values


@dataclass
class Fingerprints:
    """The winnowed fingerprints of one answer: ``hashes[i]`` starts at token ``positions[i]``."""

    hashes: np.ndarray
    positions: np.ndarray

    def unique(self) -> np.ndarray:
        return np.unique(self.hashes)


def fingerprints(words: list[str], settings: Settings, excluded: np.ndarray | None = None) -> Fingerprints:
    """Winnowed fingerprints of ``words``: in every window of ``settings.window`` k-gram
    hashes the smallest (the rightmost of equals), each position once; those in
    ``excluded`` (sorted and unique: the released notebook's k-grams) left out."""
    h = kgram_hashes(words, settings.k)
    w = settings.window
    if len(h) == 0:
        chosen = np.empty(0, dtype=np.int64)
    elif len(h) <= w:
        chosen = np.array([len(h) - 1 - int(np.argmin(h[::-1]))])
    else:
        windows = np.lib.stride_tricks.sliding_window_view(h, w)
        rightmost = w - 1 - np.argmin(windows[:, ::-1], axis=1)
        chosen = np.unique(np.arange(len(windows)) + rightmost)
    hashes = h[chosen]
    if excluded is not None and len(excluded) and len(hashes):
        keep = ~within(hashes, excluded)
        hashes, chosen = hashes[keep], chosen[keep]
    return Fingerprints(hashes, chosen)


@dataclass
class Pair:
    """Two answers to one item (``b`` is :data:`REFERENCE` for course_lib's reference)."""

    a: str
    b: str
    similarity: float
    evidence: int = 0  # tokens of the smaller answer covered by the fragments they share
    flagged: bool = False


class ItemIndex:
    """The class's answers to one item, indexed by fingerprint (``words(student)``, or
    ``words(REFERENCE)``, gives an answer's tokens: needed only for the pairs judged).
    ``frequency`` (sorted fingerprints, how many students hold each in any item of the
    assignment): a fingerprint is as common as it is here or there, whichever is more
    (the canonical lines of attention are no evidence in an item where few wrote them)."""

    def __init__(self, students: list[str], prints: list[Fingerprints], words: Callable[[str], list[str]],
                 settings: Settings, reference: Fingerprints | None = None,
                 template: np.ndarray | None = None,
                 frequency: tuple[np.ndarray, np.ndarray] | None = None,
                 canonical: np.ndarray | None = None) -> None:
        self.students, self.prints, self.words, self.settings = students, prints, words, settings
        self.reference = reference
        self.template = template if template is not None else np.empty(0, dtype=np.uint64)
        # the notebook's own solution (k-grams): what a natural answer looks like; an answer shares
        # it with course_lib's reference whoever wrote it, so against the reference it is no evidence
        self.canonical = canonical if canonical is not None else np.empty(0, dtype=np.uint64)
        self.sets = [p.unique() for p in prints]
        self._at = {s: i for i, s in enumerate(students)}
        n = len(students)
        self.common = max(math.ceil(settings.common_share * n), settings.min_common)
        owners = np.repeat(np.arange(n), [len(s) for s in self.sets])
        hashes = np.concatenate(self.sets) if n else np.empty(0, dtype=np.uint64)
        self.frequency = frequency
        self.hashes, inverse, self.holders = np.unique(hashes, return_inverse=True, return_counts=True)
        self.df = np.maximum(self.holders, self._elsewhere(self.hashes))
        order = np.lexsort((owners, inverse))  # entries grouped by fingerprint, students ascending
        self._owners, self._group = owners[order], inverse[order]
        self.ring = self._rings()
        self.weights = np.where(self.ring, 1.0, self.weight(self.df))
        counted = self.weights[inverse] > 0
        self.sizes = np.bincount(owners[counted], minlength=n)  # fingerprints of each answer that count

    def weight(self, df: np.ndarray) -> np.ndarray:
        """What a fingerprint ``df`` students hold is worth: 1 when two do (or one), then the
        less the more hold it, ``log(n / df) / log(n / 2)`` (as a search engine weighs a
        rare word), and nothing past ``common``."""
        n = max(len(self.students), 3)
        share = np.log(n / np.maximum(df, 2)) / np.log(n / 2)
        return np.where(df <= self.common, np.clip(share, 0.0, 1.0), 0.0)

    def _holders_of(self, fingerprint: int) -> np.ndarray:
        """The students (ascending) who hold ``self.hashes[fingerprint]``."""
        start = int(np.searchsorted(self._group, fingerprint))
        return self._owners[start:start + int(self.holders[fingerprint])]

    def _rings(self) -> np.ndarray:
        """Which fingerprints (of ``self.hashes``) are a ring's: held by three students or more
        (whom the weight discounts) and by nobody else in any item, the same students for each,
        together covering ``ring_tokens`` tokens of every one of their answers (outside the
        notebook's own solution): students who handed in the same long answer, not a line many
        wrote alike. Between them such a fingerprint weighs 1, however many they are (a ring of
        six is no safer than a pair)."""
        ring = np.zeros(len(self.hashes), dtype=bool)
        candidates = np.flatnonzero((self.holders > 2) & (self.df == self.holders)
                                    & ~within(self.hashes, self.canonical))
        groups: dict[bytes, list[int]] = {}
        for fingerprint in candidates:
            groups.setdefault(self._holders_of(fingerprint).tobytes(), []).append(int(fingerprint))
        for group in groups.values():
            held = self.hashes[group]
            if all(self._coverage(s, held) >= self.settings.ring_tokens for s in self._holders_of(group[0])):
                ring[group] = True
        return ring

    def _coverage(self, student: int, hashes: np.ndarray) -> int:
        """How many tokens of ``student``'s answer the k-grams of ``hashes`` (sorted) cover."""
        prints = self.prints[student]
        starts = prints.positions[within(prints.hashes, hashes)]
        if not len(starts):
            return 0
        return int(self._spread(starts, int(starts.max()) + self.settings.k).sum())

    def weights_of(self, hashes: np.ndarray) -> np.ndarray:
        """What each of ``hashes`` is worth here: its weight in the index (a ring's fingerprint weighs
        1), or as common as the assignment made it for one the class does not hold."""
        weights = self.weight(self.df_of(hashes))
        if not len(self.hashes) or not len(hashes):
            return weights
        at = np.minimum(np.searchsorted(self.hashes, hashes), len(self.hashes) - 1)
        return np.where(self.hashes[at] == hashes, self.weights[at], weights)

    def _elsewhere(self, hashes: np.ndarray) -> np.ndarray:
        """How many students hold each of ``hashes`` in any item (0 without ``frequency``)."""
        if self.frequency is None or not len(self.frequency[0]):
            return np.zeros(len(hashes), dtype=np.int64)
        known, counts = self.frequency
        at = np.minimum(np.searchsorted(known, hashes), len(known) - 1)
        return np.where(known[at] == hashes, counts[at], 0)

    def df_of(self, hashes: np.ndarray) -> np.ndarray:
        """How common each of ``hashes`` is (students holding it here or in any item; 0 for none)."""
        if not len(self.hashes):
            return self._elsewhere(hashes)
        at = np.minimum(np.searchsorted(self.hashes, hashes), len(self.hashes) - 1)
        return np.maximum(np.where(self.hashes[at] == hashes, self.df[at], 0), self._elsewhere(hashes))

    def _pairs(self, rows: tuple[int, int], limit: int = 1 << 21):
        """``(a, b, weight)`` arrays, at most about ``limit`` long each, for every two students
        ``a < b`` (``a`` in ``rows``) and each fingerprint that counts which they both hold:
        memory stays bounded however many students share a fingerprint."""
        counted = self.weights > 0
        for size in (int(s) for s in np.unique(self.holders[counted]) if s >= 2):
            groups = np.flatnonzero((self.holders == size) & counted)
            i, j = np.triu_indices(size, 1)
            step = max(1, limit // len(i))
            for g in range(0, len(groups), step):
                chunk = groups[g:g + step]
                members = self._owners[np.searchsorted(self._group, chunk)[:, None] + np.arange(size)]  # ascending
                a, b = members[:, i].ravel(), members[:, j].ravel()
                keep = (a >= rows[0]) & (a < rows[1])
                yield a[keep], b[keep], np.repeat(self.weights[chunk], len(i))[keep]

    def similar_pairs(self, floor: float, block_bytes: int = 64 * 2**20, pair_limit: int = 1 << 21) -> list[Pair]:
        """Every pair of students whose similarity is at least ``floor`` (> 0); the shared
        weights summed in blocks of rows of ``block_bytes``, ``pair_limit`` pairs at a time."""
        n = len(self.students)
        rows = max(1, block_bytes // (8 * max(n, 1)))
        found = []
        for r0 in range(0, n, rows):
            r1 = min(n, r0 + rows)
            shared = np.zeros((r1 - r0) * n)
            for a, b, w in self._pairs((r0, r1), pair_limit):
                if len(a):
                    shared += np.bincount((a - r0) * n + b, weights=w, minlength=len(shared))
            shared = shared.reshape(r1 - r0, n)
            smaller = np.maximum(np.minimum(self.sizes[r0:r1, None], self.sizes[None, :]), self.settings.min_prints)
            similarity = shared / smaller
            for ra, b in zip(*np.nonzero(similarity >= floor)):
                found.append(Pair(self.students[r0 + ra], self.students[b], min(1.0, float(similarity[ra, b]))))
        return found

    def reference_pairs(self, floor: float) -> list[Pair]:
        """Each student whose answer is at least ``floor`` similar to the reference."""
        if self.reference is None or not self.students:
            return []
        ref = np.unique(self.reference.hashes)
        ref_size = int(np.sum(self.weights_of(ref) > 0))
        entries = within(self.hashes[self._group], ref)
        shared = np.bincount(self._owners[entries], weights=self.weights[self._group[entries]],
                             minlength=len(self.students))
        similarity = shared / np.maximum(np.minimum(self.sizes, ref_size), self.settings.min_prints)
        return [Pair(self.students[s], REFERENCE, min(1.0, float(similarity[s])))
                for s in np.flatnonzero(similarity >= floor)]

    def _side(self, who: str) -> tuple[Fingerprints, list[str], np.ndarray]:
        if who == REFERENCE:
            assert self.reference is not None
            return self.reference, self.words(who), np.unique(self.reference.hashes)
        s = self._at[who]
        return self.prints[s], self.words(who), self.sets[s]

    def _spread(self, starts: np.ndarray, length: int) -> np.ndarray:
        """A mask over ``length`` tokens: the k tokens from each of ``starts``."""
        mask = np.zeros(length, dtype=bool)
        for start in starts:
            mask[start:start + self.settings.k] = True
        return mask

    def covered(self, a: str, b: str) -> tuple[np.ndarray, np.ndarray]:
        """Which tokens of ``a`` and of ``b`` lie in a fragment the two share (boolean masks
        over their tokens): the k-grams of their common fingerprints that count as evidence,
        less every token of a k-gram the released notebook has (a stub's signature)."""
        (pa, wa, sa), (pb, wb, sb) = self._side(a), self._side(b)
        common = np.intersect1d(sa, sb)
        common = common[self.weights_of(common) > 0]
        # against the reference, what the notebook's own solution has is left out too (a natural answer)
        known = np.union1d(self.template, self.canonical) if REFERENCE in (a, b) else self.template
        masks = []
        for prints, words in ((pa, wa), (pb, wb)):
            shared = self._spread(prints.positions[within(prints.hashes, common)], len(words))
            released = self._spread(np.flatnonzero(within(kgram_hashes(words, self.settings.k), known)), len(words))
            masks.append(shared & ~released)
        return masks[0], masks[1]

    def judge(self, pair: Pair, threshold: float) -> Pair:
        """``pair`` with its evidence counted and flagged when it reaches ``threshold`` with
        enough tokens on both sides."""
        if pair.similarity < threshold:
            return pair
        ma, mb = self.covered(pair.a, pair.b)
        wa, wb = self._side(pair.a)[1], self._side(pair.b)[1]
        pair.evidence = min(sum(1 for i in np.flatnonzero(ma) if wa[i] not in _STRUCTURE),
                            sum(1 for i in np.flatnonzero(mb) if wb[i] not in _STRUCTURE))
        pair.flagged = pair.evidence >= self.settings.min_tokens
        return pair


def class_frequency(prints: list[list[np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """``prints[s]``: student s's fingerprints in each item; returns every fingerprint (sorted)
    and how many students hold it in any item."""
    held = [np.unique(np.concatenate(p)) for p in prints if p]
    if not held:
        return np.empty(0, dtype=np.uint64), np.empty(0, dtype=np.int64)
    return np.unique(np.concatenate(held), return_counts=True)


def clusters(pairs: list[Pair]) -> list[list[str]]:
    """Groups of three or more answers that are all flagged with each other (course_lib's
    reference among them where it is): the largest such groups (maximal cliques of the flagged
    pairs, Bron and Kerbosch's search with a pivot), each sorted, largest first. A student
    flagged with two classmates who share nothing makes no group: those are two pairs."""
    near: dict[str, set[str]] = {}
    for p in pairs:
        if p.flagged and p.a != p.b:
            near.setdefault(p.a, set()).add(p.b)
            near.setdefault(p.b, set()).add(p.a)
    found: list[list[str]] = []
    todo = [(set(), set(near), set())]  # (the group so far, who may join it, who was tried)
    while todo:
        group, may, tried = todo.pop()
        if not may and not tried:
            if len(group) >= 3:
                found.append(sorted(group))
            continue
        pivot = max(may | tried, key=lambda x: len(near[x] & may))
        for who in sorted(may - near[pivot]):
            todo.append((group | {who}, may & near[who], tried & near[who]))
            may, tried = may - {who}, tried | {who}
    return sorted(found, key=lambda g: (-len(g), g))
