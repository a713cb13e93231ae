"""The report's conclusions: the verdict per task, the paired comparisons, replicate summaries,
the samples the arms were scored on, and holdout balanced accuracy against injected label noise.

Every number here is read from the ladder's files (``analysis/verdict.json``,
``analysis/paired.json``, ``samples.json``, the arms' evaluations); nothing is recomputed from a
model. A verdict says "no detectable difference" whenever the paired interval covers zero.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from labelrl.ladder.grid import legend
from labelrl.report import figures as F
from labelrl.report.analyses import noise_seed_words, noise_slope_lines
from labelrl.report.render import Block, FigureSink, Items, Para, TableBlock, fmt, fmt_ci
from labelrl.report.run_data import ArmData, RunData, TaskData
from labelrl.report.verdict_tables import generation_table, stability_tables

KIND_TEXT = {"vs_sft": "against its SFT parent", "vs_threshold": "against SFT + threshold chosen on val",
             "vs_recall_matched": "against SFT at its own val recall", "ablation": "ablation (same parent)"}
DELTA_TEXT = {"balanced_accuracy": "ΔBA", "accuracy": "Δaccuracy", "mean_abs_grade_error": "Δ|grade error|"}
KIND_TEXT["vs_majority"] = "against the majority class (a constant answer)"  # labelrl.ladder.majority
# labelrl.ladder.curve_vs_sft: the ranking (ROC-AUC of the scores) and the answers, against the SFT parent
KIND_TEXT["curve_vs_sft"] = "curve (ranking) and point (own answers) against its SFT parent"
DELTA_TEXT |= {"roc_auc": "ΔROC-AUC", "recall": "Δrecall", "precision": "Δprecision"}


def verdict(task: TaskData, sink: FigureSink) -> list[Block]:
    """The task's verdict lines: each RL arm against SFT, SFT + threshold and the recall-matched
    threshold (paired, with intervals and seeds) on the holdout and on each OOD set, its operating
    point and failed-positive share; then a direct RL arm's greedy-generation operating point and
    the stability figures over seeds (labelrl.report.verdict_tables)."""
    if not task.verdict:
        return []
    lines = [v.get("text", "") for v in task.verdict if v.get("text")]
    sets = "the holdout" + (f" and on each OOD set's holdout ({', '.join(task.ood_names)})" if task.ood_names else "")
    head = (f"{task.name} ({task.data}): comparisons on {sets}, paired on the same items and seeds, corrected as one "
            "family (Holm); an adjusted interval covering 0 is \"no detectable difference\", with the smallest "
            "difference it could have detected.")
    return [*grid_blocks(task), Para(head), Items(lines), *generation_table(task), *stability_tables(task)]


def grid_blocks(task: TaskData) -> list[Block]:
    """The answer sentence and the grid of ``analysis/grid.json`` (labelrl.ladder.grid), first."""
    import json

    from labelrl.report.grid_table import grid_lines

    path = task.dir / "analysis" / "grid.json"
    if not path.is_file():
        return []
    grid = json.loads(path.read_text(encoding="utf-8"))
    if not grid.get("rows"):
        return []
    header, *rows = grid_lines(grid)
    caption = f"{task.name}: {legend(grid)}"
    return [Para(f"{task.name}: {grid['sentence']}"), TableBlock(header, rows, caption)]


def paired_table(task: TaskData) -> list[Block]:
    """Every paired comparison: Δ (B − A) per metric with its two-level bootstrap interval,
    McNemar's exact p per pair of runs, the verdict, and for ablations the config that differs."""
    if not task.paired:
        return []
    metrics = [m for m in DELTA_TEXT if any(m in (c["result"].get("metrics") or {}) for c in task.paired)]
    rows = []
    for c in task.paired:
        r = c["result"]
        cells = [fmt_ci((r["metrics"].get(m) or {}).get("delta"), (r["metrics"].get(m) or {}).get("ci"), sign=True)
                 for m in metrics]
        p_values = ", ".join(fmt(t.get("p_value"), 3) for t in r.get("mcnemar") or [])
        if len(r.get("mcnemar") or []) > 1 and r.get("mcnemar_pooled"):
            p_values += f"; pooled {fmt(r['mcnemar_pooled']['p_value'], 3)}"
        diff = "; ".join(f"{k}: {a} → {b}" for k, (a, b) in (c.get("config_diff") or {}).items())
        runs = r.get("n_runs") or [1, 1]
        rows.append([f"{c['b']} vs {c['a']}", KIND_TEXT.get(c["kind"], c["kind"]), _set_name(c), fmt(r.get("n"), 0),
                     f"{runs[0]} / {runs[1]}", *cells, *_family_cells(r), p_values or "—", _verdict_cell(c), diff or "—"])
    columns = ["B vs A", "comparison", "set", "items", "runs A / B", *[f"{DELTA_TEXT[m]} (B − A) [95% CI]" for m in metrics],
               "tested", "p raw → Holm", "adjusted interval", "could detect", "McNemar p (per run pair; pooled)", "verdict",
               "config that differs (A → B)"]
    ood = any(_set_name(c) != "holdout" for c in task.paired)
    size = next((c["result"]["family"]["size"] for c in task.paired if c["result"].get("family")), None)
    caption = (f"{task.name}: paired comparisons on the holdout{' and on each OOD set (its holdout)' if ood else ''} "
               "(bootstrap over items and seeds, "
               f"{task.paired[0]['result'].get('n_boot', '?')} resamples)"
               + (f"; one family of {size} tests, Holm-corrected at 5% (the raw intervals are uncorrected)" if size else ""))
    return [TableBlock(columns, rows, caption)]


def _set_name(c: dict) -> str:
    """The evaluation set a comparison was made on: ``holdout`` or ``OOD NAME`` (labelrl.ladder.paired_arms)."""
    split = c.get("split") or "holdout"
    return "holdout" if split == "holdout" else f"OOD {split.removeprefix('ood-')}"


def _family_cells(r: dict) -> list[str]:
    """The tested metric, raw → Holm-adjusted p, the adjusted interval and the smallest detectable
    |Δ| of a comparison corrected in its task's family (labelrl.ladder.correction); dashes otherwise."""
    f = r.get("family")
    if not f:
        return ["—"] * 4
    ci = f.get("ci_adjusted")
    return [DELTA_TEXT.get(f.get("metric"), f.get("metric", "?")), f"{fmt(f.get('p_value'), 4)} → {fmt(f.get('p_adjusted'), 4)}",
            f"[{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else "—",
            fmt(f.get("detectable"), 3) if f.get("detectable") is not None else "—"]


def _verdict_cell(c: dict) -> str:
    """The comparison's verdict; with a side collapsed to one answer or not a method result, the
    ladder's words, which name it instead of "worse" (labelrl.ladder.collapse)."""
    plain = c["result"].get("verdict", "")
    named = c.get("collapsed") or c.get("not_a_result")
    return f"{c['b']} vs {c['a']}: {c['words']}" if named and c.get("words") else plain


def samples_table(task: TaskData) -> list[Block]:
    """The samples each arm trained and was scored on, with their label counts next to the split's."""
    if not task.samples:
        return []
    labels = list(task.labels) or sorted({k for s in task.samples.values() for k in (s.get("split_label_counts") or {})})
    rows = []
    for split in ("train", "val", "holdout"):
        s = task.samples.get(split)
        if not s:
            continue
        counts, full = s.get("label_counts") or {}, s.get("split_label_counts") or {}
        rows.append([split, "all" if s.get("limit") is None else f"{s.get('limit')} (random, {s.get('draw', 'stratified')})",
                     f"{s.get('n')} of {s.get('n_split')}", *[f"{counts.get(x, 0)} / {full.get(x, 0)}" for x in labels]])
    caption = (f"{task.name}: the items every arm used (sample / whole split, per label; seed {next(iter(task.samples.values())).get('seed')})"
               + (f"; training labels flipped at rate {task.label_noise:g}" if task.label_noise else "")
               + (noise_seed_words(task) if task.label_noise else ""))  # labelrl.report.analyses: split or run seed
    return [TableBlock(["split", "limit", "items", *[f"label {x}" for x in labels]], rows, caption)]


def _spread(values: list[float]) -> str:
    if not values:
        return "—"
    if len(values) == 1:
        return fmt(values[0])
    return f"{fmt(statistics.mean(values))} ± {fmt(statistics.stdev(values))} [{fmt(min(values))}, {fmt(max(values))}]"


def replicate_rows(task: TaskData, keys: list[str]) -> list[list[str]]:
    """Per replicated arm: the mean ± standard deviation [min, max] over its seeds of each holdout metric."""
    runs: dict[str, list[ArmData]] = defaultdict(list)
    for arm in task.arms:
        if arm.replicate_of and arm.holdout:
            runs[arm.replicate_of].append(arm)
    rows = []
    for group, arms in runs.items():
        cells = [_spread([a.holdout[k] for a in arms if isinstance(a.holdout.get(k), (int, float))]) for k in keys]
        seeds = ", ".join(str(a.seed) for a in arms)
        rows.append([f"{group} (seeds {seeds})", arms[0].type, f"{len(arms)} runs", "holdout, over seeds",
                     fmt(arms[0].holdout.get("n"), 0), *cells, "mean ± sd [min, max] over seeds; per-run rows above"])
    return rows


def threshold_rows(arm: ArmData, keys: list[str]) -> list[list[str]]:
    """A threshold arm's recall-matched evaluations, one row per RL arm it was matched to."""
    rows = []
    for rl, m in arm.matched.items():
        holdout = m.get("holdout") or {}
        t = (m.get("rule") or {}).get("threshold")
        rows.append([f"{arm.name} → {rl}", "threshold", arm.status, "holdout (derived)", fmt(holdout.get("n"), 0),
                     *[fmt_ci(holdout.get(k), holdout.get(f"{k}_ci")) for k in keys],
                     f"SFT threshold {fmt(t, 4)} matching {rl}'s val recall; its parent's holdout scores, no new look"])
    return rows


def noise(run: RunData, sink: FigureSink) -> list[Block]:
    """Holdout balanced accuracy against the training-label flip rate, per arm, for tasks on the
    same data that differ in ``label_noise`` (the claim: label noise hurts RLVR more than SFT), and
    under the figure the ladder's verdict on that claim: RL's least-squares slope on ε minus SFT's,
    paired, with its interval (``analysis/noise_slope.json``, labelrl.ladder.noise_slope)."""
    by_data: dict[str, list[TaskData]] = defaultdict(list)
    for task in run.tasks:
        by_data[task.data or task.name].append(task)
    blocks: list[Block] = []
    for data, tasks in by_data.items():
        if len({t.label_noise for t in tasks}) < 2:
            continue
        points: dict[str, list[tuple[float, float, list | None]]] = defaultdict(list)
        for task in sorted(tasks, key=lambda t: t.label_noise):
            for arm in task.arms:
                value = (arm.holdout or {}).get("balanced_accuracy")
                if value is not None:
                    points[arm.group].append((task.label_noise, value, (arm.holdout or {}).get("balanced_accuracy_ci")))
        rows = [[group, *[f"ε={e:g}: {fmt(v)}" for e, v, _ in pts]] for group, pts in points.items()]
        width = max(len(r) for r in rows)
        blocks += [sink.image(f"noise-{data}", f"{data}: holdout balanced accuracy against the share of flipped "
                              "training labels, per arm (bars: 95% intervals)",
                              lambda path, d=data, p=dict(points): F.render_png(lambda: F.noise_figure(d, p), path)),
                   *[Para(line) for line in noise_slope_lines(run.run_dir, data)],
                   TableBlock(["arm", *[""] * (width - 1)], [r + [""] * (width - len(r)) for r in rows],
                              f"{data}: holdout balanced accuracy by label-noise rate ε")]
    return blocks
