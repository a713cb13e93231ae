"""Dr. GRPO advantage: the reward minus its group mean, no std division.

Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical Perspective",
arXiv:2503.20783: dividing by the group std over-weights prompts that are nearly
always (or never) solved (a "question-level difficulty bias"); Dr. GRPO drops it.
"""

from __future__ import annotations

import torch

from labelrl.advantages.base import DEFAULT_DDOF, DEFAULT_EPS, ESTIMATORS, group_mean, scale


@ESTIMATORS.register("dr_grpo")
def dr_grpo_advantages(
    rewards: torch.Tensor,
    include: torch.Tensor,
    *,
    batch_std: bool = False,
    scale_by_std: bool = False,
    ddof: int = DEFAULT_DDOF,
    eps: float = DEFAULT_EPS,
) -> torch.Tensor:
    """``A = r − mean_group`` for rewards ``[B, G]`` → ``[B, G]``, in reward units.

    ``batch_std=True`` divides by the std of the whole batch (+ ``eps``, ``ddof`` as in grpo),
    which rescales every group alike and so keeps Dr. GRPO free of the per-group bias.
    ``scale_by_std=True`` divides by the group std (+ ``eps``), which is GRPO's advantage; it
    exists so that ``--scale group`` means the same for every estimator.
    """
    centred = rewards - group_mean(rewards, include)
    return scale(centred, rewards, include, by_group_std=scale_by_std, by_batch_std=batch_std, ddof=ddof, eps=eps)
