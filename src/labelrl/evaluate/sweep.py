"""Threshold sweeps of a scored model, and whether another model's operating point is just
a threshold on it.

A model that predicts "positive" when P(positive) ≥ t traces the ROC curve as t moves. An
RL run that reaches a higher recall than its SFT start at a similar balanced accuracy may
only have moved along that curve; ``sweep`` checks this by measuring how far the other
model's point lies above or below the scored model's curve.

Conventions: a threshold t predicts positive for every row with score ≥ t. Candidate
thresholds are the distinct scores. Everything is one-vs-rest on the positive label, so
multi-class predictions work with ``score_<positive>``. For a hard-prediction model, an
unparsed answer is wrong: it is a miss on a positive and not a correct rejection on a
negative (as in ``labelrl.evaluate.metrics``). Compared metrics: accuracy, balanced
accuracy, precision, recall and F1 of the positive label.

The verdict of ``compare_operating_point`` rests on the distance
(``labelrl.evaluate.sweep_distance``): ΔTPR = TPR − TPR_SFT(FPR), the other model's point's
vertical distance from the scored model's ROC curve (linear between its vertices: randomised
thresholding, Fawcett 2006 §10), with a 95% paired bootstrap interval over items: "on the
curve" when the interval covers 0, "above the curve" or "below the curve" when it does not.
Equal points do not make equal predictions, so beside it stands item agreement: the share of
items the other model answers as the scored model thresholded at its recall does, and the
agreement chance alone would give. ``distance_over_seeds`` pools several seeds' pairs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from sklearn.metrics import roc_auc_score, roc_curve

from labelrl.evaluate.io import Predictions, join_on_id
from labelrl.evaluate.sweep_distance import distance, position, verdict_word
from labelrl.types import canonical_label

COMPARED_METRICS = ("accuracy", "balanced_accuracy", "precision", "recall", "f1")
# A model answering one label on at least this share of items sits at (or next to) a corner of
# the ROC square, where every curve passes: its distance from the curve says nothing.
CONSTANT_SHARE = 0.95
DEFAULT_N_BOOT = 1000


def _ratio(num, den):
    num, den = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    return np.where(den > 0, num / np.where(den > 0, den, 1), 0.0)


def metrics_from_counts(tp, fp, tn, n_pos: int, n_neg: int) -> dict[str, np.ndarray]:
    """Positive-label metrics from confusion counts (arrays or scalars); FN = P − TP, and a
    negative counts as correctly rejected only when its answer parsed (TN given)."""
    tp, fp, tn = (np.asarray(x, dtype=np.float64) for x in (tp, fp, tn))
    recall = _ratio(tp, n_pos)
    specificity = _ratio(tn, n_neg)
    return {
        "accuracy": (tp + tn) / (n_pos + n_neg),
        "balanced_accuracy": (recall + specificity) / 2,
        "precision": _ratio(tp, tp + fp),
        "recall": recall,
        "f1": _ratio(2 * tp, 2 * tp + fp + (n_pos - tp)),
        "fpr": _ratio(fp, n_neg),
    }


@dataclass(frozen=True)
class ThresholdCurve:
    """Confusion counts at a threshold just above every score (nothing positive), then at each
    distinct score, thresholds from highest to lowest."""

    thresholds: np.ndarray  # [U] descending
    tp: np.ndarray  # [U] positives with score ≥ threshold
    fp: np.ndarray  # [U] negatives with score ≥ threshold
    n_pos: int
    n_neg: int

    def metrics(self) -> dict[str, np.ndarray]:
        return metrics_from_counts(self.tp, self.fp, self.n_neg - self.fp, self.n_pos, self.n_neg)

    def at(self, i: int) -> dict[str, float]:
        out = {name: float(v[i]) for name, v in self.metrics().items()}
        out["threshold"] = float(self.thresholds[i])
        out["predicted_positive_share"] = float((self.tp[i] + self.fp[i]) / (self.n_pos + self.n_neg))
        return out


def threshold_curve(is_pos: np.ndarray, score: np.ndarray) -> ThresholdCurve:
    is_pos = np.asarray(is_pos, dtype=bool)
    n_pos, n_neg = int(is_pos.sum()), int((~is_pos).sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError(f"{n_pos} positive and {n_neg} negative rows: a threshold sweep needs both; check --positive-label and the split")
    order = np.argsort(-np.asarray(score, dtype=np.float64), kind="stable")
    s = np.asarray(score, dtype=np.float64)[order]
    last = np.r_[s[1:] != s[:-1], True]  # last row of each run of equal scores
    tp, fp = np.cumsum(is_pos[order])[last], np.cumsum(~is_pos[order])[last]
    # First the threshold just above every score: nothing predicted positive, itself an operating point.
    above = np.nextafter(s[0], np.inf)
    return ThresholdCurve(np.r_[above, s[last]], np.r_[0, tp], np.r_[0, fp], n_pos, n_neg)


def threshold_for_recall(curve: ThresholdCurve, target: float) -> int:
    """Index of the largest threshold whose recall is ≥ ``target``.

    Exact on integers: recall ≥ R ⇔ TP ≥ ⌈R·P⌉ (a 1e-9 slack absorbs R·P landing a rounding
    error above an integer), and TP only grows as the threshold falls.
    """
    if not 0 < target <= 1:
        raise ValueError(f"target recall {target}: must lie in (0, 1]; e.g. --target-recall 0.9")
    need = math.ceil(target * curve.n_pos - 1e-9)
    return int(np.argmax(curve.tp >= need))


def best_balanced_accuracy(curve: ThresholdCurve) -> int:
    """Index of the threshold with the highest balanced accuracy (ties: the largest threshold)."""
    return int(np.argmax(curve.metrics()["balanced_accuracy"]))


def hard_metrics(true_pos: np.ndarray, pred_pos: np.ndarray, parsed: np.ndarray) -> dict[str, float]:
    """Positive-label metrics of hard predictions (see the module docstring for unparsed rows)."""
    true_pos, pred_pos, parsed = (np.asarray(x, dtype=bool) for x in (true_pos, pred_pos, parsed))
    tp = int((true_pos & pred_pos).sum())
    fp = int((~true_pos & pred_pos).sum())
    tn = int((~true_pos & ~pred_pos & parsed).sum())
    return {k: float(v) for k, v in metrics_from_counts(tp, fp, tn, int(true_pos.sum()), int((~true_pos).sum())).items()}


def positive_scores(pred: Predictions, positive_label: str | None) -> tuple[str, np.ndarray]:
    """The positive label and its probability per row [N]."""
    scores = pred.scores()
    if scores is None:
        raise ValueError(f"{pred.info.get('source', 'the predictions')}: no score column; a sweep needs a scored model (labelrl eval --method scores)")
    if positive_label is None:
        if pred.labels.kind != "binary":
            raise ValueError(f"the labels {list(pred.labels.labels)} are not binary: name the positive one with --positive-label")
        positive_label = pred.labels.positive_label
    label = pred.labels.normalise(positive_label)
    if label is None:
        raise ValueError(f"--positive-label {positive_label!r} is not one of the labels {list(pred.labels.labels)}")
    return label, scores[:, pred.labels.index(label)]


def _binary_view(pred: Predictions, rows: list[int], positive: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    want = canonical_label(positive)
    true_pos = np.array([canonical_label(pred.y_true[r]) == want for r in rows])
    answers = [pred.y_pred[r] for r in rows]
    return true_pos, np.array([a is not None and canonical_label(a) == want for a in answers]), np.array([a is not None for a in answers])


def operating_point(pred: Predictions, positive: str) -> dict[str, float]:
    """The positive-label metrics (recall, false-positive rate, …) of a model's hard predictions."""
    true_pos, pred_pos, parsed = _binary_view(pred, list(range(pred.n)), positive)
    return hard_metrics(true_pos, pred_pos, parsed)


def compare_operating_point(
    scored: Predictions, other: Predictions, positive: str, score: np.ndarray, *, n_boot: int = DEFAULT_N_BOOT,
    seed: int = 0,
) -> dict:
    """Is ``other``'s operating point a threshold on ``scored``?

    On the ids both hold (in ``scored``'s order):

    * ``distance``: ΔTPR, the other model's point's vertical distance from the scored model's ROC
      curve, with its 95% paired bootstrap interval (``labelrl.evaluate.sweep_distance.distance``
      with one pair; keys ``delta_tpr``, ``ci``, ``n_boot``, ``n_used``, ``seed``, ``fpr``,
      ``tpr``, ``curve_tpr``, …). Its ``fpr`` counts an unparsed negative as not rejected.
    * item agreement at the threshold of the scored model whose recall matches the other
      model's (``recall_matched_index``): the share of items on which the other model's answer
      equals the thresholded scored model's, with a 95% Wilson interval, next to the agreement
      expected by chance from a model with the same per-class positive rates whose answers are
      unrelated to the scores (``chance_agreement``).

    Verdict (``_verdict``): "uninformative" when the other model answers one label on ≥
    ``CONSTANT_SHARE`` of items (an unparsed answer counts as neither): its point sits at or
    next to a corner of the ROC square, which every curve passes through (rests on nothing).
    Otherwise "on the curve" when the interval covers 0, "above the curve" when it lies above
    0, "below the curve" when below (rests on the distance); "undetermined" if no bootstrap
    replicate held both classes. ``reproduced`` is True for "on the curve" only. The threshold
    whose metrics come closest overall (largest absolute difference over ``COMPARED_METRICS``)
    is reported too.
    """
    rows_s, rows_o = join_on_id(scored, other, f"{scored.info.get('source', 'scored')} and {other.info.get('source', 'compared')}")
    true_pos, _, _ = _binary_view(scored, rows_s, positive)
    curve = threshold_curve(true_pos, score[rows_s])
    _, pred_pos, parsed = _binary_view(other, rows_o, positive)
    theirs = hard_metrics(true_pos, pred_pos, parsed)
    table = curve.metrics()
    gaps = np.max([np.abs(table[m] - theirs[m]) for m in COMPARED_METRICS], axis=0)
    best = int(np.argmin(gaps))
    by_recall = recall_matched_index(curve, theirs["recall"], theirs["fpr"])
    matched = curve.at(by_recall)
    result = {
        "source": other.info.get("source"), "n_joined": len(rows_s),
        "compared_metrics": theirs, "threshold": float(curve.thresholds[best]), "scored_metrics": curve.at(best),
        "differences": {m: curve.at(best)[m] - theirs[m] for m in COMPARED_METRICS},
        "max_metric_difference": float(gaps[best]),
        "recall_matched_threshold": float(curve.thresholds[by_recall]), "recall_matched_metrics": matched,
        "recall_matched_max_difference": float(gaps[by_recall]),
        "recall_matched_differences": {m: matched[m] - theirs[m] for m in (*COMPARED_METRICS, "fpr")},
        "distance": distance(true_pos, score[rows_s][None], pred_pos[None], parsed[None], n_boot=n_boot, seed=seed),
    }
    thresholded = score[rows_s] >= curve.thresholds[by_recall]
    result.update(_agreement(true_pos, thresholded, pred_pos, parsed))
    result["constant_share"] = {"compared": _top_share(pred_pos, parsed), "scored": _top_share(thresholded)}
    result.update(_verdict(result))
    return result


def recall_matched_index(curve: ThresholdCurve, recall: float, fpr: float) -> int:
    """The threshold with the other model's recall (the largest reaching it) and, among the
    thresholds with that same recall, the false-positive rate closest to the other model's."""
    first = threshold_for_recall(curve, recall) if recall > 0 else 0
    same = np.flatnonzero(curve.tp == curve.tp[first])
    return int(same[np.argmin(np.abs(curve.fp[same] / curve.n_neg - fpr))])


def chance_agreement(true_pos: np.ndarray, a_pos: np.ndarray, b_pos: np.ndarray) -> float:
    """Agreement of two predictors whose answers are independent given the true class, with these
    per-class positive rates: Σ_c (n_c/n)·(a_c·b_c + (1 − a_c)(1 − b_c))."""
    out = 0.0
    for cls in (True, False):
        mask = true_pos == cls
        if mask.any():
            a, b = a_pos[mask].mean(), b_pos[mask].mean()
            out += mask.mean() * (a * b + (1 - a) * (1 - b))
    return float(out)


def _agreement(true_pos: np.ndarray, thresholded: np.ndarray, pred_pos: np.ndarray, parsed: np.ndarray) -> dict:
    """Item agreement of the other model (an unparsed answer agrees with nothing) with the
    thresholded scored model, its Wilson interval and the chance level."""
    from scipy.stats import binomtest

    same = (thresholded == pred_pos) & parsed
    k, n = int(same.sum()), len(same)
    ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    return {"item_agreement": k / n, "item_agreement_ci": [float(ci.low), float(ci.high)], "n_disagree": n - k,
            "chance_agreement": chance_agreement(true_pos, thresholded, pred_pos & parsed)}


def _top_share(pred_pos: np.ndarray, parsed: np.ndarray | None = None) -> float:
    """The share of items given the more frequent of the two answers (unparsed: neither)."""
    parsed = np.ones(len(pred_pos), bool) if parsed is None else parsed
    n = max(len(pred_pos), 1)
    return float(max((pred_pos & parsed).sum(), (~pred_pos & parsed).sum()) / n)


def distance_words(d: dict) -> str:
    """"ΔTPR at its FPR +0.012 [−0.020, +0.041]" (over S seeds: "mean over S seeds")."""
    ci = d.get("ci")
    interval = f" [{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else " (no interval: no resample held both classes)"
    seeds = f", mean over {d['n_pairs']} seeds" if d.get("n_pairs", 1) > 1 else ""
    return f"ΔTPR at its FPR {d['delta_tpr']:+.3f}{interval}{seeds}"


def _verdict(r: dict) -> dict:
    """The verdict words, what they rest on, and the flags (``compare_operating_point``)."""
    d = r["distance"]
    items = f"agrees with the matched threshold on {r['item_agreement']:.3f} of items, chance {r['chance_agreement']:.3f}"
    share = r["constant_share"]["compared"]
    if share >= CONSTANT_SHARE:
        verdict, rests = (f"uninformative: a (near-)constant predictor (the arm gives one answer on {share:.3f} of "
                          f"items; {distance_words(d)}; {items}): every ROC curve passes through the corners, so "
                          "this says nothing about the scores"), "nothing"
    else:
        word = position(d["ci"])
        verdict, rests = f"{word} ({distance_words(d)}; {items})", "distance" if d["ci"] else "nothing"
    return {"verdict": verdict, "verdict_rests_on": rests, "reproduced": verdict.startswith("on the curve"),
            "uninformative": verdict.startswith("uninformative")}


def _finite(values: np.ndarray) -> list[float | None]:
    return [float(v) if np.isfinite(v) else None for v in values]


def sweep(
    scored: Predictions,
    *,
    positive_label: str | None = None,
    target_recall: float | None = 0.9,
    compare: list[Predictions] = (),
    n_boot: int = DEFAULT_N_BOOT,
    seed: int = 0,
) -> dict:
    """ROC curve, the threshold for a target recall, the best-balanced-accuracy threshold,
    and the operating-point comparison of each of ``compare`` (``compare_operating_point``: its
    ΔTPR interval from ``n_boot`` resamples drawn with ``seed``)."""
    positive, score = positive_scores(scored, positive_label)
    true_pos, _, _ = _binary_view(scored, list(range(scored.n)), positive)
    curve = threshold_curve(true_pos, score)
    fpr, tpr, thresholds = roc_curve(true_pos, score)
    best = best_balanced_accuracy(curve)
    out = {
        "source": scored.info.get("source"), "positive_label": positive, "n": scored.n,
        "n_positive": curve.n_pos, "n_negative": curve.n_neg,
        "roc_auc": float(roc_auc_score(true_pos, score)),
        "roc_curve": {"fpr": _finite(fpr), "tpr": _finite(tpr), "thresholds": _finite(thresholds)},
        "best_balanced_accuracy_threshold": float(curve.thresholds[best]),
        "best_balanced_accuracy": float(curve.metrics()["balanced_accuracy"][best]),
        "metrics_at_best_balanced_accuracy": curve.at(best),
        "target_recall": target_recall, "threshold_at_target_recall": None, "metrics_at_target_recall": None,
    }
    points = [{"name": "best balanced accuracy", "fpr": out["metrics_at_best_balanced_accuracy"]["fpr"],
               "tpr": out["metrics_at_best_balanced_accuracy"]["recall"]}]
    if target_recall is not None:
        i = threshold_for_recall(curve, target_recall)
        out["threshold_at_target_recall"] = float(curve.thresholds[i])
        out["metrics_at_target_recall"] = curve.at(i)
        points.append({"name": f"recall ≥ {target_recall:g}", "fpr": curve.at(i)["fpr"], "tpr": curve.at(i)["recall"]})
    out["compared"] = []
    for other in compare:
        result = compare_operating_point(scored, other, positive, score, n_boot=n_boot, seed=seed)
        out["compared"].append(result)
        # the point the verdict judges (an unparsed negative counted as not rejected)
        points.append({"name": str(result["source"]), "fpr": result["distance"]["fpr"], "tpr": result["distance"]["tpr"],
                       "reproduced": result["reproduced"], "uninformative": result["uninformative"],
                       "position": verdict_word(result["verdict"])})
    out["operating_points"] = points
    return out


def distance_over_seeds(pairs: Sequence[tuple[Predictions, Predictions]], *, positive_label: str | None = None,
                        n_boot: int = DEFAULT_N_BOOT, seed: int = 0) -> dict:
    """ΔTPR pooled over seeds: ``pairs`` holds one (scored SFT parent, RL run) per seed, each run
    against its own seed's parent; on the ids every file holds (in the first parent's order),
    the mean over the pairs of their ΔTPR and its 95% two-level bootstrap interval (items shared
    by every pair, pairs drawn with replacement: ``labelrl.evaluate.sweep_distance``), with
    ``position`` ("on the curve" / "above the curve" / "below the curve") and ``words``. With
    one pair it equals the ``distance`` of ``compare_operating_point``."""
    from labelrl.evaluate.paired import shared_ids

    if not pairs:
        raise ValueError("no (SFT parent, RL run) pair: pooling ΔTPR over seeds needs at least one")
    ids = shared_ids([run for pair in pairs for run in pair])
    first = pairs[0][0]
    positive, _ = positive_scores(first, positive_label)
    is_pos = _binary_view(first, _rows(first, ids), positive)[0]
    scores, pred_pos, parsed = [], [], []
    for parent, run in pairs:
        scores.append(positive_scores(parent, positive)[1][_rows(parent, ids)])
        _, answered, ok = _binary_view(run, _rows(run, ids), positive)
        pred_pos.append(answered)
        parsed.append(ok)
    out = distance(is_pos, np.array(scores), np.array(pred_pos), np.array(parsed), n_boot=n_boot, seed=seed)
    out |= {"positive_label": positive, "n": len(ids), "position": position(out["ci"]), "words": distance_words(out)}
    return out


def _rows(pred: Predictions, ids: list[str]) -> list[int]:
    where = {i: r for r, i in enumerate(pred.ids)}
    return [where[i] for i in ids]
