"""Label-token scoring: the probability of each label from one forward pass, no generation.

After the prompt and the answer prefix ``<answer>``, a direct model's next tokens spell the
label. When every label starts with a different token, one forward pass over
``prompt + <answer>`` gives them all: p(label_k) = softmax over the K first-token logits
(for binary, p = P(pos)/(P(pos)+P(neg))). When two labels share their first token, each
label's whole token sequence is scored (K teacher-forced passes) and the K sequence
log-probabilities are normalised the same way.

``dtype`` bf16 runs the forward passes under bf16 autocast with the vocabulary projection
in fp32 (``labelrl.models.precision.compute``); the softmax over labels is fp32. The prompt
prefix a batch shares (template and system message) runs once per batch
(``labelrl.rollout.prefix``).

With ``fast`` weights (``scoring_weights``: a Llama, Qwen2, Qwen3 or Gemma 3 model, any trained
adapter folded in) the one pass runs on the sampler's packed weights without the model's
modules (``labelrl.rollout.fast_decode.last_logits``): fused q/k/v and gate/up products over the
prompts' real tokens only, the same roundings as the module pass in bf16. On 64 vader-movies
val prompts (bf16, AMX Xeon, 2 threads) that took 1.47 s against the modules' 2.09 s in batches
of 16, and 1.28 s in batches of 64 (``benchmarks/scoring.py``). There, a prefix every prompt of
the split shares runs once for all batches (``split_prefix``, the ``past`` of ``score_labels``)
and the last layer runs at each prompt's last token only: 15.18 s against 17.04 s for 512
vader-movies val prompts at one thread (``benchmarks/scoring_split.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from labelrl.data.prompts import ANSWER_PREFIX
from labelrl.rollout.prefix import tail_logits
from labelrl.rollout.sampler import model_device, pad_id
from labelrl.types import LabelSpace


def label_token_ids(tokenizer, labels: LabelSpace) -> list[list[int]]:
    """Token ids of each label as it follows ``<answer>`` (the boundary SFT trains on)."""
    prefix = tokenizer(ANSWER_PREFIX, add_special_tokens=False)["input_ids"]
    out = []
    for label in labels.labels:
        full = tokenizer(ANSWER_PREFIX + label, add_special_tokens=False)["input_ids"]
        if full[: len(prefix)] != prefix or len(full) == len(prefix):
            raise ValueError(
                f"label {label!r}: its tokens merge with '{ANSWER_PREFIX}' in this tokenizer, so "
                "label-token scoring is ill-defined; rename the label (e.g. without leading punctuation)"
            )
        out.append(full[len(prefix):])
    return out


def scoring_weights(model, dtype: torch.dtype):
    """The packed weights ``score_labels`` may run on (``fast``), gathered once for many
    batches; None when the model must keep its modules (``fast_decode.unsupported_reason``)."""
    from labelrl.rollout.fast_decode import fuse_llama, unsupported_reason

    if unsupported_reason(model) is not None:
        return None
    with torch.inference_mode():
        return fuse_llama(model, rows=16, dtype=dtype, fold_all=True)


@dataclass
class SplitPrefix:
    """The first ``length`` tokens every prompt of a split starts with, and each layer's keys
    and values over them (``labelrl.rollout.fast_decode.prefix_kv``)."""

    length: int
    layer_kv: list


@torch.inference_mode()
def split_prefix(model, prompt_ids: Sequence[Sequence[int]], fast) -> SplitPrefix | None:
    """The prefix all of ``prompt_ids`` share, run once for every batch of ``score_labels``
    (``past``), or None: no packed weights, sliding-window layers (they count columns), or
    fewer than ``MIN_SHARED`` shared tokens. Run per batch instead, vader-movies' 130-token
    rubric prefix is a tenth of the positions of a batch of 32 prompts (about 30 tokens each
    after it)."""
    from labelrl.rollout.fast_decode import prefix_kv
    from labelrl.rollout.prefix import shared_prefix_length

    if fast is None or any(layer.sliding_window for layer in fast.layers):
        return None
    shared = shared_prefix_length(prompt_ids)
    if not shared:
        return None
    ids = torch.tensor([list(prompt_ids[0][:shared])], dtype=torch.long, device=model_device(model))
    return SplitPrefix(shared, prefix_kv(fast, ids))


@torch.inference_mode()
def _last_logprobs(model, seqs: Sequence[Sequence[int]], pad: int, dtype: torch.dtype, fast=None,
                   past: SplitPrefix | None = None) -> torch.Tensor:
    # Only the last position's logits are needed: the full [B, L, V] tensor costs an extra
    # vocabulary projection per prompt token and B·L·V floats of memory.
    if fast is not None:
        from labelrl.rollout.fast_decode import last_logits
        from labelrl.rollout.prefix import prefill_inputs, remainder_inputs

        if past is not None:
            logits = last_logits(fast, *remainder_inputs(seqs, past.length, pad, model_device(model)), past=past.layer_kv)
        else:
            sliding = any(layer.sliding_window for layer in fast.layers)
            *inputs, prefix = prefill_inputs(seqs, pad, model_device(model), sliding)
            logits = last_logits(fast, *inputs, prefix=prefix)
    else:
        logits = tail_logits(model, seqs, pad, dtype, 1, model_device(model))[:, -1, :]
    return torch.log_softmax(logits.float(), dim=-1)


@torch.inference_mode()
def _sequence_logprob(model, prefixes: Sequence[Sequence[int]], cont: Sequence[int], pad: int,
                      dtype: torch.dtype) -> torch.Tensor:
    seqs = [list(p) + list(cont) for p in prefixes]
    n = len(cont)
    # The last n+1 positions predict the n continuation tokens (and one past them).
    logits = tail_logits(model, seqs, pad, dtype, n + 1, model_device(model)).float()
    logp = torch.log_softmax(logits[:, :-1, :], dim=-1)
    target = torch.tensor(cont, dtype=torch.long, device=logits.device).expand(len(seqs), n)
    return logp.gather(-1, target.unsqueeze(-1)).squeeze(-1).sum(-1)


def score_labels(
    model, tokenizer, prompt_ids: Sequence[Sequence[int]], labels: LabelSpace, *, batch_size: int = 16,
    dtype: torch.dtype = torch.float32, fast=None, past: SplitPrefix | None = None,
) -> torch.Tensor:
    """Probabilities [N, K] of each label for each prompt (rows sum to 1).

    Prompts are batched in order of length (longest first), so each batch pads its prompts
    to a similar length; the rows come back in the input order. With left padding and the
    attention mask a prompt's scores do not depend on its batch (up to float rounding).
    ``fast``: ``scoring_weights(model, dtype)``, used when every label starts with its own
    token (one pass); labels sharing a first token keep the module pass. ``past``:
    ``split_prefix`` of prompts these start with, used with ``fast``."""
    label_ids = label_token_ids(tokenizer, labels)
    prefix = tokenizer(ANSWER_PREFIX, add_special_tokens=False)["input_ids"]
    pad = pad_id(tokenizer)
    first = [ids[0] for ids in label_ids]
    distinct_first = len(set(first)) == len(first)
    was_training = model.training
    model.eval()
    order = sorted(range(len(prompt_ids)), key=lambda i: -len(prompt_ids[i]))
    rows = []
    for start in range(0, len(order), batch_size):
        chunk = [list(prompt_ids[i]) + prefix for i in order[start : start + batch_size]]
        if distinct_first:
            logp = _last_logprobs(model, chunk, pad, dtype, fast, past)[:, first]
        else:
            logp = torch.stack([_sequence_logprob(model, chunk, ids, pad, dtype) for ids in label_ids], dim=-1)
        rows.append(torch.softmax(logp.float(), dim=-1))
    model.train(was_training)
    if not rows:
        return torch.zeros((0, labels.k))
    scored = torch.cat(rows)
    probs = torch.empty_like(scored)
    probs[torch.tensor(order, device=scored.device)] = scored
    return probs
