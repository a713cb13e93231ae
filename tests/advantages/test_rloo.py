"""RLOO: r − mean of the other G − 1."""

from __future__ import annotations

import torch

from labelrl.advantages import compute_advantages


def test_reference_values():
    # 0.2: others 0.4, 0.4, 1.0 → mean 0.6 → −0.4
    # 0.4: others 0.2, 0.4, 1.0 → mean 0.533333 → −0.133333 (twice)
    # 1.0: others 0.2, 0.4, 0.4 → mean 0.333333 → +0.666667
    adv = compute_advantages(torch.tensor([0.2, 0.4, 0.4, 1.0], dtype=torch.float64), 4, "rloo")
    expected = torch.tensor([-0.4, -0.133333, -0.133333, 0.666667], dtype=torch.float64)
    torch.testing.assert_close(adv, expected, atol=1e-6, rtol=0)


def test_equals_g_over_g_minus_1_times_dr_grpo():
    # A_i = r_i − (S − r_i)/(G − 1) = G/(G − 1) · (r_i − S/G)
    gen = torch.Generator().manual_seed(1)
    rewards = torch.rand(6, 5, generator=gen, dtype=torch.float64)
    rloo = compute_advantages(rewards, 5, "rloo")
    dr = compute_advantages(rewards, 5, "dr_grpo")
    torch.testing.assert_close(rloo, dr * 5 / 4, atol=1e-12, rtol=0)


def test_uniform_group_is_exactly_zero():
    adv = compute_advantages(torch.full((4,), 0.7, dtype=torch.float64), 4, "rloo")
    assert torch.equal(adv, torch.zeros(4, dtype=torch.float64))


def test_loop_reference():
    gen = torch.Generator().manual_seed(2)
    rewards = torch.rand(3, 4, generator=gen, dtype=torch.float64)
    adv = compute_advantages(rewards, 4, "rloo")
    for b in range(3):
        for i in range(4):
            others = torch.cat([rewards[b, :i], rewards[b, i + 1 :]])
            assert abs(adv[b, i].item() - (rewards[b, i] - others.mean()).item()) < 1e-12
