"""Paired comparisons: McNemar's exact p against scipy, and the verdict words on constructed
predictions (a clear gain, a clear loss, a null; grade error, where lower is better)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import binomtest

from labelrl.evaluate.io import Predictions, predictions_table
from labelrl.evaluate.paired import paired_comparison, verdict_words
from labelrl.types import LabelSpace

SPAM = LabelSpace(("ham", "spam"), kind="binary")
GRADES = LabelSpace(("1", "2", "3", "4", "5"), kind="ordinal")


def preds(truth: list[str], answers: list[str], space: LabelSpace = SPAM) -> Predictions:
    ids = [f"i{i}" for i in range(len(truth))]
    return Predictions(predictions_table(ids, truth, answers, ["ok"] * len(ids), space), space, {"source": "test"})


def flip(label: str) -> str:
    return "spam" if label == "ham" else "ham"


def test_mcnemar_p_equals_scipys_exact_binomial_test_on_the_discordant_pairs():
    # 100 items, half spam. A is right on 70, B on 70 + 12 − 4: B alone right on 12 items, A
    # alone on 4 → the exact test is binomtest(12, 16, 0.5), p ≈ 0.0768 (not significant at 5%),
    # whatever the 66 items both get right and the 18 both get wrong.
    truth = ["spam" if i % 2 else "ham" for i in range(100)]
    a = list(truth)
    b = list(truth)
    for i in range(70, 100):  # both wrong on 18 of these, only one wrong on 12
        a[i] = flip(truth[i])
        if i < 88:
            b[i] = flip(truth[i])
    for i in range(4):  # A right, B wrong
        b[i] = flip(truth[i])
    result = paired_comparison([preds(truth, a)], [preds(truth, b)], n_boot=200)
    (test,) = result["mcnemar"]
    assert (test["a_right_b_wrong"], test["a_wrong_b_right"]) == (4, 12)
    assert test["p_value"] == pytest.approx(binomtest(12, 16, 0.5).pvalue, rel=1e-12)
    assert test["p_value"] == pytest.approx(0.0768, abs=1e-4)


def _with_errors(truth: list[str], wrong: set[int]) -> list[str]:
    return [flip(t) if i in wrong else t for i, t in enumerate(truth)]


@pytest.mark.parametrize("b_wrong, word, delta", [
    (10, "better", 0.95 - 0.70),    # B wrong on 5 per class: BA 0.95
    (120, "worse", 0.40 - 0.70),    # B wrong on 60 per class: BA 0.40
    (60, "no detectable difference", 0.0),  # B answers as A does: Δ = 0 on every draw
])
def test_verdict_words_on_a_clear_gain_a_clear_loss_and_a_null(b_wrong, word, delta):
    # 200 items alternating ham/spam; an arm wrong on items 0 … k−1 is wrong on k/2 of each class.
    # A is wrong on 60: recall 70/100 for both → BA 0.70.
    truth = ["spam" if i % 2 else "ham" for i in range(200)]
    a, b = _with_errors(truth, set(range(60))), _with_errors(truth, set(range(b_wrong)))
    result = paired_comparison([preds(truth, a)], [preds(truth, b)], n_boot=500)
    text = verdict_words(result)
    assert text.startswith(word), text
    m = result["metrics"]["balanced_accuracy"]
    assert m["delta"] == pytest.approx(delta)
    assert (m["ci"][0] > 0) == (word == "better") and (m["ci"][1] < 0) == (word == "worse")
    # classes are balanced, so Δacc = ΔBA here, and its interval says the same
    acc = result["metrics"]["accuracy"]
    assert acc["delta"] == pytest.approx(delta)
    assert (acc["ci"][0] > 0) == (word == "better") and (acc["ci"][1] < 0) == (word == "worse")
    assert acc["ci"][0] <= acc["delta"] <= acc["ci"][1]
    assert verdict_words(result, "accuracy").startswith(word)


def test_lower_grade_error_reads_as_better_and_higher_as_worse():
    # 5 grades, 100 items. A answers one grade off everywhere (|err| 1.0), B exactly (|err| 0):
    # Δ|err| = −1.0, interval below zero → "better"; swapped → "worse". A verdict that treated
    # a lower error as a loss (the accuracy direction) fails both.
    rng = np.random.default_rng(0)
    truth = [str(g) for g in rng.integers(1, 6, 100)]
    off = [str(int(t) + 1) if t != "5" else "4" for t in truth]
    exact, off_by_one = preds(truth, truth, GRADES), preds(truth, off, GRADES)
    gain = paired_comparison([off_by_one], [exact], n_boot=300)
    loss = paired_comparison([exact], [off_by_one], n_boot=300)
    assert gain["metrics"]["mean_abs_grade_error"]["delta"] == pytest.approx(-1.0)
    assert verdict_words(gain, "mean_abs_grade_error").startswith("better")
    assert verdict_words(loss, "mean_abs_grade_error").startswith("worse")


def test_a_small_gain_whose_interval_covers_zero_reads_no_detectable_difference_with_what_it_could_detect():
    # 200 items alternating ham/spam. A is wrong on items 0–59 (30 per class: BA 0.70), B on items
    # 6–63 (29 per class: BA 0.71): Δ = +0.010 and Δacc = +2/200 = +0.010, from 10 discordant items
    # (A alone wrong on 0–5, B alone on 60–63). A verdict reading only the sign of Δ says "better".
    truth = ["spam" if i % 2 else "ham" for i in range(200)]
    a, b = _with_errors(truth, set(range(60))), _with_errors(truth, set(range(6, 64)))
    result = paired_comparison([preds(truth, a)], [preds(truth, b)], n_boot=2000)
    m = result["metrics"]["balanced_accuracy"]
    assert m["delta"] == pytest.approx(0.01)
    assert result["metrics"]["accuracy"]["delta"] == pytest.approx(0.01)
    # the spread of 10 discordant items: se ≈ √10 / 200 · √(1 − (2/10)²) ≈ 0.0155 per class-balanced item
    assert 0.008 < m["se"] < 0.025
    text = verdict_words(result)
    assert text.startswith("no detectable difference"), text
    # alone (a family of one): it could detect (1.960 + 0.842)·se
    mde = (1.959964 + 0.841621) * m["se"]
    assert f"could detect |BA| ≥ {mde:.3f}" in text
    assert "1/1 seeds higher" in text
    assert verdict_words(result, "accuracy").startswith("no detectable difference")


def test_the_words_follow_the_family_decision_not_the_raw_interval():
    # B is right on 6 of A's 60 errors (items 54–59, 3 per class): ΔBA = +0.03 from 6 discordant items,
    # se ≈ 0.012, z ≈ 2.4, p ≈ 0.015: "better" alone. In a family of 41 where the other 40 show
    # nothing, Holm's first step is 0.05/41 = 0.0012 < p: not rejected, "no detectable difference".
    truth = ["spam" if i % 2 else "ham" for i in range(200)]
    a, b = _with_errors(truth, set(range(60))), _with_errors(truth, set(range(54)))
    result = paired_comparison([preds(truth, a)], [preds(truth, b)], n_boot=2000)
    m = result["metrics"]["balanced_accuracy"]
    assert m["ci"][0] > 0 and verdict_words(result).startswith("better")
    from labelrl.evaluate.family import correct
    family = correct([(m["delta"], m["se"])] + [(0.0, m["se"])] * 40)[0]
    assert not family["reject"], family
    result["family"] = {**family, "metric": "balanced_accuracy"}
    text = verdict_words(result)
    assert text.startswith("no detectable difference") and "Holm over 41" in text, text


def test_seed_agreement_counts_the_pairs_of_runs_with_the_sign_of_delta():
    # Two seeds per arm. Seed 0: B right on 10 more items than A (+0.10 BA); seed 1: B wrong on 2 more
    # (−0.02): Δ = +0.04, higher in 1 of 2 seeds — and the per-seed differences are recorded as such.
    truth = ["spam" if i % 2 else "ham" for i in range(100)]
    a = [preds(truth, _with_errors(truth, set(range(30)))), preds(truth, _with_errors(truth, set(range(30))))]
    b = [preds(truth, _with_errors(truth, set(range(20)))), preds(truth, _with_errors(truth, set(range(32))))]
    result = paired_comparison(a, b, n_boot=400)
    m = result["metrics"]["balanced_accuracy"]
    assert m["pair_deltas"] == pytest.approx([0.10, -0.02])
    assert m["delta"] == pytest.approx(0.04)
    assert "1/2 seeds higher" in verdict_words(result)


def test_runs_paired_by_seed_are_resampled_together_and_the_parents_noise_cancels():
    # Three seeds. Seed k's SFT run is wrong on 10·k extra items (BA 0.85, 0.75, 0.65: the parent's
    # training noise); its RL run is the same model right on 4 of those items more (+0.04 in every
    # seed). Resampled independently, the seeds' spread (sd 0.10) swamps the +0.04; resampled
    # together, it cancels and every replicate's Δ stays near +0.04.
    truth = ["spam" if i % 2 else "ham" for i in range(200)]
    sft = [preds(truth, _with_errors(truth, set(range(30 + 20 * k)))) for k in range(3)]
    rl = [preds(truth, _with_errors(truth, set(range(8, 30 + 20 * k)))) for k in range(3)]
    apart = paired_comparison(sft, rl, n_boot=1000)
    together = paired_comparison(sft, rl, n_boot=1000, seeds_paired=True)
    assert apart["metrics"]["balanced_accuracy"]["delta"] == pytest.approx(0.04)
    assert together["seeds_paired"] and not apart["seeds_paired"]
    assert together["metrics"]["balanced_accuracy"]["se"] < apart["metrics"]["balanced_accuracy"]["se"] / 3
    assert verdict_words(together).startswith("better") and verdict_words(apart).startswith("no detectable difference")
    # the documented draws: items, runs_a, runs_b from one default_rng(seed); together, runs_b := runs_a
    from labelrl.evaluate.paired import bootstrap_draws
    items, runs_a, runs_b = bootstrap_draws(200, (3, 3), 50, 0, seeds_paired=True)
    rng = np.random.default_rng(0)
    assert (items == rng.integers(0, 200, (50, 200))).all() and (runs_a == rng.integers(0, 3, (50, 3))).all()
    assert runs_b is runs_a
    with pytest.raises(ValueError, match="as many runs"):
        bootstrap_draws(10, (2, 3), 5, 0, seeds_paired=True)


def test_mcnemar_with_two_seeds_pairs_items_within_each_seed_and_pools_the_discordant_counts():
    # 100 items. Seed 0: A alone right on items 0–2, B alone on 10–17; seed 1: A alone on 20–24,
    # B alone on 30–40. Per seed: binomtest(8, 11) and binomtest(11, 16); pooled over the seeds'
    # pairs: binomtest(19, 27). Pairing items across seeds (A's seed 0 with B's seed 1) would count
    # other discordant items, so the per-pair counts are asserted too.
    truth = ["spam" if i % 2 else "ham" for i in range(100)]
    base = set(range(50, 80))  # both wrong here in every run
    a = [preds(truth, _with_errors(truth, base | set(range(10, 18)))),
         preds(truth, _with_errors(truth, base | set(range(30, 41))))]
    b = [preds(truth, _with_errors(truth, base | set(range(0, 3)))),
         preds(truth, _with_errors(truth, base | set(range(20, 25))))]
    result = paired_comparison(a, b, n_boot=200, seeds_paired=True)
    per_seed = [(t["a_run"], t["b_run"], t["a_right_b_wrong"], t["a_wrong_b_right"]) for t in result["mcnemar"]]
    assert per_seed == [(0, 0, 3, 8), (1, 1, 5, 11)]
    assert result["mcnemar"][0]["p_value"] == pytest.approx(binomtest(8, 11, 0.5).pvalue, rel=1e-12)
    assert result["mcnemar"][1]["p_value"] == pytest.approx(binomtest(11, 16, 0.5).pvalue, rel=1e-12)
    pooled = result["mcnemar_pooled"]
    assert (pooled["pairs"], pooled["a_right_b_wrong"], pooled["a_wrong_b_right"]) == (2, 8, 19)
    assert pooled["p_value"] == pytest.approx(binomtest(19, 27, 0.5).pvalue, rel=1e-12)
