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
"""

from __future__ import annotations

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


@torch.inference_mode()
def _last_logprobs(model, seqs: Sequence[Sequence[int]], pad: int, dtype: torch.dtype) -> torch.Tensor:
    # Only the last position's logits are needed: the full [B, L, V] tensor costs an extra
    # vocabulary projection per prompt token and B·L·V floats of memory.
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
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Probabilities [N, K] of each label for each prompt (rows sum to 1).

    Prompts are batched in order of length (longest first), so each batch pads its prompts
    to a similar length; the rows come back in the input order. With left padding and the
    attention mask a prompt's scores do not depend on its batch (up to float rounding)."""
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
            logp = _last_logprobs(model, chunk, pad, dtype)[:, first]
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
