"""In-context learning: task distributions where every prompt draws a fresh task, a small
transformer that reads such prompts, a non-neural baseline, and evaluation by number of
demonstrations ("shots").

A *task sampler* is any callable ``sampler(batch_size, shots, generator) -> (prompts,
targets)``: ``prompts`` is what the model takes (a batch of ``shots`` demonstrations
followed by a query) and ``targets (B,)`` the answers to the queries. A model maps
``prompts`` to logits ``(B, T, C)``; its prediction is the argmax at the last position.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .gpt import GPTBlock

__all__ = [
    "GaussianClassTasks", "ICLTransformer", "NearestCentroid", "few_shot_accuracy",
    "parameters_unchanged", "icl_loss", "TokenTaskFamily",
]

TaskSampler = Callable[[int, int, "torch.Generator | None"], tuple[Tensor, Tensor]]


class GaussianClassTasks:
    """Few-shot classification where each prompt is a new task.

    Each prompt draws ``n_classes`` fresh class centres ``~ N(0, I_dim)`` and a random
    permutation of the labels; a point of class ``c`` is ``centre_c + noise · N(0, I)``.
    A demonstration token is ``[x; onehot(y); 0]``, the query token ``[x; 0; 1]``, so a
    prompt with ``K`` shots is ``(B, K + 1, dim + n_classes + 1)``. Nothing about a task
    can be stored in a model's weights: the answer must be read from the demonstrations.
    """

    def __init__(self, n_classes: int = 4, dim: int = 16, noise: float = 0.5) -> None:
        if n_classes < 2 or dim < 1 or noise < 0:
            raise ValueError(f"need n_classes ≥ 2, dim ≥ 1, noise ≥ 0; got {n_classes}, {dim}, {noise}")
        self.n_classes, self.dim, self.noise = n_classes, dim, noise

    @property
    def token_dim(self) -> int:
        return self.dim + self.n_classes + 1

    def __call__(self, batch_size: int, shots: int, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        if batch_size < 1 or shots < 0:
            raise ValueError(f"need batch_size ≥ 1 and shots ≥ 0, got {batch_size}, {shots}")
        B, C, D, n = batch_size, self.n_classes, self.dim, shots + 1
        centres = torch.randn(B, C, D, generator=generator)
        labels = torch.argsort(torch.rand(B, C, generator=generator), dim=-1)  # class c is called labels[c]
        cls = torch.randint(0, C, (B, n), generator=generator)
        x = centres.gather(1, cls[..., None].expand(B, n, D)) + self.noise * torch.randn(B, n, D, generator=generator)
        y = labels.gather(1, cls)  # (B, n)
        tokens = torch.zeros(B, n, self.token_dim)
        tokens[..., :D] = x
        tokens[:, :-1, D:D + C] = F.one_hot(y[:, :-1], C).float()
        tokens[:, -1, -1] = 1.0
        return tokens, y[:, -1]


class ICLTransformer(nn.Module):
    """A small causal transformer over continuous tokens (no position embedding: the
    demonstrations are a set and the query is flagged).

    ``embed = nn.Linear(token_dim, d_model)``, ``num_layers`` :class:`GPTBlock` s, ``ln_f`` and
    ``head = nn.Linear(d_model, n_classes)``. ``forward(prompts (B, T, token_dim)) -> (B, T, n_classes)``.
    """

    def __init__(self, token_dim: int, n_classes: int, d_model: int = 64, num_layers: int = 2,
                 num_heads: int = 4, dropout: float = 0.0) -> None:
        super().__init__()
        self.embed = nn.Linear(token_dim, d_model)
        self.blocks = nn.ModuleList(GPTBlock(d_model, num_heads, 4 * d_model, dropout) for _ in range(num_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, n_classes)

    def forward(self, prompts: Tensor) -> Tensor:
        x = self.embed(prompts)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


class NearestCentroid(nn.Module):
    """Non-neural baseline for :class:`GaussianClassTasks` prompts: predict the label whose
    demonstrations have the nearest mean. Labels never shown score ``-inf``; with no
    demonstrations at all every label scores 0 (the argmax is then label 0: chance).

    ``forward(prompts (B, T, dim + C + 1)) -> logits (B, T, C)`` (only the last position
    is meaningful: it is the query).
    """

    def __init__(self, dim: int, n_classes: int) -> None:
        super().__init__()
        self.dim, self.n_classes = dim, n_classes

    def forward(self, prompts: Tensor) -> Tensor:
        D, C = self.dim, self.n_classes
        x, onehot = prompts[..., :D], prompts[..., D:D + C]  # demonstrations carry their label
        counts = onehot[:, :-1].sum(1)  # (B, C)
        means = onehot[:, :-1].transpose(1, 2) @ x[:, :-1] / counts.clamp_min(1)[..., None]  # (B, C, D)
        dist = (x[:, -1:, :] - means).pow(2).sum(-1)  # (B, C)
        logits = torch.where(counts > 0, -dist, torch.full_like(dist, float("-inf")))
        logits = torch.where(counts.sum(-1, keepdim=True) > 0, logits, torch.zeros_like(logits))
        return logits[:, None, :].expand(-1, prompts.size(1), -1)


def icl_loss(model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
    """Cross-entropy of the model's prediction at the last (query) position."""
    prompts, targets = batch
    return F.cross_entropy(model(prompts)[:, -1, :], targets)


def few_shot_accuracy(model: nn.Module, task_sampler: TaskSampler, shots, n_eval: int,
                      generator: torch.Generator | None = None) -> dict[int, float]:
    """Accuracy of ``model`` on ``n_eval`` fresh prompts for each number of shots.

    For each ``K`` in ``shots`` (in order) draws ``prompts, targets =
    task_sampler(n_eval, K, generator)`` in one call, predicts ``model(prompts)[:, -1].argmax(-1)``
    in eval mode without gradients, and records the fraction correct as a float. The
    model's parameters are not changed; its train/eval mode is restored afterwards.
    Returns ``{K: accuracy}``.
    """
    if n_eval < 1:
        raise ValueError(f"n_eval must be ≥ 1, got {n_eval}")
    was_training = model.training
    model.eval()
    out: dict[int, float] = {}
    try:
        with torch.no_grad():
            for k in shots:
                prompts, targets = task_sampler(n_eval, int(k), generator)
                pred = model(prompts)[:, -1, :].argmax(dim=-1)
                out[int(k)] = (pred == targets.to(pred.device)).float().mean().item()
    finally:
        model.train(was_training)
    return out


def parameters_unchanged(model: nn.Module, run: Callable[[], object]) -> tuple[bool, object]:
    """Run ``run()`` and report whether every parameter and buffer of ``model`` is
    bit-for-bit the same afterwards: returns ``(unchanged, run's result)``."""
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    result = run()
    after = model.state_dict()
    same = before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    return same, result


class TokenTaskFamily:
    """A token-level task family in the prompt format of GPT-3.

    Tasks map a digit ``x ∈ 0..9`` to a digit: ``copy`` (x), ``next`` (x+1), ``prev``
    (x−1) and ``double`` (2x), all mod 10. A prompt is
    ``[task description] x₁ = y₁ ; … x_K = y_K ; x = `` and the answer is ``f(x)``.
    Without a description the first token is ``?``. ``vocab`` lists the token strings;
    ``decode(ids)`` turns ids back into text.
    """

    TASKS = {"copy": lambda x: x, "next": lambda x: (x + 1) % 10,
             "prev": lambda x: (x - 1) % 10, "double": lambda x: (2 * x) % 10}

    def __init__(self, max_shots: int = 8) -> None:
        self.max_shots = max_shots
        self.vocab = [str(d) for d in range(10)] + ["=", ";", "?"] + [f"<{t}>" for t in self.TASKS]
        self.stoi = {s: i for i, s in enumerate(self.vocab)}
        self.block_size = 1 + 4 * max_shots + 2  # the longest prompt

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def decode(self, ids) -> str:
        return " ".join(self.vocab[int(i)] for i in ids)

    def sample(self, batch_size: int, shots: int, generator: torch.Generator | None = None,
               describe: bool | float = True, task: str | None = None) -> tuple[Tensor, Tensor]:
        """``(prompts (B, 1 + 4·shots + 2), answers (B,))``; ``describe`` is True, False or
        the probability that a prompt carries its task description."""
        if not 0 <= shots <= self.max_shots:
            raise ValueError(f"shots must be in 0..{self.max_shots}, got {shots}")
        names = list(self.TASKS)
        B = batch_size
        if task is None:
            t = torch.randint(0, len(names), (B,), generator=generator)
        else:
            t = torch.full((B,), names.index(task))
        x = torch.randint(0, 10, (B, shots + 1), generator=generator)
        y = torch.stack([torch.tensor([self.TASKS[names[int(i)]](int(v)) for v in row]) for i, row in zip(t, x)])
        p = float(describe)
        has_desc = torch.rand(B, generator=generator) < p
        desc = torch.where(has_desc, t + self.stoi[f"<{names[0]}>"], torch.full_like(t, self.stoi["?"]))
        eq, sep = self.stoi["="], self.stoi[";"]
        parts = [desc[:, None]]
        for i in range(shots):
            parts.append(torch.stack([x[:, i], torch.full_like(t, eq), y[:, i], torch.full_like(t, sep)], 1))
        parts.append(torch.stack([x[:, -1], torch.full_like(t, eq)], 1))
        return torch.cat(parts, 1), y[:, -1]

    def sampler(self, describe: bool | float = True) -> TaskSampler:
        """A task sampler (for :func:`few_shot_accuracy`) with or without descriptions."""
        return lambda batch_size, shots, generator=None: self.sample(batch_size, shots, generator, describe)

    def training_batch(self, batch_size: int, generator: torch.Generator | None = None,
                       describe: float = 0.5, answers_only: bool = False) -> tuple[Tensor, Tensor]:
        """Full prompts with ``max_shots`` demonstrations for next-token training:
        ``(inputs (B, T), targets (B, T))``, the targets being the inputs shifted by one.
        Every prefix ending in ``=`` is a ``K``-shot prompt for ``K = 0..max_shots``. With
        ``answers_only`` every target but the answers (after ``=``) is ``-100`` (ignored)."""
        prompts, answers = self.sample(batch_size, self.max_shots, generator, describe)
        seq = torch.cat([prompts, answers[:, None]], 1)
        inputs, targets = seq[:, :-1], seq[:, 1:].clone()
        if answers_only:
            targets[inputs != self.stoi["="]] = -100
        return inputs, targets
