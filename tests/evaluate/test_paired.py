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
