"""Plots used by the notebooks: attention heatmaps, masks and cost curves.

Every function draws on a matplotlib ``Axes`` (created if not given) and returns it,
so that a notebook can arrange several plots in one figure.
"""

from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.ticker import MaxNLocator

__all__ = ["attention_heatmap", "mask_image", "cost_curves", "cost_comparison", "to_numpy",
           "gradient_norms_vs_distance", "per_position_accuracy", "accuracy_vs_length", "alignment_heatmap",
           "recurrence_timing", "show_image", "attention_over_image", "mask_outline", "similarity_grid"]


def to_numpy(x) -> np.ndarray:
    """Tensor (any device, with or without grad) or array -> NumPy array."""
    if isinstance(x, torch.Tensor):
        return x.detach().float().cpu().numpy()
    return np.asarray(x)


def attention_heatmap(
    weights,
    query_labels: Sequence[str] | None = None,
    key_labels: Sequence[str] | None = None,
    ax: Axes | None = None,
    title: str = "attention weights",
    colorbar: bool = True,
    vmax: float | None = 1.0,
) -> Axes:
    """Heatmap of a ``(T_q, T_k)`` weight matrix: rows are queries, columns keys."""
    w = to_numpy(weights)
    if w.ndim != 2:
        raise ValueError(f"expected a (T_q, T_k) matrix, got shape {w.shape}")
    ax = ax or plt.subplots(figsize=(0.45 * w.shape[1] + 2.5, 0.45 * w.shape[0] + 1.5))[1]
    image = ax.imshow(w, cmap="viridis", vmin=0.0, vmax=vmax, aspect="auto")
    if key_labels is not None:
        ax.set_xticks(range(len(key_labels)), key_labels, rotation=60, ha="right")
    if query_labels is not None:
        ax.set_yticks(range(len(query_labels)), query_labels)
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query (attending)")
    ax.set_title(title)
    if colorbar:
        ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="weight")
    return ax


def mask_image(mask, ax: Axes | None = None, title: str = "mask (True = may attend)") -> Axes:
    """Show a boolean ``(T_q, T_k)`` mask: white = may attend, dark = blocked."""
    m = to_numpy(mask).astype(float)
    if m.ndim != 2:
        raise ValueError(f"expected a (T_q, T_k) mask, got shape {m.shape}")
    ax = ax or plt.subplots(figsize=(3, 3))[1]
    ax.imshow(m, cmap="gray", vmin=0, vmax=1)
    ax.set_xlabel("key position")
    ax.set_ylabel("query position")
    ax.set_title(title)
    return ax


def cost_curves(lengths: Sequence[int], seconds: Sequence[float], weight_bytes: Sequence[int],
                axes: Sequence[Axes] | None = None, last: int = 3) -> Sequence[Axes]:
    """Log-log time and memory of attention against sequence length, each with its measured
    slope over the ``last`` longest lengths and a T² guide fitted to those points by least
    squares in log-log (one noisy point, the longest run on a busy machine, cannot tilt it)."""
    from .cost import loglog_slope

    if axes is None:
        axes = plt.subplots(1, 2, figsize=(10, 3.6))[1]
    t = np.asarray(lengths, dtype=float)
    k = min(last, len(t))
    for ax, values, label, what in ((axes[0], np.asarray(seconds) * 1e3, "time per forward pass (ms)", "time"),
                                    (axes[1], np.asarray(weight_bytes) / 2**20, "memory of the weights (MiB)",
                                     "memory")):
        slope = loglog_slope(t, values, k) if len(t) >= 2 else float("nan")
        ax.loglog(t, values, "o-", label=f"measured (slope {slope:.2f})")
        scale = np.exp(np.mean(np.log(values[-k:]) - 2 * np.log(t[-k:])))  # the best T² line through them
        ax.loglog(t, scale * t ** 2, "--", color="gray", label="∝ T²")
        ax.set_xlabel("sequence length T")
        ax.set_ylabel(label)
        ax.set_title(f"{what}: slope {slope:.2f} over the {k} longest (2 is ∝ T²)")
        ax.legend()
        ax.grid(True, which="both", alpha=0.3)
    return axes


def cost_comparison(results: dict[str, dict[str, list]], axes: Sequence[Axes] | None = None,
                    last: int = 3) -> Sequence[Axes]:
    """Log-log time and largest tensor against T for several attention methods (the output
    of ``course_lib.cost.compare_attention``), each labelled with its fitted slope over
    its ``last`` longest lengths."""
    from .cost import loglog_slope

    if axes is None:
        axes = plt.subplots(1, 2, figsize=(11, 4))[1]
    for name, r in results.items():
        for ax, key, scale in ((axes[0], "seconds", 1e3), (axes[1], "largest_bytes", 2.0**-20)):
            values = np.asarray(r[key], dtype=float) * scale
            slope = loglog_slope(r["T"], values, last) if len(values) >= 2 else float("nan")
            ax.loglog(r["T"], values, "o-", label=f"{name} (slope {slope:.1f})")
    lengths = sorted({T for r in results.values() for T in r["T"]})
    for ax, label, title in ((axes[0], "time per call (ms)", "time"),
                             (axes[1], "largest tensor created (MiB)", "memory")):
        ax.set_xticks(lengths, [str(T) for T in lengths])
        ax.xaxis.set_minor_formatter(plt.NullFormatter())
        ax.set_xlabel("sequence length T")
        ax.set_ylabel(label)
        ax.set_title(f"{title}: slope 2 is quadratic, 1 is linear")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    return axes


# ---------------------------------------------------------------------------
# Recurrent networks (notebooks 01-02)
# ---------------------------------------------------------------------------

def gradient_norms_vs_distance(curves: dict[str, Sequence[float]], ax: Axes | None = None,
                               title: str = "how much h_T still depends on h_t") -> Axes:
    """Log plot of ``‖∂h_T/∂h_t‖_F`` against the distance ``T - t``, one curve per label.

    Each value list is ordered ``t = 1..T`` (as returned by ``jacobian_norms``).
    """
    ax = ax or plt.subplots(figsize=(6, 3.6))[1]
    for label, norms in curves.items():
        n = to_numpy(norms)
        distance = np.arange(len(n))[::-1]
        ax.semilogy(distance, np.maximum(n, 1e-300), "o-", ms=3, label=label)
    ax.set_xlabel("distance T − t (steps back in time)")
    ax.set_ylabel("‖∂h_T / ∂h_t‖_F (log scale)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return ax


def per_position_accuracy(curves: dict[str, Sequence[float]], ax: Axes | None = None,
                          title: str = "accuracy at each output position",
                          ylabel: str = "token accuracy") -> Axes:
    """Accuracy at each output position (1-based on the x axis), one curve per label."""
    ax = ax or plt.subplots(figsize=(6, 3.6))[1]
    for label, acc in curves.items():
        a = to_numpy(acc)
        ax.plot(np.arange(1, len(a) + 1), a, "o-", ms=4, label=label)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return _accuracy_axes(ax, "output position", ylabel, title)


def accuracy_vs_length(curves: dict[str, tuple[Sequence[float], Sequence[float]]], ax: Axes | None = None,
                       title: str = "accuracy against input length", xlabel: str = "input length (tokens)",
                       ylabel: str = "exact match") -> Axes:
    """Accuracy against input length: ``curves[label] = (lengths, accuracies)``."""
    ax = ax or plt.subplots(figsize=(6, 3.6))[1]
    for label, (lengths, acc) in curves.items():
        ax.plot(to_numpy(lengths), to_numpy(acc), "o-", ms=4, label=label)
    return _accuracy_axes(ax, xlabel, ylabel, title)


def _accuracy_axes(ax: Axes, xlabel: str, ylabel: str, title: str) -> Axes:
    """Labels, a [0, 1] y axis, a light grid and the legend of an accuracy plot."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    return ax


def alignment_heatmap(weights, output_tokens: Sequence[str], input_tokens: Sequence[str], ax: Axes | None = None,
                      title: str = "alignment α_ti") -> Axes:
    """Heatmap of decoder attention ``(T_out, T_in)``: one row per output token, one column
    per input token, both axes labelled with the tokens (spaces shown as '␣')."""
    w = to_numpy(weights)
    if w.shape != (len(output_tokens), len(input_tokens)):
        raise ValueError(f"weights {w.shape} do not match {len(output_tokens)} output and "
                         f"{len(input_tokens)} input tokens")
    shown = [t if t.strip() else "␣" for t in input_tokens]
    ax = attention_heatmap(w, list(output_tokens), shown, ax=ax, title=title)
    ax.set_xticks(range(len(shown)), shown, rotation=0, ha="center")
    ax.set_xlabel("input (encoder position i)")
    ax.set_ylabel("output (decoder step t)")
    return ax


def recurrence_timing(lengths: Sequence[int], sequential: Sequence[float], parallel: Sequence[float],
                      ax: Axes | None = None) -> Axes:
    """Wall time of the sequential RNN loop and of one batched product against length."""
    ax = ax or plt.subplots(figsize=(6, 3.6))[1]
    t = np.asarray(lengths, dtype=float)
    ax.loglog(t, np.asarray(sequential) * 1e3, "o-", label="RNN: loop over T steps")
    ax.loglog(t, np.asarray(parallel) * 1e3, "o-", label="all positions in one matrix product")
    ax.set_xlabel("sequence length T")
    ax.set_ylabel("wall time (ms)")
    ax.set_title("recurrence is sequential")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return ax


# ---------------------------------------------------------------------------
# Images (notebook 10)
# ---------------------------------------------------------------------------

def _hwc(image) -> np.ndarray:
    """An image ``(C, H, W)`` (tensor or array, values in [0, 1]) as ``(H, W, C)`` for imshow."""
    x = to_numpy(image)
    return np.clip(np.transpose(x, (1, 2, 0)) if x.ndim == 3 else x, 0, 1)


def show_image(image, ax: Axes | None = None, title: str = "", fontsize: int = 8) -> Axes:
    """An RGB image ``(3, H, W)`` without axes, with an optional title."""
    ax = ax or plt.subplots(figsize=(2, 2))[1]
    ax.imshow(_hwc(image), interpolation="nearest")
    ax.set_title(title, fontsize=fontsize)
    ax.axis("off")
    return ax


def attention_over_image(image, weights, ax: Axes | None = None, title: str = "", strength: float = 0.6,
                         fontsize: int = 8, cmap: str = "inferno", uniform_times: float = 4.0) -> Axes:
    """An attention map ``weights`` (a ``(H', W')`` grid, or ``(L,)`` for a square grid) over the
    image ``(3, H, W)``: the map is upsampled smoothly to the image's size and divided by its
    largest weight, or by ``uniform_times`` the uniform weight 1/L when that is larger (so that a
    flat map stays dim instead of lighting everything); the image is dimmed by ``strength`` where
    the map is low, and the map is laid on top as a glow of ``cmap`` colours, opaque where the
    weight is high (as in Xu et al.'s figures, where the attended part is lit)."""
    ax = ax or plt.subplots(figsize=(2, 2))[1]
    img = _hwc(image)
    H, W = img.shape[:2]
    w = torch.as_tensor(to_numpy(weights), dtype=torch.float32)
    if w.dim() == 1:
        side = int(round(w.numel() ** 0.5))
        w = w.reshape(side, side)
    up = torch.nn.functional.interpolate(w[None, None], size=(H, W), mode="bilinear", align_corners=False)[0, 0]
    up = (up / max(float(up.max()), uniform_times / w.numel(), 1e-12)).clamp(0, 1).numpy()
    ax.imshow(img * ((1 - strength) + strength * up)[..., None], interpolation="bilinear")
    glow = plt.get_cmap(cmap)(up)
    glow[..., 3] = 0.55 * up ** 1.5
    ax.imshow(glow, interpolation="bilinear")
    ax.set_title(title, fontsize=fontsize)
    ax.axis("off")
    return ax


def mask_outline(mask, ax: Axes, color: str = "white", linewidth: float = 1.0) -> Axes:
    """Draw the outline of a boolean pixel mask ``(H, W)`` on ``ax`` (over an image)."""
    m = to_numpy(mask).astype(float)
    if m.any():
        ax.contour(m, levels=[0.5], colors=[color], linewidths=linewidth)
    return ax


def similarity_grid(similarity, ax: Axes | None = None, title: str = "cosine similarity of position embeddings"
                    ) -> Axes:
    """The ViT paper's figure: ``similarity (gh, gw, gh, gw)``, one small map per patch laid out on
    the grid (the map at row r, column c is patch (r, c)'s similarity with every patch), drawn as
    one mosaic with gaps between the maps."""
    sim = to_numpy(similarity)
    gh, gw = sim.shape[:2]
    mosaic = np.full((gh * (gh + 1) - 1, gw * (gw + 1) - 1), np.nan)
    for r in range(gh):
        for c in range(gw):
            mosaic[r * (gh + 1):r * (gh + 1) + gh, c * (gw + 1):c * (gw + 1) + gw] = sim[r, c]
    ax = ax or plt.subplots(figsize=(4, 4))[1]
    image = ax.imshow(mosaic, vmin=-1, vmax=1, cmap="viridis", interpolation="nearest")
    ax.set_xticks([c * (gw + 1) + (gw - 1) / 2 for c in range(gw)], [str(c) for c in range(gw)])
    ax.set_yticks([r * (gh + 1) + (gh - 1) / 2 for r in range(gh)], [str(r) for r in range(gh)])
    ax.set_xlabel("patch column")
    ax.set_ylabel("patch row")
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="cosine similarity")
    ax.set_title(title, fontsize=10)
    return ax
