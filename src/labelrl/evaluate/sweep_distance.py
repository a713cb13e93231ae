"""How far a model's operating point lies above or below another model's ROC curve, with a
paired bootstrap interval over items and, with several seeds, over seeds.

The distance. A scored model (the SFT parent) traces its empirical ROC curve as its threshold
moves: one vertex (FP, TP) per distinct score (``labelrl.evaluate.sweep.threshold_curve``),
from (0, 0) to (N, P). Between two adjacent vertices the curve is the straight segment joining
them: answering with the higher threshold with probability λ and the lower one otherwise
reaches every point of that segment (randomised thresholding: Fawcett 2006, "An introduction
to ROC analysis", Pattern Recognition Letters 27, §10 "Interpolating classifiers", with §6 "The
ROC convex hull" and, for tied scores, the diagonal of §5.1 "Equally scored instances"; after
Provost & Fawcett 2001, "Robust classification for imprecise environments", Machine Learning
42). Deviation: the curve is the empirical one, not its convex hull. The other model's
hard answers give one point (FPR, TPR), and

    ΔTPR = TPR − TPR_curve(FPR)

is its vertical distance from the curve: > 0 above it (more positives caught at that
false-positive rate than any threshold on the scores, randomised or not, catches), < 0 below
it. TPR_curve(f) is the linear interpolation between the two vertices whose FPR brackets f;
where the curve is vertical at f (several vertices with FPR f: no negative between their
scores), it is the TPR in that vertical stretch nearest the point's (the point's own when it
lies on the stretch), so a point on a vertical stretch of the curve is at distance 0.

The point's counts follow ``labelrl.evaluate.sweep``'s convention for unparsed answers: one on
a positive is a miss (not in TP), one on a negative is not a correct rejection, so it counts in
FPR = 1 − specificity = (N − TN) / N. An unparsed answer thus sits where a wrong answer would on
either class, and never moves the point up or to the left (counting only positive answers as
false positives would read an unparsed negative as a rejection).

The interval. A percentile bootstrap (Efron & Tibshirani 1993, §13.3), paired over items: each
replicate draws n items with replacement and recomputes, on those same items, the scored
model's curve and the other model's point. With S pairs (one per seed: a run and its own
seed's scored parent, on shared items) the pooled distance is the mean of the pairs' ΔTPR, and
its interval is the two-level bootstrap of ``labelrl.evaluate.paired`` (Davison & Hinkley 1997,
§3.8): each replicate draws the n items (shared by every pair) and, independently, S pairs
with replacement, and averages the drawn pairs' ΔTPR on the drawn items. The draws come from
``numpy.random.default_rng(seed)`` in this order, all at once:
``items = rng.integers(0, n, (n_boot, n))``, ``pairs = rng.integers(0, S, (n_boot, S))``. With
one pair every pair draw is 0 and this is the paired bootstrap over items; the first draw is
the one ``labelrl.evaluate.paired.bootstrap_draws`` makes with the same n, n_boot and seed. A
replicate that draws no positive or no negative item has no curve: it is left out
(``n_used`` counts the others), and the 95% interval is the 2.5th and 97.5th percentiles of the
rest (None when none is left).
"""

from __future__ import annotations

import numpy as np

_CELLS = 4_000_000  # bootstrap item-weights held in memory at once, as in labelrl.evaluate.paired


def draws(n: int, n_pairs: int, n_boot: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(items [n_boot, n], pairs [n_boot, S]): the module docstring's draws, in that order."""
    rng = np.random.default_rng(seed)
    items = rng.integers(0, n, (n_boot, n))
    return items, rng.integers(0, n_pairs, (n_boot, n_pairs))


def curve_tpr_at(tp: np.ndarray, fp: np.ndarray, tp_point: np.ndarray, fp_point: np.ndarray) -> np.ndarray:
    """The curve's TP count at the point's FP count, per row (module docstring).

    ``tp``, ``fp`` [B, V]: the curve's vertices as counts, FP non-decreasing along each row, from
    (0, 0) to (N, P); ``tp_point``, ``fp_point`` [B]: the point's counts. Off a vertex, the TP
    interpolated between the two vertices whose FP brackets the point's; at a vertex FP (a vertical
    stretch from its lowest to its highest TP), the point's TP clipped to that stretch.
    """
    f = np.asarray(fp_point, dtype=np.float64)[:, None]
    left = (fp < f).sum(axis=1)  # first vertex with FP ≥ the point's
    right = (fp <= f).sum(axis=1)  # one past the last vertex with FP ≤ the point's
    rows = np.arange(len(tp))
    on_vertex = right > left
    lo, hi = tp[rows, np.minimum(left, tp.shape[1] - 1)], tp[rows, np.maximum(right - 1, 0)]
    stretch = np.clip(tp_point, lo, hi)
    # Off a vertex, 1 ≤ left ≤ V − 1: the curve starts at FP 0 and ends at FP N ≥ the point's FP.
    a = np.clip(left - 1, 0, tp.shape[1] - 1)
    b = np.clip(left, 0, tp.shape[1] - 1)
    run = np.where(on_vertex, 1.0, fp[rows, b] - fp[rows, a])
    between = tp[rows, a] + (tp[rows, b] - tp[rows, a]) * (f[:, 0] - fp[rows, a]) / run
    return np.where(on_vertex, stretch, between)


def weighted_gap(is_pos: np.ndarray, score: np.ndarray, pred_pos: np.ndarray, parsed: np.ndarray,
                 weights: np.ndarray) -> dict[str, np.ndarray]:
    """ΔTPR of one pair under each row of item weights.

    ``is_pos``, ``score``, ``pred_pos``, ``parsed`` [n]: the truth, the scored model's positive
    score, the other model's answer (positive and parsed) and whether it parsed; ``weights``
    [B, n]: how many times each item is drawn (all ones: the items as they are). Returns
    ``delta_tpr``, ``fpr``, ``tpr``, ``curve_tpr`` [B], NaN where the weights hold no positive or
    no negative item.
    """
    is_pos, pred_pos, parsed = (np.asarray(x, dtype=bool) for x in (is_pos, pred_pos, parsed))
    score = np.asarray(score, dtype=np.float64)
    order = np.argsort(-score, kind="stable")
    s = score[order]
    last = np.r_[s[1:] != s[:-1], True]  # the last item of each run of equal scores: one vertex per distinct score
    w = np.asarray(weights, dtype=np.float64)
    w_sorted = w[:, order]
    zero = np.zeros((len(w), 1))
    tp = np.hstack([zero, np.cumsum(w_sorted * is_pos[order], axis=1)[:, last]])
    fp = np.hstack([zero, np.cumsum(w_sorted * ~is_pos[order], axis=1)[:, last]])
    n_pos, n_neg = tp[:, -1], fp[:, -1]
    tp_point = w @ (is_pos & pred_pos & parsed).astype(np.float64)
    fp_point = w @ (~is_pos & ~(~pred_pos & parsed)).astype(np.float64)  # every negative not correctly rejected
    curve = curve_tpr_at(tp, fp, tp_point, fp_point)
    defined = (n_pos > 0) & (n_neg > 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpr = np.where(defined, tp_point / n_pos, np.nan)
        curve_tpr = np.where(defined, curve / n_pos, np.nan)
        fpr = np.where(defined, fp_point / n_neg, np.nan)
    return {"delta_tpr": tpr - curve_tpr, "fpr": fpr, "tpr": tpr, "curve_tpr": curve_tpr}


def _item_weights(items: np.ndarray, n: int) -> np.ndarray:
    """[b, n] counts of each item in each replicate's draw."""
    b = len(items)
    return np.bincount((items + (np.arange(b) * n)[:, None]).ravel(), minlength=b * n).reshape(b, n).astype(np.float64)


def distance(is_pos: np.ndarray, scores: np.ndarray, pred_pos: np.ndarray, parsed: np.ndarray, *,
             n_boot: int = 1000, seed: int = 0) -> dict:
    """The pooled ΔTPR of S pairs on n shared items and its 95% two-level bootstrap interval
    (module docstring).

    ``is_pos`` [n]; ``scores``, ``pred_pos``, ``parsed`` [S, n]: pair s's scored model's positive
    score and its other model's answers. Returns ``delta_tpr`` (mean over the pairs), ``ci``,
    ``n_boot``, ``n_used`` (replicates with both classes), ``seed``, ``n_pairs``, the means over
    the pairs of ``fpr``, ``tpr`` and ``curve_tpr`` (the point and the curve's TPR at its FPR),
    and ``delta_tpr_pairs`` (each pair's ΔTPR).
    """
    if n_boot < 1:
        raise ValueError(f"n_boot={n_boot}: the ΔTPR interval needs at least 1 bootstrap resample (e.g. 1000)")
    is_pos = np.asarray(is_pos, dtype=bool)
    scores, pred_pos, parsed = np.atleast_2d(scores), np.atleast_2d(pred_pos), np.atleast_2d(parsed)
    n_pairs, n = scores.shape
    if not (is_pos.any() and (~is_pos).any()):
        raise ValueError(f"{int(is_pos.sum())} positive and {int((~is_pos).sum())} negative items: the ROC curve "
                         "needs both; check the positive label and the split")
    ones = np.ones((1, n))
    points = [weighted_gap(is_pos, scores[p], pred_pos[p], parsed[p], ones) for p in range(n_pairs)]
    items, pairs = draws(n, n_pairs, n_boot, seed)
    per_pair = np.empty((n_boot, n_pairs))  # [n_boot, S] each pair's ΔTPR under each replicate's item draw
    chunk = max(1, _CELLS // max(n, 1))
    for start in range(0, n_boot, chunk):
        w = _item_weights(items[start : start + chunk], n)
        for p in range(n_pairs):
            per_pair[start : start + len(w), p] = weighted_gap(is_pos, scores[p], pred_pos[p], parsed[p], w)["delta_tpr"]
    boot = np.take_along_axis(per_pair, pairs, axis=1).mean(axis=1)
    boot = boot[np.isfinite(boot)]
    ci = [float(v) for v in np.percentile(boot, [2.5, 97.5])] if len(boot) else None
    mean = {k: float(np.mean([pt[k][0] for pt in points])) for k in ("delta_tpr", "fpr", "tpr", "curve_tpr")}
    return {**mean, "ci": ci, "n_boot": n_boot, "n_used": int(len(boot)), "seed": seed, "n_pairs": n_pairs,
            "delta_tpr_pairs": [float(pt["delta_tpr"][0]) for pt in points]}


def position(ci: list[float] | None) -> str:
    """Where the interval puts the point: "on the curve" when it covers 0, else "above the curve"
    or "below the curve"; "undetermined" without an interval."""
    if ci is None:
        return "undetermined"
    if ci[0] > 0:
        return "above the curve"
    if ci[1] < 0:
        return "below the curve"
    return "on the curve"


# The first words of every sweep verdict (labelrl.evaluate.sweep), in the order a tally lists them.
VERDICT_WORDS = ("on the curve", "above the curve", "below the curve", "uninformative", "undetermined")


def verdict_word(verdict: str) -> str:
    """The verdict's first words (one of ``VERDICT_WORDS``); else the text before its first ":" or " ("
    (a verdict written by an earlier version, e.g. "reproduced")."""
    for word in VERDICT_WORDS:
        if verdict.startswith(word):
            return word
    return verdict.split(":")[0].split(" (")[0]
