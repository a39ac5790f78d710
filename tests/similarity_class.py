"""A generated class of notebook 03 for ``workbook similarity``: honest students with
implementations of their own (six of them the canonical five lines, each in their own
words), and planted copies made the way students make them: names changed, comments
rewritten, independent statements reordered, a debugging print left in, course_lib's
reference pasted, written answers reworded and reordered, and three students sharing one
answer. :data:`PLANTED` says which pairs of which items are copies; nothing else is.
Used by tests/grading/test_similarity.py.
"""

from __future__ import annotations

import inspect
import shutil
import textwrap
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
ASSIGNMENT = "03_self_attention"
SDPA, SELF, PAD, CAUSAL = "scaled_dot_product_attention", "SelfAttention", "padding_mask", "causal_mask"
Q_SQRT, Q_PERM, Q_COST = "q_sqrt_dk", "q_permutation", "q_cost"

_SIG = {
    SDPA: 'def scaled_dot_product_attention(q, k, v, mask=None):\n'
          '    """Scaled dot-product attention.\n\n    q: (..., T_q, d_k), k: (..., T_k, d_k), v: (..., T_k, d_v)\n'
          '    mask: optional bool tensor broadcastable to (..., T_q, T_k); True = may attend.\n'
          '    Returns (out, weights): out (..., T_q, d_v), weights (..., T_q, T_k).\n    """\n',
    PAD: 'def padding_mask(lengths, T):\n    """(B, 1, T) bool mask, True where the key position is < lengths[b].\n\n'
         '    lengths: (B,) integer tensor of true sequence lengths; T: padded length.\n    """\n',
    CAUSAL: 'def causal_mask(T, device=None):\n'
            '    """(T, T) bool mask, True on and below the diagonal (query i may see keys 0..i)."""\n',
}


def _fn(item: str, body: str) -> str:
    return _SIG[item] + textwrap.indent(textwrap.dedent(body).strip("\n"), "    ") + "\n"


# --- scaled_dot_product_attention: the canonical five lines, in six students' own words ---
CANONICAL = [
    """
    d_k = q.size(-1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights
    """,
    """
    # scale by sqrt of the key size
    dk = q.size(-1)
    s = q @ k.transpose(-2, -1) / math.sqrt(dk)
    if mask is not None:
        s = s.masked_fill(~mask, float('-inf'))  # blocked positions
    a = torch.softmax(s, dim=-1)
    return a @ v, a
    """,
    """
    dim = q.size(-1)
    logits = q @ k.transpose(-2, -1) / math.sqrt(dim)
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf"))
    attn = F.softmax(logits, dim=-1)
    return attn @ v, attn
    """,
    """
    size = q.size(-1)
    sc = q @ k.transpose(-2, -1) / math.sqrt(size)

    if mask is not None:
        sc = sc.masked_fill(~mask, float("-inf"))

    probs = torch.softmax(sc, dim=-1)
    return probs @ v, probs
    """,
    """
    n = q.size(-1)
    score = q @ k.transpose(-2, -1) / math.sqrt(n)  # (..., T_q, T_k)
    if mask is not None:
        score = score.masked_fill(~mask, float("-inf"))
    w = torch.softmax(score, dim=-1)  # rows sum to one
    return w @ v, w
    """,
    """
    depth = q.size(-1)
    raw = q @ k.transpose(-2, -1) / math.sqrt(depth)
    if mask is not None:
        raw = raw.masked_fill(~mask, float("-inf"))
    p = torch.softmax(raw, dim=-1)
    return p @ v, p
    """,
]

SDPA_OWN = {
    "einsum": """
    scale = 1.0 / math.sqrt(q.shape[-1])
    logits = torch.einsum("...qd,...kd->...qk", q, k) * scale
    if mask is not None:
        logits = torch.where(mask, logits, torch.full_like(logits, float("-inf")))
    attn = F.softmax(logits, dim=-1)
    out = torch.einsum("...qk,...kd->...qd", attn, v)
    return out, attn
    """,
    "manual_softmax": """
    dk = k.shape[-1]
    s = torch.matmul(q, k.transpose(-1, -2))
    s = s / dk ** 0.5
    if mask is not None:
        s = s.masked_fill(mask == 0, -1e9)
    s = s - s.max(dim=-1, keepdim=True).values
    e = torch.exp(s)
    w = e / e.sum(dim=-1, keepdim=True)
    return torch.matmul(w, v), w
    """,
    "bmm": """
    *batch, tq, d = q.shape
    tk = k.shape[-2]
    qf = q.reshape(-1, tq, d)
    kf = k.reshape(-1, tk, d)
    scores = torch.bmm(qf, kf.transpose(1, 2)) / math.sqrt(d)
    scores = scores.reshape(*batch, tq, tk)
    if mask is not None:
        scores = scores.masked_fill(torch.logical_not(mask), float("-inf"))
    probs = scores.softmax(-1)
    return probs @ v, probs
    """,
    "mT": """
    scores = q.matmul(k.mT) * q.size(-1) ** -0.5
    if mask is not None:
        scores = scores.masked_fill(mask.logical_not(), -torch.inf)
    attention = nn.functional.softmax(scores, dim=-1)
    result = attention.matmul(v)
    return result, attention
    """,
    "swapaxes": """
    d = q.shape[-1]
    kt = torch.swapaxes(k, -1, -2)
    raw = torch.matmul(q, kt)
    scaled = raw / torch.sqrt(torch.tensor(d, dtype=q.dtype))
    if mask is None:
        masked = scaled
    else:
        neg = torch.finfo(scaled.dtype).min
        masked = torch.where(mask, scaled, neg)
    weights = torch.softmax(masked, -1)
    if mask is not None:
        weights = weights * mask
    return weights @ v, weights
    """,
    "exp_mask": """
    temperature = math.sqrt(q.size(-1))
    energies = (q / temperature) @ k.transpose(-2, -1)
    energies = energies - energies.amax(-1, keepdim=True).detach()
    numer = energies.exp()
    if mask is not None:
        numer = numer * mask.to(numer.dtype)
    weights = numer / numer.sum(-1, keepdim=True).clamp_min(1e-30)
    context = weights @ v
    return context, weights
    """,
    "loop_free_where": """
    scores = torch.matmul(q, torch.transpose(k, -2, -1))
    scores = torch.div(scores, math.sqrt(k.size(-1)))
    filled = scores if mask is None else torch.where(mask.bool(), scores, torch.tensor(float("-inf")))
    alpha = torch.nn.functional.softmax(filled, dim=-1)
    output = torch.matmul(alpha, v)
    return output, alpha
    """,
    "log_softmax": """
    d_head = q.size(-1)
    qk = torch.einsum("...id,...jd->...ij", q, k) / d_head ** 0.5
    if mask is not None:
        qk = qk.masked_fill(~mask, float("-inf"))
    log_w = torch.log_softmax(qk, dim=-1)
    wts = log_w.exp()
    return torch.einsum("...ij,...jd->...id", wts, v), wts
    """,
    # k1 wrote this; k2 and k3 copied it (a cluster of three)
    "cluster": """
    head_dim = q.shape[-1]
    similarity = torch.matmul(q, k.transpose(-2, -1))
    similarity = similarity * (1.0 / head_dim ** 0.5)
    if mask is not None:
        blocked = mask.logical_not()
        similarity = similarity.masked_fill(blocked, torch.finfo(similarity.dtype).min)
    similarity = similarity - similarity.logsumexp(dim=-1, keepdim=True)
    attention = similarity.exp()
    if mask is not None:
        attention = attention.masked_fill(blocked, 0.0)
    return attention @ v, attention
    """,
}

# --- SelfAttention: the constructor is given by the contract; the forward is the student's ---
_INIT = """class SelfAttention(nn.Module):
    \"\"\"Single-head self-attention.

    Parameters: w_q, w_k = nn.Linear(d_model, d_k, bias=False); w_v = nn.Linear(d_model, d_v, bias=False).
    forward(x (B, T, d_model), mask=None) -> (out (B, T, d_v), weights (B, T, T)).
    \"\"\"

    def __init__(self, d_model, d_k, d_v):
        super().__init__()
        self.w_q = nn.Linear(d_model, d_k, bias=False)
        self.w_k = nn.Linear(d_model, d_k, bias=False)
        self.w_v = nn.Linear(d_model, d_v, bias=False)

    def forward(self, x, mask=None):
"""


def _module(forward: str) -> str:
    return _INIT + textwrap.indent(textwrap.dedent(forward).strip("\n"), "        ") + "\n"


SELF_OWN = {
    "call": "return scaled_dot_product_attention(self.w_q(x), self.w_k(x), self.w_v(x), mask)",
    "named": """
    q, k, v = self.w_q(x), self.w_k(x), self.w_v(x)
    out, weights = scaled_dot_product_attention(q, k, v, mask=mask)
    return out, weights
    """,
    "inline": """
    queries = self.w_q(x)
    keys = self.w_k(x)
    values = self.w_v(x)
    scores = queries @ keys.transpose(1, 2) / math.sqrt(keys.size(-1))
    if mask is not None:
        scores = scores.masked_fill(mask == 0, -1e4)
    attn = scores.softmax(dim=2)
    out = torch.bmm(attn, values)
    return out, attn
    """,
    "list": """
    projected = [layer(x) for layer in (self.w_q, self.w_k, self.w_v)]
    return scaled_dot_product_attention(*projected, mask)
    """,
    "einsum_inline": """
    q = self.w_q(x)
    k = self.w_k(x)
    v = self.w_v(x)
    logits = torch.einsum("btd,bsd->bts", q, k) / q.shape[-1] ** 0.5
    if mask is not None:
        logits = torch.where(mask, logits, torch.full_like(logits, -float("inf")))
    weights = logits.softmax(dim=-1)
    output = torch.einsum("bts,bsd->btd", weights, v)
    return output, weights
    """,
    "bmm_inline": """
    query, key, value = self.w_q(x), self.w_k(x), self.w_v(x)
    energy = torch.bmm(query, key.permute(0, 2, 1))
    energy = energy / (key.shape[2] ** 0.5)
    if mask is not None:
        energy = energy.masked_fill(mask.logical_not(), -1e9)
    energy = energy - energy.max(dim=2, keepdim=True)[0]
    probabilities = torch.exp(energy)
    probabilities = probabilities / probabilities.sum(dim=2, keepdim=True)
    return torch.bmm(probabilities, value), probabilities
    """,
}

PAD_OWN = [
    """
    positions = torch.arange(T, device=lengths.device)
    return (positions[None, :] < lengths[:, None])[:, None, :]
    """,
    """
    idx = torch.arange(T, device=lengths.device).unsqueeze(0)
    return (idx < lengths.unsqueeze(1)).unsqueeze(1)
    """,
    """
    r = torch.arange(T, device=lengths.device).expand(len(lengths), T)
    return (r < lengths.view(-1, 1)).view(len(lengths), 1, T)
    """,
    """
    mask = torch.zeros(len(lengths), 1, T, dtype=torch.bool, device=lengths.device)
    for b, n in enumerate(lengths.tolist()):
        mask[b, 0, :n] = True
    return mask
    """,
]

CAUSAL_OWN = [
    "return torch.ones(T, T, dtype=torch.bool, device=device).tril()",
    "return torch.tril(torch.ones(T, T, dtype=torch.bool, device=device))",
    "i = torch.arange(T, device=device)\nreturn i[:, None] >= i[None, :]",
]

# --- written answers, each in its author's own words ---
SQRT_OWN = [
    "Each score is a sum of d_k products, so its variance grows like d_k. Large scores push the softmax "
    "towards a one-hot vector, where its gradient is almost zero, and the queries and keys stop learning. "
    "Dividing by the square root brings the variance back to one.",
    "Without the scaling, the logits get bigger as the dimension grows. Softmax of big numbers picks one key "
    "and ignores the rest. Then training is slow because the derivative through a saturated softmax vanishes.",
    "The dot product of random vectors with unit variance has variance equal to d_k. Scaling keeps the "
    "entropy of the attention distribution reasonable for any width; a saturated softmax would give "
    "vanishing gradients for q and k.",
    "For big d_k the scores spread out a lot. The largest one dominates after exponentiation so every row of "
    "weights becomes nearly a one hot selection. The gradient then almost disappears, learning stalls.",
    "Scores have standard deviation of about sqrt(d_k), so we divide by it to normalise them. If the softmax "
    "saturates, small changes in the scores do not change the output and the model cannot learn where to look.",
    "Think of q.k as a sum of many independent terms: the sum gets a variance proportional to the number of "
    "terms. The square root undoes exactly that growth. Saturation kills gradients, which hurts optimisation.",
    "With more dimensions the dot products have larger magnitude, so exp() blows the differences up and the "
    "distribution collapses onto a single position. Gradients of the collapsed softmax are tiny.",
    "Dividing makes the typical score independent of the head size. Otherwise attention would become hard "
    "argmax-like selection early on, and backpropagation through it would carry almost no signal.",
]
PERM_OWN = [
    "If you shuffle the input tokens the outputs get shuffled the same way, so the layer has no idea of order. "
    "In language the order carries meaning. We need positional encodings added to the embeddings.",
    "Permuting the sequence just permutes the result: dog bites man and man bites dog look the same to the "
    "layer. Adding position information, for example sinusoidal encodings, solves it.",
    "Self attention treats its input as a set. Word order matters in sentences, so we must inject positions, "
    "e.g. learned position embeddings or relative position biases in the scores.",
    "The layer is equivariant: reorder the words and you get the same vectors reordered. Nothing tells it which "
    "word came first, so a positional signal must be added to each token.",
    "Because every query sees every key with the same weights regardless of where they are, the model is blind "
    "to order. Grammar depends on order; position vectors have to be added to the inputs.",
    "Order information is lost: a bag of words. To fix this one adds a position dependent vector to the input "
    "or makes attention scores depend on the distance between tokens.",
    "Swapping two tokens swaps their outputs and changes nothing else, so the meaning carried by order is "
    "invisible. Positional encodings break the symmetry.",
    "Attention is a weighted sum over all positions with weights from content only, so it cannot know where a "
    "token sits. We add positional embeddings so that position becomes part of the content.",
]
COST_OWN = [
    "Memory grows like T squared because the weight matrix is T by T. Time also approaches T squared for long "
    "inputs. A window of width w makes both linear in T.",
    "The plot shows quadratic growth: every query is compared with every key. With a sliding window each query "
    "only looks at w keys, so the cost becomes T times w.",
    "Both curves bend upwards quadratically for large T since the score matrix has T^2 entries. Restricting "
    "attention to a local window of w neighbours reduces this to O(Tw) at the cost of long range paths.",
    "Quadratic, because all pairs of positions get a score. Short sequences are dominated by overhead. A window "
    "cuts the pairs to about T*w, linear for fixed w, but distant tokens need several layers to interact.",
    "The weights take T*T numbers, so memory is quadratic; time too once T is large. Windowed attention keeps "
    "only a band of the matrix, linear cost.",
    "Time and memory go like the square of the length because of the full score matrix. Sliding windows give "
    "linear scaling but lose direct long distance interactions.",
    "We measured roughly 4x more time when doubling T, the signature of T^2 cost from scoring all query key "
    "pairs. A width w window only scores w keys per query.",
    "The attention matrix is the bottleneck: T^2 memory and compute. Limiting each token to w neighbours makes "
    "the cost proportional to T w.",
]


STUB = "YOUR ANSWER HERE"  # a written answer left as released


def honest_students() -> dict[str, dict[str, str]]:
    """Fourteen students who did their own work: six wrote the canonical five lines of
    scaled_dot_product_attention in their own words, eight something of their own; most
    wrote the SelfAttention forward and the masks the way most people do; h09-h14 left the
    written answers unanswered."""
    own = [v for name, v in SDPA_OWN.items() if name != "cluster"]
    forward = {7: "inline", 8: "einsum_inline", 9: "bmm_inline", 10: "named", 11: "list"}
    pad = {10: 1, 11: 1, 12: 1, 13: 2, 14: 3}
    students = {}
    for n in range(1, 15):
        students[f"h{n:02d}"] = {
            SDPA: _fn(SDPA, CANONICAL[n - 1] if n <= 6 else own[n - 7]),
            SELF: _module(SELF_OWN[forward.get(n, "call")]),
            PAD: _fn(PAD, PAD_OWN[pad.get(n, 0)]),
            CAUSAL: _fn(CAUSAL, CAUSAL_OWN[n % 3]),
            Q_SQRT: SQRT_OWN[n - 1] if n <= 8 else STUB,
            Q_PERM: PERM_OWN[(n + 2) % 8] if n <= 8 else STUB,
            Q_COST: COST_OWN[(n + 4) % 8] if n <= 8 else STUB,
        }
    return students


def reference_source(item: str) -> str:
    from course_lib.grading import get_spec
    return textwrap.dedent(inspect.getsource(get_spec(item).reference))


def copied_students(honest: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """The students who copied, each answer changed the way students change what they copy."""
    plain = {SELF: _module(SELF_OWN["call"]), PAD: _fn(PAD, PAD_OWN[0]), CAUSAL: _fn(CAUSAL, CAUSAL_OWN[0]),
             Q_SQRT: STUB, Q_PERM: STUB, Q_COST: STUB}
    h07, h08, h09 = honest["h07"], honest["h08"], honest["h09"]
    assert h07[SDPA] == _fn(SDPA, SDPA_OWN["einsum"]) and h08[SDPA] == _fn(SDPA, SDPA_OWN["manual_softmax"])
    assert h09[SDPA] == _fn(SDPA, SDPA_OWN["bmm"])
    students = {}
    # h07's work with every name changed and comments of its own
    students["c_rename"] = {**plain, SDPA: _fn(SDPA, """
        # temperature so the softmax does not saturate
        factor = 1.0 / math.sqrt(q.shape[-1])
        sim = torch.einsum("...qd,...kd->...qk", q, k) * factor  # all pairs of query and key
        if mask is not None:
            # forbidden positions get -inf
            sim = torch.where(mask, sim, torch.full_like(sim, float("-inf")))
        probs = F.softmax(sim, dim=-1)
        res = torch.einsum("...qk,...kd->...qd", probs, v)
        return res, probs
        """), SELF: _module("""
        qq = self.w_q(x)   # queries
        kk = self.w_k(x)   # keys
        vv = self.w_v(x)   # values
        sc = qq @ kk.transpose(1, 2) / math.sqrt(kk.size(-1))
        if mask is not None:
            sc = sc.masked_fill(mask == 0, -1e4)  # not -inf: no NaN
        a = sc.softmax(dim=2)
        result = torch.bmm(a, vv)
        return result, a
        """),
        # h02's answer, a few words changed
        Q_SQRT: "Without the scaling, the scores get bigger as the dimension grows. Softmax of big numbers selects one "
                "key and ignores the others. Then training is slow because the gradient through a saturated softmax "
                "vanishes."}
    # h08's work with independent statements in another order, other quotes, blank lines
    students["c_reorder"] = {**plain, SDPA: _fn(SDPA, """
        s = torch.matmul(q, k.transpose(-1, -2))
        dk = k.shape[-1]

        s = s / dk ** 0.5
        if mask is not None:
            s = s.masked_fill(mask == 0, -1e9)
        s = s - s.max(dim=-1, keepdim=True).values

        e = torch.exp(s)
        w = e / e.sum(dim=-1, keepdim=True)
        return torch.matmul(w, v), w
        """), SELF: _module("""
        v = self.w_v(x)
        q = self.w_q(x)
        k = self.w_k(x)
        logits = torch.einsum('btd,bsd->bts', q, k) / q.shape[-1] ** 0.5
        if mask is not None:
            logits = torch.where(mask, logits, torch.full_like(logits, -float('inf')))
        weights = logits.softmax(dim=-1)
        output = torch.einsum('bts,bsd->btd', weights, v)
        return output, weights
        """),
        # h03's answer, its sentences in another order
        Q_PERM: " ".join(reversed(PERM_OWN[5].split(". "))).replace("..", ".")}
    # h09's work, with the debugging left in
    students["c_debug"] = {**plain, SDPA: _fn(SDPA, """
        *batch, tq, d = q.shape
        tk = k.shape[-2]
        print("shapes", q.shape, k.shape, v.shape)
        qf = q.reshape(-1, tq, d)
        kf = k.reshape(-1, tk, d)
        scores = torch.bmm(qf, kf.transpose(1, 2)) / math.sqrt(d)
        # print(scores)
        scores = scores.reshape(*batch, tq, tk)
        if mask is not None:
            print("mask", mask.shape)
            scores = scores.masked_fill(torch.logical_not(mask), float("-inf"))
        probs = scores.softmax(-1)
        assert torch.allclose(probs.sum(-1), torch.ones_like(probs.sum(-1)))
        return probs @ v, probs
        """), SELF: _module("""
        query, key, value = self.w_q(x), self.w_k(x), self.w_v(x)
        energy = torch.bmm(query, key.permute(0, 2, 1))
        energy = energy / (key.shape[2] ** 0.5)
        print(energy.shape, energy.mean().item())
        if mask is not None:
            energy = energy.masked_fill(mask.logical_not(), -1e9)
        energy = energy - energy.max(dim=2, keepdim=True)[0]
        probabilities = torch.exp(energy)
        probabilities = probabilities / probabilities.sum(dim=2, keepdim=True)
        return torch.bmm(probabilities, value), probabilities
        """)}
    # course_lib's reference pasted, its helper call left out (the notebook has no check_mask)
    reference = reference_source(SDPA).replace("    check_mask(mask, scores.shape)\n", "")
    assert reference != reference_source(SDPA)
    students["c_ref"] = {**plain, SDPA: _SIG[SDPA] + reference.split('"""', 2)[2].lstrip("\n")}
    # k1 wrote it; k2 copied k1 with new names; k3 copied k2, comments added, two lines swapped
    students["k1"] = {**plain, SDPA: _fn(SDPA, SDPA_OWN["cluster"])}
    students["k2"] = {**plain, SDPA: _fn(SDPA, """
        hd = q.shape[-1]
        sims = torch.matmul(q, k.transpose(-2, -1))
        sims = sims * (1.0 / hd ** 0.5)
        if mask is not None:
            off = mask.logical_not()
            sims = sims.masked_fill(off, torch.finfo(sims.dtype).min)
        sims = sims - sims.logsumexp(dim=-1, keepdim=True)
        att = sims.exp()
        if mask is not None:
            att = att.masked_fill(off, 0.0)
        return att @ v, att
        """)}
    students["k3"] = {**plain, SDPA: _fn(SDPA, """
        sims = torch.matmul(q, k.transpose(-2, -1))  # raw scores
        hd = q.shape[-1]
        sims = sims * (1.0 / hd ** 0.5)  # scale
        if mask is not None:
            off = mask.logical_not()
            sims = sims.masked_fill(off, torch.finfo(sims.dtype).min)
        # stable log-softmax by hand
        sims = sims - sims.logsumexp(dim=-1, keepdim=True)
        att = sims.exp()
        if mask is not None:
            att = att.masked_fill(off, 0.0)  # exactly zero where masked
        return att @ v, att
        """)}
    return students


# item -> the pairs that are copies (each pair sorted; "course_lib" for the reference)
PLANTED = {
    SDPA: {("c_rename", "h07"), ("c_reorder", "h08"), ("c_debug", "h09"), ("c_ref", "course_lib"),
           ("k1", "k2"), ("k1", "k3"), ("k2", "k3")},
    SELF: {("c_rename", "h07"), ("c_reorder", "h08"), ("c_debug", "h09")},
    Q_SQRT: {("c_rename", "h02")},
    Q_PERM: {("c_reorder", "h03")},
}
CLUSTERS = {SDPA: [["k1", "k2", "k3"]]}


def the_class() -> dict[str, dict[str, str]]:
    honest = honest_students()
    return {**honest, **copied_students(honest)}


def canonical_class(n: int = 20) -> dict[str, dict[str, str]]:
    """``n`` students who all wrote the canonical five lines (each with their own names and
    comments, from :data:`CANONICAL`), and nothing else."""
    return {f"s{i:02d}": {SDPA: _fn(SDPA, CANONICAL[i % len(CANONICAL)])} for i in range(n)}


def write_course(root: Path, students: dict[str, dict[str, str]], assignment: str = ASSIGNMENT) -> Path:
    """A course folder at ``root`` with the released notebook and each student's submission:
    the released notebook with the given answers in its solution cells."""
    shutil.copy(ROOT / "nbgrader_config.py", root / "nbgrader_config.py")
    release = root / "notebooks" / assignment
    release.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "notebooks" / assignment / f"{assignment}.ipynb", release)
    released = nbformat.read(str(release / f"{assignment}.ipynb"), as_version=4)
    for student, answers in students.items():
        nb = nbformat.reads(nbformat.writes(released), as_version=4)
        for cell in nb.cells:
            gid = cell.metadata.get("nbgrader", {}).get("grade_id")
            if gid in answers:
                cell.source = answers[gid]
        write_submission(root, student, assignment, nb)
    return root


def write_submission(root: Path, student: str, assignment: str, nb, name: str | None = None) -> Path:
    folder = root / "grading" / "submitted" / student / assignment
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name or assignment}.ipynb"
    nbformat.write(nb, str(path))
    return path


def with_dead_branches(body: str) -> str:
    """``body`` with a branch that never runs after every simple line (``if False: print('debug')``,
    and ``if 0:`` / ``while False:`` blocks): lines a copier adds so that no run of tokens is left."""
    dead = ["if False: print('debug')", "if 0:\n    pass", "while False:\n    print('x')"]
    out = []
    for n, line in enumerate(textwrap.dedent(body).strip("\n").split("\n")):
        out.append(line)
        if not line.rstrip().endswith(":"):
            indent = line[:len(line) - len(line.lstrip())]
            out += [indent + part for part in dead[n % len(dead)].split("\n")]
    return "\n".join(out)


# k1's answer ("cluster") split into helper functions defined in the same cell
HELPERS = '''def _scores(q, k):
    head_dim = q.shape[-1]
    similarity = torch.matmul(q, k.transpose(-2, -1))
    return similarity * (1.0 / head_dim ** 0.5)


def _masked(similarity, mask):
    blocked = mask.logical_not()
    return similarity.masked_fill(blocked, torch.finfo(similarity.dtype).min), blocked


def _normalised(similarity):
    similarity = similarity - similarity.logsumexp(dim=-1, keepdim=True)
    return similarity.exp()


''' + _fn(SDPA, """
    similarity = _scores(q, k)
    if mask is not None:
        similarity, blocked = _masked(similarity, mask)
    attention = _normalised(similarity)
    if mask is not None:
        attention = attention.masked_fill(blocked, 0.0)
    return attention @ v, attention
    """)


# --- an honest class of many: each answer a different choice of each step, all correct ---
_STEPS = [
    ['scores = q @ k.transpose(-2, -1)', 'scores = torch.matmul(q, k.transpose(-1, -2))',
     'scores = torch.einsum("...qd,...kd->...qk", q, k)', 'scores = q.matmul(k.mT)',
     'kt = torch.swapaxes(k, -1, -2)\nscores = torch.matmul(q, kt)'],
    ['scores = scores / math.sqrt(q.size(-1))', 'scores = scores * q.shape[-1] ** -0.5',
     'scores = scores / torch.tensor(q.shape[-1], dtype=q.dtype).sqrt()',
     'scores = torch.div(scores, math.sqrt(k.size(-1)))', 'scores = scores / q.shape[-1] ** 0.5'],
    ['if mask is not None:\n    scores = scores.masked_fill(~mask, float("-inf"))',
     'if mask is not None:\n    scores = torch.where(mask, scores, torch.full_like(scores, float("-inf")))',
     'if mask is not None:\n    scores = scores.masked_fill(mask == 0, -1e9)',
     'if mask is not None:\n    scores = scores.masked_fill(mask.logical_not(), torch.finfo(scores.dtype).min)',
     'if mask is not None:\n    scores = scores.masked_fill(torch.logical_not(mask), float("-inf"))'],
    ['weights = torch.softmax(scores, dim=-1)', 'weights = scores.softmax(-1)',
     'weights = torch.exp(scores - scores.amax(-1, keepdim=True))\nweights = weights / weights.sum(-1, keepdim=True)',
     'weights = scores.log_softmax(dim=-1).exp()', 'weights = nn.functional.softmax(scores, -1)'],
    ['return weights @ v, weights', 'return torch.matmul(weights, v), weights',
     'out = torch.einsum("...qk,...kd->...qd", weights, v)\nreturn out, weights'],
]


def honest_class(n: int = 40) -> dict[str, dict[str, str]]:
    """``n`` students who each wrote scaled_dot_product_attention their own way: every step (the
    product, the scale, the mask, the softmax, the output) one of a few correct ways, and every two
    students' choices different in at least three of the five steps (what many wrote alike is
    each step's common line, never the same whole answer)."""
    import itertools
    chosen: list[tuple[int, ...]] = []
    for choice in itertools.product(*[range(len(s)) for s in _STEPS]):
        if all(sum(a != b for a, b in zip(choice, other)) >= 3 for other in chosen):
            chosen.append(choice)
    assert len(chosen) >= n, len(chosen)
    return {f"s{i:02d}": {SDPA: _fn(SDPA, "\n".join(step[c] for step, c in zip(_STEPS, choice)))}
            for i, choice in enumerate(chosen[:n])}
