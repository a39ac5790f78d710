"""BPE, the subword tokenizer, the offline corpus and the BERT library of notebook 07."""

from __future__ import annotations

import math
import random

import pytest
import torch
import torch.nn.functional as F

from course_lib import bert, bert_pretraining
from course_lib.bpe import bpe_encode, bpe_train, wordpiece_display
from course_lib.data.corpus import (NAMES, TOPICS, load_text_documents, split_sentences, story_corpus,
                                   topic_classification, topic_sentences)
from course_lib.tokenizer import SPECIALS, SubwordTokenizer, pre_tokenize


# BPE ---------------------------------------------------------------------------------

def test_bpe_train_worked_example():
    # pairs of low(5) lower(2) newest(6) widest(3): e-s 9, s-t 9 (tie -> 'e','s'), then es-t 9,
    # then l-o 7, lo-w 7; then e-w, n-e and w-est all 6 (tie -> 'e','w'); then n-ew and ew-est 6 -> 'ew','est'
    merges = bpe_train({"low": 5, "lower": 2, "newest": 6, "widest": 3}, 6)
    assert merges == [("e", "s"), ("es", "t"), ("l", "o"), ("lo", "w"), ("e", "w"), ("ew", "est")]


def test_bpe_train_weights_and_ties():
    assert bpe_train({"cd": 1, "ab": 1}, 1) == [("a", "b")]          # tie: smallest pair, not first seen
    assert bpe_train({"ab": 1, "abx": 1, "aby": 1, "cd": 5}, 1) == [("c", "d")]  # 5 > 3
    assert bpe_train({"aa": 2}, 10) == [("a", "a")]                   # stops when nothing is left
    assert bpe_train({"aaa": 1}, 2) == [("a", "a"), ("aa", "a")]     # non-overlapping merge, left to right
    with pytest.raises(ValueError):
        bpe_train({"": 3}, 1)
    with pytest.raises(ValueError):
        bpe_train({"a": 0}, 1)


def test_bpe_encode_priority_order():
    merges = [("u", "n"), ("r", "e"), ("a", "t"), ("e", "d"), ("at", "ed"), ("l", "ated"), ("re", "lated")]
    assert bpe_encode("unrelated", merges) == ["un", "related"]
    assert bpe_encode("est", [("s", "t"), ("e", "s")]) == ["e", "st"]
    assert bpe_encode("banana", [("a", "n")]) == ["b", "an", "an", "a"]
    assert bpe_encode("xyz", merges) == ["x", "y", "z"]
    assert wordpiece_display(["un", "related"]) == ["un", "##related"]


def test_bpe_encode_reproduces_training_segmentation():
    counts = {"lowest": 3, "newer": 4, "wider": 2, "low": 7}
    merges = bpe_train(counts, 8)
    for word in counts:  # a training word is encoded exactly as training merged it
        pieces = bpe_encode(word, merges)
        assert "".join(pieces) == word and len(pieces) <= len(word)


# tokenizer and corpus --------------------------------------------------------------

def test_tokenizer_specials_and_round_trip():
    docs, _ = story_corpus(50, seed=0)
    tok = SubwordTokenizer.train([s for d in docs for s in d], 100)
    assert tok.tokens[:5] == list(SPECIALS) and tok.pad_id == 0 and tok.mask_id == 4
    sentence = docs[0][0]
    ids = tok.encode(sentence)
    assert tok.decode(ids).replace(" ", "") == "".join(pre_tokenize(sentence))
    assert tok.encode("€") == [tok.unk_id]
    pieces = tok.pieces("unbelievable")
    assert pieces[0][:2] != "##" and all(p.startswith("##") for p in pieces[1:])


def test_story_corpus_is_reproducible_and_topical():
    a, ta = story_corpus(20, seed=3)
    b, tb = story_corpus(20, seed=3)
    assert a == b and ta == tb and story_corpus(20, seed=4)[0] != a
    for doc, topic in zip(a, ta):
        assert 4 <= len(doc) <= 8
        nouns = TOPICS[topic][0]
        assert all(any(n in s for n in nouns) for s in doc)
    with pytest.raises(ValueError):
        topic_sentences(random.Random(0), "cooking", 2)


def test_topic_classification_gives_a_new_character_to_every_sentence():
    sentences, labels = topic_classification(20, seed=5)
    assert len(sentences) == 20 * len(TOPICS) and labels == [i for i in range(len(TOPICS)) for _ in range(20)]
    assert (sentences, labels) == topic_classification(20, seed=5)
    names = {n for n, _ in NAMES}
    for label, topic in enumerate(TOPICS):
        nouns = TOPICS[topic][0]
        own = [s for s, lab in zip(sentences, labels) if lab == label]
        assert all(any(n in s.split() or n + "." in s.split() for n in nouns) for s in own)
        # a topic is not tied to one character: its 20 sentences use many names
        assert len({w for s in own for w in s.replace(",", "").replace(".", "").split() if w in names}) > 5
    with pytest.raises(ValueError):
        topic_classification(0)


def test_load_text_documents(tmp_path):
    path = tmp_path / "text.txt"
    path.write_text("First one. Second one!\nThird?\n\nOnly one.\n\nA b. C d. E f.\n")
    assert load_text_documents(path) == [["First one.", "Second one!", "Third?"], ["A b.", "C d.", "E f."]]
    assert split_sentences("a. b") == ["a.", "b"]
    with pytest.raises(FileNotFoundError):
        load_text_documents(tmp_path / "missing.txt")
    (tmp_path / "one.txt").write_text("Just. One document.")
    with pytest.raises(ValueError, match="blank line"):
        load_text_documents(tmp_path / "one.txt")


# MLM and NSP -------------------------------------------------------------------------

def _ids(B=300, T=400, V=500, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (B, T), generator=g)
    ids[:, 0], ids[:, T // 2], ids[:, -1] = 2, 3, 3
    ids[:, -20:-1] = 0
    return ids


def test_mask_tokens_statistics_and_contract():
    ids = _ids()
    before = ids.clone()
    masked, labels = bert.mask_tokens(ids, 500, 4, [0, 1, 2, 3, 4], 0.15, torch.Generator().manual_seed(1))
    assert torch.equal(ids, before)
    special = torch.isin(ids, torch.tensor([0, 1, 2, 3, 4]))
    selected = labels != -100
    assert not (selected & special).any() and torch.equal(masked[special], ids[special])
    assert torch.equal(labels[selected], ids[selected]) and torch.equal(masked[~selected], ids[~selected])
    assert abs(selected.sum() / (~special).sum() - 0.15) < 0.005
    frac_mask = (masked[selected] == 4).float().mean()
    frac_same = (masked[selected] == ids[selected]).float().mean()
    assert abs(frac_mask - 0.8) < 0.01 and abs(frac_same - 0.1) < 0.01 and abs(1 - frac_mask - frac_same - 0.1) < 0.01
    again = bert.mask_tokens(ids, 500, 4, [0, 1, 2, 3, 4], 0.15, torch.Generator().manual_seed(1))
    assert torch.equal(again[0], masked) and torch.equal(again[1], labels)
    with pytest.raises(TypeError):
        bert.mask_tokens(ids.float(), 500, 4, [0])


def test_nsp_pairs_half_is_next_and_not_next_from_another_document():
    docs = [[f"d{d}s{s}" for s in range(5)] for d in range(40)]
    pairs = bert_pretraining.sample_nsp_pairs(docs, 1000, random.Random(0))
    labels = [lab for _, _, lab in pairs]
    assert labels.count(bert_pretraining.IS_NEXT) == labels.count(bert_pretraining.NOT_NEXT) == 500
    for a, b, lab in pairs:
        da, sa = map(int, a[1:].split("s"))
        db, sb = map(int, b[1:].split("s"))
        if lab == bert_pretraining.IS_NEXT:
            assert da == db and sb == sa + 1
        else:
            assert da != db
    with pytest.raises(ValueError):
        bert_pretraining.sample_nsp_pairs([["only one"]], 2, random.Random(0))


def test_nsp_pairs_not_next_from_another_topic():
    docs = [[f"d{d}s{s}" for s in range(4)] for d in range(30)]
    topics = [d % 3 for d in range(30)]
    pairs = bert_pretraining.sample_nsp_pairs(docs, 600, random.Random(1), topics)
    assert [lab for _, _, lab in pairs].count(bert_pretraining.NOT_NEXT) == 300
    for a, b, lab in pairs:
        da, db = int(a[1:].split("s")[0]), int(b[1:].split("s")[0])
        assert (topics[da] == topics[db]) if lab == bert_pretraining.IS_NEXT else (topics[da] != topics[db])
    with pytest.raises(ValueError, match="2 topics for 30 documents"):
        bert_pretraining.sample_nsp_pairs(docs, 4, random.Random(0), [0, 1])
    with pytest.raises(ValueError, match="at least two topics"):
        bert_pretraining.sample_nsp_pairs(docs, 4, random.Random(0), [0] * 30)


def test_pretraining_loss_runs_the_mlm_head_at_selected_positions_only():
    docs, topics = story_corpus(40, seed=2)
    tok = SubwordTokenizer.train([s for d in docs for s in d], 80)
    data = bert_pretraining.PretrainingData.from_text(tok, docs, max_len=40, topics=topics)
    batch = data.batch(16, random.Random(0), torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    model = bert.BertForPreTraining(len(tok), d_model=16, num_heads=2, d_ff=32, num_layers=1, max_len=40).double()
    mlm_logits, nsp_logits = model(batch["input_ids"], batch["segment_ids"], batch["attention_mask"])
    full = bert.mlm_loss(mlm_logits, batch["mlm_labels"]) + F.cross_entropy(nsp_logits, batch["nsp_labels"])
    assert torch.allclose(bert_pretraining.pretraining_loss(model, batch), full, atol=1e-12)
    batch["mlm_labels"][:] = -100  # nothing selected: the NSP loss alone, not nan
    nsp_only = F.cross_entropy(nsp_logits, batch["nsp_labels"])
    assert torch.allclose(bert_pretraining.pretraining_loss(model, batch), nsp_only)


def test_make_nsp_input_and_embeddings():
    ids, seg = bert.make_nsp_input([10, 11], [12, 13, 14], 2, 3)
    assert ids.tolist() == [2, 10, 11, 3, 12, 13, 14, 3] and seg.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    emb = bert.BertEmbeddings(20, 8, 16)
    x = emb(ids[None], seg[None])
    assert x.shape == (1, 8, 8)
    expected = F.layer_norm(emb.token.weight[ids] + emb.position.weight[:8] + emb.segment.weight[seg], (8,),
                            emb.norm.weight, emb.norm.bias)
    assert torch.allclose(x[0], expected, atol=1e-6)
    with pytest.raises(ValueError, match="max_len"):
        emb(torch.zeros(1, 17, dtype=torch.long), torch.zeros(1, 17, dtype=torch.long))


def test_mlm_loss_mean_over_selected_positions():
    logits = torch.randn(2, 5, 7)
    labels = torch.full((2, 5), -100)
    labels[0, 1], labels[1, 4] = 3, 6
    expected = -(logits[0, 1].log_softmax(-1)[3] + logits[1, 4].log_softmax(-1)[6]) / 2
    assert torch.allclose(bert.mlm_loss(logits, labels), expected)


def test_model_heads_tied_padding_and_all_layers():
    torch.manual_seed(0)
    model = bert.BertForPreTraining(30, d_model=16, num_heads=2, d_ff=32, num_layers=3, max_len=12)
    assert model.mlm.decoder.weight is model.encoder.embeddings.token.weight
    ids = torch.randint(5, 30, (2, 10))
    seg = torch.zeros_like(ids)
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[0, 7:] = False
    model.eval()
    mlm_logits, nsp_logits = model(ids, seg, mask)
    assert mlm_logits.shape == (2, 10, 30) and nsp_logits.shape == (2, 2)
    changed = ids.clone()
    changed[0, 7:] = 0  # padding content must not matter
    assert torch.allclose(model(changed, seg, mask)[1], nsp_logits, atol=1e-5)
    states = model.encoder(ids, seg, mask, all_layers=True)
    assert len(states) == 4 and torch.allclose(states[-1], model.encoder(ids, seg, mask))


def test_bert_initialisation_starts_near_uniform_predictions_and_keeps_a_pretrained_encoder():
    torch.manual_seed(0)
    model = bert.BertForPreTraining(500, d_model=64, num_heads=4, d_ff=128, num_layers=2, max_len=32)
    ids = torch.randint(5, 500, (8, 20))
    with torch.no_grad():
        token = model.encoder.embeddings.token.weight
        assert abs(float(token.std()) - 0.02) < 0.002 and float(model.nsp.pooler.bias.abs().max()) == 0.0
        logits, _ = model(ids, torch.zeros_like(ids))
    loss = F.cross_entropy(logits.reshape(-1, 500), ids.reshape(-1))
    assert abs(float(loss) - math.log(500)) < 0.1  # ln V, not the ~25 of N(0, 1) embeddings tied to the output
    before = {k: v.clone() for k, v in model.encoder.state_dict().items()}
    bert.SequenceClassifier(model.encoder, 3)  # a new head must not re-initialise the encoder under it
    assert all(torch.equal(before[k], v) for k, v in model.encoder.state_dict().items())


def test_pretraining_and_finetuning_run_and_learn():
    docs, topics = story_corpus(200, seed=0)
    tok = SubwordTokenizer.train([s for d in docs for s in d], 150)
    data = bert_pretraining.PretrainingData.from_text(tok, docs, max_len=40)
    batch = data.batch(8, random.Random(0), torch.Generator().manual_seed(0))
    assert batch["input_ids"].shape[1] <= 40 and (batch["mlm_labels"] != -100).any()
    assert batch["attention_mask"].dtype == torch.bool
    torch.manual_seed(0)
    model = bert.BertForPreTraining(len(tok), d_model=32, num_heads=2, d_ff=64, num_layers=1, max_len=40)
    history = bert_pretraining.pretrain(model, data, steps=60, batch_size=16, lr=3e-3, warmup=10, progress=False)
    assert sum(history.losses[-10:]) / 10 < sum(history.losses[:10]) / 10
    acc = bert_pretraining.mlm_accuracy(model, data, n_pairs=100)
    base, token = bert_pretraining.unigram_baseline(data, data, n_pairs=100)
    assert 0 < base < 0.5 and 0 <= acc <= 1 and token not in SPECIALS  # quality: tests/notebooks/test_notebook_07.py
    assert 0 <= bert_pretraining.nsp_accuracy(model, data, n_pairs=100) <= 1
    names = list(TOPICS)
    sentences = [docs[i][0] for i in range(40)]
    labels = [names.index(topics[i]) for i in range(40)]
    cls_batch = bert_pretraining.classification_batch(tok, sentences, labels)
    clf = bert.SequenceClassifier(model.encoder, len(names))
    bert_pretraining.finetune(clf, cls_batch, steps=80, lr=3e-3, progress=False)
    assert bert_pretraining.classification_accuracy(clf, cls_batch) > 0.5
    feats = bert_pretraining.layer_features(model.encoder, cls_batch, "mean")
    assert len(feats) == 2 and feats[0].shape == (40, 32)
    accs = bert_pretraining.probe_layers(feats, cls_batch["labels"], feats, cls_batch["labels"], steps=100)
    assert len(accs) == 2 and all(0 <= a <= 1 for a in accs)
