import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.calibration import calibration_curve
from sklearn.metrics import (
    accuracy_score,
    average_precision_score,
    balanced_accuracy_score,
    f1_score,
    precision_score,
    recall_score,
    roc_auc_score,
)
from sklearn.preprocessing import label_binarize

from labelrl.evaluate.metrics import (
    UNPARSED,
    basic_metrics,
    bootstrap_intervals,
    bootstrap_weights,
    classification_metrics,
    encode,
    metrics_from_weights,
    point_metrics,
    weighted_auc,
    weighted_average_precision,
)
from labelrl.types import LabelSpace

BINARY = LabelSpace(("ham", "spam"), kind="binary")
THREE = LabelSpace(("neg", "neu", "pos"), kind="categorical")
GRADES = LabelSpace(("1", "2", "3", "4", "5"), kind="ordinal")


def random_binary(rng, n=300, unparsed=0.0):
    y = rng.integers(0, 2, n)
    score = np.clip(0.3 * y + rng.random(n) * 0.7, 0, 1).round(2)  # rounded: ties on purpose
    pred = np.where(score >= 0.5, "spam", "ham").astype(object)
    pred[rng.random(n) < unparsed] = None
    return [BINARY.labels[i] for i in y], list(pred), score


def random_multi(rng, n=300):
    y = rng.integers(0, 3, n)
    logits = rng.normal(size=(n, 3)) + 1.5 * np.eye(3)[y]
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    pred = [THREE.labels[i] for i in probs.argmax(1)]
    return [THREE.labels[i] for i in y], pred, probs


def resample(enc, idx):
    scores = None if enc.scores is None else enc.scores[idx]
    labels = enc.labels.labels
    return encode([labels[i] for i in enc.true[idx]], [None if p < 0 else labels[p] for p in enc.pred[idx]],
                  enc.labels, scores)


def test_binary_point_metrics_match_sklearn():
    y, pred, score = random_binary(np.random.default_rng(0))
    m = point_metrics(encode(y, pred, BINARY, score))
    yb = np.array(y) == "spam"
    pb = np.array(pred) == "spam"
    assert m["accuracy"] == pytest.approx(accuracy_score(yb, pb))
    assert m["balanced_accuracy"] == pytest.approx(balanced_accuracy_score(yb, pb))
    assert m["precision"] == pytest.approx(precision_score(yb, pb))
    assert m["recall"] == pytest.approx(recall_score(yb, pb))
    assert m["f1"] == pytest.approx(f1_score(yb, pb))
    assert m["roc_auc"] == pytest.approx(roc_auc_score(yb, score))
    assert m["pr_auc"] == pytest.approx(average_precision_score(yb, score))


def test_multiclass_point_metrics_match_sklearn():
    y, pred, probs = random_multi(np.random.default_rng(1))
    m = point_metrics(encode(y, pred, THREE, probs))
    assert m["precision"] == pytest.approx(precision_score(y, pred, average="macro"))
    assert m["recall"] == pytest.approx(recall_score(y, pred, average="macro"))
    assert m["f1"] == pytest.approx(f1_score(y, pred, average="macro"))
    yi = np.array([THREE.index(v) for v in y])
    assert m["roc_auc"] == pytest.approx(roc_auc_score(yi, probs, multi_class="ovr", average="macro"))
    assert m["pr_auc"] == pytest.approx(average_precision_score(label_binarize(yi, classes=[0, 1, 2]), probs, average="macro"))


@pytest.mark.parametrize("case", ["binary", "binary_unparsed", "multi"])
def test_weighted_form_equals_sklearn_at_unit_weights_and_on_a_resample(case):
    rng = np.random.default_rng(2)
    if case == "multi":
        y, pred, scores = random_multi(rng)
        enc = encode(y, pred, THREE, scores)
    else:
        y, pred, scores = random_binary(rng, unparsed=0.1 if case == "binary_unparsed" else 0.0)
        enc = encode(y, pred, BINARY, scores)
    ones = metrics_from_weights(np.ones((1, enc.n)), enc)
    point = point_metrics(enc)
    assert set(ones) == set(point)
    for name in point:
        assert ones[name][0] == pytest.approx(point[name], abs=1e-12), name
    idx = rng.integers(0, enc.n, enc.n)
    weights = np.bincount(idx, minlength=enc.n)[None, :]
    replicate = metrics_from_weights(weights, enc)
    direct = point_metrics(resample(enc, idx))
    for name in direct:
        assert replicate[name][0] == pytest.approx(direct[name], abs=1e-12), name


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 5)), min_size=2, max_size=40))
def test_weighted_auc_and_ap_match_sklearn_with_ties(rows):
    y = np.array([r[0] for r in rows], dtype=float)
    score = np.array([r[1] / 5 for r in rows])  # six levels: many ties
    ones = np.ones((1, len(rows)))
    if 0 < y.sum() < len(y):
        assert weighted_auc(ones, y, score)[0] == pytest.approx(roc_auc_score(y, score))
    else:
        assert np.isnan(weighted_auc(ones, y, score)[0])
    if y.sum() > 0:
        assert weighted_average_precision(ones, y, score)[0] == pytest.approx(average_precision_score(y, score))


def test_reliability_curve_matches_sklearn_calibration_curve():
    y, pred, score = random_binary(np.random.default_rng(3), n=500)
    out = classification_metrics(y, pred, BINARY, scores=score, n_boot=0)
    true_freq, mean_prob = calibration_curve(np.array(y) == "spam", score, n_bins=10, strategy="uniform")
    filled = [b for b in out["reliability"]["bins"] if b["n"]]
    assert [b["observed"] for b in filled] == pytest.approx(list(true_freq))
    assert [b["mean_confidence"] for b in filled] == pytest.approx(list(mean_prob))
    n = sum(b["n"] for b in filled)
    ece = sum(b["n"] / n * abs(b["observed"] - b["mean_confidence"]) for b in filled)
    assert out["ece"] == pytest.approx(ece)


def test_hand_computed_binary_reference():
    # 4 spam, 4 ham. Predictions: spam hit 3, miss 1 (unparsed); ham hit 3, false alarm 1.
    y = ["spam"] * 4 + ["ham"] * 4
    pred = ["spam", "spam", "spam", None, "ham", "ham", "ham", "spam"]
    out = classification_metrics(y, pred, BINARY, n_boot=0)
    assert out["accuracy"] == pytest.approx(6 / 8)
    assert out["recall"] == pytest.approx(3 / 4)  # the unparsed spam is a miss
    assert out["precision"] == pytest.approx(3 / 4)  # 3 of 4 spam predictions are right
    assert out["balanced_accuracy"] == pytest.approx((3 / 4 + 3 / 4) / 2)
    assert out["n_unparsed"] == 1
    cm = out["confusion_matrix"]
    assert cm["columns"] == ["ham", "spam", UNPARSED]
    assert cm["counts"] == [[3, 1, 0], [0, 3, 1]]  # rows: true ham, true spam


def test_ordinal_grade_error_counts_unparsed_as_farthest():
    # errors: |3−3|=0, |2−4|=2, unparsed on 1 → farthest is 5 → 4, |5−4|=1 → MAE 7/4
    y = ["3", "4", "1", "5"]
    pred = ["3", "2", None, "4"]
    out = classification_metrics(y, pred, GRADES, n_boot=0)
    assert out["mean_abs_grade_error"] == pytest.approx(7 / 4)
    assert out["within_one_accuracy"] == pytest.approx(2 / 4)  # 0 and 1 are within one
    weighted = metrics_from_weights(np.ones((1, 4)), encode(y, pred, GRADES))
    assert weighted["mean_abs_grade_error"][0] == pytest.approx(7 / 4)


def test_bootstrap_is_seeded_and_brackets_the_estimate(fresh_process):
    y, pred, score = random_binary(np.random.default_rng(4), n=400)
    enc = encode(y, pred, BINARY, score)
    a = bootstrap_intervals(enc, n_boot=300, seed=7)
    b = fresh_process(bootstrap_intervals, enc, n_boot=300, seed=7)  # a second run, in another process
    c = bootstrap_intervals(enc, n_boot=300, seed=8)
    assert a == b and a != c
    point = point_metrics(enc)
    for name, (lo, hi) in a.items():
        assert lo <= point[name] <= hi, name
        assert hi - lo < 0.2, name  # n=400: intervals are a few points wide, not degenerate
        assert hi > lo, name


def test_bootstrap_weights_are_resamples_of_n_rows():
    chunks = list(bootstrap_weights(50, 130, seed=0))
    weights = np.concatenate(chunks)
    assert weights.shape == (130, 50)
    assert np.all(weights.sum(axis=1) == 50)
    assert weights.mean() == pytest.approx(1.0, abs=0.05)


def test_single_score_needs_binary_and_probabilities():
    with pytest.raises(ValueError, match="binary"):
        encode(["neg"], ["neg"], THREE, np.array([0.4]))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        encode(["ham"], ["ham"], BINARY, np.array([1.4]))


@pytest.mark.filterwarnings("ignore:y_pred contains classes not in y_true")
def test_basic_metrics_still_counts_unparsed_as_wrong():
    m = basic_metrics(["a", "b", "b", "a"], ["a", None, "b", "b"])
    assert m["accuracy"] == pytest.approx(0.5)
    assert m["balanced_accuracy"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="empty"):
        basic_metrics([], [])
