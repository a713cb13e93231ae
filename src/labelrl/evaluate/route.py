"""Routing between two models: what an oracle could gain, and what a confidence cascade gains.

* **Oracle**: per example, whichever of A and B is right (an upper bound no router reaches
  without the labels).
* **Confidence cascade**: A answers, except the examples whose A-confidence falls in a band
  [lo, hi), which go to B. Confidence is A's top-label probability (binary: max(p, 1 − p)).
  Every band on a grid of edges is tried; each reports the share of traffic routed and the
  change in accuracy and balanced accuracy against A alone. The last edge is 1 and a band
  ending there includes 1. Picking the best band on the same rows is itself a selection:
  confirm it on other data.
* **Disagreements** (A and B answer differently; two unparsed answers agree), broken down
  by A's confidence band and, given a ``labelrl audit --json`` file, by label ambiguity: an
  example is ambiguous when its id is in one of the audit's ``conflicting_groups``
  (duplicates carrying different labels). When most disagreements where B is right sit on
  ambiguous items, the oracle's gain is label noise that no router can collect.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from labelrl.evaluate.io import Predictions, join_on_id

GRID_STEPS = 10  # cascade grid: 11 edges from 1/K to 1
DISAGREEMENT_BANDS = 5


def balanced_accuracy(correct: np.ndarray, true: np.ndarray, k: int) -> float:
    """Mean over the labels present in ``true`` of the share answered correctly."""
    onehot = np.eye(k)[true]  # [N, K]
    counts = onehot.sum(axis=0)
    hits = (onehot * correct[:, None]).sum(axis=0)
    present = counts > 0
    return float((hits[present] / counts[present]).mean())


def _scores_summary(correct: np.ndarray, true: np.ndarray, k: int) -> dict:
    return {"accuracy": float(correct.mean()), "balanced_accuracy": balanced_accuracy(correct, true, k)}


def confidence_edges(k: int, steps: int) -> np.ndarray:
    # Rounded so an edge meant to be 0.6 is 0.6, not 0.6000000000000001.
    return np.round(np.linspace(1.0 / k, 1.0, steps + 1), 12)


def _in_band(conf: np.ndarray, lo: float, hi: float, last: bool) -> np.ndarray:
    return (conf >= lo) & ((conf <= hi) if last else (conf < hi))


def read_audit_ambiguous(path: str | Path) -> set[str]:
    """Ids in the ``conflicting_groups`` of a ``labelrl audit --json`` file."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--audit {path}: no such file; write one with `labelrl audit DATA --json {path}`")
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
        groups = report["conflicting_groups"]
        return {str(i) for group in groups for i in group["ids"]}
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"--audit {path}: not a `labelrl audit --json` report ({exc!r}); it needs conflicting_groups with ids") from None


def cascade_grid(conf: np.ndarray, correct_a: np.ndarray, correct_b: np.ndarray, true: np.ndarray, k: int,
                 steps: int = GRID_STEPS) -> list[dict]:
    """Every band [lo, hi) on the edge grid: routed share and Δ metrics against A alone."""
    edges = confidence_edges(k, steps)
    base = _scores_summary(correct_a, true, k)
    bands = []
    for i, lo in enumerate(edges[:-1]):
        for j in range(i + 1, len(edges)):
            hi = edges[j]
            routed = _in_band(conf, lo, hi, last=j == len(edges) - 1)
            result = _scores_summary(np.where(routed, correct_b, correct_a), true, k)
            bands.append({
                "lo": float(lo), "hi": float(hi), "n_routed": int(routed.sum()), "share_routed": float(routed.mean()),
                **result,
                "delta_accuracy": result["accuracy"] - base["accuracy"],
                "delta_balanced_accuracy": result["balanced_accuracy"] - base["balanced_accuracy"],
            })
    return bands


def frontier(bands: list[dict]) -> list[dict]:
    """The bands that beat A alone and that no band beats with less traffic: sorted by share
    routed, each has a larger Δ balanced accuracy than every band before it (and than 0)."""
    out, best = [], 0.0
    for band in sorted(bands, key=lambda b: (b["share_routed"], -b["delta_balanced_accuracy"])):
        if band["delta_balanced_accuracy"] > best + 1e-12:
            out.append(band)
            best = band["delta_balanced_accuracy"]
    return out


def _disagreement_row(mask: np.ndarray, disagree: np.ndarray, correct_a: np.ndarray, correct_b: np.ndarray) -> dict:
    d = mask & disagree
    n = int(d.sum())
    return {
        "n": int(mask.sum()), "n_disagree": n,
        "disagree_rate": float(d.sum() / mask.sum()) if mask.any() else None,
        "a_right": int((d & correct_a).sum()), "b_right": int((d & correct_b).sum()),
        "neither_right": int((d & ~correct_a & ~correct_b).sum()),
        "b_gain": int((d & correct_b & ~correct_a).sum()),  # what the oracle gains over A here
    }


def disagreements(conf, disagree, correct_a, correct_b, k: int, ids: list[str], ambiguous: set[str] | None) -> dict:
    """Disagreements overall, by A's confidence band, and (with an audit) by label ambiguity."""
    edges = confidence_edges(k, DISAGREEMENT_BANDS)
    everything = np.ones_like(disagree)
    out = {**_disagreement_row(everything, disagree, correct_a, correct_b), "by_confidence": [], "by_ambiguity": None}
    for i in range(DISAGREEMENT_BANDS):
        mask = _in_band(conf, edges[i], edges[i + 1], last=i == DISAGREEMENT_BANDS - 1)
        out["by_confidence"].append({"lo": float(edges[i]), "hi": float(edges[i + 1]),
                                     **_disagreement_row(mask, disagree, correct_a, correct_b)})
    if ambiguous is not None:
        amb = np.array([i in ambiguous for i in ids])
        out["by_ambiguity"] = [
            {"group": "ambiguous (in a conflicting duplicate group)", **_disagreement_row(amb, disagree, correct_a, correct_b)},
            {"group": "unambiguous", **_disagreement_row(~amb, disagree, correct_a, correct_b)},
        ]
        gain = out["b_gain"]
        out["b_gain_share_ambiguous"] = out["by_ambiguity"][0]["b_gain"] / gain if gain else None
    return out


def _aligned_predictions(a: Predictions, b: Predictions, rows_b: list[int]) -> list[str | None]:
    out = []
    for r in rows_b:
        answer = b.y_pred[r]
        label = None if answer is None else a.labels.normalise(answer)
        if answer is not None and label is None:
            raise ValueError(f"B predicts {answer!r}, which is not one of A's labels {list(a.labels.labels)}; route between models of the same task")
        out.append(label)
    return out


def route(a: Predictions, b: Predictions, *, audit: str | Path | None = None, steps: int = GRID_STEPS) -> dict:
    """Oracle, cascade grid and disagreement breakdown for A (scored) and B (see module docstring)."""
    scores = a.scores()
    if scores is None:
        raise ValueError(f"{a.info.get('source', 'A')}: no score column; the cascade routes on A's confidence, so A must be a scored model (pass the scored predictions first)")
    rows_a, rows_b = join_on_id(a, b, "A and B")
    k, labels = a.labels.k, a.labels
    true = np.array([labels.index(a.y_true[r]) for r in rows_a])
    pred_a = [a.y_pred[r] for r in rows_a]
    pred_b = _aligned_predictions(a, b, rows_b)
    correct_a = np.array([p is not None and labels.index(p) == t for p, t in zip(pred_a, true)])
    correct_b = np.array([p is not None and labels.index(p) == t for p, t in zip(pred_b, true)])
    conf = scores[rows_a].max(axis=1)
    disagree = np.array([(None if p is None else labels.normalise(p)) != q for p, q in zip(pred_a, pred_b)])
    bands = cascade_grid(conf, correct_a, correct_b, true, k, steps)
    ids = [a.ids[r] for r in rows_a]
    ambiguous = read_audit_ambiguous(audit) if audit is not None else None
    notes = []
    if ambiguous is not None and not ambiguous & set(ids):
        notes.append("no evaluated id is in a conflicting duplicate group of the audit: were both made from the same data?")
    best = max(bands, key=lambda x: (x["delta_balanced_accuracy"], -x["share_routed"]))
    return {
        "a": {"source": a.info.get("source"), **_scores_summary(correct_a, true, k)},
        "b": {"source": b.info.get("source"), **_scores_summary(correct_b, true, k)},
        "n_joined": len(rows_a), "n_only_a": a.n - len(rows_a), "n_only_b": b.n - len(rows_b),
        "oracle": _scores_summary(correct_a | correct_b, true, k),
        "cascade": {"confidence": "A's top-label probability", "edges": [float(e) for e in confidence_edges(k, steps)],
                    "bands": bands, "frontier": frontier(bands), "best": best},
        "disagreement": disagreements(conf, disagree, correct_a, correct_b, k, ids, ambiguous),
        "notes": notes,
    }


def routed_predictions(a: Predictions, b: Predictions, lo: float, hi: float, *, name: str = "routed") -> Predictions:
    """The cascade's hard predictions for the band [lo, hi) (hi = 1 included): B's answer where
    A's confidence falls in the band, A's elsewhere, on the ids both hold."""
    from labelrl.evaluate.io import predictions_table

    rows_a, rows_b = join_on_id(a, b, "A and B")
    scores = a.scores()
    if scores is None:
        raise ValueError(f"{a.info.get('source', 'A')}: no score column; a cascade routes on A's confidence")
    conf = scores[rows_a].max(axis=1)
    routed = _in_band(conf, lo, hi, last=hi >= 1.0)
    pred_b = _aligned_predictions(a, b, rows_b)
    answers = [pb if r else a.y_pred[ra] for r, pb, ra in zip(routed, pred_b, rows_a)]
    status = ["ok" if x is not None else "no_answer" for x in answers]
    table = predictions_table([a.ids[r] for r in rows_a], [a.y_true[r] for r in rows_a], answers, status, a.labels)
    return Predictions(table, a.labels, {"source": name, "routed_band": [lo, hi], "routed_share": float(routed.mean())})
