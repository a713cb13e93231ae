"""Training labels from another answer key: train on a relabel arm's labels, items unchanged.

The seed's "noisy vs clean" result came from retraining on relabelled data. Relabelling changes
labels, not items: the training sample is drawn on the data's own labels (so its ids are the
ones every arm of the splits trains on, and the ones the relabel arm relabelled), and only then
does each item take its label from the other key. The splits (and their fingerprint), val and
holdout are untouched, so a model trained on either key is scored on the same items.

An item the key has no label for (the judge gave none it could read) keeps its own label rather
than being dropped: dropping would make the two training sets differ in size and in which items
they hold, and the comparison would no longer be of the labels alone. How many kept theirs is
recorded (``RUN_DIR/train_labels.json``) and shown in the report.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Sequence

from labelrl.types import Example, LabelSpace

TRAIN_LABELS_FILE = "train_labels.json"


def read_label_key(path: Path) -> dict[str, str]:
    """id → label of a JSON key file: a mapping id → label, or a relabel arm's
    ``answer_key.json`` (``{"labels": {id: label}, "original": …}``). Null labels are left out."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"train_labels={path}: no such file; give a JSON file of id → label (a relabel arm's "
                         "answer_key.json, made when that arm finishes)")
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"train_labels={path}: not valid JSON ({exc}); give a JSON object of id → label") from None
    if isinstance(obj, dict) and isinstance(obj.get("labels"), dict):  # a relabel arm's answer key
        obj = obj["labels"]
    if not isinstance(obj, dict):
        raise ValueError(f"train_labels={path}: a JSON {type(obj).__name__}; give a JSON object of id → label")
    return {str(k): str(v) for k, v in obj.items() if v is not None}


def replace_labels(examples: Sequence[Example], key: dict[str, str], labels: LabelSpace,
                   source: str) -> tuple[list[Example], dict]:
    """``examples`` (in order) with each label taken from ``key`` where it has one, and the
    record of what was done (``TRAIN_LABELS_FILE``). A key label outside the task's label set
    is an error; so is a key with a label for none of the items (made from other data)."""
    out, kept, changed = [], [], 0
    for ex in examples:
        if ex.id not in key:
            kept.append(ex.id)
            out.append(ex)
            continue
        label = labels.normalise(key[ex.id])
        if label is None:
            raise ValueError(f"train_labels={source}: item {ex.id!r} has label {key[ex.id]!r}, not one of "
                             f"{', '.join(labels.labels)}; fix the key or declare the label set (--labels)")
        changed += label != ex.label
        out.append(dataclasses.replace(ex, label=label))
    if len(kept) == len(out):
        raise ValueError(f"train_labels={source}: none of the {len(out)} training items has a label there; make the key "
                         "from the same data and splits (its ids must be the items' ids)")
    record = {"source": source, "n_train": len(out), "n_replaced": len(out) - len(kept), "n_changed": changed,
              "n_kept_original": len(kept), "kept_original_ids": kept, "labels": {ex.id: ex.label for ex in out}}
    return out, record
