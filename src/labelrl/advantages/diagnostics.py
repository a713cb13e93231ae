"""What the advantages did this step: uniform groups, rewarded failures, CoRPO regimes, label mix.

These numbers answer "is the RL signal plumbed right?": a high ``groups/uniform_frac`` means
most prompts teach nothing; a non-zero ``adv/failed_positive_frac`` means wrong answers are
being reinforced (GRPO/Dr. GRPO can do this with partial credit; CoRPO cannot); the label
shares show whether the skip rule trains on one label far more than the data holds.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from labelrl import metrics_keys as K
from labelrl.advantages import compute_advantages
from labelrl.advantages.base import group_mean

UNIFORM_TOLERANCE = 1e-9


def uniform_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """``BoolTensor[B]``: True where all G rewards of the group are equal (within 1e-9).

    ``rewards`` is flat ``[B*G]`` (groups contiguous) or ``[B, G]``. The trainer's skip rule
    and ``groups/uniform_frac`` use this definition.
    """
    grouped = _grouped(rewards, group_size)
    spread = grouped.max(dim=1).values - grouped.min(dim=1).values
    return spread <= UNIFORM_TOLERANCE


def is_informative(rewards: torch.Tensor, group_size: int, estimator: str = "grpo", **options: Any) -> torch.Tensor:
    """``BoolTensor[B]``: True where some advantage of the group is non-zero.

    A group is uninformative when all its advantages are exactly 0, so it contributes no
    gradient. For grpo, dr_grpo and rloo that is exactly the uniform groups; for corpo a group
    failing uniformly below τ is informative (every rollout gets r − τ < 0).
    ``options`` (including ``mask``) go to ``compute_advantages``.
    """
    advantages = compute_advantages(rewards, group_size, estimator, **options)
    return (_grouped(advantages, group_size) != 0).any(dim=1)


def advantage_diagnostics(
    rewards: torch.Tensor,
    advantages: torch.Tensor,
    group_size: int,
    *,
    success_threshold: float,
    labels: Sequence[str] | None = None,
    label_names: Sequence[str] | None = None,
    data_label_share: Mapping[str, float] | None = None,
    corpo_threshold: float | None = None,
    baseline_mask: torch.Tensor | None = None,
) -> dict[str, float]:
    """One step's advantage diagnostics, keyed by ``labelrl.metrics_keys`` names.

    - ``groups/uniform_frac``: share of groups whose rewards are all equal (``uniform_groups``).
    - ``adv/failed_positive_frac``: among failed rollouts (reward < ``success_threshold``),
      the share with advantage > 0; 0 when nothing failed. ``adv/failed_positive_count``: how many.
    - ``adv/mean``, ``adv/abs_mean``: mean of A and of |A| over all rollouts.
    - with ``corpo_threshold`` τ: ``adv/corpo_correctness_regime_frac`` (share of groups with
      mean < τ, baseline τ) and ``adv/corpo_preference_regime_frac`` (mean ≥ τ, baseline mean),
      the mean taken over ``baseline_mask`` (``[B*G]``, True where a rollout counts in its
      group's baseline; default all), as the estimator takes it: under ``truncation: mask`` the
      regimes are the ones the baseline was actually in.
    - with ``labels`` (one reference label per group): for each label,
      ``groups/label_share_informative/<label>`` (its share among the groups that carry a
      gradient, i.e. have a non-zero advantage: what the skip rule keeps, so under CoRPO the
      uniformly failing groups count too; 0 when no group does) and, for labels in ``data_label_share``,
      ``groups/label_share_data/<label>`` (its share in the training data, passed through).
      ``label_names`` fixes which labels are reported (default: the labels seen).
    """
    flat_rewards = torch.as_tensor(rewards, dtype=torch.float64).reshape(-1)
    flat_adv = torch.as_tensor(advantages, dtype=torch.float64).reshape(-1)
    if flat_adv.shape != flat_rewards.shape:
        raise ValueError(
            f"{flat_adv.numel()} advantages for {flat_rewards.numel()} rewards: pass one advantage per rollout"
        )
    uniform = uniform_groups(flat_rewards, group_size)
    out = {
        K.UNIFORM_FRAC: uniform.double().mean().item(),
        K.ADV_MEAN: flat_adv.mean().item(),
        K.ADV_ABS_MEAN: flat_adv.abs().mean().item(),
        **_failed_positive(flat_rewards, flat_adv, success_threshold),
    }
    if corpo_threshold is not None:
        include = None if baseline_mask is None else torch.as_tensor(baseline_mask, dtype=torch.bool).reshape(-1)
        out.update(_corpo_regimes(flat_rewards, group_size, corpo_threshold, include))
    if labels is not None:
        informative = (_grouped(flat_adv, group_size) != 0).any(dim=1)
        out.update(_label_shares(labels, informative, label_names, data_label_share))
    return out


def _failed_positive(rewards: torch.Tensor, advantages: torch.Tensor, success_threshold: float) -> dict[str, float]:
    failed = rewards < success_threshold
    rewarded = failed & (advantages > 0)
    count = int(rewarded.sum())
    n_failed = int(failed.sum())
    return {
        K.FAILED_POSITIVE_FRAC: count / n_failed if n_failed else 0.0,
        K.FAILED_POSITIVE_COUNT: float(count),
    }


def _corpo_regimes(rewards: torch.Tensor, group_size: int, threshold: float,
                   include: torch.Tensor | None = None) -> dict[str, float]:
    grouped = _grouped(rewards, group_size)
    mask = torch.ones_like(grouped, dtype=torch.bool) if include is None else _grouped(include, group_size)
    # The same group mean over the same rollouts the corpo estimator compares with τ, so the
    # regimes match its choice (a group with none included: mean 0 < τ, baseline τ, as there).
    means = group_mean(grouped, mask).squeeze(1)
    correctness = (means < threshold).double().mean().item()
    return {K.CORPO_CORRECTNESS_REGIME: correctness, K.CORPO_PREFERENCE_REGIME: 1.0 - correctness}


def _label_shares(
    labels: Sequence[str],
    informative: torch.Tensor,
    label_names: Sequence[str] | None,
    data_label_share: Mapping[str, float] | None,
) -> dict[str, float]:
    if len(labels) != len(informative):
        raise ValueError(
            f"{len(labels)} labels for {len(informative)} groups: pass one reference label per group (prompt)"
        )
    names = list(label_names) if label_names is not None else sorted(set(labels))
    kept = [label for label, keep in zip(labels, informative.tolist()) if keep]
    out = {}
    for name in names:
        share = kept.count(name) / len(kept) if kept else 0.0
        out[K.per_label(K.LABEL_SHARE_INFORMATIVE, name)] = share
        if data_label_share is not None and name in data_label_share:
            out[K.per_label(K.LABEL_SHARE_DATA, name)] = float(data_label_share[name])
    return out


def _grouped(values: torch.Tensor, group_size: int) -> torch.Tensor:
    values = torch.as_tensor(values)
    if group_size < 2:
        raise ValueError(
            f"group_size={group_size}: GRPO needs at least 2 completions per prompt; set --group-size 2 or more"
        )
    if values.numel() == 0 or values.numel() % group_size:
        raise ValueError(
            f"{values.numel()} values with group_size={group_size}: the count must be a positive "
            "multiple of group_size (G completions per prompt, contiguous)"
        )
    return values.reshape(-1, group_size)
