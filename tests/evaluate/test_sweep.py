import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import balanced_accuracy_score, roc_auc_score, roc_curve

from labelrl.evaluate.io import Predictions, predictions_table
from labelrl.evaluate.sweep import (
    distance_over_seeds,
    hard_metrics,
    sweep,
    threshold_curve,
    threshold_for_recall,
)
from labelrl.evaluate.sweep_distance import distance, position, verdict_word, weighted_gap
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


# The hand example of the interpolation tests: 4 positives and 4 negatives, items in this order.
# Distinct scores, highest first: 0.9 {P}, 0.7 {N}, 0.5 {P, N, N}, 0.2 {P}, 0.1 {P}, 0.05 {N}, so the
# curve's vertices as counts (FP, TP) are (0,0) (0,1) (1,1) (3,2) (3,3) (3,4) (4,4), over N = P = 4.
HAND_POS = np.array([True, True, True, True, False, False, False, False])
HAND_SCORE = np.array([0.9, 0.5, 0.2, 0.1, 0.7, 0.5, 0.5, 0.05])


def reference_gap(is_pos, score, pred_pos, parsed):
    """ΔTPR by a loop over the curve's segments, vertices from sklearn (not threshold_curve): the
    segments whose FPR span holds the point's FPR give the candidate curve TPRs (both ends of a
    vertical one); the point's TPR clipped to their range is the curve's TPR there."""
    n_pos, n_neg = int(is_pos.sum()), int((~is_pos).sum())
    if n_pos == 0 or n_neg == 0:
        return np.nan
    xs, ys, _ = roc_curve(is_pos, score, drop_intermediate=False)
    tpr = (is_pos & pred_pos & parsed).sum() / n_pos
    fpr = (~is_pos & ~(~pred_pos & parsed)).sum() / n_neg
    found = []
    for x0, y0, x1, y1 in zip(xs[:-1], ys[:-1], xs[1:], ys[1:]):
        if x0 <= fpr <= x1:
            found += [y0 + (y1 - y0) * (fpr - x0) / (x1 - x0)] if x1 > x0 else [y0, y1]
    return tpr - min(max(tpr, min(found)), max(found))


def gap(pred_pos, parsed=None, is_pos=HAND_POS, score=HAND_SCORE):
    pred_pos = np.asarray(pred_pos, bool)
    parsed = np.ones(len(pred_pos), bool) if parsed is None else np.asarray(parsed, bool)
    return {k: float(v[0]) for k, v in weighted_gap(is_pos, score, pred_pos, parsed, np.ones((1, len(pred_pos)))).items()}


def test_the_curve_is_interpolated_between_vertices_and_a_vertical_stretch_is_on_it():
    #          pos 0.9 0.5 0.2 0.1 | neg 0.7 0.5 0.5 0.05
    # FP 2, TP 3: between the vertices (1,1) and (3,2): curve TP = 1 + (2−1)·(2−1)/(3−1) = 1.5,
    # TPR 1.5/4 = 0.375; the point's TPR 3/4 → ΔTPR = 0.75 − 0.375 = +0.375 (a step function, which
    # keeps the vertex (1,1) up to FP 3, would give 0.75 − 0.25 = +0.5).
    a = gap([1, 1, 1, 0, 1, 1, 0, 0])
    assert (a["fpr"], a["tpr"], a["curve_tpr"]) == (0.5, 0.75, 0.375) and a["delta_tpr"] == pytest.approx(0.375)
    # FP 2, TP 1: 0.25 − 0.375 = −0.125
    assert gap([1, 0, 0, 0, 1, 1, 0, 0])["delta_tpr"] == pytest.approx(-0.125)
    # FP 3 is a vertical stretch of the curve from TP 2 to TP 4: TP 3 lies on it (ΔTPR 0, where the
    # stretch's top would give 0.75 − 1 = −0.25); TP 1 lies below its bottom: 0.25 − 2/4 = −0.25.
    assert gap([1, 1, 1, 0, 1, 1, 1, 0])["delta_tpr"] == 0.0
    assert gap([1, 0, 0, 0, 1, 1, 1, 0])["delta_tpr"] == pytest.approx(-0.25)
    # FP 0 is the stretch from TP 0 to TP 1: TP 2 is above its top: 2/4 − 1/4 = +0.25; a vertex: 0.
    assert gap([1, 1, 0, 0, 0, 0, 0, 0])["delta_tpr"] == pytest.approx(0.25)
    assert gap([1, 0, 0, 0, 1, 0, 0, 0])["delta_tpr"] == 0.0


def test_an_unparsed_negative_is_not_a_rejection_so_it_moves_the_point_right():
    # The threshold 0.2 answers positive on pos 0.9, 0.5, 0.2 and neg 0.7, 0.5, 0.5: (FP 3, TP 3), on
    # the curve. With neg 0.05 unparsed it is not rejected either: FP 4, FPR 4/4 = 1, where the curve
    # is at TPR 1 → ΔTPR = 3/4 − 1 = −0.25. (Counting only positive answers as false positives would
    # leave the point at FPR 0.75, on the curve: an unparsed answer would look like a rejection.)
    answers = [1, 1, 1, 0, 1, 1, 1, 0]
    assert gap(answers)["delta_tpr"] == 0.0
    g = gap(answers, parsed=[1, 1, 1, 1, 1, 1, 1, 0])
    assert (g["fpr"], g["curve_tpr"]) == (1.0, 1.0) and g["delta_tpr"] == pytest.approx(-0.25)
    result = sweep(scored(HAND_POS, HAND_SCORE), compare=[hard(HAND_POS, np.array(answers, bool), "rl", unparsed=(7,))],
                   n_boot=200)["compared"][0]
    assert result["compared_metrics"]["fpr"] == 0.75 and result["distance"]["fpr"] == 1.0  # the metric vs the judged point
    assert result["distance"]["delta_tpr"] == pytest.approx(-0.25)
    assert result["distance"]["curve_tpr"] == 1.0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 6), st.booleans(), st.booleans()), min_size=2, max_size=40))
def test_the_vectorised_gap_equals_a_loop_over_the_curves_segments(rows):
    # integer scores 0 … 6: many ties, so diagonal and vertical stretches, and unparsed answers
    is_pos = np.array([r[0] for r in rows])
    if is_pos.all() or not is_pos.any():
        return
    score = np.array([r[1] / 6 for r in rows])
    pred_pos, parsed = np.array([r[2] for r in rows]), np.array([r[3] for r in rows])
    pred_pos &= parsed
    assert gap(pred_pos, parsed, is_pos, score)["delta_tpr"] == pytest.approx(reference_gap(is_pos, score, pred_pos, parsed), abs=1e-12)
    # any threshold on the scores is a vertex of their curve: exactly 0
    for t in np.unique(score):
        assert gap(score >= t, None, is_pos, score)["delta_tpr"] == 0.0


def test_a_threshold_on_the_scores_is_on_the_curve_with_delta_exactly_zero():
    y, score = synthetic()
    t = np.quantile(score, 0.6)
    out = sweep(scored(y, score), compare=[hard(y, score >= t, "rl")])
    result = out["compared"][0]
    d = result["distance"]
    # the point is a vertex of the curve, in every resample too: ΔTPR 0 and the interval [0, 0]
    assert d["delta_tpr"] == 0.0 and d["ci"] == [0.0, 0.0] and d["n_boot"] == 1000 and d["n_used"] == 1000
    assert d["tpr"] == d["curve_tpr"] == (score[y] >= t).mean() and d["fpr"] == (score[~y] >= t).mean()
    assert result["reproduced"] is True and result["uninformative"] is False and result["verdict_rests_on"] == "distance"
    assert result["verdict"] == (f"on the curve (ΔTPR at its FPR +0.000 [+0.000, +0.000]; agrees with the matched "
                                 f"threshold on 1.000 of items, chance {result['chance_agreement']:.3f})")
    assert result["item_agreement"] == 1.0 and result["n_disagree"] == 0
    assert result["threshold"] == pytest.approx(score[score >= t].min())
    assert result["recall_matched_threshold"] == pytest.approx(score[score >= t].min())
    assert {"verdict", "reproduced", "verdict_rests_on", "item_agreement", "item_agreement_ci"} <= set(result)
    assert {"delta_tpr", "ci", "n_boot", "fpr", "tpr", "curve_tpr"} <= set(d)
    assert out["operating_points"][-1]["position"] == "on the curve"


def test_a_point_catching_positives_no_threshold_catches_is_above_the_curve():
    # Scores unrelated to the labels; the arm answers every item right: its point is (FPR 0, TPR 1).
    # At FPR 0 the curve reaches the share of positives scored above every negative, so
    # ΔTPR = 1 − that share.
    rng = np.random.default_rng(3)
    y = rng.random(200) < 0.4
    score = rng.random(200)
    result = sweep(scored(y, score), compare=[hard(y, y, "oracle")])["compared"][0]
    above_all = (score[y] > score[~y].max()).mean()
    assert result["distance"]["delta_tpr"] == pytest.approx(1 - above_all)
    assert result["distance"]["ci"][0] > 0.5
    assert result["verdict"].startswith("above the curve (ΔTPR at its FPR +"), result["verdict"]
    assert result["reproduced"] is False and result["verdict_rests_on"] == "distance"


def test_hard_model_with_information_beyond_the_scores_is_above_and_noise_below():
    y, score = synthetic()
    rng = np.random.default_rng(1)
    pred = score >= np.quantile(score, 0.6)
    wrong = np.flatnonzero(pred != y)
    fixed = pred.copy()
    fixed[rng.choice(wrong, size=len(wrong) // 4, replace=False)] ^= True  # knows some labels
    flipped = pred ^ (rng.random(len(y)) < 0.15)  # flips independent of the score
    oracle, noisy = sweep(scored(y, score), compare=[hard(y, fixed, "oracle-ish"), hard(y, flipped, "noisy")])["compared"]
    assert oracle["verdict"].startswith("above the curve") and oracle["distance"]["ci"][0] > 0, oracle["verdict"]
    assert noisy["verdict"].startswith("below the curve") and noisy["distance"]["ci"][1] < 0, noisy["verdict"]
    assert oracle["reproduced"] is False and noisy["reproduced"] is False


def test_one_item_off_a_perfect_ranker_is_not_resolved_so_on_the_curve():
    # 10 negatives scored 0.05 … 0.50, 10 positives 0.55 … 1.0: the curve runs (0,0) → (0,1) → (1,1).
    # The arm misses one positive and takes one negative: (FPR 0.1, TPR 0.9), ΔTPR = 0.9 − 1 = −0.1.
    # A resample that does not draw the missed positive (P = (19/20)^20 ≈ 0.36) has ΔTPR 0 and none
    # has ΔTPR > 0, so the 97.5th percentile is 0: the interval covers 0. One item is not a finding.
    y = np.r_[np.zeros(10, bool), np.ones(10, bool)]
    score = np.linspace(0.05, 1.0, 20)
    arm = score >= score[10]
    arm[10], arm[9] = False, True
    result = sweep(scored(y, score), compare=[hard(y, arm, "one-off")])["compared"][0]
    assert result["distance"]["delta_tpr"] == pytest.approx(-0.1)
    assert result["distance"]["ci"][1] == 0.0 and result["distance"]["ci"][0] < 0
    assert result["verdict"].startswith("on the curve"), result["verdict"]


def test_the_interval_is_the_paired_bootstrap_of_the_documented_draws():
    # 12 items, 3 positive: a resample without a positive (P = (3/4)^12 ≈ 0.03) is left out. Each
    # replicate recomputes the curve and the point on the same drawn items, by the loop reference.
    rng = np.random.default_rng(5)
    y = np.r_[np.ones(3, bool), np.zeros(9, bool)]
    score = rng.integers(0, 4, 12) / 4  # ties
    pred = rng.random(12) < 0.4
    parsed = rng.random(12) < 0.9
    pred &= parsed
    got = distance(y, score[None], pred[None], parsed[None], n_boot=300, seed=7)
    items = np.random.default_rng(7).integers(0, 12, (300, 12))
    ref = np.array([reference_gap(y[i], score[i], pred[i], parsed[i]) for i in items])
    ok = np.isfinite(ref)
    assert 0 < (~ok).sum() < 30 and got["n_used"] == ok.sum()
    assert got["ci"] == pytest.approx(list(np.percentile(ref[ok], [2.5, 97.5])), abs=1e-12)
    assert got["delta_tpr"] == pytest.approx(reference_gap(y, score, pred, parsed), abs=1e-12)


def test_two_runs_with_one_seed_agree_and_another_seed_draws_other_resamples():
    y, score = synthetic(n=300)
    noisy = hard(y, (score >= 0.5) ^ (np.random.default_rng(4).random(300) < 0.1), "noisy")
    a, b = (sweep(scored(y, score), compare=[noisy], n_boot=200, seed=1)["compared"][0]["distance"] for _ in range(2))
    c = sweep(scored(y, score), compare=[noisy], n_boot=200, seed=2)["compared"][0]["distance"]
    assert a == b and a["seed"] == 1
    assert c["delta_tpr"] == a["delta_tpr"] and c["ci"] != a["ci"]


def test_an_always_positive_arm_is_uninformative_never_on_the_curve():
    # Always "spam": the point (FPR 1, TPR 1) is the curve's last vertex, ΔTPR exactly 0 with the
    # interval [0, 0], as for ANY scores: it says nothing about them.
    y, score = synthetic(n=300)
    result = sweep(scored(y, score), compare=[hard(y, np.ones(len(y), bool), "always spam")])["compared"][0]
    assert result["distance"]["delta_tpr"] == 0.0 and result["distance"]["ci"] == [0.0, 0.0]
    assert (result["distance"]["fpr"], result["distance"]["tpr"]) == (1.0, 1.0)
    assert result["constant_share"]["compared"] == 1.0
    assert result["verdict"].startswith("uninformative: a (near-)constant predictor (the arm gives one answer on 1.000"), result["verdict"]
    assert result["reproduced"] is False and result["uninformative"] is True and result["verdict_rests_on"] == "nothing"


def test_a_model_answering_nothing_positive_is_uninformative_not_on_the_curve():
    # An SFT model whose spam probability never reaches 0.5, compared with itself: the point (0, 0)
    # is on every curve and every item agrees, as it would for ANY two models answering "ham" everywhere.
    y, score = synthetic()
    score = score * 0.4
    out = sweep(scored(y, score), compare=[hard(y, score >= 0.5, "same model")])
    result = out["compared"][0]
    assert result["max_metric_difference"] == 0.0 and result["item_agreement"] == 1.0
    assert result["distance"]["delta_tpr"] == 0.0
    assert result["threshold"] > score.max() and result["scored_metrics"]["predicted_positive_share"] == 0.0
    assert result["reproduced"] is False and result["uninformative"] is True
    assert result["verdict"].startswith("uninformative: a (near-)constant predictor"), result["verdict"]
    assert result["constant_share"]["compared"] == 1.0 and result["verdict_rests_on"] == "nothing"
    assert out["operating_points"][-1]["uninformative"] is True


def test_a_near_constant_arm_is_uninformative_at_the_share_bound_and_judged_below_it():
    # 200 items, 60 positives. The arm answers positive on the top-k scores only: k = 8 gives
    # 192/200 = 0.96 ≥ 0.95 "ham" → uninformative; k = 40 gives 160/200 = 0.80 → an ordinary
    # verdict (a threshold on the scores, so on the curve). Catches a rule keyed on exactly 100%.
    y, score = synthetic(n=200)
    order = np.argsort(-score)
    for k, uninformative in ((8, True), (40, False)):
        pred = np.zeros(len(y), bool)
        pred[order[:k]] = True
        result = sweep(scored(y, score), compare=[hard(y, pred, f"top{k}")])["compared"][0]
        assert result["constant_share"]["compared"] == pytest.approx(1 - k / 200)
        assert result["uninformative"] is uninformative, (k, result["verdict"])
        assert result["reproduced"] is (not uninformative), (k, result["verdict"])


def test_item_agreement_and_its_chance_level_stand_beside_the_distance():
    # 20 items. Negatives 0.05 … 0.45 (9) and one at 0.70; positives one at 0.30 and 0.55 … 0.95
    # (9). The arm is the threshold 0.55 (TPR 9/10, FPR 1/10) with its answer on the negative scored
    # 0.05 unparsed: FP 2, a point (FPR 0.2, TPR 0.9) on the curve's vertex for 0.45. 19/20 = 0.95
    # items agree; chance: per class both answer positive at 0.9 (pos) and 0.1 (neg) → 0.9² + 0.1² = 0.82.
    neg = np.r_[np.linspace(0.05, 0.45, 9), 0.70]
    pos = np.r_[0.30, np.linspace(0.55, 0.95, 9)]
    y = np.r_[np.zeros(10, bool), np.ones(10, bool)]
    score = np.r_[neg, pos]
    result = sweep(scored(y, score), compare=[hard(y, score >= 0.55, "one unparsed", unparsed=(0,))])["compared"][0]
    assert result["item_agreement"] == pytest.approx(0.95)
    assert result["chance_agreement"] == pytest.approx(0.82)
    assert result["distance"]["fpr"] == pytest.approx(0.2) and result["distance"]["delta_tpr"] == 0.0
    assert result["verdict"].startswith("on the curve (ΔTPR at its FPR +0.000 [")
    assert result["verdict"].endswith("; agrees with the matched threshold on 0.950 of items, chance 0.820)")


def test_within_class_shuffle_is_on_the_curve_and_its_item_agreement_says_otherwise():
    # A thresholded SFT model's answers shuffled among the items of each true class: the point is
    # exactly the thresholded model's (on the curve, ΔTPR 0), but the answers no longer follow the
    # scores, which the agreement beside the verdict shows (near chance, far below 1).
    y, score = synthetic(n=400)
    thresholded = score >= np.quantile(score, 0.6)
    rng = np.random.default_rng(2)
    shuffled = thresholded.copy()
    for cls in (True, False):
        idx = np.flatnonzero(y == cls)
        shuffled[idx] = thresholded[rng.permutation(idx)]
    result = sweep(scored(y, score), compare=[hard(y, shuffled, "shuffled")])["compared"][0]
    assert result["recall_matched_max_difference"] == pytest.approx(0.0, abs=1e-12)  # the metrics match exactly
    assert result["distance"]["delta_tpr"] == 0.0 and result["verdict"].startswith("on the curve")
    assert result["item_agreement_ci"][1] < 0.95
    assert result["chance_agreement"] == pytest.approx(result["item_agreement"], abs=0.1)
    assert f"agrees with the matched threshold on {result['item_agreement']:.3f} of items" in result["verdict"]


def test_pooled_over_one_seed_equals_the_single_run_and_over_two_is_the_mean():
    y, score0 = synthetic(n=300, seed=0)
    score1 = np.clip(score0 + np.random.default_rng(9).normal(0, 0.1, 300), 0, 1)  # the second seed's parent
    rng = np.random.default_rng(8)
    runs = [hard(y, (s >= 0.5) ^ (rng.random(300) < 0.1), f"rl@s{i}") for i, s in enumerate((score0, score1))]
    parents = [scored(y, score0, "sft@s0"), scored(y, score1, "sft@s1")]
    single = [sweep(p, compare=[r], n_boot=300, seed=3)["compared"][0]["distance"] for p, r in zip(parents, runs)]
    reversed_run = runs[0].take(list(range(300))[::-1])  # joined on id, not row order
    one = distance_over_seeds([(parents[0], reversed_run)], n_boot=300, seed=3)
    assert {k: one[k] for k in single[0]} == single[0]
    assert one["position"] == position(single[0]["ci"]) and one["words"].startswith("ΔTPR at its FPR ")
    two = distance_over_seeds(list(zip(parents, runs)), n_boot=300, seed=3)
    assert two["delta_tpr"] == pytest.approx((single[0]["delta_tpr"] + single[1]["delta_tpr"]) / 2)
    assert two["delta_tpr_pairs"] == pytest.approx([single[0]["delta_tpr"], single[1]["delta_tpr"]])
    assert two["n_pairs"] == 2 and ", mean over 2 seeds" in two["words"]


def test_pooled_interval_draws_items_for_every_pair_and_pairs_with_replacement():
    # Brute force of the two-level bootstrap: items = rng.integers(0, n, (B, n)), then
    # pairs = rng.integers(0, S, (B, S)); each replicate averages the drawn pairs' ΔTPR on the drawn items.
    rng = np.random.default_rng(6)
    n, S = 30, 2
    y = rng.random(n) < 0.4
    scores = rng.integers(0, 5, (S, n)) / 5
    pred = rng.random((S, n)) < 0.5
    parsed = np.ones((S, n), bool)
    got = distance(y, scores, pred, parsed, n_boot=150, seed=4)
    draw = np.random.default_rng(4)
    items, pairs = draw.integers(0, n, (150, n)), draw.integers(0, S, (150, S))
    boot = np.array([np.mean([reference_gap(y[i], scores[p][i], pred[p][i], parsed[p][i]) for p in drawn])
                     for i, drawn in zip(items, pairs)])
    boot = boot[np.isfinite(boot)]
    assert got["ci"] == pytest.approx(list(np.percentile(boot, [2.5, 97.5])), abs=1e-12)


def test_each_run_is_paired_with_its_own_seeds_parent():
    # Each run is a threshold on its own parent's scores (ΔTPR 0 each, so 0 pooled with [0, 0]); a
    # run measured against the other seed's parent would not be.
    y, score0 = synthetic(n=300, seed=0)
    score1 = np.random.default_rng(1).random(300)
    parents = [scored(y, score0, "sft@s0"), scored(y, score1, "sft@s1")]
    runs = [hard(y, score0 >= 0.5, "rl@s0"), hard(y, score1 >= 0.5, "rl@s1")]
    pooled = distance_over_seeds(list(zip(parents, runs)), n_boot=100)
    assert pooled["delta_tpr"] == 0.0 and pooled["ci"] == [0.0, 0.0] and pooled["position"] == "on the curve"
    crossed = distance_over_seeds([(parents[1], runs[0])], n_boot=100)
    assert crossed["delta_tpr"] > 0.1


def test_verdict_words_name_each_verdict_and_an_older_files_head():
    assert [verdict_word(v) for v in ("on the curve (ΔTPR …)", "above the curve (…)", "below the curve (…)",
                                      "uninformative: a (near-)constant predictor (…)", "reproduced: the same point")] == [
        "on the curve", "above the curve", "below the curve", "uninformative", "reproduced"]
    assert position([-0.02, 0.04]) == "on the curve" and position([0.0, 0.1]) == "on the curve"
    assert position([0.01, 0.1]) == "above the curve" and position([-0.1, -0.01]) == "below the curve"
    assert position(None) == "undetermined"


def test_compare_joins_on_id_not_row_order():
    y, score = synthetic(n=400)
    other = hard(y, score >= 0.5, "rl")
    reversed_other = other.take(list(range(other.n))[::-1])
    result = sweep(scored(y, score), compare=[reversed_other])["compared"][0]
    assert result["reproduced"] is True and result["n_joined"] == 400 and result["distance"]["delta_tpr"] == 0.0


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


def test_sweep_errors_name_the_fix():
    y, score = synthetic(n=50)
    unscored = hard(y, score >= 0.5, "hard")
    with pytest.raises(ValueError, match="--method scores"):
        sweep(unscored)
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        sweep(scored(y, score), target_recall=1.5)
    with pytest.raises(ValueError, match="not one of the labels"):
        sweep(scored(y, score), positive_label="eggs")
    with pytest.raises(ValueError, match=r"n_boot=0: .* at least 1 bootstrap resample"):
        sweep(scored(y, score), compare=[unscored], n_boot=0)
    with pytest.raises(ValueError, match="at least one"):
        distance_over_seeds([])
