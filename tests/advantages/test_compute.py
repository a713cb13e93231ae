"""compute_advantages: shapes, validation, the baseline mask, batch std (all estimators)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from labelrl.advantages import ESTIMATORS, compute_advantages

OPTIONS = {"grpo": {}, "dr_grpo": {}, "rloo": {}, "corpo": {"threshold": 0.5}}


def test_registry_lists_the_four_estimators():
    assert ESTIMATORS.names() == ["corpo", "dr_grpo", "grpo", "rloo"]


def test_unknown_estimator_lists_known_names():
    with pytest.raises(ValueError, match="corpo, dr_grpo, grpo, rloo"):
        compute_advantages(torch.zeros(4), 2, "ppo")


def test_unknown_option_names_it_and_the_accepted_ones():
    with pytest.raises(ValueError, match="'rloo' has no option 'threshold'.*batch_std"):
        compute_advantages(torch.zeros(4), 2, "rloo", threshold=0.5)


@pytest.mark.parametrize("group_size", [1, 0, -2])
def test_group_size_below_two_is_refused(group_size):
    with pytest.raises(ValueError) as err:
        compute_advantages(torch.zeros(4), group_size, "grpo")
    assert str(err.value) == (
        f"group_size={group_size}: GRPO needs at least 2 completions per prompt; set --group-size 2 or more"
    )


def test_length_not_divisible_is_refused():
    with pytest.raises(ValueError, match="7 rewards with group_size=4"):
        compute_advantages(torch.zeros(7), 4, "grpo")


def test_2d_width_must_match_group_size():
    with pytest.raises(ValueError, match="G == group_size"):
        compute_advantages(torch.zeros(2, 3), 4, "grpo")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_reward_is_refused_with_its_index(bad):
    with pytest.raises(ValueError, match=r"rewards\[2\]=.*finite"):
        compute_advantages(torch.tensor([0.0, 1.0, bad, 0.0]), 2, "dr_grpo")


def test_integer_rewards_are_promoted_and_dtype_is_kept():
    assert compute_advantages(torch.tensor([1, 2]), 2, "dr_grpo").dtype == torch.get_default_dtype()
    assert compute_advantages(torch.tensor([1.0, 2.0], dtype=torch.float64), 2, "grpo").dtype == torch.float64


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(sorted(OPTIONS)),
    st.integers(2, 5),
    st.integers(1, 4),
    st.randoms(use_true_random=False),
    st.booleans(),
)
def test_property_flat_and_2d_agree(estimator, group_size, n_groups, rng, batch_std):
    rows = [[rng.choice([0.0, 0.25, 0.5, 0.75, 1.0]) for _ in range(group_size)] for _ in range(n_groups)]
    grouped = torch.tensor(rows, dtype=torch.float64)
    options = {**OPTIONS[estimator], "batch_std": batch_std}
    flat = compute_advantages(grouped.reshape(-1), group_size, estimator, **options)
    two_d = compute_advantages(grouped, group_size, estimator, **options)
    assert flat.shape == (n_groups * group_size,) and two_d.shape == (n_groups, group_size)
    assert torch.equal(flat, two_d.reshape(-1))


def test_batch_std_reference():
    # groups [0, 1] and [0, 0]: group means 0.5 and 0; all four rewards 0, 1, 0, 0:
    # mean 0.25, dev² 0.0625 + 0.5625 + 0.0625 + 0.0625 = 0.75, sample var 0.25, std 0.5
    # grpo+batch_std: (r − group mean) / 0.5 → −1, +1, 0, 0
    rewards = torch.tensor([0.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    adv = compute_advantages(rewards, 2, "grpo", batch_std=True, eps=1e-12)
    torch.testing.assert_close(adv, torch.tensor([-1.0, 1.0, 0.0, 0.0], dtype=torch.float64))


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(OPTIONS)), st.randoms(use_true_random=False))
def test_property_batch_std_is_one_factor_for_the_whole_batch(estimator, rng):
    # batch_std divides the unscaled (Dr. GRPO-style) advantage of every group by the same std
    rows = [[rng.random() for _ in range(4)] for _ in range(3)]
    rewards = torch.tensor(rows, dtype=torch.float64)
    base = {**OPTIONS[estimator]}
    unscaled = compute_advantages(rewards, 4, "dr_grpo" if estimator == "grpo" else estimator, **base)
    scaled = compute_advantages(rewards, 4, estimator, batch_std=True, eps=1e-6, **base)
    expected = unscaled / (rewards.reshape(-1).std() + 1e-6)
    torch.testing.assert_close(scaled, expected, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("estimator", sorted(OPTIONS))
def test_mask_equals_dropping_the_rollouts_loop_vs_vectorised(estimator):
    # Excluded rollouts get 0; the others get exactly what their group would give without them.
    gen = torch.Generator().manual_seed(4)
    rewards = torch.rand(5, 4, generator=gen, dtype=torch.float64)
    mask = torch.tensor(
        [[1, 1, 1, 1], [1, 0, 1, 1], [0, 1, 0, 1], [1, 0, 0, 1], [0, 0, 1, 1]], dtype=torch.bool
    )
    adv = compute_advantages(rewards, 4, estimator, mask=mask, **OPTIONS[estimator])
    assert torch.equal(adv[~mask], torch.zeros(int((~mask).sum()), dtype=torch.float64))
    for b in range(5):
        kept = rewards[b][mask[b]]
        expected = compute_advantages(kept, len(kept), estimator, **OPTIONS[estimator])
        torch.testing.assert_close(adv[b][mask[b]], expected, atol=1e-12, rtol=0)


def test_mask_with_a_single_included_rollout():
    rewards = torch.tensor([0.0, 1.0, 0.3, 0.9], dtype=torch.float64)
    mask = torch.tensor([False, True, True, True])
    # group 1: only 1.0 included → it is its own mean (grpo, dr_grpo) and has no other (rloo): 0
    for estimator in ("grpo", "dr_grpo", "rloo"):
        adv = compute_advantages(rewards, 2, estimator, mask=mask)
        assert adv[:2].tolist() == [0.0, 0.0]
    # corpo, τ = 0.5: group 1's lone 1.0 is its own mean (≥ τ) → 0; excluded 0.0 → 0;
    # group 2 [0.3, 0.9]: mean 0.6 ≥ τ → baseline 0.6 → −0.3, +0.3
    adv = compute_advantages(rewards, 2, "corpo", mask=mask, threshold=0.5)
    torch.testing.assert_close(adv, torch.tensor([0.0, 0.0, -0.3, 0.3], dtype=torch.float64))


def test_mask_must_be_bool_and_shaped_like_rewards():
    with pytest.raises(ValueError, match="shape"):
        compute_advantages(torch.zeros(4), 2, "grpo", mask=torch.ones(2, dtype=torch.bool))
    with pytest.raises(ValueError, match="bool"):
        compute_advantages(torch.zeros(4), 2, "grpo", mask=torch.ones(4))


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo"])
def test_scale_flags_choose_the_same_divisor_for_every_estimator(estimator):
    # The baseline is the estimator's own; scale_by_std / batch_std (what --scale sets) divide it
    # by the group's sample std, the batch's, or nothing, alike for every estimator.
    rewards = torch.tensor([[0.2, 0.4, 0.4, 1.0], [0.0, 0.0, 1.0, 1.0], [0.5, 0.5, 0.5, 0.5]], dtype=torch.float64)
    none = compute_advantages(rewards, 4, estimator, scale_by_std=False, batch_std=False)
    group = compute_advantages(rewards, 4, estimator, scale_by_std=True, batch_std=False)
    batch = compute_advantages(rewards, 4, estimator, scale_by_std=False, batch_std=True)
    # group stds 0.346410, 0.577350, 0 (the uniform group stays exactly 0); batch: mean 0.5, squared
    # deviations 0.36 + 1.0 + 0 = 1.36 over 11 → std 0.351620
    torch.testing.assert_close(group, none / (rewards.std(dim=1, keepdim=True) + 1e-6))
    torch.testing.assert_close(batch, none / (rewards.reshape(-1).std() + 1e-6))
    assert rewards.reshape(-1).std().item() == pytest.approx(0.351620, abs=1e-6)
    assert torch.equal(group[2], torch.zeros(4, dtype=torch.float64)) and torch.equal(batch[2], group[2])
    assert not torch.allclose(group, batch) and not torch.allclose(group, none)


@pytest.mark.parametrize("estimator", ["dr_grpo", "rloo", "corpo"])
def test_group_and_batch_std_together_are_refused(estimator):
    options = {"threshold": 0.5} if estimator == "corpo" else {}
    with pytest.raises(ValueError, match="batch_std=True replaces the group std"):
        compute_advantages(torch.tensor([0.0, 1.0]), 2, estimator, scale_by_std=True, batch_std=True, **options)
