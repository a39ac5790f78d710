"""Reading JSON a student wrote (a submitted notebook) in the instructor's process.

``json.loads`` raises ``RecursionError``, not ``ValueError``, on a document nested about a
thousand levels deep: a handful of bytes that would stop ``collect`` or ``autograde`` for
the whole class. Here every such document is a ``ValueError``, and so is one nested more
deeply than any notebook needs (a notebook nests about ten levels), so that nothing later
(nbformat, nbgrader, the feedback) walks a deep structure.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["MAX_JSON_DEPTH", "loads", "depth"]

MAX_JSON_DEPTH = 100


def depth(value: Any) -> int:
    """How deeply lists and dicts nest in ``value`` (a scalar: 0, ``[]``: 1), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def loads(text: str | bytes) -> Any:
    """``json.loads`` for untrusted text: a ``ValueError`` for anything that is not JSON,
    including a document nested more than :data:`MAX_JSON_DEPTH` levels deep."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError(f"nested more than {MAX_JSON_DEPTH} levels deep") from None
    if depth(value) > MAX_JSON_DEPTH:
        raise ValueError(f"nested more than {MAX_JSON_DEPTH} levels deep")
    return value
