"""What the training pass measures besides the loss: the policy's entropy on the completions, the
sampler–trainer mismatch, and how many tokens or sequences the rollout correction bounded.

All from tensors the pass already holds (its log-probs, the entropy its log-softmax gives for
free, the sampler's log-probs carried in the step's batch), detached and vectorised; taken on
the first of the ``ppo_epochs`` passes, whose weights sampled the batch. They cover the groups
the pass trains on (the skip rule leaves uniform groups out), and are absent on a step whose
groups were all skipped. Under several processes each process's share is measured and the
step's figures are the whole batch's (``step_measures``).
"""

from __future__ import annotations

import numpy as np
import torch

from labelrl import metrics_keys as K
from labelrl.losses.rollout_correction import correction_weights, mismatch_stats
from labelrl.train.distributed import gather_objects, reduce_value

# The correction's bounded units, by mode: tokens or sequences clipped (truncate) or dropped (mask).
BOUNDED_KEY = {"token_truncate": K.MISMATCH_CLIPPED_FRAC, "sequence_truncate": K.MISMATCH_CLIPPED_FRAC,
               "token_mask": K.MISMATCH_MASKED_FRAC, "sequence_mask": K.MISMATCH_MASKED_FRAC}


def padded_logprobs(rows: list[list[float]], like: torch.Tensor) -> torch.Tensor:
    """The sampler's log-probs of ``rows`` as [N, T] like the pass's ``like`` (right-padded with 0)."""
    out = torch.zeros(like.shape, dtype=torch.float32)
    for n, row in enumerate(rows):
        out[n, : len(row)] = torch.as_tensor(row, dtype=torch.float32)
    return out.to(like.device)


@torch.no_grad()
def measure_pass(trainer_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor | None, entropy: torch.Tensor,
                 real: torch.Tensor, loss_mask: torch.Tensor, mode: str, max_ratio: float):
    """The correction's token weights [N, T] (None for ``none`` or without sampler log-probs) and
    this process's raw measures: entropy values and mismatch sums over the ``real`` tokens, the
    bounded units of the correction over the ``loss_mask`` ones (the tokens trained on)."""
    measures = {"entropy": entropy[real].float().cpu().numpy()}
    if sampler_logprobs is None:
        return None, measures
    measures["mismatch"] = mismatch_stats(trainer_logprobs, sampler_logprobs, real)
    if mode == "none":
        return None, measures
    weights, bounded = correction_weights(mode, trainer_logprobs, sampler_logprobs, loss_mask, max_ratio)
    measures["bounded"] = (int(bounded.sum()), int(bounded.numel()), BOUNDED_KEY[mode])
    return weights, measures


def step_measures(accelerator, measures: dict, weight: float) -> dict[str, float]:
    """The step's metrics from every process's raw measures (a process whose share was empty ran
    one group with ``weight`` 0, and its measures count for nothing)."""
    entropy = measures["entropy"] if weight else np.zeros(0, dtype=np.float32)
    values = np.concatenate([np.asarray(v) for v in gather_objects(accelerator, entropy)])
    out: dict[str, float] = {}
    if values.size:
        out[K.ENTROPY_MEAN] = float(values.mean())
        out[K.ENTROPY_P10] = float(np.percentile(values, 10))
    if "mismatch" in measures:
        m = measures["mismatch"]
        tokens = reduce_value(accelerator, m["tokens"] * weight)
        if tokens:
            out[K.MISMATCH_KL] = reduce_value(accelerator, m["kl_sum"] * weight) / tokens
            out[K.MISMATCH_LOGP_DIFF_MEAN] = reduce_value(accelerator, m["abs_diff_sum"] * weight) / tokens
            out[K.MISMATCH_LOGP_DIFF_MAX] = reduce_value(accelerator, m["abs_diff_max"] * weight, "max")
    if "bounded" in measures:
        count, units, key = measures["bounded"]
        total = reduce_value(accelerator, units * weight)
        out[key] = reduce_value(accelerator, count * weight) / total if total else 0.0
    return out
