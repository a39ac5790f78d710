"""The offline dates data set: formats parse back, splits are disjoint, batches are right."""

from __future__ import annotations

import datetime as dt
import random

import pytest
import torch

from course_lib.data.dates import (
    FORMATS, ISO_FIELDS, DatesTask, attention_on_fields, field_spans, ordinal, parse_date, render_date,
)


@pytest.fixture(scope="module")
def task():
    return DatesTask(seed=0)


def _sample_dates(n=400, seed=0):
    rng = random.Random(seed)
    start = dt.date(1950, 1, 1)
    picks = [start + dt.timedelta(days=rng.randrange(36525)) for _ in range(n)]
    # edge cases: ends of the range and of months, leap days, the two-digit-year pivot
    return picks + [dt.date(1950, 1, 1), dt.date(2049, 12, 31), dt.date(2000, 2, 29), dt.date(1999, 12, 31),
                    dt.date(2001, 1, 11), dt.date(2012, 12, 12), dt.date(1972, 2, 29), dt.date(2023, 3, 23)]


@pytest.mark.parametrize("fmt", FORMATS, ids=[f.name for f in FORMATS])
def test_every_format_parses_back_to_the_same_date(fmt):
    for d in _sample_dates():
        text = render_date(d, fmt)
        assert parse_date(text) == d, (fmt.name, text)


def test_formats_are_distinct_and_cover_the_issue_examples():
    day = dt.date(2026, 11, 21)
    texts = {render_date(day, f) for f in FORMATS}
    assert len(texts) == len(FORMATS) >= 10
    for example in ("Sat 21 Nov 2026", "21/11/26", "November 21, 2026", "the 21st of November 2026"):
        assert example in texts


def test_parse_rejects_inconsistent_or_foreign_text():
    with pytest.raises(ValueError, match="does not match"):
        parse_date("Sunday, November 21, 2026")  # 21 Nov 2026 is a Saturday
    with pytest.raises(ValueError):
        parse_date("hello world")
    with pytest.raises(ValueError):
        parse_date("31/02/2026")
    with pytest.raises(TypeError):
        parse_date(20261121)


def test_ordinals():
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 23, 31)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "23rd", "31st"]


def test_splits_are_disjoint_and_cover_every_date(task):
    train, val, test = (set(task.dates[s]) for s in ("train", "val", "test"))
    assert not (train & val) and not (train & test) and not (val & test)
    assert len(train | val | test) == (dt.date(2049, 12, 31) - dt.date(1950, 1, 1)).days + 1
    assert len(train) > 7 * len(test) and len(val) > 0.09 * len(train | val | test)


def test_splits_are_seeded(task):
    assert DatesTask(seed=0).dates["test"] == task.dates["test"]
    assert DatesTask(seed=1).dates["test"] != task.dates["test"]


def test_examples_come_from_their_split_and_are_reproducible(task):
    test_dates = set(task.dates["test"])
    pairs = task.examples("test", 300, seed=5)
    assert pairs == task.examples("test", 300, seed=5)
    assert pairs != task.examples("test", 300, seed=6)
    for text, iso in pairs:
        assert parse_date(text).isoformat() == iso and dt.date.fromisoformat(iso) in test_dates
    batch = task.sample_batch(200, random.Random(0), split="train")
    train_dates = set(task.dates["train"])
    assert all(dt.date.fromisoformat(iso) in train_dates for iso in batch.tgt_text)


def test_batch_encoding_padding_and_teacher_forcing(task):
    pairs = [("21/11/26", "2026-11-21"), ("the 21st of November 2026", "2026-11-21")]
    b = task.batch(pairs)
    assert b.src.shape == (2, 25) and b.src.dtype == torch.long
    assert b.src_mask.dtype == torch.bool and b.src_mask.sum(1).tolist() == [8, 25]
    assert (b.src[0, 8:] == task.src_vocab.pad_id).all()
    assert task.src_vocab.decode(b.src[0].tolist()) == "21/11/26"
    assert b.tgt_out.shape == (2, 10) and b.tgt_mask.all()
    assert task.tgt_vocab.decode(b.tgt_out[1].tolist()) == "2026-11-21"
    assert b.tgt_in[0, 0] == task.tgt_vocab.bos_id and torch.equal(b.tgt_in[:, 1:], b.tgt_out[:, :-1])


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="fractions"):
        DatesTask(fractions=(0.5, 0.5))
    with pytest.raises(ValueError, match="1950-2049"):
        DatesTask(start=dt.date(1900, 1, 1))
    with pytest.raises(ValueError, match="split"):
        DatesTask().examples("training", 3)
    with pytest.raises(ValueError, match="unknown date format"):
        render_date(dt.date(2020, 1, 1), "dd-mm")


@pytest.mark.parametrize("fmt", FORMATS, ids=[f.name for f in FORMATS])
def test_field_spans_pick_out_day_month_and_year(fmt):
    for d in _sample_dates(60, seed=3):
        text = render_date(d, fmt)
        spans = field_spans(text)
        day, month, year = (text[slice(*spans[k])] for k in ("day", "month", "year"))
        assert int(day) == d.day
        assert (int(month) if month.isdigit() else parse_date(f"1 {month} 2000").month) == d.month
        assert int(year) % 100 == d.year % 100


def test_attention_on_fields_measures_the_mass_on_each_span():
    texts = ["21/11/26", "2026/11/21"]
    w = torch.zeros(2, 10, 10)
    for b, text in enumerate(texts):
        spans = field_spans(text)
        for name, positions in ISO_FIELDS.items():
            start, _ = spans[name]
            w[b, list(positions), start] = 1.0  # everything on the field's first character
    assert attention_on_fields(w, texts) == {"year": 1.0, "month": 1.0, "day": 1.0}
    w_uniform = torch.full((2, 10, 10), 0.1)
    mass = attention_on_fields(w_uniform, texts)
    assert mass["year"] == pytest.approx((0.2 + 0.4) / 2)
    with_eos = torch.cat([w, torch.full((2, 1, 10), 0.1)], dim=1)  # the <eos> step is left out
    assert attention_on_fields(with_eos, texts) == {"year": 1.0, "month": 1.0, "day": 1.0}
    with pytest.raises(ValueError):
        attention_on_fields(torch.zeros(2, 9, 10), texts)
