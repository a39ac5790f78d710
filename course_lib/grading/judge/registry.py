"""Where check specs live: item name -> ItemSpec.

Each notebook's items are defined in a module of ``course_lib.grading.items`` (a long
notebook's in several, one per idea: ``transformer_layers``, ``transformer_training``,
``transformer_decoding``) that exposes ``SPECS: dict[str, ItemSpec]``. Add a new module to
``ITEM_MODULES``.
"""

from __future__ import annotations

import importlib
from functools import lru_cache

from .spec import ItemSpec

__all__ = ["ITEM_MODULES", "all_specs", "get_spec"]

ITEM_MODULES = (
    "course_lib.grading.items.rnn",
    "course_lib.grading.items.bahdanau",
    "course_lib.grading.items.self_attention",
    "course_lib.grading.items.multihead",
    "course_lib.grading.items.positional",
    "course_lib.grading.items.transformer_layers",
    "course_lib.grading.items.transformer_training",
    "course_lib.grading.items.transformer_decoding",
    "course_lib.grading.items.bert",
    "course_lib.grading.items.gpt",
    "course_lib.grading.items.efficient_attention",
    "course_lib.grading.items.vision",
    "course_lib.grading.items.modern",
)


@lru_cache(maxsize=None)
def all_specs() -> dict[str, ItemSpec]:
    """Every graded item of the course, by name."""
    specs: dict[str, ItemSpec] = {}
    for module_name in ITEM_MODULES:
        module = importlib.import_module(module_name)
        for name, spec in module.SPECS.items():
            if name in specs:
                raise RuntimeError(f"graded item {name!r} is defined twice")
            specs[name] = spec
    return specs


def get_spec(name: str) -> ItemSpec:
    """The spec of graded item ``name``; a clear error lists the known names otherwise."""
    specs = all_specs()
    if name not in specs:
        known = ", ".join(sorted(specs))
        raise KeyError(f"no graded item called {name!r}; known items: {known}")
    return specs[name]
