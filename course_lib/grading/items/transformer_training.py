"""Check specs for notebook 06's training pieces: noam_lr (the warm-up schedule) and
label_smoothed_cross_entropy, with their mistake catalogues."""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F

from ... import optim as ref
from ..judge.properties import compare_cases, dtype_name, fresh, generator, ignored_get_no_gradient, randn
from ..judge.spec import Case, CheckFailed, ItemSpec, Mistake, SubCheck

f32, f64 = torch.float32, torch.float64

# ---------------------------------------------------------------------------
# noam_lr
# ---------------------------------------------------------------------------


def _noam(step, d_model, warmup, pick=min, exponent=-1.5, offset=0, scale=True):
    """The schedule d_model^-0.5 · pick(s^-0.5, s · warmup^exponent), s = step + offset."""
    s = step + offset
    rate = pick(s ** -0.5, s * warmup ** exponent)
    return d_model ** -0.5 * rate if scale else rate


NOAM_MISTAKES = (
    Mistake("max instead of min", partial(_noam, pick=max),
            "You take the max of the two branches: the rate is the *smaller* of step^-0.5 and step·warmup^-1.5 "
            "(it rises during warm-up, then decays)."),
    Mistake("peak not at the boundary", partial(_noam, exponent=-1.0),
            "The two branches do not meet at step = warmup, where the rate must peak: the warm-up branch is "
            "step · warmup^-1.5 (at step = warmup it equals warmup^-0.5)."),
    Mistake("one step late", partial(_noam, offset=1),
            "Your schedule is one step late (it uses step + 1): steps count from 1, and the peak is at step = warmup."),
    Mistake("no d_model factor", partial(_noam, scale=False), "The factor d_model^-0.5 is missing."),
)


def _noam_case(step: int, d_model: int, warmup: int) -> Case:
    where = "the boundary step = warmup" if step == warmup else ("during warm-up" if step < warmup else "after warm-up")
    return Case(f"step={step}, d_model={d_model}, warmup={warmup} ({where})",
                lambda device: {"step": step, "d_model": d_model, "warmup": warmup})


def _noam_float(trial) -> None:
    step = fresh(93, 1, 100000)  # (a step no notebook fixes: a float typed in for one step is not enough)
    got = trial.student({"step": step, "d_model": 512, "warmup": 4000}, f"step={step}, d_model=512, warmup=4000")
    if not isinstance(got, float):
        raise CheckFailed(f"noam_lr should return a Python float, got {type(got).__name__} "
                          "(use math.sqrt / ** on numbers, or float(...)).")


def _noam_peak(trial) -> None:
    d, w = 64, 50
    rates = [float(trial.student({"step": s, "d_model": d, "warmup": w}, f"step={s}")) for s in range(1, 3 * w)]
    peak = max(range(len(rates)), key=rates.__getitem__) + 1
    if peak != w:
        raise CheckFailed(f"With d_model={d}, warmup={w} the rate peaks at step {peak}; it should peak at step = warmup = {w}.")


def _noam_spec() -> ItemSpec:
    return ItemSpec(
        name="noam_lr", reference=ref.noam_lr, mistakes=NOAM_MISTAKES,
        subchecks=(
            SubCheck("values during warm-up, at the boundary and after it (d_model=512, warmup=4000), and at "
                     "fresh steps", 1,
                     lambda t: t.compare([_noam_case(1, 512, 4000), _noam_case(4000, 512, 4000),
                                          _noam_case(100000, 512, 4000), _noam_case(fresh(91, 2, 3999), 512, 4000),
                                          _noam_case(fresh(92, 4001, 99999), 512, 4000)])),
            SubCheck("returns a Python float", 1, _noam_float),
            SubCheck("other sizes: steps 1, warmup − 1, warmup, warmup + 1", 1,
                     compare_cases(*(_noam_case(s, 64, 10) for s in (1, 9, 10, 11, 500))), hidden=True),
            SubCheck("the rate peaks exactly at step = warmup", 1, _noam_peak, hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# label_smoothed_cross_entropy
# ---------------------------------------------------------------------------

def _uniform(logp, nll, ignore_index):
    return -logp.mean(-1)


def _without_pad_class(logp, nll, ignore_index):
    K = logp.size(-1)
    return -logp[..., [k for k in range(K) if k != ignore_index]].mean(-1) if 0 <= ignore_index < K else -logp.mean(-1)


def _smoothed(smooth=_uniform, over_all=False, smooth_ignored=False):
    """A wrong label-smoothed loss: the smoothing term ``smooth(logp, nll, ignore_index)`` (None: no
    smoothing), divided by every position (``over_all``) or kept at ignored positions."""

    def loss(logits, target, epsilon, ignore_index=-100):
        logp = torch.log_softmax(logits, -1)
        keep = target != ignore_index
        nll = -logp.gather(-1, torch.where(keep, target, torch.zeros_like(target)).unsqueeze(-1)).squeeze(-1)
        if smooth_ignored:
            kept = torch.where(keep, nll, torch.zeros_like(nll))
            return ((1 - epsilon) * kept + epsilon * smooth(logp, nll, ignore_index)).sum() / keep.sum()
        each = nll if smooth is None else (1 - epsilon) * nll + epsilon * smooth(logp, nll, ignore_index)
        return torch.where(keep, each, torch.zeros_like(each)).sum() / (keep.numel() if over_all else keep.sum())

    return loss


def _kl(spread="uniform"):
    """Label smoothing as a KL divergence to the smoothed target q (the Annotated Transformer's
    nn.KLDivLoss), which is the smoothed cross-entropy minus q's entropy: ``spread`` ε/K over every
    class ("uniform"), ε/(K−1) over the wrong ones ("others") or ε/(K−2) over the wrong ones but the
    padding class ("annotated")."""

    def loss(logits, target, epsilon, ignore_index=-100):
        logp = torch.log_softmax(logits, -1)
        K = logp.size(-1)
        keep = target != ignore_index
        safe = torch.where(keep, target, torch.zeros_like(target)).unsqueeze(-1)
        pad = 0 <= ignore_index < K
        off = {"uniform": epsilon / K, "others": epsilon / (K - 1),
               "annotated": epsilon / (K - 2 if pad else K - 1)}[spread]
        q = torch.full_like(logp, off)
        q.scatter_(-1, safe, (1 - epsilon + epsilon / K) if spread == "uniform" else 1 - epsilon)
        if spread == "annotated" and pad:
            q[..., ignore_index] = 0.0
        kl = torch.where(q > 0, q * (q.clamp_min(1e-30).log() - logp), torch.zeros_like(q)).sum(-1)
        return torch.where(keep, kl, torch.zeros_like(kl)).sum() / keep.sum()

    return loss


_KL_HINT = ("You compute the KL divergence to the smoothed target (nn.KLDivLoss, as in the Annotated Transformer), "
            "which is the cross-entropy minus the target's entropy, a constant that shifts the loss. The contract's "
            "loss is the cross-entropy with the smoothed target, as F.cross_entropy(label_smoothing=ε): "
            "(1 − ε)·(−log p_y) + ε · mean_k(−log p_k).")

LS_MISTAKES = (
    Mistake("smoothing on ignored positions", _smoothed(smooth_ignored=True),
            "Positions whose target is ignore_index still get the smoothing term ε·mean(−log p): the smoothed "
            "target spreads mass onto ignored positions. Drop those positions entirely (both terms)."),
    Mistake("mean over all positions", _smoothed(over_all=True),
            "You divide by the number of all positions; average over the positions whose target is not "
            "ignore_index only."),
    Mistake("ε spread over the other classes", _smoothed(lambda logp, nll, _: (-logp.sum(-1) - nll) / (logp.size(-1) - 1)),
            "The smoothing mass goes to the K − 1 wrong classes (ε/(K−1) each); as in PyTorch, spread ε "
            "uniformly over all K classes (ε/K each, the right one included): ε · mean_k(−log p_k)."),
    Mistake("padding class excluded from smoothing", _smoothed(_without_pad_class),
            "You keep the smoothing mass off the ignore_index class; PyTorch spreads ε/K over every class, "
            "the padding class included (only the ignored *positions* are dropped)."),
    Mistake("no smoothing", _smoothed(None),
            "epsilon has no effect: the loss is (1 − ε)·(−log p_y) + ε · mean_k(−log p_k)."),
    Mistake("ε times the sum", _smoothed(lambda logp, nll, _: -logp.sum(-1)),
            "The smoothing term uses the sum of −log p_k over the classes; it is the mean (ε/K for each class)."),
    Mistake("KL divergence instead of cross-entropy", _kl("uniform"), _KL_HINT),
    Mistake("KL divergence, ε over the other classes", _kl("others"),
            _KL_HINT + " Spread ε over all K classes (ε/K each), not over the K − 1 wrong ones."),
    Mistake("KL divergence, the Annotated Transformer's target", _kl("annotated"),
            _KL_HINT + " Spread ε over all K classes (ε/K each): not ε/(K − 2) over the wrong classes but the "
            "padding one, and the padding class keeps its share."),
)


def _ls_case(shape: tuple, K: int, epsilon: float, ignore_index: int | None, dtype: torch.dtype, seed: int) -> Case:
    def make(device):
        logits = randn((*shape, K), seed, dtype, device) * 2
        g = generator(seed + 1)
        target = torch.randint(0, K, shape, generator=g)
        drop = torch.rand(shape, generator=g) < 0.3
        drop.view(-1)[0] = True
        drop.view(-1)[-1] = False
        kw = {"logits": logits, "epsilon": epsilon}
        if ignore_index is None:
            target = torch.where(drop, torch.full_like(target, -100), target)
        else:
            target = torch.where(target == ignore_index, (target + 1) % K, target)
            target = torch.where(drop, torch.full_like(target, ignore_index), target)
            kw["ignore_index"] = ignore_index
        kw["target"] = target.to(device)
        return kw

    ig = "ignore_index=-100 (default)" if ignore_index is None else f"ignore_index={ignore_index} (a real class: padding)"
    return Case(f"logits {(*shape, K)} {dtype_name(dtype)}, epsilon={epsilon}, some targets ignored, {ig}", make)


def _ls_spec() -> ItemSpec:
    return ItemSpec(
        name="label_smoothed_cross_entropy", reference=ref.label_smoothed_cross_entropy, mistakes=LS_MISTAKES,
        forbidden={F.cross_entropy: "it calls torch.nn.functional.cross_entropy; compute the smoothed loss "
                                    "from log_softmax yourself"},
        subchecks=(
            SubCheck("matches F.cross_entropy(label_smoothing=0.1) on logits (2, 5, 7) with ignored targets", 1,
                     compare_cases(_ls_case((2, 5), 7, 0.1, None, f32, 700))),
            SubCheck("ignore_index = a real class (padding id 0)", 1,
                     compare_cases(_ls_case((3, 4), 9, 0.1, 0, f32, 710))),
            SubCheck("other shapes and epsilons (0, 0.25, 1), float64, ignore_index 3", 1,
                     compare_cases(_ls_case((6,), 5, 0.0, None, f64, 720), _ls_case((2, 3, 4), 11, 0.25, 3, f64, 730),
                                   _ls_case((4, 6), 8, 1.0, 0, f32, 740)), hidden=True),
            SubCheck("a scalar with gradients to the logits; none at ignored positions", 1,
                     ignored_get_no_gradient(_ls_case((3, 4), 6, 0.1, 0, f64, 790), lambda inputs: inputs["target"] == 0),
                     hidden=True),
        ),
    )


SPECS = {spec.name: spec for spec in (_noam_spec(), _ls_spec())}
