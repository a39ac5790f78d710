"""Reusable building blocks for check specs: seeded inputs and attention properties.

Every property raises :class:`CheckFailed` with a student-facing message.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from .compare import describe_difference, fmt_num
from .runner import unwatched
from .spec import Case, CheckFailed

__all__ = [
    "randn", "dtype_name", "mask_words",
    "weights_sum_to_one", "masked_weights_zero", "masked_keys_ignored", "gradients_reach",
    "compare_cases", "module_invoke",
]


def randn(shape: Sequence[int], seed: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """Standard normal tensor from a private seeded generator (CPU, then moved)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype).to(device)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def mask_words(mask: Tensor | None) -> str:
    """Describe a mask for a message: 'no mask', 'causal mask (5, 5)', ..."""
    if mask is None:
        return "no mask"
    shape = tuple(mask.shape)
    if mask.dim() >= 2 and mask.shape[-1] == mask.shape[-2] and bool((mask == torch.ones_like(mask).tril()).all()):
        return f"causal mask {shape}"
    return f"padding mask {shape}"


def compare_cases(*cases: Case) -> Callable[[Any], None]:
    """A sub-check body that compares the student with the reference on ``cases``."""
    return lambda trial: trial.compare(cases)


def _weights(out: Any, index: int | None) -> Tensor:
    w = out[index] if index is not None else out
    if not isinstance(w, Tensor):
        raise CheckFailed(f"expected the attention weights as a tensor, got {type(w).__name__}")
    return w


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
    w = _weights(trial.student(inputs, case.label), index).detach()
    blocked = ~mask.expand_as(w)
    if bool((w[blocked] != 0).any()):
        worst = w[blocked].abs().max().item()
        hint = ""
        allowed = w[~blocked]
        if bool((allowed == 0).all()):
            hint = " All weight goes to the masked keys: is the mask inverted? True means 'may attend'."
        else:
            hint = (" Fill the masked scores with -inf (float('-inf')) before the softmax, "
                    "so that exp gives exactly 0.")
        raise CheckFailed(
            f"On {case.label}: masked positions have weight up to {fmt_num(worst)}, expected exactly 0.{hint}"
        )


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


def gradients_reach(trial: Any, case: Case, names: Sequence[str], index: int | None = 0) -> None:
    """Backpropagating from the output gives finite, non-zero gradients for ``names``."""
    inputs = case.make(trial.device)
    for name in names:
        inputs[name] = inputs[name].detach().requires_grad_(True)
    out = trial.student(inputs, case.label)
    y = out[index] if index is not None else out
    if not isinstance(y, Tensor) or not y.requires_grad:
        raise CheckFailed(
            f"On {case.label}: the output is not connected to the inputs' autograd graph "
            "(did you use .detach(), .item(), numpy or torch.no_grad()?)."
        )
    (y.float() ** 2).sum().backward()
    for name in names:
        g = inputs[name].grad
        if g is None or not bool(torch.isfinite(g).all()) or float(g.abs().sum()) == 0.0:
            state = "no gradient" if g is None else ("a non-finite gradient" if not bool(torch.isfinite(g).all()) else "a zero gradient")
            raise CheckFailed(f"On {case.label}: `{name}` gets {state} from the output.")


def module_invoke(build: Callable[[Any], torch.nn.Module], call: Callable[[torch.nn.Module, dict], Any],
                  state_from: Callable[[], torch.nn.Module]) -> Callable[[Any, dict], Any]:
    """``invoke`` for an ``nn.Module`` item.

    ``build(cls)`` constructs the implementation; its parameters are then loaded from
    ``state_from()`` (a seeded reference instance) so that every implementation runs
    with the same weights; ``call(module, inputs)`` runs it.
    """

    def invoke(impl: Any, inputs: dict) -> Any:
        module = build(impl)
        with unwatched():
            reference_state = state_from().state_dict()
        own = module.state_dict()
        missing = [k for k in reference_state if k not in own]
        if missing:
            have = ", ".join(f"{k} {tuple(v.shape)}" for k, v in own.items()) or "none"
            raise CheckFailed(f"expected parameters {', '.join(missing)}; your module has: {have}.")
        for key, value in reference_state.items():
            if own[key].shape != value.shape:
                raise CheckFailed(
                    f"parameter `{key}` has shape {tuple(own[key].shape)}, expected {tuple(value.shape)}."
                )
        module.load_state_dict(reference_state, strict=False)
        device, dtype = inputs.pop("_device"), inputs.pop("_dtype")
        module = module.to(device=device, dtype=dtype)
        return call(module, inputs)

    return invoke


def module_gradients_reach(trial: Any, case: Case) -> None:
    """A module item built from ``case`` inputs ``{"dims", "x", "mask"}`` (float64):
    backpropagating from its output reaches ``x`` and every parameter."""
    inputs = case.make(trial.device)
    x = inputs["x"].requires_grad_(True)

    def run():
        module = trial.impl(*inputs["dims"]).to(device=trial.device, dtype=torch.float64)
        out = module(x, inputs["mask"])
        y = out[0] if isinstance(out, tuple) else out
        y.pow(2).sum().backward()
        return module

    module = trial.guarded(run, case.label)
    for name, p in (("x", x), *module.named_parameters()):
        if p.grad is None or float(p.grad.abs().sum()) == 0.0:
            raise CheckFailed(f"On {case.label}: `{name}` gets no gradient from the output.")
