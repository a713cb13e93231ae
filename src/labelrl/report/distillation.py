"""Section 7 of the report, per task: the matched-data decomposition of distillation
(``analysis/compare.json``: the filter effect and the objective effect on balanced accuracy) and
each distill arm's trace survival, overall, per label and per confidence band.
"""

from __future__ import annotations

from labelrl.report import figures as F
from labelrl.report.render import Block, FigureSink, Para, TableBlock, fmt, fmt_ci
from labelrl.report.run_data import TaskData


def _survival_rows(summary: dict) -> list[list[str]]:
    groups = [("overall", summary.get("overall") or {})]
    groups += [(f"label {k}", v) for k, v in (summary.get("per_label") or {}).items()]
    groups += [(f"confidence {k}", v) for k, v in (summary.get("by_confidence") or {}).items()]
    return [[name, fmt(c.get("n_items"), 0), fmt(c.get("n_survived"), 0), fmt(c.get("survival_rate")),
             fmt(c.get("mean_attempts_used"), 2)] for name, c in groups]


def distillation(task: TaskData, sink: FigureSink) -> list[Block]:
    """Section 7: the compare.json decomposition and each distill arm's trace survival."""
    blocks: list[Block] = []
    c = task.compare
    if c is None and "compare" in task.analysis_notes:
        blocks.append(Para(f"Decomposition not made: {task.analysis_notes['compare']}.", "note"))
    if c is not None:
        models = c.get("models") or {}
        order = [r for r in ("direct_all", "direct_survivors", "cot") if r in models]
        order += [r for r in models if r not in order]
        rows = [[role, str(models[role].get("name", role)),
                 fmt_ci(models[role].get("balanced_accuracy"), models[role].get("balanced_accuracy_ci"))] for role in order]
        split = c.get("split", "holdout")
        blocks.append(TableBlock(["role", "arm", f"{split} balanced accuracy [95% CI]"], rows,
                                 f"{task.name}: matched-data decomposition on the {fmt(c.get('n'), 0)} {split} items all three were evaluated on"))
        filter_effect = fmt_ci(c.get("filter_effect"), c.get("filter_effect_ci"), sign=True)
        objective_effect = fmt_ci(c.get("objective_effect"), c.get("objective_effect_ci"), sign=True)
        blocks.append(Para(f"Filter effect (direct_all − direct_survivors) {filter_effect}; objective effect "
                           f"(direct_survivors − cot) {objective_effect}; total {fmt(c.get('total_effect'), sign=True)} "
                           "(positive = balanced accuracy lost)."))
        blocks.append(sink.image(f"{task.name}-decomposition", f"{task.name}: balanced accuracy of the three models of "
                                 "the decomposition", F.drawer(lambda: F.decomposition_figure(task.name, c, task.ceiling))))
    for arm in task.arms:
        if arm.distill_summary:
            s = arm.distill_summary
            caption = (f"{task.name} / {arm.name}: trace survival (teacher {s.get('teacher', '?')}, "
                       f"{s.get('attempts', '?')} attempts per item, keep {s.get('keep', '?')})")
            blocks.append(TableBlock(["items", "n", "survived", "survival rate", "mean attempts used"],
                                     _survival_rows(s), caption))
    return blocks
