"""Label noise from individual raters: how often one rater's label flips, and the aggregate's.

Input is one list of ratings per item (VADER: every rater's integer score −4..+4). A
:class:`RatingMap` turns a rating, or a mean of ratings, into a label. Two estimates:

* single rater: two raters of the same item disagree with probability d; inverting eq. 1
  of :mod:`labelrl.audit.noise` gives the flip rate ε of one rater's label.
* aggregated label, by split-half resampling: each item's raters are shuffled and cut into
  two halves of ⌊n/2⌋; each half's mean rating is mapped to a label; the halves disagree
  with probability d_half, which inverts to ε_half. That is the noise of a label made from
  n/2 raters. The dataset's label averages all n raters, whose mean spreads less, so its
  noise is about ε_half or less: ε_half is an approximate upper bound and 1 − ε_half an
  approximate lower bound on the accuracy ceiling.

Items weigh equally in both estimates (mean over items of each item's pairwise
disagreement): the number of raters varies (15–99 in VADER) and the quantity of interest is
the label of a random item; weighting pairs would let heavily rated items dominate.
Intervals resample items.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from labelrl.audit.noise import (
    bootstrap_counts,
    flip_rate_from_disagreement,
    flip_rate_reason,
    flip_rates,
    interval,
)
from labelrl.data.builtin import GRADE_CUTS, GRADE_LABELS
from labelrl.types import Example, LabelSpace, canonical_label

NO_LABEL = -1


@dataclass(frozen=True)
class RatingMap:
    """Maps ratings (or mean ratings) to label indices; ``NO_LABEL`` (−1) where none applies.

    ``classify`` takes an array of any shape (NaN allowed) and returns int indices into
    ``labels`` of the same shape.
    """

    name: str
    labels: tuple[str, ...]
    classify: Callable[[np.ndarray], np.ndarray]

    def label(self, rating: float) -> str | None:
        index = int(self.classify(np.array([rating], dtype=float))[0])
        return None if index == NO_LABEL else self.labels[index]


def _vader_grade_index(ratings: np.ndarray) -> np.ndarray:
    # The loader's grade rule on the VADER scale −4..+4 (Hutto & Gilbert 2014), one definition
    # (GRADE_CUTS): r < −2 → "1"; −2 ≤ r < −0.5 → "2"; −0.5 ≤ r ≤ 0.5 → "3"; 0.5 < r ≤ 2 → "4";
    # r > 2 → "5". Counting the cuts a rating passes gives the grade index.
    very_neg, neg, pos, very_pos = GRADE_CUTS
    r = np.asarray(ratings, dtype=float)
    index = (r >= very_neg).astype(int) + (r >= neg) + (r > pos) + (r > very_pos)
    return np.where(np.isnan(r), NO_LABEL, index)


def _sign_index(ratings: np.ndarray) -> np.ndarray:
    # The loader's polarity rule: r ≥ 0 → positive (1), r < 0 → negative (0); a neutral 0
    # counts as positive, as in labelrl.data.builtin.mean_to_polarity.
    r = np.asarray(ratings, dtype=float)
    return np.where(np.isnan(r), NO_LABEL, (r >= 0).astype(int))


VADER_GRADES = RatingMap("vader-grades", GRADE_LABELS, _vader_grade_index)


def sign_map(negative: str = "negative", positive: str = "positive") -> RatingMap:
    """Binary labels from the sign of a rating: ``positive`` for r ≥ 0, else ``negative``."""
    return RatingMap("sign", (negative, positive), _sign_index)


def rating_map_for(labels: LabelSpace) -> RatingMap | None:
    """The rating map matching a label space: grades "1".."5" → VADER cut points; binary →
    sign (the positive label for ratings ≥ 0); anything else → None."""
    folded = tuple(canonical_label(x) for x in labels.labels)
    if folded == VADER_GRADES.labels:
        return RatingMap(VADER_GRADES.name, labels.labels, VADER_GRADES.classify)
    if labels.kind == "binary":
        positive = labels.positive_label
        negative = next(x for x in labels.labels if x != positive)
        return sign_map(negative, positive)
    return None


def pad_ratings(ratings: Sequence[Sequence[float]]) -> np.ndarray:
    """[n_items, max raters] float matrix, NaN where an item has fewer raters."""
    width = max((len(r) for r in ratings), default=0)
    matrix = np.full((len(ratings), width), np.nan)
    for i, row in enumerate(ratings):
        matrix[i, : len(row)] = row
    return matrix


def item_disagreement(label_index: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per item: (rater pairs, disagreeing pairs) among ratings that carry a label.

    ``label_index`` is [n_items, max raters] with ``NO_LABEL`` for padding and unlabelled
    ratings. With m labelled ratings and c_a of them labelled a: pairs = m(m − 1)/2,
    disagreeing = pairs − Σ_a c_a(c_a − 1)/2.
    """
    counts = np.stack([(label_index == a).sum(axis=1) for a in range(k)], axis=1).astype(float)
    m = counts.sum(axis=1)
    pairs = m * (m - 1) / 2
    return pairs, pairs - (counts * (counts - 1) / 2).sum(axis=1)


def split_half_disagreement(
    ratings: np.ndarray, rating_map: RatingMap, *, n_repeats: int, rng: np.random.Generator
) -> np.ndarray:
    """Per item, the share of ``n_repeats`` random splits whose two half-means map to
    different labels (NaN for items with fewer than 2 raters, or no usable split).

    Each repeat shuffles every item's raters and compares the means of the first ⌊n/2⌋ and
    the next ⌊n/2⌋ (one rater is left out when n is odd).
    """
    n_items, width = ratings.shape
    present = ~np.isnan(ratings)
    half = (present.sum(axis=1) // 2)[:, None]  # [n_items, 1]
    column = np.arange(width)[None, :]
    first, second = column < half, (column >= half) & (column < 2 * half)
    outcomes = np.full((n_repeats, n_items), np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        for rep in range(n_repeats):
            keys = np.where(present, rng.random((n_items, width)), np.inf)
            shuffled = np.take_along_axis(ratings, np.argsort(keys, axis=1), axis=1)
            values = np.nan_to_num(shuffled)
            mean_a = (values * first).sum(axis=1) / half[:, 0]
            mean_b = (values * second).sum(axis=1) / half[:, 0]
            label_a, label_b = rating_map.classify(mean_a), rating_map.classify(mean_b)
            usable = (label_a != NO_LABEL) & (label_b != NO_LABEL)
            outcomes[rep] = np.where(usable, (label_a != label_b).astype(float), np.nan)
    usable_any = ~np.isnan(outcomes).all(axis=0)
    result = np.full(n_items, np.nan)
    result[usable_any] = np.nanmean(outcomes[:, usable_any], axis=0)
    return result


def _noise_block(per_item: np.ndarray, k: int, n_boot: int, rng: np.random.Generator) -> dict:
    """d as the mean of per-item values, ε, ceiling, each with an item-bootstrap interval."""
    values = per_item[np.isfinite(per_item)]
    d = float(values.mean()) if values.size else None
    eps = None if d is None else flip_rate_from_disagreement(d, k)
    block = {
        "disagreement_rate": d,
        "flip_rate": eps,
        "flip_rate_reason": flip_rate_reason(d, k),
        "ceiling": None if eps is None else 1.0 - eps,
        "disagreement_rate_ci": None,
        "flip_rate_ci": None,
        "ceiling_ci": None,
    }
    if d is None or n_boot == 0:
        return block
    boot_d = np.concatenate(
        [w @ values / values.size for w in bootstrap_counts(values.size, n_boot, rng)]
    )
    boot_eps = flip_rates(boot_d, k)
    block["disagreement_rate_ci"] = interval(boot_d)
    if eps is not None:
        block["flip_rate_ci"] = interval(boot_eps)
        block["ceiling_ci"] = interval(1.0 - boot_eps)
    return block


def rater_noise(
    examples: Sequence[Example],
    rating_map: RatingMap,
    *,
    n_boot: int = 1000,
    n_repeats: int = 20,
    seed: int = 0,
) -> dict:
    """Single-rater and aggregated-label noise from ``Example.meta["ratings"]``.

    Keys: rating_map, n_items (items with ≥ 2 ratings), n_rater_pairs, raters_per_item
    {min, median, max}, disagreement_rate, flip_rate, flip_rate_reason, ceiling (each with
    ``_ci``), label_reproduced_rate (share of items whose mean over all raters maps to the
    recorded label: a check that ``rating_map`` matches how the labels were made), and
    aggregated {method, n_repeats, raters_per_half_median, disagreement_rate, flip_rate,
    flip_rate_reason, ceiling, ``_ci`` siblings}.
    """
    if n_repeats < 1:
        raise ValueError(f"n_repeats={n_repeats}: split-half needs at least 1 random split")
    rated = _rated_examples(examples)
    k = len(rating_map.labels)
    ratings = pad_ratings([list(map(float, e.meta["ratings"])) for e in rated])
    # Separate streams, so the split-half estimate does not move when n_boot changes.
    single_rng, split_rng, aggregated_rng = (np.random.default_rng([seed, i]) for i in range(3))
    result = _single_rater_noise(rated, ratings, rating_map, n_boot, single_rng)
    n_raters = (~np.isnan(ratings)).sum(axis=1)
    halves = split_half_disagreement(ratings, rating_map, n_repeats=n_repeats, rng=split_rng)
    result["aggregated"] = {
        "method": (
            "split-half: each item's raters shuffled into two halves of n//2, each half's mean "
            "mapped to a label; noise of a label from n/2 raters, an approximate upper bound "
            "for the label from all n"
        ),
        "n_repeats": n_repeats,
        "raters_per_half_median": float(np.median(n_raters // 2)),
        **_noise_block(halves, k, n_boot, aggregated_rng),
    }
    return result


def _rated_examples(examples: Sequence[Example]) -> list[Example]:
    """The examples with at least two ratings; ValueError when there are none."""
    rated = [e for e in examples if len(e.meta.get("ratings") or ()) >= 2]
    if not rated:
        raise ValueError(
            "no example has 2 or more ratings in meta['ratings']: rater noise needs "
            "every rater's score per item"
        )
    return rated


def _single_rater_noise(rated: Sequence[Example], ratings: np.ndarray, rating_map: RatingMap, n_boot: int,
                        rng: np.random.Generator) -> dict:
    """Noise of one rater's label: disagreement between pairs of raters of an item, the raters per
    item, and whether the mean of all ratings reproduces the recorded label."""
    k = len(rating_map.labels)
    pairs, disagree = item_disagreement(rating_map.classify(ratings), k)
    with np.errstate(invalid="ignore", divide="ignore"):
        per_item = np.where(pairs > 0, disagree / pairs, np.nan)
    n_raters = (~np.isnan(ratings)).sum(axis=1)
    means = np.nanmean(ratings, axis=1)
    recorded = np.array(
        [rating_map.labels.index(e.label) if e.label in rating_map.labels else NO_LABEL for e in rated]
    )
    return {
        "rating_map": rating_map.name,
        "n_items": len(rated),
        "n_rater_pairs": int(pairs.sum()),
        "raters_per_item": {
            "min": int(n_raters.min()),
            "median": float(np.median(n_raters)),
            "max": int(n_raters.max()),
        },
        **_noise_block(per_item, k, n_boot, rng),
        "label_reproduced_rate": float(np.mean(rating_map.classify(means) == recorded)),
    }
