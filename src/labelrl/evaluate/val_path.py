"""The RL policy's path on val: what its argmax answers and label-token scores look like at each
evaluated checkpoint, one JSON line per step in ``RUN_DIR/val_path.jsonl``.

The RL loop (``labelrl.train.val_scoring``) scores the policy on the val sample at step 0 (the
starting model), every ``--checkpoint-every`` steps and at the last step, with the label-token
probabilities ``labelrl eval`` uses, and writes ``val_point`` of each. The report draws the path
from the file alone: for a binary task, the points (FPR, TPR) on the SFT parent's val ROC, which
shows whether RL moved along the curve the SFT scores fixed (a threshold) or changed the ranking.

Fields of a line (``val_point`` plus ``step`` and ``seconds``):

* ``step`` (0 = before the first update), ``n`` items, ``seconds`` the scoring took;
* ``accuracy`` and ``balanced_accuracy`` (mean recall over the labels present) of the argmax
  answers, as ``labelrl.evaluate.metrics.basic_metrics`` computes them;
* ``recall`` {label: share of the label's items answered with it} (null for a label absent from
  the sample) and ``label_share`` {label: share of all items answered with it};
* binary tasks: ``positive_label``, ``tpr`` (= recall of the positive label) and ``fpr`` (share of
  negatives answered positive = 1 − recall of the negative label) of the argmax answers, and
  ``roc_auc`` of the positive label's probability (null when the sample has one class only).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
from sklearn.metrics import roc_auc_score

from labelrl.evaluate.metrics import basic_metrics
from labelrl.fileio import read_jsonl
from labelrl.types import LabelSpace

VAL_PATH_FILE = "val_path.jsonl"


def val_point(labels: LabelSpace, y_true: Sequence[str], probs: np.ndarray) -> dict:
    """The record of one evaluated checkpoint (module docstring) from the label probabilities
    ``probs [N, K]`` (columns in ``labels.labels`` order) of the items whose labels are ``y_true``.
    The answer is the most probable label (the first on a tie, as ``labelrl eval`` takes it)."""
    probs = np.asarray(probs, dtype=np.float64)
    if probs.shape != (len(y_true), labels.k):
        raise ValueError(f"probabilities of shape {probs.shape} for {len(y_true)} items and {labels.k} labels; "
                         "give one row per item and one column per label")
    names = list(labels.labels)
    true = np.array([labels.index(y) for y in y_true], dtype=np.int64)
    pred = probs.argmax(axis=1)
    out: dict = {"n": len(true), **basic_metrics([names[i] for i in true], [names[i] for i in pred])}
    out["recall"] = {x: (float(np.mean(pred[true == k] == k)) if (true == k).any() else None) for k, x in enumerate(names)}
    out["label_share"] = {x: float(np.mean(pred == k)) for k, x in enumerate(names)}
    if labels.kind == "binary":
        pos = labels.index(labels.positive_label)
        is_pos = true == pos
        out["positive_label"] = labels.positive_label
        out["tpr"] = float(np.mean(pred[is_pos] == pos)) if is_pos.any() else None
        out["fpr"] = float(np.mean(pred[~is_pos] == pos)) if (~is_pos).any() else None
        both = 0 < int(is_pos.sum()) < len(true)
        out["roc_auc"] = float(roc_auc_score(is_pos, probs[:, pos])) if both else None
    return out


def read_val_path(run_dir: str | Path) -> list[dict]:
    """The records of ``RUN_DIR/val_path.jsonl`` in step order ([] when absent; a torn last line is
    ignored, as ``labelrl.fileio.read_jsonl`` does)."""
    records = [r for r in read_jsonl(Path(run_dir) / VAL_PATH_FILE) if isinstance(r, dict) and "step" in r]
    return sorted(records, key=lambda r: r["step"])


def roc_point(record: dict, positive_label: str, labels: Sequence[str]) -> tuple[float, float] | None:
    """(FPR, TPR) of a binary record's answers with ``positive_label`` as the positive class, from
    its per-label recall (so a report may take another positive label than the run did):
    TPR = recall of the positive label, FPR = 1 − recall of the other. None when undefined."""
    recall = record.get("recall") or {}
    negatives = [x for x in labels if x != positive_label]
    if len(negatives) != 1:
        raise ValueError(f"positive_label {positive_label!r} with labels {list(labels)}: an ROC point needs a binary "
                         "task and one of its two labels as the positive one")
    tpr, specificity = recall.get(positive_label), recall.get(negatives[0])
    if not isinstance(tpr, (int, float)) or not isinstance(specificity, (int, float)):
        return None
    return 1.0 - float(specificity), float(tpr)
