"""Reusable building blocks for check specs: seeded inputs and attention properties.

Every property raises :class:`CheckFailed` with a student-facing message.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from .compare import describe_difference, fmt_num
from .runner import current_salt
from .spec import Case, CheckFailed

__all__ = [
    "seed", "generator", "randn", "dtype_name", "mask_words",
    "weights_sum_to_one", "masked_weights_zero", "masked_keys_ignored", "gradients_reach",
    "compare_cases", "reference_state", "module_inputs", "layout", "module_gradients",
]


def seed(value: int) -> int:
    """The seed to use for grading input ``value``: ``value`` itself in a notebook; when
    a submission is graded, mixed with that grading's secret salt, so that random
    inputs cannot be known (and answered) in advance."""
    salt = current_salt()
    if not salt:
        return value
    return (value * 1_000_003 + salt * 7_919) % (2**62)


def generator(value: int) -> torch.Generator:
    """A CPU generator seeded with :func:`seed` ``(value)``."""
    return torch.Generator().manual_seed(seed(value))


def randn(shape: Sequence[int], seed_value: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """Standard normal tensor from a private seeded generator (CPU, then moved)."""
    return torch.randn(*shape, generator=generator(seed_value), dtype=dtype).to(device)


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
    inputs["_grads"] = {"names": list(names), "index": index}
    out = trial.student(inputs, case.label, probe="gradients")
    if not isinstance(out, dict) or not out.get("connected"):
        raise CheckFailed(
            f"On {case.label}: the output is not connected to the inputs' autograd graph "
            "(did you use .detach(), .item(), numpy or torch.no_grad()?)."
        )
    grads = out.get("grads") or {}
    for name in names:
        g = grads.get(name)
        if not isinstance(g, Tensor):
            g = None
        if g is None or not bool(torch.isfinite(g).all()) or float(g.abs().sum()) == 0.0:
            state = "no gradient" if g is None else ("a non-finite gradient" if not bool(torch.isfinite(g).all()) else "a zero gradient")
            raise CheckFailed(f"On {case.label}: `{name}` gets {state} from the output.")


# ---------------------------------------------------------------------------
# Module items: the grader's hyper-parameters and weights, the student's class
# ---------------------------------------------------------------------------

def reference_state(cls: type, args: tuple, seed_value: int) -> dict[str, Tensor]:
    """The weights of ``cls(*args)`` initialised from :func:`seed` ``(seed_value)`` (grader
    side; the global random state is left as it was)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed(seed_value))
        module = cls(*args)
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def module_inputs(args: tuple, state: dict[str, Tensor] | None, device: torch.device, dtype: torch.dtype,
                  **inputs: Any) -> dict:
    """Inputs of a module item's call: construct ``impl(*args)``, load ``state`` (the
    reference's weights, computed by the grader), move to ``device``/``dtype``; the
    other keyword arguments are the forward's inputs."""
    return {"args": tuple(args), "state": state, "device": str(device), "dtype": dtype, **inputs}


def layout(trial: Any, args: tuple, attrs: Sequence[str] = (), kwargs: dict | None = None,
           values: bool = False, label: str = "") -> dict:
    """The student's module ``impl(*args, **kwargs)`` described by the ``layout`` probe
    (parameter shapes, submodule classes, ``attrs``; parameter values with ``values``)."""
    label = label or f"{trial.spec.name}{tuple(args)}"
    inputs = {"args": tuple(args), "kwargs": dict(kwargs or {}), "attrs": list(attrs), "values": values}
    out = trial.student(inputs, label, probe="layout")
    if not isinstance(out, dict) or not out.get("module"):
        raise CheckFailed(f"{label} should construct an nn.Module, got {out.get('type') if isinstance(out, dict) else out}.")
    return out


def module_gradients(trial: Any, case: Case, names: Sequence[str] = ("x",), state: bool = False,
                     what: dict[str, str] | None = None) -> None:
    """Backpropagating from a module item's output reaches the inputs ``names`` and
    every parameter (non-zero gradients). The module keeps its own initialisation
    unless ``state``. ``what`` renames inputs in messages."""
    inputs = case.make(trial.device)
    if not state:
        inputs["state"] = None
    inputs["_grads"] = {"names": list(names)}
    out = trial.student(inputs, case.label, probe="gradients")
    if not isinstance(out, dict) or not out.get("connected"):
        raise CheckFailed(f"On {case.label}: the output is not connected to the autograd graph "
                          "(did you use .detach(), .item() or torch.no_grad()?).")
    grads = {**{(what or {}).get(n, n): g for n, g in (out.get("grads") or {}).items()},
             **(out.get("params") or {})}
    for name, g in grads.items():
        if not isinstance(g, Tensor) or float(g.abs().sum()) == 0.0 or not bool(torch.isfinite(g).all()):
            raise CheckFailed(f"On {case.label}: `{name}` gets no (finite) gradient from the output.")
