"""What a forward pass over a batch of token sequences hands the model besides its weights.

* ``left_pad``: input ids, attention mask and position ids of sequences of different lengths,
  left-padded, with positions that count real tokens only;
* ``new_cache`` and ``cache_kwarg``: a fresh KV cache and the name of the forward argument that
  takes it (it changed within transformers 5.x);
* ``inner_model``: the model inside a DistributedDataParallel-style wrapper.

The sampler (``labelrl.rollout.sampler``), the shared-prefix pass (``labelrl.rollout.prefix``)
and the training pass (``labelrl.rollout.logprobs``) all build their inputs here, so they pad
and cache alike; this module imports none of them.
"""

from __future__ import annotations

import inspect
from typing import Sequence

import torch
from transformers import DynamicCache


def left_pad(
    prompt_ids: Sequence[Sequence[int]], pad_token_id: int, device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded ``input_ids`` [B, P], ``attention_mask`` [B, P] and ``position_ids`` [B, P].

    Positions count real tokens only (0 at each prompt's first token), as
    ``generate`` does, so padding never shifts a prompt's rotary positions; pad slots get 0.
    """
    width = max(len(p) for p in prompt_ids)
    input_ids = torch.full((len(prompt_ids), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prompt_ids), width), dtype=torch.long)
    for i, prompt in enumerate(prompt_ids):
        input_ids[i, width - len(prompt):] = torch.as_tensor(list(prompt), dtype=torch.long)
        attention_mask[i, width - len(prompt):] = 1
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return input_ids.to(device), attention_mask.to(device), position_ids.to(device)


def inner_model(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside a DistributedDataParallel-style wrapper (``.module``), else the model:
    the wrapper forwards calls but hides ``config`` and the forward signature."""
    return getattr(model, "module", model)


def cache_kwarg(model: torch.nn.Module) -> str:
    """The forward argument that takes the KV cache: ``cache`` in newer transformers 5.x,
    ``past_key_values`` before (still accepted, with a deprecation warning, until 5.40)."""
    model = inner_model(model)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def new_cache(model: torch.nn.Module) -> DynamicCache:
    return DynamicCache(config=inner_model(model).config)
