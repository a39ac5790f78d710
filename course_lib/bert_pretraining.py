"""Pre-training BERT (:mod:`course_lib.bert`) with MLM + NSP, and what comes after it.

- data: sentence pairs drawn from documents (:func:`sample_nsp_pairs`), tokenized,
  cut to ``max_len``, padded and masked (:class:`PretrainingData`);
- the pre-training run (:func:`pretrain`, on :func:`course_lib.training.train`) and its
  held-out metrics (:func:`mlm_accuracy`, :func:`nsp_accuracy`, :func:`unigram_baseline`);
- fine-tuning a :class:`~course_lib.bert.SequenceClassifier` on a few labelled sentences
  (:func:`finetune`) and linear probes of every layer's features (:func:`probe_layers`).

Batches are dicts of tensors: ``input_ids``, ``segment_ids``, ``attention_mask`` (True =
real token) and the labels (``mlm_labels`` and ``nsp_labels``, or ``labels``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .bert import BertEncoder, BertForPreTraining, SequenceClassifier, mask_tokens
from .tokenizer import SubwordTokenizer
from .training import TrainHistory, train

__all__ = [
    "IS_NEXT", "NOT_NEXT", "sample_nsp_pairs", "PretrainingData", "pretraining_loss", "pretrain", "mlm_accuracy",
    "unigram_baseline", "nsp_accuracy", "classification_batch", "finetune", "classification_accuracy",
    "layer_features", "probe_layers",
]

IS_NEXT, NOT_NEXT = 0, 1


# ---------------------------------------------------------------------------
# Pre-training data
# ---------------------------------------------------------------------------

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
        cut = [self._truncate(a, b) for a, b, _ in pairs]
        T = max(len(a) + len(b) + 3 for a, b in cut)
        # the rows of make_nsp_input, padded, built as lists: one tensor per batch, not five per pair
        input_ids = torch.tensor([[tok.cls_id, *a, tok.sep_id, *b, tok.sep_id] + [tok.pad_id] * (T - len(a) - len(b) - 3)
                                  for a, b in cut], dtype=torch.long)
        segment_ids = torch.tensor([[0] * (len(a) + 2) + [1] * (len(b) + 1) + [0] * (T - len(a) - len(b) - 3)
                                    for a, b in cut], dtype=torch.long)
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
    15% of them): the same loss as :func:`course_lib.bert.mlm_loss` on the full ``(B, T, V)`` logits,
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
    tokens = [t for doc in train_data.documents for sentence in doc for t in sentence]
    counts = torch.bincount(torch.tensor(tokens, dtype=torch.long), minlength=len(train_data.tokenizer))
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
    n_classes = int(max(train_labels.max(), test_labels.max())) + 1
    accuracies = []
    for x_train, x_test in zip(train_features, test_features):
        mean, std = x_train.mean(0), x_train.std(0) + 1e-5
        x_train, x_test = (x_train - mean) / std, (x_test - mean) / std
        torch.manual_seed(seed)
        probe = nn.Linear(x_train.size(1), n_classes)
        with torch.enable_grad():  # full batch: every step sees all the training features
            train(probe, next_batch=lambda step: (x_train, train_labels),
                  loss_fn=lambda model, batch: F.cross_entropy(model(batch[0]), batch[1]), steps=steps,
                  optimizer=torch.optim.Adam(probe.parameters(), lr=lr, weight_decay=1e-4), clip_grad_norm=None,
                  progress=False)
        accuracies.append(float((probe(x_test).argmax(-1) == test_labels).float().mean()))
    return accuracies
