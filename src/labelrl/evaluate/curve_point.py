"""The curve and the point: a binary model's ranking and its own answers, compared separately.

A model that scores every item has a ROC curve (its ranking, whatever the threshold) and an
operating point on it (the answers it gives, at its own threshold). RL can move the point along
the curve without improving the ranking, e.g. to an extreme where it answers one label almost
always, and a comparison of answers alone cannot tell that from a worse model. So B (an RL arm)
is set against A (its SFT parent) on the same items twice:

* **the curve**: ROC-AUC of each run's probability of the positive label (its label-token score),
  computed as the Mann–Whitney statistic P(score_pos > score_neg) + ½ P(tie) (Hanley & McNeil
  1982), ``labelrl.evaluate.metrics.weighted_auc``;
* **the point**: recall (TPR) and precision of the positive label among each run's own answers
  (its most probable label). Precision is undefined when a run never answers positive; that
  run's value is null and replicates where it is undefined are left out of the interval.

Δ = B − A of each, with the two-level paired percentile bootstrap of ``labelrl.evaluate.paired``
(its seed and draw order): every replicate draws n items with replacement, the same items for
every run, and both arms' AUCs are recomputed on that draw (the paired bootstrap of ΔAUC,
e.g. pROC's ``roc.test(method = "bootstrap")``, Robin et al. 2011, there stratified by class;
here a draw without both classes has no AUC and is left out). Replicate runs (seeds) are
resampled too, as in ``paired_comparison`` (together when ``seeds_paired``).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from labelrl.evaluate.io import Predictions
from labelrl.evaluate.metrics import Encoded, weighted_auc
from labelrl.evaluate.paired import bootstrap_draws, delta_summary, encode_on, metric_matrix, point_value, shared_ids

CURVE = "roc_auc"
POINT = ("recall", "precision")


def curve_point_from_weights(weights: np.ndarray, enc: Encoded) -> dict[str, np.ndarray]:
    """ROC-AUC of the positive label's score, and recall and precision of the positive label among the
    answers, for each row-weight vector of ``weights [B, N]``; NaN where undefined (no positive or no
    negative item for the AUC and recall, no positive answer for precision)."""
    pos = enc.labels.index(enc.labels.positive_label)
    is_pos = (enc.true == pos).astype(np.float64)
    answered_pos = (enc.pred == pos).astype(np.float64)
    tp, n_pos, n_answered = weights @ (is_pos * answered_pos), weights @ is_pos, weights @ answered_pos
    with np.errstate(invalid="ignore", divide="ignore"):
        return {CURVE: weighted_auc(weights, is_pos, enc.scores[:, pos]),
                "recall": np.where(n_pos > 0, tp / n_pos, np.nan),
                "precision": np.where(n_answered > 0, tp / n_answered, np.nan)}


def paired_curve_point(a: Sequence[Predictions], b: Sequence[Predictions], *, names: tuple[str, str] = ("A", "B"),
                       n_boot: int = 2000, seed: int = 0, seeds_paired: bool = False) -> dict:
    """B against A (each arm's runs) on their shared items: Δ (B − A) of ROC-AUC, recall and precision
    with paired intervals (module docstring), and the words of each (``curve``, ``point``).

    Returns ``{names, n, n_runs, n_boot, seed, positive_label, metrics: {roc_auc, recall, precision:
    {a, b, a_runs, b_runs, delta, ci}}, curve, point, verdict}`` (undefined values are None)."""
    if not a or not b:
        raise ValueError("a curve-and-point comparison needs at least one run of each arm")
    if n_boot < 1:
        raise ValueError(f"n_boot={n_boot}: the paired interval needs at least 1 bootstrap resample (e.g. 2000)")
    labels = a[0].labels
    if labels.kind != "binary":
        raise ValueError(f"labels {list(labels.labels)} are {labels.kind}: the curve (ROC-AUC of the positive label) "
                         "and the point (its recall and precision) are for binary tasks")
    unscored = [r.info.get("source", "a run") for r in [*a, *b] if r.scores() is None]
    if unscored:
        raise ValueError(f"{unscored[0]}: no label scores, so no ROC curve; score the model by label-token "
                         "probabilities (labelrl eval --method scores; a direct model)")
    ids = shared_ids([*a, *b])
    encs = [encode_on(r, ids, scores=True) for r in [*a, *b]]
    n, S, T = len(ids), len(a), len(b)
    items, runs_a, runs_b = bootstrap_draws(n, (S, T), n_boot, seed, seeds_paired and S == T > 1)
    metrics = (CURVE, *POINT)
    boot = metric_matrix(encs, items, metrics, values=curve_point_from_weights)
    out: dict = {"names": list(names), "n": n, "n_runs": [S, T], "n_boot": n_boot, "seed": seed,
                 "positive_label": labels.positive_label, "metrics": {}}
    for m in metrics:
        values = [point_value(e, m, curve_point_from_weights) for e in encs]
        summary = delta_summary(boot[m], (values[:S], values[S:]), runs_a, runs_b)
        out["metrics"][m] = {k: _finite(v) for k, v in summary.items()}
    out["curve"], out["point"] = curve_words(out), point_words(out)
    out["verdict"] = f"{names[1]} vs {names[0]}: {out['curve']}; {out['point']}"
    return out


def _finite(value):
    """JSON-safe: NaN (undefined) becomes None, in lists too."""
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return None if isinstance(value, float) and math.isnan(value) else value


def _number(value: float | None, sign: bool = False) -> str:
    return "—" if value is None else f"{value:+.3f}" if sign else f"{value:.3f}"


def _interval(m: dict) -> str:
    lo, hi = m["ci"] or (None, None)
    return f"[{_number(lo, True)}, {_number(hi, True)}]"


def curve_words(result: dict) -> str:
    """``curve: ΔROC-AUC +0.026 [-0.004, +0.060] (no detectable difference, could detect |ROC-AUC| ≥ 0.041;
    grpo 0.994 vs sft 0.968 over 128 items; 1/1 seeds higher)``: "better ranking" / "worse ranking" only
    when the comparison's corrected decision (``labelrl.evaluate.paired.tested``, Holm within the task's
    family once the ladder has corrected it) detects a difference; the interval is the adjusted one."""
    from labelrl.evaluate.paired import seed_agreement, tested

    m = result["metrics"][CURVE]
    if m["delta"] is None:
        return f"curve: ROC-AUC undefined over {result['n']} items (one class only)"
    decision = tested(result, CURVE)
    if decision["reject"]:
        words = "better ranking" if m["delta"] > 0 else "worse ranking"
    else:
        mde = decision.get("detectable")
        words = "no detectable difference" + (f", could detect |ROC-AUC| ≥ {mde:.3f}" if mde is not None else "")
    a, b = result["names"]
    interval = _interval({"ci": decision["ci_adjusted"]})
    seeds = seed_agreement(m)
    return (f"curve: ΔROC-AUC {_number(m['delta'], True)} {interval} ({words}; {b} {_number(m['b'])} vs "
            f"{a} {_number(m['a'])} over {result['n']} items{'; ' + seeds if seeds else ''})")


def point_words(result: dict) -> str:
    """``point (grpo vs sft, positive 'spam'): recall 0.222 vs 0.889 (Δ -0.667 [-0.889, -0.444]), precision
    1.000 vs 0.571 (Δ …)``; the precision of a run that never answers positive reads "none answered"."""
    parts = []
    for name in POINT:
        m = result["metrics"][name]
        b, a = ("none answered" if v is None and name == "precision" else _number(v) for v in (m["b"], m["a"]))
        delta = f" (Δ {_number(m['delta'], True)} {_interval(m)})" if m["delta"] is not None else ""
        parts.append(f"{name} {b} vs {a}{delta}")
    a, b = result["names"]
    return f"point ({b} vs {a}, positive {result['positive_label']!r}): " + ", ".join(parts)

