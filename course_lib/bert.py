"""BERT: an encoder pre-trained with masked language modelling (MLM) and
next-sentence prediction (NSP), then fine-tuned.

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

import random
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .tokenizer import SubwordTokenizer
from .training import TrainHistory, train

__all__ = [
    "IS_NEXT", "NOT_NEXT", "mask_tokens", "make_nsp_input", "sample_nsp_pairs", "BertEmbeddings",
    "BertEncoder", "init_bert_weights", "MLMHead", "NSPHead", "BertForPreTraining", "mlm_loss", "PretrainingData",
    "pretrain", "mlm_accuracy", "unigram_baseline", "nsp_accuracy", "SequenceClassifier",
    "classification_batch", "finetune", "classification_accuracy", "layer_features", "probe_layers",
]

IS_NEXT, NOT_NEXT = 0, 1


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
# Next-sentence prediction: pairs and their input
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


def sample_nsp_pairs(documents: Sequence[Sequence[Any]], n: int, rng: random.Random,
                     topics: Sequence[Any] | None = None) -> list[tuple[Any, Any, int]]:
    """``n`` sentence pairs ``(A, B, label)``: half IsNext (B follows A in its document,
    label 0), half NotNext (B is a random sentence of another document, label 1).

    documents: at least two, each a sequence of sentences (strings or token lists).
    topics: optional, one label per document; NotNext sentences then come from a
    document with a *different* topic, so that every NotNext pair changes subject.
    """
    usable = [i for i, d in enumerate(documents) if len(d) >= 2]
    if not usable or len(documents) < 2:
        raise ValueError("need at least two documents, one of them with two or more sentences")
    if topics is not None:
        if len(topics) != len(documents):
            raise ValueError(f"got {len(topics)} topics for {len(documents)} documents")
        if len(set(topics)) < 2:
            raise ValueError("NotNext from a different topic needs documents of at least two topics")
    pairs = []
    for k in range(n):
        d = rng.choice(usable)
        j = rng.randrange(len(documents[d]) - 1)
        if k % 2 == 0:
            pairs.append((documents[d][j], documents[d][j + 1], IS_NEXT))
            continue
        if topics is None:
            other = rng.randrange(len(documents) - 1)
            other += other >= d  # any document but d
        else:
            while topics[other := rng.randrange(len(documents))] == topics[d]:
                pass
        pairs.append((documents[d][j], rng.choice(documents[other]), NOT_NEXT))
    rng.shuffle(pairs)
    return pairs


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
    """Embeddings followed by ``n_layer`` encoder layers (post-LN like BERT by default).

    forward(input_ids (B, T), segment_ids (B, T), attention_mask=None (B, T) bool, True
    for real tokens) -> hidden (B, T, D); with ``all_layers=True`` a list of
    ``n_layer + 1`` tensors (the embeddings, then each layer's output).
    """

    def __init__(self, vocab_size: int, d_model: int = 64, num_heads: int = 4, d_ff: int = 128,
                 n_layer: int = 2, max_len: int = 64, dropout: float = 0.0, norm_first: bool = False) -> None:
        super().__init__()
        self.embeddings = BertEmbeddings(vocab_size, d_model, max_len, dropout=dropout)
        self.layers = nn.ModuleList(_encoder_layer(d_model, num_heads, d_ff, dropout, norm_first)
                                    for _ in range(n_layer))
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
                 n_layer: int = 2, max_len: int = 64, dropout: float = 0.0, norm_first: bool = False) -> None:
        super().__init__()
        self.encoder = BertEncoder(vocab_size, d_model, num_heads, d_ff, n_layer, max_len, dropout, norm_first)
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


# ---------------------------------------------------------------------------
# Pre-training data
# ---------------------------------------------------------------------------

@dataclass
class PretrainingData:
    """Tokenized documents from which pre-training batches are drawn.

    ``batch(batch_size, rng, generator)`` returns a dict with ``input_ids``,
    ``segment_ids``, ``attention_mask`` (True = real token), ``mlm_labels`` and
    ``nsp_labels``; every pair is padded to the longest in the batch and cut to
    ``max_len`` (the longer sentence loses its tail). With ``topics`` (one per
    document), NotNext sentences come from a document of another topic.
    """

    tokenizer: SubwordTokenizer
    documents: list[list[list[int]]]
    max_len: int = 64
    mlm_probability: float = 0.15
    topics: list[Any] | None = None

    @classmethod
    def from_text(cls, tokenizer: SubwordTokenizer, documents: Sequence[Sequence[str]], max_len: int = 64,
                  mlm_probability: float = 0.15, topics: Sequence[Any] | None = None) -> "PretrainingData":
        docs = [[tokenizer.encode(s) for s in doc] for doc in documents]
        return cls(tokenizer, docs, max_len, mlm_probability, None if topics is None else list(topics))

    def _truncate(self, a: list[int], b: list[int]) -> tuple[list[int], list[int]]:
        budget = self.max_len - 3
        a, b = list(a), list(b)
        while len(a) + len(b) > budget:
            if len(a) >= len(b):
                a.pop()
            else:
                b.pop()
        return a, b

    def collate(self, pairs: Sequence[tuple[list[int], list[int], int]], generator: torch.Generator | None = None,
                mask: bool = True) -> dict[str, Tensor]:
        tok = self.tokenizer
        rows = [make_nsp_input(*self._truncate(a, b), tok.cls_id, tok.sep_id) for a, b, _ in pairs]
        T = max(len(ids) for ids, _ in rows)
        input_ids = torch.full((len(rows), T), tok.pad_id, dtype=torch.long)
        segment_ids = torch.zeros((len(rows), T), dtype=torch.long)
        for i, (ids, seg) in enumerate(rows):
            input_ids[i, : len(ids)] = ids
            segment_ids[i, : len(seg)] = seg
        batch = {"input_ids": input_ids, "segment_ids": segment_ids, "attention_mask": input_ids != tok.pad_id,
                 "nsp_labels": torch.tensor([label for _, _, label in pairs], dtype=torch.long)}
        if mask:
            batch["input_ids"], batch["mlm_labels"] = mask_tokens(
                input_ids, len(tok), tok.mask_id, tok.special_ids, self.mlm_probability, generator)
        return batch

    def batch(self, batch_size: int, rng: random.Random, generator: torch.Generator | None = None) -> dict[str, Tensor]:
        return self.collate(sample_nsp_pairs(self.documents, batch_size, rng, self.topics), generator)


def _to(batch: dict[str, Tensor], device: torch.device) -> dict[str, Tensor]:
    return {k: v.to(device) for k, v in batch.items()}


def pretraining_loss(model: BertForPreTraining, batch: dict[str, Tensor]) -> Tensor:
    """MLM loss + NSP loss on one batch.

    Like the original BERT code, the MLM head runs only at the selected positions (about
    15% of them): the same loss as :func:`mlm_loss` on the full ``(B, T, V)`` logits,
    for a fraction of the cost of the vocabulary-sized output layer.
    """
    hidden = model.encoder(batch["input_ids"], batch["segment_ids"], batch["attention_mask"])
    selected = batch["mlm_labels"] != -100
    mlm = F.cross_entropy(model.mlm(hidden[selected]), batch["mlm_labels"][selected]) if selected.any() else hidden.sum() * 0
    return mlm + F.cross_entropy(model.nsp(hidden), batch["nsp_labels"])


def pretrain(model: BertForPreTraining, data: PretrainingData, steps: int, batch_size: int = 64, lr: float = 1e-3,
             warmup: int = 100, seed: int = 0, progress: bool = True,
             eval_fn: Callable[[nn.Module], dict[str, float]] | None = None, eval_every: int = 0) -> TrainHistory:
    """Pre-train with MLM + NSP (Adam, linear warm-up then constant learning rate);
    ``eval_fn``/``eval_every`` record metrics during training (see :func:`course_lib.training.train`)."""
    device = next(model.parameters()).device
    rng, generator = random.Random(seed), torch.Generator().manual_seed(seed)
    return train(model, next_batch=lambda step: _to(data.batch(batch_size, rng, generator), device),
                 loss_fn=pretraining_loss, steps=steps, lr=lr,
                 schedule=lambda step: min(1.0, (step + 1) / max(1, warmup)),
                 progress=progress, desc="pre-training (MLM + NSP)", eval_fn=eval_fn, eval_every=eval_every)


@torch.no_grad()
def _eval_batches(data: PretrainingData, n_pairs: int, seed: int, batch_size: int = 200) -> list[dict[str, Tensor]]:
    rng, generator = random.Random(seed), torch.Generator().manual_seed(seed)
    pairs = sample_nsp_pairs(data.documents, n_pairs, rng, data.topics)
    return [data.collate(pairs[i: i + batch_size], generator) for i in range(0, n_pairs, batch_size)]


@torch.no_grad()
def mlm_accuracy(model: BertForPreTraining, data: PretrainingData, n_pairs: int = 1000, seed: int = 1) -> float:
    """Fraction of the selected (masked) tokens whose original id is the model's top prediction."""
    model.eval()
    device = next(model.parameters()).device
    right = total = 0
    for batch in _eval_batches(data, n_pairs, seed):
        batch = _to(batch, device)
        logits, _ = model(batch["input_ids"], batch["segment_ids"], batch["attention_mask"])
        selected = batch["mlm_labels"] != -100
        right += int((logits.argmax(-1)[selected] == batch["mlm_labels"][selected]).sum())
        total += int(selected.sum())
    return right / max(total, 1)


@torch.no_grad()
def unigram_baseline(train_data: PretrainingData, test_data: PretrainingData, n_pairs: int = 1000,
                     seed: int = 1) -> tuple[float, str]:
    """Accuracy on the same masked positions as :func:`mlm_accuracy` of always guessing
    the most frequent non-special token of the training text; returns (accuracy, token)."""
    counts = torch.zeros(len(train_data.tokenizer), dtype=torch.long)
    for doc in train_data.documents:
        for sentence in doc:
            counts += torch.bincount(torch.tensor(sentence, dtype=torch.long), minlength=len(counts))
    counts[train_data.tokenizer.special_ids] = 0
    guess = int(counts.argmax())
    right = total = 0
    for batch in _eval_batches(test_data, n_pairs, seed):
        labels = batch["mlm_labels"][batch["mlm_labels"] != -100]
        right += int((labels == guess).sum())
        total += labels.numel()
    return right / max(total, 1), train_data.tokenizer.tokens[guess]


@torch.no_grad()
def nsp_accuracy(model: BertForPreTraining, data: PretrainingData, n_pairs: int = 1000, seed: int = 2) -> float:
    """NSP accuracy on ``n_pairs`` fresh pairs (half IsNext) from ``data`` (inputs masked as in training)."""
    model.eval()
    device = next(model.parameters()).device
    right = 0
    for batch in _eval_batches(data, n_pairs, seed):
        batch = _to(batch, device)
        _, logits = model(batch["input_ids"], batch["segment_ids"], batch["attention_mask"])
        right += int((logits.argmax(-1) == batch["nsp_labels"]).sum())
    return right / n_pairs


# ---------------------------------------------------------------------------
# Fine-tuning and probing
# ---------------------------------------------------------------------------

class SequenceClassifier(nn.Module):
    """A fine-tuning head on an encoder: ``classifier(tanh(pooler(h_[CLS])))``.

    forward(input_ids, segment_ids, attention_mask) -> logits (B, num_classes).
    """

    def __init__(self, encoder: BertEncoder, num_classes: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.encoder = encoder
        self.pooler = nn.Linear(encoder.d_model, encoder.d_model)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(encoder.d_model, num_classes)
        init_bert_weights(self.pooler)
        init_bert_weights(self.classifier)

    def forward(self, input_ids: Tensor, segment_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        hidden = self.encoder(input_ids, segment_ids, attention_mask)
        return self.classifier(self.dropout(torch.tanh(self.pooler(hidden[:, 0]))))


def classification_batch(tokenizer: SubwordTokenizer, sentences: Sequence[str], labels: Sequence[int],
                         max_len: int = 64) -> dict[str, Tensor]:
    """``[CLS] sentence [SEP]`` rows (segment 0), padded; with ``labels``."""
    rows = [[tokenizer.cls_id, *tokenizer.encode(s)[: max_len - 2], tokenizer.sep_id] for s in sentences]
    T = max(len(r) for r in rows)
    ids = torch.full((len(rows), T), tokenizer.pad_id, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
    return {"input_ids": ids, "segment_ids": torch.zeros_like(ids), "attention_mask": ids != tokenizer.pad_id,
            "labels": torch.as_tensor(list(labels), dtype=torch.long)}


def _classify_loss(model: SequenceClassifier, batch: dict[str, Tensor]) -> Tensor:
    return F.cross_entropy(model(batch["input_ids"], batch["segment_ids"], batch["attention_mask"]), batch["labels"])


def finetune(model: SequenceClassifier, batch: dict[str, Tensor], steps: int, lr: float = 5e-4,
             progress: bool = True, desc: str = "fine-tuning") -> TrainHistory:
    """Train on one small labelled batch (all of the labelled data) for ``steps`` steps."""
    device = next(model.parameters()).device
    batch = _to(batch, device)
    return train(model, next_batch=lambda step: batch, loss_fn=_classify_loss, steps=steps, lr=lr,
                 progress=progress, desc=desc)


@torch.no_grad()
def classification_accuracy(model: SequenceClassifier, batch: dict[str, Tensor]) -> float:
    model.eval()
    batch = _to(batch, next(model.parameters()).device)
    logits = model(batch["input_ids"], batch["segment_ids"], batch["attention_mask"])
    return float((logits.argmax(-1) == batch["labels"]).float().mean())


@torch.no_grad()
def layer_features(encoder: BertEncoder, batch: dict[str, Tensor], pooling: str = "cls") -> list[Tensor]:
    """One ``(N, D)`` feature matrix per layer (embeddings first): the ``[CLS]`` state
    (``pooling="cls"``) or the mean over real tokens (``"mean"``)."""
    if pooling not in ("cls", "mean"):
        raise ValueError(f"pooling must be 'cls' or 'mean', got {pooling!r}")
    encoder.eval()
    batch = _to(batch, next(encoder.parameters()).device)
    states = encoder(batch["input_ids"], batch["segment_ids"], batch["attention_mask"], all_layers=True)
    if pooling == "cls":
        return [h[:, 0].cpu() for h in states]
    m = batch["attention_mask"][..., None].to(states[0].dtype)
    return [((h * m).sum(1) / m.sum(1)).cpu() for h in states]


def probe_layers(train_features: Sequence[Tensor], train_labels: Tensor, test_features: Sequence[Tensor],
                 test_labels: Tensor, steps: int = 300, lr: float = 0.05, seed: int = 0) -> list[float]:
    """Linear probe per layer: a logistic regression trained on frozen features
    (standardised with the training statistics); returns test accuracy per layer."""
    num_classes = int(max(train_labels.max(), test_labels.max())) + 1
    accuracies = []
    for x_train, x_test in zip(train_features, test_features):
        mean, std = x_train.mean(0), x_train.std(0) + 1e-5
        x_train, x_test = (x_train - mean) / std, (x_test - mean) / std
        torch.manual_seed(seed)
        probe = nn.Linear(x_train.size(1), num_classes)
        opt = torch.optim.Adam(probe.parameters(), lr=lr, weight_decay=1e-4)
        with torch.enable_grad():
            for _ in range(steps):
                opt.zero_grad()
                F.cross_entropy(probe(x_train), train_labels).backward()
                opt.step()
        accuracies.append(float((probe(x_test).argmax(-1) == test_labels).float().mean()))
    return accuracies
