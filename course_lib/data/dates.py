"""The dates task: human-readable dates ("Sat 21 Nov 2026", "21/11/26",
"November 21, 2026", "the 21st of November 2026", ...) mapped to ISO dates
("2026-11-21"). Generated offline and seeded.

Every calendar date between ``start`` and ``end`` belongs to exactly one split
(train, validation or test), so a held-out date was never seen in training in any
format. Two-digit years are read with the pivot used by the formats: ``50..99`` are
19xx and ``00..49`` are 20xx, which is why the default range is 1950-2049.
"""

from __future__ import annotations

import datetime as dt
import random
import re
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from .vocab import Seq2SeqBatch, Vocab, make_seq2seq_batch

__all__ = [
    "MONTHS", "WEEKDAYS", "DateFormat", "FORMATS", "render_date", "parse_date", "ordinal",
    "field_spans", "attention_on_fields", "DatesTask", "SPLITS", "ISO_FIELDS",
]

MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December")
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
SPLITS = ("train", "val", "test")
#: Output positions in "YYYY-MM-DD" that copy a field of the input (the century digits
#: of a two-digit year are inferred, not copied, so the year uses its last two digits).
ISO_FIELDS = {"year": (2, 3), "month": (5, 6), "day": (8, 9)}


def ordinal(n: int) -> str:
    """``1 -> '1st'``, ``2 -> '2nd'``, ``11 -> '11th'``, ``23 -> '23rd'``."""
    if 10 <= n % 100 <= 20:
        suffix = "th"
    else:
        suffix = {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


@dataclass(frozen=True)
class DateFormat:
    """A named way of writing a date; ``render(date) -> str``."""

    name: str
    render: Callable[[dt.date], str]
    example: str


def _mon(d: dt.date) -> str:
    return MONTHS[d.month - 1]


def _wd(d: dt.date) -> str:
    return WEEKDAYS[d.weekday()]


_FORMATS = (
    ("weekday short", lambda d: f"{_wd(d)[:3]} {d.day} {_mon(d)[:3]} {d.year}"),
    ("dd/mm/yy", lambda d: f"{d.day:02d}/{d.month:02d}/{d.year % 100:02d}"),
    ("month day, year", lambda d: f"{_mon(d)} {d.day}, {d.year}"),
    ("the nth of month", lambda d: f"the {ordinal(d.day)} of {_mon(d)} {d.year}"),
    ("day month year", lambda d: f"{d.day} {_mon(d)} {d.year}"),
    ("dd.mm.yyyy", lambda d: f"{d.day:02d}.{d.month:02d}.{d.year}"),
    ("weekday, month day, year", lambda d: f"{_wd(d)}, {_mon(d)} {d.day}, {d.year}"),
    ("d mon yyyy lower case", lambda d: f"{d.day} {_mon(d)[:3].lower()} {d.year}"),
    ("MON d yyyy upper case", lambda d: f"{_mon(d)[:3].upper()} {d.day} {d.year}"),
    ("weekday nth month year", lambda d: f"{_wd(d)} {ordinal(d.day)} {_mon(d)} {d.year}"),
    ("d-m-yyyy", lambda d: f"{d.day}-{d.month}-{d.year}"),
    ("mon d, yyyy", lambda d: f"{_mon(d)[:3]} {d.day}, {d.year}"),
    ("yyyy/mm/dd", lambda d: f"{d.year}/{d.month:02d}/{d.day:02d}"),
    ("d mon 'yy", lambda d: f"{d.day} {_mon(d)[:3]} '{d.year % 100:02d}"),
)

_EXAMPLE_DAY = dt.date(2026, 11, 21)
FORMATS: tuple[DateFormat, ...] = tuple(DateFormat(n, r, r(_EXAMPLE_DAY)) for n, r in _FORMATS)
_BY_NAME = {f.name: f for f in FORMATS}


def render_date(date: dt.date, fmt: str | DateFormat) -> str:
    """Write ``date`` in format ``fmt`` (a :data:`FORMATS` entry or its name)."""
    if isinstance(fmt, str):
        if fmt not in _BY_NAME:
            raise ValueError(f"unknown date format {fmt!r}; known: {', '.join(_BY_NAME)}")
        fmt = _BY_NAME[fmt]
    return fmt.render(date)


# ---------------------------------------------------------------------------
# Parsing (independent of the renderers: used to check them)
# ---------------------------------------------------------------------------

_MONTH_WORDS = {m.lower(): i + 1 for i, m in enumerate(MONTHS)} | {m[:3].lower(): i + 1 for i, m in enumerate(MONTHS)}
_WEEKDAY_WORDS = {w.lower(): i for i, w in enumerate(WEEKDAYS)} | {w[:3].lower(): i for i, w in enumerate(WEEKDAYS)}


def _year(token: str) -> int:
    if len(token) == 4:
        return int(token)
    if len(token) == 2:
        yy = int(token)
        return 1900 + yy if yy >= 50 else 2000 + yy
    raise ValueError(f"cannot read a year from {token!r}")


def parse_date(text: str) -> dt.date:
    """Read a date written in any of the :data:`FORMATS` (and similar spellings).

    Words are case-insensitive; ``the``, ``of``, commas, ordinal suffixes and a
    leading weekday are allowed (a weekday must agree with the date). Numeric dates
    are day/month/year (``21/11/26``, ``21.11.2026``, ``21-11-2026``) or
    year/month/day with a four-digit year (``2026/11/21``). Raises ``ValueError``.
    """
    if not isinstance(text, str):
        raise TypeError(f"parse_date expects a string, got {type(text).__name__}")
    words = re.findall(r"[A-Za-z]+|'?\d+", text)
    weekday = month = None
    numbers: list[str] = []
    for w in words:
        lw = w.lower()
        if lw in ("the", "of", "st", "nd", "rd", "th"):
            continue
        if lw in _MONTH_WORDS and month is None:
            month = _MONTH_WORDS[lw]
        elif lw in _WEEKDAY_WORDS and weekday is None:
            weekday = _WEEKDAY_WORDS[lw]
        elif w.lstrip("'").isdigit():
            numbers.append(w)
        else:
            raise ValueError(f"cannot read a date from {text!r}: unexpected word {w!r}")
    if month is not None:
        if len(numbers) != 2:
            raise ValueError(f"cannot read a date from {text!r}: expected a day and a year")
        day_tok, year_tok = numbers
        if day_tok.startswith("'") or len(day_tok) > 2:
            day_tok, year_tok = year_tok, day_tok
        date = dt.date(_year(year_tok.lstrip("'")), month, int(day_tok))
    else:
        if len(numbers) != 3 or any(n.startswith("'") for n in numbers):
            raise ValueError(f"cannot read a date from {text!r}: expected day, month and year")
        if len(numbers[0]) == 4:
            date = dt.date(int(numbers[0]), int(numbers[1]), int(numbers[2]))
        else:
            date = dt.date(_year(numbers[2]), int(numbers[1]), int(numbers[0]))
    if weekday is not None and date.weekday() != weekday:
        raise ValueError(f"{text!r}: {WEEKDAYS[weekday]} does not match {date.isoformat()}")
    return date


def field_spans(text: str) -> dict[str, tuple[int, int]]:
    """Character spans ``[start, end)`` of the day, month and year in a written date.

    ``field_spans("the 21st of November 2026")`` is
    ``{"day": (4, 6), "month": (12, 20), "year": (21, 25)}``; an ordinal suffix is not part
    of the day and an apostrophe not part of the year. Raises ``ValueError`` when the text
    is not a date :func:`parse_date` can read.
    """
    parse_date(text)  # raises ValueError unless the text is a date
    spans: dict[str, tuple[int, int]] = {}
    numbers = []
    for m in re.finditer(r"[A-Za-z]+|'?\d+", text):
        w = m.group()
        if w.lower() in _MONTH_WORDS and "month" not in spans:
            spans["month"] = (m.start(), m.end())
        elif w.lstrip("'").isdigit():
            start = m.start() + (1 if w.startswith("'") else 0)
            numbers.append((w, start, m.end()))
    if "month" in spans:
        (a, sa, ea), (b, sb, eb) = numbers
        if a.startswith("'") or len(a) > 2:
            spans["year"], spans["day"] = (sa, ea), (sb, eb)
        else:
            spans["day"], spans["year"] = (sa, ea), (sb, eb)
    elif len(numbers[0][0]) == 4:
        spans["year"], spans["month"], spans["day"] = [(s, e) for _, s, e in numbers]
    else:
        spans["day"], spans["month"], spans["year"] = [(s, e) for _, s, e in numbers]
    return spans


def attention_on_fields(weights: torch.Tensor, src_texts: Sequence[str]) -> dict[str, float]:
    """How much attention the output digits of each field put on that field in the input.

    ``weights (B, T_out, T_in)`` are a model's alignments for ISO targets (rows sum to 1;
    the first 10 output steps are the date's characters, later ones such as the ``<eos>``
    step are left out), ``src_texts`` the B written dates. For each field (day, month, year) the result is
    the mean, over the examples and the field's output positions (:data:`ISO_FIELDS`), of
    the total weight on the field's input characters (:func:`field_spans`).
    """
    if weights.dim() != 3 or weights.shape[0] != len(src_texts) or weights.shape[1] < 10:
        raise ValueError(f"expected weights (B={len(src_texts)}, T_out >= 10, T_in), got {tuple(weights.shape)}")
    totals = {name: 0.0 for name in ISO_FIELDS}
    for b, text in enumerate(src_texts):
        spans = field_spans(text)
        for name, positions in ISO_FIELDS.items():
            start, end = spans[name]
            totals[name] += float(weights[b, list(positions), start:end].sum(dim=-1).mean())
    return {name: total / len(src_texts) for name, total in totals.items()}


# ---------------------------------------------------------------------------
# The task
# ---------------------------------------------------------------------------

_SRC_SYMBOLS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 ,./-'"
_TGT_SYMBOLS = "0123456789-"


class DatesTask:
    """Human-readable dates to ISO dates, with train/validation/test splits by date.

    ``DatesTask(seed=0)`` shuffles every date from ``start`` to ``end`` with ``seed``
    and cuts the list by ``fractions`` into ``train``, ``val`` and ``test`` dates.
    Examples pair a date of a split with a format drawn uniformly from ``formats``.

    - ``src_vocab``: characters of the human formats (plus ``<pad>``, ``<bos>``, ...);
    - ``tgt_vocab``: the ten digits and ``-``; every target has 10 tokens;
    - :meth:`examples` / :meth:`batch`: fixed example lists and padded batches;
    - :meth:`sample_batch`: a fresh random training batch.
    """

    target_length = 10

    def __init__(self, seed: int = 0, start: dt.date = dt.date(1950, 1, 1), end: dt.date = dt.date(2049, 12, 31),
                 fractions: Sequence[float] = (0.8, 0.1, 0.1),
                 formats: Sequence[DateFormat] | None = None) -> None:
        if len(fractions) != 3 or any(f <= 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-9:
            raise ValueError(f"fractions must be three positive numbers summing to 1, got {tuple(fractions)}")
        if end <= start:
            raise ValueError(f"end ({end}) must come after start ({start})")
        if start.year < 1950 or end.year > 2049:
            raise ValueError("dates must lie in 1950-2049 so that two-digit years are unambiguous")
        self.seed = seed
        self.formats = tuple(formats) if formats is not None else FORMATS
        if not self.formats:
            raise ValueError("at least one format is needed")
        n_days = (end - start).days + 1
        all_dates = [start + dt.timedelta(days=i) for i in range(n_days)]
        random.Random(seed).shuffle(all_dates)
        n_train = int(round(fractions[0] * n_days))
        n_val = int(round(fractions[1] * n_days))
        self.dates: dict[str, list[dt.date]] = {
            "train": all_dates[:n_train],
            "val": all_dates[n_train:n_train + n_val],
            "test": all_dates[n_train + n_val:],
        }
        self.src_vocab = Vocab.build(_SRC_SYMBOLS)
        self.tgt_vocab = Vocab.build(_TGT_SYMBOLS)

    def _dates_of(self, split: str) -> list[dt.date]:
        if split not in self.dates:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        return self.dates[split]

    def examples(self, split: str, n: int, seed: int = 0) -> list[tuple[str, str]]:
        """``n`` reproducible ``(human, iso)`` pairs from ``split``."""
        rng = random.Random(f"{self.seed}-{split}-{seed}")
        dates = self._dates_of(split)
        out = []
        for _ in range(n):
            d = rng.choice(dates)
            out.append((render_date(d, rng.choice(self.formats)), d.isoformat()))
        return out

    def batch(self, pairs: Sequence[tuple[str, str]], device: torch.device | str | None = None) -> Seq2SeqBatch:
        """Encode and pad ``(human, iso)`` pairs."""
        return make_seq2seq_batch(pairs, self.src_vocab, self.tgt_vocab, device)

    def sample_batch(self, batch_size: int, rng: random.Random, split: str = "train",
                     device: torch.device | str | None = None) -> Seq2SeqBatch:
        """A random batch of ``batch_size`` examples from ``split`` drawn with ``rng``."""
        dates = self._dates_of(split)
        pairs = []
        for _ in range(batch_size):
            d = rng.choice(dates)
            pairs.append((render_date(d, rng.choice(self.formats)), d.isoformat()))
        return self.batch(pairs, device)

    def __repr__(self) -> str:
        sizes = ", ".join(f"{k}: {len(v)} dates" for k, v in self.dates.items())
        return f"DatesTask(seed={self.seed}, {len(self.formats)} formats; {sizes})"
