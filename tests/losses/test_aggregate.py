"""Aggregations: token_mean (DAPO), seq_mean_token_mean (GRPO), seq_mean_token_sum_norm (Dr. GRPO)."""

from __future__ import annotations

import pytest
import torch

from labelrl.losses import AGGREGATIONS, policy_loss
from labelrl.losses.aggregate import seq_mean_token_mean, seq_mean_token_sum_norm, token_mean

# two sequences of lengths 2 and 4, advantages +1 and −1, width (L_max) 4
MASK = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
ADV = torch.tensor([1.0, -1.0])


def _objective(aggregation: str) -> float:
    logprobs = torch.full((2, 4), -0.7, requires_grad=True)
    loss, _ = policy_loss(logprobs, logprobs.detach(), ADV, MASK, surrogate="pg", aggregation=aggregation)
    return -loss.item()


def test_registry_names():
    assert AGGREGATIONS.names() == ["seq_mean_token_mean", "seq_mean_token_sum_norm", "token_mean"]


def test_seq_mean_token_mean_reference():
    # pg per-token objective = A: seq 1 mean (1 + 1)/2 = 1, seq 2 mean (−4)/4 = −1; mean over 2 → 0
    assert _objective("seq_mean_token_mean") == pytest.approx(0.0)


def test_token_mean_reference():
    # (1 + 1 − 1 − 1 − 1 − 1) / 6 tokens = −2/6 = −1/3
    assert _objective("token_mean") == pytest.approx(-1 / 3)


def test_seq_mean_token_sum_norm_reference():
    # (2 − 4) / (N · L_max) = −2 / (2 · 4) = −1/4
    assert _objective("seq_mean_token_sum_norm") == pytest.approx(-1 / 4)


def test_sum_norm_uses_max_len_when_given():
    # (2 − 4) / (2 · 8) = −1/8
    loss = seq_mean_token_sum_norm(-ADV.unsqueeze(1).expand(2, 4), MASK, max_len=8)
    assert loss.item() == pytest.approx(1 / 8)


def test_sum_norm_refuses_max_len_shorter_than_a_completion():
    with pytest.raises(ValueError, match="max_len=3"):
        seq_mean_token_sum_norm(torch.zeros(2, 4), MASK, max_len=3)


@pytest.mark.parametrize("fn", [token_mean, seq_mean_token_mean, seq_mean_token_sum_norm])
def test_padding_invariance_even_with_nan_in_padding(fn):
    gen = torch.Generator().manual_seed(0)
    loss = torch.randn(2, 4, generator=gen)
    padded_loss = torch.cat([loss, torch.full((2, 3), float("nan"))], dim=1)
    padded_mask = torch.cat([MASK, torch.zeros(2, 3, dtype=torch.bool)], dim=1)
    plain = fn(loss, MASK, max_len=4)
    padded = fn(padded_loss, padded_mask, max_len=4)
    torch.testing.assert_close(padded, plain)


def test_seq_mean_counts_an_empty_sequence_as_zero():
    # as TRL: lengths clamp to 1, so an all-masked row adds 0 and still counts in N
    loss = torch.ones(2, 3)
    mask = torch.tensor([[1, 1, 1], [0, 0, 0]], dtype=torch.bool)
    assert seq_mean_token_mean(loss, mask).item() == pytest.approx(0.5)
    assert token_mean(loss, mask).item() == pytest.approx(1.0)


def test_token_mean_of_an_all_masked_batch_is_zero():
    assert token_mean(torch.ones(2, 3), torch.zeros(2, 3, dtype=torch.bool)).item() == 0.0


def test_group_size_must_divide_the_sequences():
    with pytest.raises(ValueError, match="whole groups"):
        token_mean(torch.ones(3, 2), torch.ones(3, 2, dtype=torch.bool), group_size=2)


def test_int_mask_is_accepted():
    assert token_mean(torch.ones(2, 4), MASK.int()).item() == pytest.approx(1.0)


# --- n_sequences / n_tokens: the whole batch's counts when groups were dropped -------------

# per-token losses of two sequences of lengths 2 and 4 (padding ignored, even NaN):
# row 0: 1, 2 | row 1: 3, 4, 5, 6 → Σ = 21 over 6 tokens; sequence means 3/2 = 1.5 and 18/4 = 4.5
LOSS = torch.tensor([[1.0, 2.0, float("nan"), float("nan")], [3.0, 4.0, 5.0, 6.0]])


def test_token_mean_divides_by_n_tokens_when_given():
    assert token_mean(LOSS, MASK).item() == pytest.approx(21 / 6)  # = 3.5, its own 6 tokens
    assert token_mean(LOSS, MASK, n_tokens=14).item() == pytest.approx(21 / 14)  # = 1.5
    # n_sequences plays no part in a token mean
    assert token_mean(LOSS, MASK, n_sequences=100).item() == pytest.approx(21 / 6)


def test_seq_mean_token_mean_divides_by_n_sequences_when_given():
    assert seq_mean_token_mean(LOSS, MASK).item() == pytest.approx((1.5 + 4.5) / 2)  # = 3.0
    assert seq_mean_token_mean(LOSS, MASK, n_sequences=8).item() == pytest.approx((1.5 + 4.5) / 8)  # = 0.75
    # n_tokens plays no part: each sequence is averaged over its own tokens
    assert seq_mean_token_mean(LOSS, MASK, n_tokens=100).item() == pytest.approx(3.0)


def test_seq_mean_token_sum_norm_divides_by_n_sequences_times_l_max_when_given():
    assert seq_mean_token_sum_norm(LOSS, MASK).item() == pytest.approx(21 / (2 * 4))  # = 2.625, width 4
    assert seq_mean_token_sum_norm(LOSS, MASK, n_sequences=6).item() == pytest.approx(21 / (6 * 4))  # = 0.875
    assert seq_mean_token_sum_norm(LOSS, MASK, n_sequences=6, max_len=7).item() == pytest.approx(21 / (6 * 7))  # = 0.5
    assert seq_mean_token_sum_norm(LOSS, MASK, n_tokens=100).item() == pytest.approx(21 / 8)  # n_tokens unused


def test_policy_loss_passes_the_counts_to_the_aggregation():
    # pg on-policy: per-token loss −A; row 0 (A = +1): −1, −1; row 1 (A = −1): +1 ×4 → Σ = 2
    logprobs = torch.full((2, 4), -0.7, requires_grad=True)
    loss, _ = policy_loss(logprobs, logprobs.detach(), ADV, MASK, surrogate="pg", aggregation="token_mean", n_tokens=8)
    assert loss.item() == pytest.approx(2 / 8)
    loss, _ = policy_loss(logprobs, logprobs.detach(), ADV, MASK, surrogate="pg", aggregation="seq_mean_token_mean",
                          n_sequences=4)
    assert loss.item() == pytest.approx((-1 + 1) / 4)
    loss, _ = policy_loss(logprobs, logprobs.detach(), ADV, MASK, surrogate="pg", aggregation="seq_mean_token_sum_norm",
                          n_sequences=4, max_len=5)
    assert loss.item() == pytest.approx(2 / (4 * 5))


@pytest.mark.parametrize("fn", [token_mean, seq_mean_token_mean, seq_mean_token_sum_norm])
def test_dropping_zero_rows_with_the_whole_batch_counts_leaves_the_loss_and_gradient(fn):
    # The skip rule in miniature: rows 2 and 3 (a uniform group, advantage 0) have zero loss;
    # dropped before the pass, with n_sequences = 4 and n_tokens = 2 + 4 + 3 + 1 = 10 the
    # result is the one over all four rows. Without the counts it is not (the test can fail).
    weights = torch.tensor([[1.0, 2.0, 0, 0], [3.0, 4.0, 5.0, 6.0], [1.0, 1.0, 1.0, 0], [1.0, 0, 0, 0]],
                           requires_grad=True)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.bool)
    zero_rows = torch.tensor([1.0, 1.0, 0.0, 0.0]).unsqueeze(1)  # the loss of rows 2, 3 is 0

    full = fn(weights * zero_rows, mask, max_len=6)
    full.backward()
    full_grad = weights.grad[:2].clone()
    weights.grad = None
    kept = fn((weights * zero_rows)[:2], mask[:2], max_len=6, n_sequences=4, n_tokens=10)
    kept.backward()
    torch.testing.assert_close(kept, full)
    torch.testing.assert_close(weights.grad[:2], full_grad)
    assert fn((weights * zero_rows)[:2], mask[:2], max_len=6).item() != pytest.approx(full.item())
