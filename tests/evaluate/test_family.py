"""Holm's correction, the adjusted interval and the smallest detectable difference (labelrl.evaluate.family)."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import norm
from statsmodels.stats.multitest import multipletests

from labelrl.evaluate.family import correct, detectable, holm, normal_p


def test_holm_by_hand():
    # m = 4, α = 0.05: sorted p 0.001, 0.01, 0.03, 0.04 against 0.05/4 = 0.0125, 0.05/3 = 0.0167,
    # 0.05/2 = 0.025, 0.05/1: the first two pass, 0.03 > 0.025 fails, so 0.04 is not rejected either
    # (a plain per-test 0.05 would have called all four). Adjusted: 4·0.001 = 0.004, 3·0.01 = 0.03,
    # 2·0.03 = 0.06, max(0.06, 1·0.04) = 0.06.
    out = holm([0.03, 0.001, 0.04, 0.01])
    assert out["reject"] == [False, True, False, True]
    assert out["p_adjusted"] == pytest.approx([0.06, 0.004, 0.06, 0.03])
    # levels: rejected ones at their own step (0.0125, 0.0167), the rest at the first failing step's 0.025
    assert out["level"] == pytest.approx([0.025, 0.0125, 0.025, 0.05 / 3])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=1, max_size=40))
def test_holm_agrees_with_statsmodels(p):
    ours = holm(p)
    reject, adjusted, _, _ = multipletests(p, alpha=0.05, method="holm")
    assert ours["reject"] == list(reject)
    np.testing.assert_allclose(ours["p_adjusted"], adjusted, rtol=1e-12, atol=1e-15)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(-0.3, 0.3), st.floats(0.001, 0.1)), min_size=1, max_size=30))
def test_the_adjusted_interval_excludes_zero_exactly_when_rejected(tests):
    for (delta, se), entry in zip(tests, correct(tests)):
        lo, hi = entry["ci_adjusted"]
        excludes = lo > 0 or hi < 0
        if not math.isclose(abs(delta) / se, norm.ppf(1 - entry["level"] / 2), rel_tol=1e-9):  # not at the boundary
            assert excludes == entry["reject"]


def test_raw_interval_excludes_zero_but_the_corrected_one_does_not():
    # Δ = 0.03, se = 0.012: z = 2.5, p = 0.0124 < 0.05, so alone it is "better" (raw 95% interval
    # 0.03 ± 1.96·0.012 = [0.0065, 0.0535]). In a family of 10 with nothing else there (p = 1 each),
    # its Holm step is 0.05/10 = 0.005 < 0.0124: not rejected, interval 0.03 ± z(0.99975)·0.012
    # = 0.03 ± 3.48·0.012 = [−0.012, 0.072], covering 0.
    alone = correct([(0.03, 0.012)])[0]
    assert alone["reject"] and alone["ci_adjusted"][0] > 0
    family = correct([(0.03, 0.012)] + [(0.0, 0.012)] * 9)
    first = family[0]
    assert not first["reject"]
    assert first["size"] == 10
    assert first["ci_adjusted"][0] < 0 < first["ci_adjusted"][1]
    assert first["p_adjusted"] == pytest.approx(min(1.0, 10 * normal_p(0.03, 0.012)))
    # it could have detected (z(1 − 0.005/2) + z(0.8))·0.012 = (2.807 + 0.842)·0.012 = 0.0438
    assert first["detectable"] == pytest.approx((norm.ppf(1 - 0.0025) + norm.ppf(0.8)) * 0.012)


def test_detectable_difference_by_hand():
    # α = 0.05 alone, 80% power: (1.95996 + 0.84162)·0.02 = 0.05603
    assert detectable(0.02, 0.05) == pytest.approx(0.056032, abs=1e-6)
    assert detectable(None, 0.05) is None


def test_normal_p_edges():
    assert normal_p(0.0, 0.0) == 1.0
    assert normal_p(0.01, 0.0) == 0.0
    assert normal_p(None, 0.1) == 1.0
    assert normal_p(0.0196, 0.01) == pytest.approx(0.05, abs=1e-4)


def test_bad_input_names_the_rule():
    with pytest.raises(ValueError, match=r"alpha=1.5"):
        holm([0.1], alpha=1.5)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        holm([1.2])
