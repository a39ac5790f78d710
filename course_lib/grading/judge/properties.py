"""Reusable building blocks for check specs: seeded inputs, properties (attention weights,
masks, padding, the future, gradients), the module-item layer (the grader's weights, cases,
the parameter layout) and :func:`variant` for catalogued wrong modules.

Every property raises :class:`CheckFailed` with a student-facing message.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from ..answer.calls import INVOKE, Probe
from .compare import describe_difference, fmt_num
from .runner import current_salt
from .spec import Case, CheckFailed
from .spec import Mistake
from .trial import raised
from ..answer.wire import Opaque

__all__ = [
    "seed", "fresh", "generator", "randn", "dtype_name", "type_name", "mask_words",
    "weights_sum_to_one", "masked_weights_zero", "masked_keys_ignored", "gradients_reach",
    "compare_cases", "reference_state", "module_inputs", "module_case", "layout", "parameter_shapes",
    "module_gradients", "padding", "padding_no_leak", "no_future_leak", "ignored_get_no_gradient", "variant",
    "reproducible", "call_and_inspect", "raises_value_error",
]


def seed(value: int) -> int:
    """The seed to use for grading input ``value``: ``value`` itself in a notebook; when
    a submission is graded, mixed with that grading's secret salt, so that random
    inputs cannot be known (and answered) in advance."""
    salt = current_salt()
    if not salt:
        return value
    return (value * 1_000_003 + salt * 7_919) % (2**62)


def fresh(value: int, low: int, high: int) -> int:
    """An integer in ``[low, high]`` for grading input ``value``: another one at each grading
    (from its salt), a fixed one in a notebook. For the sizes and numbers of an input that the
    notebook's own examples fix (a hand example is public: its answer could be typed in), so
    that a visible check also holds on one the student has not seen. Call it while a check runs
    (in a sub-check or a case's ``make``), as :func:`seed`."""
    return low + seed(value) % (high - low + 1)


def sample_inputs(make: Callable[[torch.device], dict]) -> dict:
    """What ``make`` builds, on the CPU and unsalted, for describing a case when its spec is
    built (the shapes and masks a label names do not depend on a grading's salt)."""
    from .runner import salted
    with salted(0):
        return make(torch.device("cpu"))


def generator(value: int) -> torch.Generator:
    """A CPU generator seeded with :func:`seed` ``(value)``."""
    return torch.Generator().manual_seed(seed(value))


def randn(shape: Sequence[int], seed_value: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """Standard normal tensor from a private seeded generator (CPU, then moved)."""
    return torch.randn(*shape, generator=generator(seed_value), dtype=dtype).to(device)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def type_name(value: Any) -> str:
    """The type of an answer for a message (an :class:`~course_lib.grading.answer.wire.Opaque` answer
    keeps only its name)."""
    return value.type_name if isinstance(value, Opaque) else type(value).__name__


def mask_words(mask: Tensor | None) -> str:
    """Describe a mask for a message: 'no mask', 'causal mask (5, 5)', ..."""
    if mask is None:
        return "no mask"
    shape = tuple(mask.shape)
    if mask.dim() >= 2 and mask.shape[-1] == mask.shape[-2] and bool((mask == torch.ones_like(mask).tril()).all()):
        return f"causal mask {shape}"
    return f"padding mask {shape}"


def compare_cases(*cases: Case, probe: Probe = INVOKE, differ: Callable | None = None) -> Callable[[Any], None]:
    """A sub-check body that compares the student with the reference on ``cases``
    (their answers to ``probe``, told apart by ``differ``: see :meth:`Trial.compare`)."""
    return lambda trial: trial.compare(cases, probe, differ)


def _weights(out: Any, index: int | None) -> Tensor:
    w = out[index] if index is not None else out
    if not isinstance(w, Tensor):
        raise CheckFailed(f"expected the attention weights as a tensor, got {type(w).__name__}")
    return w


def _catalogued(trial: Any, case: Case, got: Any) -> Mistake | None:
    """A catalogued mistake whose whole output is the student's on ``case``."""
    return trial.likely_mistake(case, got, trial.reference(case.make(trial.device)))


def weights_sum_to_one(trial: Any, case: Case, index: int = 1) -> None:
    """Each row of the weights sums to 1 over the key axis and no weight is negative."""
    w = _weights(trial.student(case.make(trial.device), case.label), index).detach()
    sums = w.sum(dim=-1)
    bad = ~torch.isclose(sums, torch.ones_like(sums), atol=1e-4)
    if bool(bad.any()):
        first = tuple(int(i) for i in bad.nonzero()[0].tolist())
        col = w.sum(dim=-2)
        extra = ""
        if bool(torch.isclose(col, torch.ones_like(col), atol=1e-4).all()):
            extra = " They sum to 1 over the queries instead: apply the softmax over the last axis (dim=-1)."
        raise CheckFailed(
            f"On {case.label}: the weights of query row {first} sum to {fmt_num(sums[first].item())}, "
            f"not 1 over the keys.{extra}"
        )
    if bool((w < 0).any()):
        raise CheckFailed(f"On {case.label}: some weights are negative; weights come out of a softmax.")


def masked_weights_zero(trial: Any, case: Case, index: int = 1, mask_key: str = "mask") -> None:
    """Positions the mask disallows get weight exactly 0."""
    inputs = case.make(trial.device)
    mask = inputs[mask_key]
    got = trial.student(inputs, case.label)
    w = _weights(got, index).detach()
    blocked = ~mask.expand_as(w)
    if bool((w[blocked] != 0).any()):
        worst = w[blocked].abs().max().item()
        message = f"On {case.label}: masked positions have weight up to {fmt_num(worst)}, expected exactly 0."
        named = _catalogued(trial, case, got)
        if named:
            raise trial.failed(message, named, sep=" ")
        if bool((w[~blocked] == 0).all()):
            raise CheckFailed(f"{message} All weight goes to the masked keys: is the mask inverted? "
                              "True means 'may attend'.")
        raise CheckFailed(f"{message} Fill the masked scores with -inf (float('-inf')) before the softmax, "
                          "so that exp gives exactly 0.")


def masked_keys_ignored(trial: Any, case: Case, perturb: Sequence[str] = ("k", "v"),
                        key_mask: Callable[[dict], Tensor] | None = None, index: int = 0) -> None:
    """Changing a masked key/value does not change the output.

    ``key_mask(inputs)`` returns a boolean ``(..., T_k)`` tensor of the key positions
    that no query may see (default: ``~inputs['mask'][..., 0, :]``, for padding masks).
    """
    inputs = case.make(trial.device)
    blocked = key_mask(inputs) if key_mask else ~inputs["mask"][..., 0, :]
    before = trial.student(inputs, case.label)
    changed = case.make(trial.device)
    for name in perturb:
        t = changed[name]
        noise = 100.0 * torch.ones_like(t)
        b = blocked
        while b.dim() < t.dim():
            b = b.unsqueeze(-1)
        changed[name] = torch.where(b.expand_as(t), t + noise, t)
    after = trial.student(changed, case.label)
    o1 = before[index] if index is not None else before
    o2 = after[index] if index is not None else after
    problem = describe_difference(o1.detach(), o2.detach() if isinstance(o2, Tensor) else o2)
    if problem:
        raise CheckFailed(
            f"On {case.label}: changing the padded (masked) keys and values changed the output, "
            f"so masked keys still leak in. {problem}"
        )


def raises_value_error(case: Case, what: str, probe: Probe = INVOKE) -> Callable[[Any], None]:
    """Sub-check body: the student's code raises a ``ValueError`` on ``case`` (``what`` says why
    it should); an answer instead fails, naming the catalogued mistake that gives the same answer."""

    def run(trial: Any) -> None:
        try:
            got = trial.student(case.make(trial.device), case.label, probe)
        except CheckFailed as failed:
            if raised(failed, "ValueError"):
                return
            raise CheckFailed(f"On {case.label}: expected a ValueError ({what}); instead {failed}",
                              cause=failed.cause) from None
        shape = f" of shape {tuple(got.shape)}" if isinstance(got, Tensor) else ""
        message = (f"On {case.label}: expected a ValueError ({what}), but your code returned an answer{shape}: "
                   "check the sizes and `raise ValueError(...)` when they do not fit.")
        for mistake in trial.spec.mistakes if trial.name_mistakes else ():
            wrong = trial.mistake_output(mistake.impl, case.make(trial.device), probe)
            if wrong is not None and describe_difference(wrong, got, equal_nan=True) is None:
                raise trial.failed(message, mistake)
        raise CheckFailed(message)

    return run


def call_and_inspect(trial: Any, inputs: dict, names: Sequence[str], label: str) -> tuple[Any, dict]:
    """Call the student's function on ``inputs`` and also get the arguments ``names`` back
    as the call left them (the ``after`` probe): ``(output, {name: value})``, to tell
    whether it changed them in place. A name the grader could not inspect is missing."""
    got = trial.student(inputs, label, probe=Probe("after", {"names": list(names)}))
    if not isinstance(got, dict):
        return got, {}
    return got.get("output"), got.get("after") or {}


def _gradients(trial: Any, inputs: dict, label: str, names: Sequence[str], index: int | None = 0) -> dict:
    """The student's answer to the ``gradients`` probe (backpropagate from output ``index``
    to the inputs ``names``): ``{"grads": ..., "params": ...}``; fails unless the output is
    connected to the autograd graph."""
    out = trial.student(inputs, label, probe=Probe("gradients", {"names": list(names), "index": index}))
    if not isinstance(out, dict) or not out.get("connected"):
        raise CheckFailed(
            f"On {label}: the output is not connected to the inputs' autograd graph "
            "(did you use .detach(), .item(), numpy or torch.no_grad()?)."
        )
    return out


def _require_gradient(label: str, name: str, g: Any) -> None:
    """``g``, the gradient of ``name``, exists, is finite and is not all zero."""
    if not isinstance(g, Tensor):
        raise CheckFailed(f"On {label}: `{name}` gets no gradient from the output.")
    if not bool(torch.isfinite(g).all()):
        raise CheckFailed(f"On {label}: `{name}` gets a non-finite gradient from the output.")
    if float(g.abs().sum()) == 0.0:
        raise CheckFailed(f"On {label}: `{name}` gets a zero gradient from the output.")


def gradients_reach(trial: Any, case: Case, names: Sequence[str], index: int | None = 0) -> None:
    """Backpropagating from the output gives finite, non-zero gradients for ``names``."""
    grads = _gradients(trial, case.make(trial.device), case.label, names, index).get("grads") or {}
    for name in names:
        _require_gradient(case.label, name, grads.get(name))


# ---------------------------------------------------------------------------
# Module items: the grader's hyper-parameters and weights, the student's class
# ---------------------------------------------------------------------------

def reference_state(cls: type, args: tuple, seed_value: int,
                    adjust: Callable[[torch.nn.Module], None] | None = None) -> dict[str, Tensor]:
    """The weights of ``cls(*args)`` initialised from :func:`seed` ``(seed_value)``, then
    changed in place by ``adjust(module)`` (under ``no_grad``, same random stream), e.g.
    to move LayerNorms away from (1, 0) so that a forgotten one shows. Grader side; the
    global random state is left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed(seed_value))
        module = cls(*args)
        if adjust is not None:
            with torch.no_grad():
                adjust(module)
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def module_inputs(args: tuple, state: dict[str, Tensor] | None, device: torch.device, dtype: torch.dtype,
                  **inputs: Any) -> dict:
    """Inputs of a module item's call: construct ``impl(*args)``, load ``state`` (the
    reference's weights, computed by the grader), move to ``device``/``dtype``; the
    other keyword arguments are the forward's inputs."""
    return {"args": tuple(args), "state": state, "device": str(device), "dtype": dtype, **inputs}


def module_case(label: str, cls: type, args: tuple, seed_value: int, dtype: torch.dtype,
                inputs: Callable[[torch.device], dict],
                adjust: Callable[[torch.nn.Module], None] | None = None) -> Case:
    """A module item's case: the implementation built as ``impl(*args)`` with the weights of
    :func:`reference_state` ``(cls, args, seed_value, adjust)``, in ``dtype``, called on
    ``inputs(device)`` (the forward's inputs by name)."""

    def make(device: torch.device) -> dict:
        state = reference_state(cls, args, seed_value, adjust)
        return module_inputs(args, state, device, dtype, **inputs(device))

    return Case(label, make)


def layout(trial: Any, args: tuple, attrs: Sequence[str] = (), kwargs: dict | None = None,
           values: bool = False, label: str = "") -> dict:
    """The student's module ``impl(*args, **kwargs)`` described by the ``layout`` probe
    (parameter shapes, submodule classes, ``attrs``; parameter values with ``values``)."""
    label = label or f"{trial.spec.name}{tuple(args)}"
    inputs = {"args": tuple(args), "kwargs": dict(kwargs or {})}
    out = trial.student(inputs, label, probe=Probe("layout", {"attrs": list(attrs), "values": values}))
    if not isinstance(out, dict) or not out.get("module"):
        raise CheckFailed(f"{label} should construct an nn.Module, got {out.get('type') if isinstance(out, dict) else out}.")
    return out


def _shapes(state: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in state.items())


def parameter_shapes(trial: Any, args: tuple, expected: dict[str, tuple], what: str,
                     advice: Callable[[dict], str] = lambda got: "", **options: Any) -> None:
    """The parameter-layout sub-check: the student's ``impl(*args)`` has exactly the
    parameters ``expected`` (name → shape), as the grader loads its weights by name.
    ``what`` names the module in the message ("SelfAttention(d_model=6, d_k=4, d_v=5)").
    A wrong layout's message names stray or missing biases and transposed weights;
    ``advice(got)`` adds the item's own hints. ``options`` go to :func:`layout`
    (with ``values``, the shapes are those of the parameters, buffers left out)."""
    built = layout(trial, args, **options)
    got = ({k: tuple(v.shape) for k, v in built.get("values", {}).items()} if options.get("values")
           else built["state"])
    if got != expected:
        raise CheckFailed(f"{what} should have exactly the parameters {_shapes(expected)}; yours: "
                          f"{_shapes(got) or 'none'}.{_layout_hints(got, expected)}{advice(got)}")


def _layout_hints(got: dict[str, tuple], expected: dict[str, tuple]) -> str:
    """Hints for the layout mistakes any module can make: biases that should not be
    there or are missing, and weights stored transposed."""
    def modules(keys: list[str]) -> str:
        names = [k.removesuffix(".bias") for k in keys]
        return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]

    hints = ""
    extra = [k for k in got if k.endswith(".bias") and k not in expected]
    missing = [k for k in expected if k.endswith(".bias") and k not in got
               and k.removesuffix(".bias") + ".weight" in got]
    if extra:
        hints += f" {modules(extra)} should have no bias: nn.Linear(..., bias=False)."
    if missing:
        hints += f" {modules(missing)} should have a bias: nn.Linear(in, out) has one by default (bias=True)."
    transposed = [k for k, shape in expected.items() if len(shape) == 2 and shape[0] != shape[1]
                  and got.get(k) == shape[::-1]]
    if transposed:
        hints += (f" {', '.join(transposed)} {'has its shape' if len(transposed) == 1 else 'have their shapes'} "
                  "transposed: nn.Linear(in, out) stores its weight as (out, in); check the order of its arguments.")
    return hints


def module_gradients(trial: Any, case: Case, names: Sequence[str] = ("x",), state: bool = False,
                     what: dict[str, str] | None = None) -> None:
    """Backpropagating from a module item's output reaches the inputs ``names`` and
    every parameter (non-zero gradients). The module keeps its own initialisation
    unless ``state``. ``what`` renames inputs in messages."""
    inputs = case.make(trial.device)
    if not state:
        inputs["state"] = None
    out = _gradients(trial, inputs, case.label, names)
    grads = {**{(what or {}).get(n, n): g for n, g in (out.get("grads") or {}).items()},
             **(out.get("params") or {})}
    for name, g in grads.items():
        _require_gradient(case.label, name, g)


def padding(lengths: Sequence[int], T: int, device: torch.device) -> Tensor:
    """A padding mask ``(B, 1, T)``: True at the first ``lengths[b]`` positions of row b."""
    return (torch.arange(T, device=device)[None, :] < torch.tensor(lengths, device=device)[:, None])[:, None, :]


def padding_no_leak(case: Case, lengths: Sequence[int], key: str = "x") -> Callable[[Any], None]:
    """Sub-check body: other vectors at the padded positions of input ``key`` (B, T, d)
    leave the outputs (B, T, d) at real positions unchanged (all outputs unless ``key`` is
    ``"x"``, the sequence the outputs are aligned with)."""

    def run(trial: Any) -> None:
        before = trial.student(case.make(trial.device), case.label)
        changed = case.make(trial.device)
        T = changed[key].size(1)
        pad = ~padding(lengths, T, trial.device)[:, 0, :, None]
        noise = 5.0 * randn(changed[key].shape, 998, changed[key].dtype, trial.device)
        changed[key] = torch.where(pad, noise, changed[key])
        after = trial.student(changed, case.label)
        if key == "x":
            keep = padding(lengths, before.size(1), trial.device)[:, 0, :]
            before, after = before[keep], after[keep]
        if describe_difference(before.detach(), after.detach()) is not None:
            raise CheckFailed(f"On {case.label}: changing the padded positions of `{key}` changed the outputs at "
                              "real positions, so padding leaks in: pass the mask to the attention.")

    return run


def no_future_leak(case: Case, hint: str, key: str = "x") -> Callable[[Any], None]:
    """Sub-check body: new random vectors at the last two positions of input ``key``
    (B, T, d) leave the outputs (B, T, d) at earlier positions unchanged."""

    def run(trial: Any) -> None:
        before = trial.student(case.make(trial.device), case.label)
        changed = case.make(trial.device)
        x = changed[key].clone()
        x[:, -2:] = 3.0 * randn(x[:, -2:].shape, 999, x.dtype, x.device)  # new tokens, not a constant shift
        changed[key] = x
        after = trial.student(changed, case.label)
        if describe_difference(before[:, :-2].detach(), after[:, :-2].detach()) is not None:
            raise CheckFailed(f"On {case.label}: changing the last two target positions changed the outputs at "
                              f"earlier positions: {hint}")

    return run


def variant(layout: type, name: str, **options: Any) -> type:
    """A catalogued wrong module: a subclass of ``layout`` (the contract's constructor and
    parameters, and ``run(*inputs, **options)``, the computation with its ways of going
    wrong) whose ``forward(*inputs)`` is ``run(*inputs, **options)``."""

    def forward(self: Any, *inputs: Any) -> Any:
        return self.run(*inputs, **options)

    return type(name, (layout,), {"forward": forward, "__module__": layout.__module__, "__qualname__": name})


def ignored_get_no_gradient(case: Case, ignored: Callable[[dict], Tensor],
                            what: str = "ignored positions") -> Callable[[Any], None]:
    """Sub-check body for a loss of ``logits`` (..., K): it is a scalar connected to the
    logits, whose gradient is finite and exactly 0 at the positions ``ignored(inputs)``
    (a boolean tensor over the logits' leading axes), named ``what`` in the message."""

    def run(trial: Any) -> None:
        inputs = case.make(trial.device)
        out = trial.student(inputs, case.label, probe=Probe("gradients", {"names": ["logits"], "index": None,
                                                                           "reduce": "sum"}))
        out = out if isinstance(out, dict) else {}
        loss = out.get("output")
        if not out.get("connected") or not isinstance(loss, Tensor) or loss.dim() != 0:
            raise CheckFailed(f"On {case.label}: return a scalar tensor connected to the logits "
                              "(no .item(), no .detach()).")
        g = (out.get("grads") or {}).get("logits")
        if (not isinstance(g, Tensor) or tuple(g.shape) != tuple(inputs["logits"].shape)
                or not bool(torch.isfinite(g).all())):
            raise CheckFailed(f"On {case.label}: the logits get no finite gradient.")
        if bool((g.cpu()[ignored(inputs).cpu()] != 0).any()):
            raise CheckFailed(f"On {case.label}: {what} get a gradient; they must not affect the loss.")

    return run


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, Tensor) or isinstance(b, Tensor):
        return isinstance(a, Tensor) and isinstance(b, Tensor) and a.shape == b.shape and torch.equal(a.cpu(), b.cpu())
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def reproducible(trial: Any, answer: Callable[[], Any], label: str, what: str, hint: str) -> None:
    """Property of a random item: ``answer()``, the student's answer to a call with a
    generator seeded alike each time, is the same twice (tensors exactly, inside tuples and
    lists too). Otherwise the item draws from the global random state, not ``generator``:
    ``hint`` says how to pass it on; ``what`` names the outputs ("tokens")."""
    if not _same(answer(), answer()):
        raise trial.failed(f"On {label}: two calls with generators seeded alike gave different {what}.", hint)
