import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import balanced_accuracy_score, roc_auc_score, roc_curve

from labelrl.evaluate.io import Predictions, predictions_table
from labelrl.evaluate.sweep import (
    hard_metrics,
    sweep,
    threshold_curve,
    threshold_for_recall,
)
from labelrl.types import LabelSpace

SPACE = LabelSpace(("ham", "spam"), kind="binary")


def scored(y_pos, score, name="scored"):
    ids = [f"x{i}" for i in range(len(y_pos))]
    labels = ["spam" if p else "ham" for p in y_pos]
    probs = np.stack([1 - np.asarray(score), np.asarray(score)], axis=1)
    preds = ["spam" if s >= 0.5 else "ham" for s in score]
    table = predictions_table(ids, labels, preds, ["ok"] * len(ids), SPACE, probs)
    return Predictions(table, SPACE, {"source": name})


def hard(y_pos, pred_pos, name, unparsed=()):
    ids = [f"x{i}" for i in range(len(y_pos))]
    labels = ["spam" if p else "ham" for p in y_pos]
    preds = [None if i in unparsed else ("spam" if p else "ham") for i, p in enumerate(pred_pos)]
    status = ["no_answer" if p is None else "ok" for p in preds]
    return Predictions(predictions_table(ids, labels, preds, status, SPACE), SPACE, {"source": name})


def synthetic(n=2000, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.random(n) < 0.3
    score = 1 / (1 + np.exp(-(2.0 * y - 1 + rng.normal(0, 1, n))))
    return y, score


def test_threshold_for_target_recall_is_exact_on_constructed_scores():
    # 10 positives scored 0.91 … 0.10 (step 0.09), 5 negatives at 0.95, 0.5, 0.3, 0.2, 0.05.
    pos = np.round(np.linspace(0.91, 0.10, 10), 2)
    neg = np.array([0.95, 0.5, 0.3, 0.2, 0.05])
    y = np.r_[np.ones(10, bool), np.zeros(5, bool)]
    curve = threshold_curve(y, np.r_[pos, neg])
    # recall ≥ 0.7 needs 7 of 10 positives: the 7th highest positive score, 0.37.
    i = threshold_for_recall(curve, 0.7)
    assert curve.thresholds[i] == pytest.approx(0.37)
    assert curve.at(i)["recall"] == pytest.approx(0.7)
    # recall ≥ 0.71 needs 8: threshold 0.28; recall 1.0 needs all: the lowest positive, 0.10.
    assert curve.thresholds[threshold_for_recall(curve, 0.71)] == pytest.approx(0.28)
    assert curve.thresholds[threshold_for_recall(curve, 1.0)] == pytest.approx(0.10)
    # At 0.37: FP = negatives ≥ 0.37 = {0.95, 0.5} → precision 7/9.
    assert curve.at(i)["precision"] == pytest.approx(7 / 9)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 20)), min_size=2, max_size=60),
       st.floats(0.01, 1.0))
def test_threshold_for_recall_is_the_largest_reaching_the_target(rows, target):
    y = np.array([r[0] for r in rows])
    if y.all() or not y.any():
        return
    score = np.array([r[1] / 20 for r in rows])
    curve = threshold_curve(y, score)
    i = threshold_for_recall(curve, target)
    t = curve.thresholds[i]
    assert (score[y] >= t).mean() >= target - 1e-12
    larger = score[score > t]
    if len(larger):  # the next larger distinct score misses the target
        assert (score[y] >= larger.min()).mean() < target


def test_roc_and_best_balanced_accuracy_agree_with_sklearn():
    y, score = synthetic(n=400)
    out = sweep(scored(y, score), target_recall=0.9)
    assert out["roc_auc"] == pytest.approx(roc_auc_score(y, score))
    fpr, tpr, _ = roc_curve(y, score)
    assert out["roc_curve"]["fpr"] == pytest.approx(list(fpr))
    brute = max(balanced_accuracy_score(y, score >= t) for t in np.unique(score))
    assert out["best_balanced_accuracy"] == pytest.approx(brute)
    t = out["best_balanced_accuracy_threshold"]
    assert balanced_accuracy_score(y, score >= t) == pytest.approx(brute)
    m = out["metrics_at_target_recall"]
    assert m["recall"] >= 0.9 and m["threshold"] == out["threshold_at_target_recall"]


def test_hard_model_from_a_threshold_is_reproduced_with_every_item_agreeing():
    y, score = synthetic()
    t = np.quantile(score, 0.6)
    other = hard(y, score >= t, "rl")
    out = sweep(scored(y, score), compare=[other])
    result = out["compared"][0]
    assert result["reproduced"] is True and result["verdict"].startswith("reproduced")
    assert result["verdict_rests_on"] == "items"
    assert result["item_agreement"] == 1.0 and result["n_disagree"] == 0
    assert result["max_metric_difference"] == pytest.approx(0.0, abs=1e-12)
    assert result["threshold"] == pytest.approx(score[score >= t].min())
    assert result["recall_matched_threshold"] == pytest.approx(score[score >= t].min())


def test_a_model_answering_nothing_positive_is_uninformative_not_reproduced():
    # An SFT model whose spam probability never reaches 0.5, compared with itself: the matched
    # threshold lies above every score and every item agrees, as it would for ANY two models
    # answering "ham" everywhere. Catches a verdict that calls a constant predictor "reproduced".
    y, score = synthetic()
    score = score * 0.4
    out = sweep(scored(y, score), compare=[hard(y, score >= 0.5, "same model")])
    result = out["compared"][0]
    assert result["max_metric_difference"] == 0.0 and result["item_agreement"] == 1.0
    assert result["threshold"] > score.max() and result["scored_metrics"]["predicted_positive_share"] == 0.0
    assert result["reproduced"] is False and result["uninformative"] is True
    assert result["verdict"].startswith("uninformative: a (near-)constant predictor"), result["verdict"]
    assert result["constant_share"]["compared"] == 1.0 and result["verdict_rests_on"] == "nothing"


def test_a_near_constant_arm_is_uninformative_at_the_share_bound_and_judged_below_it():
    # 200 items, 60 positives. The arm answers positive on the top-k scores only: k = 8 gives
    # 192/200 = 0.96 ≥ 0.95 "ham" → uninformative; k = 40 gives 160/200 = 0.80 → an ordinary
    # verdict (a threshold on the scores, so reproduced). Catches a rule keyed on exactly 100%.
    y, score = synthetic(n=200)
    order = np.argsort(-score)
    for k, uninformative in ((8, True), (40, False)):
        pred = np.zeros(len(y), bool)
        pred[order[:k]] = True
        result = sweep(scored(y, score), compare=[hard(y, pred, f"top{k}")])["compared"][0]
        assert result["constant_share"]["compared"] == pytest.approx(1 - k / 200)
        assert result["uninformative"] is uninformative, (k, result["verdict"])
        assert result["reproduced"] is (not uninformative), (k, result["verdict"])


def test_matched_point_with_agreement_chance_could_give_is_undetermined():
    # 20 items. Negatives 0.05 … 0.45 (9) and one at 0.70; positives one at 0.30 and 0.55 … 0.95
    # (9). The arm is the threshold 0.55 (recall 9/10, FPR 1/10) with one answer, on the
    # negative scored 0.05, unparsed: the point is the same, 19/20 = 0.95 items agree. Chance:
    # per class both answer positive at 0.9 (pos) and 0.1 (neg) → 0.9² + 0.1² = 0.82; the
    # Wilson interval of 19/20 starts near 0.76 ≤ 0.82 → undetermined (the branch no other test reaches).
    neg = np.r_[np.linspace(0.05, 0.45, 9), 0.70]
    pos = np.r_[0.30, np.linspace(0.55, 0.95, 9)]
    y = np.r_[np.zeros(10, bool), np.ones(10, bool)]
    score = np.r_[neg, pos]
    result = sweep(scored(y, score), compare=[hard(y, score >= 0.55, "one unparsed", unparsed=(0,))])["compared"][0]
    assert result["item_agreement"] == pytest.approx(0.95)
    assert result["chance_agreement"] == pytest.approx(0.82)
    assert result["item_agreement_ci"][0] <= result["chance_agreement"]
    assert result["verdict"].startswith("undetermined"), result["verdict"]
    assert result["reproduced"] is False and result["uninformative"] is False


def test_hard_model_with_information_beyond_the_scores_is_not_reproduced():
    y, score = synthetic()
    rng = np.random.default_rng(1)
    pred = score >= np.quantile(score, 0.6)
    wrong = np.flatnonzero(pred != y)
    fixed = pred.copy()
    fixed[rng.choice(wrong, size=len(wrong) // 4, replace=False)] ^= True  # knows some labels
    flipped = pred ^ (rng.random(len(y)) < 0.15)  # flips independent of the score
    out = sweep(scored(y, score), compare=[hard(y, fixed, "oracle-ish"), hard(y, flipped, "noisy")])
    for result in out["compared"]:
        assert result["reproduced"] is False, result["source"]
        assert result["verdict"].startswith("not reproduced"), result["verdict"]


def test_within_class_shuffle_with_equal_metrics_is_not_reproduced_on_items():
    # A thresholded SFT model's answers shuffled among the items of each true class: every
    # metric is exactly the thresholded model's, but the answers no longer follow the scores.
    y, score = synthetic(n=400)
    thresholded = score >= np.quantile(score, 0.6)
    rng = np.random.default_rng(2)
    shuffled = thresholded.copy()
    for cls in (True, False):
        idx = np.flatnonzero(y == cls)
        shuffled[idx] = thresholded[rng.permutation(idx)]
    out = sweep(scored(y, score), compare=[hard(y, shuffled, "shuffled")])
    result = out["compared"][0]
    assert result["recall_matched_max_difference"] == pytest.approx(0.0, abs=1e-12)  # the metrics match exactly
    assert result["reproduced"] is False
    assert result["verdict"].startswith("not reproduced on items"), result["verdict"]
    assert result["verdict_rests_on"] == "items"
    assert result["item_agreement"] < 0.95
    assert result["item_agreement_ci"][1] < 0.95
    # a chance level near what independence within each class gives
    assert result["chance_agreement"] == pytest.approx(result["item_agreement"], abs=0.1)


def test_the_printed_point_tolerance_is_never_tighter_than_one_item():
    y, score = synthetic(n=64)
    out = sweep(scored(y, score), compare=[hard(y, score >= 0.5, "rl")], tolerance=0.001)
    result = out["compared"][0]
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    assert result["point_tolerance"]["recall"] == pytest.approx(1 / n_pos)
    assert result["point_tolerance"]["fpr"] == pytest.approx(1 / n_neg)
    assert min(result["point_tolerance"].values()) >= 1 / len(y)
    assert f"(1/{n_pos})" in result["tolerance_text"] and f"(1/{n_neg})" in result["tolerance_text"]


def test_one_item_off_still_matches_the_point_but_two_items_do_not():
    # 10 positives, 10 negatives, scores 0.05 … 1.0; the arm answers positive for the top 10
    # scores except that it swaps one negative in: recall 9/10 at FPR 1/10 vs the threshold
    # with recall ≥ 0.9 (top 9 scores... all positive here) → FPR 0: off by one item (0.1).
    y = np.r_[np.zeros(10, bool), np.ones(10, bool)]
    score = np.linspace(0.05, 1.0, 20)
    arm = score >= score[10]
    arm[10], arm[9] = False, True  # one positive missed, one negative taken
    result = sweep(scored(y, score), compare=[hard(y, arm, "one-off")])["compared"][0]
    assert abs(result["recall_matched_differences"]["fpr"]) == pytest.approx(0.1)
    assert not result["verdict"].startswith("not reproduced:")  # within one item of negatives
    arm[8] = True  # a second negative taken
    result = sweep(scored(y, score), compare=[hard(y, arm, "two-off")])["compared"][0]
    assert result["verdict"].startswith("not reproduced:") and result["verdict_rests_on"] == "metrics"


def test_hard_metrics_count_unparsed_as_wrong_on_both_classes():
    # y: P P N N; pred: P, unparsed, unparsed, N → TP 1, FN 1, TN 1 (the unparsed N is not a rejection)
    y = np.array([True, True, False, False])
    pred_pos = np.array([True, False, False, False])
    parsed = np.array([True, False, False, True])
    m = hard_metrics(y, pred_pos, parsed)
    assert m["accuracy"] == pytest.approx(2 / 4)
    assert m["recall"] == pytest.approx(1 / 2)
    assert m["balanced_accuracy"] == pytest.approx((1 / 2 + 1 / 2) / 2)
    assert m["precision"] == pytest.approx(1.0)


def test_compare_joins_on_id_not_row_order():
    y, score = synthetic(n=400)
    other = hard(y, score >= 0.5, "rl")
    reversed_other = other.take(list(range(other.n))[::-1])
    result = sweep(scored(y, score), compare=[reversed_other])["compared"][0]
    assert result["reproduced"] is True and result["n_joined"] == 400


def test_sweep_errors_name_the_fix():
    y, score = synthetic(n=50)
    unscored = hard(y, score >= 0.5, "hard")
    with pytest.raises(ValueError, match="--method scores"):
        sweep(unscored)
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        sweep(scored(y, score), target_recall=1.5)
    with pytest.raises(ValueError, match="not one of the labels"):
        sweep(scored(y, score), positive_label="eggs")
