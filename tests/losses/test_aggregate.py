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
