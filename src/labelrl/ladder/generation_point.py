"""The operating point a user without logit access gets: a direct RL arm's greedy generations.

A direct RL arm is scored twice on the holdout (``labelrl.ladder.evaluations``): by label-token
scores (argmax, which needs the logits) and by its own greedy generations parsed strictly (the
``-generate`` evaluations, ``eval/ARM-holdout-generate.*``). The paired verdicts and the sweep's
first verdict use the scores; this module states the generated answers' point:

* per label, recall (share of the label's items answered with it; an unparsed answer is a miss)
  and precision (share of the answers of that label that are right), each with a 95% Wilson
  interval (Wilson 1927) over the holdout items; the unparsed count;
* whether the val point of the generated answers (``eval/ARM-val-generate.*``) is a threshold on
  the SFT parent's val scores: the sweep (``labelrl.evaluate.sweep``) compares it as
  ``"ARM (greedy generation)"``, and its verdict ("on the curve" / "above the curve" / "below the
  curve", with ΔTPR at its FPR and the interval, or "uninformative" …) is quoted.

With several seeds each run's point is kept; the verdict text gives the mean over the seeds of
each figure and a tally of the sweep's verdicts over the seeds.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Sequence

from labelrl.ladder.layout import eval_paths

GENERATE_TAG = "-generate"


def generated_name(run: str) -> str:
    """The name the sweep gives a run's greedy-generation operating point."""
    return f"{run} (greedy generation)"


def wilson(k: int, n: int) -> list[float] | None:
    """The 95% Wilson score interval of k successes in n (Wilson 1927); None when n = 0."""
    from scipy.stats import binomtest

    if n == 0:
        return None
    ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    return [float(ci.low), float(ci.high)]


def label_point(y_true: Sequence[str], y_pred: Sequence[str | None], labels: Sequence[str]) -> dict:
    """Per label {recall, recall_ci, precision, precision_ci, n_true, n_answered}, and n_unparsed.
    recall = #(true L, answered L) / #(true L); precision = #(true L, answered L) / #(answered L);
    None where the denominator is 0. An unparsed answer (None) is a miss and nobody's answer."""
    per_label = {}
    for label in labels:
        hits = sum(t == label and p == label for t, p in zip(y_true, y_pred))
        n_true = sum(t == label for t in y_true)
        n_answered = sum(p == label for p in y_pred)
        per_label[label] = {"recall": hits / n_true if n_true else None, "recall_ci": wilson(hits, n_true),
                            "precision": hits / n_answered if n_answered else None,
                            "precision_ci": wilson(hits, n_answered), "n_true": n_true, "n_answered": n_answered}
    return {"n": len(y_true), "n_unparsed": sum(p is None for p in y_pred), "labels": per_label}


def is_direct_rl(st: dict) -> bool:
    """A type ``rl`` arm trained in direct mode (its answers are scored by label tokens too)."""
    return st.get("type") == "rl" and (st.get("config") or {}).get("mode", "direct") == "direct"


def run_point(task_dir: Path, run: str) -> dict | None:
    """The run's holdout generation point, from ``eval/RUN-holdout-generate.parquet``; None without it."""
    from labelrl.evaluate.io import read_predictions

    path = eval_paths(task_dir, run, "holdout" + GENERATE_TAG)[0]
    if not path.is_file():
        return None
    pred = read_predictions(path)
    return label_point(pred.y_true, pred.y_pred, list(pred.labels.labels))


def generation_points(task_dir: Path, arms: dict[str, dict], grouped: dict[str, list[str]]) -> dict:
    """Per direct RL arm with generated holdout answers: each run's point (``label_point``)."""
    out = {}
    for g, runs in grouped.items():
        if not is_direct_rl(arms[runs[0]]):
            continue
        points = {r: run_point(task_dir, r) for r in runs}
        if all(p is not None for p in points.values()):
            out[g] = points
    if not out:
        return {"note": "no direct RL arm has greedy-generation evaluations (task generate_eval: false, or none ran)"}
    return {"arms": out}


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def point_words(points: dict[str, dict]) -> str:
    """"recall no 0.750 [0.41, 0.93], yes 0.500 […]; precision …; 1 of 8 unparsed" (one run), or the
    means over the runs' figures ("mean over 2 seeds")."""
    runs = list(points.values())
    labels = list(runs[0]["labels"])

    def figure(label: str, key: str) -> str:
        if len(runs) == 1:
            v, ci = runs[0]["labels"][label][key], runs[0]["labels"][label][f"{key}_ci"]
            return f"{label} —" if v is None else f"{label} {v:.3f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")
        v = _mean([r["labels"][label][key] for r in runs])
        return f"{label} —" if v is None else f"{label} {v:.3f}"

    seeds = "" if len(runs) == 1 else f" (means over {len(runs)} seeds)"
    unparsed = sum(r["n_unparsed"] for r in runs)
    return (f"recall {', '.join(figure(x, 'recall') for x in labels)}; "
            f"precision {', '.join(figure(x, 'precision') for x in labels)}{seeds}; "
            f"{unparsed} of {sum(r['n'] for r in runs)} answers unparsed")


def sweep_tally(found: list[dict]) -> str:
    """How many seeds got each sweep verdict, in the order of ``VERDICT_WORDS`` ("on the curve"
    first): "on the curve in 1, uninformative in 1 of 2 seeds" (a count of "on the curve" alone
    would read an uninformative seed as a point off the curve)."""
    from labelrl.evaluate.sweep_distance import VERDICT_WORDS, verdict_word

    heads = [verdict_word(v["verdict"]) for v in found]
    rank = {w: i for i, w in enumerate(VERDICT_WORDS)}
    order = sorted(set(heads), key=lambda h: (rank.get(h, len(rank)), h))
    return ", ".join(f"{h} in {heads.count(h)}" for h in order) + f" of {len(found)} seeds"


def sweep_words(runs: list[str], sweeps: dict) -> str | None:
    """The sweep's verdict on the runs' generated val points (one run: its verdict; several: the tally)."""
    found = [sweeps[generated_name(r)] for r in runs if generated_name(r) in sweeps]
    if not found:
        return None
    if len(found) == 1:
        return f"its val point {found[0]['verdict']}"
    return f"its val point against a threshold on the SFT model: {sweep_tally(found)}"


def add_generation_points(verdicts: list[dict], made: dict | None, sweeps: dict) -> None:
    """Give each direct RL arm's verdict ``generation`` ({points, sweep} or None) and append its words."""
    by_arm = (made or {}).get("arms") or {}
    for v in verdicts:
        points = by_arm.get(v["arm"])
        if points is None:
            v["generation"] = None
            continue
        sweep = sweep_words(list(points), sweeps)
        v["generation"] = {"points": points, "sweep": sweep}
        v["text"] += ("; greedy generation, no logits (holdout): " + point_words(points)
                      + (f"; {sweep}" if sweep else "; its val point not swept (binary tasks with a scored SFT parent only)"))
