"""Model loading: built-in names (``smollm2-135m-instruct``; the tiny random models ``tiny-random``,
``tiny-qwen2``, ``tiny-qwen3``, ``tiny-gemma3``) and local directories.

Everything here is offline; see ``labelrl.models.load`` for the specs and the cache. The
public names are imported on first use, so ``import labelrl.models.cache`` (or a CLI that only
lists commands) does not pay for importing torch and transformers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from labelrl.lazy import lazy_exports

if TYPE_CHECKING:
    from labelrl.models.load import BUILTIN_MODELS, load_model, load_tokenizer, model_fingerprint

_WHERE = dict.fromkeys(["BUILTIN_MODELS", "load_model", "load_tokenizer", "model_fingerprint"], "load")
__all__ = sorted(_WHERE)

__getattr__, __dir__ = lazy_exports(__name__, _WHERE, globals())
