"""Does RL lose more than SFT as label noise rises? A paired difference of slopes with an interval.

A noise ladder runs the same data at several training-label flip rates ε_1 … ε_J (one task per
rate, ``label_noise``), each with a direct SFT arm and an RL arm started from it. Per arm, the
holdout balanced accuracy of task j is the mean over its runs (seeds) of each run's balanced
accuracy on the task's holdout items:

    BA_j = mean_s BA(run_s on task j's holdout)

and its slope on ε is the ordinary least-squares slope over the J points (ε_j, BA_j) (Wasserman
2004, *All of Statistics*, §13.1, the least-squares estimate of β₁):

    slope = Σ_j (ε_j − ε̄)(BA_j − B̄A) / Σ_j (ε_j − ε̄)²

The claim "RL loses more than SFT as noise rises" is the difference of slopes

    D = slope_RL − slope_SFT      (BA per unit ε; negative: RL's BA falls faster)

**Interval.** A percentile bootstrap (Efron & Tibshirani 1993, ch. 13) whose replicates resample
every task independently (the tasks are separate samples: Davison & Hinkley 1997, §3.2) at two
stages within it (§3.8): the task's holdout items, n_j of them with replacement, the *same* draw
for every SFT and RL run of the task (the pairing: an item hard for one arm is hard for the
other), and the task's runs, S_j SFT runs with replacement; when the RL runs pair with the SFT
runs (RL run k trained from SFT run k, e.g. ``grpo@s1`` from ``sft@s1``: ``seeds_paired``) the
same run indices pick the RL runs (a resampled seed is the pair), else T_j RL runs are drawn
independently. Each replicate recomputes BA per run from the item counts (row weights,
``labelrl.evaluate.paired.metric_matrix`` with ``labelrl.evaluate.metrics.metrics_from_weights``),
the arm means, both slopes and D; the interval is the 2.5th and 97.5th percentiles of D over the
replicates (a replicate whose BA is undefined is left out). The draws come from
``numpy.random.default_rng(seed)``, task by task in the order given, all replicates at once:
``items_j = rng.integers(0, n_j, (n_boot, n_j))``, ``sft_runs_j = rng.integers(0, S_j, (n_boot, S_j))``
and, unless ``seeds_paired``, ``rl_runs_j = rng.integers(0, T_j, (n_boot, T_j))``.

Deviation (conservative): the noise recipe's tasks share one holdout sample (same data, split
seed and ``holdout_limit``), yet each task's items are drawn independently. An item effect on
RL − SFT common to every rate cancels from D (the OLS weights ε_j − ε̄ sum to zero) under a
joint draw, and adds variance under independent ones, so the interval is at least as wide as a
joint draw's would be.

**Words.** The interval below 0: "RL loses more than SFT as noise rises"; above 0: "RL loses less
than SFT as noise rises"; covering 0: "no detectable difference in slope", with the smallest
difference it could have detected: the |D| a two-sided 5% test finds with 80% power,
(z_0.975 + z_0.80)·se with se the standard deviation of the bootstrap D (the normal-approximation
sample-size relation, Chow, Shao & Wang 2008, §3.1; the definition ``labelrl.evaluate.family``
uses for a single comparison's paired Δ). A run flagged collapsed to one answer
(``train.collapse`` in ``ladder.json``, labelrl.train.collapse) is named: its BA is a constant
answer's, and it counts in the slope as it is.

``noise_slope_analysis`` picks the tasks and runs from ``ladder.json``'s state, reads each run's
holdout predictions (``TASK/eval/RUN-holdout.parquet``) and writes ``analysis/noise_slope.json``
at the run level.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from labelrl.evaluate.io import Predictions, read_predictions
from labelrl.evaluate.paired import encode_on, metric_matrix, point_value, shared_ids
from labelrl.fileio import atomic_write_json
from labelrl.ladder.kinds import groups
from labelrl.ladder.layout import eval_paths

METRIC = "balanced_accuracy"
NOISE_SLOPE_FILE = "noise_slope.json"  # in RUN_DIR/analysis/
MORE, LESS, SAME = ("RL loses more than SFT as noise rises", "RL loses less than SFT as noise rises",
                    "no detectable difference in slope")


@dataclass(frozen=True)
class NoiseTask:
    """One rate's task: its flip rate ε, the SFT arm's and the RL arm's runs' holdout predictions."""

    name: str
    label_noise: float  # ε_j
    sft: Sequence[Predictions]  # one per run (seed)
    rl: Sequence[Predictions]
    seeds_paired: bool = False  # rl[k] trained from sft[k]: a resampled seed picks both
    sft_runs: Sequence[str] = field(default_factory=tuple)  # run names, for the record only
    rl_runs: Sequence[str] = field(default_factory=tuple)


def ols_slope(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least-squares slope of ``y [..., J]`` on ``x [J]`` (module docstring); Σ(x − x̄)·ȳ = 0, so
    y need not be centred."""
    xc = np.asarray(x, dtype=np.float64) - np.mean(x)
    return np.asarray(y, dtype=np.float64) @ xc / float(xc @ xc)


def _check(tasks: Sequence[NoiseTask], n_boot: int) -> None:
    rates = sorted({t.label_noise for t in tasks})
    if len(rates) < 2:
        raise ValueError(f"label_noise rates {rates} over {len(tasks)} task(s): a slope on ε needs at least 2 different "
                         "rates; run the same data at two or more label_noise values (e.g. the noise recipe's e00 … e30)")
    if n_boot < 1:
        raise ValueError(f"n_boot={n_boot}: the slope interval needs at least 1 bootstrap resample; set the tasks' "
                         "n_boot to e.g. 500")
    for t in tasks:
        if not t.sft or not t.rl:
            raise ValueError(f"task {t.name}: {len(t.sft)} SFT and {len(t.rl)} RL runs; each rate needs at least one "
                             "finished run of each arm")
        if t.seeds_paired and len(t.sft) != len(t.rl):
            raise ValueError(f"task {t.name}: seeds_paired with {len(t.sft)} SFT and {len(t.rl)} RL runs; pairing needs "
                             "RL run k trained from SFT run k, so as many runs of each")


def _task_boot(task: NoiseTask, rng: np.random.Generator, n_boot: int) -> dict:
    """One task's point BAs per run and each replicate's arm means [n_boot] (draw order: module docstring)."""
    ids = shared_ids([*task.sft, *task.rl])
    encs = [encode_on(r, ids) for r in [*task.sft, *task.rl]]
    S, T = len(task.sft), len(task.rl)
    points = [point_value(e, METRIC) for e in encs]
    items = rng.integers(0, len(ids), (n_boot, len(ids)))
    mat = metric_matrix(encs, items, (METRIC,))[METRIC]  # [n_boot, S + T]: every run under each item draw
    sft_runs = rng.integers(0, S, (n_boot, S))
    rl_runs = sft_runs if task.seeds_paired else rng.integers(0, T, (n_boot, T))
    return {"n": len(ids), "sft_by_run": points[:S], "rl_by_run": points[S:],
            "boot_sft": np.take_along_axis(mat[:, :S], sft_runs, axis=1).mean(axis=1),
            "boot_rl": np.take_along_axis(mat[:, S:], rl_runs, axis=1).mean(axis=1)}


def _ci(values: np.ndarray) -> list[float] | None:
    values = values[np.isfinite(values)]
    return [float(v) for v in np.percentile(values, [2.5, 97.5])] if len(values) else None


def slope_difference(tasks: Sequence[NoiseTask], *, n_boot: int, seed: int = 0) -> dict:
    """Per arm the OLS slope of holdout BA on ε, D = slope_RL − slope_SFT, and the paired two-stage
    bootstrap's percentile 95% intervals of each (module docstring), with the per-task points and
    ``words``. ValueError with fewer than 2 distinct rates, a task without runs, or n_boot < 1."""
    _check(tasks, n_boot)
    rng = np.random.default_rng(seed)
    per_task = [_task_boot(t, rng, n_boot) for t in tasks]
    x = np.array([t.label_noise for t in tasks])
    y_sft = np.array([np.mean(p["sft_by_run"]) for p in per_task])
    y_rl = np.array([np.mean(p["rl_by_run"]) for p in per_task])
    boot_sft = ols_slope(x, np.stack([p["boot_sft"] for p in per_task], axis=1))  # [n_boot]
    boot_rl = ols_slope(x, np.stack([p["boot_rl"] for p in per_task], axis=1))
    slope_sft, slope_rl = float(ols_slope(x, y_sft)), float(ols_slope(x, y_rl))
    rows = [{"task": t.name, "label_noise": t.label_noise, "n": p["n"], "sft": float(ys), "rl": float(yr),
             "sft_by_run": p["sft_by_run"], "rl_by_run": p["rl_by_run"], "sft_runs": list(t.sft_runs),
             "rl_runs": list(t.rl_runs), "seeds_paired": t.seeds_paired}
            for t, p, ys, yr in zip(tasks, per_task, y_sft, y_rl)]
    result = {"metric": METRIC, "split": "holdout", "tasks": rows, "slope_sft": slope_sft, "slope_rl": slope_rl,
              "slope_sft_ci": _ci(boot_sft), "slope_rl_ci": _ci(boot_rl), "difference": slope_rl - slope_sft,
              "ci": _ci(boot_rl - boot_sft), "n_boot": n_boot, "seed": seed,
              "n_boot_used": int(np.isfinite(boot_rl - boot_sft).sum())}
    result |= _power(boot_rl - boot_sft)
    result["words"] = slope_words(result)
    return result


def _power(boot_d: np.ndarray) -> dict:
    """``se``, the standard deviation of the bootstrap D, and ``detectable``, (z_0.975 + z_0.80)·se:
    the |D| a two-sided 5% test would detect with 80% power (module docstring)."""
    finite = boot_d[np.isfinite(boot_d)]
    se = float(np.std(finite, ddof=1)) if len(finite) > 1 else None
    from labelrl.evaluate.family import detectable

    return {"se": se, "detectable": detectable(se, 0.05)}


def verdict_lead(ci: list[float] | None) -> str:
    """The verdict words of an interval of D (module docstring)."""
    if ci is not None and ci[1] < 0:
        return MORE
    if ci is not None and ci[0] > 0:
        return LESS
    return SAME


def slope_words(result: dict, names: tuple[str, str] | None = None) -> str:
    """``RL loses more than SFT as noise rises (slope difference -0.410 BA per unit ε [-0.700,
    -0.120]; …)``: the verdict, D with its interval, D over the rates' range in BA, and what the
    interval rests on (rates, items, runs; ``names`` = (SFT arm, RL arm)); "no detectable
    difference" also says the smallest difference it could have detected (``detectable``)."""
    d, ci = result["difference"], result.get("ci")
    lo, hi = ci or (float("nan"), float("nan"))
    rates = [t["label_noise"] for t in result["tasks"]]
    span = max(rates) - min(rates)
    lead = verdict_lead(ci)
    parts = [f"slope difference {d:+.3f} BA per unit ε [{lo:+.3f}, {hi:+.3f}]",
             f"over ε {min(rates):g} → {max(rates):g}: {d * span:+.3f} BA [{lo * span:+.3f}, {hi * span:+.3f}]"]
    mdd = result.get("detectable")
    if lead == SAME and mdd == 0:  # se = 0: nothing varies, so no size of difference follows from it
        parts.append("every resample gives the same D (the arms are right on the same items at every rate): "
                     "no smallest detectable difference follows")
    elif lead == SAME and mdd is not None:
        parts.append(f"smallest difference it could detect: {mdd:.3f} per unit ε ({mdd * span:.3f} BA over the range)")
    runs = sorted({len(t["sft_by_run"]) for t in result["tasks"]} | {len(t["rl_by_run"]) for t in result["tasks"]})
    items = sorted({t["n"] for t in result["tasks"]})
    who = f"{names[1]} − {names[0]}, " if names else ""
    parts.append(f"{who}{len(rates)} rates, {'/'.join(map(str, items))} holdout items per rate, "
                 f"{'/'.join(map(str, runs))} run(s) per arm and rate")
    if runs == [1]:
        parts.append("one run per arm and rate: the interval is over holdout items, not over training runs")
    return f"{lead} ({'; '.join(parts)})"


# ---------------------------------------------------------------- from a ladder run's files


def arm_pairs(tstate: dict) -> list[tuple[str, str]]:
    """(SFT arm, RL arm) of a task's state: every direct ``rl`` arm whose runs start from one
    ``sft`` arm's runs, in run order."""
    arms = tstate.get("arms") or {}
    grouped = groups({n: arms[n] for n in (tstate.get("arm_order") or list(arms)) if n in arms})
    sft = {g: set(runs) for g, runs in grouped.items() if arms[runs[0]].get("type") == "sft"}
    pairs = []
    for g, runs in grouped.items():
        if arms[runs[0]].get("type") != "rl":
            continue
        parent = next((s for s, sft_runs in sft.items() if {arms[r].get("from") for r in runs} <= sft_runs), None)
        if parent is not None:
            pairs.append((parent, g))
    return pairs


def read_noise_task(task_dir: Path, task_name: str, tstate: dict, sft: str, rl: str) -> NoiseTask:
    """The task's finished runs of arms ``sft`` and ``rl`` with their holdout predictions; RL runs
    ordered by their parent when each starts from a different finished SFT run (``seeds_paired``).
    ValueError when an arm has no finished run."""
    arms = tstate["arms"]
    order = [n for n in (tstate.get("arm_order") or list(arms)) if arms.get(n, {}).get("status") == "done"]
    grouped = groups({n: arms[n] for n in order})
    sft_runs, rl_runs = grouped.get(sft, []), grouped.get(rl, [])
    if not sft_runs or not rl_runs:
        raise ValueError(f"{len(sft_runs)} finished {sft} run(s) and {len(rl_runs)} finished {rl} run(s); the slope needs "
                         "one of each (see the arms' status and error in ladder.json)")
    by_parent = {arms[r].get("from"): r for r in rl_runs}
    paired = len(by_parent) == len(rl_runs) == len(sft_runs) and set(by_parent) == set(sft_runs)
    if paired:
        rl_runs = [by_parent[s] for s in sft_runs]

    def load(run: str) -> Predictions:
        return read_predictions(eval_paths(task_dir, run, "holdout")[0])

    return NoiseTask(task_name, float(tstate.get("label_noise") or 0.0), [load(r) for r in sft_runs],
                     [load(r) for r in rl_runs], seeds_paired=paired, sft_runs=sft_runs, rl_runs=rl_runs)


def _candidates(state: dict) -> dict[tuple[str, str, str], list[str]]:
    """(data, SFT arm, RL arm) → the tasks holding that pair, for pairs found at ≥ 2 distinct rates."""
    tasks = state.get("tasks") or {}
    found: dict[tuple[str, str, str], list[str]] = {}
    for name in state.get("task_order") or list(tasks):
        tstate = tasks.get(name) or {}
        for sft, rl in arm_pairs(tstate):
            found.setdefault((str(tstate.get("data") or name), sft, rl), []).append(name)
    return {key: names for key, names in found.items()
            if len({float(tasks[n].get("label_noise") or 0.0) for n in names}) >= 2}


def noise_slope_analysis(run_dir: Path, state: dict, *, n_boot: int, seed: int = 0) -> dict | None:
    """Every (data, SFT arm, RL arm) the run holds at ≥ 2 label-noise rates: its ``slope_difference``
    over the tasks where both arms finished (tasks left out, and why, under ``left_out``), the
    collapsed runs named, written to ``RUN_DIR/analysis/noise_slope.json``. None (nothing written)
    when the run has no such pair. A comparison that cannot be made records its ``error``."""
    run_dir = Path(run_dir)
    candidates = _candidates(state)
    if not candidates:
        return None
    comparisons = []
    for (data, sft, rl), names in candidates.items():
        entry: dict = {"data": data, "sft": sft, "rl": rl, "left_out": {}}
        tasks = []
        for name in names:
            try:
                tasks.append(read_noise_task(run_dir / name, name, state["tasks"][name], sft, rl))
            except (ValueError, FileNotFoundError) as exc:
                entry["left_out"][name] = str(exc)
        try:
            entry |= slope_difference(tasks, n_boot=n_boot, seed=seed)
        except ValueError as exc:
            entry["error"] = str(exc)
            comparisons.append(entry)
            continue
        entry["collapsed"] = [f"{t.name}/{r}" for t in tasks for r in [*t.sft_runs, *t.rl_runs]
                              if ((state["tasks"][t.name]["arms"][r].get("train") or {}).get("collapse"))]
        entry["words"] = comparison_words(entry)
        comparisons.append(entry)
    out = {"comparisons": comparisons}
    (run_dir / "analysis").mkdir(parents=True, exist_ok=True)
    atomic_write_json(run_dir / "analysis" / NOISE_SLOPE_FILE, out)
    return out


def comparison_words(entry: dict) -> str:
    """``slope_words`` with the arms' names, the tasks left out and the collapsed runs named."""
    words = slope_words(entry, names=(entry["sft"], entry["rl"]))
    if entry.get("left_out"):
        words += f"; left out: {', '.join(f'{t} ({why})' for t, why in entry['left_out'].items())}"
    if entry.get("collapsed"):
        words += (f"; collapsed to one answer: {', '.join(entry['collapsed'])} (a constant answer's balanced accuracy, "
                  "counted in the slope as it is)")
    return words


def summary_lines(result: dict | None) -> list[str]:
    """One line per comparison of ``noise_slope_analysis``'s result, for the console and the report."""
    lines = []
    for c in (result or {}).get("comparisons") or []:
        head = f"{c['data']}: {c['rl']} vs {c['sft']}"
        lines.append(f"{head}: {c['words']}" if "words" in c else f"{head}: slope not computed: {c.get('error')}")
    return lines


def noise_slope_step(run_dir: Path, state: dict, recipe, console) -> dict | None:
    """The ladder's cross-task step at the end of a run: ``noise_slope_analysis`` with the recipe's
    seed and its tasks' largest ``n_boot``, its lines printed; returns what ``ladder.json`` keeps
    (the file and the lines), None when the run has no noise pair. A failure is printed and
    returned as ``error``, never raised: every task's own results are already saved."""
    n_boot = max((t.n_boot for t in recipe.tasks.values()), default=0)
    try:
        result = noise_slope_analysis(run_dir, state, n_boot=n_boot, seed=recipe.seed)
    except Exception as exc:  # an analysis that cannot be made is reported, not fatal (as analyse_task's steps)
        result = {"error": f"{type(exc).__name__}: {exc}"}
    if result is None:
        return None
    lines = summary_lines(result) or [f"slope not computed: {result.get('error')}"]
    console.rule("label noise: RL's slope against SFT's")
    for line in lines:
        console.print(f"  • {line}", highlight=False, soft_wrap=True)
    return {"file": str(Path(run_dir) / "analysis" / NOISE_SLOPE_FILE) if "error" not in result else None, "lines": lines}
