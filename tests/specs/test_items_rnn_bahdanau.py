"""The check specs of notebooks 01 and 02 accept correct independent implementations
and catch every catalogued mistake with its hint."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from course_lib.grading import get_spec, grade
from course_lib.grading.items import bahdanau as bahdanau_items
from course_lib.grading.items import rnn as rnn_items

# ---------------------------------------------------------------------------
# Independent correct implementations (written differently from course_lib's)
# ---------------------------------------------------------------------------


def rnn_step(x_t, h_prev, W_xh, W_hh, b_h):
    return torch.tanh(torch.einsum("hd,bd->bh", W_xh, x_t) + torch.einsum("hk,bk->bh", W_hh, h_prev) + b_h)


def rnn_forward(X, h0, W_xh, W_hh, b_h):
    out = torch.empty(X.shape[0], X.shape[1], W_hh.shape[0], dtype=X.dtype, device=X.device)
    states = []
    h = h0
    for t in range(X.shape[1]):
        h = rnn_step(X[:, t, :], h, W_xh, W_hh, b_h)
        states.append(h)
    return torch.stack(states, 1) if states else out


def jacobian_norms(X, h0, W_xh, W_hh, b_h):
    # Autograd on a chain of states: ∂h_T/∂h_t row by row.
    T = X.shape[0]
    hs = []
    h = h0
    for t in range(T):
        h = torch.tanh(W_xh @ X[t] + W_hh @ h + b_h)
        hs.append(h)
    norms = []
    for t in range(T):
        start = hs[t].detach().requires_grad_(True)
        h = start
        for s in range(t + 1, T):
            h = torch.tanh(W_xh @ X[s] + W_hh @ h + b_h)
        rows = [torch.autograd.grad(h[i], start, retain_graph=True, allow_unused=True)[0] for i in range(h.shape[0])]
        rows = [r if r is not None else torch.zeros_like(start) for r in rows]
        norms.append(torch.stack(rows).pow(2).sum().sqrt())
    return torch.stack(norms)


def dot_score(h, s):
    return torch.einsum("btd,bd->bt", h, s)


def general_score(h, s, W):
    return torch.einsum("btd,de,be->bt", h, W, s)


def additive_score(h, s, W_h, W_s, v):
    return torch.einsum("bta,a->bt", torch.tanh(torch.einsum("ad,btd->bta", W_h, h) + (W_s @ s.T).T[:, None, :]), v)


def masked_softmax(scores, mask):
    if mask is None:
        mask = torch.ones_like(scores, dtype=torch.bool)
    shifted = scores - scores.masked_fill(~mask, float("-inf")).amax(dim=-1, keepdim=True)
    e = torch.where(mask, shifted.exp(), torch.zeros_like(scores))
    return e / e.sum(dim=-1, keepdim=True)


def context_vector(weights, h):
    return torch.einsum("bt,btd->bd", weights, h)


class BahdanauAttention(nn.Module):
    def __init__(self, enc_dim, dec_dim, attn_dim):
        super().__init__()
        self.W_h = nn.Linear(enc_dim, attn_dim, bias=False)
        self.W_s = nn.Linear(dec_dim, attn_dim)
        self.v = nn.Linear(attn_dim, 1, bias=False)

    def forward(self, h, s, mask=None):
        e = self.v(torch.tanh(self.W_h(h) + self.W_s(s)[:, None, :]))[..., 0]
        w = masked_softmax(e, mask)
        return context_vector(w, h), w


CORRECT = {
    "rnn_step": rnn_step, "rnn_forward": rnn_forward, "jacobian_norms": jacobian_norms,
    "dot_score": dot_score, "general_score": general_score, "additive_score": additive_score,
    "masked_softmax": masked_softmax, "context_vector": context_vector, "BahdanauAttention": BahdanauAttention,
}
ITEM_MODULES = (rnn_items, bahdanau_items)


@pytest.mark.parametrize("name", sorted(CORRECT))
def test_correct_implementation_earns_every_point(name):
    spec = get_spec(name)
    result = grade(spec, CORRECT[name], hidden=True)
    failed = [f"{r.title}: {r.message}" for r in result.results if not r.passed]
    assert not failed and not result.reference_used, failed
    assert result.earned == spec.points and spec.points >= 2


@pytest.mark.parametrize("name", sorted(CORRECT))
def test_visible_checks_pass_for_correct_implementation(name):
    result = grade(get_spec(name), CORRECT[name], hidden=False)
    assert all(r.passed for r in result.results) and not result.results[0].hidden


MISTAKES = [(module.__name__.rsplit(".", 1)[-1], name, mistake)
            for module in ITEM_MODULES for name, spec in module.SPECS.items() for mistake in spec.mistakes]


@pytest.mark.parametrize("name,mistake", [(n, m) for _, n, m in MISTAKES],
                         ids=[f"{n}-{m.name}" for _, n, m in MISTAKES])
def test_each_mistake_loses_points_and_gets_its_hint(name, mistake):
    spec = get_spec(name)
    result = grade(spec, mistake.impl, hidden=True)
    assert not result.reference_used, result.reference_used
    assert result.earned < spec.points
    messages = "\n".join(r.message for r in result.results)
    assert f"Likely cause: {mistake.hint}" in messages, messages


def test_every_item_has_a_mistake_catalogue_and_hidden_checks():
    for module in ITEM_MODULES:
        for spec in module.SPECS.values():
            assert len(spec.mistakes) >= 3, spec.name
            assert spec.visible() and spec.hidden(), spec.name


def test_calling_the_reference_earns_nothing():
    from course_lib import bahdanau, rnn

    def wrapped_step(x_t, h_prev, W_xh, W_hh, b_h):
        return rnn.rnn_step(x_t, h_prev, W_xh, W_hh, b_h)

    def wrapped_softmax(scores, mask):
        return bahdanau.masked_softmax(scores, mask)

    for name, impl in (("rnn_step", wrapped_step), ("masked_softmax", wrapped_softmax)):
        result = grade(get_spec(name), impl, hidden=True)
        assert result.earned == 0 and "reference" in result.reference_used


def test_builtin_rnn_is_refused_for_rnn_forward():
    def with_torch_rnn(X, h0, W_xh, W_hh, b_h):
        layer = nn.RNN(X.shape[-1], W_hh.shape[0], batch_first=True).to(X.dtype)
        with torch.no_grad():
            layer.weight_ih_l0.copy_(W_xh)
            layer.weight_hh_l0.copy_(W_hh)
            layer.bias_ih_l0.copy_(b_h)
            layer.bias_hh_l0.zero_()
        return layer(X, h0[None])[0]

    result = grade(get_spec("rnn_forward"), with_torch_rnn, hidden=True)
    assert result.earned == 0 and "torch.nn.RNN" in result.reference_used


def test_stub_reports_once():
    def stub(x_t, h_prev, W_xh, W_hh, b_h):
        raise NotImplementedError()

    result = grade(get_spec("rnn_step"), stub, hidden=True)
    assert result.earned == 0
    assert "NotImplementedError" in result.results[0].message
    assert all(r.message == "not run" for r in result.results[1:])



class MislaidAttention(BahdanauAttention):
    """Bahdanau attention with the layout mistakes any module can make: a stray bias
    (W_h), a missing one (W_s), and nn.Linear's arguments swapped (W_s)."""

    def __init__(self, enc_dim, dec_dim, attn_dim):
        super().__init__(enc_dim, dec_dim, attn_dim)
        self.W_h = nn.Linear(enc_dim, attn_dim)
        self.W_s = nn.Linear(attn_dim, dec_dim, bias=False)


def test_a_wrong_parameter_layout_is_explained():
    result = grade(get_spec("BahdanauAttention"), MislaidAttention, hidden=True)
    layout = next(r for r in result.results if r.title.startswith("parameters"))
    assert not layout.passed
    for hint in ("yours: W_h.weight (5, 6), W_h.bias (5,), W_s.weight (4, 5), v.weight (1, 5).",
                 "W_h should have no bias: nn.Linear(..., bias=False).",
                 "W_s should have a bias: nn.Linear(in, out) has one by default (bias=True).",
                 "W_s.weight has its shape transposed: nn.Linear(in, out) stores its weight as (out, in)"):
        assert hint in layout.message, layout.message
    assert "v.weight has" not in layout.message

CONTRACT = {
    "01_rnn_limitations": {"rnn_step": "def rnn_step(x_t, h_prev, W_xh, W_hh, b_h)",
                           "rnn_forward": "def rnn_forward(X, h0, W_xh, W_hh, b_h)",
                           "jacobian_norms": "def jacobian_norms(X, h0, W_xh, W_hh, b_h)"},
    "02_bahdanau_attention": {"dot_score": "def dot_score(h, s)", "general_score": "def general_score(h, s, W)",
                              "additive_score": "def additive_score(h, s, W_h, W_s, v)",
                              "masked_softmax": "def masked_softmax(scores, mask=None)",
                              "context_vector": "def context_vector(weights, h)",
                              "BahdanauAttention": "def __init__(self, enc_dim, dec_dim, attn_dim)"},
}


@pytest.mark.parametrize("assignment", sorted(CONTRACT))
def test_released_notebooks_keep_the_curriculum_contract(assignment):
    import json

    from conftest import ROOT

    cells = json.loads((ROOT / "notebooks" / assignment / f"{assignment}.ipynb").read_text())["cells"]
    sources = {c["metadata"]["nbgrader"]["grade_id"]: "".join(c["source"]) for c in cells
               if c["cell_type"] == "code" and c.get("metadata", {}).get("nbgrader", {}).get("solution")}
    assert set(sources) == set(CONTRACT[assignment])
    for name, signature in CONTRACT[assignment].items():
        assert signature in sources[name] and "raise NotImplementedError()" in sources[name], name
    written = [c for c in cells if c["cell_type"] == "markdown" and c.get("metadata", {}).get("nbgrader", {}).get("grade")]
    assert len(written) >= 3
