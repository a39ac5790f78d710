"""Loss and evaluation helpers for the RNN encoder-decoders of notebooks 01-02.

A model here has ``forward(src, src_mask, tgt_in)`` returning logits (or
``(logits, weights)``) and ``greedy(src, src_mask, max_len, bos_id)`` returning
tokens (or ``(tokens, weights)``); batches are :class:`course_lib.data.vocab.Seq2SeqBatch`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .data.vocab import Seq2SeqBatch
from .device import torch_threads

__all__ = ["sequence_loss", "Seq2SeqScores", "score_predictions", "evaluate", "accuracy_by_length"]


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def sequence_loss(model: nn.Module, batch: Seq2SeqBatch) -> Tensor:
    """Mean cross-entropy of the teacher-forced predictions over the real target tokens."""
    logits = _first(model(batch.src, batch.src_mask, batch.tgt_in))
    return F.cross_entropy(logits[batch.tgt_mask], batch.tgt_out[batch.tgt_mask])


@dataclass
class Seq2SeqScores:
    """Exact match (every target token right), token accuracy, accuracy at each
    output position (``nan`` where no target is that long) and per-example correctness;
    from :func:`evaluate`, also the decoder's attention weights, where it has them."""

    exact_match: float
    token_accuracy: float
    per_position: Tensor  # (T_out,)
    correct: Tensor  # (B,) bool: whole sequence right
    src_lengths: Tensor  # (B,)
    weights: Tensor | None = None  # (B, T_out, T_src) on the CPU, or None for a model without attention


def score_predictions(pred: Tensor, batch: Seq2SeqBatch) -> Seq2SeqScores:
    """Compare predicted tokens ``(B, T_out)`` with the batch's targets."""
    if pred.shape != batch.tgt_out.shape:
        raise ValueError(f"predictions {tuple(pred.shape)} and targets {tuple(batch.tgt_out.shape)} differ in shape")
    right = (pred == batch.tgt_out) & batch.tgt_mask
    mask = batch.tgt_mask
    correct = (right | ~mask).all(dim=1)
    counts = mask.sum(dim=0).double()
    per_position = torch.where(counts > 0, right.sum(dim=0).double() / counts.clamp(min=1),
                               torch.full_like(counts, float("nan")))
    return Seq2SeqScores(
        exact_match=float(correct.double().mean()),
        token_accuracy=float(right.sum() / mask.sum()),
        per_position=per_position.cpu(),
        correct=correct.cpu(),
        src_lengths=batch.src_mask.sum(dim=1).cpu(),
    )


def evaluate(model: nn.Module, batch: Seq2SeqBatch, bos_id: int,
             num_threads: int | str | None = "auto") -> Seq2SeqScores:
    """Greedy-decode ``batch`` with ``model`` (in eval mode) and score it; the scores
    keep the decoder's attention weights if ``model.greedy`` returns them.

    Decoding runs on ``num_threads`` CPU threads: ``"auto"`` (the default) picks one for
    a small model (:func:`~course_lib.device.threads_for`), ``None`` keeps the current setting.
    """
    was_training = model.training
    model.eval()
    try:
        with torch_threads(num_threads, model), torch.no_grad():
            out = model.greedy(batch.src, batch.src_mask, batch.tgt_out.size(1), bos_id)
    finally:
        model.train(was_training)
    tokens, weights = out if isinstance(out, tuple) else (out, None)
    scores = score_predictions(tokens, batch)
    scores.weights = weights.detach().cpu() if weights is not None else None
    return scores


def accuracy_by_length(scores: Seq2SeqScores, bins: list[tuple[int, int]] | None = None) -> dict[str, list[float]]:
    """Exact match grouped by source length: ``{"length": [...], "accuracy": [...], "count": [...]}``.

    Without ``bins`` every length present is its own group; a bin ``(lo, hi)`` covers
    ``lo <= length <= hi`` and is reported at its midpoint.
    """
    lengths = scores.src_lengths
    if bins is None:
        bins = [(int(n), int(n)) for n in torch.unique(lengths).tolist()]
    out: dict[str, list[float]] = {"length": [], "accuracy": [], "count": []}
    for lo, hi in bins:
        sel = (lengths >= lo) & (lengths <= hi)
        if int(sel.sum()) == 0:
            continue
        out["length"].append((lo + hi) / 2)
        out["accuracy"].append(float(scores.correct[sel].double().mean()))
        out["count"].append(int(sel.sum()))
    return out
