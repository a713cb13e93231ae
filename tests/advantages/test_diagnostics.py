"""advantage_diagnostics, uniform_groups, is_informative."""

from __future__ import annotations

import pytest
import torch

from labelrl import metrics_keys as K
from labelrl.advantages import compute_advantages
from labelrl.advantages.diagnostics import (
    advantage_diagnostics,
    is_informative,
    uniform_groups,
)

# group 0: partial credit, all failing a 0.5 threshold; group 1: all correct; group 2: all zero
REWARDS = torch.tensor([0.1, 0.2, 0.2, 0.4, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64)


def test_uniform_groups_exact_and_within_tolerance():
    rewards = torch.tensor([0.3, 0.3, 0.3 + 5e-10, 0.3, 0.0, 1e-8], dtype=torch.float64)
    # group 0 spread 0 → uniform; group 1 spread 5e-10 ≤ 1e-9 → uniform; group 2 spread 1e-8 → not
    assert uniform_groups(rewards, 2).tolist() == [True, True, False]
    assert uniform_groups(REWARDS.reshape(3, 4), 4).tolist() == [False, True, True]


def test_dr_grpo_diagnostics_reference():
    adv = compute_advantages(REWARDS, 4, "dr_grpo")
    out = advantage_diagnostics(REWARDS, adv, 4, success_threshold=0.5)
    # uniform groups: 1 and 2 → 2/3
    assert out[K.UNIFORM_FRAC] == pytest.approx(2 / 3)
    # failed (< 0.5): the 4 of group 0 and the 4 of group 2 = 8; positive among them:
    # 0.4 − 0.225 = +0.175 only → 1 / 8
    assert out[K.FAILED_POSITIVE_FRAC] == pytest.approx(1 / 8)
    assert out[K.FAILED_POSITIVE_COUNT] == 1.0
    # Dr. GRPO advantages sum to 0 per group → mean 0; |A| = 0.125 + 0.025·2 + 0.175 = 0.35 over 12
    assert out[K.ADV_MEAN] == pytest.approx(0.0, abs=1e-12)
    assert out[K.ADV_ABS_MEAN] == pytest.approx(0.35 / 12)
    assert K.CORPO_CORRECTNESS_REGIME not in out  # only with corpo_threshold


def test_corpo_diagnostics_reference():
    adv = compute_advantages(REWARDS, 4, "corpo", threshold=0.5)
    out = advantage_diagnostics(REWARDS, adv, 4, success_threshold=0.5, corpo_threshold=0.5)
    assert out[K.FAILED_POSITIVE_FRAC] == 0.0 and out[K.FAILED_POSITIVE_COUNT] == 0.0
    # group means 0.225 (< τ), 1.0 (≥ τ), 0.0 (< τ) → correctness 2/3, preference 1/3
    assert out[K.CORPO_CORRECTNESS_REGIME] == pytest.approx(2 / 3)
    assert out[K.CORPO_PREFERENCE_REGIME] == pytest.approx(1 / 3)


def test_corpo_regimes_use_the_baseline_mask_the_estimator_used():
    # Truncation "mask": group 0 = [1, 1, 0, 0] with both 0s truncated and out of the baseline;
    # group 1 = [1, 0, 0, 0] all counted. τ = 0.75. The estimator's mean of group 0 is over its
    # included rollouts: 1.0 ≥ τ → preference; group 1: 0.25 < τ → correctness. Over all
    # rollouts group 0 would be 0.5 < τ → correctness: a diagnostic ignoring the mask reports
    # correctness 2/2 while the baseline was in each regime once.
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    include = torch.tensor([True, True, False, False, True, True, True, True])
    adv = compute_advantages(rewards, 4, "corpo", threshold=0.75, mask=include)
    assert adv[:2].tolist() == [0.0, 0.0]  # baseline max(1.0, 0.75) = 1.0: the estimator's regime is preference
    out = advantage_diagnostics(rewards, adv, 4, success_threshold=1.0, corpo_threshold=0.75, baseline_mask=include)
    assert out[K.CORPO_PREFERENCE_REGIME] == pytest.approx(1 / 2)
    assert out[K.CORPO_CORRECTNESS_REGIME] == pytest.approx(1 / 2)
    unmasked = advantage_diagnostics(rewards, adv, 4, success_threshold=1.0, corpo_threshold=0.75)
    assert unmasked[K.CORPO_CORRECTNESS_REGIME] == pytest.approx(1.0)  # what the mask changes


def test_no_failed_rollouts_gives_zero_fraction_and_count():
    rewards = torch.tensor([1.0, 0.8, 0.9, 1.0])
    adv = compute_advantages(rewards, 2, "grpo")
    out = advantage_diagnostics(rewards, adv, 2, success_threshold=0.5)
    assert out[K.FAILED_POSITIVE_FRAC] == 0.0 and out[K.FAILED_POSITIVE_COUNT] == 0.0


def test_label_shares_among_informative_groups():
    adv = compute_advantages(REWARDS, 4, "dr_grpo")
    out = advantage_diagnostics(
        REWARDS, adv, 4, success_threshold=0.5, labels=["spam", "ham", "ham"],
        label_names=["ham", "spam"], data_label_share={"ham": 0.87, "spam": 0.13},
    )
    # only group 0 (spam) is non-uniform → spam 1.0, ham 0.0 among informative; data shares passed through
    assert out[K.per_label(K.LABEL_SHARE_INFORMATIVE, "spam")] == 1.0
    assert out[K.per_label(K.LABEL_SHARE_INFORMATIVE, "ham")] == 0.0
    assert out[K.per_label(K.LABEL_SHARE_DATA, "ham")] == 0.87
    assert out[K.per_label(K.LABEL_SHARE_DATA, "spam")] == 0.13


def test_label_shares_when_every_group_is_uniform():
    rewards = torch.zeros(4)
    out = advantage_diagnostics(rewards, rewards, 2, success_threshold=0.5, labels=["a", "b"])
    assert out[K.per_label(K.LABEL_SHARE_INFORMATIVE, "a")] == 0.0
    assert out[K.per_label(K.LABEL_SHARE_INFORMATIVE, "b")] == 0.0


def test_label_count_must_match_groups():
    with pytest.raises(ValueError, match="one reference label per group"):
        advantage_diagnostics(REWARDS, REWARDS, 4, success_threshold=0.5, labels=["a", "b"])


def test_advantage_count_must_match_rewards():
    with pytest.raises(ValueError, match="one advantage per rollout"):
        advantage_diagnostics(REWARDS, REWARDS[:8], 4, success_threshold=0.5)


def test_is_informative_depends_on_the_estimator():
    # group 2 fails uniformly (all 0): zero advantages under dr_grpo, r − τ = −0.5 under corpo
    assert is_informative(REWARDS, 4, "dr_grpo").tolist() == [True, False, False]
    assert is_informative(REWARDS, 4, "grpo").tolist() == [True, False, False]
    assert is_informative(REWARDS, 4, "corpo", threshold=0.5).tolist() == [True, False, True]


def test_is_informative_with_a_mask():
    mask = torch.ones(12, dtype=torch.bool)
    mask[0:3] = False  # group 0 keeps only 0.4: a lone rollout has advantage 0
    assert is_informative(REWARDS, 4, "dr_grpo", mask=mask).tolist() == [False, False, False]
