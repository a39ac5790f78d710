"""Training a Transformer: the warm-up ("Noam") learning-rate schedule and
cross-entropy with label smoothing.

- ``lr(step) = d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)``: grows linearly for
  ``warmup`` steps, peaks at ``step = warmup``, then decays like ``1/√step``;
- label smoothing with ``ε``: the target distribution puts ``1 − ε`` on the right token
  and spreads ``ε`` uniformly over all ``K`` classes (``ε/K`` each, the right one included),
  exactly as ``torch.nn.functional.cross_entropy(..., label_smoothing=ε)``.
"""

from __future__ import annotations


import torch
from torch import Tensor

__all__ = ["noam_lr", "noam_lambda", "label_smoothed_cross_entropy"]


def noam_lr(step: int, d_model: int, warmup: int) -> float:
    """The learning rate of Vaswani et al. at optimisation step ``step ≥ 1`` (a float)."""
    if step < 1:
        raise ValueError(f"steps count from 1, got step={step}")
    if warmup < 1 or d_model < 1:
        raise ValueError(f"d_model and warmup must be positive, got d_model={d_model}, warmup={warmup}")
    return d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


def noam_lambda(d_model: int, warmup: int, factor: float = 1.0):
    """A function for ``torch.optim.lr_scheduler.LambdaLR`` (with the optimiser's base
    learning rate 1): LambdaLR counts from 0, the schedule from 1."""
    return lambda i: factor * noam_lr(i + 1, d_model, warmup)


def label_smoothed_cross_entropy(logits: Tensor, target: Tensor, epsilon: float,
                                 ignore_index: int = -100) -> Tensor:
    """Mean cross-entropy against the smoothed targets over the positions whose target
    is not ``ignore_index``.

    ``logits (..., K)``, ``target (...)`` integer ids. For one position with
    log-probabilities ``log p``: ``loss = (1 − ε)(−log p_y) + ε · mean_k(−log p_k)``.
    Positions with ``target == ignore_index`` contribute nothing (neither term) and are
    not counted in the mean. Equals ``F.cross_entropy(logits.reshape(-1, K), target.reshape(-1),
    label_smoothing=ε, ignore_index=ignore_index)``.
    """
    if not 0.0 <= epsilon <= 1.0:
        raise ValueError(f"epsilon must be in [0, 1], got {epsilon}")
    if logits.shape[:-1] != target.shape:
        raise ValueError(f"logits (..., K) and target (...) disagree: {tuple(logits.shape)} vs {tuple(target.shape)}")
    logp = torch.log_softmax(logits, dim=-1)
    keep = target != ignore_index
    safe = torch.where(keep, target, torch.zeros_like(target))
    nll = -logp.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
    smooth = -logp.mean(dim=-1)
    per_position = (1.0 - epsilon) * nll + epsilon * smooth
    per_position = torch.where(keep, per_position, torch.zeros_like(per_position))
    return per_position.sum() / keep.sum()
