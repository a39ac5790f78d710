"""The attention explorer: look at attention weights while changing the mask, the
temperature and the heads live.

Two ways to feed it:

- ``AttentionExplorer(tokens, attend)``: ``attend(mask)`` is any callable that runs a model
  on fixed inputs with a boolean ``(T, T)`` mask (or ``None``) and returns its attention
  weights ``(..., T, T)`` (one layer; a head axis before ``(T, T)`` is kept, a batch axis
  before that reduced by taking index 0). The temperature is applied to these weights.
- ``AttentionExplorer(tokens, ModelSource(model, run, describe))``: a whole model. The
  explorer finds its attention modules (course_lib's or a student's: anything with a
  ``w_q`` (or ``W_q``) projection that returns ``(output, weights)``), records their weights with forward
  hooks, divides every attention logit by the temperature *inside* the model (by scaling
  the queries), switches heads off (``ablate_heads``), and shows the model's prediction
  (``describe(output)``), which changes with the mask, the temperature and the ablations.

Mask modes (``MASK_MODES``): ``"none"``, ``"causal"``, ``"padding"`` (length slider),
``"sliding window"`` (width slider), ``"dilated window"`` (width and dilation sliders) and
``"window + global"`` (sliding window plus Longformer's global tokens, typed as positions,
e.g. ``"0, 5"``). The three window modes are causal unless the "causal window" box is
unticked; controls that do not apply to the chosen mode are hidden (and disabled), and so are
the layer and head selectors when there is only one to choose.

Usage (the explorer is the cell's last expression; the controls can also be set in code)::

    from course_lib.widgets import AttentionExplorer

    explorer = AttentionExplorer(tokens, lambda mask: head(x, mask)[1], title="local attention")
    explorer.mode.value = "dilated window"       # width: explorer.window, dilation: explorer.dilation
    explorer.window.value, explorer.dilation.value = 3, 2
    explorer

    # later (the picture above follows), Longformer's pattern:
    explorer.mode.value = "window + global"      # sliding window (explorer.window) plus global tokens
    explorer.global_positions.value = "0, 8"     # positions, counted from 0
    explorer.causal.value = False                # Longformer's two-sided window

Patch tokens (notebook 10): ``AttentionExplorer(labels, source, image=image, grid=(gh, gw))``,
the labels being the tokens' names (``"[CLS]"``, then patch coordinates ``"r,c"``), shows beside
the heatmap the map of one query token (``explorer.query``, [CLS] by default) over the image:
the selected head's weights on the last ``gh·gw`` keys (the patches), laid out on the grid (the
mean of the heads when all heads are shown); ``explorer.image_map`` holds it.

The logic is plain functions and small classes whose state (``explorer.weights``,
``explorer.prediction``, ``explorer.mask``, ``explorer.png``, ``explorer.error``) can be
read in tests without a browser; the widgets only set that state. Everything renders to
PNG inside an ``ipywidgets.Output``, so nothing is fetched from the network (works offline
in JupyterLab 4).
"""

from __future__ import annotations

import contextlib
import html
import io
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import ipywidgets as widgets
import matplotlib.pyplot as plt
import PIL.Image
import numpy as np
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from torch import Tensor, nn

from ..attention import causal_mask, sliding_window_mask
from ..efficient_attention import add_global_tokens, dilated_window_mask
from ..multihead import ablate_heads
from ..plotting import to_numpy

__all__ = [
    "MASK_MODES", "ALL_HEADS", "build_mask", "apply_temperature", "find_attention_modules",
    "capture_attention", "logit_temperature", "Snapshot", "ModelSource", "AttentionExplorer",
    "describe_tokens", "WINDOW_MODES", "parse_positions",
]

MASK_MODES = ("none", "causal", "padding", "sliding window", "dilated window", "window + global")
WINDOW_MODES = ("sliding window", "dilated window", "window + global")  # width slider, causal box
ALL_HEADS = "all heads"


def parse_positions(positions: str | int | Sequence[int] | Tensor, T: int) -> list[int]:
    """Global token positions as a sorted list of distinct ints in ``0 .. T-1``.

    Accepts a text such as ``"0, 5"`` (commas and/or spaces), an int, or a sequence of ints.
    A bad entry raises a ``ValueError`` that names it.
    """
    if isinstance(positions, Tensor):
        positions = positions.reshape(-1).tolist()
    if isinstance(positions, str):
        items: list[Any] = positions.replace(",", " ").split()
    elif isinstance(positions, (int, np.integer)):
        items = [positions]
    else:
        items = list(positions)
    if not items:
        raise ValueError(f"window + global needs at least one global position (0 .. {T - 1}), e.g. 0")
    found = set()
    for item in items:
        text = item.strip() if isinstance(item, str) else item
        if isinstance(text, bool):
            raise ValueError(f"global position {item!r} is not a whole number")
        if isinstance(text, str):
            try:
                text = int(text)
            except ValueError:
                raise ValueError(f"global position {item!r} is not a whole number (write e.g. 0, 5)") from None
        if not isinstance(text, (int, np.integer)):
            raise ValueError(f"global position {item!r} is not a whole number")
        if not 0 <= text < T:
            raise ValueError(f"global position {int(text)} is outside 0 .. {T - 1} (the sequence has {T} tokens)")
        found.add(int(text))
    return sorted(found)


def build_mask(mode: str, T: int, length: int | None = None, window: int | None = None,
               dilation: int | None = None, global_positions: str | Sequence[int] | None = None,
               causal: bool = True) -> Tensor | None:
    """Boolean ``(T, T)`` mask for an explorer mask mode (True = may attend), or None.

    - ``"none"``: no mask;
    - ``"causal"``: query i sees keys 0..i;
    - ``"padding"``: every query sees only the first ``length`` keys (the rest is padding);
    - ``"sliding window"``: causal, and query i sees only the last ``window`` keys up to i
      (``causal=False``: the keys with ``|i - j| < window``);
    - ``"dilated window"``: ``dilated_window_mask(T, window, dilation, causal)``, the keys at
      distances ``0, dilation, …, (window - 1)·dilation`` before i (both sides if not causal);
    - ``"window + global"``: ``add_global_tokens(sliding_window_mask(T, window, causal),
      global_positions)``, Longformer's pattern; positions as for :func:`parse_positions`.
    """
    if mode == "none":
        return None
    if mode == "causal":
        return causal_mask(T)
    if mode == "padding":
        if length is None or not 1 <= length <= T:
            raise ValueError(f"padding needs 1 <= length <= {T}, got {length}")
        return (torch.arange(T) < length).expand(T, T).clone()
    if mode in WINDOW_MODES:
        if window is None or window < 1:
            raise ValueError(f"{mode} needs a width >= 1, got {window}")
        if mode == "sliding window":
            return sliding_window_mask(T, window, causal=causal)
        if mode == "dilated window":
            if dilation is None or dilation < 1:
                raise ValueError(f"dilated window needs a dilation >= 1, got {dilation}")
            return dilated_window_mask(T, window, dilation, causal=causal)
        if global_positions is None:
            raise ValueError(f"window + global needs global positions (0 .. {T - 1}), e.g. [0]")
        return add_global_tokens(sliding_window_mask(T, window, causal=causal),
                                 parse_positions(global_positions, T))
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


# ---------------------------------------------------------------------------
# Looking inside a model
# ---------------------------------------------------------------------------

def _queries(module: nn.Module) -> nn.Module | None:
    """An attention module's query projection: ``w_q``, or ``W_q`` (notebook 11's names)."""
    found = getattr(module, "w_q", None)
    return found if isinstance(found, nn.Module) else getattr(module, "W_q", None)


def find_attention_modules(model: nn.Module) -> list[nn.Module]:
    """The model's attention layers, in order: ``model.attention_modules()`` if it has it,
    else every outermost submodule with a ``w_q`` projection (the course's convention)."""
    if hasattr(model, "attention_modules"):
        return list(model.attention_modules())
    found: list[tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        inside = any(name.startswith(outer + ".") for outer, _ in found if outer)
        if isinstance(_queries(module), nn.Module) and not inside:
            found.append((name, module))
    if not found:
        raise ValueError("no attention module found: expected submodules with a `w_q` projection")
    return [module for _, module in found]


@contextlib.contextmanager
def capture_attention(modules: Sequence[nn.Module]) -> Iterator[list[Tensor | None]]:
    """Record the weights each module returns (its output ``(out, weights)``) while in the block.

    Yields a list with one entry per module (the weights of its last call, ``None`` if it
    was not called); single-head weights ``(B, T_q, T_k)`` get a head axis ``(B, 1, T_q, T_k)``.
    """
    record: list[Tensor | None] = [None] * len(modules)
    handles = []
    for i, module in enumerate(modules):
        def hook(mod, args, output, i=i):
            if not isinstance(output, tuple) or len(output) < 2 or not isinstance(output[1], Tensor):
                raise TypeError(f"attention module {type(mod).__name__} must return (output, weights)")
            w = output[1].detach()
            record[i] = w.unsqueeze(1) if w.dim() == 3 else w
        handles.append(module.register_forward_hook(hook))
    try:
        yield record
    finally:
        for h in handles:
            h.remove()


@contextlib.contextmanager
def logit_temperature(modules: Sequence[nn.Module], temperature: float) -> Iterator[None]:
    """Divide the attention logits of ``modules`` by ``temperature`` inside the block.

    Attention logits are linear in the queries (``q·k``, ``q·(k + a)``, rotated ``q``...), so
    scaling the output of each module's ``w_q`` by ``1/τ`` divides every logit by ``τ``.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    handles = []
    if temperature != 1.0:
        for module in modules:
            w_q = _queries(module)
            if not isinstance(w_q, nn.Module):
                raise TypeError(f"{type(module).__name__} has no `w_q` projection to scale")
            handles.append(w_q.register_forward_hook(lambda mod, args, out: out / temperature))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


@contextlib.contextmanager
def _zero_output(module: nn.Module) -> Iterator[None]:
    """Single-head attention switched off: its output (not its weights) becomes 0."""
    handle = module.register_forward_hook(lambda mod, args, out: (torch.zeros_like(out[0]),) + tuple(out[1:]))
    try:
        yield
    finally:
        handle.remove()


@dataclass
class Snapshot:
    """What the explorer shows: per layer the weights ``(H, T_q, T_k)`` of one sequence, and
    the model's prediction in words (``None`` without a model)."""

    weights: list[Tensor]
    prediction: str | None = None


class ModelSource:
    """A model on fixed inputs, for the explorer.

    ``run(model, mask)`` runs the model (mask: boolean ``(T, T)`` or ``None``) and returns
    its output; ``describe(output)`` turns the output into a short text (HTML allowed),
    e.g. the predicted tokens and their accuracy. The first sequence of the batch is shown.
    """

    def __init__(self, model: nn.Module, run: Callable[[nn.Module, Tensor | None], Any],
                 describe: Callable[[Any], str] | None = None) -> None:
        self.model = model
        self.run = run
        self.describe = describe
        self.modules = find_attention_modules(model)

    def num_heads(self, layer: int) -> int:
        return int(getattr(self.modules[layer], "num_heads", 1))

    @property
    def num_layers(self) -> int:
        return len(self.modules)

    def __call__(self, mask: Tensor | None, temperature: float = 1.0,
                 ablated: dict[int, Sequence[int]] | None = None) -> Snapshot:
        was_training = self.model.training
        self.model.eval()
        with contextlib.ExitStack() as stack:
            for layer, heads in (ablated or {}).items():
                heads = sorted(heads)
                if not heads:
                    continue
                module = self.modules[layer]
                if self.num_heads(layer) == 1 and not (hasattr(module, "w_o") or hasattr(module, "W_o")):
                    stack.enter_context(_zero_output(module))
                else:
                    stack.enter_context(ablate_heads(module, heads))
            stack.enter_context(logit_temperature(self.modules, temperature))
            record = stack.enter_context(capture_attention(self.modules))
            with torch.no_grad():
                output = self.run(self.model, mask)
        self.model.train(was_training)
        missing = [i for i, w in enumerate(record) if w is None]
        if missing:
            raise RuntimeError(f"attention layers {missing} were not called by run(model, mask)")
        prediction = self.describe(output) if self.describe else None
        return Snapshot([w[0] for w in record], prediction)


class _CallableSource:
    """``attend(mask) -> weights (..., T, T)`` as a one-layer source (temperature applied after)."""

    def __init__(self, attend: Callable[[Tensor | None], Tensor]) -> None:
        self.attend = attend
        self.num_layers = 1
        self._heads = 1

    def num_heads(self, layer: int) -> int:
        return self._heads

    def __call__(self, mask: Tensor | None, temperature: float = 1.0,
                 ablated: dict[int, Sequence[int]] | None = None) -> Snapshot:
        with torch.no_grad():
            w = self.attend(mask)
        while w.dim() > 4:  # extra leading axes: take index 0
            w = w[0]
        if w.dim() == 4:  # (B, H, T, T): first sequence, every head
            w = w[0]
        elif w.dim() == 3:  # (B, T, T): first sequence, one head
            w = w[:1]
        else:
            w = w.unsqueeze(0)
        self._heads = w.size(0)
        return Snapshot([apply_temperature(w, temperature)])


# ---------------------------------------------------------------------------
# The widget
# ---------------------------------------------------------------------------

class AttentionExplorer:
    """Heatmaps of attention with live controls.

    ``AttentionExplorer(tokens, source)`` then display it (it is the cell's last expression).
    ``source`` is a callable ``attend(mask)`` returning weights ``(T, T)``, ``(B, T, T)`` or
    ``(B, H, T, T)`` (the first sequence is shown), or a :class:`ModelSource`. Controls: layer,
    head (or all heads as a grid), mask mode (``mode``) with its controls (``length`` for
    padding; ``window`` for the window modes, ``dilation`` for the dilated window,
    ``global_positions`` (a text such as ``"0, 5"``) for window + global, and ``causal`` for
    the three window modes; the others are disabled), temperature on the logits, and one
    checkbox per head to switch it off (model sources only).

    State for tests: ``weights`` (NumPy: ``(T, T)`` for one head, ``(H, T, T)`` for the grid;
    what is plotted), ``snapshot`` (all layers), ``prediction`` (the text shown), ``mask``,
    ``png`` (the rendered image), ``last_update_seconds`` and ``error`` (the message for a
    bad setting, e.g. a global position out of range, shown under the controls while the
    last good picture stays; ``None`` when all is well).
    """

    def __init__(self, tokens: Sequence[str], attend: Callable[[Tensor | None], Tensor] | ModelSource,
                 title: str = "attention", query_tokens: Sequence[str] | None = None, image: Any = None,
                 grid: Sequence[int] | None = None) -> None:
        self.tokens = [str(t) for t in tokens]
        self.query_tokens = [str(t) for t in query_tokens] if query_tokens is not None else self.tokens
        self.source = attend if isinstance(attend, ModelSource) else _CallableSource(attend)
        self.title = title
        T = len(self.tokens)
        self.image = None if image is None else to_numpy(image)
        self.grid = None if grid is None else (int(grid[0]), int(grid[1]))
        if self.image is not None:
            if self.grid is None or self.grid[0] * self.grid[1] > T:
                raise ValueError(f"an image needs grid=(rows, columns) of patch tokens, at most the {T} tokens")
            if self.image.ndim == 3 and self.image.shape[0] in (1, 3):  # (C, H, W) -> (H, W, C)
                self.image = np.transpose(self.image, (1, 2, 0))
            self.image = np.clip(self.image, 0, 1)
        self.image_map: np.ndarray | None = None
        self.image_png = b""
        self.image_output = widgets.Output()
        self._image_figure: tuple | None = None
        style = {"description_width": "initial"}
        self.mode = widgets.Dropdown(options=MASK_MODES, value="none", description="mask", style=style)
        self.length = widgets.IntSlider(value=T, min=1, max=T, description="length (padding)", style=style)
        self.window = widgets.IntSlider(value=min(3, T), min=1, max=T, description="window width", style=style)
        self.dilation = widgets.IntSlider(value=min(2, max(T - 1, 1)), min=1, max=max(T - 1, 1),
                                          description="dilation", style=style)
        self.global_positions = widgets.Text(value="0", placeholder="e.g. 0, 5", continuous_update=False,
                                             description="global positions", style=style,
                                             tooltip=f"token positions 0 .. {T - 1}, separated by commas")
        self.causal = widgets.Checkbox(value=True, description="causal window", indent=False,
                                       layout=widgets.Layout(width="auto"))
        self.mask_info = widgets.HTML(value="", layout=widgets.Layout(display="none"))  # shown when it says something
        self.temperature = widgets.FloatLogSlider(value=1.0, base=10, min=-1, max=1, step=0.05,
                                                  description="temperature", style=style)
        self.layer = widgets.Dropdown(options=list(range(self.source.num_layers)), value=0,
                                      description="layer", style=style)
        self.head = widgets.Dropdown(options=[0], value=0, description="head", style=style)
        self.query = widgets.Dropdown(options=[(label, i) for i, label in enumerate(self.query_tokens)], value=0,
                                      description="query over the image", style=style)
        self.ablation = widgets.HBox([])
        self.ablate: dict[int, list[widgets.Checkbox]] = {}
        self.prediction_box = widgets.HTML(value="")
        self.output = widgets.Output()
        self.mask: Tensor | None = None
        self.error: str | None = None
        self.snapshot: Snapshot | None = None
        self.prediction: str | None = None
        self.weights = np.zeros((T, T))
        self.png = b""
        self.last_update_seconds = 0.0
        self._figures: dict[tuple, tuple] = {}
        self._updating = False
        if isinstance(self.source, ModelSource):
            for layer in range(self.source.num_layers):
                self.ablate[layer] = [widgets.Checkbox(value=False, description=f"switch off L{layer} H{h}",
                                                       indent=False, layout=widgets.Layout(width="auto"))
                                      for h in range(self.source.num_heads(layer))]
                for box in self.ablate[layer]:
                    box.observe(lambda change: self.update(), names="value")
        self._refresh_head_options(first=True)
        for control in (self.mode, self.length, self.window, self.dilation, self.global_positions, self.causal,
                        self.temperature, self.head, self.query):
            control.observe(lambda change: self.update(), names="value")
        self.layer.observe(lambda change: (self._refresh_head_options(), self.update()), names="value")
        self.update()

    # -- controls --------------------------------------------------------
    def _refresh_head_options(self, first: bool = False) -> None:
        H = self.source.num_heads(self.layer.value)
        options = list(range(H)) + ([ALL_HEADS] if H > 1 else [])
        self._updating = True
        try:
            keep = self.head.value if self.head.value in options and not first else (ALL_HEADS if H > 1 else 0)
            self.head.options = options
            self.head.value = keep
        finally:
            self._updating = False
        # a selector with one choice says nothing: hidden (one layer, one head)
        self.layer.layout.display = None if self.source.num_layers > 1 else "none"
        self.head.layout.display = None if H > 1 else "none"
        self.ablation.children = tuple(self.ablate.get(self.layer.value, []))

    def ablated(self) -> dict[int, list[int]]:
        """``{layer: [heads switched off]}`` from the checkboxes."""
        return {layer: [h for h, box in enumerate(boxes) if box.value] for layer, boxes in self.ablate.items()}

    @property
    def widget(self) -> widgets.Widget:
        # what to look at, then the mask and the controls of the chosen mask only (each hidden
        # while it does not apply: at most four in a row), then the picture, the largest thing
        rows = [widgets.HBox([self.layer, self.head, self.temperature]),
                widgets.HBox([self.mode, self.length, self.window]),
                widgets.HBox([self.dilation, self.global_positions, self.causal]),
                self.mask_info]
        if self.ablate:
            rows.append(self.ablation)
            rows.append(self.prediction_box)
        if self.image is not None:
            rows.append(self.query)
            return widgets.VBox(rows + [widgets.HBox([self.output, self.image_output])])
        return widgets.VBox(rows + [self.output])

    # -- computing and drawing --------------------------------------------
    def update(self) -> None:
        """Recompute the weights (and prediction) for the current controls and redraw."""
        if self._updating:
            return
        start = time.perf_counter()
        T = len(self.tokens)
        mode = self.mode.value
        for control, applies in ((self.length, mode == "padding"), (self.window, mode in WINDOW_MODES),
                                 (self.causal, mode in WINDOW_MODES), (self.dilation, mode == "dilated window"),
                                 (self.global_positions, mode == "window + global")):
            control.disabled = not applies
            control.layout.display = None if applies else "none"  # shown only where it applies
        try:
            mask = build_mask(mode, T, self.length.value, self.window.value, self.dilation.value,
                              self.global_positions.value, self.causal.value)
        except ValueError as error:  # a bad setting typed in the widget: say so, keep the last picture
            self.error = str(error)
            self._say(f"<span style='color:#c00'>{html.escape(self.error)}</span>")
            return
        self.error = None
        self._say(self._mask_description())
        self.mask = mask
        self.snapshot = self.source(self.mask, float(self.temperature.value), self.ablated())
        layer_weights = self.snapshot.weights[self.layer.value]  # (H, T_q, T_k)
        grid = self.head.value == ALL_HEADS
        self.weights = to_numpy(layer_weights if grid else layer_weights[self.head.value])
        self.prediction = self.snapshot.prediction
        if self.prediction is not None:
            self.prediction_box.value = self.prediction
        self._draw(grid)
        if self.image is not None:
            self._draw_image(layer_weights, grid)
        self._show()
        self.last_update_seconds = time.perf_counter() - start

    def _say(self, text: str) -> None:
        self.mask_info.value = text
        self.mask_info.layout.display = None if text else "none"

    def _mask_description(self) -> str:
        """A line under the controls naming the global tokens (window + global only)."""
        if self.mode.value != "window + global":
            return ""
        positions = parse_positions(self.global_positions.value, len(self.tokens))
        names = ", ".join(f"{p} ({html.escape(self.tokens[p])})" for p in positions)
        return f"global tokens: {names}"

    def _heads_label(self) -> str:
        off = self.ablated().get(self.layer.value, [])
        return f", heads off: {off}" if off else ""

    def _figure(self, n_panels: int) -> tuple:
        """A cached figure with ``n_panels`` heatmaps, token labels and one colour bar.

        Everything that does not change between updates (axes, token labels, colour bar) is
        rendered once into a background; an update only redraws the images and titles on top
        of it (blitting), which keeps the update time low for T = 32 and a grid of heads.
        """
        key = (n_panels,)
        if key not in self._figures:
            T_q, T_k = len(self.query_tokens), len(self.tokens)
            cols = min(n_panels, 4 if T_k <= 12 else 2)
            rows = -(-n_panels // cols)
            small = T_k > 24
            # the picture is the largest thing in the widget: about 850 px wide in a notebook of
            # about 1000, a token's square between 14 and 43 px, token labels at 11 pt (8 beyond
            # 24 tokens); constrained layout keeps every label and the colour bar inside it (a
            # fixed layout cut "animal" to "nimal")
            cell = min(0.6, max(0.2, (11.8 - 1.9 * cols - 1.2) / (cols * max(T_k, 1))))
            fig, axes = plt.subplots(rows, cols, squeeze=False, dpi=72, layout="constrained",
                                     figsize=((cell * max(T_k, 6) + 1.9) * cols + 1.2,
                                              (cell * max(T_q, 6) + 1.7) * rows + 0.6))
            plt.close(fig)  # shown through the Output widget only
            images = []
            for i, ax in enumerate(axes.flat):
                if i >= n_panels:
                    ax.axis("off")
                    continue
                image = ax.imshow(np.zeros((T_q, T_k)), cmap="viridis", vmin=0, vmax=1, aspect="auto",
                                  interpolation="nearest")
                image.set_animated(True)
                ax.set_xticks(range(T_k), self.tokens, rotation=90, fontsize=8 if small else 11)
                ax.set_yticks(range(T_q), self.query_tokens, fontsize=8 if small else 11)
                if i % cols == 0:
                    ax.set_ylabel("query (attending)", fontsize=11)
                if i >= n_panels - cols:
                    ax.set_xlabel("key (attended to)", fontsize=11)
                ax.set_title(" ", fontsize=11)
                ax.title.set_animated(True)
                images.append(image)
            bar = fig.colorbar(images[0], ax=axes.ravel().tolist(), fraction=0.03, pad=0.02)
            bar.set_label("attention weight", fontsize=11)
            suptitle = fig.suptitle(" ", fontsize=12)
            suptitle.set_animated(True)
            canvas = FigureCanvasAgg(fig)
            canvas.draw()
            background = canvas.copy_from_bbox(fig.bbox)
            self._figures[key] = (fig, list(axes.flat[:n_panels]), images, canvas, background, suptitle)
        return self._figures[key][:3]

    def _draw(self, grid: bool) -> None:
        maps = self.weights if grid else self.weights[None]
        fig, axes, images = self._figure(len(maps))
        canvas, background, suptitle = self._figures[(len(maps),)][3:]
        layer = self.layer.value
        canvas.restore_region(background)
        for h, (ax, image, w) in enumerate(zip(axes, images, maps)):
            image.set_data(w)
            head = h if grid else self.head.value
            off = head in self.ablated().get(layer, [])
            where = [f"layer {layer}"] * (self.source.num_layers > 1) + \
                [f"head {head}"] * (self.source.num_heads(layer) > 1)  # (one of each goes without saying)
            ax.set_title(", ".join(where) + (" (off)" if off else ""), fontsize=11)
            ax.draw_artist(image)
            ax.draw_artist(ax.title)
        suptitle.set_text(f"{self.title} — mask: {self.mode.value}, temperature {self.temperature.value:.2g}"
                          f"{self._heads_label()}")
        fig.draw_artist(suptitle)
        pixels = np.asarray(canvas.buffer_rgba())
        buffer = io.BytesIO()
        PIL.Image.fromarray(pixels[..., :3]).save(buffer, format="png", compress_level=1)
        self.png = buffer.getvalue()

    def _draw_image(self, layer_weights: Tensor, grid: bool) -> None:
        """The query token's map over the patches (the shown head, or the heads' mean), over the image."""
        gh, gw = self.grid
        n = gh * gw
        rows = layer_weights[:, self.query.value, -n:]  # (H, n): the query's weights on the patch keys
        shown = rows.mean(dim=0) if grid else rows[self.head.value]
        self.image_map = to_numpy(shown).reshape(gh, gw)
        if self._image_figure is None:
            fig, ax = plt.subplots(figsize=(2.8, 3.0), dpi=72, layout="constrained")
            plt.close(fig)
            ax.imshow(self.image, interpolation="nearest")
            overlay = ax.imshow(np.zeros((gh, gw)), cmap="magma", alpha=0.55, vmin=0,
                                extent=(-0.5, self.image.shape[1] - 0.5, self.image.shape[0] - 0.5, -0.5),
                                interpolation="bilinear")
            ax.set_xticks([])
            ax.set_yticks([])
            self._image_figure = (fig, ax, overlay, FigureCanvasAgg(fig))
        fig, ax, overlay, canvas = self._image_figure
        overlay.set_data(self.image_map)
        overlay.set_clim(0, max(float(self.image_map.max()), 1e-12))
        head = "mean of the heads" if grid else f"head {self.head.value}"
        ax.set_title(f"{self.query_tokens[self.query.value]} → patches\nlayer {self.layer.value}, {head}", fontsize=9)
        canvas.draw()
        buffer = io.BytesIO()
        PIL.Image.fromarray(np.asarray(canvas.buffer_rgba())[..., :3]).save(buffer, format="png", compress_level=1)
        self.image_png = buffer.getvalue()

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
        if self.image is not None:
            with self.image_output:
                clear_output(wait=True)
                display(Image(data=self.image_png, format="png"))

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)


def describe_tokens(predicted: Sequence[str], expected: Sequence[str] | None = None) -> str:
    """HTML line for a prediction: predicted tokens, wrong ones in red, and the accuracy."""
    if expected is None:
        return "prediction: " + " ".join(html.escape(p) for p in predicted)
    parts, right, n = [], 0, 0
    for p, e in zip(predicted, expected):
        if e == "":
            parts.append("·")
            continue
        n += 1
        ok = p == e
        right += ok
        parts.append(html.escape(p) if ok else f"<span style='color:#c00'>{html.escape(p)}</span>")
    acc = f" — {right}/{n} correct" if n else ""
    return "prediction: " + " ".join(parts) + acc

