"""The majority-class baseline: the constant predictor every table starts from.

The predictor answers the most frequent label of the task's training sample (``samples.json``;
of the train split when the sample was drawn label-balanced; a tie goes to the first of the
task's labels in their order) on every item. Its val and holdout
metrics come from the shared samples alone: its predictions are a finished arm's predictions
(the first direct SFT arm's) with every answer replaced by that label, so it uses no model and
no holdout look. Every trained arm is compared with it, paired on the holdout items
(``labelrl.evaluate.paired``), as kind ``vs_majority``: an arm that does no better than it has
learnt nothing a constant answer does not give, and an arm collapsed to one answer
(``labelrl.train.collapse``) usually lands right on it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping, Sequence

MAJORITY = "majority class"
MAJORITY_FILE = "majority.json"
# Arms trained on the task (the threshold arm reuses its parent's scores; distill and relabel
# arms answer nothing on the holdout).
TRAINED_TYPES = ("sft", "control", "cot_sft", "rl", "random_reward", "cot_rl")


def majority_label(label_counts: Mapping[str, int], labels: Sequence[str]) -> str:
    """The most frequent label of ``label_counts``; on a tie, the first of ``labels`` among the
    tied ones. ValueError when nothing was counted."""
    counted = {label: int(label_counts.get(label, 0)) for label in labels}
    if not any(counted.values()):
        raise ValueError(f"label counts {dict(label_counts)} hold none of the labels {list(labels)}: the majority "
                         "class needs the training sample's label counts (TASK/samples.json)")
    top = max(counted.values())
    return next(label for label in labels if counted[label] == top)


def constant_predictions(pred, label: str):
    """``pred``'s items and true labels with every answer ``label`` (parsed, no scores)."""
    from labelrl.evaluate.io import Predictions, predictions_table

    if label not in pred.labels.labels:
        raise ValueError(f"majority label {label!r} is not one of the labels {list(pred.labels.labels)} of {pred.info.get('source')}")
    n = pred.n
    table = predictions_table(pred.ids, pred.y_true, [label] * n, ["ok"] * n, pred.labels)
    return Predictions(table, pred.labels, {"method": "majority", "label": label})


def _reference_arm(arms: dict[str, dict]) -> str | None:
    """The finished arm whose items the baseline is scored on: the first direct SFT run."""
    return next((n for n, st in arms.items() if st["type"] == "sft"), None)


def _majority_counts(task_dir: Path) -> tuple[dict[str, int], str]:
    """(the label counts that name the majority, whose they are): the training sample's, or the
    train split's when the sample was drawn label-balanced (its counts equal by construction)."""
    train = json.loads((task_dir / "samples.json").read_text(encoding="utf-8"))["train"]
    if train.get("draw") == "balanced":
        return train["split_label_counts"], "train split"
    return train["label_counts"], "training sample"


def counted_from(task_dir: Path) -> str:
    """Whose label counts name the majority ("training sample" or "train split")."""
    return _majority_counts(task_dir)[1]


def _task_label(task_dir: Path, labels: Sequence[str]) -> str:
    return majority_label(_majority_counts(task_dir)[0], labels)


def majority_predictions(task_dir: Path, arms: dict[str, dict], split: str):
    """(label, the constant predictor's Predictions on ``split``) from the reference arm's file."""
    from labelrl.evaluate.io import read_predictions
    from labelrl.ladder.layout import eval_paths

    reference = _reference_arm(arms)
    if reference is None:
        raise ValueError("no finished direct SFT arm: the majority class is scored on its items")
    pred = read_predictions(eval_paths(task_dir, reference, split)[0])
    label = _task_label(task_dir, pred.labels.labels)
    return label, constant_predictions(pred, label)


def majority_baseline(task_dir: Path, arms: dict[str, dict], n_boot: int) -> dict:
    """``{"label", "counted", "from", "val", "holdout"}`` (``counted``: whose label counts name it,
    ``counted_from``; summary metrics with 95% intervals), also saved as ``analysis/majority.json``."""
    from labelrl.evaluate.ledger import summary_metrics
    from labelrl.evaluate.metrics import classification_metrics
    from labelrl.fileio import atomic_write_json

    out: dict = {"from": _reference_arm(arms), "counted": counted_from(task_dir)}
    for split in ("val", "holdout"):
        label, pred = majority_predictions(task_dir, arms, split)
        out["label"] = label
        out[split] = summary_metrics(classification_metrics(pred.y_true, pred.y_pred, pred.labels, n_boot=max(n_boot, 1)))
    atomic_write_json(task_dir / "analysis" / MAJORITY_FILE, out)
    return out


def majority_comparisons(task_dir: Path, arms: dict[str, dict], grouped: dict[str, list[str]], n_boot: int) -> list[dict]:
    """Every trained arm (its runs over seeds) against the majority class on the holdout: the
    entries ``paired.json`` holds, kind ``vs_majority``; none without a direct SFT arm or without
    the task's ``samples.json`` (a run directory not made by the ladder)."""
    from labelrl.evaluate.io import read_predictions
    from labelrl.evaluate.paired import paired_comparison
    from labelrl.ladder.layout import eval_paths

    if _reference_arm(arms) is None or not (task_dir / "samples.json").is_file():
        return []
    label, constant = majority_predictions(task_dir, arms, "holdout")
    name = f"{MAJORITY} ({label})"
    out = []
    for group, runs in grouped.items():
        if arms[runs[0]]["type"] not in TRAINED_TYPES:
            continue
        preds = [read_predictions(eval_paths(task_dir, r, "holdout")[0]) for r in runs]
        result = paired_comparison([constant], preds, names=(name, group), n_boot=max(n_boot, 1))
        out.append({"kind": "vs_majority", "a": name, "b": group, "a_runs": [], "b_runs": runs, "label": label,
                    "result": result})
    return out
