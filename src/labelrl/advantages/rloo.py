"""RLOO advantage: the reward minus the mean of the other G − 1 rewards of its group.

Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style Optimization for Learning
from Human Feedback in LLMs", arXiv:2402.14740 (after Kool et al. 2019, "Buy 4
REINFORCE Samples, Get a Baseline for Free!"): ``A_i = r_i − 1/(G−1) Σ_{j≠i} r_j``.
The leave-one-out baseline does not depend on r_i, so the gradient estimate is unbiased;
algebraically ``A_i = G/(G−1) · (r_i − mean(r))``, a rescaled Dr. GRPO advantage.
"""

from __future__ import annotations

import torch

from labelrl.advantages.base import DEFAULT_DDOF, DEFAULT_EPS, ESTIMATORS, first_included, scale


@ESTIMATORS.register("rloo")
def rloo_advantages(
    rewards: torch.Tensor,
    include: torch.Tensor,
    *,
    batch_std: bool = False,
    scale_by_std: bool = False,
    ddof: int = DEFAULT_DDOF,
    eps: float = DEFAULT_EPS,
) -> torch.Tensor:
    """``A_i = r_i − mean_{j≠i}(r_j)`` over included rollouts, rewards ``[B, G]`` → ``[B, G]``.

    A rollout whose group has no other included rollout has no baseline and gets 0.
    ``batch_std=True`` divides by the std of the whole batch (+ ``eps``), ``scale_by_std=True`` by
    the group std of the included rewards (+ ``eps``), so that ``--scale`` means the same for
    every estimator.
    """
    # Sums are taken relative to the group's first included reward, so that a uniform group
    # gets exactly 0 (see base.group_mean).
    ref = first_included(rewards, include)
    diffs = torch.where(include, rewards - ref, torch.zeros_like(rewards))
    others = include.sum(dim=1, keepdim=True).to(rewards.dtype) - 1
    baseline = ref + (diffs.sum(dim=1, keepdim=True) - diffs) / others.clamp(min=1)
    centred = torch.where(others > 0, rewards - baseline, torch.zeros_like(rewards))
    return scale(centred, rewards, include, by_group_std=scale_by_std, by_batch_std=batch_std, ddof=ddof, eps=eps)
