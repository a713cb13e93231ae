"""GRPO advantage: the reward standardised within its group.

Shao et al. 2024, "DeepSeekMath", arXiv:2402.03300, §4.1.2 (outcome supervision):
``A_i = (r_i − mean(r)) / std(r)``, the same advantage for every token of completion i.
"""

from __future__ import annotations

import torch

from labelrl.advantages.base import DEFAULT_DDOF, DEFAULT_EPS, ESTIMATORS, group_mean, scale


@ESTIMATORS.register("grpo")
def grpo_advantages(
    rewards: torch.Tensor,
    include: torch.Tensor,
    *,
    ddof: int = DEFAULT_DDOF,
    eps: float = DEFAULT_EPS,
    batch_std: bool = False,
    scale_by_std: bool = True,
) -> torch.Tensor:
    """``A = (r − mean_group) / (std_group + eps)`` for rewards ``[B, G]`` → ``[B, G]``.

    ``ddof=1`` (default) is the sample std, as ``torch.std`` and verl's
    ``compute_grpo_outcome_advantage`` use; TRL 1.16 also uses the sample std (its
    ``nanstd`` applies Bessel's correction). ``eps`` defaults to 1e-6 as in verl; TRL 1.16
    adds 1e-4 (pass ``eps=1e-4`` to match it bit for bit). A group whose rewards are all
    equal gets exactly 0. ``batch_std=True`` divides by the std of the whole batch instead;
    ``scale_by_std=False`` (with ``batch_std`` off) divides by nothing, which is Dr. GRPO's
    advantage: TRL's ``scale_rewards`` "group", "batch" and "none" (``labelrl rl --scale``).
    """
    # Deviation from the paper: eps keeps a uniform group (std 0) at 0 instead of 0/0.
    centred = rewards - group_mean(rewards, include)
    return scale(
        centred, rewards, include, by_group_std=scale_by_std and not batch_std, by_batch_std=batch_std,
        ddof=ddof, eps=eps,
    )
