"""Label noise from duplicates: disagreement d, flip rate ε, accuracy ceiling, Cohen's κ.

The noise model (symmetric label noise, e.g. Angluin & Laird 1988, "Learning from noisy
examples"; Natarajan et al. 2013, NeurIPS): every copy of an item independently keeps its
true label with probability 1 − ε and moves to each of the other K − 1 labels with
probability ε/(K − 1). Two copies then disagree with probability

    d = 1 − (1 − ε)² − ε²/(K − 1)                    (eq. 1; K = 2: d = 2ε(1 − ε))

and a model that always predicts the true label matches the recorded label with
probability 1 − ε, the accuracy ceiling. Inverting eq. 1 turns the observed disagreement
between duplicates into ε. The estimate assumes copies were labelled independently; copies
labelled together (or reconciled by the dataset's authors) agree more often, which makes
ε̂ a lower bound.

Pairs are weighted equally: a group of n copies gives n(n − 1)/2 pairs, so d is the
probability that two random copies of the same item, drawn over all such pairs, disagree.
Pairs inside a group are not independent, so intervals resample whole groups.

A group of 300 copies gives 44,850 pairs, a group of 2 gives one: when a few groups hold most
of the pairs (retweets copied hundreds of times), the pair-weighted d is mostly theirs. Eq. 1
holds within every group whatever its size, so the mean of the groups' own disagreement rates
(each group counted once, ``group_weighted_noise``) estimates the same d; the two differ when
the big groups are noisier or cleaner than the rest, and the audit reports both.
"""

from __future__ import annotations

from typing import Iterator, Mapping, Sequence

import numpy as np
from scipy.stats import chi2_contingency
from sklearn.metrics import cohen_kappa_score

from labelrl.audit.duplicates import DuplicateGroup
from labelrl.types import LabelSpace

# Columns of the per-group feature matrix; label endpoint counts follow at _ENDPOINTS.
_PAIRS, _AGREE, _ABS_DIFF, _ENDPOINTS = 0, 1, 2, 3
_TOLERANCE = 1e-12


def max_disagreement(k: int) -> float:
    """The largest d eq. 1 can produce, (K − 1)/K, reached at ε = (K − 1)/K (labels uniform)."""
    if k < 2:
        raise ValueError(f"k={k}: a label set needs at least 2 labels")
    return (k - 1) / k


def disagreement_from_flip_rate(flip_rate: float, k: int = 2) -> float:
    """d for flip rate ε among K labels (eq. 1)."""
    if not 0.0 <= flip_rate <= 1.0:
        raise ValueError(f"flip_rate={flip_rate}: a probability lies in [0, 1]")
    # 1 − (1 − ε)² − ε²/(K − 1) rearranged to ε(2 − aε), a = K/(K − 1): no cancellation near 0.
    a = 1.0 / max_disagreement(k)  # K/(K − 1); also rejects K < 2
    return flip_rate * (2.0 - a * flip_rate)


def flip_rates(disagreement: np.ndarray, k: int) -> np.ndarray:
    """Vectorised inverse of eq. 1, clamped: d above (K − 1)/K maps to ε = (K − 1)/K.

    Eq. 1 reads d = 2ε − aε² with a = K/(K − 1); the smaller root of aε² − 2ε + d = 0 is
    ε = (1 − √(1 − a·d))/a (K = 2: ε = (1 − √(1 − 2d))/2). The smaller root is the one with
    ε ≤ (K − 1)/K, where a recorded label is still most likely the true one; the larger root
    (labels systematically moved away from the truth) cannot be told apart from duplicates.
    NaN stays NaN.
    """
    a = k / (k - 1)
    d = np.asarray(disagreement, dtype=float)
    return (1.0 - np.sqrt(np.clip(1.0 - a * d, 0.0, None))) / a


def flip_rate_from_disagreement(disagreement: float, k: int = 2) -> float | None:
    """ε from d (inverse of eq. 1), or None when d exceeds what the noise model can produce.

    d > (K − 1)/K (1/2 for binary) means copies disagree more often than unrelated uniform
    labels would: no ε fits, and a number would mislead. Use :func:`flip_rate_reason` for
    the plain-language reason.
    """
    if disagreement < 0.0:
        raise ValueError(f"disagreement={disagreement}: a rate cannot be negative")
    if disagreement > max_disagreement(k) + _TOLERANCE:
        return None
    return float(flip_rates(np.array(disagreement), k))


def flip_rate_reason(disagreement: float | None, k: int) -> str | None:
    """Why ε is not reported for this d (None when it is)."""
    if disagreement is None:
        return "no duplicate pairs: ε cannot be estimated from duplicates"
    if disagreement > max_disagreement(k) + _TOLERANCE:
        return (
            f"d = {disagreement:.3f} exceeds {max_disagreement(k):.3f} = (K−1)/K, the most "
            f"disagreement symmetric noise over K = {k} labels can produce: copies' labels look "
            "unrelated to each other, so no flip rate fits"
        )
    return None


def group_label_counts(groups: Sequence[DuplicateGroup], labels: LabelSpace) -> np.ndarray:
    """[n_groups, K] how many copies of each group carry each label (label-space order)."""
    counts = np.zeros((len(groups), labels.k), dtype=np.int64)
    for g, group in enumerate(groups):
        for label in group.labels:
            counts[g, labels.index(label)] += 1
    return counts


def symmetrised_confusion(counts: np.ndarray) -> np.ndarray:
    """[K, K] the pair list in both orders: Σ_groups (m mᵀ − diag m) for label counts m.

    Off-diagonal m_a·m_b counts ordered pairs (a, b); the diagonal m_a(m_a − 1) counts ordered
    pairs of distinct copies that share label a. The total is Σ n(n − 1), twice the pairs.
    """
    counts = np.asarray(counts, dtype=float)
    return counts.T @ counts - np.diag(counts.sum(axis=0))


def group_features(counts: np.ndarray) -> np.ndarray:
    """[n_groups, 3 + K]: pairs, agreeing pairs, Σ|grade difference|, label endpoint counts.

    All are additive over groups, so a bootstrap resample's totals are ``weights @ features``.
    A copy with label a takes part in n − 1 pairs, so label a is an endpoint m_a(n − 1) times.
    """
    counts = np.asarray(counts, dtype=float)
    n = counts.sum(axis=1)
    k = counts.shape[1]
    grades = np.arange(k, dtype=float)
    distance = np.abs(grades[:, None] - grades[None, :])  # [K, K]
    abs_diff = 0.5 * np.einsum("ga,ab,gb->g", counts, distance, counts)
    features = np.empty((counts.shape[0], _ENDPOINTS + k))
    features[:, _PAIRS] = n * (n - 1) / 2
    features[:, _AGREE] = (counts * (counts - 1) / 2).sum(axis=1)
    features[:, _ABS_DIFF] = abs_diff
    features[:, _ENDPOINTS:] = counts * (n - 1)[:, None]
    return features


def stats_from_totals(totals: np.ndarray) -> dict[str, np.ndarray]:
    """d, κ and mean |grade difference| from summed group features ([..., 3 + K]).

    κ = (p_o − p_e)/(1 − p_e) (Cohen 1960, eq. 1) on the symmetrised pair list: p_o = 1 − d,
    p_e = Σ_a (share of endpoints with label a)², since both orders share one marginal.
    Undefined values (no pairs; a single label, p_e = 1) are NaN.
    """
    totals = np.asarray(totals, dtype=float)
    pairs = totals[..., _PAIRS]
    with np.errstate(invalid="ignore", divide="ignore"):
        agree = totals[..., _AGREE] / pairs
        shares = totals[..., _ENDPOINTS:] / (2 * pairs)[..., None]
        chance = (shares**2).sum(axis=-1)
        kappa = np.where(chance < 1 - _TOLERANCE, (agree - chance) / (1 - chance), np.nan)
        mean_abs = totals[..., _ABS_DIFF] / pairs
    return {"disagreement": 1 - agree, "kappa": kappa, "mean_abs_grade_diff": mean_abs}


def kappa_between_copies(counts: np.ndarray) -> float | None:
    """Cohen's κ between copies (scikit-learn) on the pair list in both orders.

    The list is passed in compressed form: every label pair (a, b) once, weighted by how
    often it occurs. None when undefined (no pairs, or one label only).
    """
    confusion = symmetrised_confusion(counts)
    if confusion.sum() == 0 or np.count_nonzero(confusion.sum(axis=0)) < 2:
        return None
    k = confusion.shape[0]
    first, second = np.divmod(np.arange(k * k), k)
    return float(
        cohen_kappa_score(first, second, labels=np.arange(k), sample_weight=confusion.ravel())
    )


def bootstrap_counts(
    n_units: int, n_boot: int, rng: np.random.Generator, max_cells: int = 4_000_000
) -> Iterator[np.ndarray]:
    """Resample counts, ``[chunk, n_units]`` per chunk, ``n_boot`` rows in all.

    Row b says how often each unit (group or item) was drawn in resample b (n_units draws
    with replacement). Chunks bound memory to ``max_cells`` counts.
    """
    chunk = max(1, min(n_boot, max_cells // max(n_units, 1)))
    for start in range(0, n_boot, chunk):
        rows = min(chunk, n_boot - start)
        draws = rng.integers(0, n_units, size=(rows, n_units))
        flat = draws + (np.arange(rows) * n_units)[:, None]
        yield np.bincount(flat.ravel(), minlength=rows * n_units).reshape(rows, n_units)


def bootstrap_totals(features: np.ndarray, n_boot: int, seed: int | Sequence[int]) -> np.ndarray:
    """[n_boot, F] summed features of ``n_boot`` resamples of the rows of ``features``."""
    rng = np.random.default_rng(seed)
    parts = [w @ features for w in bootstrap_counts(features.shape[0], n_boot, rng)]
    return np.concatenate(parts) if parts else np.empty((0, features.shape[1]))


def interval(values: np.ndarray, level: float = 0.95) -> list[float] | None:
    """Percentile interval [lo, hi] of bootstrap values, ignoring NaN; None when none are finite."""
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    if values.size == 0:
        return None
    tail = 100 * (1 - level) / 2
    lo, hi = np.percentile(values, [tail, 100 - tail])
    return [float(lo), float(hi)]


def _none_if_nan(value: float) -> float | None:
    return None if not np.isfinite(value) else float(value)


def duplicate_noise(
    groups: Sequence[DuplicateGroup],
    labels: LabelSpace,
    *,
    n_boot: int = 1000,
    seed: int | Sequence[int] = 0,
) -> dict:
    """d, ε, ceiling and κ (each with a 95% group-bootstrap interval) from duplicate groups.

    Keys: n_duplicate_groups, n_conflicting_groups, n_pairs, n_disagreeing_pairs,
    disagreement_rate, flip_rate, flip_rate_reason, ceiling, kappa, and for ordinal label
    spaces mean_abs_grade_diff (mean |grade index difference| over pairs); each estimate has a
    ``<name>_ci`` sibling [lo, hi] (None without pairs or with ``n_boot=0``). Beside them,
    ``group_weighted`` (d, ε, ceiling with each group counted once: ``group_weighted_noise``)
    and ``largest_groups_pair_share`` (the share of pairs in the largest 1, 2 and 3 groups).

    Intervals are percentile intervals over ``n_boot`` resamples of whole groups. In a
    resample whose d exceeds (K − 1)/K, ε is taken at its maximum (K − 1)/K (labels carry
    no information) rather than dropped, so the interval stays honest about that tail.
    """
    if n_boot < 0:
        raise ValueError(f"n_boot={n_boot}: the number of bootstrap resamples cannot be negative; use 0 to skip intervals")
    k = labels.k
    counts = group_label_counts(groups, labels)
    features = group_features(counts)
    point = stats_from_totals(features.sum(axis=0))
    n_pairs = int(features[:, _PAIRS].sum())
    d = _none_if_nan(point["disagreement"])
    eps = flip_rate_from_disagreement(d, k) if d is not None else None
    result = {
        "n_duplicate_groups": len(groups),
        "n_conflicting_groups": sum(g.conflicting for g in groups),
        "n_pairs": n_pairs,
        "n_disagreeing_pairs": int(round(features[:, _PAIRS].sum() - features[:, _AGREE].sum())),
        "disagreement_rate": d,
        "flip_rate": eps,
        "flip_rate_reason": flip_rate_reason(d, k),
        "ceiling": None if eps is None else 1.0 - eps,
        "kappa": kappa_between_copies(counts),
    }
    names = ["disagreement_rate", "flip_rate", "ceiling", "kappa"]
    if labels.kind == "ordinal":
        result["mean_abs_grade_diff"] = _none_if_nan(point["mean_abs_grade_diff"])
        names.append("mean_abs_grade_diff")
    for name in names:
        result[f"{name}_ci"] = None
    result["group_weighted"] = group_weighted_noise(counts, k, n_boot=n_boot, seed=seed)
    result["largest_groups_pair_share"] = largest_group_pair_shares(counts)
    if n_pairs == 0 or n_boot == 0:
        return result
    boot = stats_from_totals(bootstrap_totals(features, n_boot, seed))
    boot_eps = flip_rates(boot["disagreement"], k)
    result["disagreement_rate_ci"] = interval(boot["disagreement"])
    if eps is not None:
        result["flip_rate_ci"] = interval(boot_eps)
        result["ceiling_ci"] = interval(1.0 - boot_eps)
    if result["kappa"] is not None:
        result["kappa_ci"] = interval(boot["kappa"])
    if labels.kind == "ordinal":
        result["mean_abs_grade_diff_ci"] = interval(boot["mean_abs_grade_diff"])
    return result


def group_weighted_noise(counts: np.ndarray, k: int, *, n_boot: int, seed: int | Sequence[int]) -> dict:
    """d, ε and the ceiling with each duplicate group counted once: d is the mean over groups of
    the share of the group's pairs that disagree (eq. 1 applies to each group alone), with a
    95% interval from ``n_boot`` resamples of whole groups. None values without groups."""
    counts = np.asarray(counts, dtype=float)
    features = group_features(counts)
    result: dict = {"n_groups": int(counts.shape[0])}
    for name in ("disagreement_rate", "flip_rate", "ceiling"):
        result[name] = result[f"{name}_ci"] = None
    if counts.shape[0] == 0:
        return result
    rates = 1.0 - features[:, _AGREE] / features[:, _PAIRS]  # [n_groups] each group's own d
    d = float(rates.mean())
    eps = flip_rate_from_disagreement(d, k)
    result.update(disagreement_rate=d, flip_rate=eps, ceiling=None if eps is None else 1.0 - eps)
    if n_boot:
        per_group = np.stack([rates, np.ones_like(rates)], axis=1)  # resample sums: Σ rates, n groups
        totals = bootstrap_totals(per_group, n_boot, seed)
        boot_d = totals[:, 0] / totals[:, 1]
        result["disagreement_rate_ci"] = interval(boot_d)
        if eps is not None:
            boot_eps = flip_rates(boot_d, k)
            result["flip_rate_ci"] = interval(boot_eps)
            result["ceiling_ci"] = interval(1.0 - boot_eps)
    return result


def largest_group_pair_shares(counts: np.ndarray, top: int = 3) -> list[float]:
    """Share of all pairs held by the largest 1, 2, …, ``top`` groups (cumulative, by pairs)."""
    pairs = np.sort(group_features(np.asarray(counts, dtype=float))[:, _PAIRS])[::-1]
    total = pairs.sum()
    if total == 0:
        return []
    return [float(x) for x in np.cumsum(pairs[:top]) / total]


def homogeneity_test(table: Mapping[str, tuple[int, int]]) -> dict:
    """Is d the same in every split? Pearson chi-square test of homogeneity.

    ``table`` maps split name → (disagreeing pairs, agreeing pairs); splits without pairs are
    left out. The test (scipy ``chi2_contingency``, no Yates correction so the statistic is
    the plain Pearson sum for any number of splits) compares each split's share of
    disagreeing pairs with the pooled share. Pairs within a group are not independent, so
    with large groups the p-value is optimistic. statistic and p_value are None when fewer
    than 2 splits have pairs; when every pair in every split agrees (or every pair
    disagrees) the splits are identical: statistic 0, p-value 1.
    """
    rows = {name: (int(a), int(b)) for name, (a, b) in table.items() if a + b > 0}
    result: dict = {"splits": sorted(rows), "statistic": None, "p_value": None, "dof": None}
    if len(rows) < 2:
        result["reason"] = "fewer than 2 splits have duplicate pairs: nothing to compare"
        return result
    observed = np.array([rows[name] for name in result["splits"]], dtype=float)
    result["dof"] = len(rows) - 1
    if (observed.sum(axis=0) == 0).any():
        result.update(statistic=0.0, p_value=1.0)
        return result
    statistic, p_value, _, _ = chi2_contingency(observed, correction=False)
    result.update(statistic=float(statistic), p_value=float(p_value))
    return result
