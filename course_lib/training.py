"""A small, generic training loop: progress bar, gradient clipping, loss history.

It knows nothing about the model or the data: the caller passes a function that
returns the next batch and a function that computes the loss on it::

    history = train(model, next_batch=lambda step: task.sample_batch(64, rng),
                    loss_fn=lambda model, batch: my_loss(model, batch), steps=1000, lr=3e-3)
    history.plot()
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from .device import torch_threads

__all__ = ["TrainHistory", "train", "cosine_schedule", "default_optimizer"]


@dataclass
class TrainHistory:
    """What happened during :func:`train`.

    ``losses[i]`` is the training loss at step ``i + 1``; ``evals`` maps a metric name
    to ``(step, value)`` pairs; ``seconds`` is the wall time of the whole run.
    """

    losses: list[float] = field(default_factory=list)
    evals: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def steps(self) -> int:
        return len(self.losses)

    def smoothed(self, window: int = 50) -> list[float]:
        """Running mean of the loss over the last ``window`` steps."""
        out, total = [], 0.0
        for i, x in enumerate(self.losses):
            total += x
            if i >= window:
                total -= self.losses[i - window]
            out.append(total / min(i + 1, window))
        return out

    def plot(self, ax: Any = None, title: str = "Training loss", window: int = 50) -> Any:
        """Loss per step (faint) and its running mean; returns the axes."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(6, 3.5))
        x = range(1, self.steps + 1)
        ax.plot(x, self.losses, alpha=0.3, lw=0.8, label="loss per step")
        ax.plot(x, self.smoothed(window), lw=1.8, label=f"running mean ({window} steps)")
        ax.set_xlabel("training step")
        ax.set_ylabel("loss")
        ax.set_title(title)
        ax.legend()
        return ax


def cosine_schedule(steps: int, warmup: int = 0) -> Callable[[int], float]:
    """Learning-rate factor ``0.5 (1 + cos(π step / steps))`` for ``schedule=``: from 1 at the
    first step down to 0 at the last. With ``warmup``, the factor first grows linearly
    over that many steps (``(step + 1) / warmup``): a short run can then use a high peak
    learning rate without the first, large updates throwing the model off."""
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    return lambda step: min(1.0, (step + 1) / max(1, warmup)) * 0.5 * (1 + math.cos(math.pi * step / max(1, steps)))


def train(model: nn.Module, next_batch: Callable[[int], Any], loss_fn: Callable[[nn.Module, Any], Tensor],
          steps: int, lr: float = 1e-3, optimizer: torch.optim.Optimizer | None = None,
          schedule: Callable[[int], float] | None = None, clip_grad_norm: float | None = 1.0,
          eval_fn: Callable[[nn.Module], dict[str, float]] | None = None, eval_every: int = 0,
          progress: bool = True, desc: str = "training", num_threads: int | str | None = "auto") -> TrainHistory:
    """Train ``model`` for ``steps`` optimisation steps and return the history.

    - ``next_batch(step)`` returns the batch for step ``step`` (0-based);
    - ``loss_fn(model, batch)`` returns a scalar loss tensor;
    - ``optimizer`` defaults to Adam with learning rate ``lr`` (:func:`default_optimizer`); ``schedule(step)``, if
      given, multiplies the learning rate at each step (``LambdaLR``);
    - ``clip_grad_norm`` clips the global gradient norm (``None`` turns it off);
    - ``eval_fn(model)`` returns metrics, recorded every ``eval_every`` steps and at the
      end (the model is in eval mode and gradients are off while it runs);
    - ``num_threads``: CPU threads for PyTorch while training (restored afterwards).
      ``"auto"`` (the default) picks one thread for a small model on the CPU
      (:func:`~course_lib.device.threads_for`), ``None`` keeps the current setting.

    A non-finite loss stops training with a ``FloatingPointError`` naming the step.
    """
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    with torch_threads(num_threads, model):
        return _train(model, next_batch, loss_fn, steps, lr, optimizer, schedule, clip_grad_norm, eval_fn,
                      eval_every, progress, desc)


def default_optimizer(model: nn.Module, lr: float, kind: type[torch.optim.Optimizer] = torch.optim.Adam,
                      **options: Any) -> torch.optim.Optimizer:
    """``kind(model.parameters(), lr=lr, **options)`` (Adam by default), fused where PyTorch
    has a fused kernel for every parameter (CPU and CUDA floating-point tensors): the same
    update in one kernel instead of about ten small operations per parameter tensor, a
    tenth of a small model's step."""
    params = [p for p in model.parameters() if p.requires_grad]
    fusable = bool(params) and all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    return kind(params, lr=lr, fused=fusable or None, **options)


def _train(model, next_batch, loss_fn, steps, lr, optimizer, schedule, clip_grad_norm, eval_fn, eval_every,
           progress, desc) -> TrainHistory:
    if optimizer is None:
        optimizer = default_optimizer(model, lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule) if schedule is not None else None
    history = TrainHistory()
    start = time.perf_counter()
    # Reading a loss on an accelerator waits for it (a host sync): there losses are read ten
    # steps at a time; on the CPU at once, so that a non-finite loss stops before its update.
    first = next(model.parameters(), None)
    read_every = 1 if first is None or first.device.type == "cpu" else 10
    pending: list[Tensor] = []

    def evaluate(step: int) -> None:
        model.eval()
        with torch.no_grad():
            for name, value in eval_fn(model).items():
                history.evals.setdefault(name, []).append((step, float(value)))
        model.train()

    def read_losses() -> None:
        values = torch.stack(pending).tolist() if len(pending) > 1 else [float(pending[0])]
        pending.clear()
        for value in values:
            if not math.isfinite(value):
                bar.close()
                raise FloatingPointError(f"the loss became {value} at step {history.steps + 1}; "
                                         "try a smaller learning rate")
            history.losses.append(value)

    bar = tqdm(range(steps), desc=desc, disable=not progress, leave=True)
    model.train()
    for step in bar:
        loss = loss_fn(model, next_batch(step))
        pending.append(loss.detach())
        if len(pending) >= read_every:
            read_losses()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if clip_grad_norm is not None:
            nn.utils.clip_grad_norm_(model.parameters(), clip_grad_norm)
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        if eval_fn is not None and eval_every and (step + 1) % eval_every == 0 and step + 1 < steps:
            evaluate(step + 1)
        if (step % 10 == 0 or step + 1 == steps) and history.losses:
            recent = history.losses[-20:]
            bar.set_postfix(loss=f"{sum(recent) / len(recent):.3f}")
    if pending:
        read_losses()
    bar.close()
    if eval_fn is not None:
        evaluate(steps)
    model.eval()
    history.seconds = time.perf_counter() - start
    return history
