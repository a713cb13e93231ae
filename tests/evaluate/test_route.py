import json

import numpy as np
import pytest
from sklearn.metrics import balanced_accuracy_score

from labelrl.evaluate.io import Predictions, predictions_table
from labelrl.evaluate.route import balanced_accuracy, cascade_grid, frontier, route
from labelrl.types import LabelSpace

SPACE = LabelSpace(("ham", "spam"), kind="binary")


def make(ids, labels, preds, score=None, name="m"):
    probs = None if score is None else np.stack([1 - np.asarray(score), np.asarray(score)], axis=1)
    status = ["ok" if p is not None else "no_answer" for p in preds]
    return Predictions(predictions_table(ids, labels, preds, status, SPACE, probs), SPACE, {"source": name})


def small_pair():
    # 8 items. A's P(spam) and answers; B right where A is unsure (items 2, 3), wrong on item 6.
    ids = [str(i) for i in range(8)]
    labels = ["spam", "spam", "spam", "ham", "ham", "ham", "ham", "spam"]
    score = [0.95, 0.90, 0.45, 0.55, 0.05, 0.10, 0.20, 0.60]
    pred_a = ["spam", "spam", "ham", "spam", "ham", "ham", "ham", "spam"]  # wrong: 2, 3
    pred_b = ["spam", "spam", "spam", "ham", "ham", "ham", "spam", None]  # wrong: 6, 7
    return make(ids, labels, pred_a, score, "A"), make(ids, labels, pred_b, name="B")


def test_oracle_and_single_models_by_hand():
    a, b = small_pair()
    out = route(a, b)
    # A: spam 3/4 right, ham 3/4 right → BA 0.75; B: spam 3/4, ham 3/4 → 0.75; oracle: all right.
    assert out["a"]["balanced_accuracy"] == pytest.approx(0.75)
    assert out["b"]["balanced_accuracy"] == pytest.approx(0.75)
    assert out["oracle"]["balanced_accuracy"] == pytest.approx(1.0)
    assert out["oracle"]["accuracy"] == pytest.approx(1.0)


def test_cascade_band_routes_the_unsure_items():
    a, b = small_pair()
    bands = route(a, b)["cascade"]["bands"]
    # confidence max(p, 1−p): items 2 and 3 have 0.55; band [0.5, 0.6) routes exactly them (and
    # item 7 at 0.60 stays with A) → both fixed, B's mistakes avoided → BA 1.0.
    band = next(x for x in bands if x["lo"] == pytest.approx(0.5) and x["hi"] == pytest.approx(0.6))
    assert band["n_routed"] == 2 and band["share_routed"] == pytest.approx(0.25)
    assert band["balanced_accuracy"] == pytest.approx(1.0)
    assert band["delta_balanced_accuracy"] == pytest.approx(0.25)
    everything = next(x for x in bands if x["lo"] == pytest.approx(0.5) and x["hi"] == pytest.approx(1.0))
    assert everything["share_routed"] == 1.0  # the last band includes confidence 1
    assert everything["balanced_accuracy"] == pytest.approx(0.75)  # = B alone
    assert route(a, b)["cascade"]["best"]["delta_balanced_accuracy"] == pytest.approx(0.25)


def test_cascade_grid_matches_sklearn_on_random_data():
    rng = np.random.default_rng(0)
    n = 500
    true = rng.integers(0, 2, n)
    conf = rng.uniform(0.5, 1.0, n)
    correct_a, correct_b = rng.random(n) < conf, rng.random(n) < 0.8
    bands = cascade_grid(conf, correct_a, correct_b, true, 2)
    assert len(bands) == 55  # 11 edges → 11·10/2 bands
    for band in bands[::7]:
        last = band["hi"] == 1.0
        routed = (conf >= band["lo"]) & ((conf <= band["hi"]) if last else (conf < band["hi"]))
        correct = np.where(routed, correct_b, correct_a)
        pred = np.where(correct, true, 1 - true)
        assert band["balanced_accuracy"] == pytest.approx(balanced_accuracy_score(true, pred))
    assert balanced_accuracy(correct_a, true, 2) == pytest.approx(balanced_accuracy_score(true, np.where(correct_a, true, 1 - true)))


def test_frontier_keeps_only_undominated_bands():
    bands = [{"share_routed": s, "delta_balanced_accuracy": d} for s, d in
             [(0.05, -0.01), (0.08, 0.0), (0.1, 0.01), (0.2, 0.005), (0.3, 0.03), (0.3, 0.02), (0.5, 0.03)]]
    # (0.05, −0.01) and (0.08, 0) do not beat A alone; (0.2, 0.005) and (0.5, 0.03) are beaten with less traffic.
    assert [(b["share_routed"], b["delta_balanced_accuracy"]) for b in frontier(bands)] == [(0.1, 0.01), (0.3, 0.03)]


def test_disagreements_by_confidence_and_ambiguity(tmp_path):
    a, b = small_pair()
    audit = tmp_path / "audit.json"
    # Items 2 and 6 sit in conflicting duplicate groups (with ids outside this split).
    audit.write_text(json.dumps({"conflicting_groups": [{"ids": ["2", "99"]}, {"ids": ["6", "100"]}]}))
    out = route(a, b, audit=audit)["disagreement"]
    # Disagreements: 2 (B right), 3 (B right), 6 (A right), 7 (A right, B unparsed).
    assert out["n_disagree"] == 4 and out["a_right"] == 2 and out["b_right"] == 2 and out["b_gain"] == 2
    low = out["by_confidence"][0]  # A-confidence [0.5, 0.6): items 2, 3
    assert low["n_disagree"] == 2 and low["b_gain"] == 2
    ambiguous, clear = out["by_ambiguity"]
    assert ambiguous["n"] == 2 and ambiguous["n_disagree"] == 2 and ambiguous["b_gain"] == 1
    assert clear["n"] == 6 and clear["n_disagree"] == 2 and clear["b_gain"] == 1
    assert out["b_gain_share_ambiguous"] == pytest.approx(0.5)


def test_route_needs_a_scored_and_a_shared_ids(tmp_path):
    a, b = small_pair()
    with pytest.raises(ValueError, match="A must be a scored model"):
        route(b, a)
    other = make(["x"], ["ham"], ["ham"], name="C")
    with pytest.raises(ValueError, match="share no id"):
        route(a, other)
    bad = tmp_path / "audit.json"
    bad.write_text("{}")
    with pytest.raises(ValueError, match="conflicting_groups"):
        route(a, b, audit=bad)
