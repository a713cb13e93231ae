"""Decision rules on a scored model, chosen on val and applied unchanged to the holdout.

The baseline an RL arm on labels must beat is not the SFT model at its default decision rule
(the most probable label) but the SFT model with a rule tuned on val: RL on labels mostly
moves the operating point along the SFT model's ROC curve, and a val-tuned threshold moves it
for free.

* Binary tasks: predict the positive label when P(positive) ≥ t. ``best_threshold_rule``
  chooses the t with the best val balanced accuracy (``labelrl.evaluate.sweep``, exact over
  every distinct score); ``recall_matched_rule`` chooses the largest t whose val recall
  reaches another model's val recall.
* Other tasks: predict argmax_k (log p_k + b_k) with per-label offsets b (the first label's
  fixed at 0; for two labels this is a threshold on P(positive)). ``best_offsets_rule`` maximises val balanced accuracy by coordinate ascent:
  each label's offset in turn is set by an exact line search (balanced accuracy is piecewise
  constant in b_k and changes only where an item's argmax switches to or from k, so every
  breakpoint is tried), until a full pass improves nothing. Coordinate ascent finds a local
  optimum, not necessarily the global one; the rule is still chosen on val only.

A rule is a plain dict (saved in the run files); ``apply_rule`` turns a scored model's
predictions into the rule's predictions (same ids, labels and scores).
"""

from __future__ import annotations

import numpy as np

from labelrl.evaluate.io import Predictions, predictions_table
from labelrl.evaluate.sweep import best_balanced_accuracy, positive_scores, threshold_curve, threshold_for_recall
from labelrl.types import canonical_label

MAX_ROUNDS = 10
_LOG_FLOOR = 1e-300


def _scores(pred: Predictions) -> np.ndarray:
    scores = pred.scores()
    if scores is None:
        raise ValueError(f"{pred.info.get('source', 'the predictions')}: no score columns; a decision rule needs a "
                         "scored model (labelrl eval --method scores)")
    return scores


def _is_positive(pred: Predictions, positive: str) -> np.ndarray:
    want = canonical_label(positive)
    return np.array([canonical_label(y) == want for y in pred.y_true])


def best_threshold_rule(val: Predictions, positive_label: str | None = None) -> dict:
    """The threshold on P(positive) with the best val balanced accuracy (ties: the largest)."""
    positive, score = positive_scores(val, positive_label)
    curve = threshold_curve(_is_positive(val, positive), score)
    i = best_balanced_accuracy(curve)
    return {"kind": "threshold", "positive_label": positive, "threshold": float(curve.thresholds[i]),
            "chosen_by": "best val balanced accuracy", "val_metrics": curve.at(i)}


def recall_matched_rule(val: Predictions, target_recall: float, positive_label: str | None = None, *, name: str = "") -> dict:
    """The largest threshold whose val recall is at least ``target_recall`` (another model's)."""
    positive, score = positive_scores(val, positive_label)
    curve = threshold_curve(_is_positive(val, positive), score)
    i = threshold_for_recall(curve, target_recall) if target_recall > 0 else 0
    return {"kind": "threshold", "positive_label": positive, "threshold": float(curve.thresholds[i]),
            "chosen_by": f"val recall ≥ {target_recall:.4f}" + (f" (the val recall of {name})" if name else ""),
            "val_metrics": curve.at(i)}


def _balanced_accuracy(true: np.ndarray, pred: np.ndarray, k: int) -> np.ndarray:
    """Balanced accuracy of each row of ``pred [C, N]`` against ``true [N]`` (labels present in true)."""
    counts = np.bincount(true, minlength=k).astype(np.float64)
    present = counts > 0
    hits = np.stack([((pred == c) & (true == c)).sum(axis=1) for c in range(k)], axis=1)  # [C, K]
    return (hits[:, present] / counts[present]).mean(axis=1)


def _line_search(logp: np.ndarray, true: np.ndarray, offsets: np.ndarray, c: int) -> tuple[float, float]:
    """The offset of label ``c`` maximising balanced accuracy with the others fixed, and that BA.

    Item i goes to c iff logp_ic + b_c > r_i, its best other label's score r_i (with offsets), so
    the prediction changes only at the breakpoints r_i − logp_ic: the candidates are one value
    below them all, the midpoints between consecutive ones, one above them all, and the current
    offset. Ties go to the candidate nearest the current offset (no needless moves)."""
    n, k = logp.shape
    others = logp + offsets
    others[:, c] = -np.inf
    rival = others.argmax(axis=1)  # [N] the best other label
    need = others[np.arange(n), rival] - logp[:, c]  # [N] c wins iff b_c > need
    breaks = np.unique(need)
    candidates = np.r_[breaks[0] - 1.0, (breaks[1:] + breaks[:-1]) / 2, breaks[-1] + 1.0, offsets[c]]
    pred = np.where(candidates[:, None] > need[None, :], c, rival[None, :])  # [C, N]
    ba = _balanced_accuracy(true, pred, k)
    best = ba.max()
    pick = np.flatnonzero(ba >= best - 1e-12)
    choice = pick[np.argmin(np.abs(candidates[pick] - offsets[c]))]
    return float(candidates[choice]), float(best)


def best_offsets_rule(val: Predictions) -> dict:
    """Per-label log-probability offsets with a (locally) best val balanced accuracy."""
    scores = _scores(val)
    labels = val.labels
    logp = np.log(np.maximum(scores, _LOG_FLOOR))
    true = np.array([labels.index(y) for y in val.y_true])
    offsets = np.zeros(labels.k)
    best = float(_balanced_accuracy(true, logp.argmax(axis=1)[None, :], labels.k)[0])
    start = best
    for _ in range(MAX_ROUNDS):
        improved = False
        for c in range(1, labels.k):
            value, ba = _line_search(logp, true, offsets, c)
            if ba > best + 1e-12:
                offsets[c], best, improved = value, ba, True
        if not improved:
            break
    return {"kind": "offsets", "offsets": {name: float(b) for name, b in zip(labels.labels, offsets)},
            "chosen_by": "best val balanced accuracy (coordinate ascent on per-label log-probability offsets)",
            "val_metrics": {"balanced_accuracy": best, "balanced_accuracy_at_argmax": start}}


# Fewer val items of a label than this, and a rule chosen on val fits those items: one of them
# moves that label's recall by 1/n > 0.1, and a threshold or offset can sit anywhere in the gaps
# between their scores.
MIN_RULE_ITEMS = 10


def thin_labels(val: Predictions, minimum: int = MIN_RULE_ITEMS) -> dict[str, int]:
    """The labels with fewer than ``minimum`` val items (label → count, in label order; a label
    with none counts 0): the ones a val-chosen rule cannot be placed for with any precision."""
    counts = {label: 0 for label in val.labels.labels}
    for y in val.y_true:
        label = val.labels.normalise(y)
        if label is not None:
            counts[label] += 1
    return {label: n for label, n in counts.items() if n < minimum}


def thin_words(thin: dict[str, int]) -> str:
    """``val held only 4 'fraud' items: a rule chosen on so few fits them; its holdout figure is the
    measure`` (empty without thin labels)."""
    if not thin:
        return ""
    held = ", ".join(f"{n} {label!r}" for label, n in thin.items())
    return f"val held only {held} item{'s' if sum(thin.values()) != 1 else ''}: a rule chosen on so few fits them; its holdout figure is the measure"


def best_rule(val: Predictions, positive_label: str | None = None) -> dict:
    """The val-chosen rule: a threshold for binary tasks, per-label offsets otherwise."""
    return best_threshold_rule(val, positive_label) if val.labels.kind == "binary" else best_offsets_rule(val)


def rule_predictions(pred: Predictions, rule: dict) -> list[str]:
    """The label the rule gives each row of a scored model's predictions."""
    scores, labels = _scores(pred), pred.labels
    if rule["kind"] == "threshold":
        positive = labels.normalise(rule["positive_label"])
        negative = next(x for x in labels.labels if x != positive)
        p = scores[:, labels.index(positive)]
        return [positive if v >= rule["threshold"] else negative for v in p]
    if rule["kind"] == "offsets":
        b = np.array([rule["offsets"].get(name, 0.0) for name in labels.labels])
        return [labels.labels[i] for i in (np.log(np.maximum(scores, _LOG_FLOOR)) + b).argmax(axis=1)]
    raise ValueError(f"decision rule kind {rule.get('kind')!r}: expected 'threshold' or 'offsets'")


def apply_rule(pred: Predictions, rule: dict, *, source: str = "") -> Predictions:
    """``pred`` with its predictions replaced by the rule's (ids, labels and scores kept)."""
    scores = _scores(pred)
    table = predictions_table(pred.ids, pred.y_true, rule_predictions(pred, rule), ["ok"] * pred.n, pred.labels, scores)
    info = dict(pred.info, rule=rule, derived_from=pred.info.get("model_spec"), method="threshold",
                source=source or pred.info.get("source"))
    return Predictions(table, pred.labels, info)
