"""What the RL training pass saves for backward, measured on its own shape.

The shared pass (``labelrl.rollout.logprobs.completion_logprobs_shared``) is not a plain
pass over B·(P + G·T) tokens, which the SFT probe's line would price:

* the prefix every prompt shares runs once, each prompt's remainder once, each completion
  once: ``S + B·R`` prompt positions and ``B·G·(T − 1)`` completion positions;
* attention saves the keys and values it attended over, per row: the prompt's cache repeated
  under each of its G completions, in the dtype and head layout the attention runs in (on CPU
  fp32, grouped-query heads expanded: SmolLM2 saves 135 KB per key position per row);
* the module pass saves each completion's T logits (fp32, vocabulary wide); the lean pass
  (``labelrl.rollout.lean_pass``) one hidden-wide vector per position instead
  (``labelrl.rollout.token_logprobs``);
* under bf16 autocast, each of the pass's forward calls saves its own bf16 copy of the frozen
  weights (autocast caches casts of trainable leaves only).

How these add up depends on which attention kernel a shape gets, so they are not priced one
by one: ``rl_pass_saved_bytes`` runs the real pass under ``saved_tensors_hooks`` at the run's
own prefix, remainder, G and T, with 2 and 3 prompts, and extends the line to B prompts. Each
prompt beyond the first two brings the same tensors (its remainder, its G rows, their keys and
logits), so the line is exact in B (checked against the measured bytes at 4 and 16 prompts:
``tests/train/test_memory_rl.py``).

What the process's resident memory grows by at the peak is more than the tensors saved (the
heap keeps holes, the backward pass holds gradients beside them). Measured with SmolLM2-135M +
LoRA r=16, G = 4, 12 new tokens, 2 steps, every group trained, the lean pass (no vocabulary-wide
logits), bf16 on an AMD EPYC with AVX-512 BF16: the peak (VmHWM) above the model, its kept
weights and the optimizer state grew by 1.09× and 0.85× the bytes the plan's worst batch saves
on sms-spam (4 and 16 prompts per step: a run's batches are shorter than the longest prompts its
plan prices) and by 1.52× and 1.12× on vader-movies, plus a fixed part. The CPU prediction takes
``HEAP_GROWTH_RL`` × the saved bytes plus ``FIXED_BYTES_PER_FROZEN_WEIGHT`` per frozen weight
(807 MB for SmolLM2). Any factor from 0.87 to 1.23 keeps all four peaks within [1, 1.5]× of the
prediction; 1.05, near that range's geometric middle, put them at 1/1.11 to 1/1.34 of it, about
a tenth from either edge, and at 1/1.13 to 1/1.36 once the pass kept its fused bf16 base joined
instead of copying it per pass (``tests/train/test_memory_prediction_slow.py`` checks them on its
machine). Before the lean
pass read the vocabulary in slices and left the prompts' padding out, the pass churned the heap
with [M, V] logits and the factor was 1.5.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

# Resident growth of a CPU process per byte the RL pass saves, and a fixed part per frozen weight
# (module doc).
HEAP_GROWTH_RL = 1.05
FIXED_BYTES_PER_FROZEN_WEIGHT = 6
# The pass is measured at this many prompts and extended by the line through the two (module doc).
PROBED_PROMPTS = (2, 3)


@dataclass(frozen=True)
class PassShape:
    """One training pass: B prompts whose first S tokens are the same and R more are each
    prompt's own (padded to the longest), G completions each of T tokens; ``share_prefix``
    False (several processes) runs every prompt whole. ``next_remainders``: the remainders of
    the prompts after the longest, longest first (the run's next-longest training prompts);
    a prompt past them, or every prompt when empty, has R. The lean pass computes a prompt's
    real tokens only, so a batch of the longest prompt and the next-longest saves less than B
    copies of the longest (its attention still runs over the longest's width)."""
    prompts: int
    group_size: int
    shared: int
    remainder: int
    new_tokens: int
    share_prefix: bool = True
    next_remainders: tuple[int, ...] = ()

    def remainder_of(self, prompt: int) -> int:
        """Prompt ``prompt``'s own tokens after the shared ones (0: the longest)."""
        return self.remainder if prompt == 0 or prompt > len(self.next_remainders) else self.next_remainders[prompt - 1]


def _probe_inputs(shape: PassShape, vocab: int) -> tuple[list[list[int]], list[list[int]]]:
    """Prompts sharing ``shared`` tokens, then distinct remainders; distinct completions. Token
    ids stay clear of 0 (the pad id the probe passes), so nothing is mistaken for padding."""
    B, G, S, T = shape.prompts, shape.group_size, shape.shared, shape.new_tokens
    prefix = [1 + (7 * i) % (vocab - 1) for i in range(S)]
    prompts = [prefix + [1 + (1000 + 97 * b + j) % (vocab - 1) for j in range(shape.remainder_of(b))] for b in range(B)]
    completions = [[1 + (500 + 13 * n + j) % (vocab - 1) for j in range(T)] for n in range(B * G)]
    return prompts, completions


def saved_by_pass(model, shape: PassShape, dtype: torch.dtype) -> int:
    """Bytes the training pass of ``shape`` saves for backward (parameters excluded)."""
    from labelrl.rollout.logprobs import completion_logprobs_shared
    from labelrl.train.memory import saved_bytes_of

    prompts, completions = _probe_inputs(shape, model.config.vocab_size)
    was_training = model.training
    model.train()
    try:
        return saved_bytes_of(model, lambda: completion_logprobs_shared(
            model, prompts, completions, shape.group_size, pad_token_id=0, dtype=dtype,
            share_prefix=shape.share_prefix), key=("rl pass", shape, dtype))
    finally:
        model.train(was_training)


def rl_pass_saved_bytes(model, shape: PassShape, dtype: torch.dtype) -> float:
    """What the pass of ``shape`` saves: measured at 2 and 3 prompts and extended by the line
    through them (module doc); measured whole below 3 prompts."""
    return extended(lambda b: saved_by_pass(model, replace(shape, prompts=b), dtype), shape.prompts)


def extended(saved_at, count: int) -> float:
    """``saved_at(count)`` measured whole at up to ``PROBED_PROMPTS[0]``, else measured at both
    probe sizes and extended by the line through them (module doc)."""
    low, high = PROBED_PROMPTS
    if count <= low:
        return float(saved_at(count))
    first, second = saved_at(low), saved_at(high)
    return first + (count - low) * (second - first) / (high - low)


def grown_by_heap(model, saved: float, device: torch.device) -> float:
    """What a pass saving ``saved`` bytes adds to the process's peak: the bytes on a GPU (the
    caching allocator reuses blocks by size); on a CPU grown by the heap (module doc)."""
    if device.type != "cpu":
        return saved
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    return HEAP_GROWTH_RL * saved + FIXED_BYTES_PER_FROZEN_WEIGHT * frozen


def rl_pass_growth_bytes(model, shape: PassShape, dtype: torch.dtype, device: torch.device) -> float:
    """What the pass of ``shape`` adds to the process's peak (``grown_by_heap``)."""
    return grown_by_heap(model, rl_pass_saved_bytes(model, shape, dtype), device)
