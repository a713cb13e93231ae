"""Items and seeds a difference would need (labelrl.evaluate.plan), by hand."""

import pytest
from scipy.stats import norm

from labelrl.evaluate.plan import items_needed, plan_comparison, spread_parts

Z = norm.ppf(0.975) + norm.ppf(0.8)  # 1.960 + 0.842 = 2.802


def test_items_needed_by_hand():
    # se_items² = 0.02² = 4e-4 at n = 500, no seed variance: to detect 0.02 the variance must fall to
    # (0.02/2.8016)² = 5.0962e-5, so n' = 4e-4·500/5.0962e-5 = 3,924.5 → 3,925: 2.8016² = 7.85× the
    # items, for a difference 2.8016× smaller than the (z + z)·se = 0.056 detectable now
    assert items_needed(0.02, 4e-4, 0.0, n=500, seeds_now=1, seeds=1) == 3925
    # a difference of the size detectable now needs the items there are now (500, give or take the rounding up)
    assert items_needed(Z * 0.02, 4e-4, 0.0, n=500, seeds_now=1, seeds=1) == pytest.approx(500, abs=1)


def test_seed_noise_sets_a_floor_that_items_cannot_pass():
    # seeds' variance 1e-4 at 3 seeds: with 3 seeds it alone exceeds (0.02/2.802)² = 5.1e-5 → None;
    # at 10 seeds it is 3e-5, leaving 2.1e-5 for the items: n' = 4e-4·500/2.095e-5 = 9,547
    assert items_needed(0.02, 4e-4, 1e-4, n=500, seeds_now=3, seeds=3) is None
    budget = (0.02 / Z) ** 2
    assert items_needed(0.02, 4e-4, 1e-4, n=500, seeds_now=3, seeds=10) == pytest.approx(
        4e-4 * 500 / (budget - 1e-4 * 3 / 10), abs=1)


def test_bad_targets_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="target=0"):
        items_needed(0, 1e-4, 0, n=10, seeds_now=1, seeds=1)
    with pytest.raises(ValueError, match="re-run the ladder"):
        spread_parts({"se": 0.01}, 1)


def test_a_plan_from_a_comparison_uses_its_holm_level_and_marks_one_seed_as_a_lower_bound():
    c = {"kind": "vs_sft", "a": "sft", "b": "grpo", "result": {"n": 500, "family": {"metric": "balanced_accuracy",
                                                                                   "level": 0.005},
                                                        "metrics": {"balanced_accuracy": {"delta": 0.01, "se": 0.02,
                                                                                          "se_items": 0.02,
                                                                                          "pair_deltas": [0.01]}}}}
    p = plan_comparison(c, 0.03, (1, 3))
    assert not p["seeds_measured"] and p["seeds"] == 1
    # at λ = 0.005: (z(0.9975) + z(0.8))·0.02 = (2.807 + 0.842)·0.02 = 0.0730
    assert p["detectable_now"] == pytest.approx((norm.ppf(1 - 0.0025) + norm.ppf(0.8)) * 0.02)
    budget = (0.03 / (norm.ppf(1 - 0.0025) + norm.ppf(0.8))) ** 2
    assert p["items_needed"][1] == pytest.approx(4e-4 * 500 / budget, abs=1)
