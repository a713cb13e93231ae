"""Surrogates: pg (one on-policy step), clip (PPO with clip-higher) and gspo (sequence-level ratio)."""

from __future__ import annotations

import pytest
import torch

from labelrl.losses import SURROGATES, policy_loss
from labelrl.losses.surrogate import check_surrogate_options, clip_loss, gspo_loss, pg_loss


def test_registry_names():
    assert SURROGATES.names() == ["clip", "gspo", "pg"]


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


# gspo: one ratio per sequence, s_i = exp(mean of logp − old over its real tokens)
GSPO_MASK = torch.tensor([[True, True, False], [True, True, True]])


def test_gspo_reference_values_and_gradient():
    # row 0: log ratios 0.2, −0.1 (the padded 0.5 is left out) → mean 0.05 → s = e^0.05 = 1.051271,
    #        A = +1, inside [0.8, 1.2] → −1.051271 on every token
    # row 1: log ratios 0.3, 0.3, 0.3 → s = e^0.3 = 1.349859, A = +1 → clipped to 1.2 → −1.2
    old = torch.zeros(2, 3)
    logprobs = torch.tensor([[0.2, -0.1, 0.5], [0.3, 0.3, 0.3]], requires_grad=True)
    loss = gspo_loss(logprobs, old, torch.tensor([1.0, 1.0]), mask=GSPO_MASK, eps_low=0.2, eps_high=0.2)
    torch.testing.assert_close(loss, torch.tensor([[-1.051271] * 3, [-1.2] * 3]))
    # Σ over real tokens = |o_i|·loss_i; d/dlogp_t = |o_i| · (−A·s_i/|o_i|) = −s_i on row 0's real
    # tokens, 0 on its padding, 0 on the clipped row 1
    (grad,) = torch.autograd.grad(torch.where(GSPO_MASK, loss, 0.0).sum(), logprobs)
    torch.testing.assert_close(grad, torch.tensor([[-1.051271, -1.051271, 0.0], [0.0, 0.0, 0.0]]))


def test_gspo_differs_from_token_clip_when_token_ratios_vary_within_a_sequence():
    # log ratios +0.5, −0.5, A = +1, eps 0.2. Token clip: min(1.6487, 1.2) = 1.2 and min(0.6065, 0.8)
    # = 0.6065 → mean −0.903. gspo: mean log ratio 0 → s = 1 → −1 on both tokens.
    logprobs, old, adv = torch.tensor([[0.5, -0.5]]), torch.zeros(1, 2), torch.tensor([1.0])
    mask = torch.ones(1, 2, dtype=torch.bool)
    token, _ = policy_loss(logprobs, old, adv, mask, surrogate="clip", aggregation="seq_mean_token_mean", eps_low=0.2)
    sequence, _ = policy_loss(logprobs, old, adv, mask, surrogate="gspo", aggregation="seq_mean_token_mean", eps_low=0.2, eps_high=0.2)
    assert token.item() == pytest.approx(-(1.2 + 0.6065307) / 2, abs=1e-6)
    assert sequence.item() == pytest.approx(-1.0, abs=1e-6)


def test_gspo_default_clip_range_is_the_papers():
    # GSPO §5.1: 3e-4 / 4e-4. log ratio 0.001 → s = 1.0010005 > 1.0004, A = +1 → −1.0004;
    # log ratio −0.001 → s = 0.9990005 < 0.9997, A = −1 → −min(−0.9990, −0.9997) = +0.9997
    logprobs = torch.tensor([[0.001], [-0.001]])
    loss = gspo_loss(logprobs, torch.zeros(2, 1), torch.tensor([1.0, -1.0]), mask=torch.ones(2, 1, dtype=torch.bool))
    torch.testing.assert_close(loss.squeeze(1), torch.tensor([-1.0004, 0.9997]))


def test_gspo_ignores_padding_even_when_nan():
    gen = torch.Generator().manual_seed(3)
    base = -torch.rand(2, 3, generator=gen)
    old = base + (torch.rand(2, 3, generator=gen) - 0.5) * 0.4
    adv = torch.tensor([1.0, -1.0])
    results = []
    for pad in (0.0, float("nan")):
        logprobs = torch.where(GSPO_MASK, base, torch.full_like(base, pad)).requires_grad_(True)
        loss, _ = policy_loss(logprobs, old, adv, GSPO_MASK, surrogate="gspo", aggregation="token_mean", eps_low=0.2, eps_high=0.2)
        (grad,) = torch.autograd.grad(loss, logprobs)
        results.append((loss, grad))
    assert torch.isfinite(results[1][0]) and torch.isfinite(results[1][1]).all()
    torch.testing.assert_close(results[0], results[1])
    assert results[0][1][0, 2] == 0 and results[0][1][0, :2].abs().sum() > 0  # real tokens carry gradient


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_gspo_on_policy_equals_clip_in_value_and_gradient(aggregation):
    # s_i = 1: value −A per token as clip's; ∇ = −A · 1/|o_i| Σ_t ∇logp spread over |o_i| tokens = clip's
    gen = torch.Generator().manual_seed(0)
    logprobs = (-torch.rand(2, 3, generator=gen)).requires_grad_(True)
    adv = torch.tensor([1.5, -0.5])
    kwargs = dict(aggregation=aggregation, max_len=3, eps_low=0.2, eps_high=0.28)
    clip, _ = policy_loss(logprobs, logprobs.detach(), adv, GSPO_MASK, surrogate="clip", **kwargs)
    gspo, _ = policy_loss(logprobs, logprobs.detach(), adv, GSPO_MASK, surrogate="gspo", **kwargs)
    torch.testing.assert_close(gspo, clip)
    (g_clip,) = torch.autograd.grad(clip, logprobs)
    (g_gspo,) = torch.autograd.grad(gspo, logprobs)
    torch.testing.assert_close(g_gspo, g_clip)
    assert g_clip.abs().sum() > 0


def test_gspo_mask_is_supplied_not_an_option():
    # the mask comes from policy_loss; as a user option it is refused, naming the real options
    with pytest.raises(ValueError, match="'gspo' has no option 'mask': its options are eps_low, eps_high"):
        check_surrogate_options("gspo", gspo_loss, {"mask": GSPO_MASK})
    with pytest.raises(ValueError, match=r"mask \(2, 2\) for logprobs \(2, 3\)"):
        gspo_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2), mask=torch.ones(2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="eps_low=0.0"):
        gspo_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2), mask=GSPO_MASK, eps_low=0.0)
