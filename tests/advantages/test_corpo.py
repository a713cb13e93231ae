"""CoRPO: baseline max(group mean, τ); A = r − baseline."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from labelrl.advantages import compute_advantages


def _t(values):
    return torch.tensor(values, dtype=torch.float64)


def test_preference_regime_equals_dr_grpo():
    # mean = 0.5 ≥ τ = 0.5 → baseline = mean = 0.5 → identical to Dr. GRPO: −0.3, −0.1, −0.1, +0.5
    rewards = _t([0.2, 0.4, 0.4, 1.0])
    corpo = compute_advantages(rewards, 4, "corpo", threshold=0.5)
    assert torch.equal(corpo, compute_advantages(rewards, 4, "dr_grpo"))
    torch.testing.assert_close(corpo, _t([-0.3, -0.1, -0.1, 0.5]))


def test_correctness_regime_never_rewards_a_failure():
    # mean = 0.9 / 4 = 0.225 < τ = 0.5 → baseline 0.5 → A = r − 0.5 = −0.4, −0.3, −0.3, −0.1
    # (Dr. GRPO would give the 0.4 failure +0.175)
    adv = compute_advantages(_t([0.1, 0.2, 0.2, 0.4]), 4, "corpo", threshold=0.5)
    torch.testing.assert_close(adv, _t([-0.4, -0.3, -0.3, -0.1]))


def test_ordinal_grades():
    # grades 1–5, τ = 3: mean (1 + 2 + 2 + 5) / 4 = 2.5 < 3 → baseline 3 → A = −2, −1, −1, +2
    adv = compute_advantages(torch.tensor([1, 2, 2, 5]), 4, "corpo", threshold=3)
    torch.testing.assert_close(adv, torch.tensor([-2.0, -1.0, -1.0, 2.0]))


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo"])
def test_uniform_failing_group_is_zero_for_mean_baselines(estimator):
    assert torch.equal(compute_advantages(_t([0.2] * 4), 4, estimator), torch.zeros(4, dtype=torch.float64))


def test_uniform_failing_group_is_pushed_down():
    # all 0.2 < τ = 0.5: mean 0.2 < τ → baseline 0.5 → every A = 0.2 − 0.5 = −0.3 (not 0)
    adv = compute_advantages(_t([0.2] * 4), 4, "corpo", threshold=0.5)
    torch.testing.assert_close(adv, _t([-0.3] * 4))


def test_uniform_passing_group_is_zero():
    adv = compute_advantages(_t([1.0] * 4), 4, "corpo", threshold=0.5)
    assert torch.equal(adv, torch.zeros(4, dtype=torch.float64))


def test_missing_threshold_is_a_clear_error():
    with pytest.raises(ValueError, match="threshold"):
        compute_advantages(_t([0.0, 1.0]), 2, "corpo")


def test_scale_by_std_divides_by_group_std():
    # [0.1, 0.2, 0.2, 0.4]: A = r − 0.5 (as above); sample std: mean 0.225, dev² sum
    # 0.015625 + 0.000625·2 + 0.030625 = 0.0475, var = 0.0475 / 3 = 0.0158333, std = 0.125831
    adv = compute_advantages(_t([0.1, 0.2, 0.2, 0.4]), 4, "corpo", threshold=0.5, scale_by_std=True, eps=1e-12)
    torch.testing.assert_close(adv, _t([-0.4, -0.3, -0.3, -0.1]) / 0.0158333333333333**0.5)


def test_scale_by_std_with_batch_std_is_refused():
    with pytest.raises(ValueError, match="batch_std"):
        compute_advantages(_t([0.0, 1.0]), 2, "corpo", threshold=0.5, scale_by_std=True, batch_std=True)


groups = st.integers(min_value=2, max_value=6).flatmap(
    lambda g: st.lists(
        st.lists(st.floats(-10, 10, allow_nan=False), min_size=g, max_size=g), min_size=1, max_size=4
    )
)


@settings(max_examples=200, deadline=None)
@given(groups, st.floats(-10, 10, allow_nan=False))
def test_property_every_failure_gets_negative_advantage(rows, tau):
    rewards = _t(rows)
    adv = compute_advantages(rewards, rewards.shape[1], "corpo", threshold=tau)
    assert bool((adv[rewards < tau] < 0).all())


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(-10, 10, allow_nan=False), min_size=2, max_size=6),
    st.floats(1e-6, 5),
)
def test_property_mean_at_or_above_threshold_equals_dr_grpo(row, margin):
    # τ is set `margin` below the exact (rational) mean, so the group is in the preference regime
    exact_mean = sum(Fraction(x) for x in row) / len(row)
    tau = float(exact_mean) - margin
    rewards = _t([row])
    corpo = compute_advantages(rewards, len(row), "corpo", threshold=tau)
    assert torch.equal(corpo, compute_advantages(rewards, len(row), "dr_grpo"))


@settings(max_examples=100, deadline=None)
@given(st.floats(-10, 10, allow_nan=False), st.floats(1e-6, 5), st.integers(2, 8))
def test_property_uniform_group_below_threshold_is_negative(value, gap, group_size):
    tau = value + gap
    adv = compute_advantages(_t([value] * group_size), group_size, "corpo", threshold=tau)
    assert bool((adv < 0).all())
    assert torch.equal(adv, _t([value - tau] * group_size))
