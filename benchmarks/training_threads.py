"""Training steps on 1, 2, 4 and 8 CPU threads: the notebooks' models, and GPTs of growing size.

    .venv/bin/python benchmarks/training_threads.py [--threads 1 2 4 8] [--rounds 3] [--steps 20] [--only NAME ...]

For each model it times ``--steps`` training steps (forward, backward, Adam) with each thread
count, the counts taken in turn for ``--rounds`` rounds (so that a change in the machine's load
falls on all of them alike), and prints the median milliseconds per step (wall), the CPU
milliseconds per step (all threads together) and the speed-up over one thread. The notebook
models are built and fed as in their notebooks' main training cells; the ``gpt-d*`` rows are
GPTs of 0.1 to 6 million parameters on the same batch, for the rule of
``course_lib.device.threads_for`` (how many threads a model of a given size should get).
docs/threads.md records a run and the rule chosen from it. Run it on an otherwise idle
machine; more threads than cores measure oversubscription.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

Case = tuple[nn.Module, Callable[[], Any], Callable[[nn.Module, Any], torch.Tensor]]


def _copy_model() -> Case:  # notebook 01
    from course_lib.data.copy import CopyTask
    from course_lib.rnn import FixedContextSeq2Seq
    from course_lib.seq2seq import sequence_loss

    task, rng = CopyTask(min_len=3, max_len=20), random.Random(0)
    model = FixedContextSeq2Seq(len(task.src_vocab), len(task.tgt_vocab), emb_dim=16, hidden_size=128, cell="gru")
    return model, lambda: task.sample_batch(64, rng), sequence_loss


def _dates_attention() -> Case:  # notebook 02
    from course_lib.bahdanau import AttentionSeq2Seq, BahdanauAttention
    from course_lib.data.dates import DatesTask
    from course_lib.seq2seq import sequence_loss

    task, rng = DatesTask(seed=0), random.Random(0)
    model = AttentionSeq2Seq(len(task.src_vocab), len(task.tgt_vocab), emb_dim=32, enc_hidden=64, dec_hidden=64,
                             attention=BahdanauAttention(128, 64, 32))
    return model, lambda: task.sample_batch(64, rng), sequence_loss


def _offset_digits() -> Case:  # notebook 04
    from course_lib.synthetic_tasks import offset_digits_batch
    from course_lib.tiny_models import TinyTransformer

    g = torch.Generator().manual_seed(1)
    model = TinyTransformer(vocab_size=10, n_classes=100, d_model=32, num_heads=4, num_layers=1, positions="learned",
                            max_len=16, causal=True)
    return model, lambda: offset_digits_batch(64, 16, generator=g), _classify


def _translation() -> Case:  # notebook 06
    from course_lib.data.translation import make_translation_data
    from course_lib.decoding import teacher_forcing_loss
    from course_lib.transformer import Transformer

    data = make_translation_data(n_train=4000, n_valid=300, n_test=300, seed=0)
    model = Transformer(len(data.vocab), d_model=64, num_heads=4, num_encoder_layers=2, num_decoder_layers=2,
                        d_ff=128, dropout=0.0)
    batches = data.batches("train", batch_size=64, generator=torch.Generator().manual_seed(0))
    return model, lambda: next(batches), lambda m, b: teacher_forcing_loss(m, b.src, b.src_mask, b.tgt_in, b.tgt_out,
                                                                           epsilon=0.1, pad_id=data.pad_id)


def _bert() -> Case:  # notebook 07
    from course_lib.bert import BertForPreTraining
    from course_lib.bert_pretraining import PretrainingData, pretraining_loss
    from course_lib.data.corpus import story_corpus
    from course_lib.tokenizer import SubwordTokenizer

    docs, topics = story_corpus(3000, seed=0)
    tokenizer = SubwordTokenizer.train([s for doc in docs for s in doc], num_merges=1000)
    data = PretrainingData.from_text(tokenizer, docs, max_len=48, topics=topics)
    model = BertForPreTraining(len(tokenizer), d_model=64, num_heads=4, d_ff=128, num_layers=2, max_len=48,
                               norm_first=True)
    rng, g = random.Random(0), torch.Generator().manual_seed(0)
    return model, lambda: data.batch(64, rng, g), pretraining_loss


def _icl() -> Case:  # notebook 08
    from course_lib.icl import GaussianClassTasks, ICLTransformer, icl_loss

    tasks, g = GaussianClassTasks(n_classes=4, dim=16), torch.Generator().manual_seed(1)
    model = ICLTransformer(tasks.token_dim, n_classes=4, d_model=64, num_layers=2, num_heads=4)
    return model, lambda: tasks(256, int(torch.randint(0, 17, (1,), generator=g)), g), icl_loss


def _induction() -> Case:  # notebook 08
    from course_lib.induction import AttentionOnlyTransformer, next_token_loss, repeated_random_tokens

    g = torch.Generator().manual_seed(3)
    model = AttentionOnlyTransformer(32, 32, d_model=64, num_layers=2, num_heads=4)
    return model, lambda: repeated_random_tokens(64, 16, 32, g, min_length=4), next_token_loss


def _long_context() -> Case:  # notebook 09, the steps at T = 1024
    from course_lib.long_context import LongContextModel
    from course_lib.synthetic_tasks import IGNORE_INDEX, shift_by_first_batch

    g = torch.Generator().manual_seed(1)
    model = LongContextModel(12, 8, "full", 16)

    def loss(m: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        tokens, targets = batch
        return F.cross_entropy(m(tokens).flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX)

    return model, lambda: shift_by_first_batch(8, 1024, generator=g), loss


def _gpt(d_model: int) -> Callable[[], Case]:
    """A GPT of width ``d_model`` (4 layers) on batches of 32 random sequences of 64 tokens."""
    def build() -> Case:
        from course_lib.gpt import GPT

        g = torch.Generator().manual_seed(0)
        model = GPT(vocab_size=256, block_size=64, d_model=d_model, num_layers=4, num_heads=4)
        return model, lambda: torch.randint(0, 256, (32, 65), generator=g), _next_token
    return build


def _classify(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))


def _next_token(model: nn.Module, idx: torch.Tensor) -> torch.Tensor:
    logits = model(idx[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), idx[:, 1:].reshape(-1))


CASES: dict[str, Callable[[], Case]] = {
    "01 copy (GRU)": _copy_model, "02 dates (attention)": _dates_attention, "04 offset digits": _offset_digits,
    "06 translation": _translation, "07 BERT": _bert, "08 in-context": _icl, "08 induction": _induction,
    "09 T=1024": _long_context, "gpt-d64": _gpt(64), "gpt-d128": _gpt(128), "gpt-d256": _gpt(256),
    "gpt-d512": _gpt(512),
}


def time_steps(model: nn.Module, next_batch: Callable[[], Any], loss_fn: Callable[[nn.Module, Any], torch.Tensor],
               optimizer: torch.optim.Optimizer, steps: int) -> tuple[float, float]:
    """Wall and CPU seconds per training step over ``steps`` steps (batches made beforehand)."""
    batches = [next_batch() for _ in range(steps)]
    wall, cpu = time.perf_counter(), time.process_time()
    for batch in batches:
        loss = loss_fn(model, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return (time.perf_counter() - wall) / steps, (time.process_time() - cpu) / steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--only", nargs="+", help="models whose name contains one of these")
    args = parser.parse_args(argv)
    from course_lib.training import default_optimizer

    names = [n for n in CASES if not args.only or any(o in n for o in args.only)]
    print(f"{os.cpu_count()} CPUs; milliseconds per training step, median of {args.rounds} rounds of {args.steps} "
          f"steps: wall (CPU, all threads) and speed-up over {args.threads[0]} thread(s)")
    print(f"{'model':<22}{'parameters':>11}" + "".join(f"{f'{n} thread' + ('s' if n > 1 else ''):>22}"
                                                        for n in args.threads))
    for name in names:
        torch.manual_seed(0)
        model, next_batch, loss_fn = CASES[name]()
        optimizer = default_optimizer(model, 1e-4)  # small steps: the model stays where it started
        previous = torch.get_num_threads()
        times: dict[int, list[tuple[float, float]]] = {n: [] for n in args.threads}
        try:
            for _ in range(args.rounds):
                for n in args.threads:
                    torch.set_num_threads(n)
                    time_steps(model, next_batch, loss_fn, optimizer, 2)  # warm-up: start the threads
                    times[n].append(time_steps(model, next_batch, loss_fn, optimizer, args.steps))
        finally:
            torch.set_num_threads(previous)
        wall = {n: statistics.median(w for w, _ in t) for n, t in times.items()}
        cpu = {n: statistics.median(c for _, c in t) for n, t in times.items()}
        base = wall[args.threads[0]]
        row = f"{name:<22}{sum(p.numel() for p in model.parameters()):>11,}"
        row += "".join(f"{f'{wall[n] * 1e3:.1f} ({cpu[n] * 1e3:.0f}) {base / wall[n]:.2f}x':>22}" for n in args.threads)
        print(row, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
