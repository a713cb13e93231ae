"""policy_loss: surrogate + beta·KL, aggregated; validation and stats."""

from __future__ import annotations

import pytest
import torch

from labelrl.losses import policy_loss
from labelrl.losses.kl import k3

MASK = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)


def test_beta_adds_the_token_mean_of_k3():
    logp = torch.tensor([[-1.0, -0.5, -9.0], [-0.2, -0.3, -0.4]])
    ref = logp - 0.1
    adv = torch.tensor([1.0, -1.0])
    base, _ = policy_loss(logp, logp, adv, MASK, surrogate="pg", aggregation="token_mean")
    with_kl, stats = policy_loss(
        logp, logp, adv, MASK, surrogate="pg", aggregation="token_mean", ref_logprobs=ref, beta=0.5
    )
    # every token has log ρ = −0.1 → k3 = e^−0.1 + 0.1 − 1 = 0.004837; × 0.5 on every token
    per_token_kl = k3(logp, ref)[0, 0].item()
    assert per_token_kl == pytest.approx(0.0048374, abs=1e-6)
    assert with_kl.item() - base.item() == pytest.approx(0.5 * per_token_kl, abs=1e-7)
    assert stats["kl"] == pytest.approx(per_token_kl, abs=1e-7)


def test_kl_ratio_correction_keeps_value_and_changes_gradient_on_policy():
    logp = torch.tensor([[-1.0, -0.5, -2.0]], requires_grad=True)
    ref = torch.tensor([[-0.5, -0.5, -0.5]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    kwargs = dict(surrogate="pg", aggregation="token_mean", ref_logprobs=ref, beta=1.0)
    plain, _ = policy_loss(logp, logp.detach(), torch.zeros(1), mask, **kwargs)
    fixed, _ = policy_loss(logp, logp.detach(), torch.zeros(1), mask, kl_ratio_correction=True, **kwargs)
    torch.testing.assert_close(plain, fixed)
    (g_plain,) = torch.autograd.grad(plain, logp)
    (g_fixed,) = torch.autograd.grad(fixed, logp)
    # d/dlogp of k3·ratio at ratio 1 adds k3 itself: the per-token difference is k3 / 3 tokens
    torch.testing.assert_close(g_fixed - g_plain, k3(logp.detach(), ref) / 3)


def test_beta_without_reference_is_refused():
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2), MASK, surrogate="pg", aggregation="token_mean", beta=0.1)


def test_negative_beta_is_refused():
    with pytest.raises(ValueError, match="beta=-0.1"):
        policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2), MASK, surrogate="pg", aggregation="token_mean", beta=-0.1)


def test_unknown_names_list_the_known_ones():
    with pytest.raises(ValueError, match="clip, gspo, pg"):
        policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2), MASK, surrogate="ppo", aggregation="token_mean")
    with pytest.raises(ValueError, match="seq_mean_token_mean"):
        policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2), MASK, surrogate="pg", aggregation="sum")


def test_option_the_surrogate_does_not_take_is_refused():
    with pytest.raises(ValueError, match="'pg' has no option 'eps_high'"):
        policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2), MASK, surrogate="pg", aggregation="token_mean", eps_high=0.28)


def test_clip_stats_count_binding_clipped_tokens():
    old = torch.zeros(2, 3)
    # row 0 (A = +1): ratios e^0.5 = 1.65 (clipped high), 1.0, [pad]; row 1 (A = −1): e^−0.5 = 0.61 (clipped low), 1, 1
    logp = torch.tensor([[0.5, 0.0, 5.0], [-0.5, 0.0, 0.0]])
    _, stats = policy_loss(logp, old, torch.tensor([1.0, -1.0]), MASK, surrogate="clip", aggregation="token_mean", eps_low=0.2, eps_high=0.28)
    # 5 unmasked tokens: one clipped high, one clipped low; the padded e^5 is ignored
    assert stats["clip_high_frac"] == pytest.approx(1 / 5)
    assert stats["clip_low_frac"] == pytest.approx(1 / 5)
    assert stats["ratio_mean"] == pytest.approx((1.6487213 + 1 + 0.6065307 + 1 + 1) / 5, abs=1e-6)
    assert stats["kl"] == 0.0


def test_gspo_stats_count_every_token_of_a_clipped_sequence():
    old = torch.zeros(2, 3)
    # row 0 (A = +1): log ratios 0.5, 0.3 → s = e^0.4 = 1.4918 > 1.28, clipped high on its 2 tokens
    # (the padded 5.0 is ignored); row 1 (A = −1): 0.1, −0.1, 0 → s = 1, not clipped
    logp = torch.tensor([[0.5, 0.3, 5.0], [0.1, -0.1, 0.0]])
    _, stats = policy_loss(logp, old, torch.tensor([1.0, -1.0]), MASK, surrogate="gspo", aggregation="token_mean", eps_low=0.2, eps_high=0.28)
    assert stats["clip_high_frac"] == pytest.approx(2 / 5)
    assert stats["clip_low_frac"] == 0.0
    assert stats["ratio_mean"] == pytest.approx((2 * 1.4918247 + 3 * 1.0) / 5, abs=1e-6)
