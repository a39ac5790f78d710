"""course_lib's GPT, sampling, in-context-learning and induction references."""

from __future__ import annotations

import math

import pytest
import torch

from course_lib.gpt import GPT, GPT2_XL, GPT3, GPTBlock, gpt_parameter_count
from course_lib.icl import (GaussianClassTasks, ICLTransformer, NearestCentroid, TokenTaskFamily, few_shot_accuracy,
                            parameters_unchanged)
from course_lib.induction import (AttentionOnlyTransformer, induction_scores, per_position_loss,
                                  previous_token_scores, repeated_random_tokens)
from course_lib.sampling import generate, next_token_probs, sample_next_token


def test_block_is_causal_and_pre_ln():
    torch.manual_seed(0)
    block = GPTBlock(16, 4, 64).double()
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    y = x.clone()
    y[:, 4:] += 1.0
    assert torch.allclose(block(x)[:, :4], block(y)[:, :4], atol=1e-12)
    assert not torch.allclose(block(x)[:, 4:], block(y)[:, 4:])
    # pre-LN by hand
    h = block.ln1(x)
    mask = torch.ones(7, 7, dtype=torch.bool).tril()
    a, _ = block.attn(h, h, h, mask)
    mid = x + a
    assert torch.allclose(block(x), mid + block.mlp(block.ln2(mid)), atol=1e-12)


def test_block_fast_path_equals_weights_path():
    torch.manual_seed(1)
    block = GPTBlock(16, 2, 32)
    x = torch.randn(3, 5, 16)
    out, w = block(x, need_weights=True)
    assert torch.allclose(block(x), out, atol=1e-5)
    assert w.shape == (3, 2, 5, 5) and bool((w.triu(1) == 0).all())


def test_gpt_ties_embeddings_and_checks_block_size():
    model = GPT(vocab_size=30, block_size=8, d_model=16, num_layers=2, num_heads=2)
    assert model.head.weight is model.tok_emb.weight
    logits, weights = model(torch.randint(0, 30, (2, 8)), need_weights=True)
    assert logits.shape == (2, 8, 30) and len(weights) == 2
    with pytest.raises(ValueError, match="block size 8"):
        model(torch.randint(0, 30, (1, 9)))


@pytest.mark.parametrize("n_layer,d,V,n_ctx,tied", [(2, 32, 50, 16, True), (3, 48, 100, 32, True), (0, 8, 11, 4, True)])
def test_parameter_count_matches_a_real_model(n_layer, d, V, n_ctx, tied):
    model = GPT(V, n_ctx, d, n_layer, num_heads=4 if d % 4 == 0 else 1)
    assert gpt_parameter_count(n_layer, d, V, n_ctx, tied) == sum(p.numel() for p in model.parameters())


def test_untied_count_adds_the_output_matrix():
    assert gpt_parameter_count(2, 8, 11, 5, tied=False) - gpt_parameter_count(2, 8, 11, 5) == 11 * 8


def test_gpt2_and_gpt3_sizes():
    hp2 = {k: v for k, v in GPT2_XL.items() if k != "num_heads"}
    hp3 = {k: v for k, v in GPT3.items() if k != "num_heads"}
    assert gpt_parameter_count(**hp2) == 1_557_611_200  # GPT-2 XL, as published
    assert 174e9 < gpt_parameter_count(**hp3) < 176e9
    with pytest.raises(ValueError):
        gpt_parameter_count(2, 8.0, 11, 5)


def test_greedy_and_probabilities():
    logits = torch.tensor([[0.0, 2.0, 1.0], [3.0, -1.0, 0.0]])
    assert sample_next_token(logits, temperature=0).tolist() == [1, 0]
    p = next_token_probs(logits, temperature=0.5, top_k=2)
    assert torch.allclose(p.sum(-1), torch.ones(2))
    assert p[0, 0] == 0 and p[1, 1] == 0
    assert torch.allclose(p[0, 1] / p[0, 2], torch.tensor(math.exp((2.0 - 1.0) / 0.5)))


def test_sampling_frequencies_match_the_distribution():
    # fixed seed; 6 standard deviations: a correct sampler always passes
    logits = torch.tensor([2.0, 1.2, 0.6, 0.0, -0.5, -1.5])
    n = 20000
    for temperature, top_k in ((1.0, None), (0.5, None), (2.0, 3)):
        draws = sample_next_token(logits.repeat(n, 1), temperature, top_k, torch.Generator().manual_seed(0))
        assert draws.shape == (n,) and draws.dtype == torch.long
        freq = torch.bincount(draws, minlength=6).double() / n
        p = next_token_probs(logits[None].double(), temperature, top_k)[0]
        assert bool(((freq - p).abs() <= 6 * (p * (1 - p) / n).sqrt() + 1e-9).all()), (temperature, top_k, freq, p)
        assert bool((freq[p == 0] == 0).all())


def test_sampling_is_reproducible_with_a_generator():
    logits = torch.randn(50, 7, generator=torch.Generator().manual_seed(3))
    a = sample_next_token(logits, 1.0, None, torch.Generator().manual_seed(1))
    b = sample_next_token(logits, 1.0, None, torch.Generator().manual_seed(1))
    assert torch.equal(a, b)


def test_bad_sampling_arguments():
    with pytest.raises(ValueError):
        sample_next_token(torch.zeros(2, 3), temperature=-1.0)
    with pytest.raises(ValueError):
        sample_next_token(torch.zeros(2, 3), top_k=0)
    with pytest.raises(ValueError):
        sample_next_token(torch.zeros(3), temperature=1.0)


def test_generate_crops_the_context():
    model = GPT(vocab_size=13, block_size=4, d_model=16, num_layers=1, num_heads=2).eval()
    idx = torch.randint(0, 13, (2, 3))
    out = generate(model, idx, 6, temperature=0)
    assert out.shape == (2, 9) and torch.equal(out[:, :3], idx)
    # each greedy token is what the model predicts from the last 4 tokens
    for t in range(3, 9):
        ctx = out[:, max(0, t - 4):t]
        assert torch.equal(out[:, t], model(ctx)[:, -1].argmax(-1))


def test_gaussian_tasks_format():
    tasks = GaussianClassTasks(4, 16)
    prompts, targets = tasks(5, 3, torch.Generator().manual_seed(0))
    assert prompts.shape == (5, 4, 21) and targets.shape == (5,)
    assert torch.equal(prompts[:, :-1, 16:20].sum(-1), torch.ones(5, 3))
    assert bool((prompts[:, -1, 16:20] == 0).all()) and bool((prompts[:, -1, -1] == 1).all())
    assert bool((prompts[:, :-1, -1] == 0).all())


def test_baseline_learns_in_context_and_is_at_chance_without_examples():
    tasks = GaussianClassTasks(4, 16)
    acc = few_shot_accuracy(NearestCentroid(16, 4), tasks, [0, 16], 2000, torch.Generator().manual_seed(0))
    assert 0.2 < acc[0] < 0.3 and acc[16] > 0.9


def test_few_shot_accuracy_changes_no_parameter_and_restores_mode():
    tasks = GaussianClassTasks(4, 8)
    model = ICLTransformer(tasks.token_dim, 4, d_model=16, num_layers=1, num_heads=2, dropout=0.1).train()
    unchanged, acc = parameters_unchanged(model, lambda: few_shot_accuracy(model, tasks, [2, 0], 64))
    assert unchanged and list(acc) == [2, 0] and all(isinstance(v, float) for v in acc.values())
    assert model.training and all(p.grad is None for p in model.parameters())


def test_parameters_unchanged_detects_a_change():
    model = torch.nn.Linear(2, 2)
    unchanged, _ = parameters_unchanged(model, lambda: model.weight.data.add_(1.0))
    assert not unchanged


def test_token_task_family():
    fam = TokenTaskFamily(max_shots=3)
    prompts, answers = fam.sample(4, 2, torch.Generator().manual_seed(0), describe=True, task="next")
    assert prompts.shape == (4, 1 + 4 * 2 + 2)
    for p, a in zip(prompts, answers):
        words = fam.decode(p).split()
        assert words[0] == "<next>" and words[2] == "=" and int(words[3]) == (int(words[1]) + 1) % 10
        assert int(a) == (int(words[-2]) + 1) % 10
    x, y = fam.training_batch(3, torch.Generator().manual_seed(1))
    assert x.shape == y.shape == (3, fam.block_size)
    assert torch.equal(x[:, 1:], y[:, :-1])
    x, y = fam.training_batch(3, torch.Generator().manual_seed(1), answers_only=True)
    assert bool(((y != -100) == (x == fam.stoi["="])).all())


def test_repeated_tokens_and_scores():
    seqs = repeated_random_tokens(4, 5, 10, torch.Generator().manual_seed(0))
    assert torch.equal(seqs[:, :5], seqs[:, 5:])
    varied = repeated_random_tokens(50, 8, 10, torch.Generator().manual_seed(0), min_length=3)
    assert varied.shape == (50, 16)
    # the last L tokens repeat the L before them, for the sequence's own L
    assert all(any(torch.equal(s[16 - 2 * L:16 - L], s[16 - L:]) for L in range(3, 9)) for s in varied)
    T, L = 10, 5
    ideal = torch.zeros(1, 1, T, T)
    for t in range(T):
        ideal[0, 0, t, t - L + 1 if t >= L else 0] = 1.0
    assert induction_scores(ideal, L).item() == 1.0
    prev = torch.zeros(1, 1, T, T)
    prev[0, 0, 0, 0] = 1.0
    for t in range(1, T):
        prev[0, 0, t, t - 1] = 1.0
    assert previous_token_scores(prev).item() == 1.0


def test_attention_only_model_shapes():
    model = AttentionOnlyTransformer(10, 12, d_model=16, num_layers=2, num_heads=2)
    seqs = repeated_random_tokens(3, 6, 10)
    logits, weights = model(seqs, need_weights=True)
    assert logits.shape == (3, 12, 10) and [w.shape for w in weights] == [(3, 2, 12, 12)] * 2
    assert per_position_loss(model, seqs).shape == (11,)
