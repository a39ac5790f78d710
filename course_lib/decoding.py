"""Training and decoding an encoder–decoder model.

The model interface (course_lib's :class:`~course_lib.transformer.Transformer`, or any
model with the same two methods):

- ``model.encode(src (B, S), src_mask (B, 1, S)) -> memory (B, S, D)``;
- ``model.decode(tgt (B, T), memory, src_mask) -> logits (B, T, V)``, causal inside.

**Teacher forcing**: during training the decoder reads the *true* previous tokens
(``<bos>`` + target) and predicts the next ones (target + ``<eos>``) at all positions
at once. At inference there is no true prefix: the decoder feeds on its own outputs,
one token at a time (greedy decoding or beam search).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import Tensor, nn

from .device import torch_threads
from .optim import label_smoothed_cross_entropy

__all__ = ["teacher_forcing_loss", "greedy_decode", "beam_search", "length_penalty", "capture_attention"]


def teacher_forcing_loss(model: nn.Module, src: Tensor, src_mask: Tensor | None, tgt_in: Tensor,
                         tgt_out: Tensor, epsilon: float = 0.0, pad_id: int = 0) -> Tensor:
    """Label-smoothed cross-entropy of ``model(src, tgt_in)`` against ``tgt_out``
    (``(B, T)`` each), ignoring padded target positions."""
    logits = model.decode(tgt_in, model.encode(src, src_mask), src_mask)
    return label_smoothed_cross_entropy(logits, tgt_out, epsilon, ignore_index=pad_id)


def greedy_decode(model: nn.Module, src: Tensor, src_mask: Tensor | None, bos_id: int, eos_id: int,
                  max_len: int) -> Tensor:
    """Decode by always taking the most probable next token.

    Returns ``LongTensor (B, L)`` with ``L ≤ max_len``: column 0 is ``bos_id``, then the
    chosen tokens. A sequence that has produced ``eos_id`` is finished; its later
    positions are filled with ``eos_id``. Decoding stops when every sequence is
    finished or the length reaches ``max_len``.
    """
    if max_len < 1:
        raise ValueError(f"max_len must be at least 1 (the <bos> column), got {max_len}")
    with torch.no_grad():
        return _greedy(model, src, src_mask, bos_id, eos_id, max_len)


def _greedy(model: nn.Module, src: Tensor, src_mask: Tensor | None, bos_id: int, eos_id: int,
            max_len: int) -> Tensor:
    memory = model.encode(src, src_mask)
    B = src.size(0)
    ys = torch.full((B, 1), bos_id, dtype=torch.long, device=src.device)
    done = torch.zeros(B, dtype=torch.bool, device=src.device)
    while ys.size(1) < max_len and not bool(done.all()):
        logits = model.decode(ys, memory, src_mask)[:, -1]  # (B, V)
        nxt = logits.argmax(dim=-1)
        nxt = torch.where(done, torch.full_like(nxt, eos_id), nxt)
        ys = torch.cat([ys, nxt[:, None]], dim=1)
        done = done | (nxt == eos_id)
    return ys


def length_penalty(length: int, alpha: float) -> float:
    """The GNMT length penalty ``((5 + |Y|) / 6)^α`` (Wu et al., 2016); scores are
    divided by it, so ``α > 0`` favours longer hypotheses and ``α = 0`` turns it off."""
    return ((5.0 + length) / 6.0) ** alpha


def beam_search(model: nn.Module, src: Tensor, src_mask: Tensor | None, bos_id: int, eos_id: int,
                max_len: int, beam_size: int = 4, alpha: float = 0.6,
                num_threads: int | str | None = "auto") -> list[list[int]]:
    """Beam search, every source sentence of the batch at once.

    Keeps, for each sentence, the ``beam_size`` best partial translations by summed
    log-probability; a hypothesis that emits ``eos_id`` is finished and scored by
    ``log p(Y) / length_penalty(|Y|, alpha)`` (``|Y|`` counts the tokens after ``<bos>``,
    ``<eos>`` included). A sentence stops when no open hypothesis can beat its best
    finished one. Returns, for each sentence, the best finished hypothesis as a list of ids
    starting with ``bos_id`` (ending with ``eos_id`` unless ``max_len`` cut it). Runs on
    ``num_threads`` CPU threads (:func:`~course_lib.device.torch_threads`; ``"auto"``:
    one for a small model).
    """
    if beam_size < 1:
        raise ValueError(f"beam_size must be at least 1, got {beam_size}")
    with torch.no_grad(), torch_threads(num_threads, model):
        return _beam(model, src, src_mask, bos_id, eos_id, max_len, beam_size, alpha)


def _beam(model: nn.Module, src: Tensor, src_mask: Tensor | None, bos_id: int, eos_id: int, max_len: int,
          k: int, alpha: float) -> list[list[int]]:
    """Beam search for a batch ``src (B, S)``: the ``k`` open hypotheses of every sentence are
    decoded together, one ``(B·k, t)`` batch per step. Slot ``j`` of a sentence holds its
    ``j``-th best open hypothesis; a sentence with fewer than ``k`` open ones has empty
    slots scored ``-inf``, which no candidate can come from."""
    B, device = src.size(0), src.device
    memory = model.encode(src, src_mask).repeat_interleave(k, dim=0)  # (B·k, S, D)
    mask = None if src_mask is None else src_mask.repeat_interleave(k, dim=0)
    seqs = torch.full((B, k, 1), bos_id, dtype=torch.long, device=device)  # (B, k, t)
    scores = torch.full((B, k), float("-inf"), device=device, dtype=memory.dtype)
    scores[:, 0] = 0.0  # one open hypothesis to start with: <bos>
    finished: list[list[tuple[list[int], float]]] = [[] for _ in range(B)]
    open_ = [True] * B
    while seqs.size(-1) < max_len and any(open_):
        logits = model.decode(seqs.flatten(0, 1), memory, mask)[:, -1]  # (B·k, V)
        logp = torch.log_softmax(logits, -1).view(B, k, -1)
        V = logp.size(-1)
        top = (scores[..., None] + logp).flatten(1).topk(min(k, k * V))  # (B, k): the best continuations
        parents, tokens = (top.indices // V).tolist(), (top.indices % V).tolist()
        new_parent = torch.zeros(B, k, dtype=torch.long)
        new_token = torch.full((B, k), bos_id, dtype=torch.long)
        new_score = torch.full((B, k), float("-inf"), dtype=logp.dtype)
        for b in range(B):
            if not open_[b]:
                continue
            kept = 0
            for score, parent, token in zip(top.values[b].tolist(), parents[b], tokens[b]):
                if score == float("-inf"):
                    break  # fewer candidates than slots
                if token == eos_id:
                    seq = seqs[b, parent].tolist() + [eos_id]
                    finished[b].append((seq, score / length_penalty(len(seq) - 1, alpha)))
                else:
                    new_parent[b, kept], new_token[b, kept], new_score[b, kept] = parent, token, score
                    kept += 1
            if kept == 0:
                open_[b] = False
            elif finished[b]:
                best_done = max(f for _, f in finished[b])
                # an open hypothesis can only lose probability; stop when none can win any more
                if all(s / length_penalty(max_len - 1, alpha) < best_done for s in new_score[b, :kept].tolist()):
                    open_[b] = False
        rows = torch.arange(B, device=device)[:, None]
        seqs = torch.cat([seqs[rows, new_parent.to(device)], new_token.to(device)[..., None]], dim=-1)
        scores = new_score.to(device)
    out = []
    for b in range(B):
        if not finished[b]:  # max_len reached first: the open hypotheses compete
            finished[b] = [(seqs[b, j].tolist(), float(scores[b, j]) / length_penalty(seqs.size(-1) - 1, alpha))
                           for j in range(k) if scores[b, j] > float("-inf")]
        out.append(max(finished[b], key=lambda f: f[1])[0])
    return out


@contextlib.contextmanager
def capture_attention(modules: list[nn.Module]) -> Iterator[list[Tensor]]:
    """Collect the attention weights (second output) of each module in ``modules``
    while inside the ``with`` block, e.g. the ``cross_attn`` of every decoder layer::

        with capture_attention([l.cross_attn for l in model.decoder.layers]) as weights:
            model(src, tgt, src_mask)
        weights[-1]  # (B, H, T, S) of the last layer
    """
    captured: list[Tensor] = []

    def hook(module: nn.Module, args: tuple, output: tuple) -> None:
        captured.append(output[1].detach())

    handles = [m.register_forward_hook(hook) for m in modules]
    try:
        yield captured
    finally:
        for h in handles:
            h.remove()
