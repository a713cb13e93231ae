"""Dr. GRPO: r − group mean."""

from __future__ import annotations

import torch

from labelrl.advantages import compute_advantages


def test_reference_values():
    # mean = (0.2 + 0.4 + 0.4 + 1.0) / 4 = 0.5 → A = r − 0.5 = −0.3, −0.1, −0.1, +0.5
    adv = compute_advantages(torch.tensor([0.2, 0.4, 0.4, 1.0], dtype=torch.float64), 4, "dr_grpo")
    torch.testing.assert_close(adv, torch.tensor([-0.3, -0.1, -0.1, 0.5], dtype=torch.float64))


def test_rewards_a_failure_with_partial_credit():
    # all four fail a 0.5 threshold; mean = 0.9 / 4 = 0.225 → the 0.4 failure gets 0.4 − 0.225 = +0.175
    adv = compute_advantages(torch.tensor([0.1, 0.2, 0.2, 0.4], dtype=torch.float64), 4, "dr_grpo")
    torch.testing.assert_close(adv, torch.tensor([-0.125, -0.025, -0.025, 0.175], dtype=torch.float64))


def test_uniform_failing_group_is_zero():
    adv = compute_advantages(torch.zeros(4), 4, "dr_grpo")
    assert torch.equal(adv, torch.zeros(4))


def test_advantages_sum_to_zero_per_group():
    gen = torch.Generator().manual_seed(3)
    rewards = torch.rand(4, 5, generator=gen, dtype=torch.float64)
    adv = compute_advantages(rewards, 5, "dr_grpo")
    torch.testing.assert_close(adv.sum(dim=1), torch.zeros(4, dtype=torch.float64), atol=1e-12, rtol=0)
