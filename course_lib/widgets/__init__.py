"""Interactive widgets (ipywidgets + matplotlib), usable offline in JupyterLab 4."""

from .explorer import (
    ALL_HEADS, MASK_MODES, AttentionExplorer, ModelSource, apply_temperature, build_mask, capture_attention,
    describe_tokens, find_attention_modules, logit_temperature,
)

__all__ = [
    "AttentionExplorer", "ModelSource", "apply_temperature", "build_mask", "capture_attention",
    "describe_tokens", "find_attention_modules", "logit_temperature", "ALL_HEADS", "MASK_MODES",
]
