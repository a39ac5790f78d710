"""Check specs of notebook 07: correct answers written independently of course_lib earn
every point (mask_tokens whatever random numbers it draws), stubs are reported once, and
the messages name the mistake."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from course_lib.grading import get_spec, grade
from spec_helpers import assert_full_marks, assert_stub_reported_once, messages

ITEMS = ["bpe_train", "bpe_encode", "mask_tokens", "make_nsp_input", "BertEmbeddings", "mlm_loss", "NSPHead"]


# Correct answers written differently from course_lib's references ---------------------

def bpe_train(word_counts, num_merges):
    corpus = [(list(w), c) for w, c in word_counts.items()]
    merges = []
    while len(merges) < num_merges:
        counts = {}
        for symbols, c in corpus:
            for i in range(len(symbols) - 1):
                counts[(symbols[i], symbols[i + 1])] = counts.get((symbols[i], symbols[i + 1]), 0) + c
        if not counts:
            break
        pair = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]
        merges.append(pair)
        for symbols, _ in corpus:
            i = 0
            while i < len(symbols) - 1:
                if (symbols[i], symbols[i + 1]) == pair:
                    symbols[i: i + 2] = [pair[0] + pair[1]]
                i += 1
    return merges


def bpe_encode(word, merges):
    symbols = list(word)
    for pair in merges:  # applying each merge in learned order is equivalent to priority order
        i = 0
        while i < len(symbols) - 1:
            if (symbols[i], symbols[i + 1]) == tuple(pair):
                symbols[i: i + 2] = [symbols[i] + symbols[i + 1]]
            i += 1
    return symbols


def make_mask_tokens(draw: str):
    """Correct mask_tokens variants that use the generator in different ways."""

    def mask_tokens(input_ids, vocab_size, mask_id, special_ids, mlm_probability=0.15, generator=None):
        ids = input_ids.clone()
        special = torch.isin(ids, torch.tensor(list(special_ids), device=ids.device))
        if draw == "bernoulli":
            probs = torch.full(ids.shape, mlm_probability).masked_fill(special.cpu(), 0.0)
            selected = torch.bernoulli(probs, generator=generator).bool().to(ids.device)
            replace = torch.bernoulli(torch.full(ids.shape, 0.8), generator=generator).bool().to(ids.device) & selected
            rand = (torch.bernoulli(torch.full(ids.shape, 0.5), generator=generator).bool().to(ids.device)
                    & selected & ~replace)
        else:  # one uniform number per token decides everything
            u = torch.rand(ids.shape, generator=generator).to(ids.device)
            selected = (u < mlm_probability) & ~special
            v = u / mlm_probability
            replace, rand = selected & (v < 0.8), selected & (v >= 0.8) & (v < 0.9)
        labels = ids.masked_fill(~selected, -100)
        ids[replace] = mask_id
        ids[rand] = torch.randint(0, vocab_size, (int(rand.sum()),), generator=generator).to(ids.device)
        return ids, labels

    return mask_tokens


def make_nsp_input(tokens_a, tokens_b, cls_id, sep_id):
    ids = [cls_id] + list(tokens_a) + [sep_id] + list(tokens_b) + [sep_id]
    seg = [0 if i <= len(tokens_a) + 1 else 1 for i in range(len(ids))]
    return torch.LongTensor(ids), torch.LongTensor(seg)


class BertEmbeddings(nn.Module):
    def __init__(self, vocab_size, d_model, max_len, num_segments=2, dropout=0.0):
        super().__init__()
        self.token = nn.Embedding(vocab_size, d_model)
        self.position = nn.Embedding(max_len, d_model)
        self.segment = nn.Embedding(num_segments, d_model)
        self.norm = nn.LayerNorm(d_model)

    def forward(self, input_ids, segment_ids):
        pos = self.position.weight[: input_ids.shape[1]].unsqueeze(0)
        return self.norm(self.token(input_ids) + self.segment(segment_ids) + pos)


def mlm_loss(logits, labels):
    keep = labels != -100
    logp = logits.log_softmax(-1)[keep]
    return -logp.gather(-1, labels[keep][:, None]).mean()


class NSPHead(nn.Module):
    def __init__(self, d_model):
        super().__init__()
        self.pooler = nn.Linear(d_model, d_model)
        self.classifier = nn.Linear(d_model, 2)

    def forward(self, hidden):
        cls = hidden[:, 0, :]
        return self.classifier(self.pooler(cls).tanh())


ANSWERS = {"bpe_train": bpe_train, "bpe_encode": bpe_encode, "mask_tokens": make_mask_tokens("uniform"),
           "make_nsp_input": make_nsp_input, "BertEmbeddings": BertEmbeddings, "mlm_loss": mlm_loss,
           "NSPHead": NSPHead}


@pytest.mark.parametrize("item", ITEMS)
def test_independent_answers_earn_every_point(item):
    assert_full_marks(item, ANSWERS[item])


def test_points_of_the_items():
    assert {i: get_spec(i).points for i in ITEMS} == {
        "bpe_train": 4, "bpe_encode": 3, "mask_tokens": 5, "make_nsp_input": 2, "BertEmbeddings": 3,
        "mlm_loss": 2, "NSPHead": 3}


@pytest.mark.parametrize("draw", ["uniform", "bernoulli"])
def test_mask_tokens_checks_pass_whatever_numbers_are_drawn(monkeypatch, draw):
    """The statistical checks seed the generator they pass; a correct implementation that
    draws other numbers (here: the generator's state shifted by a different seed) passes too."""
    impl = make_mask_tokens(draw)
    for shift in range(6):
        def shifted(input_ids, vocab_size, mask_id, special_ids, mlm_probability=0.15, generator=None):
            g = torch.Generator().manual_seed(int(torch.randint(10**6, (1,), generator=generator)) + 7919 * shift)
            return impl(input_ids, vocab_size, mask_id, special_ids, mlm_probability, g)

        result = grade(get_spec("mask_tokens"), shifted, hidden=True, device="cpu")
        assert result.earned == 5, messages(result)


@pytest.mark.parametrize("item", ITEMS)
def test_stubs_are_reported_once(item):
    if isinstance(ANSWERS[item], type):
        class Stub(nn.Module):
            def __init__(self, *args, **kwargs):
                super().__init__()
                raise NotImplementedError()
        stub = Stub
    else:
        def stub(*args, **kwargs):
            raise NotImplementedError()
    assert_stub_reported_once(item, stub)


def test_messages_say_what_was_measured():
    def always_mask(input_ids, vocab_size, mask_id, special_ids, mlm_probability=0.15, generator=None):
        special = torch.isin(input_ids, torch.tensor(list(special_ids)))
        selected = (torch.rand(input_ids.shape, generator=generator) < mlm_probability) & ~special
        return input_ids.masked_fill(selected, mask_id), input_ids.masked_fill(~selected, -100)

    result = grade(get_spec("mask_tokens"), always_mask, hidden=True, device="cpu")
    assert result.earned == 2  # the 80/10/10 check and the random-ids check fail
    text = messages(result)
    assert "100.0% became [MASK], 0.0% a random token" in text and "The 80/10/10 split is wrong" in text

    def segment_off(tokens_a, tokens_b, cls_id, sep_id):
        ids, seg = make_nsp_input(tokens_a, tokens_b, cls_id, sep_id)
        seg[len(tokens_a) + 1] = 1
        return ids, seg

    text = messages(grade(get_spec("make_nsp_input"), segment_off, hidden=True, device="cpu"))
    assert "segment_ids" in text and "the first [SEP] closes sentence A" in text

    def nsp_loss_over_all(logits, labels):
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum") / labels.numel()

    text = messages(grade(get_spec("mlm_loss"), nsp_loss_over_all, hidden=True, device="cpu"))
    assert "The loss is averaged over all positions" in text
