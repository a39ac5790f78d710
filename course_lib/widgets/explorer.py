"""The attention explorer: look at attention weights while changing the mask and the
temperature live.

The logic is plain functions (``build_mask``, ``apply_temperature``) and a small
class whose state (``explorer.weights``, ``explorer.mask``) can be read in tests
without a browser; the widgets only set that state.

``attend(mask)`` is any callable that runs a model on fixed inputs with a boolean
``(T, T)`` mask (or ``None``) and returns its attention weights ``(..., T, T)``;
leading axes (batch, heads) are reduced by taking index 0.
"""

from __future__ import annotations

import io
import time
from typing import Callable, Sequence

import ipywidgets as widgets
import matplotlib.pyplot as plt
import numpy as np
import torch
from torch import Tensor

from ..attention import causal_mask, sliding_window_mask
from ..plotting import to_numpy

__all__ = ["MASK_MODES", "build_mask", "apply_temperature", "AttentionExplorer"]

MASK_MODES = ("none", "causal", "padding", "sliding window")


def build_mask(mode: str, T: int, length: int | None = None, window: int | None = None) -> Tensor | None:
    """Boolean ``(T, T)`` mask for an explorer mask mode (True = may attend), or None.

    - ``"none"``: no mask;
    - ``"causal"``: query i sees keys 0..i;
    - ``"padding"``: every query sees only the first ``length`` keys (the rest is padding);
    - ``"sliding window"``: causal, and query i sees only the last ``window`` keys up to i.
    """
    if mode == "none":
        return None
    if mode == "causal":
        return causal_mask(T)
    if mode == "padding":
        if length is None or not 1 <= length <= T:
            raise ValueError(f"padding needs 1 <= length <= {T}, got {length}")
        return (torch.arange(T) < length).expand(T, T).clone()
    if mode == "sliding window":
        if window is None or window < 1:
            raise ValueError(f"sliding window needs a width >= 1, got {window}")
        return sliding_window_mask(T, window)
    raise ValueError(f"unknown mask mode {mode!r}; choose one of {MASK_MODES}")


def apply_temperature(weights: Tensor, temperature: float) -> Tensor:
    """Re-weight softmax outputs as if the logits had been divided by ``temperature``.

    ``softmax(s / τ) = normalize(softmax(s) ** (1 / τ))`` over the last axis, so this is
    exact for any model's weights; masked entries (0) stay 0.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    if temperature == 1.0:
        return weights
    w = weights.double().clamp_min(0) ** (1.0 / temperature)
    w = w / w.sum(dim=-1, keepdim=True).clamp_min(1e-300)
    return w.to(weights.dtype)


class AttentionExplorer:
    """Heatmap of one head's attention with live mask and temperature controls.

    ``AttentionExplorer(tokens, attend)`` then display it (it is the cell's last
    expression). State for tests: ``weights`` (NumPy ``(T, T)``, what is plotted),
    ``mask``, ``png`` (the rendered image) and ``last_update_seconds``.
    """

    def __init__(self, tokens: Sequence[str], attend: Callable[[Tensor | None], Tensor],
                 title: str = "attention") -> None:
        self.tokens = list(tokens)
        self.attend = attend
        self.title = title
        T = len(self.tokens)
        style = {"description_width": "initial"}
        self.mode = widgets.Dropdown(options=MASK_MODES, value="none", description="mask", style=style)
        self.length = widgets.IntSlider(value=T, min=1, max=T, description="length (padding)", style=style)
        self.window = widgets.IntSlider(value=min(3, T), min=1, max=T, description="window width", style=style)
        self.temperature = widgets.FloatLogSlider(value=1.0, base=10, min=-1, max=1, step=0.05,
                                                  description="temperature", style=style)
        self.output = widgets.Output()
        self.fig, self.ax = plt.subplots(figsize=(0.42 * T + 3, 0.42 * T + 1.6))
        plt.close(self.fig)  # shown through the Output widget only
        self.image = self.ax.imshow(np.zeros((T, T)), cmap="viridis", vmin=0, vmax=1, aspect="auto")
        self.ax.set_xticks(range(T), self.tokens, rotation=60, ha="right")
        self.ax.set_yticks(range(T), self.tokens)
        self.ax.set_xlabel("key (attended to)")
        self.ax.set_ylabel("query (attending)")
        self.fig.colorbar(self.image, ax=self.ax, fraction=0.046, pad=0.04, label="weight")
        self.fig.tight_layout()
        self.weights = np.zeros((T, T))
        self.mask: Tensor | None = None
        self.last_update_seconds = 0.0
        for control in (self.mode, self.length, self.window, self.temperature):
            control.observe(lambda change: self.update(), names="value")
        self.update()

    @property
    def widget(self) -> widgets.Widget:
        controls = widgets.HBox([self.mode, self.length, self.window, self.temperature])
        return widgets.VBox([controls, self.output])

    def update(self) -> None:
        """Recompute the weights for the current controls and redraw."""
        start = time.perf_counter()
        T = len(self.tokens)
        self.length.disabled = self.mode.value != "padding"
        self.window.disabled = self.mode.value != "sliding window"
        self.mask = build_mask(self.mode.value, T, self.length.value, self.window.value)
        with torch.no_grad():
            w = self.attend(self.mask)
        while w.dim() > 2:
            w = w[0]
        w = apply_temperature(w, float(self.temperature.value))
        self.weights = to_numpy(w)
        self.image.set_data(self.weights)
        self.ax.set_title(f"{self.title} — mask: {self.mode.value}, temperature {self.temperature.value:.2g}")
        self.png = self._render_png()
        self._show()
        self.last_update_seconds = time.perf_counter() - start

    def _render_png(self) -> bytes:
        buffer = io.BytesIO()
        self.fig.savefig(buffer, format="png", dpi=80)
        return buffer.getvalue()

    def _show(self) -> None:
        try:
            from IPython import get_ipython
            from IPython.display import Image, clear_output, display
        except ImportError:  # pragma: no cover - IPython is a dependency of ipywidgets
            return
        if get_ipython() is None:
            return
        with self.output:
            clear_output(wait=True)
            display(Image(data=self.png, format="png"))

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)
