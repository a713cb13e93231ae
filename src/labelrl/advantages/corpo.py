"""CoRPO advantage: the group mean as baseline, but never below a correctness threshold τ.

Garg et al. 2025, "CoRPO: Adding a Correctness Bias to GRPO Improves Generalization"
(first version titled "The Peril of Preference: Why GRPO fails on Ordinal Rewards"),
arXiv:2511.04439: ``b = max(mean(r), τ)``, ``A_i = r_i − b``.

Two regimes. When the group's mean is below τ (correctness-seeking), the baseline is τ, so
every rollout below τ is pushed down and only rollouts above τ are pushed up; a group whose
mean is at or above τ (preference-seeking) is treated exactly as Dr. GRPO treats it.
"""

from __future__ import annotations

import math

import torch

from labelrl.advantages.base import DEFAULT_DDOF, DEFAULT_EPS, ESTIMATORS, group_mean, scale


@ESTIMATORS.register("corpo")
def corpo_advantages(
    rewards: torch.Tensor,
    include: torch.Tensor,
    *,
    threshold: float | None = None,
    scale_by_std: bool = False,
    batch_std: bool = False,
    ddof: int = DEFAULT_DDOF,
    eps: float = DEFAULT_EPS,
) -> torch.Tensor:
    """``A = r − max(mean_group, τ)`` for rewards ``[B, G]`` → ``[B, G]``, τ = ``threshold``.

    ``threshold`` is required and in reward units (e.g. 0.5 for 0/1 rewards, 3 for grades
    1–5). Guarantees: every r < τ gets A < 0; a group with mean ≥ τ gets exactly the Dr. GRPO
    advantage; a group failing uniformly below τ gets ``r − τ < 0``, not 0.

    ``scale_by_std`` (off by default) divides by the group std + eps. It is off because a
    uniformly failing group has std 0: its push-down ``(r − τ) / eps`` would grow without
    bound as eps shrinks, and for other groups it rescales the correctness margin ``r − τ``
    by a spread that says nothing about how wrong the answers are. ``batch_std=True``
    divides by the batch std instead, one factor for all groups.
    """
    if threshold is None:
        raise ValueError(
            "estimator 'corpo' needs its correctness threshold: pass threshold=τ in reward "
            "units (--threshold; e.g. 0.5 for 0/1 rewards, 3 for grades 1–5)"
        )
    if not math.isfinite(threshold):
        raise ValueError(f"threshold={threshold}: the CoRPO threshold must be a finite reward value")
    # The baseline is one number per group and the advantage one subtraction r − b, so the
    # sign guarantee holds in floating point: r < τ ≤ b gives fl(r − b) < 0.
    baseline = group_mean(rewards, include).clamp(min=threshold)
    centred = rewards - baseline
    return scale(
        centred, rewards, include, by_group_std=scale_by_std, by_batch_std=batch_std, ddof=ddof, eps=eps
    )
