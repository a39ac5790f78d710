"""A tiny decoder-only language model built from modern blocks, the characters it reads, and its
training loop (notebook 11).

- :class:`DecoderLM`: token embedding, ``num_layers`` blocks (:class:`course_lib.modern.ModernBlock`
  by default, or a student's class with its constructor), a final RMSNorm and an output layer tied
  to the embedding. Positions are rotary (in every attention layer) or, for comparison, learned or
  sinusoidal vectors added once to the embeddings, or none; ``position_scale`` multiplies the
  rotary positions (position interpolation). With notebook 09's ``caches`` it generates token by
  token (:func:`course_lib.efficient_attention.cached_generate`).
- :class:`CharCorpus` / :func:`story_characters`: notebook 07's generated stories as characters,
  split into training and validation text.
- :func:`train_lm`: :func:`course_lib.training.train` with AdamW, warm-up and cosine decay, on
  random windows of a corpus (or any batch function); :func:`lm_loss`: the mean next-token loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .data.corpus import story_corpus
from .device import torch_threads
from .gpt import gpt2_init
from .modern import ModernBlock, RMSNorm, swiglu_width
from .positional import sinusoidal_positional_encoding
from .training import TrainHistory, cosine_schedule, train

__all__ = ["POSITION_KINDS", "DecoderLM", "with_layer_norm", "CharCorpus", "story_characters", "train_lm", "lm_loss",
           "lengths_loss"]

POSITION_KINDS = ("rope", "learned", "sinusoidal", "none")
# Sinusoidal vectors (entries in [-1, 1], RMS 1/√2) scaled to the size of a token embedding at
# initialisation (GPT-2's N(0, 0.02²)); unscaled they drown the tokens (Vaswani et al. scale the
# embeddings up by √d_model instead).
SINUSOIDAL_SCALE = 0.02 * 2 ** 0.5


class DecoderLM(nn.Module):
    """A decoder-only language model over ``vocab_size`` tokens.

    ``tok_emb (V, d)``, ``blocks`` (``num_layers`` of ``block(d_model, num_heads, num_kv_heads, d_ff,
    eps, rope_base)``, default :class:`~course_lib.modern.ModernBlock`; ``d_ff`` defaults to
    :func:`~course_lib.modern.swiglu_width`), ``norm`` (RMSNorm) and ``head`` (tied to ``tok_emb``).

    ``positions``: ``"rope"`` (rotary, inside every attention layer), ``"learned"`` (a table of
    ``max_positions`` vectors added to the embeddings; only those a training run reaches are
    trained), ``"sinusoidal"`` (Vaswani et al.'s vectors added) or ``"none"``. Only ``"rope"`` suits
    a student's block (the others build course_lib's with ``rope_base=None``).

    ``forward(idx (B, T), caches=None, need_weights=False, mask=None) -> logits (B, T, V)``
    (with ``need_weights``, also each layer's ``(B, H, T, T)`` weights): ``caches`` (one cache per
    block, notebook 09) continue the positions from ``len(caches[0])``; ``mask`` (boolean ``(T, T)``)
    restricts the causal attention further. ``position_scale`` (attribute) multiplies the rotary
    positions: ``train_length / test_length`` is position interpolation (Chen et al. 2023).
    ``block_size`` is the context :func:`~course_lib.sampling.generate` crops to.
    """

    def __init__(self, vocab_size: int, block_size: int, d_model: int = 64, num_layers: int = 2,
                 num_heads: int = 4, num_kv_heads: int | None = None, d_ff: int | None = None,
                 positions: str = "rope", max_positions: int | None = None, block: type[nn.Module] = ModernBlock,
                 eps: float = 1e-6, rope_base: float = 10000.0) -> None:
        super().__init__()
        if positions not in POSITION_KINDS:
            raise ValueError(f"positions must be one of {POSITION_KINDS}, got {positions!r}")
        if positions != "rope" and block is not ModernBlock:
            raise ValueError("positions other than 'rope' need course_lib's ModernBlock (built without rotation)")
        self.vocab_size, self.block_size, self.positions = vocab_size, block_size, positions
        self.position_scale = 1.0
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(max_positions or block_size, d_model) if positions == "learned" else None
        base = rope_base if positions == "rope" else None
        self.blocks = nn.ModuleList(block(d_model, num_heads, num_kv_heads or num_heads, d_ff or swiglu_width(d_model),
                                          eps, base) for _ in range(num_layers))
        self.norm = RMSNorm(d_model, eps)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight  # tied, as notebook 08's GPT
        self.apply(gpt2_init)

    def attention_modules(self) -> list[nn.Module]:
        """Each block's attention, first layer first (for the attention explorer)."""
        return [block.attn for block in self.blocks]

    def forward(self, idx: Tensor, caches: list | None = None, need_weights: bool = False,
                mask: Tensor | None = None) -> Tensor | tuple[Tensor, list[Tensor]]:
        if idx.dim() != 2:
            raise ValueError(f"idx must have shape (B, T), got {tuple(idx.shape)}")
        past = len(caches[0]) if caches else 0
        T = idx.size(1)
        where = torch.arange(past, past + T, device=idx.device)
        x = self.tok_emb(idx)
        if self.pos_emb is not None:
            if past + T > self.pos_emb.num_embeddings:
                raise ValueError(f"learned positions exist up to {self.pos_emb.num_embeddings}, got {past + T}")
            x = x + self.pos_emb(where)
        elif self.positions == "sinusoidal":  # at the embeddings' initial size (N(0, 0.02²) per feature)
            pe = sinusoidal_positional_encoding(past + T, x.size(-1), dtype=x.dtype, device=x.device)[past:]
            x = x + SINUSOIDAL_SCALE * pe
        rotary = where * self.position_scale if self.position_scale != 1.0 else where
        extras = caches is not None or need_weights or mask is not None
        weights = []
        for i, block in enumerate(self.blocks):
            if not extras:  # the contract's call: a student's block takes it too
                x = block(x, rotary)
                continue
            x, w = block(x, rotary, need_weights=True, cache=caches[i] if caches is not None else None, mask=mask)
            weights.append(w)
        logits = self.head(self.norm(x))
        return (logits, weights) if need_weights else logits


def with_layer_norm(model: nn.Module) -> nn.Module:
    """``model`` with every :class:`~course_lib.modern.RMSNorm` replaced by an ``nn.LayerNorm`` of the same
    size and eps (weight ones, bias zeros): the modern block with GPT-2's normalisation, for comparison.
    Changed in place and returned."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, RMSNorm):
                setattr(parent, name, nn.LayerNorm(child.weight.numel(), eps=child.eps,
                                                   device=child.weight.device, dtype=child.weight.dtype))
    return model


@dataclass
class CharCorpus:
    """A text as character ids: ``chars`` (the vocabulary, sorted), ``train`` and ``val`` ids (LongTensor)."""

    chars: str
    train: Tensor
    val: Tensor

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> Tensor:
        index = {c: i for i, c in enumerate(self.chars)}
        return torch.tensor([index[c] for c in text], dtype=torch.long)

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)

    def batch(self, batch_size: int, T: int, split: str = "train",
              generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """``batch_size`` random windows of ``T + 1`` characters: inputs ``(B, T)``, next characters ``(B, T)``."""
        data = {"train": self.train, "val": self.val}[split]
        start = torch.randint(0, data.numel() - T - 1, (batch_size,), generator=generator)
        windows = data[start[:, None] + torch.arange(T + 1)]
        return windows[:, :-1], windows[:, 1:]


def story_characters(num_documents: int = 2000, seed: int = 0, val_fraction: float = 0.1) -> CharCorpus:
    """Notebook 07's generated stories (one per line) as characters; the last ``val_fraction`` of the
    stories is the validation text (stories never seen in training)."""
    docs, _ = story_corpus(num_documents, seed=seed)
    stories = [" ".join(sentences) for sentences in docs]
    cut = max(1, int(len(stories) * (1 - val_fraction)))
    train_text, val_text = "\n".join(stories[:cut]) + "\n", "\n".join(stories[cut:]) + "\n"
    chars = "".join(sorted(set(train_text) | set(val_text)))
    corpus = CharCorpus(chars, torch.empty(0, dtype=torch.long), torch.empty(0, dtype=torch.long))
    corpus.train, corpus.val = corpus.encode(train_text), corpus.encode(val_text)
    return corpus


def _next_token_loss(model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
    x, y = batch
    device = next(model.parameters()).device
    logits = model(x.to(device))
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.to(device).reshape(-1), ignore_index=-100)


def train_lm(model: nn.Module, batches: CharCorpus | Callable[[int], tuple[Tensor, Tensor]], steps: int,
             batch_size: int = 32, T: int = 64, lr: float = 3e-3, warmup: int = 20, seed: int = 0,
             progress: bool = True, desc: str = "training") -> TrainHistory:
    """Train ``model`` on next-token prediction for ``steps`` steps: AdamW (weight decay 0.1 on the
    matrices), warm-up then cosine decay, gradients clipped at 1. ``batches`` is a :class:`CharCorpus`
    (random windows of ``T`` characters, drawn from ``seed``) or a function ``step -> (inputs, targets)``
    (targets ``-100`` are left out). Returns :class:`~course_lib.training.TrainHistory`."""
    if isinstance(batches, CharCorpus):
        corpus, g = batches, torch.Generator().manual_seed(seed)

        def next_batch(step: int) -> tuple[Tensor, Tensor]:
            return corpus.batch(batch_size, T, "train", g)
    else:
        next_batch = batches
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                                  lr=lr, betas=(0.9, 0.95))
    return train(model, next_batch, _next_token_loss, steps, optimizer=optimizer,
                 schedule=cosine_schedule(steps, warmup), progress=progress, desc=desc)


@torch.no_grad()
def lm_loss(model: nn.Module, corpus: CharCorpus, T: int = 64, batches: int = 8, batch_size: int = 64,
            split: str = "val", seed: int = 1234, num_threads: int | str | None = "auto") -> float:
    """The mean next-character loss (nats) of ``model`` on ``batches`` batches of ``batch_size`` random
    windows of ``split``, the same windows for every model (drawn from ``seed``); on ``num_threads``
    CPU threads (``"auto"``: one for a small model, :func:`course_lib.device.threads_for`)."""
    was = model.training
    model.eval()
    g = torch.Generator().manual_seed(seed)
    with torch_threads(num_threads, model):
        total = sum(float(_next_token_loss(model, corpus.batch(batch_size, T, split, g))) for _ in range(batches))
    model.train(was)
    return total / batches


@torch.no_grad()
def lengths_loss(model: nn.Module, corpus: CharCorpus, T: int, factors: Sequence[int] = (1, 2, 3, 4),
                 interpolate: bool = False, batch_size: int = 32, batches: int = 4) -> list[float]:
    """The validation loss of ``model`` on windows ``factor · T`` characters long, for each factor
    (:func:`lm_loss`). With ``interpolate``, rotary positions are scaled by ``1 / factor`` while a window
    ``factor`` times the training length ``T`` is read (position interpolation), then restored."""
    losses = []
    scale = getattr(model, "position_scale", 1.0)
    for factor in factors:
        if interpolate:
            model.position_scale = scale / factor
        try:
            losses.append(lm_loss(model, corpus, factor * T, batches=batches, batch_size=batch_size))
        finally:
            if interpolate:
                model.position_scale = scale
    return losses
