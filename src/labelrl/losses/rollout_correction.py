"""The sampler–trainer mismatch: how far apart they are, and truncated importance sampling.

The completions are drawn by one engine (labelrl's decoder, or vLLM) and the loss is taken on
another (the training pass). Both compute log π(token | context) of the same policy, but with
other kernels and roundings, so the sampler's distribution q differs from the trainer's π. The
gradient of a loss on samples from q is then off-policy by however far q is from π.

``mismatch_stats`` measures the gap on the sampled tokens: Schulman's k3 estimate of KL(q ‖ π)
(samples from q, ``log ρ = log π − log q``, ``k3 = ρ − 1 − log ρ``; Schulman 2020, "Approximating
KL Divergence"), and the mean and largest |log π − log q| per token.

``ROLLOUT_CORRECTIONS`` maps a mode to the importance weights ``w`` [N,T] that multiply each
token's surrogate loss (detached: they rescale the gradient, never receive one), from the ratio
``ρ = π / q`` of the trainer's detached log-probs over the sampler's (Espeholt et al. 2018,
"IMPALA", arXiv:1802.01561, §4.1: truncated importance weights; Yao et al. 2025, "Your Efficient
RL Framework Secretly Brings You Off-Policy RL Training": truncated IS for the sampler–trainer
gap). With ``C = max_ratio``:

- ``none``: ``w = 1``.
- ``token_truncate``: ``w_t = min(ρ_t, C)``.
- ``token_mask``: ``w_t = ρ_t`` where ``ρ_t ≤ C``, else 0 (the token is dropped).
- ``sequence_truncate``: ``w_t = min(ρ_seq, C)`` for every token of the sequence, with
  ``ρ_seq = Π_t ρ_t = exp(Σ_t (log π_t − log q_t))`` over its real tokens.
- ``sequence_mask``: ``w_t = ρ_seq`` where ``ρ_seq ≤ C``, else 0 (the sequence is dropped).

This is TRL 1.16's ``vllm_importance_sampling_mode`` with ``vllm_importance_sampling_clip_max =
C`` and no lower bound (its default ``clip_min=None``); a dropped token or sequence still counts
in the aggregation's denominators, as in TRL. Each function returns the weights and, per unit
(a real token for ``token_*``, a sequence for ``sequence_*``), whether its ratio passed ``C``.
"""

from __future__ import annotations

from typing import Callable

import torch

from labelrl.losses.kl import KL_ESTIMATORS
from labelrl.registry import Registry

RolloutCorrection = Callable[..., tuple[torch.Tensor, torch.Tensor]]
ROLLOUT_CORRECTIONS: Registry[RolloutCorrection] = Registry("rollout correction")

DEFAULT_MAX_RATIO = 3.0  # TRL 1.16's vllm_importance_sampling_clip_max


def log_ratios(trainer_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``log π − log q`` per token [N,T], 0 where ``mask`` is False (so padding has ratio 1)."""
    if trainer_logprobs.shape != sampler_logprobs.shape or mask.shape != trainer_logprobs.shape:
        raise ValueError(
            f"trainer log-probs {tuple(trainer_logprobs.shape)}, sampler log-probs {tuple(sampler_logprobs.shape)} "
            f"and mask {tuple(mask.shape)}: all three must be [N, T] over the same completions"
        )
    diff = trainer_logprobs.detach().float() - sampler_logprobs.float()
    return torch.where(mask.bool(), diff, torch.zeros_like(diff))


@ROLLOUT_CORRECTIONS.register("none")
def no_correction(trainer_logprobs, sampler_logprobs, mask, *, max_ratio: float = DEFAULT_MAX_RATIO):
    """Weights 1: the loss treats the samples as the trainer's own."""
    log_ratios(trainer_logprobs, sampler_logprobs, mask)  # the shape check
    return torch.ones_like(trainer_logprobs, dtype=torch.float32), torch.zeros(0, dtype=torch.bool)


@ROLLOUT_CORRECTIONS.register("token_truncate")
def token_truncate(trainer_logprobs, sampler_logprobs, mask, *, max_ratio: float = DEFAULT_MAX_RATIO):
    """``w_t = min(ρ_t, C)``; a real token is bounded when ``ρ_t > C``."""
    ratio = torch.exp(log_ratios(trainer_logprobs, sampler_logprobs, mask))
    return ratio.clamp(max=max_ratio), (ratio > max_ratio)[mask.bool()]


@ROLLOUT_CORRECTIONS.register("token_mask")
def token_mask(trainer_logprobs, sampler_logprobs, mask, *, max_ratio: float = DEFAULT_MAX_RATIO):
    """``w_t = ρ_t`` if ``ρ_t ≤ C`` else 0; a real token is bounded (dropped) when ``ρ_t > C``."""
    ratio = torch.exp(log_ratios(trainer_logprobs, sampler_logprobs, mask))
    over = ratio > max_ratio
    return ratio.masked_fill(over, 0.0), over[mask.bool()]


def _sequence_ratio(trainer_logprobs, sampler_logprobs, mask) -> torch.Tensor:
    """``ρ_seq = exp(Σ_t log ρ_t)`` per sequence [N, 1] over its real tokens."""
    return torch.exp(log_ratios(trainer_logprobs, sampler_logprobs, mask).sum(dim=-1, keepdim=True))


@ROLLOUT_CORRECTIONS.register("sequence_truncate")
def sequence_truncate(trainer_logprobs, sampler_logprobs, mask, *, max_ratio: float = DEFAULT_MAX_RATIO):
    """``w_t = min(ρ_seq, C)`` on every token; a sequence is bounded when ``ρ_seq > C``."""
    ratio = _sequence_ratio(trainer_logprobs, sampler_logprobs, mask)
    return ratio.clamp(max=max_ratio).expand_as(trainer_logprobs), (ratio > max_ratio).squeeze(-1)


@ROLLOUT_CORRECTIONS.register("sequence_mask")
def sequence_mask(trainer_logprobs, sampler_logprobs, mask, *, max_ratio: float = DEFAULT_MAX_RATIO):
    """``w_t = ρ_seq`` if ``ρ_seq ≤ C`` else 0; a sequence is bounded (dropped) when ``ρ_seq > C``."""
    ratio = _sequence_ratio(trainer_logprobs, sampler_logprobs, mask)
    over = ratio > max_ratio
    return ratio.masked_fill(over, 0.0).expand_as(trainer_logprobs), over.squeeze(-1)


def correction_weights(mode: str, trainer_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor,
                       mask: torch.Tensor, max_ratio: float = DEFAULT_MAX_RATIO) -> tuple[torch.Tensor, torch.Tensor]:
    """The weights [N,T] (detached, fp32) of ``mode`` and its bounded units (bool, one per unit)."""
    if not max_ratio > 1:
        raise ValueError(f"rollout_correction_max={max_ratio}: the bound on π/q must exceed 1 (equal policies have "
                         "ratio 1); TRL uses 3.0")
    with torch.no_grad():
        return ROLLOUT_CORRECTIONS.get(mode)(trainer_logprobs, sampler_logprobs, mask, max_ratio=max_ratio)


@torch.no_grad()
def mismatch_stats(trainer_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor) -> dict:
    """Sums over the real tokens (so processes can add theirs): ``kl_sum`` (Σ k3 of KL(q ‖ π)),
    ``abs_diff_sum`` and ``abs_diff_max`` (of |log π − log q|), and ``tokens``."""
    diff = log_ratios(trainer_logprobs, sampler_logprobs, mask)
    keep = mask.bool()
    # k3(logprobs=log q, ref=log π): samples come from q, the sampler.
    k3 = KL_ESTIMATORS.get("k3")(torch.zeros_like(diff), diff)
    absolute = diff.abs()[keep]
    return {"kl_sum": float(k3[keep].sum()), "abs_diff_sum": float(absolute.sum()),
            "abs_diff_max": float(absolute.max()) if absolute.numel() else 0.0, "tokens": int(keep.sum())}
