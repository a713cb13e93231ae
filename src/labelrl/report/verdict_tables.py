"""The verdict section's tables: each direct RL arm's greedy-generation operating point, and the
stability figures over seeds with CoRPO against GRPO paired by seed.

Read from the files only: the verdict entries' ``generation`` field (labelrl.ladder.generation_point,
in ladder.json and ``analysis/verdict.json``) and ``analysis/stability.json``
(labelrl.ladder.stability).
"""

from __future__ import annotations

from labelrl.report.render import Block, TableBlock, fmt, fmt_ci
from labelrl.report.run_data import TaskData


def generation_table(task: TaskData) -> list[Block]:
    """Per direct RL run and label: recall and precision of its greedy generations on the holdout,
    with Wilson intervals, and the sweep's verdict on its val point."""
    rows = []
    for v in task.verdict:
        generation = v.get("generation") or {}
        for run, point in (generation.get("points") or {}).items():
            for i, (label, m) in enumerate((point.get("labels") or {}).items()):
                rows.append([run if i == 0 else "", label, fmt(m.get("n_true"), 0), fmt_ci(m.get("recall"), m.get("recall_ci")),
                             fmt_ci(m.get("precision"), m.get("precision_ci")),
                             f"{point.get('n_unparsed')} of {point.get('n')}" if i == 0 else "",
                             (generation.get("sweep") or "not swept") if i == 0 else ""])
    if not rows:
        return []
    return [TableBlock(["run", "label", "items", "recall [95% CI]", "precision [95% CI]", "unparsed", "val point vs the SFT threshold"],
                       rows, f"{task.name}: the operating point without logit access: each direct RL arm's greedy "
                             "generations parsed strictly, on the holdout (Wilson intervals); the sweep asks whether its "
                             "val point is a threshold on the SFT parent's scores")]


def stability_tables(task: TaskData) -> list[Block]:
    """Per replicated arm and seed: holdout BA, the median step changes; the arm's spread over seeds;
    then each CoRPO-vs-GRPO comparison, paired by seed."""
    made = task.stability or {}
    rows = []
    for arm, f in (made.get("arms") or {}).items():
        for i, (run, r) in enumerate((f.get("per_run") or {}).items()):
            rows.append([arm if i == 0 else "", run, fmt(r.get("seed"), 0), fmt(r.get("holdout_balanced_accuracy")),
                         fmt(f.get("holdout_balanced_accuracy_sd")) if i == 0 else "",
                         fmt(r.get("reward_step_change"), 4), fmt(r.get("val_step_change"), 4)])
    if not rows:
        return []
    blocks: list[Block] = [TableBlock(
        ["arm", "run", "seed", "holdout BA", "sd over seeds", "median |Δ mean reward| per step",
         "median |Δ val BA| per checkpoint"], rows,
        f"{task.name}: stability over seeds and over training steps (sample sd, ddof 1: a rough figure with few seeds)")]
    rows = []
    for c in made.get("corpo_vs_grpo") or []:
        sd_a, sd_b = c.get("holdout_balanced_accuracy_sd") or [None, None]
        for key, what in (("reward_step_change", "median |Δ mean reward| per step"),
                          ("val_step_change", "median |Δ val BA| per checkpoint")):
            d = c.get(key) or {}
            by_seed = ", ".join(f"s{s}: {fmt(x, 4, sign=True)}" for s, x in (d.get("by_seed") or {}).items()) or "—"
            rows.append([f"{c['a']} − {c['b']}", what, by_seed, fmt(d.get("mean"), 4, sign=True),
                         f"{d.get('n_lower')} of {d.get('n_seeds')}", fmt(d.get("sign_test_p"), 2),
                         f"{c['a']} {fmt(sd_a)} vs {c['b']} {fmt(sd_b)}"])
    if rows:
        blocks.append(TableBlock(["CoRPO − GRPO", "figure", "per seed", "mean", "seeds lower", "sign test p",
                                  "holdout BA sd over seeds"], rows,
                                 f"{task.name}: CoRPO against GRPO from the same parent, paired by seed (negative: CoRPO "
                                 "steadier; the sign test needs 6 or more seeds to reach p < 0.05)"))
    return blocks
