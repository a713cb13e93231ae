"""Model loading: built-in names (``smollm2-135m-instruct``, ``tiny-random``) and local directories.

Everything here is offline; see ``labelrl.models.load`` for the specs and the cache. The
public names are imported on first use, so ``import labelrl.models.cache`` (or a CLI that only
lists commands) does not pay for importing torch and transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from labelrl.models.load import BUILTIN_MODELS, load_model, load_tokenizer, model_fingerprint

__all__ = ["BUILTIN_MODELS", "load_model", "load_tokenizer", "model_fingerprint"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("labelrl.models.load"), name)
    raise AttributeError(f"module 'labelrl.models' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
