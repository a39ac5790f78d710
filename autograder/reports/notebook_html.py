"""``workbook html NOTEBOOK``: a notebook as one HTML page that needs no network, to read or hand on.

``jupyter nbconvert --to html`` loads MathJax and the widget manager from the web: offline, its
formulas stay raw TeX and every widget is blank. Here math is MathML (written when the page is
made, as on the feedback pages: :func:`autograder.doors.outbound.markdown_html`), a widget shows
the outputs it held when the notebook was saved (the attention explorer's last picture: JupyterLab
and nbclient keep a widget's state in the notebook), and the page runs no script and fetches
nothing (the outbound door's sanitiser and Content-Security-Policy, as on every generated page).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import nbformat

from ..doors.allowlist import with_csp
from ..doors.outbound import SafeHTMLExporter

__all__ = ["notebook_html", "widget_outputs"]

_TEMPLATES = Path(__file__).resolve().parent / "templates"
_VIEW = "application/vnd.jupyter.widget-view+json"
_STATE = "application/vnd.jupyter.widget-state+json"


def widget_outputs(nb: Any, model_id: str) -> list[dict]:
    """The outputs held by the ``Output`` widgets inside widget ``model_id`` (itself or any of its
    children, in order), from the widget state saved in the notebook's metadata."""
    state = (nb.get("metadata", {}).get("widgets", {}).get(_STATE, {}) or {}).get("state", {})
    found, seen, todo = [], set(), [model_id]
    while todo:
        mid = todo.pop(0)
        if mid in seen or mid not in state:
            continue
        seen.add(mid)
        model = state[mid]
        fields = model.get("state", {}) if isinstance(model, dict) else {}
        if model.get("model_name") == "OutputModel":
            found.extend(o for o in fields.get("outputs", []) if isinstance(o, dict))
        for value in fields.values():
            for ref in value if isinstance(value, list) else [value]:
                if isinstance(ref, str) and ref.startswith("IPY_MODEL_"):
                    todo.append(ref[len("IPY_MODEL_"):])
    return found


def _with_widget_pictures(nb: Any) -> Any:
    """Each widget output replaced by the outputs its ``Output`` widgets held (a line saying it is
    interactive where it held none)."""
    for cell in nb.cells:
        if cell.get("cell_type") != "code":
            continue
        outputs = []
        for output in cell.get("outputs", []):
            view = output.get("data", {}).get(_VIEW) if isinstance(output.get("data"), dict) else None
            if not isinstance(view, dict):
                outputs.append(output)
                continue
            held = [nbformat.from_dict(o) for o in widget_outputs(nb, str(view.get("model_id", "")))]
            outputs.extend(held or [nbformat.v4.new_output(
                "display_data", {"text/plain": "(an interactive widget: open the notebook in JupyterLab to use it)"})])
        cell["outputs"] = outputs
    return nb


def notebook_html(path: Path) -> str:
    """The page of the notebook at ``path`` (see the module docstring)."""
    from traitlets.config import Config

    nb = nbformat.read(str(path), as_version=4)
    nb = _with_widget_pictures(nb)
    nb.metadata.pop("widgets", None)
    config = Config()
    config.HTMLExporter.template_name = "workbook_html"
    config.HTMLExporter.extra_template_basedirs = [str(_TEMPLATES)]
    config.HTMLExporter.embed_images = False  # a file a notebook's markdown names is not read
    body, _ = SafeHTMLExporter(config=config).from_notebook_node(nb, resources={"metadata": {"name": path.stem}})
    return with_csp(body)
