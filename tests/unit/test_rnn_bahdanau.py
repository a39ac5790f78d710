"""course_lib's RNN and Bahdanau references against PyTorch, and the seq2seq models,
evaluation helpers and training loop they are used with."""

from __future__ import annotations

import random

import pytest
import torch
from torch import nn

from conftest import devices
from course_lib import bahdanau, rnn
from course_lib.data.copy import CopyTask
from course_lib.data.vocab import Vocab, make_seq2seq_batch, pad_sequences
from course_lib.seq2seq import accuracy_by_length, evaluate, score_predictions
from course_lib.training import TrainHistory, train


def _rnn_inputs(B=3, T=7, D=4, H=5, dtype=torch.float64, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=g, dtype=dtype).to(device)
    return mk(B, T, D), mk(B, H), mk(H, D), mk(H, H) * 0.5, mk(H)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rnn_forward_matches_torch_rnn(device, dtype):
    """Against torch.nn.RNN computed in float64 (on the same device): on a GPU, cuDNN's RNN runs
    float32 in TF32 by default (2e-3 off a float64 reference, where course_lib's float32 loop is
    2e-7 off), so float32 is held to float64's answer, not to cuDNN's float32 one."""
    X, h0, W_xh, W_hh, b_h = _rnn_inputs(dtype=torch.float64, device=device)
    layer = nn.RNN(4, 5, batch_first=True).to(device=device, dtype=torch.float64)
    with torch.no_grad():
        layer.weight_ih_l0.copy_(W_xh)
        layer.weight_hh_l0.copy_(W_hh)
        layer.bias_ih_l0.copy_(b_h)
        layer.bias_hh_l0.zero_()
        expected, h_n = layer(X, h0[None])
    X, h0, W_xh, W_hh, b_h = (t.to(dtype) for t in (X, h0, W_xh, W_hh, b_h))
    expected = expected.to(dtype)
    got = rnn.rnn_forward(X, h0, W_xh, W_hh, b_h)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    assert got.shape == (3, 7, 5) and got.dtype == dtype and got.device.type == torch.device(device).type
    torch.testing.assert_close(got, expected, atol=tol, rtol=tol)
    torch.testing.assert_close(rnn.rnn_step(X[:, 0], h0, W_xh, W_hh, b_h), expected[:, 0], atol=tol, rtol=tol)


def test_rnn_shape_errors_are_clear():
    X, h0, W_xh, W_hh, b_h = _rnn_inputs()
    with pytest.raises(ValueError, match="W_hh must be square"):
        rnn.rnn_step(X[:, 0], h0, W_xh, W_hh[:, :4], b_h)
    with pytest.raises(ValueError, match="D_in"):
        rnn.rnn_step(X[:, 0, :3], h0, W_xh, W_hh, b_h)
    with pytest.raises(ValueError, match="B, T, D_in"):
        rnn.rnn_forward(X[0], h0, W_xh, W_hh, b_h)


@pytest.mark.parametrize("radius", [0.5, 1.0, 3.0])
def test_jacobian_norms_match_autograd(radius):
    W = rnn.random_rnn_weights(3, 6, radius, seed=1)
    g = torch.Generator().manual_seed(2)
    X = torch.randn(9, 3, generator=g, dtype=torch.float64)
    h0 = torch.randn(6, generator=g, dtype=torch.float64)
    norms = rnn.jacobian_norms(X, h0, **W)
    hs = rnn.rnn_forward(X[None], h0[None], **W)[0]
    assert norms.shape == (9,)
    for t in range(9):
        def rest(h, t=t):
            for s in range(t + 1, 9):
                h = rnn.rnn_step(X[s][None], h[None], **W)[0]
            return h
        J = torch.autograd.functional.jacobian(rest, hs[t])
        torch.testing.assert_close(norms[t], torch.linalg.norm(J), rtol=1e-9, atol=1e-12)
    assert norms[-1] == pytest.approx(6 ** 0.5)


def test_spectral_radius_controls_vanishing_and_exploding():
    X = 0.1 * torch.randn(30, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    h0 = torch.zeros(32, dtype=torch.float64)
    small = rnn.jacobian_norms(X, h0, **rnn.random_rnn_weights(4, 32, 0.5, seed=0))
    large = rnn.jacobian_norms(X, h0, **rnn.random_rnn_weights(4, 32, 3.0, seed=0))
    assert rnn.spectral_radius(rnn.random_rnn_weights(4, 32, 0.5)["W_hh"]) == pytest.approx(0.5)
    assert small[0] < 1e-6 < large[0] / 100


def test_time_recurrence_reports_both_timings_and_counts_what_each_computes():
    out = rnn.time_recurrence([4, 16], batch_size=2, hidden_size=8, repeats=1)
    assert out["length"] == [4, 16] and all(t > 0 for t in out["sequential"] + out["parallel"])
    # the same arithmetic: two (B, H) x (H, H) products per position, 2 operations a multiply-add
    assert out["sequential_flops"] == out["parallel_flops"] == [2 * 2 * T * 2 * 8 * 8 for T in (4, 16)]
    # the loop runs the same few operations at every step, one after another; the product a few in all
    per_step = [(b - a) / 12 for a, b in [out["sequential_operations"]]]
    assert per_step[0] >= 2 and out["sequential_operations"][0] == 4 * per_step[0] + 1
    assert out["parallel_operations"][0] == out["parallel_operations"][1] < per_step[0] * 4


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_scores_softmax_and_context(device, dtype):
    g = torch.Generator().manual_seed(0)
    mk = lambda *s: torch.randn(*s, generator=g, dtype=dtype).to(device)
    h, s, W, W_h, W_s, v = mk(2, 5, 4), mk(2, 3), mk(4, 3), mk(6, 4), mk(6, 3), mk(6)
    for b in range(2):
        for i in range(5):
            assert torch.isclose(bahdanau.general_score(h, s, W)[b, i], h[b, i] @ W @ s[b])
            assert torch.isclose(bahdanau.additive_score(h, s, W_h, W_s, v)[b, i], v @ torch.tanh(W_h @ h[b, i] + W_s @ s[b]))
            assert torch.isclose(bahdanau.dot_score(h, h[:, 0])[b, i], h[b, i] @ h[b, 0])
    mask = torch.tensor([[True] * 5, [True, True, False, False, False]], device=device)
    scores = mk(2, 5)
    w = bahdanau.masked_softmax(scores, mask)
    torch.testing.assert_close(w[1, :2], torch.softmax(scores[1, :2], -1))
    assert (w[1, 2:] == 0).all() and torch.allclose(w.sum(-1), torch.ones(2, dtype=dtype, device=device))
    c = bahdanau.context_vector(w, h)
    torch.testing.assert_close(c[1], w[1, 0] * h[1, 0] + w[1, 1] * h[1, 1])
    with pytest.raises(ValueError, match="D_h == D_s"):
        bahdanau.dot_score(h, s)
    with pytest.raises(TypeError, match="boolean"):
        bahdanau.masked_softmax(scores, mask.long())


def test_bahdanau_attention_module_matches_the_functions():
    torch.manual_seed(0)
    att = bahdanau.BahdanauAttention(6, 4, 5)
    assert {k: tuple(p.shape) for k, p in att.state_dict().items()} == {
        "W_h.weight": (5, 6), "W_s.weight": (5, 4), "W_s.bias": (5,), "v.weight": (1, 5)}
    h, s = torch.randn(3, 7, 6), torch.randn(3, 4)
    mask = torch.arange(7)[None, :] < torch.tensor([7, 4, 1])[:, None]
    c, w = att(h, s, mask)
    scores = torch.tanh(h @ att.W_h.weight.T + (s @ att.W_s.weight.T + att.W_s.bias)[:, None]) @ att.v.weight[0]
    torch.testing.assert_close(w, bahdanau.masked_softmax(scores, mask))
    torch.testing.assert_close(c, bahdanau.context_vector(w, h))
    assert (w[2, 1:] == 0).all()


def _tiny_copy_batch():
    task = CopyTask(min_len=2, max_len=5)
    return task, task.sample_batch(6, random.Random(0))


def test_seq2seq_models_shapes_and_padding_invariance():
    task, batch = _tiny_copy_batch()
    V = len(task.src_vocab)
    torch.manual_seed(0)
    for model in (rnn.FixedContextSeq2Seq(V, V, 8, 16), rnn.FixedContextSeq2Seq(V, V, 8, 16, cell="gru"),
                  bahdanau.AttentionSeq2Seq(V, V, 8, 8, 16, 8)):
        model.eval()
        out = model(batch.src, batch.src_mask, batch.tgt_in)
        logits = out[0] if isinstance(out, tuple) else out
        assert logits.shape == (6, batch.tgt_in.size(1), V)
        # extra padding on the right changes nothing
        pad = torch.zeros(6, 3, dtype=torch.long)
        out2 = model(torch.cat([batch.src, pad], 1), torch.cat([batch.src_mask, pad.bool()], 1), batch.tgt_in)
        torch.testing.assert_close(out2[0] if isinstance(out2, tuple) else out2, logits, atol=1e-5, rtol=1e-5)
        greedy = model.greedy(batch.src, batch.src_mask, 4, task.tgt_vocab.bos_id)
        tokens = greedy[0] if isinstance(greedy, tuple) else greedy
        assert tokens.shape == (6, 4) and tokens.dtype == torch.long
    _, w = bahdanau.AttentionSeq2Seq(V, V, 8, 8, 16, 8)(batch.src, batch.src_mask, batch.tgt_in)
    assert (w[~batch.src_mask[:, None, :].expand_as(w)] == 0).all()
    with pytest.raises(ValueError, match="cell"):
        rnn.FixedContextSeq2Seq(V, V, cell="lstm")


def test_scores_and_accuracy_by_length():
    vocab = Vocab.build("ab")
    batch = make_seq2seq_batch([("ab", "ab"), ("abab", "abab"), ("b", "b")], vocab, vocab)
    pred = batch.tgt_out.clone()
    pred[1, 3] = vocab.id("a")  # one wrong token in the 4-long target
    pred[0, 2:] = 1  # padding positions are not scored
    s = score_predictions(pred, batch)
    assert s.exact_match == pytest.approx(2 / 3) and s.token_accuracy == pytest.approx(6 / 7)
    assert s.per_position.tolist()[:3] == [1.0, 1.0, 1.0] and s.per_position[3] == 0.0
    r = accuracy_by_length(s)
    assert r == {"length": [1.0, 2.0, 4.0], "accuracy": [1.0, 1.0, 0.0], "count": [1, 1, 1]}
    ids, mask = pad_sequences([[1, 2], [3]], pad_id=0)
    assert ids.tolist() == [[1, 2], [3, 0]] and mask.tolist() == [[True, True], [True, False]]


def test_evaluate_keeps_the_decoders_attention_weights():
    vocab = Vocab.build("ab")
    batch = make_seq2seq_batch([("ab", "ab"), ("abab", "abab"), ("b", "b")], vocab, vocab)
    torch.manual_seed(0)
    V = len(vocab)
    attentive = bahdanau.AttentionSeq2Seq(V, V, 8, 8, 16, 8)
    scores = evaluate(attentive, batch, vocab.bos_id)
    assert attentive.training  # evaluate decodes in eval mode and restores the mode it found
    with torch.no_grad():
        tokens, weights = attentive.eval().greedy(batch.src, batch.src_mask, batch.tgt_out.size(1), vocab.bos_id)
    assert scores.weights is not None and scores.weights.shape == (3, batch.tgt_out.size(1), batch.src.size(1))
    torch.testing.assert_close(scores.weights, weights)
    assert scores.exact_match == score_predictions(tokens, batch).exact_match
    plain = rnn.FixedContextSeq2Seq(V, V, 8, 16)
    assert evaluate(plain, batch, vocab.bos_id).weights is None


def test_training_loop_learns_and_records_history():
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    g = torch.Generator().manual_seed(0)
    true_w = torch.tensor([[1.0, -2.0, 0.5]])

    def next_batch(step):
        x = torch.randn(32, 3, generator=g)
        return x, x @ true_w.T + 0.3

    def loss_fn(m, batch):
        x, y = batch
        return ((m(x) - y) ** 2).mean()

    history = train(model, next_batch, loss_fn, steps=150, lr=0.1, schedule=lambda s: 0.99 ** s,
                    eval_fn=lambda m: {"w_error": float((m.weight - true_w).abs().max())}, eval_every=50,
                    progress=False)
    assert isinstance(history, TrainHistory) and history.steps == 150 and history.seconds > 0
    assert history.smoothed(20)[-1] < 0.01 * history.losses[0]
    assert [s for s, _ in history.evals["w_error"]] == [50, 100, 150]
    assert history.evals["w_error"][-1][1] < 0.05 and not model.training


def test_training_loop_stops_on_a_non_finite_loss():
    model = nn.Linear(2, 1)
    with pytest.raises(FloatingPointError, match="step 1"):
        train(model, lambda step: None, lambda m, b: m.weight.sum() * float("nan"), steps=3, progress=False)


def test_training_loop_restores_the_thread_setting(two_threads):
    before = torch.get_num_threads()
    model = nn.Linear(2, 1)
    seen = []

    def loss_fn(m, batch):
        seen.append(torch.get_num_threads())
        return m(batch).pow(2).mean()

    train(model, lambda step: torch.ones(4, 2), loss_fn, steps=2, progress=False, num_threads=1)
    assert seen == [1, 1] and torch.get_num_threads() == before
    train(model, lambda step: torch.ones(4, 2), loss_fn, steps=1, progress=False)  # "auto": a small model, one thread
    train(model, lambda step: torch.ones(4, 2), loss_fn, steps=1, progress=False, num_threads=None)  # left alone
    assert seen[2:] == [1, before] and torch.get_num_threads() == before
    for wrong in (0, "all", 1.5):
        with pytest.raises(ValueError, match="num_threads"):
            train(model, lambda step: None, loss_fn, steps=1, num_threads=wrong)


def test_threads_for_picks_one_thread_for_small_models_on_the_cpu():
    from course_lib.device import SMALL_MODEL_PARAMETERS, threads_for

    assert threads_for(nn.Linear(10, 10)) == 1
    big = nn.Embedding(SMALL_MODEL_PARAMETERS // 8, 8)  # exactly at the limit: no longer small
    assert threads_for(big) is None
    assert threads_for(nn.ReLU()) is None  # no parameters, nothing to decide
    if torch.cuda.is_available():
        assert threads_for(nn.Linear(10, 10).cuda()) is None


def test_torch_threads_is_scoped(two_threads):
    from course_lib.device import torch_threads

    before = torch.get_num_threads()
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with torch_threads(None):
        assert torch.get_num_threads() == before
    with torch_threads("auto", nn.Linear(4, 4)):  # a small model: one thread
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    for wrong, model in ((0, None), (True, None), ("auto", None)):  # "auto" needs a model to judge
        with pytest.raises(ValueError, match="num_threads"):
            with torch_threads(wrong, model):
                pass


def test_context_readout_reads_every_position_from_c_alone():
    from course_lib.rnn import ContextReadout

    torch.manual_seed(0)
    model = ContextReadout(vocab_size=12, max_len=6)
    src = torch.randint(0, 12, (3, 5))
    assert model(src).shape == (3, 5, 12)
    # the logits depend on the input only through c = h_n: same final state, same logits
    _, h_n = model.encoder(model.embedding(src))
    assert torch.allclose(model.readout(torch.cat([h_n[0][:, None].expand(3, 5, -1),
                                                   model.position.weight[:5][None].expand(3, 5, -1)], -1)), model(src))
    assert model.per_position_accuracy(src).shape == (5,)
    with pytest.raises(ValueError, match="max_len"):
        model(torch.randint(0, 12, (1, 7)))
