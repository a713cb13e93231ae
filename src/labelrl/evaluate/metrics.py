"""Classification metrics with bootstrap 95% intervals.

Point estimates come from scikit-learn, so our definitions cannot drift from the standard
ones. Intervals are percentile bootstrap intervals: rows are resampled with replacement
``n_boot`` times (seeded); each replicate is a row-count matrix ``W [B, N]`` and every
metric is computed from weighted sums (matrix products), so one pass serves all replicates.
``metrics_from_weights`` is that weighted form; with all weights 1 it equals scikit-learn
(tested), and with the counts of a resample it equals scikit-learn on the resampled rows.

Conventions:

* An unparseable prediction (None) is wrong: it is nobody's true positive, a miss for its
  true class, and not a prediction of any label (the confusion matrix gives it its own
  column ``(unparsed)``).
* Binary tasks: precision, recall and F1 are those of the positive label. Other tasks: the
  macro average over the labels present in the true or predicted values (scikit-learn's
  default label set).
* Balanced accuracy: the mean recall over the labels present in the true values.
* ROC-AUC and PR-AUC (average precision) need scores: binary, the positive label's
  probability; multi-class, one-vs-rest per label, macro-averaged over labels present in
  the true values.
* Calibration: 10 equal-width bins on [0, 1], [0, 0.1], (0.1, 0.2], …, (0.9, 1] (a value on
  an inner edge goes to the lower bin, as in ``sklearn.calibration.calibration_curve``). Binary tasks bin P(positive) and
  compare it with the share of positives in the bin; multi-class tasks bin the top-label
  confidence max_k p_k and compare it with the accuracy in the bin (Guo et al. 2017,
  "On Calibration of Modern Neural Networks", eq. 3). ECE = Σ_b (n_b / N)·|conf_b − obs_b|.
* Ordinal tasks add the mean absolute grade error (an unparsed answer counts as the
  farthest grade from the truth, as the grader's failure reward does) and within-one
  accuracy (|grade error| ≤ 1; an unparsed answer is never within one).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from sklearn.metrics import (
    accuracy_score,
    average_precision_score,
    balanced_accuracy_score,
    f1_score,
    mean_absolute_error,
    precision_score,
    recall_score,
    roc_auc_score,
)

from labelrl.types import LabelSpace

UNPARSED = "(unparsed)"
N_BINS = 10
BIN_EDGES = np.linspace(0.0, 1.0, N_BINS + 1)
# Rows × replicates held in memory at once by the bootstrap.
_BOOT_CELLS = 4_000_000


def basic_metrics(y_true: Sequence[str], y_pred: Sequence[str | None]) -> dict[str, float]:
    """Accuracy and balanced accuracy; an unparseable prediction (None) counts as wrong."""
    if len(y_true) == 0:
        raise ValueError("no examples to evaluate: the split (or the predictions file) is empty; check the data, the split ratios and any limit on the items evaluated")
    pred = np.array(["\x00unparsed" if p is None else p for p in y_pred], dtype=object)
    true = np.array(list(y_true), dtype=object)
    return {
        "accuracy": float(accuracy_score(true, pred)),
        "balanced_accuracy": float(balanced_accuracy_score(true, pred)),
    }


@dataclass(frozen=True)
class Encoded:
    """Labels as indices into ``labels.labels``; ``pred == -1`` marks an unparsed answer.

    ``scores`` is ``[N, K]`` (column k = probability of label k) or None.
    """

    true: np.ndarray  # [N] int
    pred: np.ndarray  # [N] int, -1 = unparsed
    labels: LabelSpace
    scores: np.ndarray | None = None  # [N, K] float

    @property
    def n(self) -> int:
        return len(self.true)


def encode(
    y_true: Sequence[str], y_pred: Sequence[str | None], labels: LabelSpace, scores: np.ndarray | None = None
) -> Encoded:
    """Index-encode labels; ``scores`` is [N] (binary: P(positive)) or [N, K] in label order."""
    if len(y_true) != len(y_pred):
        raise ValueError(f"{len(y_true)} true labels but {len(y_pred)} predictions: give one prediction per example")
    if len(y_true) == 0:
        raise ValueError("no examples to evaluate: the split (or the predictions file) is empty; check the data, the split ratios and any limit on the items evaluated")
    true = np.array([labels.index(y) for y in y_true], dtype=np.int64)
    pred = np.array([-1 if p is None else labels.index(p) for p in y_pred], dtype=np.int64)
    if scores is not None:
        scores = np.asarray(scores, dtype=np.float64)
        if scores.ndim == 1:
            if labels.kind != "binary":
                raise ValueError(f"a single score column needs a binary task, but the labels {list(labels.labels)} are {labels.kind}; give one score_<label> column per label")
            pos = labels.index(labels.positive_label)
            scores = np.stack([1.0 - scores, scores] if pos == 1 else [scores, 1.0 - scores], axis=1)
        if scores.shape != (len(true), labels.k):
            raise ValueError(f"scores have shape {scores.shape}; expected ({len(true)}, {labels.k}): one column per label")
        if not np.all(np.isfinite(scores)) or scores.min() < 0 or scores.max() > 1:
            raise ValueError("scores must be probabilities in [0, 1] with no missing values; check the score columns")
    return Encoded(true, pred, labels, scores)


def _positive_index(enc: Encoded) -> int | None:
    return enc.labels.index(enc.labels.positive_label) if enc.labels.kind == "binary" else None


def _present(values: np.ndarray) -> list[int]:
    return sorted(int(v) for v in set(values.tolist()) if v >= 0)


def _quiet(fn, *args, **kwargs) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(fn(*args, **kwargs))


def confidence_target(enc: Encoded) -> tuple[np.ndarray, np.ndarray]:
    """What calibration compares: binary (P(positive), is positive); else (max_k p_k, argmax correct)."""
    assert enc.scores is not None
    pos = _positive_index(enc)
    if pos is not None:
        return enc.scores[:, pos], (enc.true == pos).astype(np.float64)
    return enc.scores.max(axis=1), (enc.scores.argmax(axis=1) == enc.true).astype(np.float64)


def bin_index(confidence: np.ndarray) -> np.ndarray:
    """The calibration bin (0 … N_BINS−1) of each value; inner edges go to the lower bin."""
    return np.searchsorted(BIN_EDGES[1:-1], confidence, side="left")


def reliability_curve(enc: Encoded) -> dict:
    """Per-bin counts, mean confidence and observed frequency, and the ECE (module docstring)."""
    confidence, target = confidence_target(enc)
    bins = bin_index(confidence)
    rows = []
    for b in range(N_BINS):
        mask = bins == b
        n = int(mask.sum())
        rows.append({
            "lo": float(BIN_EDGES[b]), "hi": float(BIN_EDGES[b + 1]), "n": n,
            "mean_confidence": float(confidence[mask].mean()) if n else None,
            "observed": float(target[mask].mean()) if n else None,
        })
    ece = sum(r["n"] * abs(r["mean_confidence"] - r["observed"]) for r in rows if r["n"]) / enc.n
    kind = "positive_probability" if _positive_index(enc) is not None else "top_label_confidence"
    return {"kind": kind, "bins": rows, "ece": float(ece)}


def point_metrics(enc: Encoded) -> dict[str, float]:
    """Every metric on the rows as given, computed by scikit-learn (module docstring)."""
    t, p, k = enc.true, enc.pred, enc.labels.k
    pos = _positive_index(enc)
    out = {"accuracy": _quiet(accuracy_score, t, p), "balanced_accuracy": _quiet(balanced_accuracy_score, t, p)}
    if pos is not None:
        kw = {"labels": [pos], "average": None, "zero_division": 0}
        out["precision"] = float(precision_score(t, p, **kw)[0])
        out["recall"] = float(recall_score(t, p, **kw)[0])
        out["f1"] = float(f1_score(t, p, **kw)[0])
    else:
        kw = {"labels": _present(np.concatenate([t, p])), "average": "macro", "zero_division": 0}
        out.update(precision=_quiet(precision_score, t, p, **kw), recall=_quiet(recall_score, t, p, **kw),
                   f1=_quiet(f1_score, t, p, **kw))
    if enc.scores is not None:
        classes = [pos] if pos is not None else _present(t)
        aucs, aps = [], []
        for c in classes:
            is_c = (t == c).astype(int)
            both = 0 < is_c.sum() < len(is_c)
            aucs.append(roc_auc_score(is_c, enc.scores[:, c]) if both else np.nan)
            aps.append(average_precision_score(is_c, enc.scores[:, c]) if is_c.sum() else np.nan)
        out["roc_auc"] = float(np.mean(aucs))
        out["pr_auc"] = float(np.mean(aps))
        out["ece"] = reliability_curve(enc)["ece"]
    if enc.labels.kind == "ordinal":
        farthest = np.where(t <= (k - 1) / 2, k - 1, 0)
        out["mean_abs_grade_error"] = float(mean_absolute_error(t, np.where(p >= 0, p, farthest)))
        out["within_one_accuracy"] = float(np.mean((np.abs(p - t) <= 1) & (p >= 0)))
    return out


def _grade_error(enc: Encoded) -> np.ndarray:
    """|pred − true| in grades; an unparsed answer counts as the farthest grade from the truth."""
    farthest = np.maximum(enc.true, enc.labels.k - 1 - enc.true)
    return np.where(enc.pred >= 0, np.abs(enc.pred - enc.true), farthest).astype(np.float64)


def _ratio(num: np.ndarray, den: np.ndarray, empty: float) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1), empty)


def weighted_auc(weights: np.ndarray, is_pos: np.ndarray, score: np.ndarray) -> np.ndarray:
    """ROC-AUC [B] for row weights [B, N]: P(score_pos > score_neg) + ½ P(tie) (Mann–Whitney)."""
    order = np.argsort(score, kind="stable")
    sorted_score = score[order]
    starts = np.flatnonzero(np.r_[True, sorted_score[1:] != sorted_score[:-1]])
    w = weights[:, order]
    pos = np.add.reduceat(w * is_pos[order], starts, axis=1)  # [B, U] positives per distinct score
    neg = np.add.reduceat(w * (1 - is_pos[order]), starts, axis=1)
    below = np.cumsum(neg, axis=1) - neg  # negatives strictly below each distinct score
    wins = (pos * (below + 0.5 * neg)).sum(axis=1)
    return _ratio(wins, pos.sum(axis=1) * neg.sum(axis=1), np.nan)


def weighted_average_precision(weights: np.ndarray, is_pos: np.ndarray, score: np.ndarray) -> np.ndarray:
    """Average precision [B]: Σ_n (R_n − R_{n−1}) P_n over distinct thresholds, high to low."""
    order = np.argsort(-score, kind="stable")
    sorted_score = score[order]
    starts = np.flatnonzero(np.r_[True, sorted_score[1:] != sorted_score[:-1]])
    w = weights[:, order]
    tp = np.cumsum(np.add.reduceat(w * is_pos[order], starts, axis=1), axis=1)
    fp = np.cumsum(np.add.reduceat(w * (1 - is_pos[order]), starts, axis=1), axis=1)
    total = tp[:, -1:]
    precision = _ratio(tp, tp + fp, 0.0)
    recall = _ratio(tp, np.broadcast_to(total, tp.shape), 0.0)
    gain = np.diff(recall, axis=1, prepend=0.0)
    return np.where(total[:, 0] > 0, (gain * precision).sum(axis=1), np.nan)


def _class_counts(weights: np.ndarray, enc: Encoded) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Weighted true positives, true counts and predicted counts per label, each [B, K]."""
    onehot_t = np.eye(enc.labels.k)[enc.true]  # [N, K]
    onehot_p = np.zeros((enc.n, enc.labels.k))
    parsed = enc.pred >= 0
    onehot_p[parsed, enc.pred[parsed]] = 1.0
    return weights @ (onehot_t * onehot_p), weights @ onehot_t, weights @ onehot_p


def metrics_from_weights(weights: np.ndarray, enc: Encoded) -> dict[str, np.ndarray]:
    """Every metric of ``point_metrics`` for each row-weight vector in ``weights [B, N]``."""
    weights = np.asarray(weights, dtype=np.float64)
    total = weights.sum(axis=1)
    tp, n_true, n_pred = _class_counts(weights, enc)
    recall_c, precision_c = _ratio(tp, n_true, 0.0), _ratio(tp, n_pred, 0.0)
    f1_c = _ratio(2 * tp, n_true + n_pred, 0.0)
    present_t = n_true > 0
    out = {
        "accuracy": tp.sum(axis=1) / total,
        "balanced_accuracy": _ratio((recall_c * present_t).sum(axis=1), present_t.sum(axis=1), np.nan),
    }
    pos = _positive_index(enc)
    if pos is not None:
        out.update(precision=precision_c[:, pos], recall=recall_c[:, pos], f1=f1_c[:, pos])
    else:
        used = (n_true + n_pred) > 0
        for name, per_class in (("precision", precision_c), ("recall", recall_c), ("f1", f1_c)):
            out[name] = (per_class * used).sum(axis=1) / used.sum(axis=1)
    if enc.scores is not None:
        classes = [pos] if pos is not None else list(range(enc.labels.k))
        aucs = [weighted_auc(weights, (enc.true == c).astype(np.float64), enc.scores[:, c]) for c in classes]
        aps = [weighted_average_precision(weights, (enc.true == c).astype(np.float64), enc.scores[:, c]) for c in classes]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a replicate may lack a label: its AUC is nan
            out["roc_auc"] = np.nanmean(np.stack(aucs), axis=0) if pos is None else aucs[0]
            out["pr_auc"] = np.nanmean(np.stack(aps), axis=0) if pos is None else aps[0]
        confidence, target = confidence_target(enc)
        onehot_bin = np.eye(N_BINS)[bin_index(confidence)]  # [N, N_BINS]
        gap = weights @ (onehot_bin * confidence[:, None]) - weights @ (onehot_bin * target[:, None])
        out["ece"] = np.abs(gap).sum(axis=1) / total
    if enc.labels.kind == "ordinal":
        err = _grade_error(enc)
        out["mean_abs_grade_error"] = weights @ err / total
        out["within_one_accuracy"] = weights @ ((err <= 1) & (enc.pred >= 0)).astype(np.float64) / total
    return out


def bootstrap_weights(n: int, n_boot: int, seed: int):
    """Yield row-count matrices [b, n] (chunks, n_boot rows in all): each row counts how often
    each of the n rows was drawn in one resample of n rows with replacement."""
    rng = np.random.default_rng(seed)
    chunk = max(1, min(n_boot, _BOOT_CELLS // max(n, 1)))
    done = 0
    while done < n_boot:
        b = min(chunk, n_boot - done)
        draws = rng.integers(0, n, size=(b, n)) + (np.arange(b) * n)[:, None]
        yield np.bincount(draws.ravel(), minlength=b * n).reshape(b, n).astype(np.float64)
        done += b


def bootstrap_intervals(enc: Encoded, n_boot: int = 1000, seed: int = 0) -> dict[str, list[float] | None]:
    """Percentile 95% interval [2.5%, 97.5%] of each metric over ``n_boot`` row resamples
    (replicates where a metric is undefined, e.g. no positive drawn, are left out)."""
    if n_boot < 0:
        raise ValueError(f"n_boot={n_boot}: the number of bootstrap resamples must be 0 or more (0 skips intervals)")
    if n_boot == 0:
        return {}
    parts: dict[str, list[np.ndarray]] = {}
    for weights in bootstrap_weights(enc.n, n_boot, seed):
        for name, values in metrics_from_weights(weights, enc).items():
            parts.setdefault(name, []).append(values)
    out: dict[str, list[float] | None] = {}
    for name, chunks in parts.items():
        values = np.concatenate(chunks)
        values = values[np.isfinite(values)]
        out[name] = [float(v) for v in np.percentile(values, [2.5, 97.5])] if len(values) else None
    return out


def confusion_matrix(enc: Encoded) -> dict:
    """Counts [true label][predicted label], with a last column for unparsed answers."""
    k = enc.labels.k
    counts = np.zeros((k, k + 1), dtype=np.int64)
    np.add.at(counts, (enc.true, np.where(enc.pred >= 0, enc.pred, k)), 1)
    return {"rows": list(enc.labels.labels), "columns": [*enc.labels.labels, UNPARSED], "counts": counts.tolist()}


def classification_metrics(
    y_true: Sequence[str],
    y_pred: Sequence[str | None],
    labels: LabelSpace,
    *,
    scores: np.ndarray | None = None,
    n_boot: int = 1000,
    seed: int = 0,
) -> dict:
    """All metrics for one set of predictions (see the module docstring for definitions).

    Returns ``{name: value, name + "_ci": [lo, hi] or None, ...}`` plus ``n``,
    ``n_unparsed``, ``confusion_matrix``, ``reliability`` (when scores are given),
    ``averaging`` and the bootstrap settings.
    """
    enc = encode(y_true, y_pred, labels, scores)
    point = point_metrics(enc)
    intervals = bootstrap_intervals(enc, n_boot, seed)
    out: dict = {"n": enc.n, "n_unparsed": int((enc.pred < 0).sum()), "labels": list(labels.labels), "kind": labels.kind}
    out["averaging"] = f"positive label {labels.positive_label!r}" if labels.kind == "binary" else "macro"
    for name, value in point.items():
        out[name] = None if np.isnan(value) else value
        out[f"{name}_ci"] = intervals.get(name)
    out["confusion_matrix"] = confusion_matrix(enc)
    if enc.scores is not None:
        out["reliability"] = reliability_curve(enc)
    out["bootstrap"] = {"n_boot": n_boot, "seed": seed, "interval": "percentile 95%, rows resampled with replacement"}
    return out
