"""The matched-data decomposition of what reasoning distillation costs (or buys), from
predictions files (pure functions).

Three models are evaluated on the same split: the decomposition runs on whatever split's
predictions it is given (the ladder's, ``labelrl.ladder.analysis``, on the holdout):

- ``direct_all``: direct SFT on every training item;
- ``direct_survivors``: direct SFT on exactly the items whose teacher trace survived
  rejection (``labelrl sft --only-ids-from TRACES``), the matched control;
- ``cot``: CoT-SFT on the same survivors (``labelrl sft --mode reasoning --traces TRACES``).

The rejection filter changes two things at once, the data (hard items thin out) and the
objective (reasoning instead of a direct answer); the matched control separates them:

    filter effect    = BA(direct_all) − BA(direct_survivors)
    objective effect = BA(direct_survivors) − BA(cot)

so BA(direct_all) − BA(cot) = filter effect + objective effect exactly (positive = a loss).
BA is balanced accuracy (an unparsed answer counts as wrong). Only items all three files
hold are compared (joined on id, answer keys must agree). Intervals are paired percentile
bootstrap 95% intervals: each replicate resamples the items once and recomputes every BA and
both effects on the same draw, so the effects' intervals account for the models being
scored on the same items.

**Regressions** are items ``direct_survivors`` got right and ``cot`` got wrong (the matched
direct model is the one the objective effect compares with), grouped by that direct model's
confidence band (``labelrl.distill.reject.confidence_band``; ``unscored`` without scores).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from labelrl.distill.reject import CONFIDENCE_EDGES, band_name, confidence_band, item_confidence
from labelrl.evaluate.io import Predictions
from labelrl.evaluate.metrics import bootstrap_weights, encode, metrics_from_weights
from labelrl.types import canonical_label

ROLES = ("direct_all", "direct_survivors", "cot")

__all__ = ["ROLES", "align", "compare_models", "regressions"]


def align(preds: Sequence[Predictions], names: Sequence[str]) -> tuple[list[str], list[Predictions]]:
    """The ids every table holds (in the first table's order) and each table restricted to them."""
    common = set(preds[0].ids)
    for p in preds[1:]:
        common &= set(p.ids)
    if not common:
        raise ValueError(f"{', '.join(names)} share no item id: evaluate all three models on the same split")
    ids = [i for i in preds[0].ids if i in common]
    out = []
    for p, name in zip(preds, names):
        where = {i: r for r, i in enumerate(p.ids)}
        taken = p.take([where[i] for i in ids])
        differ = [i for i, a, b in zip(ids, taken.y_true, out[0].y_true if out else taken.y_true)
                  if p.labels.normalise(a) != p.labels.normalise(b)]
        if differ:
            raise ValueError(f"{name} disagrees with {names[0]} on the label of {len(differ)} item(s) (e.g. "
                             f"{differ[0]!r}): they were scored against different answer keys")
        out.append(taken)
    return ids, out


def regressions(ids: Sequence[str], y_true: Sequence[str], direct_pred: Sequence[str | None],
                cot_pred: Sequence[str | None], confidence: dict[str, float]) -> dict:
    """Items the direct model got right and the CoT model got wrong, grouped by the direct
    model's confidence band: ``{"n", "ids", "by_band": {band: {"n_direct_right", "n_regressed", "rate"}}}``."""
    order = [band_name(k) for k in range(len(CONFIDENCE_EDGES) + 1)] + ["unscored"]
    bands: dict[str, list[int]] = {}
    regressed = []
    for i, t, d, c in zip(ids, y_true, direct_pred, cot_pred):
        if d is None or canonical_label(d) != canonical_label(t):
            continue
        band = confidence_band(confidence[i]) if i in confidence else "unscored"
        lost = c is None or canonical_label(c) != canonical_label(t)
        bands.setdefault(band, []).append(int(lost))
        if lost:
            regressed.append(i)
    by_band = {b: {"n_direct_right": len(bands[b]), "n_regressed": sum(bands[b]),
                   "rate": sum(bands[b]) / len(bands[b])} for b in order if b in bands}
    return {"n": len(regressed), "ids": regressed, "by_band": by_band}


def _ba(weights: np.ndarray, preds: Sequence[Predictions]) -> list[np.ndarray]:
    return [metrics_from_weights(weights, encode(p.y_true, p.y_pred, p.labels))["balanced_accuracy"] for p in preds]


def _ci(values: np.ndarray) -> list[float] | None:
    values = values[np.isfinite(values)]
    return [float(v) for v in np.percentile(values, [2.5, 97.5])] if len(values) else None


def compare_models(direct_all: Predictions, direct_survivors: Predictions, cot: Predictions, *,
                   names: Sequence[str] = ROLES, n_boot: int = 1000, seed: int = 0) -> dict:
    """BA of each model with intervals, the two effects with paired intervals, and the regressions
    (see the module docstring). ``names`` label the three inputs in messages and output."""
    if n_boot < 0:
        raise ValueError(f"--n-boot {n_boot}: the number of bootstrap resamples must be 0 or more")
    ids, preds = align([direct_all, direct_survivors, cot], names)
    ba = [float(v[0]) for v in _ba(np.ones((1, len(ids))), preds)]
    draws: list[list[np.ndarray]] = [[], [], []]
    for weights in (bootstrap_weights(len(ids), n_boot, seed) if n_boot else []):
        for k, values in enumerate(_ba(weights, preds)):
            draws[k].append(values)
    boot = [np.concatenate(d) if d else np.array([]) for d in draws]
    models = {role: {"name": name, "balanced_accuracy": ba[k], "balanced_accuracy_ci": _ci(boot[k]) if n_boot else None}
              for k, (role, name) in enumerate(zip(ROLES, names))}
    effects = {
        "filter_effect": ba[0] - ba[1],
        "filter_effect_ci": _ci(boot[0] - boot[1]) if n_boot else None,
        "objective_effect": ba[1] - ba[2],
        "objective_effect_ci": _ci(boot[1] - boot[2]) if n_boot else None,
        "total_effect": ba[0] - ba[2],
    }
    confidence = item_confidence(preds[1].ids, preds[1].scores())
    regressed = regressions(ids, preds[1].y_true, preds[1].y_pred, preds[2].y_pred, confidence)
    return {"n": len(ids), "models": models, **effects, "regressions": regressed,
            "bootstrap": {"n_boot": n_boot, "seed": seed, "interval": "paired percentile 95%, items resampled"}}
