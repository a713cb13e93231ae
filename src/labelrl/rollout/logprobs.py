"""Per-token log-probs of sampled completions: the training forward pass.

Two routes give the same numbers and the same gradients:

* ``completion_logprobs``: one sequence per sample (prompt then completion), N = B*G rows.
* ``completion_logprobs_shared``: each prompt runs once and keeps its KV cache *with*
  gradients; the cache is repeated G times and the G completions run on top of it, so the
  prompt costs B token passes instead of B*G and its gradient arrives once, summed over
  its G completions by the backward of ``repeat_interleave``. The prefix the B prompts
  share runs once more before them, the same way (``labelrl.rollout.prefix``).

Both routes can also return the policy's entropy at every completion position (``with_entropy``):
H = logsumexp(z) − Σ_v softmax(z)_v·z_v over the vocabulary, detached, from the logits the
module pass holds anyway (``_entropy``) or from the lean pass's running sums (``token_logprobs``).

Precision: ``dtype`` bf16 runs the forward under bf16 autocast with the vocabulary
projection in fp32 (``labelrl.models.precision.compute``); log-softmax and gather are fp32
either way.

Layout, both routes: prompts are left-padded to a common width P and completions follow,
right-padded to the longest completion T. Every completion therefore starts at column P, so
the logits needed (columns P−1 … P+T−2) are one slice, and the vocabulary projection and
log-softmax run on N×T positions only, never on prompt positions.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from labelrl.models.precision import compute
from labelrl.rollout.lean_pass import lean_logprobs, lean_reason
from labelrl.rollout.model_inputs import left_pad
from labelrl.rollout.prefix import cached_inputs, checkpointing, prefix_supported, shared_prefix_length
from labelrl.rollout.sampler import model_device


def completion_logprobs(
    model: torch.nn.Module,
    prompt_ids: Sequence[Sequence[int]],
    completion_ids: Sequence[Sequence[int]],
    *,
    pad_token_id: int,
    min_width: int | None = None,
    dtype: torch.dtype = torch.float32,
    with_entropy: bool = False,
):
    """Log-probs [N, T] (float32, with gradients when enabled) and mask [N, T] (bool); with
    ``with_entropy``, third, the entropy [N, T] (nats, detached; 0 where ``mask`` is False).

    ``logprobs[n, t] = log π(completion_ids[n][t] | prompt_ids[n], completion_ids[n][:t])``
    at temperature 1; T is the longest completion; positions past a completion's end hold 0
    and ``mask`` False. ``prompt_ids`` has one prompt per completion (repeat each of B
    prompts G times, or call ``completion_logprobs_shared``). One forward pass; the model's
    train/eval mode is left as it is. ``min_width`` pads T up to at least that many columns
    (masked; the result is unchanged), so processes that train on different completions
    can make the same sequence of forward calls.
    """
    _check_inputs(prompt_ids, completion_ids, pad_token_id)
    if len(prompt_ids) != len(completion_ids):
        raise ValueError(
            f"{len(prompt_ids)} prompts for {len(completion_ids)} completions: completion_logprobs needs one "
            "prompt per completion; repeat each prompt G times, or use completion_logprobs_shared(..., group_size=G)"
        )
    targets, mask = right_pad(completion_ids, pad_token_id, model_device(model), min_width)
    width = targets.shape[1]
    if width == 0:
        return _empty(targets, mask, with_entropy)
    input_ids, attention_mask, position_ids = left_pad(prompt_ids, pad_token_id, targets.device)
    # The last completion token predicts nothing we need, so it is not fed.
    input_ids = torch.cat([input_ids, targets[:, :-1]], dim=1)
    attention_mask = torch.cat([attention_mask, mask[:, :-1].long()], dim=1)
    position_ids = torch.cat([position_ids, position_ids[:, -1:] + torch.arange(1, width, device=targets.device)], dim=1)
    with compute(model, dtype):
        out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                    use_cache=False, logits_to_keep=width)
    logprobs = _gather_logprobs(out.logits, targets, mask)
    return (logprobs, mask, _entropy(out.logits, mask)) if with_entropy else (logprobs, mask)


def completion_logprobs_shared(
    model: torch.nn.Module,
    prompt_ids: Sequence[Sequence[int]],
    completion_ids: Sequence[Sequence[int]],
    group_size: int,
    *,
    pad_token_id: int,
    min_width: int | None = None,
    dtype: torch.dtype = torch.float32,
    share_prefix: bool = True,
    with_entropy: bool = False,
):
    """Same result as ``completion_logprobs`` with each of the B prompts repeated G times,
    computing each prompt once: ``completion_ids`` [B*G] is grouped contiguously (prompt i
    owns rows i*G … i*G+G−1, as ``sample_groups`` returns them).

    The prompt pass keeps its KV cache in the autograd graph (no inference mode, use_cache);
    the cache is repeated G times and the completions run on it. With ``share_prefix`` the
    tokens all B prompts start with (template and system message) run once before them
    (``labelrl.rollout.prefix``); processes that must make the same forward calls turn it
    off, since their shares can differ in what they share. With gradient
    checkpointing active (training mode, gradients on) transformers drops the cache inside
    checkpointed layers, so this falls back to the plain pass, which is correct, only slower.
    """
    _check_inputs(prompt_ids, completion_ids, pad_token_id)
    if group_size < 1 or len(completion_ids) != len(prompt_ids) * group_size:
        raise ValueError(
            f"{len(completion_ids)} completions for {len(prompt_ids)} prompts with group_size={group_size}: "
            "the shared pass needs exactly B*G completions grouped by prompt; pass the RolloutBatch rows in order"
        )
    repeated = [p for p in prompt_ids for _ in range(group_size)]
    if checkpointing(model) and model.training and torch.is_grad_enabled():
        return completion_logprobs(model, repeated, completion_ids, pad_token_id=pad_token_id, min_width=min_width,
                                   dtype=dtype, with_entropy=with_entropy)
    targets, mask = right_pad(completion_ids, pad_token_id, model_device(model), min_width)
    width = targets.shape[1]
    if width == 0:
        return _empty(targets, mask, with_entropy)
    # the prefix all B prompts share runs once, then each prompt's remainder
    shared = shared_prefix_length(prompt_ids) if share_prefix and prefix_supported(model) else 0
    if lean_reason(model) is None:  # the same function with fewer, larger operations
        picked, rows, entropy = lean_logprobs(model, prompt_ids, targets, mask, group_size, shared, pad_token_id, dtype,
                                              with_entropy=True)
        laid_out = lambda values: torch.zeros(targets.numel(), device=targets.device).index_copy(0, rows, values).view_as(targets)  # noqa: E731
        return (laid_out(picked), mask, laid_out(entropy)) if with_entropy else (laid_out(picked), mask)
    input_ids, prompt_mask, position_ids, cache, cache_arg = cached_inputs(model, prompt_ids, shared, pad_token_id,
                                                                          dtype, targets.device)
    with compute(model, dtype):
        out = model(input_ids=input_ids, attention_mask=prompt_mask, position_ids=position_ids,
                    use_cache=True, logits_to_keep=1, **{cache_arg: cache})
        logits = out.logits.repeat_interleave(group_size, dim=0)  # [N, 1, V]: predicts token 0
        if width > 1:
            cache.batch_repeat_interleave(group_size)
            start = position_ids[:, -1:].repeat_interleave(group_size, dim=0) + 1
            attention_mask = torch.cat([prompt_mask.repeat_interleave(group_size, dim=0), mask[:, :-1].long()], dim=1)
            out = model(input_ids=targets[:, :-1], attention_mask=attention_mask,
                        position_ids=start + torch.arange(width - 1, device=targets.device),
                        use_cache=True, **{cache_arg: cache})
            logits = torch.cat([logits, out.logits], dim=1)  # [N, T, V]
    logprobs = _gather_logprobs(logits, targets, mask)
    return (logprobs, mask, _entropy(logits, mask)) if with_entropy else (logprobs, mask)


def _check_inputs(prompt_ids, completion_ids, pad_token_id) -> None:
    if len(prompt_ids) == 0 or len(completion_ids) == 0:
        raise ValueError("no prompts or no completions: log-probs need at least one of each; pass the sampled batch")
    for i, prompt in enumerate(prompt_ids):
        if len(prompt) == 0:
            raise ValueError(f"prompt_ids[{i}] is empty: every prompt needs at least one token; add a BOS or chat-template token")
    if not isinstance(pad_token_id, int) or pad_token_id < 0:
        raise ValueError(f"pad_token_id={pad_token_id!r}: must be a token id (int >= 0); pass the tokenizer's pad or EOS id")


def right_pad(completion_ids, pad_token_id: int, device, min_width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Completion tokens [N, T] right-padded with ``pad_token_id`` and their mask [N, T];
    T is the longest completion, or ``min_width`` when that is more."""
    width = max(max(len(c) for c in completion_ids), min_width or 0)
    targets = torch.full((len(completion_ids), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(completion_ids), width), dtype=torch.bool)
    for n, completion in enumerate(completion_ids):
        targets[n, : len(completion)] = torch.as_tensor(list(completion), dtype=torch.long)
        mask[n, : len(completion)] = True
    return targets.to(device), mask.to(device)


def _empty(targets: torch.Tensor, mask: torch.Tensor, with_entropy: bool):
    zeros = torch.zeros(targets.shape, dtype=torch.float32, device=targets.device)
    return (zeros, mask, zeros.clone()) if with_entropy else (zeros, mask)


# The entropy runs over blocks of positions whose vocabulary-wide temporaries are about this many
# bytes, within a core's L2 cache: at 256 positions of a 49k vocabulary, 6 ms in blocks of 5
# positions against 50 ms in one block (2-core Xeon; the cross-entropy forward took 17 ms).
ENTROPY_BLOCK_BYTES = 2**20


@torch.no_grad()
def _entropy(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The entropy [N, T] of softmax(logits) at each position (fp32, nats), 0 where ``mask`` is
    False: with m = max_v z_v and e_v = exp(z_v − m), H = log Σ_v e_v − Σ_v e_v·(z_v − m) / Σ_v e_v
    (= logsumexp(z) − Σ_v softmax(z)_v·z_v), a cache-sized block of positions at a time."""
    flat = logits.detach().reshape(-1, logits.shape[-1])
    out = torch.empty(flat.shape[0], dtype=torch.float32, device=flat.device)
    block = max(1, ENTROPY_BLOCK_BYTES // (4 * flat.shape[-1]))
    for start in range(0, flat.shape[0], block):
        z = flat[start : start + block].float()
        shifted = z - z.amax(dim=-1, keepdim=True)
        e = shifted.exp()
        total = e.sum(dim=-1)
        out[start : start + z.shape[0]] = total.log() - torch.linalg.vecdot(e, shifted) / total
    return out.view(mask.shape).masked_fill(~mask, 0.0)


def _gather_logprobs(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[target] in float32, as minus the cross-entropy of each position: one
    fused log-softmax-and-pick forward, whose backward is softmax − one-hot (half the time of
    ``logit[target] − logsumexp(logits)`` and its backward over a 49k vocabulary on CPU); 0 where
    ``mask`` is False."""
    logits = logits.float()
    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
    return nll.view(targets.shape).neg().masked_fill(~mask, 0.0)
