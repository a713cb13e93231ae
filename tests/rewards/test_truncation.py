"""Reference and property tests for labelrl.rewards.truncation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labelrl.rewards.truncation import TRUNCATION_POLICIES, apply_truncation, overlong_penalty


def test_registry_holds_the_three_policies():
    assert TRUNCATION_POLICIES.names() == ["mask", "soft_penalty", "zero"]
    with pytest.raises(ValueError, match="unknown truncation policy 'drop': choose one of mask, soft_penalty, zero"):
        apply_truncation([1.0], [3], [True], policy="drop", failure_reward=0.0)


def test_dapo_overlong_penalty_reference():
    # DAPO (Yu et al. 2025) Eq. 13 with L_max = 20480, L_cache = 4096, so L_max − L_cache = 16384:
    # 16384 ≤ 16384 → 0; (16384 − 18432) / 4096 = −0.5; (16384 − 20480) / 4096 = −1; beyond L_max → −1
    assert overlong_penalty(16384, 20480, 4096) == 0.0
    assert overlong_penalty(18432, 20480, 4096) == -0.5
    assert overlong_penalty(20480, 20480, 4096) == -1.0
    assert overlong_penalty(20481, 20480, 4096) == -1.0
    assert overlong_penalty(17408, 20480, 4096) == -0.25  # (16384 − 17408) / 4096
    assert overlong_penalty(10, 20480, 4096) == 0.0


def test_soft_penalty_adds_to_every_reward_and_keeps_all_in_loss():
    out = apply_truncation(
        [1.0, 1.0, 0.0, 0.0], [24, 28, 32, 10], [False, False, True, False],
        policy="soft_penalty", failure_reward=0.0, max_new_tokens=32, cache_tokens=8,
    )
    # free length 32 − 8 = 24: 24 → 0; 28 → (24 − 28)/8 = −0.5; 32 → −1; 10 → 0
    assert out.rewards == [1.0, 0.5, -1.0, 0.0]
    assert out.loss_mask == [True] * 4 and out.baseline_mask == [True] * 4


def test_zero_scores_truncated_completions_as_failure_even_when_they_parsed():
    out = apply_truncation([1.0, 1.0, 0.5], [5, 8, 8], [False, True, True], policy="zero", failure_reward=[-1.0, -2.0, -3.0])
    assert out.rewards == [1.0, -2.0, -3.0]  # per-completion failure rewards
    assert out.loss_mask == [True] * 3 and out.baseline_mask == [True] * 3
    assert apply_truncation([1.0], None, [True], policy="zero", failure_reward=0.0).rewards == [0.0]


def test_mask_drops_truncated_from_loss_and_by_default_from_the_baseline():
    rewards, truncated = [1.0, 0.0, 0.0], [False, True, False]
    out = apply_truncation(rewards, None, truncated, policy="mask", failure_reward=0.0)
    assert out.rewards == [1.0, 0.0, 0.0]
    assert out.loss_mask == [True, False, True]
    assert out.baseline_mask == [True, False, True]
    kept = apply_truncation(rewards, None, truncated, policy="mask", failure_reward=0.0, mask_in_baseline=True)
    assert kept.loss_mask == [True, False, True]
    assert kept.baseline_mask == [True, True, True]


def test_invalid_inputs_raise_value_error_naming_the_value():
    with pytest.raises(ValueError, match="batch sizes differ"):
        apply_truncation([1.0, 0.0], [3], [False, False], policy="zero", failure_reward=0.0)
    with pytest.raises(ValueError, match="needs each completion's length"):
        apply_truncation([1.0], None, [False], policy="soft_penalty", failure_reward=0.0, max_new_tokens=8, cache_tokens=2)
    with pytest.raises(ValueError, match="cache_tokens=9"):
        overlong_penalty(3, 8, 9)
    with pytest.raises(ValueError, match="cache_tokens=None"):
        apply_truncation([1.0], [3], [False], policy="soft_penalty", failure_reward=0.0, max_new_tokens=8)
    with pytest.raises(ValueError, match="max_new_tokens=0"):
        overlong_penalty(3, 0, 1)


@settings(max_examples=200, deadline=None)
@given(cap=st.integers(1, 4096), data=st.data())
def test_soft_penalty_is_within_minus_one_and_zero_and_never_rewards_length(cap, data):
    cache = data.draw(st.integers(1, cap))
    a = data.draw(st.integers(0, cap + 10))
    b = data.draw(st.integers(a, cap + 10))
    pa, pb = overlong_penalty(a, cap, cache), overlong_penalty(b, cap, cache)
    assert -1.0 <= pb <= pa <= 0.0
    assert overlong_penalty(cap, cap, cache) == -1.0
