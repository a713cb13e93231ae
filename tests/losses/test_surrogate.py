"""Surrogates: pg (one on-policy step) and clip (PPO with clip-higher)."""

from __future__ import annotations

import pytest
import torch

from labelrl.losses import SURROGATES
from labelrl.losses.surrogate import clip_loss, pg_loss


def test_registry_names():
    assert SURROGATES.names() == ["clip", "pg"]


def test_pg_value_is_minus_advantage_and_gradient_is_policy_gradient():
    logprobs = torch.tensor([[-0.5, -1.0], [-2.0, -0.1]], requires_grad=True)
    adv = torch.tensor([2.0, -3.0])
    loss = pg_loss(logprobs, logprobs.detach(), adv)
    # value: −A per token (exp(0) = 1)
    torch.testing.assert_close(loss, torch.tensor([[-2.0, -2.0], [3.0, 3.0]]))
    # d(Σ loss)/d logp = −A per token, as d(−A·logp)/d logp
    (grad,) = torch.autograd.grad(loss.sum(), logprobs)
    torch.testing.assert_close(grad, torch.tensor([[-2.0, -2.0], [3.0, 3.0]]))


def test_pg_ignores_old_logprobs():
    logprobs = torch.tensor([[-0.5, -1.0]])
    assert torch.equal(pg_loss(logprobs, logprobs - 5, torch.tensor([1.0])), pg_loss(logprobs, logprobs, torch.tensor([1.0])))


def test_clip_reference_table():
    # eps_low 0.2, eps_high 0.28 → ratio clipped to [0.8, 1.28]
    ratios = torch.tensor([1.5, 0.5, 0.5, 1.5, 1.1])
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0])
    old = torch.zeros(5, 1)
    logprobs = ratios.log().unsqueeze(1).requires_grad_(True)
    loss = clip_loss(logprobs, old, adv, eps_low=0.2, eps_high=0.28)
    # 1.5, A=+1: min(1.5, 1.28) = 1.28 → −1.28, clipped (no gradient)
    # 0.5, A=−1: min(−0.5, −0.8) = −0.8 → +0.8, clipped (no gradient)
    # 0.5, A=+1: min(0.5, 0.8) = 0.5 → −0.5, gradient −A·ratio = −0.5
    # 1.5, A=−1: min(−1.5, −1.28) = −1.5 → +1.5, gradient −A·ratio = +1.5
    # 1.1, A=+1: inside the range → −1.1, gradient −1.1
    torch.testing.assert_close(loss.squeeze(1), torch.tensor([-1.28, 0.8, -0.5, 1.5, -1.1]))
    (grad,) = torch.autograd.grad(loss.sum(), logprobs)
    torch.testing.assert_close(grad.squeeze(1), torch.tensor([0.0, 0.0, -0.5, 1.5, -1.1]))


def test_clip_on_policy_equals_pg_in_value_and_gradient():
    gen = torch.Generator().manual_seed(0)
    logprobs = (-torch.rand(3, 5, generator=gen)).requires_grad_(True)
    adv = torch.tensor([1.0, -0.5, 2.0])
    clip = clip_loss(logprobs, logprobs.detach(), adv, eps_low=0.2, eps_high=0.28)
    pg = pg_loss(logprobs, logprobs.detach(), adv)
    torch.testing.assert_close(clip, pg)
    (g_clip,) = torch.autograd.grad(clip.sum(), logprobs)
    (g_pg,) = torch.autograd.grad(pg.sum(), logprobs)
    torch.testing.assert_close(g_clip, g_pg)


def test_clip_eps_high_defaults_to_eps_low():
    logprobs = torch.tensor([[0.5]])  # ratio e^0.5 = 1.6487 > 1.3
    loss = clip_loss(logprobs, torch.zeros(1, 1), torch.tensor([1.0]), eps_low=0.3)
    torch.testing.assert_close(loss, torch.tensor([[-1.3]]))


@pytest.mark.parametrize("opts, match", [({"eps_low": 0.0}, "eps_low=0.0"), ({"eps_low": 1.0}, "eps_low=1.0"), ({"eps_high": -0.1}, "eps_high=-0.1")])
def test_clip_ranges_are_validated(opts, match):
    with pytest.raises(ValueError, match=match):
        clip_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1), **opts)


def test_shapes_are_checked():
    with pytest.raises(ValueError, match="same completions"):
        pg_loss(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2))
    with pytest.raises(ValueError, match="one advantage per sequence"):
        clip_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(3))
