"""A prefix that every sequence of a batch shares, computed once.

Prompts rendered from one template share their first tokens: the chat template's header and
the system message (instruction, label line, answer format, rubric). With SmolLM2's template,
63 of a median 87 prompt tokens in sms-spam, and 130 of 160 in vader-movies with its rubric.
A forward pass over B such sequences computes that prefix B times. Here it runs once, as one
row whose KV cache is kept (in the autograd graph when gradients are on) and repeated B times;
each sequence's remainder runs on top of it. Causal attention makes the prefix's keys and
values independent of what follows, and the position ids continue from the prefix, so the
logits equal the plain pass's up to float rounding (the products have other shapes).

Layout: the remainders are left-padded to a common width R; the attention mask is
``[ones(P0) | remainder mask]``, so padding sits between the prefix and a remainder, masked;
the position ids count real tokens, P0 at each remainder's first token.

Transformers drops the cache inside checkpointed layers, so callers keep the plain pass when
activation checkpointing is on (``checkpointing``), and for models with sliding-window layers
(``prefix_supported``).
"""

from __future__ import annotations

from typing import Sequence

import torch
from transformers import DynamicCache

from labelrl.models.precision import compute
from labelrl.rollout.model_inputs import cache_kwarg, inner_model, left_pad, new_cache

# Below this many shared tokens the extra forward call costs about what it saves.
MIN_SHARED = 16


def shared_prefix_length(seqs: Sequence[Sequence[int]], keep: Sequence[int] | int = 1) -> int:
    """Tokens at the start of every sequence that all share, leaving at least ``keep[i]``
    tokens of sequence i after the prefix (an int: the same for all); 0 for fewer than two
    sequences, or when fewer than ``MIN_SHARED`` tokens are shared (not worth a pass)."""
    if len(seqs) < 2:
        return 0
    keep = [keep] * len(seqs) if isinstance(keep, int) else list(keep)
    limit = min(len(s) - k for s, k in zip(seqs, keep))
    first = seqs[0]
    n = 0
    while n < limit and all(s[n] == first[n] for s in seqs[1:]):
        n += 1
    return n if n >= MIN_SHARED else 0


def prefix_supported(model: torch.nn.Module) -> bool:
    """Whether the model attends over every earlier key. A sliding-window layer (Gemma 3,
    Mistral) counts its window in cache columns, and the padding between the prefix and a
    short remainder would take the place of the prefix's last keys: those models keep the
    plain pass."""
    config = inner_model(model).config.get_text_config()
    if "sliding_attention" in (getattr(config, "layer_types", None) or ()):
        return False
    return not (getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True))


def checkpointing(model: torch.nn.Module) -> bool:
    """Whether activation (gradient) checkpointing is on; the property's name changed in 5.x."""
    model = inner_model(model)
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        try:
            return bool(getattr(model, name))
        except AttributeError:
            continue
    return False


def prefix_cache(model: torch.nn.Module, prefix: Sequence[int], rows: int, dtype: torch.dtype, device):
    """The KV cache of ``prefix`` (one row) repeated ``rows`` times, and the forward argument
    that takes it. One logit position is kept: the prefix's own logits are never used."""
    cache, arg = new_cache(model), cache_kwarg(model)
    ids = torch.tensor([list(prefix)], dtype=torch.long, device=device)
    with compute(model, dtype):
        model(input_ids=ids, attention_mask=torch.ones_like(ids), position_ids=torch.arange(len(prefix), device=device)[None],
              use_cache=True, logits_to_keep=1, **{arg: cache})
    cache.batch_repeat_interleave(rows)
    return cache, arg


def remainder_inputs(seqs: Sequence[Sequence[int]], shared: int, pad: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The remainders after ``shared`` tokens, left-padded: input ids [B, R], the attention
    mask over prefix and remainder [B, shared + R], and position ids [B, R] from ``shared``."""
    ids, mask, positions = left_pad([list(s)[shared:] for s in seqs], pad, device)
    full = torch.cat([torch.ones((len(seqs), shared), dtype=mask.dtype, device=mask.device), mask], dim=1)
    return ids, full, torch.where(mask.bool(), positions + shared, positions)


def prefill_inputs(prompt_ids: Sequence[Sequence[int]], pad: int, device, sliding: bool = False) -> tuple:
    """The arguments of ``fast_decode``'s prefill over ``prompt_ids``: input ids, attention mask
    and position ids, and the prefix [1, S] the prompts share (run once; None when they share
    fewer than ``MIN_SHARED`` tokens, or with ``sliding`` windows, which count columns)."""
    shared = 0 if sliding else shared_prefix_length(prompt_ids)
    if not shared:
        return (*left_pad(prompt_ids, pad, device), None)
    prefix = torch.tensor([list(prompt_ids[0][:shared])], dtype=torch.long, device=device)
    return (*remainder_inputs(prompt_ids, shared, pad, device), prefix)


def cached_inputs(model: torch.nn.Module, seqs: Sequence[Sequence[int]], shared: int, pad: int, dtype: torch.dtype,
                  device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, DynamicCache, str]:
    """Input ids, attention mask and position ids of a forward pass over ``seqs`` that fills a
    KV cache, the cache and the forward argument that takes it: after their first ``shared``
    tokens ran once (``prefix_cache``, ``remainder_inputs``), or, with ``shared`` 0, the whole
    sequences left-padded into a fresh cache."""
    if shared:
        cache, arg = prefix_cache(model, seqs[0][:shared], len(seqs), dtype, device)
        return *remainder_inputs(seqs, shared, pad, device), cache, arg
    return *left_pad(seqs, pad, device), new_cache(model), cache_kwarg(model)


def tail_logits(model: torch.nn.Module, seqs: Sequence[Sequence[int]], pad: int, dtype: torch.dtype, keep: int,
                device) -> torch.Tensor:
    """Logits [B, keep, V] of the last ``keep`` positions of each sequence (left-padded
    together), with their shared prefix computed once when there is one worth sharing."""
    shared = shared_prefix_length(seqs, keep=keep) if prefix_supported(model) else 0
    ids, mask, positions, cache, arg = cached_inputs(model, seqs, shared, pad, dtype, device)
    with compute(model, dtype):
        return model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=keep, use_cache=True,
                     **{arg: cache}).logits
