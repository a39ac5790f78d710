"""Interactive widgets (ipywidgets + matplotlib), usable offline in JupyterLab 4."""

from .explorer import AttentionExplorer, apply_temperature, build_mask

__all__ = ["AttentionExplorer", "apply_temperature", "build_mask"]
