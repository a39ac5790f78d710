"""course_lib's Transformer pieces against PyTorch and sacrebleu: LayerNorm, FFN, encoder
and decoder layers, whole stacks (post-LN and pre-LN, with padding), the parameter count,
the warm-up schedule, label smoothing, decoding, BLEU and the toy translation data."""

from __future__ import annotations

import math
import random

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import devices
from course_lib.bleu import bleu, sentence_bleu_simple
from course_lib.data.translation import (ADJECTIVES, NOUNS, OBJECT_PARTICLE, VERBS, make_translation_data,
                                         verb_position)
from course_lib.decoding import beam_search, capture_attention, greedy_decode, length_penalty, teacher_forcing_loss
from course_lib.grading.answer.fixtures.transformer import ScriptedModel
from course_lib.optim import label_smoothed_cross_entropy, noam_lambda, noam_lr
from course_lib.transformer import (Decoder, DecoderLayer, Encoder, EncoderLayer, LayerNorm, PositionwiseFeedForward,
                                    Transformer, copy_decoder_layer_from_torch, copy_encoder_layer_from_torch,
                                    copy_stacks_from_torch, transformer_parameter_count)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_layer_norm_equals_torch(device, dtype):
    torch.manual_seed(0)
    ours, theirs = LayerNorm(12).to(device, dtype), nn.LayerNorm(12).to(device, dtype)
    with torch.no_grad():
        theirs.weight.normal_()
        theirs.bias.normal_()
        ours.gamma.copy_(theirs.weight)
        ours.beta.copy_(theirs.bias)
    for scale in (1.0, 3e-3):  # small spread: eps matters
        x = (torch.randn(3, 5, 12, dtype=dtype) * scale).to(device)
        torch.testing.assert_close(ours(x), theirs(x))
    assert [n for n, _ in ours.named_parameters()] == ["gamma", "beta"]


def test_layer_norm_rejects_wrong_width():
    with pytest.raises(ValueError, match="features"):
        LayerNorm(8)(torch.randn(2, 7))


def _torch_layers(norm_first):
    torch.manual_seed(1)
    enc = nn.TransformerEncoderLayer(16, 4, 40, dropout=0.0, batch_first=True, norm_first=norm_first)
    dec = nn.TransformerDecoderLayer(16, 4, 40, dropout=0.0, batch_first=True, norm_first=norm_first)
    for layer in (enc, dec):  # move the norms away from (1, 0)
        for name, p in layer.named_parameters():
            if "norm" in name:
                with torch.no_grad():
                    p.add_(0.3 * torch.randn_like(p))
    return enc, dec


@pytest.mark.parametrize("norm_first", [False, True])
def test_layers_equal_torch_layers(norm_first):
    enc_t, dec_t = _torch_layers(norm_first)
    enc = copy_encoder_layer_from_torch(EncoderLayer(16, 4, 40, norm_first=norm_first), enc_t)
    dec = copy_decoder_layer_from_torch(DecoderLayer(16, 4, 40, norm_first=norm_first), dec_t)
    x, mem = torch.randn(3, 6, 16), torch.randn(3, 8, 16)
    ok = torch.arange(8)[None, :] < torch.tensor([8, 5, 2])[:, None]
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    torch.testing.assert_close(enc(mem, ok[:, None, :]), enc_t(mem, src_key_padding_mask=~ok))
    torch.testing.assert_close(dec(x, mem, causal, ok[:, None, :]),
                               dec_t(x, mem, tgt_mask=~causal, memory_key_padding_mask=~ok))


@pytest.mark.filterwarnings("ignore:enable_nested_tensor")
@pytest.mark.parametrize("norm_first", [False, True])
def test_stacks_equal_torch_transformer(norm_first):
    torch.manual_seed(2)
    theirs = nn.Transformer(24, 4, 3, 2, 48, dropout=0.0, batch_first=True, norm_first=norm_first)
    enc = Encoder(3, 24, 4, 48, norm_first=norm_first, final_norm=True)
    dec = Decoder(2, 24, 4, 48, norm_first=norm_first, final_norm=True)
    copy_stacks_from_torch(enc, dec, theirs)
    src, tgt = torch.randn(2, 9, 24, dtype=torch.float64), torch.randn(2, 4, 24, dtype=torch.float64)
    theirs, enc, dec = theirs.double(), enc.double(), dec.double()
    ok = torch.arange(9)[None, :] < torch.tensor([9, 3])[:, None]
    causal = torch.ones(4, 4, dtype=torch.bool).tril()
    ours = dec(tgt, enc(src, ok[:, None, :]), causal, ok[:, None, :])
    ref = theirs(src, tgt, tgt_mask=~causal, src_key_padding_mask=~ok, memory_key_padding_mask=~ok)
    torch.testing.assert_close(ours, ref)


def test_copy_needs_final_norms():
    theirs = nn.Transformer(8, 2, 1, 1, 16, batch_first=True)
    with pytest.raises(ValueError, match="final_norm=True"):
        copy_stacks_from_torch(Encoder(1, 8, 2, 16), Decoder(1, 8, 2, 16), theirs)


def test_final_norm_default_follows_norm_first():
    assert Encoder(1, 8, 2, 16).norm is None and Encoder(1, 8, 2, 16, norm_first=True).norm is not None


def test_transformer_base_parameter_count():
    base = dict(d_model=512, num_heads=8, num_encoder_layers=6, num_decoder_layers=6, d_ff=2048)
    with torch.device("meta"):
        model = Transformer(37000, **base)
        torch_body = nn.Transformer(512, 8, 6, 6, 2048, batch_first=True)
    counted = sum(p.numel() for p in model.parameters())
    assert counted == transformer_parameter_count(37000, **base, out_bias=True)
    body = sum(p.numel() for p in torch_body.parameters())
    assert body + 37000 * 512 == transformer_parameter_count(37000, **base, final_norms=True)
    assert 60e6 < counted < 66e6  # "65M" in the paper


def test_ffn_is_positionwise():
    ffn = PositionwiseFeedForward(6, 10)
    x = torch.randn(2, 5, 6)
    torch.testing.assert_close(ffn(x)[:, 2], ffn(x[:, 2:3])[:, 0])
    assert torch.equal(ffn(x), ffn.linear2(torch.relu(ffn.linear1(x))))


def test_transformer_decoder_is_causal_and_ignores_source_padding():
    torch.manual_seed(3)
    model = Transformer(20, d_model=16, num_heads=2, num_encoder_layers=2, num_decoder_layers=2, d_ff=32,
                        dropout=0.0).eval()
    src = torch.randint(4, 20, (2, 7))
    tgt = torch.randint(4, 20, (2, 5))
    mask = (torch.arange(7)[None, :] < torch.tensor([7, 4])[:, None])[:, None, :]
    out = model(src, tgt, mask)
    tgt2 = tgt.clone()
    tgt2[:, 3:] = 1
    torch.testing.assert_close(model(src, tgt2, mask)[:, :3], out[:, :3])
    src2 = src.clone()
    src2[1, 4:] = 0
    torch.testing.assert_close(model(src2, tgt, mask)[1], out[1])
    assert out.shape == (2, 5, 20)


def test_embeddings_are_shared_and_scaled():
    model = Transformer(30, d_model=16, num_heads=2, num_encoder_layers=1, num_decoder_layers=1, d_ff=32, dropout=0.0)
    tokens = torch.tensor([[5]])
    expected = model.embedding.weight[5] * 4.0 + torch.tensor([0.0, 1.0] * 8)  # PE at position 0
    torch.testing.assert_close(model.embed(tokens)[0, 0], expected)
    assert model.embedding.weight.data_ptr() not in {p.data_ptr() for n, p in model.named_parameters()
                                                     if n != "embedding.weight"}


@pytest.mark.parametrize("warmup", [10, 4000])
def test_noam_lr(warmup):
    rates = [noam_lr(s, 512, warmup) for s in range(1, 3 * warmup)]
    assert max(range(len(rates)), key=rates.__getitem__) + 1 == warmup
    assert noam_lr(warmup, 512, warmup) == pytest.approx(512 ** -0.5 * warmup ** -0.5)
    assert noam_lr(1, 512, warmup) == pytest.approx(512 ** -0.5 * warmup ** -1.5)
    assert noam_lambda(512, warmup)(0) == noam_lr(1, 512, warmup)
    with pytest.raises(ValueError, match="from 1"):
        noam_lr(0, 512, warmup)


@pytest.mark.parametrize("ignore_index", [-100, 0, 3])
@pytest.mark.parametrize("epsilon", [0.0, 0.1, 0.5, 1.0])
def test_label_smoothing_equals_torch(ignore_index, epsilon):
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(4, 6, 9, generator=g, dtype=torch.float64, requires_grad=True)
    target = torch.randint(0, 9, (4, 6), generator=g)
    target[torch.rand(4, 6, generator=g) < 0.3] = ignore_index
    ours = label_smoothed_cross_entropy(logits, target, epsilon, ignore_index)
    theirs = F.cross_entropy(logits.reshape(-1, 9), target.reshape(-1), label_smoothing=epsilon,
                             ignore_index=ignore_index)
    torch.testing.assert_close(ours, theirs)
    (g1,) = torch.autograd.grad(ours, logits)
    (g2,) = torch.autograd.grad(theirs, logits)
    torch.testing.assert_close(g1, g2)


def _scripted_batch():
    src = torch.randint(3, 12, (4, 6), generator=torch.Generator().manual_seed(5))
    mask = (torch.arange(6)[None, :] < torch.tensor([4, 2, 6, 3])[:, None])[:, None, :]
    return src, mask


def test_greedy_decode_on_a_scripted_model():
    model = ScriptedModel()
    src, mask = _scripted_batch()
    out = greedy_decode(model, src, mask, 1, 2, 12)
    assert out.dtype == torch.long and out.shape == (4, 7)  # the longest sentence: <bos> + 5 tokens + <eos>
    assert (out[:, 0] == 1).all()
    for b, length in enumerate([4, 2, 6, 3]):
        assert out[b, length] == 2 and (out[b, length:] == 2).all() and (out[b, 1:length] != 2).all()
    assert greedy_decode(model, src, mask, 1, 2, 3).shape == (4, 3)


@pytest.mark.parametrize("device", devices())
def test_beam_of_one_is_greedy_and_wider_beams_score_no_worse(device):
    torch.manual_seed(6)
    model = Transformer(15, d_model=16, num_heads=2, num_encoder_layers=1, num_decoder_layers=1, d_ff=32,
                        dropout=0.0).eval().to(device)
    with torch.no_grad():
        model.out_bias[2] = 1.0
    src = torch.randint(3, 15, (5, 6), device=device)
    mask = torch.ones(5, 1, 6, dtype=torch.bool, device=device)
    greedy = greedy_decode(model, src, mask, 1, 2, 10)
    beams1 = beam_search(model, src, mask, 1, 2, 10, beam_size=1, alpha=0.0)
    for row, seq in zip(greedy.tolist(), beams1):
        assert row[:len(seq)] == seq

    def score(seq, b, alpha):
        ys = torch.tensor([seq], device=device)
        with torch.no_grad():
            logp = model(src[b:b + 1], ys[:, :-1], mask[b:b + 1]).log_softmax(-1)
        total = logp[0].gather(-1, ys[0, 1:, None]).sum().item()
        return total / length_penalty(len(seq) - 1, alpha)

    for alpha in (0.0, 0.6):
        wide = beam_search(model, src, mask, 1, 2, 10, beam_size=5, alpha=alpha)
        narrow = beam_search(model, src, mask, 1, 2, 10, beam_size=1, alpha=alpha)
        for b in range(5):
            if wide[b][-1] == 2 and narrow[b][-1] == 2:
                assert score(wide[b], b, alpha) >= score(narrow[b], b, alpha) - 1e-6


def test_beam_search_of_a_batch_searches_each_sentence_as_if_alone():
    # the sentences of a batch are searched together; slots of finished or missing hypotheses
    # must not change any sentence's result (float64: no rounding differences between batch sizes)
    for seed in range(3):
        torch.manual_seed(seed)
        model = Transformer(15, d_model=16, num_heads=2, num_encoder_layers=1, num_decoder_layers=1, d_ff=32,
                            dropout=0.0).double().eval()
        with torch.no_grad():
            model.out_bias[2] = 0.5 * seed  # from rarely to often finished early
        src = torch.randint(3, 15, (12, 7))
        mask = (torch.arange(7)[None] < torch.randint(2, 8, (12,))[:, None])[:, None, :]
        for beam_size, alpha, max_len in ((4, 0.6, 12), (3, 0.0, 6)):
            together = beam_search(model, src, mask, 1, 2, max_len, beam_size=beam_size, alpha=alpha)
            alone = [beam_search(model, src[b:b + 1], mask[b:b + 1], 1, 2, max_len, beam_size=beam_size,
                                 alpha=alpha)[0] for b in range(12)]
            assert together == alone
            assert all(seq[0] == 1 and len(seq) <= max_len for seq in together)


def test_capture_attention_collects_every_layer():
    model = Transformer(20, d_model=16, num_heads=2, num_encoder_layers=1, num_decoder_layers=3, d_ff=32, dropout=0.0)
    src, tgt = torch.randint(4, 20, (2, 7)), torch.randint(4, 20, (2, 5))
    with capture_attention([layer.cross_attn for layer in model.decoder.layers]) as weights:
        model(src, tgt)
    assert len(weights) == 3 and weights[0].shape == (2, 2, 5, 7)
    torch.testing.assert_close(weights[0].sum(-1), torch.ones(2, 2, 5))
    model(src, tgt)
    assert len(weights) == 3  # hooks removed


def _random_corpus(rng, n):
    refs = [[rng.choice("abcdef") for _ in range(rng.randint(1, 14))] for _ in range(n)]
    cands = [[w if rng.random() < 0.7 else rng.choice("abcdef") for w in r][:rng.randint(0, 16)] for r in refs]
    return cands, refs


@pytest.mark.parametrize("seed", range(20))
def test_bleu_equals_sacrebleu(seed):
    sacrebleu = pytest.importorskip("sacrebleu")
    rng = random.Random(seed)
    cands, refs = _random_corpus(rng, rng.randint(1, 12))
    for max_n in (4, 2):
        metric = sacrebleu.metrics.BLEU(tokenize="none", smooth_method="none", max_ngram_order=max_n)
        expected = metric.corpus_score([" ".join(c) for c in cands], [[" ".join(r) for r in refs]]).score / 100
        assert bleu(cands, refs, max_n=max_n) == pytest.approx(expected, abs=1e-9)


def test_bleu_edge_cases():
    assert bleu([["a", "b", "c", "d"]], [["a", "b", "c", "d"]]) == 1.0
    assert bleu([["the"] * 4], [["the", "cat", "sat", "on", "the", "mat"]], max_n=1) == pytest.approx(
        0.5 * math.exp(1 - 6 / 4))
    assert bleu([[]], [["a"]]) == 0.0
    with pytest.raises(ValueError, match="candidates"):
        bleu([["a"]], [])
    with pytest.raises(TypeError, match="token lists"):
        bleu(["a b"], ["a b"])
    assert sentence_bleu_simple(list("abcd"), list("abcd")) == 1.0


def test_toy_translation_grammar_and_splits():
    data = make_translation_data(2000, 200, 200, seed=0)
    again = make_translation_data(2000, 200, 200, seed=0)
    assert data.train == again.train and data.test == again.test
    assert make_translation_data(2000, 200, 200, seed=1).train != data.train
    splits = [{tuple(s) for s, _ in getattr(data, n)} for n in ("train", "valid", "test")]
    assert sum(map(len, splits)) == 2400 and len(set.union(*splits)) == 2400  # distinct and disjoint
    verbs_sg = {t[0] for t in VERBS.values()}
    verbs_pl = {t[1] for t in VERBS.values()}
    adjectives = {f for forms in ADJECTIVES.values() for f in forms}
    nouns = {f for forms in NOUNS.values() for f in forms}
    for src, tgt in data.train[:300]:
        assert tgt[-2] == OBJECT_PARTICLE and tgt[-1] in verbs_sg | verbs_pl  # SOV
        assert src[verb_position(src)] in {v for pair in VERBS for v in pair}
        assert 0 < verb_position(src) < len(src) - 1
        subject_plural = src[0] == "some" or src[verb_position(src)] in {p[1] for p in VERBS}
        assert (tgt[-1] in verbs_pl) == subject_plural  # the verb agrees with the subject
        for i, word in enumerate(tgt):
            if word in adjectives:
                assert tgt[i - 1] in nouns  # adjective after the noun
                assert word.endswith("i") == tgt[i - 1].endswith("s")  # number agreement
    vocab = set(data.vocab.tokens)
    assert all(w in vocab for s, t in data.train for w in s + t)


def test_batch_layout_for_teacher_forcing():
    data = make_translation_data(50, 5, 5, seed=0)
    batch = data.make_batch(data.train[:3])
    for b, (src, tgt) in enumerate(data.train[:3]):
        assert data.to_words(batch.src[b]) == src
        assert batch.src_mask[b, 0].sum() == len(src) and batch.src_mask.shape[1] == 1
        assert batch.tgt_in[b, 0] == data.bos_id and data.to_words(batch.tgt_in[b, 1:]) == tgt
        assert batch.tgt_out[b, len(tgt)] == data.eos_id and data.to_words(batch.tgt_out[b]) == tgt
    model = Transformer(len(data.vocab), d_model=16, num_heads=2, num_encoder_layers=1, num_decoder_layers=1,
                        d_ff=32, dropout=0.0)
    loss = teacher_forcing_loss(model, batch.src, batch.src_mask, batch.tgt_in, batch.tgt_out, 0.1, data.pad_id)
    assert loss.dim() == 0 and math.isfinite(loss.item())
    with pytest.raises(ValueError, match="split"):
        data.split("dev")
