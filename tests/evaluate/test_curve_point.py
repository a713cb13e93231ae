"""labelrl.evaluate.curve_point: ΔROC-AUC (the curve) and recall/precision (the point), paired."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from labelrl.evaluate.curve_point import paired_curve_point
from labelrl.evaluate.io import Predictions, predictions_table
from labelrl.types import LabelSpace

SPAM = LabelSpace(("ham", "spam"), kind="binary", positive="spam")


def run(y: list[str], p_spam, answers: list[str] | None = None, name: str = "run") -> Predictions:
    """Scored predictions; answers default to the argmax of (P(ham), P(spam))."""
    p = np.asarray(p_spam, dtype=np.float64)
    answers = answers or ["spam" if v > 0.5 else "ham" for v in p]
    table = predictions_table([f"i{i}" for i in range(len(y))], y, answers, ["ok"] * len(y), SPAM, np.stack([1 - p, p], 1))
    return Predictions(table, SPAM, {"source": name})


def test_delta_auc_recall_and_precision_by_hand():
    y = ["ham", "ham", "spam", "spam"]
    sft = run(y, [0.1, 0.6, 0.4, 0.9])   # answers ham, spam, ham, spam
    rl = run(y, [0.1, 0.2, 0.4, 0.9])    # answers ham, ham, ham, spam
    r = paired_curve_point([sft], [rl], names=("sft", "grpo"), n_boot=200)
    m = r["metrics"]
    # AUC sft: spam scores 0.4, 0.9 against ham 0.1, 0.6: 0.4 beats 0.1 only, 0.9 beats both → 3/4.
    # AUC grpo: every spam score above every ham score → 1. Δ = B − A = +0.25 (a swapped sign gives −0.25;
    # the AUC of the answers instead of the scores would give 0.5 and 0.75).
    assert (m["roc_auc"]["a"], m["roc_auc"]["b"], m["roc_auc"]["delta"]) == pytest.approx((0.75, 1.0, 0.25))
    # recall of spam: sft 1/2 (item 3), grpo 1/2 (item 3) → Δ 0
    assert (m["recall"]["a"], m["recall"]["b"], m["recall"]["delta"]) == pytest.approx((0.5, 0.5, 0.0))
    # precision of spam answers: sft 1 of 2, grpo 1 of 1 → Δ +0.5 (recall and precision swapped would differ)
    assert (m["precision"]["a"], m["precision"]["b"], m["precision"]["delta"]) == pytest.approx((0.5, 1.0, 0.5))
    assert r["curve"].startswith("curve: ΔROC-AUC +0.250 [")
    assert "grpo 1.000 vs sft 0.750 over 4 items" in r["curve"]
    assert r["point"].startswith("point (grpo vs sft, positive 'spam'): recall 0.500 vs 0.500 (Δ +0.000 [")
    assert "precision 1.000 vs 0.500 (Δ +0.500 [" in r["point"]


def test_identical_scores_give_an_interval_of_exactly_zero():
    rng = np.random.default_rng(0)
    y = ["spam" if v else "ham" for v in rng.random(80) < 0.4]
    p = rng.random(80)
    r = paired_curve_point([run(y, p)], [run(y, p)], n_boot=300)
    # Paired: both arms are recomputed on the same drawn items, so Δ is 0 on every draw. An unpaired
    # bootstrap (each arm its own draw) would give an interval of about ±0.1 around 0.
    for name in ("roc_auc", "recall", "precision"):
        assert r["metrics"][name]["delta"] == 0.0 and r["metrics"][name]["ci"] == [0.0, 0.0], name
    assert "no detectable difference" in r["curve"]


def test_a_clearly_better_ranking_excludes_zero():
    rng = np.random.default_rng(1)
    is_spam = rng.random(200) < 0.5
    y = ["spam" if v else "ham" for v in is_spam]
    noise = run(y, rng.random(200))  # AUC about 0.5
    ranked = run(y, np.where(is_spam, 0.55 + 0.4 * rng.random(200), 0.05 + 0.4 * rng.random(200)))  # AUC 1
    r = paired_curve_point([noise], [ranked], names=("sft", "grpo"), n_boot=400)
    lo, hi = r["metrics"]["roc_auc"]["ci"]
    assert 0 < lo <= r["metrics"]["roc_auc"]["delta"] <= hi
    assert "(better ranking;" in r["curve"]
    swapped = paired_curve_point([ranked], [noise], n_boot=400)
    assert swapped["metrics"]["roc_auc"]["ci"][1] < 0 and "(worse ranking;" in swapped["curve"]


def test_replicates_match_an_independent_bootstrap_with_sklearn():
    """Two runs per arm: the documented draws (items, then runs of A, then runs of B, from one
    default_rng(seed)) and the AUCs recomputed with scikit-learn on each draw."""
    rng = np.random.default_rng(2)
    n, n_boot, seed = 30, 150, 7
    is_spam = rng.random(n) < 0.5
    y = ["spam" if v else "ham" for v in is_spam]
    scores_a = [rng.random(n) for _ in range(2)]
    scores_b = [np.clip(0.3 * is_spam + 0.7 * rng.random(n), 0, 1) for _ in range(2)]
    r = paired_curve_point([run(y, s) for s in scores_a], [run(y, s) for s in scores_b], n_boot=n_boot, seed=seed)

    draws = np.random.default_rng(seed)
    items = draws.integers(0, n, (n_boot, n))
    runs_a, runs_b = draws.integers(0, 2, (n_boot, 2)), draws.integers(0, 2, (n_boot, 2))
    deltas = []
    for k in range(n_boot):
        rows = items[k]
        if is_spam[rows].all() or not is_spam[rows].any():
            continue  # no AUC on a one-class draw
        auc = lambda s: roc_auc_score(is_spam[rows], s[rows])  # noqa: E731
        deltas.append(np.mean([auc(scores_b[j]) for j in runs_b[k]]) - np.mean([auc(scores_a[i]) for i in runs_a[k]]))
    point = np.mean([roc_auc_score(is_spam, s) for s in scores_b]) - np.mean([roc_auc_score(is_spam, s) for s in scores_a])
    assert r["n_runs"] == [2, 2] and "2/2 seeds higher" in r["curve"]
    assert r["metrics"]["roc_auc"]["delta"] == pytest.approx(point, abs=1e-12)
    assert r["metrics"]["roc_auc"]["ci"] == pytest.approx(list(np.percentile(deltas, [2.5, 97.5])), abs=1e-12)
    assert r["metrics"]["roc_auc"]["se"] == pytest.approx(np.std(deltas, ddof=1), abs=1e-12)
    per_seed = [roc_auc_score(is_spam, scores_b[k]) - roc_auc_score(is_spam, scores_a[k]) for k in range(2)]
    assert r["metrics"]["roc_auc"]["pair_deltas"] == pytest.approx(per_seed, abs=1e-12)


def test_a_run_that_never_answers_positive_has_no_precision_and_stays_json():
    y = ["ham", "spam", "spam", "ham", "spam"]
    collapsed = run(y, [0.1, 0.45, 0.4, 0.2, 0.3])  # ranks well, answers ham everywhere
    sft = run(y, [0.2, 0.7, 0.6, 0.55, 0.8])
    r = paired_curve_point([sft], [collapsed], names=("sft", "grpo"), n_boot=100)
    assert r["metrics"]["precision"]["b"] is None and r["metrics"]["precision"]["delta"] is None
    assert r["metrics"]["recall"]["b"] == 0.0
    # sft answers spam on items 1, 2, 3, 4, three of them spam → 0.750; grpo's "none answered", not "0.000",
    # which would read as every spam answer wrong
    assert "precision none answered vs 0.750" in r["point"]
    json.dumps(r, allow_nan=False)  # NaN never reaches paired.json


def test_refusals_name_the_problem():
    y = ["ham", "spam"]
    labels = LabelSpace(("1", "2", "3"), kind="ordinal")
    probs = np.full((2, 3), 1 / 3)
    ordinal = Predictions(predictions_table(["a", "b"], ["1", "2"], ["1", "1"], ["ok", "ok"], labels, probs), labels)
    with pytest.raises(ValueError, match="are ordinal: the curve .* for binary tasks"):
        paired_curve_point([ordinal], [ordinal])
    table = predictions_table(["i0", "i1"], y, ["ham", "ham"], ["ok", "ok"], SPAM)  # no probabilities
    unscored = Predictions(table, SPAM, {"source": "gen.parquet"})
    with pytest.raises(ValueError, match="gen.parquet: no label scores"):
        paired_curve_point([run(y, [0.2, 0.7])], [unscored])
    with pytest.raises(ValueError, match="n_boot=0"):
        paired_curve_point([run(y, [0.2, 0.7])], [run(y, [0.2, 0.7])], n_boot=0)
