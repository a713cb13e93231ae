"""The RL checkpoints' path on val (``ARM/val_path.jsonl``, ``labelrl.evaluate.val_path``), drawn
from the run's files only (section 6).

* Binary tasks, the "one curve" figure: the SFT parent's val ROC (its label-token scores in
  ``TASK/eval/PARENT-val.parquet``) with each RL arm's answers at step 0, every checkpoint and the
  last step as points (FPR, TPR), numbered by step and joined in step order, the last one
  emphasised. A point on the curve is an operating point a threshold on the SFT scores reaches
  too: RL moved the answers along the curve the SFT data fixed; a point above it is a ranking the
  SFT model does not have. FPR and TPR come from each record's recall per label, with the task's
  positive label.
* Other tasks: the recall of each label per checkpoint, a panel per RL arm, a line per label.

A table gives each arm's first and last evaluated step.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from labelrl.evaluate.val_path import read_val_path, roc_point  # noqa: E402
from labelrl.report import figures as F  # noqa: E402
from labelrl.report.render import Block, FigureSink, Para, TableBlock, fmt  # noqa: E402
from labelrl.report.run_data import TaskData  # noqa: E402

FPR_LABEL = "false positive rate (share of negatives answered positive, 0–1)"


def val_paths(task: TaskData) -> dict[str, list[dict]]:
    """Each RL arm's val path records (arm name → records in step order); arms without one left out."""
    out = {}
    for arm in task.rl_arms():
        try:
            records = read_val_path(arm.dir)
        except (OSError, ValueError, UnicodeDecodeError):
            continue  # an unreadable file leaves the arm out of the figure, not the report
        if records:
            out[arm.name] = records
    return out


def parent_roc(task: TaskData, parent: str) -> dict | None:
    """The parent's val ROC from its scored predictions: {fpr, tpr, roc_auc, n}; None without scores or
    without both classes."""
    from sklearn.metrics import roc_auc_score, roc_curve

    from labelrl.evaluate.io import read_predictions
    from labelrl.evaluate.sweep import positive_scores

    path = task.dir / "eval" / f"{parent}-val.parquet"
    if not path.is_file():
        return None
    pred = read_predictions(path, positive_label=task.positive_label)
    if pred.scores() is None:
        return None
    positive, score = positive_scores(pred, task.positive_label)
    is_pos = np.array([pred.labels.normalise(y) == positive for y in pred.y_true])
    if is_pos.all() or not is_pos.any():
        return None
    fpr, tpr, _ = roc_curve(is_pos, score)
    return {"fpr": fpr.tolist(), "tpr": tpr.tolist(), "roc_auc": float(roc_auc_score(is_pos, score)), "n": pred.n,
            "positive_label": positive}


def path_points(records: Sequence[dict], positive: str, labels: Sequence[str]) -> list[tuple[int, float, float]]:
    """(step, FPR, TPR) of every record whose point is defined."""
    out = []
    for r in records:
        point = roc_point(r, positive, labels)
        if point is not None:
            out.append((int(r["step"]), *point))
    return out


def one_curve_figure(task: str, parent: str, roc: dict | None, paths: Sequence[tuple[str, list]], positive: str) -> Figure:
    """The parent's ROC (when scored) and each arm's path of (step, FPR, TPR) points on it."""
    fig, ax = plt.subplots(figsize=(6.2, 5.6))
    if roc is not None:
        ax.plot(roc["fpr"], roc["tpr"], color="0.25", linewidth=1.5,
                label=f"{parent}: val ROC (AUC {roc['roc_auc']:.3f}, {roc['n']} items)")
    ax.plot([0, 1], [0, 1], color="0.75", linestyle=":", label="chance")
    for i, (arm, points) in enumerate(paths):
        color = f"C{i}"
        steps, x, y = zip(*points)
        ax.plot(x, y, color=color, marker="o", markersize=4, linewidth=1, alpha=0.8, label=f"{arm}: path by step")
        ax.scatter([x[-1]], [y[-1]], s=160, marker="*", color=color, edgecolors="black", linewidths=0.8, zorder=4,
                   label=f"{arm}: step {steps[-1]} (last)")
        for step, px, py in points:
            # offset per arm: two arms starting from the same model share their step-0 point
            ax.annotate(str(step), (px, py), textcoords="offset points", xytext=(4 + 7 * i, -10), fontsize=7, color=color)
    ax.set(xlim=(-0.02, 1.02), ylim=(-0.02, 1.02), xlabel=FPR_LABEL,
           ylabel=f"true positive rate = recall of {positive!r} (0–1)",
           title=f"{task}: RL answers per checkpoint on {parent}'s val ROC")
    ax.legend(loc="lower right", fontsize=7)
    return fig


def recall_path_figure(task: str, paths: Sequence[tuple[str, list[dict]]], labels: Sequence[str]) -> Figure:
    """A panel per arm: the recall of each label of its val answers per evaluated step."""
    cols = min(3, len(paths))
    rows = math.ceil(len(paths) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.6 * rows), squeeze=False, layout="constrained")
    for ax, (arm, records) in zip(axes.flat, paths):
        for label, colour, marker in zip(labels, F.label_colours(len(labels)), F.label_markers(len(labels))):
            x, y = F.known((r["step"], (r.get("recall") or {}).get(label)) for r in records)
            ax.plot(x, y, color=colour, marker=marker, markersize=3, label=f"label {label}")
        ax.set(xlabel=F.STEP_LABEL, ylabel=f"recall on val {F.FRACTION}",
               title=f"{task} / {arm}: recall per label on val", ylim=(-0.02, 1.02))
        ax.legend(fontsize=7)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in list(axes.flat)[len(paths):]:
        ax.set_visible(False)
    return fig


def _summary_rows(task: TaskData, paths: dict[str, list[dict]]) -> list[list[str]]:
    binary = task.kind == "binary" and task.positive_label is not None
    rows = []
    for arm, records in paths.items():
        first, last = records[0], records[-1]
        row = [arm, ", ".join(str(r["step"]) for r in records), fmt(last.get("n"), 0),
               f"{fmt(first.get('balanced_accuracy'))} → {fmt(last.get('balanced_accuracy'))}"]
        if binary:
            a, b = (roc_point(r, task.positive_label, task.labels) or (None, None) for r in (first, last))
            row += [f"({fmt(a[0])}, {fmt(a[1])}) → ({fmt(b[0])}, {fmt(b[1])})",
                    f"{fmt(first.get('roc_auc'))} → {fmt(last.get('roc_auc'))}"]
        share = last.get("label_share") or {}
        rows.append(row + [", ".join(f"{k} {fmt(v, 2)}" for k, v in share.items())])
    return rows


def _table(task: TaskData, paths: dict[str, list[dict]]) -> TableBlock:
    columns = ["arm", "steps scored", "val items", "balanced accuracy first → last"]
    if task.kind == "binary" and task.positive_label is not None:
        columns += ["(FPR, TPR) first → last", "val ROC-AUC first → last"]
    return TableBlock(columns + ["answer share, last step"], _summary_rows(task, paths),
                      f"{task.name}: each RL arm's answers on val at step 0, its checkpoints and its last step "
                      "(RUN_DIR/TASK/ARM/val_path.jsonl)")


def path_blocks(task: TaskData, sink: FigureSink) -> list[Block]:
    """Section 6 addition: the figure(s) of the module docstring and the summary table; [] when no RL
    arm recorded a val path."""
    paths = val_paths(task)
    if not paths:
        return []
    if task.kind != "binary" or task.positive_label is None or len(task.labels) != 2:
        arms = [(a.label, paths[a.name]) for a in task.rl_arms() if a.name in paths]
        caption = f"{task.name}: recall of each label on val at step 0, every checkpoint and the last step, per RL arm"
        return [sink.image(f"{task.name}-val-recall-path", caption,
                           lambda path: F.render_png(lambda: recall_path_figure(task.name, arms, task.labels), path)),
                _table(task, paths)]
    return [*_binary_blocks(task, sink, paths), _table(task, paths)]


def _binary_blocks(task: TaskData, sink: FigureSink, paths: dict[str, list[dict]]) -> list[Block]:
    by_parent: dict[str, list] = {}
    for arm in task.rl_arms():
        points = path_points(paths.get(arm.name, []), task.positive_label, task.labels)
        if points:
            by_parent.setdefault(arm.parent or "?", []).append((arm.label, points, paths[arm.name][-1].get("n")))
    blocks: list[Block] = []
    for parent, arms in by_parent.items():
        try:
            roc = parent_roc(task, parent)
        except (OSError, ValueError):
            roc = None
        drawn = [(label, points) for label, points, _ in arms]
        caption = (f"{task.name}: the one curve. {parent}'s val ROC (its label-token scores) with each RL arm's answers "
                   "(FPR, TPR) at step 0, every checkpoint and the last step (star), numbered by step: a path along the "
                   "curve only moves the operating point, as a threshold on the SFT scores would; a point above the curve "
                   "is one no such threshold reaches")

        def draw(path, p=parent, r=roc, d=drawn):
            return F.render_png(lambda: one_curve_figure(task.name, p, r, d, task.positive_label), path)

        blocks.append(sink.image(f"{task.name}-one-curve-{parent}", caption, draw))
        if roc is None:
            blocks.append(Para(f"{parent}'s val ROC not drawn: no scored val predictions with both labels "
                               f"({Path(task.dir.name) / 'eval' / f'{parent}-val.parquet'}).", "note"))
        differ = sorted({str(n) for _, _, n in arms if roc is not None and n != roc["n"]})
        if differ:
            blocks.append(Para(f"The RL points were scored on {', '.join(differ)} val items and {parent}'s curve on "
                               f"{roc['n']}: different samples (the arms' eval_limit differs from the task's), so a "
                               "point's distance from the curve is partly sampling.", "note"))
    return blocks
