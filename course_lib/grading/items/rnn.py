"""Check specs for notebook 01 (RNN limitations): rnn_step, rnn_forward and
jacobian_norms, with their mistake catalogues."""

from __future__ import annotations

import torch

from ... import rnn as ref
from ..judge.properties import compare_cases, dtype_name, gradients_reach, randn
from ..judge.spec import Case, CheckFailed, ItemSpec, Mistake, SubCheck

f32, f64 = torch.float32, torch.float64


def _weights(seed: int, d_in: int, H: int, dtype: torch.dtype, device: torch.device, radius: float = 0.9) -> dict:
    """W_xh (H, D_in), W_hh (H, H) with spectral radius about ``radius``, b_h (H,)."""
    W_hh = randn((H, H), seed + 1, f64, torch.device("cpu"))
    W_hh = W_hh * (radius / torch.linalg.eigvals(W_hh).abs().max())
    return {
        "W_xh": randn((H, d_in), seed, dtype, device) / d_in ** 0.5,
        "W_hh": W_hh.to(dtype=dtype, device=device),
        "b_h": 0.1 * randn((H,), seed + 2, dtype, device),
    }


# ---------------------------------------------------------------------------
# rnn_step
# ---------------------------------------------------------------------------

def _step_case(seed: int, B: int, d_in: int, H: int, dtype: torch.dtype) -> Case:
    def make(device: torch.device) -> dict:
        return {"x_t": randn((B, d_in), seed + 3, dtype, device), "h_prev": randn((B, H), seed + 4, dtype, device),
                **_weights(seed, d_in, H, dtype, device)}

    return Case(f"x_t ({B}, {d_in}), h_prev ({B}, {H}), W_xh ({H}, {d_in}), W_hh ({H}, {H}) {dtype_name(dtype)}", make)


def _hand_step_case() -> Case:
    def make(device: torch.device) -> dict:
        return {
            "x_t": torch.tensor([[1.0, 0.0], [0.0, 1.0]], device=device),
            "h_prev": torch.tensor([[0.5, -0.5, 0.0], [1.0, 0.0, -1.0]], device=device),
            "W_xh": torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], device=device),
            "W_hh": torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [0.5, 0.0, 0.0]], device=device),
            "b_h": torch.tensor([0.1, 0.0, -0.1], device=device),
        }

    return Case("the hand example x_t (2, 2), h_prev (2, 3), W_xh (3, 2), W_hh (3, 3) (from the notebook)", make)


def _step(act=torch.tanh, whh_t=True, wxh_t=True, bias=True, recurrence=True):
    """A wrong RNN step: another activation (None: none), a weight used untransposed, no bias, no h_prev."""

    def step(x_t, h_prev, W_xh, W_hh, b_h):
        z = (h_prev @ (W_hh.T if whh_t else W_hh) if recurrence else 0) + x_t @ (W_xh.T if wxh_t else W_xh)
        z = z + b_h if bias else z
        return act(z) if act else z

    return step


STEP_MISTAKES = (
    Mistake("missing tanh", _step(act=None),
            "The non-linearity is missing: apply torch.tanh to W_hh h_prev + W_xh x_t + b_h."),
    Mistake("W_hh transposed", _step(whh_t=False),
            "W_hh is used transposed: with batch-first rows, W_hh h_{t-1} is h_prev @ W_hh.T (not h_prev @ W_hh)."),
    Mistake("W_xh transposed", _step(wxh_t=False),
            "W_xh is used transposed: W_xh has shape (H, D_in), so W_xh x_t is x_t @ W_xh.T."),
    Mistake("bias missing", _step(bias=False), "The bias b_h is missing: add it inside the tanh."),
    Mistake("no recurrence", _step(recurrence=False),
            "h_prev has no effect on your result: add the recurrent term h_prev @ W_hh.T inside the tanh."),
    Mistake("sigmoid instead of tanh", _step(act=torch.sigmoid),
            "You used a sigmoid: the vanilla RNN uses torch.tanh."),
    Mistake("ReLU instead of tanh", _step(act=torch.relu), "You used a ReLU: the vanilla RNN uses torch.tanh."),
)


def _step_spec() -> ItemSpec:
    hidden = (
        _step_case(30, 1, 6, 6, f32),  # D_in == H: a transposed W_xh runs without a shape error
        _step_case(20, 4, 5, 3, f64),
        _step_case(40, 7, 2, 9, f64),
    )
    return ItemSpec(
        name="rnn_step", reference=ref.rnn_step, mistakes=STEP_MISTAKES,
        subchecks=(
            # (the hand example is public: with it, one the student has not seen)
            SubCheck("matches the reference on the hand example and a random input of its shape", 1,
                     compare_cases(_hand_step_case(), _step_case(15, 2, 2, 3, f32))),
            SubCheck("matches the reference on a random batch", 1, compare_cases(_step_case(10, 3, 4, 5, f32))),
            SubCheck("matches on other sizes and float64 (batch of 1, D_in = H, D_in < H)", 1,
                     compare_cases(*hidden), hidden=True),
            SubCheck("gradients reach x_t, h_prev, W_xh, W_hh and b_h", 1,
                     lambda t: gradients_reach(t, hidden[0], ("x_t", "h_prev", "W_xh", "W_hh", "b_h"), index=None),
                     hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# rnn_forward
# ---------------------------------------------------------------------------

def _forward_case(seed: int, B: int, T: int, d_in: int, H: int, dtype: torch.dtype, zero_h0: bool = False) -> Case:
    def make(device: torch.device) -> dict:
        h0 = torch.zeros(B, H, dtype=dtype, device=device) if zero_h0 else randn((B, H), seed + 5, dtype, device)
        return {"X": randn((B, T, d_in), seed + 3, dtype, device), "h0": h0, **_weights(seed, d_in, H, dtype, device)}

    h0 = "zero h0" if zero_h0 else "random h0"
    return Case(f"X ({B}, {T}, {d_in}), h0 ({B}, {H}) {dtype_name(dtype)}, {h0}", make)


def _forward(step=_step(), carry=True, dim=1, last_only=False, before=False, reverse=False):
    """A wrong loop over time: the state not carried, stacked on ``dim``, only the last one, the
    states before each step, time reversed."""

    def forward(X, h0, W_xh, W_hh, b_h):
        h, out = h0, []
        for t in (reversed(range(X.shape[1])) if reverse else range(X.shape[1])):
            if before:
                out.append(h)
            h = step(X[:, t], h if carry else h0, W_xh, W_hh, b_h)
            if not before:
                out.append(h)
        return h if last_only else torch.stack(out, dim=dim)

    return forward


FORWARD_MISTAKES = (
    Mistake("hidden state not carried", _forward(carry=False),
            "The hidden state is not carried between steps: every step starts again from h0. "
            "Update h = rnn_step(X[:, t], h, ...) and feed that h into the next step."),
    Mistake("time axis first", _forward(dim=0),
            "The states are stacked along a new first axis, giving (T, B, H): stack along dim=1 to return (B, T, H)."),
    Mistake("last state only", _forward(last_only=True),
            "You returned only the last hidden state: return every state h_1..h_T, stacked into (B, T, H)."),
    Mistake("states shifted by one", _forward(before=True),
            "Your states are shifted by one step: output t must be the state after reading X[:, t] "
            "(h_1..h_T), not before it (h_0..h_{T-1})."),
    Mistake("missing tanh", _forward(_step(act=None)),
            "The non-linearity is missing: each step is h_t = tanh(W_hh h_{t-1} + W_xh x_t + b_h)."),
    Mistake("W_hh transposed", _forward(_step(whh_t=False)),
            "W_hh is used transposed: with batch-first rows, W_hh h_{t-1} is h @ W_hh.T."),
    Mistake("time reversed", _forward(reverse=True),
            "The sequence is read backwards: loop over t = 0, 1, ..., T-1."),
)


def _forward_spec() -> ItemSpec:
    visible = _forward_case(100, 2, 5, 3, 4, f32)
    hidden = (
        _forward_case(110, 3, 7, 4, 4, f64),
        _forward_case(120, 1, 1, 2, 3, f32, zero_h0=True),
        _forward_case(130, 5, 12, 6, 8, f64, zero_h0=True),
    )
    return ItemSpec(
        name="rnn_forward", reference=ref.rnn_forward, mistakes=FORWARD_MISTAKES,
        forbidden={torch.nn.RNN: "it uses torch.nn.RNN; write the loop over time steps yourself",
                   torch.rnn_tanh: "it calls torch's built-in RNN; write the loop over time steps yourself"},
        subchecks=(
            SubCheck("matches the reference on a random batch", 1, compare_cases(visible)),
            SubCheck("matches on other sizes and float64 (T = 1, zero h0, longer sequences)", 1,
                     compare_cases(*hidden), hidden=True),
            SubCheck("gradients reach X, h0, W_xh, W_hh and b_h", 1,
                     lambda t: gradients_reach(t, hidden[0], ("X", "h0", "W_xh", "W_hh", "b_h"), index=None),
                     hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# jacobian_norms
# ---------------------------------------------------------------------------

def _jac_case(seed: int, T: int, d_in: int, H: int, dtype: torch.dtype, radius: float) -> Case:
    def make(device: torch.device) -> dict:
        return {"X": randn((T, d_in), seed + 3, dtype, device), "h0": randn((H,), seed + 4, dtype, device),
                **_weights(seed, d_in, H, dtype, device, radius)}

    return Case(f"X ({T}, {d_in}), h0 ({H},), W_hh with spectral radius {radius} {dtype_name(dtype)}", make)


def _states(X, h0, W_xh, W_hh, b_h):
    h, out = h0, []
    for t in range(X.shape[0]):
        h = torch.tanh(W_hh @ h + W_xh @ X[t] + b_h)
        out.append(h)
    return out


def jac_reversed(X, h0, W_xh, W_hh, b_h):
    hs = _states(X, h0, W_xh, W_hh, b_h)
    J = torch.eye(len(h0), dtype=h0.dtype, device=h0.device)
    norms = [torch.linalg.norm(J)]
    for t in range(len(hs) - 1, 0, -1):
        J = J @ torch.diag(1 - hs[t] ** 2) @ W_hh
        norms.append(torch.linalg.norm(J))
    return torch.stack(norms)  # t = T .. 1 instead of 1 .. T


def _product_norms(hs, W_hh, factor, norm=torch.linalg.norm):
    J = torch.eye(W_hh.shape[0], dtype=W_hh.dtype, device=W_hh.device)
    norms = [norm(J)]
    for t in range(len(hs) - 1, 0, -1):
        J = J @ factor(t)
        norms.append(norm(J))
    return torch.stack(norms[::-1])


def _jac(factor=lambda hs, W_hh, t: torch.diag(1 - hs[t] ** 2) @ W_hh, norm=torch.linalg.norm, drop_identity=False,
         with_h0=False):
    """Wrong Jacobian norms: another factor ∂h_{t+1}/∂h_t (from the states and W_hh), another norm,
    the identity dropped, h0 included."""

    def norms(X, h0, W_xh, W_hh, b_h):
        hs = ([h0] if with_h0 else []) + _states(X, h0, W_xh, W_hh, b_h)
        out = _product_norms(hs, W_hh, lambda t: factor(hs, W_hh, t), norm)
        return out[:-1] if drop_identity else out

    return norms


JACOBIAN_MISTAKES = (
    Mistake("order reversed", jac_reversed,
            "Your norms are in reverse order: entry t-1 must be ‖∂h_T/∂h_t‖ for t = 1..T, so the last entry is "
            "the identity's norm √H."),
    Mistake("tanh derivative missing", _jac(lambda hs, W_hh, t: W_hh),
            "The tanh derivative is missing: ∂h_{t+1}/∂h_t = diag(1 - h_{t+1}²) W_hh, not W_hh alone."),
    Mistake("tanh derivative at the wrong step", _jac(lambda hs, W_hh, t: torch.diag(1 - hs[t - 1] ** 2) @ W_hh),
            "The tanh derivative is taken at the wrong step: ∂h_{t+1}/∂h_t uses 1 - h_{t+1}² (the state the "
            "step produces), not 1 - h_t²."),
    Mistake("tanh instead of its derivative", _jac(lambda hs, W_hh, t: torch.diag(torch.tanh(hs[t])) @ W_hh),
            "You used tanh(h) where its derivative belongs: since h_{t+1} = tanh(a), ∂h_{t+1}/∂a = 1 - h_{t+1}²."),
    Mistake("spectral norm", _jac(norm=lambda J: torch.linalg.matrix_norm(J, ord=2)),
            "You computed the spectral norm (largest singular value); the Frobenius norm is asked for: "
            "torch.linalg.norm(J) (the default for a matrix)."),
    Mistake("identity dropped", _jac(drop_identity=True),
            "One entry is missing: include t = T, where ∂h_T/∂h_T is the identity (norm √H), for T entries in all."),
    Mistake("h0 included", _jac(with_h0=True),
            "You returned T + 1 entries: the norms are for t = 1..T (not for h0), so there are T of them."),
)


def _jac_spec() -> ItemSpec:
    visible = _jac_case(200, 6, 3, 4, f64, 1.2)
    hidden = (
        _jac_case(210, 10, 2, 5, f64, 0.5),
        _jac_case(220, 8, 4, 6, f64, 3.0),
        _jac_case(230, 1, 2, 3, f64, 1.0),
        _jac_case(240, 5, 3, 3, f32, 1.5),
    )

    def against_autograd(trial) -> None:
        """The norms agree with ∂h_T/∂h_t computed by torch.autograd."""
        case = hidden[0]
        inputs = case.make(trial.device)
        got = trial.student(case.make(trial.device), case.label)
        if not isinstance(got, torch.Tensor) or got.shape != (inputs["X"].shape[0],):
            return  # the comparison sub-check reports shapes
        W_xh, W_hh, b_h, X = inputs["W_xh"], inputs["W_hh"], inputs["b_h"], inputs["X"]
        hs = _states(X, inputs["h0"], W_xh, W_hh, b_h)
        T = len(hs)
        for t in range(T):
            def from_t(h, t=t):
                for s in range(t + 1, T):
                    h = torch.tanh(W_hh @ h + W_xh @ X[s] + b_h)
                return h
            J = torch.autograd.functional.jacobian(from_t, hs[t].detach())
            if not torch.isclose(got[t].detach(), torch.linalg.norm(J), rtol=1e-6, atol=1e-9):
                raise CheckFailed(
                    f"On {case.label}: entry {t} (t = {t + 1}) is {got[t].item():.4g}, but the norm of the Jacobian "
                    f"∂h_T/∂h_{t + 1} computed by autograd is {torch.linalg.norm(J).item():.4g}.")

    return ItemSpec(
        name="jacobian_norms", reference=ref.jacobian_norms, mistakes=JACOBIAN_MISTAKES,
        subchecks=(
            SubCheck("matches the reference on a random sequence", 1, compare_cases(visible)),
            SubCheck("matches for small and large spectral radius, T = 1, float32", 1,
                     compare_cases(*hidden), hidden=True),
            SubCheck("agrees with torch.autograd's Jacobians", 1, against_autograd, hidden=True),
        ),
    )


SPECS = {spec.name: spec for spec in (_step_spec(), _forward_spec(), _jac_spec())}
