"""Shared group statistics for the advantage estimators.

Every estimator sees rewards as a ``[B, G]`` tensor (B prompts, G completions each) and an
``include`` mask of the same shape: ``True`` where a rollout counts in its group's baseline.
The statistics here ignore excluded rollouts; ``compute_advantages`` sets their advantage to 0.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import torch

from labelrl.registry import Registry

Estimator = Callable[..., torch.Tensor]
ESTIMATORS: Registry[Estimator] = Registry("advantage estimator")

DEFAULT_EPS = 1e-6
DEFAULT_DDOF = 1


def group_mean(rewards: torch.Tensor, include: torch.Tensor) -> torch.Tensor:
    """Mean reward of the included rollouts of each group → ``[B, 1]`` (0 for an empty group).

    The mean is taken as ``ref + mean(r − ref)`` with ``ref`` the group's first included
    reward, so that a group whose rewards are all equal gets back exactly that reward: a plain
    ``sum / n`` can be off by one ulp (``(0.1 + 0.1 + 0.1) / 3 ≠ 0.1``), which would hand a
    uniform group tiny non-zero advantages and make it look informative to the skip rule.
    """
    ref = first_included(rewards, include)
    diffs = torch.where(include, rewards - ref, torch.zeros_like(rewards))
    count = include.sum(dim=1, keepdim=True).clamp(min=1).to(rewards.dtype)
    return ref + diffs.sum(dim=1, keepdim=True) / count


def first_included(rewards: torch.Tensor, include: torch.Tensor) -> torch.Tensor:
    """Reward of each group's first included rollout → ``[B, 1]`` (0 when none is included)."""
    index = include.to(torch.int8).argmax(dim=1, keepdim=True)
    ref = rewards.gather(1, index)
    return torch.where(include.any(dim=1, keepdim=True), ref, torch.zeros_like(ref))


def group_std(rewards: torch.Tensor, include: torch.Tensor, ddof: int) -> torch.Tensor:
    """Standard deviation of the included rewards of each group → ``[B, 1]``.

    ``ddof=1`` is the sample std (Bessel's correction: divide by n − 1), as ``torch.std``,
    verl and TRL use; ``ddof=0`` the population std. A group with n ≤ ddof included rollouts
    has std 0 (there is no spread to measure).
    """
    mean = group_mean(rewards, include)
    sq = torch.where(include, (rewards - mean) ** 2, torch.zeros_like(rewards))
    dof = include.sum(dim=1, keepdim=True).to(rewards.dtype) - ddof
    var = sq.sum(dim=1, keepdim=True) / dof.clamp(min=1)
    return torch.where(dof > 0, var.sqrt(), torch.zeros_like(var))


def batch_std(rewards: torch.Tensor, include: torch.Tensor, ddof: int) -> torch.Tensor:
    """Standard deviation of all included rewards of the batch, as a ``[1, 1]`` tensor."""
    flat = rewards.reshape(1, -1)
    return group_std(flat, include.reshape(1, -1), ddof)


def scale(
    centred: torch.Tensor,
    rewards: torch.Tensor,
    include: torch.Tensor,
    *,
    by_group_std: bool,
    by_batch_std: bool,
    ddof: int,
    eps: float,
) -> torch.Tensor:
    """Divide centred advantages by a std + eps: the group's, the batch's, or none.

    The batch variant keeps the group baseline but takes the spread from the whole batch,
    as REINFORCE++ (Hu 2025, arXiv:2501.03262: batch-level normalisation) and "Lite PPO"
    (Liu et al. 2025, "Part I: Tricks or Traps? A Deep Dive into RL for LLM Reasoning",
    arXiv:2508.08221: group-level mean, batch-level std) do; TRL calls it ``scale_rewards="batch"``.
    """
    if by_group_std and by_batch_std:
        raise ValueError(
            "batch_std=True replaces the group std; it cannot be combined with a group std "
            "scaling; drop one of the two options"
        )
    if ddof not in (0, 1):
        raise ValueError(f"ddof={ddof}: use 1 (sample std, the default) or 0 (population std)")
    if not eps > 0:
        raise ValueError(
            f"eps={eps}: the std offset must be > 0 (a uniform group has std 0); use the default 1e-6"
        )
    if by_batch_std:
        return centred / (batch_std(rewards, include, ddof) + eps)
    if by_group_std:
        return centred / (group_std(rewards, include, ddof) + eps)
    return centred


def check_options(kind: str, name: str, fn: Callable[..., Any], options: dict[str, Any]) -> None:
    """Raise a ValueError naming an option ``fn`` does not take, and the ones it does."""
    params = inspect.signature(fn).parameters
    accepted = [p for p, spec in params.items() if spec.kind is inspect.Parameter.KEYWORD_ONLY]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(
            f"{kind} {name!r} has no option {unknown[0]!r}: its options are "
            f"{', '.join(accepted) or '(none)'}"
        )
