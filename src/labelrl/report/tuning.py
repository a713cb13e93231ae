"""The report's tuning part of section 1: per tuned arm, every value it tried with its val
metrics and which was chosen (``labelrl.ladder.tune``, read from ladder.json's ``tune`` entries),
and the val balanced accuracy against the learning rate (log axis, one line per arm)."""

from __future__ import annotations

from typing import Sequence

from matplotlib.figure import Figure

from labelrl.report import figures as F
from labelrl.report.render import Block, FigureSink, Para, TableBlock, fmt, fmt_ci
from labelrl.report.run_data import ArmData, TaskData

LR = "learning_rate"


def values_text(values: dict) -> str:
    """``learning_rate=1e-05`` (``,`` between keys), as the ladder names a candidate."""
    return ",".join(f"{k}={v}" for k, v in values.items())


def _candidate_rows(arm: ArmData) -> list[list[str]]:
    chosen = arm.tune.get("chosen")
    rows = []
    for c in arm.tune.get("candidates") or []:
        if not isinstance(c, dict):
            continue
        val = c.get("val") or {}
        note = "chosen" if c.get("values") == chosen else ""
        if c.get("status") == "failed":
            note = f"failed: {c.get('error') or 'no error recorded'}"
        rows.append([arm.name, values_text(c.get("values") or {}), fmt(val.get("n"), 0),
                     fmt_ci(val.get("balanced_accuracy"), val.get("balanced_accuracy_ci")),
                     fmt_ci(val.get("accuracy"), val.get("accuracy_ci")), note])
    return rows


def lr_series(arms: Sequence[ArmData]) -> list[tuple[str, list[float], list[float], float | None, float | None]]:
    """Per arm whose grid is the learning rate alone: (label, learning rates, val balanced
    accuracies, the chosen rate, its accuracy) of its finished candidates, by learning rate."""
    out = []
    for arm in arms:
        if list((arm.tune or {}).get("grid") or {}) != [LR]:
            continue
        found = [((c.get("values") or {}).get(LR), (c.get("val") or {}).get("balanced_accuracy"))
                 for c in arm.tune.get("candidates") or [] if isinstance(c, dict) and c.get("status") == "done"]
        points = sorted((x, y) for x, y in found if isinstance(x, (int, float)) and isinstance(y, (int, float)))
        chosen = (arm.tune.get("chosen") or {}).get(LR)
        best = next((y for x, y in points if x == chosen), None)
        if points:
            out.append((arm.label, [p[0] for p in points], [p[1] for p in points], chosen, best))
    return out


def tuning_figure(task_name: str, lines: Sequence[tuple], ceiling: float | None) -> Figure:
    """Val balanced accuracy against the learning rate (log axis), one line per tuned arm, the
    chosen rate starred, with the label ceiling."""
    fig, ax = F.plt.subplots(figsize=(6.5, 3.8))
    for i, (label, xs, ys, chosen, best) in enumerate(lines):
        ax.plot(xs, ys, marker="o", markersize=4, color=f"C{i}", label=label)
        if chosen is not None and best is not None:
            ax.plot([chosen], [best], marker="*", markersize=12, color=f"C{i}", linestyle="none")
    F._ceiling(ax, ceiling)
    ax.set_xscale("log")
    ax.set(xlabel="learning rate (log scale)", ylabel=f"val balanced accuracy {F.FRACTION}",
           title=f"{task_name}: val balanced accuracy per learning rate (★ chosen)", ylim=(-0.02, 1.02))
    F._legend(ax)
    return fig


def tuning(task: TaskData, sink: FigureSink) -> list[Block]:
    """The tuning table (and figure) of the task, or nothing when no arm tuned."""
    tuned = [a for a in task.arms if a.tune and a.tune.get("candidates")]
    followers = [a for a in task.arms if a.tune and a.tune.get("selected_by") and a.tune.get("chosen")]
    if not tuned and not followers:
        return []
    blocks: list[Block] = []
    rows = [row for arm in tuned for row in _candidate_rows(arm)]
    if rows:
        blocks.append(TableBlock(["arm", "values tried", "val n", "val balanced accuracy [95% CI]", "val accuracy [95% CI]",
                                  "note"], rows, f"{task.name}: tuning on val (the highest val balanced accuracy is chosen, "
                                 "ties go to the first value listed; only the chosen model is evaluated on the holdout)"))
    if followers:
        blocks.append(Para("Replicate runs trained once with the values their first seed's run chose on val: "
                           + "; ".join(f"{a.name}: {values_text(a.tune['chosen'])} (chosen by {a.tune['selected_by']})"
                                       for a in followers) + "."))
    lines = lr_series(tuned)
    if lines:
        blocks.append(sink.image(f"{task.name}-tuning", f"{task.name}: val balanced accuracy per learning rate, one line "
                                 "per tuned arm (★ the chosen rate; dashed: label ceiling)",
                                 lambda path: F.render_png(lambda: tuning_figure(task.name, lines, task.ceiling), path)))
    return blocks
