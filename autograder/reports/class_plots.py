"""The class report's plots (autograder/reports/class_report.py), each a PNG as base64 text:
the score distribution, the credit per item, the most common mistakes, and the heat map of
students by notebook."""

from __future__ import annotations

import base64
import io
from typing import Any

__all__ = ["png", "score_figure", "score_plot", "items_plot", "mistakes_plot", "heatmap_plot"]


def png(fig) -> str:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode()


def score_plot(data: dict, assignment: str) -> str:
    return png(score_figure(data, assignment))


def score_figure(data: dict, assignment: str):  # a matplotlib Figure
    import matplotlib.pyplot as plt

    scores = data["scores"]
    top = max(data["max_score"], 1.0)
    bins = [top * i / 20 for i in range(21)]
    fig, ax = plt.subplots(figsize=(7, 3))
    ax.hist([s["auto"] for s in scores], bins=bins, alpha=0.75, label="automatic points", color="#4477aa")
    if any(s["manual"] for s in scores):
        ax.hist([s["manual"] for s in scores], bins=bins, alpha=0.75, label="manual points", color="#ee6677")
    ax.hist([s["score"] for s in scores], bins=bins, histtype="step", lw=2, color="black", label="total")
    ax.yaxis.get_major_locator().set_params(integer=True)  # students are counted in whole numbers
    ax.set_xlabel(f"points (of {top:g})")
    ax.set_ylabel("students")
    ax.set_title(f"{assignment}: scores of {len(scores)} students")
    # below the axes: inside, the legend covered the first bars (where the students with 0 are)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=3, fontsize="small", frameon=False)
    fig.tight_layout()
    return fig


def items_plot(data: dict, assignment: str) -> str:
    import matplotlib.pyplot as plt

    items = data["items"]
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(items) + 1.2))
    names = [i["item"] for i in items]
    left = [0.0] * len(items)
    for key, color, label in (("full", "#228833", "full credit"), ("partial", "#ccbb44", "partial"),
                              ("none", "#ee6677", "no credit")):
        shares = [i[key] / max(1, i["full"] + i["partial"] + i["none"]) for i in items]
        ax.barh(names, shares, left=left, color=color, label=label)
        left = [a + b for a, b in zip(left, shares)]
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of students")
    ax.set_title(f"{assignment}: credit per graded item")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=3, fontsize="small", frameon=False)
    return png(fig)


def mistakes_plot(rows: list[dict], title: str, top: int = 12) -> str:
    import matplotlib.pyplot as plt

    rows = rows[:top]
    fig, ax = plt.subplots(figsize=(8, 0.4 * len(rows) + 1.2))
    ax.barh([f"{r['item']}: {r['mistake']}" for r in rows], [r["count"] for r in rows], color="#aa3377")
    ax.invert_yaxis()
    ax.set_xlabel("students")
    ax.set_title(title)
    ax.xaxis.get_major_locator().set_params(integer=True)
    return png(fig)


def _plain(label: Any) -> str:
    """A label matplotlib shows as it is: ``$`` would start its math mode (and bad math
    stops the whole plot)."""
    return str(label).replace("$", r"\$")


def heatmap_plot(heatmap: dict) -> str:
    import matplotlib.pyplot as plt
    import numpy as np

    rows = heatmap["rows"]
    values = np.array([[np.nan if v is None else v for v in r["shares"]] for r in rows], dtype=float)
    fig, ax = plt.subplots(figsize=(1.1 * len(heatmap["columns"]) + 2.5, 0.22 * len(rows) + 1.5))
    cmap = plt.get_cmap("RdYlGn").copy()
    cmap.set_bad("#dddddd")
    image = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, vmin=0, vmax=1, aspect="auto",
                      interpolation="nearest")
    ax.set_xticks(range(len(heatmap["columns"])), heatmap["columns"], rotation=30, ha="right")
    ax.set_yticks(range(len(rows)), [_plain(r["student"]) for r in rows], fontsize=7 if len(rows) > 40 else 9)
    ax.set_title("share of points per notebook (grey: no submission)")
    fig.colorbar(image, ax=ax, fraction=0.04, pad=0.02, label="share of points")
    return png(fig)
