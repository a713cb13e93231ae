"""How stable an arm is over seeds and over its own training steps, and CoRPO against GRPO on it.

CoRPO claims steadier convergence than GRPO (Garg et al. 2025). With replicate seeds (task
``seeds: [..]``, runs ``ARM@sSEED``) three figures measure it, per arm with at least 2 runs:

* **spread over seeds**: the sample standard deviation (ddof = 1) of the runs' holdout balanced
  accuracy;
* **reward step change** (RL runs): the median over steps t of |r̄_{t+1} − r̄_t|, r̄_t the step's
  mean reward (``reward/mean`` in ``RUN_DIR/metrics.jsonl``, one record per step);
* **val step change** (RL runs with ``val_path.jsonl``, direct mode): the median over consecutive
  scored checkpoints of the change of val balanced accuracy (``labelrl.evaluate.val_path``; the
  checkpoints are ``checkpoint_every`` steps apart, the last one may be closer).

The median, not the mean, so one jump (a collapse, a recovery) does not stand for the run.

**CoRPO against GRPO.** Each CoRPO arm (estimator ``corpo``) is set against each GRPO-family arm
(estimator ``grpo`` or ``dr_grpo``: GRPO, DAPO, Dr. GRPO; Dr. GRPO differs from CoRPO in the
baseline only) trained from the same parent arm, paired by seed: per seed s the difference
CoRPO − GRPO of each step-change figure (negative: CoRPO steadier), their mean, how many seeds
are lower, and the exact two-sided sign test on the non-zero differences (Dixon & Mood 1946;
``scipy.stats.binomtest(k, n, 0.5)``). With fewer than 6 seeds the sign test cannot reach
p < 0.05 (2·0.5⁵ = 0.0625), so the words stay "no detectable difference": a claim of stability
needs seeds. The spreads over seeds are shown side by side, untested (a variance from 2 or 3
runs has no useful interval).

Written to ``analysis/stability.json``; each RL verdict line gets its figures (``add_stability``).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Sequence

from labelrl import metrics_keys as K
from labelrl.fileio import atomic_write_json, read_jsonl
from labelrl.ladder.kinds import RL_TYPES

STABILITY_FILE = "stability.json"
STEP_FIGURES = ("reward_step_change", "val_step_change")
CORPO, GRPO_FAMILY = "corpo", ("grpo", "dr_grpo")
SIGN_TEST_ALPHA = 0.05


def median_abs_change(values: Sequence[float | None]) -> float | None:
    """median_t |v_{t+1} − v_t| over the finite values in order; None with fewer than 2."""
    finite = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    if len(finite) < 2:
        return None
    return float(statistics.median(abs(b - a) for a, b in zip(finite, finite[1:])))


def seed_sd(values: Sequence[float]) -> float | None:
    """The sample standard deviation (ddof = 1) of the finite values; None with fewer than 2."""
    finite = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return float(statistics.stdev(finite)) if len(finite) >= 2 else None


def run_step_figures(run_dir: Path) -> dict:
    """One RL run's step changes (module docstring) from its metrics.jsonl and val_path.jsonl."""
    from labelrl.evaluate.val_path import read_val_path

    steps = sorted(read_jsonl(run_dir / "metrics.jsonl"), key=lambda r: r.get(K.STEP, 0))
    rewards = [r.get(K.REWARD_MEAN) for r in steps]
    val = [r.get("balanced_accuracy") for r in read_val_path(run_dir)]
    return {"reward_step_change": median_abs_change(rewards), "val_step_change": median_abs_change(val),
            "n_steps": len(rewards), "n_val_points": len(val)}


def seed_differences(a: dict[int, float | None], b: dict[int, float | None]) -> dict:
    """Per shared seed the difference a − b (seeds where either is None are left out), their mean,
    how many are below 0, and the exact two-sided sign test on the non-zero ones."""
    from scipy.stats import binomtest

    diffs = {s: a[s] - b[s] for s in sorted(set(a) & set(b)) if a[s] is not None and b[s] is not None}
    values = list(diffs.values())
    nonzero = [d for d in values if d != 0]
    lower = sum(d < 0 for d in values)
    p = float(binomtest(sum(d < 0 for d in nonzero), len(nonzero), 0.5).pvalue) if nonzero else None
    return {"by_seed": {str(s): d for s, d in diffs.items()}, "n_seeds": len(values),
            "mean": float(statistics.fmean(values)) if values else None, "n_lower": lower, "sign_test_p": p}


def difference_words(d: dict, what: str, a: str, b: str) -> str:
    """"median |Δreward| per step: corpo − grpo −0.012 (lower in 2 of 2 seeds; sign test p 0.50: no
    detectable difference)"."""
    if not d["n_seeds"]:
        return f"{what}: not measured for both on a shared seed"
    p = d["sign_test_p"]
    if p is not None and p < SIGN_TEST_ALPHA:
        words = f"{a} steadier" if d["mean"] < 0 else f"{a} less steady"
    else:
        words = "no detectable difference" + (" (fewer than 6 seeds cannot show one)" if d["n_seeds"] < 6 else "")
    p_text = "no non-zero difference" if p is None else f"sign test p {p:.2f}"
    return (f"{what}: {a} − {b} {d['mean']:+.4f} (lower in {d['n_lower']} of {d['n_seeds']} seeds; "
            f"{p_text}: {words})")


def estimator_family(st: dict) -> str | None:
    """``corpo``, ``grpo`` (the GRPO family of the module docstring) or None, from the resolved algorithm."""
    if st.get("type") != "rl":
        return None
    estimator = (st.get("algorithm") or {}).get("estimator")
    return CORPO if estimator == CORPO else "grpo" if estimator in GRPO_FAMILY else None


def arm_figures(task_dir: Path, arms: dict[str, dict], runs: list[str]) -> dict:
    """One replicated arm's figures: per run (by seed) its holdout BA and step changes; the spread."""
    per_run = {}
    for r in runs:
        st = arms[r]
        entry = {"seed": st.get("seed"), "holdout_balanced_accuracy": (st.get("holdout") or {}).get("balanced_accuracy")}
        if st["type"] in RL_TYPES:
            entry |= run_step_figures(task_dir / r)
        per_run[r] = entry
    out = {"type": arms[runs[0]]["type"], "runs": runs, "per_run": per_run,
           "holdout_balanced_accuracy_sd": seed_sd([e["holdout_balanced_accuracy"] for e in per_run.values()])}
    for key in STEP_FIGURES:
        values = [e[key] for e in per_run.values() if e.get(key) is not None]
        out[f"{key}_median_over_seeds"] = float(statistics.median(values)) if values else None
    return out


def _by_seed(figures: dict, key: str) -> dict[int, float | None]:
    return {e["seed"]: e.get(key) for e in figures["per_run"].values() if e["seed"] is not None}


def corpo_vs_grpo(arms: dict[str, dict], grouped: dict[str, list[str]], figures: dict[str, dict]) -> list[dict]:
    """Each CoRPO arm against each GRPO-family arm from the same parent arm, paired by seed."""
    def parents(g: str) -> set:
        return {arms[arms[r]["from"]].get("replicate_of") or arms[r]["from"] for r in grouped[g] if arms[r].get("from") in arms}

    family = {g: estimator_family(arms[runs[0]]) for g, runs in grouped.items() if g in figures}
    out = []
    for c in (g for g, f in family.items() if f == CORPO):
        for g in (g for g, f in family.items() if f == "grpo" and parents(g) == parents(c)):
            entry = {"a": c, "b": g, "parent": sorted(parents(c)),
                     "holdout_balanced_accuracy_sd": [figures[c]["holdout_balanced_accuracy_sd"],
                                                      figures[g]["holdout_balanced_accuracy_sd"]]}
            for key in STEP_FIGURES:
                entry[key] = seed_differences(_by_seed(figures[c], key), _by_seed(figures[g], key))
            out.append(entry)
    return out


def stability_analysis(task_dir: Path, arms: dict[str, dict], grouped: dict[str, list[str]]) -> dict:
    """The figures of every arm with at least 2 runs and the CoRPO-vs-GRPO comparisons, also saved
    as ``analysis/stability.json``; a note when no arm has 2 seeds."""
    replicated = {g: runs for g, runs in grouped.items() if len(runs) >= 2 and arms[runs[0]]["type"] != "threshold"}
    if not replicated:
        return {"note": "no arm has 2 or more seeds (task `seeds: [0, 1]`): stability over seeds is not measured"}
    figures = {g: arm_figures(task_dir, arms, runs) for g, runs in replicated.items()}
    out = {"arms": figures, "corpo_vs_grpo": corpo_vs_grpo(arms, grouped, figures)}
    path = task_dir / "analysis" / STABILITY_FILE
    atomic_write_json(path, out)
    return {"file": str(path), **out}


def _fmt(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def arm_words(f: dict) -> str:
    """"over 2 seeds: holdout BA sd 0.021; median |Δreward| per step 0.050; median |Δval BA| per checkpoint 0.010"."""
    n = len(f["runs"])
    words = f"stability over {n} seeds: holdout BA sd {_fmt(f['holdout_balanced_accuracy_sd'])}"
    if f["type"] in RL_TYPES:
        words += (f"; median |Δreward| per step {_fmt(f['reward_step_change_median_over_seeds'], 4)}"
                  f", median |Δval BA| per checkpoint {_fmt(f['val_step_change_median_over_seeds'], 4)} "
                  "(medians over seeds)")
    return words


def comparison_words(c: dict) -> str:
    """The CoRPO-vs-GRPO sentence: both step changes paired by seed, the spreads side by side."""
    a, b = c["a"], c["b"]
    sd_a, sd_b = c["holdout_balanced_accuracy_sd"]
    return (f"stability vs {b} (same parent, paired by seed): "
            + "; ".join(difference_words(c[key], what, a, b) for key, what in
                        (("reward_step_change", "median |Δreward| per step"),
                         ("val_step_change", "median |Δval BA| per checkpoint")))
            + f"; holdout BA sd over seeds {a} {_fmt(sd_a)} vs {b} {_fmt(sd_b)} (side by side, untested)")


def add_stability(verdicts: list[dict], made: dict | None) -> None:
    """Give each verdict entry ``stability`` (its figures and CoRPO-vs-GRPO comparisons, or None)
    and append their words to its ``text``."""
    figures = (made or {}).get("arms") or {}
    comparisons = (made or {}).get("corpo_vs_grpo") or []
    for v in verdicts:
        f = figures.get(v["arm"])
        mine = [c for c in comparisons if c["a"] == v["arm"]]
        v["stability"] = {"figures": f, "corpo_vs_grpo": mine} if f else None
        if f:
            v["text"] += "; " + arm_words(f) + "".join("; " + comparison_words(c) for c in mine)
