"""Group-relative advantage estimators behind one registry.

``compute_advantages(rewards, group_size, "grpo")`` is the only entry point the trainer uses;
each estimator (grpo, dr_grpo, rloo, corpo) is a pure function of a ``[B, G]`` reward tensor
registered in ``ESTIMATORS``. docs/algorithms.md gives each formula and the test that pins it.
"""

from __future__ import annotations

from typing import Any

import torch

from labelrl.advantages import corpo, dr_grpo, grpo, rloo  # noqa: F401  (registers the estimators)
from labelrl.advantages.base import ESTIMATORS, check_options

__all__ = ["ESTIMATORS", "compute_advantages"]


def compute_advantages(
    rewards: Any,
    group_size: int,
    estimator: str = "grpo",
    *,
    mask: torch.Tensor | None = None,
    **options: Any,
) -> torch.Tensor:
    """Advantages of rollouts grouped by prompt; same shape as ``rewards``.

    ``rewards``: ``[B*G]`` with the G completions of each prompt contiguous (rows
    ``i*G … i*G+G−1`` belong to prompt i), or ``[B, G]``. Integer rewards are promoted to the
    default float dtype. ``estimator``: a name in ``ESTIMATORS``; ``options`` go to it
    (``ddof``, ``eps``, ``scale_by_std``, ``batch_std``; ``threshold`` for corpo).
    ``mask`` (bool, same shape): ``True`` where a rollout counts in its group's baseline;
    ``False`` rollouts (e.g. truncated ones under the ``mask`` truncation policy) are left out
    of every statistic and get advantage 0. ``None`` counts every rollout.

    Raises ValueError for group_size < 2, a length not divisible by group_size, a mask of
    another shape, non-finite rewards, an unknown estimator or an option it does not take.
    """
    fn = ESTIMATORS.get(estimator)
    check_options("advantage estimator", estimator, fn, options)
    values = _as_float(rewards)
    grouped = _grouped(values, group_size)
    include = _include(mask, values, grouped.shape)
    advantages = fn(grouped, include, **options)
    advantages = torch.where(include, advantages, torch.zeros_like(advantages))
    return advantages.reshape(values.shape)


def _as_float(rewards: Any) -> torch.Tensor:
    values = torch.as_tensor(rewards)
    if not values.is_floating_point():
        values = values.to(torch.get_default_dtype())
    if values.dim() not in (1, 2):
        raise ValueError(
            f"rewards of shape {tuple(values.shape)}: pass a flat [B*G] tensor (groups "
            "contiguous) or a [B, G] tensor"
        )
    bad = (~torch.isfinite(values)).nonzero()
    if len(bad):
        index = tuple(bad[0].tolist())
        raise ValueError(
            f"rewards{list(index)}={values[index].item()}: every reward must be finite; "
            "check the reward function (a parse failure should get the failure reward, not NaN)"
        )
    return values


def _grouped(values: torch.Tensor, group_size: int) -> torch.Tensor:
    if group_size < 2:
        raise ValueError(
            f"group_size={group_size}: GRPO needs at least 2 completions per prompt; "
            "set --group-size 2 or more"
        )
    if values.dim() == 2:
        if values.shape[1] != group_size:
            raise ValueError(
                f"rewards of shape {tuple(values.shape)} with group_size={group_size}: a [B, G] "
                "tensor needs G == group_size; pass the flat [B*G] tensor or fix group_size"
            )
        return values
    if values.numel() == 0 or values.numel() % group_size:
        raise ValueError(
            f"{values.numel()} rewards with group_size={group_size}: the count must be a "
            "positive multiple of group_size (G completions per prompt, contiguous)"
        )
    return values.reshape(-1, group_size)


def _include(mask: torch.Tensor | None, values: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    if mask is None:
        return torch.ones(shape, dtype=torch.bool, device=values.device)
    mask = torch.as_tensor(mask, device=values.device)
    if mask.shape != values.shape:
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} for rewards of shape {tuple(values.shape)}: "
            "pass one bool per rollout, shaped like rewards"
        )
    if mask.dtype != torch.bool:
        raise ValueError(f"mask of dtype {mask.dtype}: pass a bool tensor (True = counts in the baseline)")
    return mask.reshape(shape)
