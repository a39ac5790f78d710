"""Check specs for notebook 08 (GPT and in-context learning): GPTBlock,
sample_next_token, generate, gpt_parameter_count and few_shot_accuracy, with their
mistake catalogues.

Sampling is random, so ``sample_next_token`` is checked statistically: many rows with
the same logits are sampled in one call with a seeded generator, and the frequency of
each token must be within 6 standard deviations (plus 0.005) of its probability, which
a correct implementation meets whatever random stream it uses.
"""

from __future__ import annotations

import math
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ... import gpt as ref_gpt
from ... import icl as ref_icl
from ... import sampling as ref_sampling
from ..answer.calls import Invoke, earlier, realise
from ..answer.watch import unwatched
from ..judge.compare import fmt_num
from ..judge.properties import (call_and_inspect, compare_cases, dtype_name, fresh, generator, layout, module_case,
                          module_gradients, randn, reference_state, reproducible, type_name, variant)
from ..judge.properties import seed as salted_seed
from ..answer.fixtures.gpt import CentroidModel, ContextSumModel, GaussianSampler, TinyLM  # noqa: F401
from ..judge.spec import Case, CheckFailed, ItemSpec, Mistake, SubCheck
from ..answer.wire import Build

f32, f64 = torch.float32, torch.float64
_HERE = "course_lib.grading.answer.fixtures.gpt"  # Build targets, built on the student's side


# ---------------------------------------------------------------------------
# GPTBlock
# ---------------------------------------------------------------------------


def _block_noise(block: nn.Module) -> None:
    """``adjust`` for the grader's GPTBlock weights: non-trivial LayerNorm and bias values,
    so that every part shows."""
    for name, p in block.named_parameters():
        if name.endswith("bias") or name.startswith("ln"):
            p.add_(0.1 * torch.randn(p.shape))


def _block_case(seed: int, B: int, T: int, d_model: int, heads: int, d_ff: int, dtype: torch.dtype) -> Case:
    dims = (d_model, heads, d_ff)
    return module_case(f"GPTBlock(d_model={d_model}, num_heads={heads}, d_ff={d_ff}) on x ({B}, {T}, {d_model}) "
                       f"{dtype_name(dtype)}", ref_gpt.GPTBlock, dims, 808 + sum(dims), dtype,
                       lambda device: {"x": randn((B, T, d_model), seed, dtype, device)}, adjust=_block_noise)


_BLOCK_PARTS = ("ln1", "attn", "ln2", "mlp")


class _PlainMHA(nn.Module):
    """Multi-head attention with the parameter names of course_lib's (w_q, w_k, w_v, w_o);
    ``safe``: a row with nothing visible gives zeros instead of NaN."""

    def __init__(self, d_model: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.w_q, self.w_k, self.w_v, self.w_o = (nn.Linear(d_model, d_model) for _ in range(4))

    def forward(self, x, mask, safe=False):
        B, T, D = x.shape
        H = self.num_heads

        def split(t):
            return t.view(B, T, H, D // H).transpose(1, 2)

        q, k, v = split(self.w_q(x)), split(self.w_k(x)), split(self.w_v(x))
        s = q @ k.transpose(-2, -1) / math.sqrt(D // H)
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        w = torch.nan_to_num(torch.softmax(s, dim=-1)) if safe else torch.softmax(s, dim=-1)
        return self.w_o((w @ v).transpose(1, 2).reshape(B, T, D))


class _BlockLayout(nn.Module):
    """The contract's layout, written without course_lib (for the mistake variants)."""

    def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = _PlainMHA(d_model, num_heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(), nn.Linear(d_ff, d_model))

    def run(self, x, mask="causal", safe=False, post_ln=False, residual=True, mlp_norm="ln2", relu=False,
            gelu="none", eps=None):
        ones = torch.ones(x.size(1), x.size(1), dtype=torch.bool, device=x.device)
        allowed = {"causal": ones.tril(), "none": None, "diagonal": ones.tril(-1), "inverted": ~ones.tril(-1)}[mask]

        def attn(h):
            return self.attn(h, allowed, safe)

        def mlp(h):
            if relu:
                return self.mlp[2](torch.relu(self.mlp[0](h)))
            return self.mlp[2](F.gelu(self.mlp[0](h), approximate=gelu))

        def norm(ln, h):
            return ln(h) if eps is None else F.layer_norm(h, h.shape[-1:], ln.weight, ln.bias, eps)

        if post_ln:
            x = norm(self.ln1, x + attn(x))
            return norm(self.ln2, x + mlp(x))
        if not residual:
            return mlp(norm(self.ln2, attn(norm(self.ln1, x))))
        x = x + attn(norm(self.ln1, x))
        return x + mlp(norm(getattr(self, mlp_norm), x))


BLOCK_MISTAKES = (
    Mistake("no causal mask", variant(_BlockLayout, "BlockNoMask", mask="none"),
            "Every position sees the future: pass a causal mask (True on and below the diagonal, "
            "torch.ones(T, T, dtype=torch.bool).tril()) to the attention."),
    Mistake("diagonal excluded", variant(_BlockLayout, "BlockDiagonalExcluded", mask="diagonal"),
            "Your causal mask excludes the diagonal, so a token cannot attend to itself (and the first token "
            "sees nothing at all): use tril() without an offset."),
    Mistake("diagonal excluded (empty first row gives zeros)",
            variant(_BlockLayout, "BlockDiagonalExcludedSafe", mask="diagonal", safe=True),
            "Your causal mask excludes the diagonal, so a token cannot attend to itself (and the first token "
            "sees nothing at all): use tril() without an offset."),
    Mistake("mask inverted", variant(_BlockLayout, "BlockMaskInverted", mask="inverted"),
            "Your causal mask is inverted: True means 'may attend', i.e. on and below the diagonal."),
    Mistake("post-LN", variant(_BlockLayout, "BlockPostLN", post_ln=True),
            "This is the post-LN block of the original transformer (LayerNorm after the residual sum). GPT-2 is "
            "pre-LN: x = x + attn(ln1(x)), then x = x + mlp(ln2(x))."),
    Mistake("no residual connections", variant(_BlockLayout, "BlockNoResidual", residual=False),
            "The residual connections are missing: add each sub-layer's output to its input (x = x + ...)."),
    Mistake("ln1 used twice", variant(_BlockLayout, "BlockSameNorm", mlp_norm="ln1"),
            "The MLP reads ln1(x): each sub-layer has its own LayerNorm, use ln2 before the MLP."),
    Mistake("ReLU in the MLP", variant(_BlockLayout, "BlockReLU", relu=True),
            "The MLP uses ReLU; GPT uses GELU: nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(), nn.Linear(d_ff, d_model))."),
    Mistake("tanh approximation of GELU", variant(_BlockLayout, "BlockTanhGELU", gelu="tanh"),
            "The MLP uses the tanh approximation of GELU (GPT-2's gelu_new, nn.GELU(approximate='tanh')); the "
            "contract's is the exact one, nn.GELU()."),
    Mistake("LayerNorm eps 1e-12", variant(_BlockLayout, "BlockNormEps", eps=1e-12),
            "The LayerNorms use eps=1e-12; the contract's are nn.LayerNorm(d_model), with the default eps=1e-5."),
)


def _block_parameters(trial) -> None:
    module = layout(trial, (8, 2, 32), attrs=(*_BLOCK_PARTS, "attn.num_heads"), label="GPTBlock(8, 2, 32)")
    found = module.get("attrs") or {}
    present = {name: found[name] for name in _BLOCK_PARTS
               if isinstance(found.get(name), dict) and found[name].get("is_module")}
    missing = [name for name in _BLOCK_PARTS if name not in present]
    if missing:
        raise CheckFailed(f"GPTBlock(8, 2, 32) should have the submodules ln1, attn, ln2 and mlp; missing: {', '.join(missing)}.")
    for name in ("ln1", "ln2"):
        if "torch.nn.modules.normalization.LayerNorm" not in (present[name].get("torch") or []):
            raise CheckFailed(f"`{name}` should be an nn.LayerNorm(d_model), got {present[name].get('type')}.")
    if found.get("attn.num_heads") != 2:
        raise CheckFailed("`attn` should be MultiHeadAttention(d_model, num_heads, dropout) with num_heads = 2.")
    expected = {k: tuple(v.shape) for k, v in reference_state(ref_gpt.GPTBlock, (8, 2, 32), 0).items()}
    got = module.get("state", {})
    if got != expected:
        wrong = [f"{k} {got.get(k, 'missing')}" for k in expected if got.get(k) != expected[k]]
        extra = [k for k in got if k not in expected]
        raise CheckFailed(
            "GPTBlock(d_model=8, num_heads=2, d_ff=32) should have exactly the parameters "
            + ", ".join(f"{k} {v}" for k, v in expected.items())
            + f". Different: {', '.join(wrong + extra)}. The MLP is "
            "nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(), nn.Linear(d_ff, d_model))."
        )


def _block_causal(trial) -> None:
    """Changing the last token must not change any earlier output."""
    case = _block_case(850, 2, 6, 8, 2, 16, f64)
    a = case.make(trial.device)
    b = case.make(trial.device)
    b["x"][:, -1] += 3.0
    out_a = trial.student(a, case.label)
    out_b = trial.student(b, case.label)
    if not isinstance(out_a, Tensor) or not isinstance(out_b, Tensor):
        raise CheckFailed(f"GPTBlock.forward should return a tensor (B, T, d_model), got {type_name(out_a)}.")
    diff = (out_a[:, :-1] - out_b[:, :-1]).abs().max().item()
    if not diff < 1e-9:
        raise CheckFailed(
            f"On {case.label}: changing only the last token changed the outputs at earlier positions (by up to "
            f"{fmt_num(diff)}), so earlier tokens see the future. Use a causal mask."
        )


def _block_gradients(trial) -> None:
    """x and every parameter of the student's own initialisation get a gradient."""
    module_gradients(trial, _block_case(860, 2, 5, 8, 2, 16, f64))


def _block_spec() -> ItemSpec:
    visible = _block_case(800, 2, 5, 8, 2, 32, f32)
    hidden = (
        _block_case(810, 3, 7, 12, 3, 24, f64),
        _block_case(820, 1, 1, 16, 4, 64, f32),
        _block_case(830, 2, 9, 8, 1, 8, f64),
    )
    return ItemSpec(
        name="GPTBlock", reference=ref_gpt.GPTBlock, invoke=Invoke(module=True, forward=("x",)),
        mistakes=BLOCK_MISTAKES,
        subchecks=(
            SubCheck("submodules ln1, attn, ln2, mlp with the right parameters", 1, _block_parameters),
            SubCheck("matches the reference (same weights) on a random batch", 1, compare_cases(visible)),
            SubCheck("matches on other sizes, float64, T = 1", 1, compare_cases(*hidden), hidden=True),
            SubCheck("causal: changing the last token leaves earlier outputs unchanged", 1, _block_causal, hidden=True),
            SubCheck("gradients reach x and every parameter", 1, _block_gradients, hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# sample_next_token
# ---------------------------------------------------------------------------

N_DRAWS = 20000
LOGITS_A = [2.0, 1.2, 0.6, 0.0, -0.5, -1.5]  # distinct values: top-k is never ambiguous
LOGITS_B = [-1.0, 0.5, 3.0, 1.0, 0.0, 2.2]


def _expected_probs(rows: list[list[float]], temperature: float, top_k: int | None) -> Tensor:
    """The distribution the reference draws from (float64), for comparing frequencies."""
    with unwatched():
        return ref_sampling.next_token_probs(torch.tensor(rows, dtype=torch.float64), temperature, top_k)


class _SampleCase:
    """``rows`` of logits, each repeated ``N_DRAWS`` times (row-major), one call."""

    def __init__(self, rows: list[list[float]], temperature: float, top_k: int | None, seed: int,
                 dtype: torch.dtype = f32, n: int = N_DRAWS) -> None:
        self.rows, self.temperature, self.top_k, self.seed, self.dtype, self.n = rows, temperature, top_k, seed, dtype, n
        k = "" if top_k is None else f", top_k={top_k}"
        self.label = (f"{len(rows) * n} rows of logits ({len(rows)} distinct, V = {len(rows[0])}) "
                      f"{dtype_name(dtype)}, temperature={temperature}{k}")

    def make(self, device: torch.device) -> dict:
        logits = torch.tensor(self.rows, dtype=self.dtype).repeat_interleave(self.n, dim=0).to(device)
        gen = torch.Generator(device=device).manual_seed(salted_seed(self.seed))
        kw = {"logits": logits, "temperature": self.temperature, "generator": gen}
        if self.top_k is not None:
            kw["top_k"] = self.top_k
        return kw

    def frequencies(self, samples: Tensor) -> Tensor:
        V = len(self.rows[0])
        s = samples.detach().cpu().long().view(len(self.rows), self.n)
        return torch.stack([torch.bincount(r, minlength=V)[:V] for r in s]).double() / self.n


def _validate_samples(case: _SampleCase, got, device) -> Tensor:
    B, V = len(case.rows) * case.n, len(case.rows[0])
    if not isinstance(got, Tensor):
        raise CheckFailed(f"On {case.label}: expected a LongTensor of shape ({B},), got {type_name(got)}.")
    if got.dtype != torch.long:
        raise CheckFailed(f"On {case.label}: expected token ids as a LongTensor (int64), got dtype {dtype_name(got.dtype)}.")
    if tuple(got.shape) != (B,):
        extra = " Squeeze the last axis of torch.multinomial's (B, 1) result." if tuple(got.shape) == (B, 1) else ""
        raise CheckFailed(f"On {case.label}: expected shape ({B},), one token per row, got {tuple(got.shape)}.{extra}")
    if got.device.type != device.type:
        raise CheckFailed(f"On {case.label}: the tokens are on {got.device}, the logits on {device}.")
    if bool(((got < 0) | (got >= V)).any()):
        raise CheckFailed(f"On {case.label}: some token ids are outside 0..{V - 1}.")
    return got


def _distance(freq: Tensor, probs: Tensor, n: int) -> tuple[float, tuple[int, int]]:
    """Largest |freq - p| in units of the allowed deviation (> 1 means 'does not match')."""
    allowed = 6.0 * torch.sqrt(probs * (1 - probs) / n) + 0.005
    ratio = (freq - probs).abs() / allowed
    idx = int(ratio.argmax())
    return float(ratio.max()), divmod(idx, probs.size(-1))


def _frequency_differ(case: _SampleCase):
    """``differ`` for :meth:`Trial.likely_mistake` on sampled tokens: outputs are compared
    by their frequency tables (a probability table, as the expected output, is used as
    is). A mistake shows when its frequencies are over 1.5 allowed deviations from the
    probabilities, and the student's draws match it within 1.5 (two samples: about
    twice the deviation of one)."""
    R, V = len(case.rows), len(case.rows[0])

    def table(x) -> Tensor | None:
        if not isinstance(x, Tensor):
            return None
        if x.dim() == 2 and tuple(x.shape) == (R, V) and x.is_floating_point():
            return x.detach().cpu().double()  # probabilities
        if tuple(x.shape) != (R * case.n,) or bool(((x < 0) | (x >= V)).any()):
            return None  # not tokens of this case
        return case.frequencies(x)

    def differ(a, b) -> str | None:
        ta, tb = table(a), table(b)
        if ta is None or tb is None:
            return None
        dist = _distance(tb, ta, case.n)[0]
        return None if dist <= 1.5 else f"frequencies differ by {dist:.1f} allowed deviations"

    return differ


def _sample_distribution(*cases: _SampleCase):
    def run(trial) -> None:
        for case in cases:
            got = _validate_samples(case, trial.student(case.make(trial.device), case.label), trial.device)
            freq = case.frequencies(got)
            probs = _expected_probs(case.rows, case.temperature, case.top_k)
            impossible = (probs == 0) & (freq > 0)
            if bool(impossible.any()):
                r, tok = (int(i) for i in impossible.nonzero()[0])
                message = (f"On {case.label}: token {tok} of row {r} was sampled {int(freq[r, tok] * case.n)} times "
                           "but has probability 0 (it is not among the top_k largest logits).")
            else:
                dist, (r, tok) = _distance(freq, probs, case.n)
                if dist <= 1.0:
                    continue
                message = (f"On {case.label}: token {tok} of row {r} should be drawn with probability "
                           f"{probs[r, tok]:.3f}, but came up in {freq[r, tok]:.3f} of {case.n} draws.")
            raise trial.failed(message, trial.likely_mistake(case, got, probs, differ=_frequency_differ(case)))

    return run


def _greedy_case(rows: list[list[float]], dtype: torch.dtype = f32) -> Case:
    def make(device):
        return {"logits": torch.tensor(rows, dtype=dtype, device=device), "temperature": 0.0}

    return Case(f"logits {tuple(torch.tensor(rows).shape)} {dtype_name(dtype)}, temperature=0 (greedy)", make)


def _random_greedy_case(value: int, dtype: torch.dtype = f32) -> Case:
    """Random logits (3, 7), drawn anew at each grading (the notebook's rows are public)."""
    def make(device):
        return {"logits": randn((3, 7), value, dtype, device), "temperature": 0.0}

    return Case(f"random logits (3, 7) {dtype_name(dtype)}, temperature=0 (greedy)", make)


def _sample_generator(trial) -> None:
    case = _SampleCase([LOGITS_A, LOGITS_B], 1.0, None, 5, n=50)
    reproducible(trial, lambda: trial.student(case.make(trial.device), case.label), case.label, "tokens",
                 "`generator` is not used. Pass it on: torch.multinomial(probs, 1, generator=generator).")


def _sampler(multiply=False, after_softmax=False, top_k_offset=0, use_top_k=True, smallest=False, dim=-1,
             greedy=False):
    """A wrong sampler: the temperature multiplied or applied after the softmax, top-k keeping
    ``top_k + top_k_offset`` tokens, the smallest ones or ignored, the softmax over ``dim``,
    or always greedy."""

    def sample(logits, temperature=1.0, top_k=None, generator=None):
        if temperature == 0 or greedy:
            return logits.argmax(-1)
        s = logits if after_softmax else (logits * temperature if multiply else logits / temperature)
        if top_k is not None and use_top_k:
            k = min(max(top_k + top_k_offset, 1), s.size(-1)) if top_k_offset else top_k
            kth = s.topk(k, dim=-1, largest=not smallest).values[:, -1:]
            s = s.masked_fill(s > kth if smallest else s < kth, float("-inf"))
        p = torch.softmax(s, dim=dim) / temperature if after_softmax else torch.softmax(s, dim=dim)
        return torch.multinomial(p, 1, generator=generator).squeeze(-1)

    return sample


SAMPLE_MISTAKES = (
    Mistake("temperature after the softmax", _sampler(after_softmax=True),
            "The temperature is applied after the softmax, where dividing the probabilities by T changes nothing "
            "once they are renormalised: divide the logits by the temperature, then take the softmax."),
    Mistake("logits multiplied by the temperature", _sampler(multiply=True),
            "The logits are multiplied by the temperature: divide them (logits / temperature), so that a high "
            "temperature flattens the distribution."),
    Mistake("top-k keeps k-1 tokens", _sampler(top_k_offset=-1),
            "Your top-k keeps k-1 tokens: keep every logit ≥ the k-th largest (torch.topk(logits, k).values[:, -1:])."),
    Mistake("top-k keeps k+1 tokens", _sampler(top_k_offset=+1),
            "Your top-k keeps k+1 tokens: the threshold is the k-th largest logit, torch.topk(logits, k).values[:, -1:] "
            "(index k-1, not k)."),
    Mistake("top-k ignored", _sampler(use_top_k=False),
            "top_k has no effect: set every logit below the k-th largest to -inf before the softmax."),
    Mistake("top-k keeps the smallest", _sampler(smallest=True),
            "Your top-k keeps the k smallest logits: keep the k largest."),
    Mistake("softmax over the batch", _sampler(dim=0),
            "The softmax runs over the batch axis: each row is its own distribution, use dim=-1."),
    Mistake("always greedy", _sampler(greedy=True),
            "You always return the argmax: for temperature > 0, draw from softmax(logits / temperature) "
            "with torch.multinomial."),
)


def _mixed_rows_and_greedy_ties(trial) -> None:
    """Draw frequencies for batches of different rows (T = 2, 0.7, 1.5; top_k 2 and 4; float64), then greedy ties."""
    _sample_distribution(_SampleCase([LOGITS_A, LOGITS_B], 2.0, None, 4, f64),
                         _SampleCase([LOGITS_B, LOGITS_A], 0.7, 2, 6),
                         _SampleCase([LOGITS_A, LOGITS_B], 1.5, 4, 7, f64))(trial)
    trial.compare([_greedy_case([LOGITS_B, LOGITS_A], f64)])


def _large_top_k_and_generator(trial) -> None:
    """top_k = V and V + 3 keep every token; a seeded generator makes the draws reproducible."""
    _sample_distribution(_SampleCase([LOGITS_B], 1.0, 6, 8), _SampleCase([LOGITS_A], 1.0, 9, 9))(trial)
    _sample_generator(trial)


def _sample_spec() -> ItemSpec:
    return ItemSpec(
        name="sample_next_token", reference=ref_sampling.sample_next_token, mistakes=SAMPLE_MISTAKES,
        subchecks=(
            SubCheck("temperature 0 is greedy (argmax of each row), also on fresh random logits", 1,
                     compare_cases(_greedy_case([LOGITS_A, LOGITS_B, [0.0, 1.0, -1.0, 5.0, 4.0, 0.0]]),
                                   _random_greedy_case(370))),
            SubCheck(f"frequencies over {N_DRAWS} draws match softmax(logits / T) at T = 1 and T = 0.5", 1,
                     _sample_distribution(_SampleCase([LOGITS_A], 1.0, None, 1), _SampleCase([LOGITS_A], 0.5, None, 2))),
            SubCheck("top_k = 3 draws only the 3 most likely tokens, in the right proportions", 1,
                     _sample_distribution(_SampleCase([LOGITS_A], 1.0, 3, 3))),
            SubCheck("several different rows in one batch, T = 2, top_k = 2 and 4, float64, greedy ties", 1,
                     _mixed_rows_and_greedy_ties, hidden=True),
            SubCheck("top_k ≥ V (V and V + 3) keeps every token; the generator makes draws reproducible", 1,
                     _large_top_k_and_generator, hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# generate
# ---------------------------------------------------------------------------


def _gen_case(kind: str, B: int, T: int, new: int, block: int, seed: int, **extra) -> Case:
    def make(device):
        g = generator(seed)
        if kind == "sum":
            model = Build(f"{_HERE}:ContextSumModel", (11, block), device=str(device), train=False)
            idx = torch.randint(0, 11, (B, T), generator=g)
        else:
            args = (13, block)
            model = Build(f"{_HERE}:TinyLM", args, state=reference_state(TinyLM, args, seed), device=str(device),
                          train=False)
            idx = torch.randint(0, 13, (B, T), generator=g)
        return {"model": model, "idx": idx.to(device), "max_new_tokens": new, "temperature": 0.0, **extra}

    what = "a model that predicts the sum of its context mod 11" if kind == "sum" else "a small GPT (13 tokens)"
    more = "".join(f", {k}={v}" for k, v in extra.items())
    return Case(f"{what} with block_size={block}, idx ({B}, {T}), max_new_tokens={new}, temperature=0{more}", make)


def _gen_loop(crop, position=-1, new_only=False):
    """A wrong greedy generation: the context cropped by ``crop(idx, block_size)``, the next
    token read at ``position``, only the new tokens returned (``new_only``)."""

    def generate(model, idx, max_new_tokens, temperature=1.0, top_k=None, generator=None):
        prompt = idx.size(1)
        with torch.no_grad():
            for _ in range(max_new_tokens):
                nxt = model(crop(idx, model.block_size))[:, position, :].argmax(-1)
                idx = torch.cat([idx, nxt[:, None]], dim=1)
        return idx[:, prompt:] if new_only else idx

    return generate


def _latest(idx, n):
    return idx[:, -n:]


GENERATE_MISTAKES = (
    Mistake("context not cropped", _gen_loop(lambda idx, n: idx),
            "The context is not cropped: the model only knows block_size positions, so feed it "
            "idx[:, -model.block_size:], the most recent block_size tokens."),
    Mistake("keeps the first tokens", _gen_loop(lambda idx, n: idx[:, :n]),
            "You crop to the first block_size tokens: keep the most recent ones, idx[:, -model.block_size:]."),
    Mistake("crops one token too many", _gen_loop(lambda idx, n: idx[:, -(n - 1):]),
            "You crop to block_size - 1 tokens: the model can take block_size, idx[:, -model.block_size:]."),
    Mistake("first position's logits", _gen_loop(_latest, position=0),
            "The next token comes from the logits of the first position: use the last one, logits[:, -1, :]."),
    Mistake("returns only the new tokens", _gen_loop(_latest, new_only=True),
            "Return the whole sequence, the prompt followed by the new tokens: shape (B, T + max_new_tokens)."),
)


def _generate_spec() -> ItemSpec:
    return ItemSpec(
        name="generate", reference=ref_sampling.generate, mistakes=GENERATE_MISTAKES,
        invoke=Invoke(names=earlier(ref_sampling.sample_next_token)),
        subchecks=(
            SubCheck("greedy generation while the sequence fits in the block", 1,
                     compare_cases(_gen_case("sum", 2, 3, 4, 8, 900))),
            SubCheck("greedy generation past the block size (the context is cropped)", 1,
                     compare_cases(_gen_case("sum", 2, 5, 7, 6, 901))),
            SubCheck("a small GPT past its block size; a batch of 3; max_new_tokens = 0; top_k passed on", 1,
                     compare_cases(_gen_case("gpt", 3, 4, 6, 6, 902), _gen_case("sum", 1, 9, 3, 4, 903),
                                   _gen_case("sum", 2, 3, 0, 4, 904), _gen_case("gpt", 2, 2, 4, 4, 905, top_k=1)),
                     hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# gpt_parameter_count
# ---------------------------------------------------------------------------


def _count_case(n_layer, d_model, vocab_size, n_ctx, tied=None) -> Case:
    kw = {"n_layer": n_layer, "d_model": d_model, "vocab_size": vocab_size, "n_ctx": n_ctx}
    if tied is not None:
        kw["tied"] = tied
    label = ", ".join(f"{k}={v}" for k, v in kw.items())
    return Case(label, lambda device: dict(kw))


def _count(n_layer, d_model, vocab_size, n_ctx, tied=True, *, bias=True, ln=True, pos=True, ff=4, final_ln=True,
           tied_as=None, ln_bias=True):
    """A GPT's parameters counted without biases (``ln_bias=False``: in the LayerNorms too, nanoGPT's
    bias=False), LayerNorms, positions or the final LayerNorm, with an MLP of width ``ff``·d, or with
    ``tied`` read as ``tied_as``."""
    d, V = d_model, vocab_size
    norm = (2 if ln_bias else 1) * d if ln else 0  # one LayerNorm
    per = 2 * norm + 4 * d * d + ff * 2 * d * d + ((4 * d + ff * d + d) if bias else 0)
    total = V * d + (n_ctx * d if pos else 0) + n_layer * per + (norm if final_ln else 0)
    return total + (0 if (tied if tied_as is None else tied_as) else V * d)


def _twelve_d_squared(n_layer, d_model, vocab_size, n_ctx, tied=True):
    return 12 * n_layer * d_model * d_model


COUNT_MISTAKES = (
    Mistake("no biases", partial(_count, bias=False),
            "The biases are missing: every nn.Linear has one (attention: 4·d, MLP: 4·d + d per block)."),
    Mistake("no biases, in the LayerNorms either", partial(_count, bias=False, ln_bias=False),
            "This counts a model without any bias (nanoGPT's bias=False: no bias in the Linears, none in the "
            "LayerNorms). GPT-2 has biases everywhere: every nn.Linear (attention 4·d, MLP 4·d + d per block) and "
            "every LayerNorm (a weight and a bias of size d)."),
    Mistake("no LayerNorms", partial(_count, ln=False),
            "The LayerNorms are missing: each has a weight and a bias of size d (two per block, 4·d, plus "
            "2·d for the final ln_f)."),
    Mistake("no position embeddings", partial(_count, pos=False),
            "The position embeddings are missing: GPT learns one vector per position, n_ctx · d parameters."),
    Mistake("no final LayerNorm", partial(_count, final_ln=False),
            "The final LayerNorm (ln_f, 2·d parameters) after the last block is missing."),
    Mistake("tied ignored", partial(_count, tied_as=False),
            "With tied=True the output layer reuses the token embedding's matrix, so it adds no parameters."),
    Mistake("untied output layer missing", partial(_count, tied_as=True),
            "With tied=False the output layer is a separate vocab_size × d matrix (nn.Linear without bias): add it."),
    Mistake("MLP of width d", partial(_count, ff=1),
            "The MLP's hidden layer has d_ff = 4·d units: its two matrices hold 8·d² parameters."),
    Mistake("only 12·n_layer·d²", _twelve_d_squared,
            "12 · n_layer · d² is the usual approximation of the blocks' matrices only; the function should count "
            "everything exactly: embeddings, biases and LayerNorms too."),
)


def _count_spec() -> ItemSpec:
    return ItemSpec(
        name="gpt_parameter_count", reference=ref_gpt.gpt_parameter_count, mistakes=COUNT_MISTAKES,
        subchecks=(
            # (the notebook's sizes are public: with each, one the student has not seen)
            SubCheck("a small model (n_layer=2, d_model=8, vocab_size=11, n_ctx=5), and a fresh one", 1,
                     lambda t: t.compare([_count_case(2, 8, 11, 5),
                                          _count_case(fresh(94, 3, 8), 4 * fresh(95, 1, 8), fresh(96, 5, 60),
                                                      fresh(97, 3, 40))])),
            SubCheck("GPT-2 XL's hyper-parameters, and a fresh large model", 1,
                     lambda t: t.compare([_count_case(48, 1600, 50257, 1024),
                                          _count_case(fresh(98, 12, 47), 64 * fresh(99, 8, 30),
                                                      fresh(100, 30000, 60000), 256 * fresh(101, 2, 8))])),
            SubCheck("untied output layer, GPT-3, and a model with no blocks", 1,
                     compare_cases(_count_case(3, 6, 7, 10, tied=False), _count_case(96, 12288, 50257, 2048),
                                   _count_case(0, 4, 9, 3, tied=True)), hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# few_shot_accuracy
# ---------------------------------------------------------------------------


def _few_shot_case(seed: int, shots: tuple, n_eval: int, dropout: float, training: bool) -> Case:
    def make(device):
        model = Build(f"{_HERE}:CentroidModel", (6, 4, dropout, salted_seed(seed)), train=training)
        return {"model": model, "task_sampler": Build(f"{_HERE}:GaussianSampler"), "shots": list(shots),
                "n_eval": n_eval, "generator": generator(seed)}

    mode = "in train mode with dropout 0.5" if training else "in eval mode"
    return Case(f"a nearest-centroid model {mode}, shots={list(shots)}, n_eval={n_eval}", make)


def _accuracy_differ(expected, got) -> str | None:
    """How ``got`` differs from the accuracies ``expected`` (a dict {shots: accuracy}); None if it does not."""
    if not isinstance(expected, dict):
        return None if expected == got else "different"
    if not isinstance(got, dict):
        return f"the result should be a dict {{shots: accuracy}}, got a {type_name(got)}."
    if list(got.keys()) != list(expected.keys()):
        return f"the keys should be the numbers of shots {list(expected)} (in order), got {list(got)}."
    for k, e in expected.items():
        g = got[k]
        if isinstance(g, Tensor):
            return f"the accuracy for {k} shots is a tensor: return a Python float (.item())."
        if not isinstance(g, float):
            return f"the accuracy for {k} shots should be a float, got {type_name(g)}."
        if not abs(g - e) <= 1e-6:  # also catches NaN
            return f"the accuracy for {k} shots should be {e:.4f}, got {fmt_num(g)}."
    return None


def _no_parameter_changes(trial) -> None:
    case = _few_shot_case(950, (0, 2, 8), 64, 0.5, True)
    inputs = case.make(trial.device)
    model = realise(inputs["model"])  # the model as shipped, built here
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    flags = {name: p.requires_grad for name, p in model.named_parameters()}
    _, after = call_and_inspect(trial, inputs, ["model"], case.label)
    after = after.get("model")
    if not isinstance(after, dict):
        raise CheckFailed(f"On {case.label}: the model could not be inspected after your call.")
    state = after["state"]
    changed = [k for k, v in state.items()
               if not (k in before and isinstance(v, Tensor) and v.shape == before[k].shape
                       and v.dtype == before[k].dtype and torch.equal(v.cpu(), before[k]))]
    changed += [k for k in before if k not in state]
    if changed:
        raise CheckFailed(
            f"On {case.label}: the model's parameters changed ({', '.join(changed)}). {FINE_TUNES}"
        )
    if after["with_grad"]:
        raise CheckFailed(f"On {case.label}: gradients were computed on the model's parameters: evaluate under torch.no_grad().")
    if after["requires_grad"] != flags:
        raise CheckFailed(f"On {case.label}: requires_grad of the parameters was changed; leave the model as it was.")
    if not after["training"]:
        raise CheckFailed(f"On {case.label}: the model was left in eval mode; restore its train mode afterwards "
                          "(model.train(was_training)).")


def _accuracy_loop(model, task_sampler, shots, n_eval, generator=None, *, last=True, percent=False,
                   eval_mode=True, train_step=False, leave_eval=False):
    was = model.training
    if eval_mode:
        model.eval()
    out = {}
    for k in shots:
        prompts, targets = task_sampler(n_eval, k, generator)
        if train_step:
            logits = model(prompts)[:, -1, :]
            loss = F.cross_entropy(logits, targets)
            model.zero_grad()
            loss.backward()
            with torch.no_grad():
                for p in model.parameters():
                    if p.grad is not None:
                        p -= 0.5 * p.grad
                        p.grad = None
        with torch.no_grad():
            logits = model(prompts)
        pred = logits[:, -1 if last else 0, :].argmax(-1)
        acc = (pred == targets).float().mean().item()
        out[k] = 100.0 * acc if percent else acc
    model.train(was)
    if leave_eval:
        model.eval()
    return out


FINE_TUNES = ("Your function updates the model's parameters: in-context learning uses no gradient updates; "
              "evaluate under torch.no_grad() and never call an optimizer.")

FEW_SHOT_MISTAKES = (
    Mistake("first position", partial(_accuracy_loop, last=False),
            "The prediction is read at the first position: the query is the last token, use model(prompts)[:, -1]."),
    Mistake("percentages", partial(_accuracy_loop, percent=True),
            "Return accuracies as fractions in [0, 1], not percentages."),
    Mistake("train mode", partial(_accuracy_loop, eval_mode=False),
            "The model is evaluated in train mode, so dropout is still active: call model.eval() first "
            "(and restore the previous mode afterwards)."),
    Mistake("fine-tunes on the prompts", partial(_accuracy_loop, train_step=True), FINE_TUNES),
    Mistake("leaves the model in eval mode", partial(_accuracy_loop, leave_eval=True),
            "the model was left in eval mode; restore its train mode afterwards"),
)


def _few_shot_spec() -> ItemSpec:
    visible = _few_shot_case(940, (0, 1, 4), 200, 0.0, False)
    hidden = (_few_shot_case(941, (8, 0, 2), 300, 0.0, False), _few_shot_case(942, (1, 4), 300, 0.5, True))
    return ItemSpec(
        name="few_shot_accuracy", reference=ref_icl.few_shot_accuracy, mistakes=FEW_SHOT_MISTAKES,
        subchecks=(
            SubCheck("matches the reference on a nearest-centroid model, shots 0, 1, 4", 1,
                     compare_cases(visible, differ=_accuracy_differ)),
            SubCheck("shots in any order; a model with dropout in train mode is evaluated in eval mode", 1,
                     compare_cases(*hidden, differ=_accuracy_differ), hidden=True),
            SubCheck("no parameter changes, no gradients, train mode restored", 1, _no_parameter_changes, hidden=True),
        ),
    )


SPECS = {
    spec.name: spec
    for spec in (_block_spec(), _sample_spec(), _generate_spec(), _count_spec(), _few_shot_spec())
}
