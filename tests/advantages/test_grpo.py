"""GRPO: (r − group mean) / (group sample std + eps)."""

from __future__ import annotations

import pytest
import torch

from labelrl.advantages import compute_advantages


def test_reference_values_sample_std():
    # rewards [0.2, 0.4, 0.4, 1.0]: mean = 2.0 / 4 = 0.5; deviations −0.3, −0.1, −0.1, +0.5
    # squares 0.09 + 0.01 + 0.01 + 0.25 = 0.36; sample var = 0.36 / 3 = 0.12; std = 0.346410
    # A = dev / 0.346410 → −0.866025, −0.288675, −0.288675, 1.443376 (eps 1e-6 moves the 6th digit at most)
    adv = compute_advantages(torch.tensor([0.2, 0.4, 0.4, 1.0], dtype=torch.float64), 4, "grpo")
    expected = torch.tensor([-0.866025, -0.288675, -0.288675, 1.443376], dtype=torch.float64)
    torch.testing.assert_close(adv, expected, atol=5e-6, rtol=0)


def test_population_std_with_ddof_0():
    # population var = 0.36 / 4 = 0.09; std = 0.3 → A = dev / 0.3 = −1, −1/3, −1/3, 5/3
    adv = compute_advantages(torch.tensor([0.2, 0.4, 0.4, 1.0], dtype=torch.float64), 4, "grpo", ddof=0, eps=1e-12)
    expected = torch.tensor([-1.0, -1 / 3, -1 / 3, 5 / 3], dtype=torch.float64)
    torch.testing.assert_close(adv, expected, atol=1e-9, rtol=0)


def test_matches_torch_std_per_group_loop():
    gen = torch.Generator().manual_seed(0)
    rewards = torch.rand(5, 6, generator=gen, dtype=torch.float64)
    adv = compute_advantages(rewards, 6, "grpo", eps=1e-6)
    for b in range(5):
        group = rewards[b]
        expected = (group - group.mean()) / (group.std() + 1e-6)  # torch.std is the sample std
        torch.testing.assert_close(adv[b], expected, atol=1e-12, rtol=0)


@pytest.mark.parametrize("value", [0.0, 0.1, 1.0, -3.7])
def test_uniform_group_gives_exact_zeros(value):
    # (0.1 + 0.1 + 0.1) / 3 = 0.10000000000000002 in floating point: a naive mean would leave
    # ±1e-17 here, which the skip rule would read as "informative".
    adv = compute_advantages(torch.full((3,), value, dtype=torch.float64), 3, "grpo")
    assert torch.equal(adv, torch.zeros(3, dtype=torch.float64))


def test_eps_must_be_positive():
    with pytest.raises(ValueError, match="eps=0"):
        compute_advantages(torch.tensor([0.0, 1.0]), 2, "grpo", eps=0)


def test_ddof_other_than_0_or_1_is_refused():
    with pytest.raises(ValueError, match="ddof=2"):
        compute_advantages(torch.tensor([0.0, 1.0, 1.0]), 3, "grpo", ddof=2)


def test_two_member_group_is_plus_minus_one_over_sqrt2():
    # [0, 1]: mean 0.5, sample std = sqrt(0.5) = 0.707107 → A = ±0.5 / 0.707107 = ±0.707107
    adv = compute_advantages(torch.tensor([0.0, 1.0], dtype=torch.float64), 2, "grpo", eps=1e-12)
    torch.testing.assert_close(adv, torch.tensor([-0.5**0.5, 0.5**0.5], dtype=torch.float64))


def test_without_the_std_it_is_dr_grpo():
    # scale_by_std=False (--scale none): r − group mean, bit for bit Dr. GRPO's advantage
    rewards = torch.tensor([0.2, 0.4, 0.4, 1.0, 0.0, 1.0, 1.0, 1.0], dtype=torch.float64)
    assert torch.equal(compute_advantages(rewards, 4, "grpo", scale_by_std=False), compute_advantages(rewards, 4, "dr_grpo"))
