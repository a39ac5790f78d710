"""BERT (Devlin et al., 2019): its input, the encoder and the heads of pre-training and
fine-tuning. Pre-training data, the pre-training and fine-tuning runs and their metrics
are in :mod:`course_lib.bert_pretraining`.

Input of a sentence pair: ``[CLS] A [SEP] B [SEP]`` with segment id 0 for ``[CLS]``,
A and the first ``[SEP]``, and 1 for B and the last ``[SEP]``; the input vector of a
token is ``token + position + segment`` embedding, then LayerNorm.

- MLM: select 15% of the non-special tokens; of those 80% become ``[MASK]``, 10% a
  random token and 10% stay; the model predicts the original token at the selected
  positions only (labels are -100 elsewhere).
- NSP: half the pairs are consecutive sentences (IsNext, label 0), half take B from
  another document (NotNext, label 1); the head reads the final state of ``[CLS]``:
  ``softmax(W_y tanh(W_s z_[CLS] + b_s) + b_y)``.

Masks follow course_lib's convention: boolean, True = may attend.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "mask_tokens", "make_nsp_input", "BertEmbeddings", "BertEncoder", "init_bert_weights", "MLMHead", "NSPHead",
    "BertForPreTraining", "mlm_loss", "SequenceClassifier",
]


# ---------------------------------------------------------------------------
# Masked language modelling: which tokens to predict
# ---------------------------------------------------------------------------

def mask_tokens(input_ids: Tensor, vocab_size: int, mask_id: int, special_ids: Sequence[int],
                mlm_probability: float = 0.15, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """BERT's MLM corruption of a batch of token ids.

    input_ids: LongTensor of any shape (usually ``(B, T)``); it is not modified.
    Each token that is not in ``special_ids`` is selected with probability
    ``mlm_probability``. A selected token becomes ``mask_id`` with probability 0.8,
    a uniformly random id in ``[0, vocab_size)`` with probability 0.1, and stays
    unchanged with probability 0.1.

    Returns ``(masked_ids, labels)``, both shaped like ``input_ids``: ``labels`` holds
    the original id at selected positions and -100 everywhere else.
    ``generator`` (a CPU ``torch.Generator``) makes the draw reproducible.
    """
    if not isinstance(input_ids, Tensor) or input_ids.dtype != torch.long:
        raise TypeError("input_ids must be a LongTensor of token ids")
    if not 0.0 <= mlm_probability <= 1.0:
        raise ValueError(f"mlm_probability must be in [0, 1], got {mlm_probability}")
    shape, device = input_ids.shape, input_ids.device

    def uniform() -> Tensor:
        return torch.rand(shape, generator=generator).to(device)

    special = torch.isin(input_ids, torch.as_tensor(list(special_ids), dtype=torch.long, device=device))
    selected = (uniform() < mlm_probability) & ~special
    labels = torch.where(selected, input_ids, torch.full_like(input_ids, -100))
    action = uniform()
    to_mask = selected & (action < 0.8)
    to_random = selected & (action >= 0.8) & (action < 0.9)
    random_ids = torch.randint(vocab_size, shape, generator=generator).to(device)
    masked = input_ids.clone()
    masked[to_mask] = mask_id
    masked[to_random] = random_ids[to_random]
    return masked, labels


# ---------------------------------------------------------------------------
# Next-sentence prediction: the input of a pair
# ---------------------------------------------------------------------------

def make_nsp_input(tokens_a: Sequence[int], tokens_b: Sequence[int], cls_id: int, sep_id: int) -> tuple[Tensor, Tensor]:
    """``[CLS] A [SEP] B [SEP]`` and its segment ids.

    tokens_a, tokens_b: token ids (lists of ints or 1-D tensors).
    Returns ``(input_ids, segment_ids)``, two LongTensors of length ``len(A) + len(B) + 3``;
    segment 0 covers ``[CLS]``, A and the first ``[SEP]``, segment 1 covers B and the
    last ``[SEP]``.
    """
    a = torch.as_tensor(tokens_a, dtype=torch.long).reshape(-1)
    b = torch.as_tensor(tokens_b, dtype=torch.long).reshape(-1)
    cls = torch.tensor([cls_id], dtype=torch.long)
    sep = torch.tensor([sep_id], dtype=torch.long)
    input_ids = torch.cat([cls, a, sep, b, sep])
    segment_ids = torch.cat([torch.zeros(len(a) + 2, dtype=torch.long), torch.ones(len(b) + 1, dtype=torch.long)])
    return input_ids, segment_ids


# ---------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------

class BertEmbeddings(nn.Module):
    """Input vectors: ``LayerNorm(token[x_t] + position[t] + segment[s_t])``, then dropout.

    forward(input_ids (B, T), segment_ids (B, T)) -> (B, T, d_model).
    """

    def __init__(self, vocab_size: int, d_model: int, max_len: int, num_segments: int = 2,
                 dropout: float = 0.0) -> None:
        super().__init__()
        self.token = nn.Embedding(vocab_size, d_model)
        self.position = nn.Embedding(max_len, d_model)
        self.segment = nn.Embedding(num_segments, d_model)
        self.norm = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, input_ids: Tensor, segment_ids: Tensor) -> Tensor:
        T = input_ids.size(-1)
        if T > self.position.num_embeddings:
            raise ValueError(f"sequence of length {T} is longer than max_len={self.position.num_embeddings}")
        positions = torch.arange(T, device=input_ids.device)
        x = self.token(input_ids) + self.position(positions) + self.segment(segment_ids)
        return self.dropout(self.norm(x))


def init_bert_weights(module: nn.Module, std: float = 0.02) -> None:
    """BERT's initialisation, in place: the weights of every ``nn.Linear`` and
    ``nn.Embedding`` in ``module`` drawn from N(0, std²), linear biases 0 (LayerNorms keep
    weight 1, bias 0). With PyTorch's default N(0, 1) embeddings, a tied MLM head starts
    with logits of standard deviation about sqrt(d_model) and a loss near 25 instead of ln V."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, std)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)


def _encoder_layer(d_model: int, num_heads: int, d_ff: int, dropout: float, norm_first: bool) -> nn.Module:
    """The course's Transformer encoder layer (notebook 06)."""
    from .transformer import EncoderLayer

    return EncoderLayer(d_model, num_heads, d_ff, dropout=dropout, norm_first=norm_first)


class BertEncoder(nn.Module):
    """Embeddings followed by ``num_layers`` encoder layers (post-LN like BERT by default).

    forward(input_ids (B, T), segment_ids (B, T), attention_mask=None (B, T) bool, True
    for real tokens) -> hidden (B, T, D); with ``all_layers=True`` a list of
    ``num_layers + 1`` tensors (the embeddings, then each layer's output).
    """

    def __init__(self, vocab_size: int, d_model: int = 64, num_heads: int = 4, d_ff: int = 128,
                 num_layers: int = 2, max_len: int = 64, dropout: float = 0.0, norm_first: bool = False) -> None:
        super().__init__()
        self.embeddings = BertEmbeddings(vocab_size, d_model, max_len, dropout=dropout)
        self.layers = nn.ModuleList(_encoder_layer(d_model, num_heads, d_ff, dropout, norm_first)
                                    for _ in range(num_layers))
        self.final_norm = nn.LayerNorm(d_model) if norm_first else nn.Identity()
        self.d_model = d_model
        init_bert_weights(self)

    def forward(self, input_ids: Tensor, segment_ids: Tensor, attention_mask: Tensor | None = None,
                all_layers: bool = False) -> Tensor | list[Tensor]:
        mask = None if attention_mask is None else attention_mask[:, None, :]  # (B, 1, T_k)
        x = self.embeddings(input_ids, segment_ids)
        states = [x]
        for layer in self.layers:
            x = layer(x, mask)
            states.append(x)
        states[-1] = self.final_norm(x)
        return states if all_layers else states[-1]


class MLMHead(nn.Module):
    """Token predictions: ``LayerNorm(GELU(W h + b)) E^T + bias`` with ``E`` the token
    embedding matrix (tied: the output layer shares the input embeddings' weights).

    forward(hidden (B, T, D)) -> logits (B, T, vocab_size).
    """

    def __init__(self, token_embedding: nn.Embedding) -> None:
        super().__init__()
        d_model = token_embedding.embedding_dim
        self.transform = nn.Linear(d_model, d_model)
        self.norm = nn.LayerNorm(d_model)
        self.decoder = nn.Linear(d_model, token_embedding.num_embeddings)
        self.decoder.weight = token_embedding.weight  # tied
        nn.init.zeros_(self.decoder.bias)

    def forward(self, hidden: Tensor) -> Tensor:
        return self.decoder(self.norm(F.gelu(self.transform(hidden))))


class NSPHead(nn.Module):
    """IsNext / NotNext logits from the final state of ``[CLS]`` (position 0):
    ``classifier(tanh(pooler(hidden[:, 0])))``.

    forward(hidden (B, T, D)) -> logits (B, 2).
    """

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.pooler = nn.Linear(d_model, d_model)
        self.classifier = nn.Linear(d_model, 2)

    def forward(self, hidden: Tensor) -> Tensor:
        return self.classifier(torch.tanh(self.pooler(hidden[:, 0])))


class BertForPreTraining(nn.Module):
    """Encoder + tied MLM head + NSP head.

    forward(input_ids, segment_ids, attention_mask) -> (mlm_logits (B, T, V), nsp_logits (B, 2)).
    """

    def __init__(self, vocab_size: int, d_model: int = 64, num_heads: int = 4, d_ff: int = 128,
                 num_layers: int = 2, max_len: int = 64, dropout: float = 0.0, norm_first: bool = False) -> None:
        super().__init__()
        self.encoder = BertEncoder(vocab_size, d_model, num_heads, d_ff, num_layers, max_len, dropout, norm_first)
        self.mlm = MLMHead(self.encoder.embeddings.token)
        self.nsp = NSPHead(d_model)
        init_bert_weights(self.mlm.transform)
        init_bert_weights(self.nsp)

    def forward(self, input_ids: Tensor, segment_ids: Tensor, attention_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        hidden = self.encoder(input_ids, segment_ids, attention_mask)
        return self.mlm(hidden), self.nsp(hidden)


def mlm_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """Mean cross-entropy over the positions whose label is not -100.

    logits: (B, T, V); labels: (B, T) with -100 at positions not to predict.
    """
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=-100)


class SequenceClassifier(nn.Module):
    """A fine-tuning head on an encoder: ``classifier(tanh(pooler(h_[CLS])))``.

    forward(input_ids, segment_ids, attention_mask) -> logits (B, n_classes).
    """

    def __init__(self, encoder: BertEncoder, n_classes: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.encoder = encoder
        self.pooler = nn.Linear(encoder.d_model, encoder.d_model)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(encoder.d_model, n_classes)
        init_bert_weights(self.pooler)
        init_bert_weights(self.classifier)

    def forward(self, input_ids: Tensor, segment_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        hidden = self.encoder(input_ids, segment_ids, attention_mask)
        return self.classifier(self.dropout(torch.tanh(self.pooler(hidden[:, 0]))))
