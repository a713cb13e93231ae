"""Survival statistics of rejection-sampled traces, computed from files (pure functions).

An item **survives** when at least one of its traces was kept. ``survival_summary`` reports:

- ``overall``: items, survivors, survival rate, mean attempts used, kept traces;
- ``per_label``: the same counts for each reference label;
- ``by_confidence`` (when the direct SFT model's predictions are given): survival in bands of
  that model's confidence on the item, max over labels of its probability (max(p, 1 − p)
  for a binary task), bands ``CONFIDENCE_EDGES``: [0, 0.6), [0.6, 0.7), …, [0.9, 1.0];
  items the predictions file lacks, or without scores, are counted under ``unscored``;
- ``trace_chars``: the length distribution of kept traces in **characters** (not tokens:
  the summary needs no tokenizer, so it can be rebuilt from the file alone): n, mean, min,
  p50, p90, max;
- ``attempt_status`` (when attempt records are given): how many attempts had each parse
  status, and how many matched.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable, Mapping, Sequence

import numpy as np

CONFIDENCE_EDGES = (0.6, 0.7, 0.8, 0.9)  # band k holds confidences in [edge[k-1], edge[k])

__all__ = ["CONFIDENCE_EDGES", "band_name", "confidence_band", "item_confidence", "length_stats",
           "survival_counts", "survival_summary"]


def band_name(k: int, edges: Sequence[float] = CONFIDENCE_EDGES) -> str:
    """``"[0.60, 0.70)"`` style name of band ``k`` (the last band is closed at 1)."""
    lo = 0.0 if k == 0 else edges[k - 1]
    if k == len(edges):
        return f"[{lo:.2f}, 1.00]"
    return f"[{lo:.2f}, {edges[k]:.2f})"


def confidence_band(confidence: float, edges: Sequence[float] = CONFIDENCE_EDGES) -> str:
    """The band name of one confidence in [0, 1]."""
    return band_name(int(np.searchsorted(np.asarray(edges), confidence, side="right")), edges)


def item_confidence(ids: Sequence[str], scores: np.ndarray | None) -> dict[str, float]:
    """Item id → the model's confidence, max over labels of its probability; empty without scores."""
    if scores is None:
        return {}
    return {i: float(row.max()) for i, row in zip(ids, np.asarray(scores, dtype=np.float64))}


def survival_counts(records: Iterable[Mapping]) -> dict:
    """``{n_items, n_survived, survival_rate, mean_attempts_used, n_kept_traces}`` of traces
    records (several kept records of one id count as one surviving item)."""
    survived: dict[str, bool] = {}
    attempts: dict[str, int] = {}
    kept = 0
    for r in records:
        survived[r["id"]] = survived.get(r["id"], False) or bool(r["kept"])
        attempts[r["id"]] = int(r["attempts_used"])
        kept += bool(r["kept"])
    n = len(survived)
    n_survived = sum(survived.values())
    return {"n_items": n, "n_survived": n_survived, "survival_rate": n_survived / n if n else None,
            "mean_attempts_used": sum(attempts.values()) / n if n else None, "n_kept_traces": kept}


def length_stats(lengths: Sequence[int]) -> dict:
    """n, mean, min, p50, p90, max of a list of lengths (None values when empty)."""
    if not lengths:
        return {"n": 0, "mean": None, "min": None, "p50": None, "p90": None, "max": None}
    a = np.asarray(lengths, dtype=np.float64)
    return {"n": len(a), "mean": float(a.mean()), "min": int(a.min()), "p50": float(np.percentile(a, 50)),
            "p90": float(np.percentile(a, 90)), "max": int(a.max())}


def survival_summary(records: Sequence[Mapping], *, confidence: Mapping[str, float] | None = None,
                     attempts: Iterable[Mapping] | None = None) -> dict:
    """The summary of the module docstring from traces records (and optionally the direct
    model's per-item confidence, ``item_confidence``, and the journal's attempt records)."""
    by_label: dict[str, list[Mapping]] = {}
    for r in records:
        by_label.setdefault(str(r["label"]), []).append(r)
    out: dict = {"overall": survival_counts(records),
                 "per_label": {label: survival_counts(rs) for label, rs in sorted(by_label.items())}}
    if confidence is not None:
        bands: dict[str, list[Mapping]] = {}
        for r in records:
            c = confidence.get(r["id"])
            bands.setdefault("unscored" if c is None else confidence_band(c), []).append(r)
        order = [band_name(k) for k in range(len(CONFIDENCE_EDGES) + 1)] + ["unscored"]
        out["by_confidence"] = {b: survival_counts(bands[b]) for b in order if b in bands}
        out["confidence"] = "max over labels of the direct model's probability; bands " + ", ".join(order[:-1])
    out["trace_chars"] = length_stats([len(r["trace"]) for r in records if r["kept"]])
    if attempts is not None:
        attempts = list(attempts)
        out["attempt_status"] = dict(sorted(Counter(str(a["status"]) for a in attempts).items()))
        out["attempts_matched"] = sum(bool(a["matched"]) for a in attempts)
        out["attempts_total"] = len(attempts)
    return out
