"""Paired comparison of two arms scored on the same items, over items and over seeds.

Two arms evaluated on the same holdout items are compared item by item: an item that is hard
for one is hard for the other, so the paired difference is far more precise than two
separate intervals (which overlap almost always at a few hundred items). An arm may hold
several runs, one per seed (replicates); the difference is then between the arms' means over
their runs, and its interval accounts for the spread over seeds as well as over items.

For a metric m (accuracy, balanced accuracy, and for ordinal tasks the mean absolute grade
error), with runs a_1 … a_S of arm A and b_1 … b_T of arm B on the n shared items:

    Δ = mean_t m(b_t) − mean_s m(a_s)

The 95% interval is a two-level percentile bootstrap (Davison & Hinkley 1997, §3.8, resampling
at both stages): each replicate draws n items with replacement (the same items for every run:
the pairing) and, independently, S runs of A and T runs of B with replacement, and computes Δ
on them. The draws come from ``numpy.random.default_rng(seed)`` in this order, all at once:
``items = rng.integers(0, n, (n_boot, n))``, ``runs_a = rng.integers(0, S, (n_boot, S))``,
``runs_b = rng.integers(0, T, (n_boot, T))``. With one run per arm this is the ordinary paired
bootstrap over items.

**Runs paired by seed** (``seeds_paired``: S = T and run k of B is run k of A's counterpart — an RL
run and the SFT run it started from, or two RL arms started from the same SFT run, as the ladder
trains them): the seed is the unit, so each replicate draws one set of seed indices and takes
both arms' runs at them (``runs_b`` is ``runs_a``; ``runs_b`` is still drawn, so the stream is the
same). What the two arms share through their seed (the parent's training noise) then cancels
from Δ, as the items' shared difficulty does.

Each Δ also records ``se``, the standard deviation of its bootstrap replicates, and
``pair_deltas``, the difference of each pair of runs (seed k of B against seed k of A; see McNemar
below for the pairing): how many seeds agree in sign with Δ is part of every verdict. The verdict's
words come from the task's family of comparisons, Holm-corrected (``labelrl.evaluate.family``:
the adjusted interval, and the smallest difference a "no detectable difference" could have
detected); a comparison judged alone is a family of one.

Binary correctness is also compared with McNemar's exact test (McNemar 1947; the exact form is
a two-sided binomial test of the discordant pairs, ``scipy.stats.binomtest``), per pair of
runs: by position when both arms have the same number of runs (seed k with seed k), else each
run of the replicated arm against the single run of the other. With several pairs, the test is
also run once on their discordant counts pooled (``mcnemar_pooled``): items are paired within
each pair of runs, never across seeds, and each seed's items count as further pairs.

An unparsed answer is wrong, and counts as the farthest grade in the grade error, as in
``labelrl.evaluate.metrics``.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from scipy.stats import binomtest

from labelrl.evaluate.io import Predictions
from labelrl.evaluate.metrics import Encoded, encode, metrics_from_weights

COMPARED = ("accuracy", "balanced_accuracy", "mean_abs_grade_error")
# Lower is better for these; "better" in a verdict means a lower value.
LOWER_IS_BETTER = {"mean_abs_grade_error"}
_CELLS = 4_000_000  # item-weights held in memory at once


def shared_ids(runs: Sequence[Predictions]) -> list[str]:
    """Ids every run holds, in the first run's order; ValueError when two runs disagree on a label."""
    common = set(runs[0].ids)
    for run in runs[1:]:
        common &= set(run.ids)
    if not common:
        raise ValueError("the runs share no item id: a paired comparison needs the same items in every run "
                         "(evaluate every arm on the same split and sample: labelrl eval --split, --limit)")
    truth = dict(zip(runs[0].ids, runs[0].y_true))
    for run in runs[1:]:
        bad = next((i for i, y in zip(run.ids, run.y_true) if i in common and y != truth[i]), None)
        if bad is not None:
            raise ValueError(f"item {bad!r} has label {truth[bad]!r} in one run and another in {run.info.get('source', 'another')}: "
                             "the runs were scored against different answer keys")
    return [i for i in runs[0].ids if i in common]


def encode_on(run: Predictions, ids: list[str], *, scores: bool = False) -> Encoded:
    """The run's rows of ``ids``, in that order, encoded (with its label scores when ``scores``)."""
    row = {i: r for r, i in enumerate(run.ids)}
    rows = [row[i] for i in ids]
    probs = run.scores()[rows] if scores else None
    return encode([run.y_true[r] for r in rows], [run.y_pred[r] for r in rows], run.labels, probs)


def bootstrap_draws(n: int, n_runs: tuple[int, int], n_boot: int, seed: int,
                    seeds_paired: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(items [n_boot, n], runs_a [n_boot, S], runs_b [n_boot, T]): the draws of the module
    docstring, from ``numpy.random.default_rng(seed)`` in that order; with ``seeds_paired`` (S = T)
    ``runs_b`` is ``runs_a``."""
    if seeds_paired and n_runs[0] != n_runs[1]:
        raise ValueError(f"runs paired by seed need as many runs in each arm, not {n_runs[0]} and {n_runs[1]}")
    rng = np.random.default_rng(seed)
    items = rng.integers(0, n, (n_boot, n))
    runs_a, runs_b = rng.integers(0, n_runs[0], (n_boot, n_runs[0])), rng.integers(0, n_runs[1], (n_boot, n_runs[1]))
    return items, runs_a, runs_a if seeds_paired else runs_b


def delta_summary(mat: np.ndarray, points: tuple[list[float], list[float]], runs_a: np.ndarray, runs_b: np.ndarray) -> dict:
    """One metric's paired difference: the arms' means over their runs (``points``), Δ = B − A, its
    percentile 95% interval and its bootstrap standard error ``se`` from ``mat [n_boot, S + T]``
    (every run's value under each replicate's item draw, A's runs first) under the drawn runs,
    ``se_items`` the same with every run kept (the items' part of the spread), and
    ``pair_deltas``, B − A per pair of runs (``run_pairs``); replicates where Δ is undefined are left
    out."""
    pa, pb = points
    S = len(pa)
    delta = (np.take_along_axis(mat[:, S:], runs_b, axis=1).mean(axis=1)
             - np.take_along_axis(mat[:, :S], runs_a, axis=1).mean(axis=1))
    delta = delta[np.isfinite(delta)]
    ci = [float(v) for v in np.percentile(delta, [2.5, 97.5])] if len(delta) else None
    se = float(np.std(delta, ddof=1)) if len(delta) > 1 else None
    # the items' share of the spread: every run kept, only the items redrawn (labelrl.evaluate.plan)
    by_items = mat[:, S:].mean(axis=1) - mat[:, :S].mean(axis=1)
    by_items = by_items[np.isfinite(by_items)]
    se_items = float(np.std(by_items, ddof=1)) if len(by_items) > 1 else None
    return {"a": float(np.mean(pa)), "b": float(np.mean(pb)), "a_runs": pa, "b_runs": pb,
            "delta": float(np.mean(pb) - np.mean(pa)), "ci": ci, "se": se, "se_items": se_items,
            "pair_deltas": [float(pb[j] - pa[i]) for i, j in run_pairs(len(pa), len(pb))]}


def metric_matrix(encs: list[Encoded], items: np.ndarray, metrics: tuple[str, ...],
                  values=metrics_from_weights) -> dict[str, np.ndarray]:
    """Each metric [n_boot, R] of every run under each replicate's item draw; ``values(weights [B, N],
    enc)`` computes the metrics of row-weighted items (default ``metrics_from_weights``)."""
    n_boot, n = items.shape
    out = {m: np.empty((n_boot, len(encs))) for m in metrics}
    chunk = max(1, _CELLS // max(n, 1))
    for start in range(0, n_boot, chunk):
        draws = items[start : start + chunk]
        b = len(draws)
        weights = np.bincount((draws + (np.arange(b) * n)[:, None]).ravel(), minlength=b * n).reshape(b, n).astype(np.float64)
        for r, enc in enumerate(encs):
            computed = values(weights, enc)
            for m in metrics:
                out[m][start : start + b, r] = computed[m]
    return out


def point_value(enc: Encoded, metric: str, values=metrics_from_weights) -> float:
    """``metric`` of the run on its items as they are (every weight 1)."""
    return float(values(np.ones((1, enc.n)), enc)[metric][0])


def mcnemar(a: Encoded, b: Encoded) -> dict:
    """McNemar's exact test of B's correctness against A's on the same items."""
    right_a, right_b = a.pred == a.true, b.pred == b.true
    a_only, b_only = int((right_a & ~right_b).sum()), int((~right_a & right_b).sum())
    p = binomtest(b_only, a_only + b_only, 0.5).pvalue if a_only + b_only else 1.0
    return {"a_right_b_wrong": a_only, "a_wrong_b_right": b_only, "p_value": float(p)}


def mcnemar_pooled(tests: Sequence[dict]) -> dict:
    """McNemar's exact test on the discordant pairs of every pair of runs added together
    (``mcnemar`` per pair: items are paired within each seed's runs)."""
    a_only, b_only = sum(t["a_right_b_wrong"] for t in tests), sum(t["a_wrong_b_right"] for t in tests)
    p = binomtest(b_only, a_only + b_only, 0.5).pvalue if a_only + b_only else 1.0
    return {"pairs": len(tests), "a_right_b_wrong": a_only, "a_wrong_b_right": b_only, "p_value": float(p)}


def run_pairs(n_a: int, n_b: int) -> list[tuple[int, int]]:
    """(run of A, run of B) pairs: by position when both arms have as many runs (seed k with seed k),
    else each run of the replicated arm with the single run of the other (module docstring)."""
    if n_a == n_b:
        return [(i, i) for i in range(n_a)]
    if n_a == 1:
        return [(0, j) for j in range(n_b)]
    if n_b == 1:
        return [(i, 0) for i in range(n_a)]
    return [(i, i) for i in range(min(n_a, n_b))]


def paired_comparison(a: Sequence[Predictions], b: Sequence[Predictions], *, names: tuple[str, str] = ("A", "B"),
                      n_boot: int = 2000, seed: int = 0, seeds_paired: bool = False) -> dict:
    """Δ (B − A) per metric with its two-level bootstrap interval, McNemar per pair of runs, and
    a verdict on balanced accuracy (module docstring). ``a`` and ``b`` are each arm's runs;
    ``seeds_paired``: run k of each is seed k's (resampled together; ignored unless S = T > 1)."""
    if not a or not b:
        raise ValueError("a paired comparison needs at least one run of each arm")
    if n_boot < 1:
        raise ValueError(f"n_boot={n_boot}: the paired interval needs at least 1 bootstrap resample (e.g. 2000)")
    ids = shared_ids([*a, *b])
    enc_a, enc_b = [encode_on(r, ids) for r in a], [encode_on(r, ids) for r in b]
    metrics = tuple(m for m in COMPARED if m != "mean_abs_grade_error" or enc_a[0].labels.kind == "ordinal")
    n, S, T = len(ids), len(a), len(b)
    paired = seeds_paired and S == T > 1
    items, runs_a, runs_b = bootstrap_draws(n, (S, T), n_boot, seed, paired)
    boot = metric_matrix(enc_a + enc_b, items, metrics)
    out: dict = {"names": list(names), "n": n, "n_runs": [S, T], "n_boot": n_boot, "seed": seed, "seeds_paired": paired,
                 "metrics": {}}
    for m in metrics:
        points = [point_value(e, m) for e in enc_a], [point_value(e, m) for e in enc_b]
        out["metrics"][m] = delta_summary(boot[m], points, runs_a, runs_b)
    out["mcnemar"] = [{"a_run": i, "b_run": j, **mcnemar(enc_a[i], enc_b[j])} for i, j in run_pairs(S, T)]
    out["mcnemar_pooled"] = mcnemar_pooled(out["mcnemar"])
    out["verdict"] = verdict(out, "balanced_accuracy")
    return out


SHORT = {"balanced_accuracy": "ΔBA", "accuracy": "Δacc", "mean_abs_grade_error": "Δ|err|", "roc_auc": "ΔROC-AUC"}


def tested(result: dict, metric: str = "balanced_accuracy") -> dict:
    """The comparison's decision on ``metric``: its family entry (``labelrl.evaluate.family``) when the
    ladder corrected it within a family on that metric, else a family of one. A result written before
    Δ had a standard error is judged by its percentile interval, as it was then."""
    from labelrl.evaluate.family import correct

    family = result.get("family")
    if family and family.get("metric", metric) == metric:
        return family
    m = result["metrics"][metric]
    if "se" not in m and m.get("ci") is not None:
        lo, hi = m["ci"]
        return {"method": "none", "size": 1, "reject": lo > 0 or hi < 0, "ci_adjusted": m["ci"], "detectable": None}
    return correct([(m["delta"], m.get("se"))])[0]


def seed_count(m: dict) -> tuple[int, int] | None:
    """(k, n): of the n pairs of runs (``pair_deltas``, one per seed), the k whose Δ has the sign of
    the mean Δ (Δ = 0: the pairs with no difference); None without them."""
    deltas = [d for d in m.get("pair_deltas") or [] if d is not None and np.isfinite(d)]
    if not deltas or m.get("delta") is None:
        return None
    sign = np.sign(m["delta"])
    return int(sum(np.sign(d) == sign for d in deltas)), len(deltas)


def seed_agreement(m: dict) -> str:
    """``3/3 seeds higher``: ``seed_count`` in words."""
    count = seed_count(m)
    if count is None:
        return ""
    direction = "no different" if m["delta"] == 0 else ("lower" if m["delta"] < 0 else "higher")
    return f"{count[0]}/{count[1]} seeds {direction}"


def verdict_words(result: dict, metric: str = "balanced_accuracy") -> str:
    """Plain words for one metric's paired difference (B − A): "better", "worse", or "no detectable
    difference" by the corrected decision (``tested``), with Δ, its adjusted interval, the items, the
    seeds that agree in sign, the smallest detectable |Δ| where nothing was detected, and the
    correction: ``better (ΔBA +0.028 [+0.006, +0.053] over 557 items; 3/3 seeds higher; Holm over
    29)``."""
    m = result["metrics"][metric]
    decision = tested(result, metric)
    lo, hi = decision["ci_adjusted"] or (float("nan"), float("nan"))
    short = SHORT.get(metric, f"Δ{metric}")
    parts = [f"{short} {m['delta']:+.3f} [{lo:+.3f}, {hi:+.3f}] over {result['n']} items"]
    parts.append(seed_agreement(m))
    if not decision["reject"] and decision.get("detectable") is not None:
        parts.append(f"could detect |{short.removeprefix('Δ')}| ≥ {decision['detectable']:.3f}")
    if decision.get("method") == "holm" and decision.get("size", 1) > 1:
        parts.append(f"Holm over {decision['size']}")
    numbers = "; ".join(p for p in parts if p)
    if not decision["reject"]:
        return f"no detectable difference ({numbers})"
    better = (m["delta"] < 0) if metric in LOWER_IS_BETTER else (m["delta"] > 0)
    return f"{'better' if better else 'worse'} ({numbers})"


def verdict(result: dict, metric: str = "balanced_accuracy") -> str:
    """``"B vs A: " + verdict_words(...)``."""
    a, b = result["names"]
    return f"{b} vs {a}: {verdict_words(result, metric)}"
