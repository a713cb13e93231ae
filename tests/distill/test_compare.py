"""The matched-data decomposition on constructed predictions, with the arithmetic in comments."""

from __future__ import annotations

import numpy as np
import pytest

from labelrl.distill.compare import compare_models, regressions
from labelrl.evaluate.io import Predictions, predictions_table
from labelrl.types import LabelSpace

SPACE = LabelSpace(("ham", "spam"), kind="binary", positive="spam")
IDS = [f"i{k}" for k in range(8)]
TRUE = ["ham"] * 4 + ["spam"] * 4


def preds(pred, probs=None, ids=IDS, true=TRUE):
    status = ["ok" if p is not None else "no_answer" for p in pred]
    return Predictions(predictions_table(ids, true, pred, status, SPACE, probs), SPACE)


# direct_all: all right → BA 1.0
ALL = preds(TRUE)
# direct_survivors: ham 4/4, spam 2/4 → BA (1 + 0.5) / 2 = 0.75
SURV_PRED = ["ham"] * 4 + ["spam", "spam", "ham", "ham"]
SURV_PROBS = np.array([[0.95, 0.05], [0.65, 0.35], [0.9, 0.1], [0.85, 0.15],
                       [0.2, 0.8], [0.1, 0.9], [0.6, 0.4], [0.7, 0.3]])
SURV = preds(SURV_PRED, SURV_PROBS)
# cot: ham 3/4 (i1 wrong), spam 1/4 (i4 unparsed, i5 right) → BA (0.75 + 0.25) / 2 = 0.5
COT = preds(["ham", "spam", "ham", "ham", None, "spam", "ham", "ham"])


def test_balanced_accuracies_and_effects():
    r = compare_models(ALL, SURV, COT, n_boot=200, seed=1)
    ba = {k: v["balanced_accuracy"] for k, v in r["models"].items()}
    assert ba == pytest.approx({"direct_all": 1.0, "direct_survivors": 0.75, "cot": 0.5})
    assert r["filter_effect"] == pytest.approx(0.25)  # 1.0 − 0.75
    assert r["objective_effect"] == pytest.approx(0.25)  # 0.75 − 0.5
    assert r["total_effect"] == pytest.approx(r["filter_effect"] + r["objective_effect"])
    for key in ("filter_effect_ci", "objective_effect_ci"):
        lo, hi = r[key]
        assert lo <= r[key.removesuffix("_ci")] <= hi
    lo, hi = r["models"]["direct_all"]["balanced_accuracy_ci"]
    assert lo == hi == 1.0  # a perfect model is perfect on every resample


def test_regressions_grouped_by_direct_confidence():
    r = compare_models(ALL, SURV, COT, n_boot=0)
    assert r["models"]["cot"]["balanced_accuracy_ci"] is None and r["filter_effect_ci"] is None
    reg = r["regressions"]
    # direct_survivors right on i0..i5; CoT wrong on i1 (conf 0.65) and i4 (conf 0.8, unparsed)
    assert reg["n"] == 2 and reg["ids"] == ["i1", "i4"]
    # confidences of the right ones: i0 .95, i1 .65, i2 .9, i3 .85, i4 .8, i5 .9
    assert reg["by_band"] == {
        "[0.60, 0.70)": {"n_direct_right": 1, "n_regressed": 1, "rate": 1.0},
        "[0.80, 0.90)": {"n_direct_right": 2, "n_regressed": 1, "rate": 0.5},
        "[0.90, 1.00]": {"n_direct_right": 3, "n_regressed": 0, "rate": 0.0},
    }


def test_regressions_without_scores_are_unscored():
    reg = regressions(["a", "b"], ["ham", "spam"], ["ham", "spam"], ["spam", "spam"], {})
    assert reg["by_band"] == {"unscored": {"n_direct_right": 2, "n_regressed": 1, "rate": 0.5}}


def test_only_shared_ids_are_compared():
    # cot lacks i7: compared on i0..i6; direct_survivors there: ham 4/4, spam 2/3 → BA (1 + 2/3) / 2
    cot = preds(COT.y_pred[:7], ids=IDS[:7], true=TRUE[:7])
    r = compare_models(ALL, SURV, cot, n_boot=0)
    assert r["n"] == 7
    assert r["models"]["direct_survivors"]["balanced_accuracy"] == pytest.approx((1 + 2 / 3) / 2)


def test_disjoint_or_disagreeing_files_are_refused():
    other = preds(TRUE, ids=[f"x{k}" for k in range(8)])
    with pytest.raises(ValueError, match="share no item id"):
        compare_models(ALL, SURV, other, n_boot=0)
    flipped = preds(TRUE, true=["spam"] + TRUE[1:])
    with pytest.raises(ValueError, match="different answer keys"):
        compare_models(ALL, SURV, flipped, n_boot=0)
