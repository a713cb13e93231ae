"""The comparison table's majority-class rows (labelrl.report.baselines): they say whose label
counts named the constant answer."""

from __future__ import annotations

from pathlib import Path

from labelrl.report.baselines import majority_rows
from labelrl.report.run_data import TaskData

COLS = [("balanced_accuracy", "balanced accuracy")]


def _task(**majority) -> TaskData:
    metrics = {"n": 557, "balanced_accuracy": 0.5, "balanced_accuracy_ci": [0.5, 0.5]}
    return TaskData("spam", Path("."), majority={"label": "ham", "from": "sft@s0", "val": metrics, "holdout": metrics, **majority})


def test_the_majority_row_names_the_counts_that_chose_its_label():
    rows = majority_rows(_task(counted="train split"), COLS)
    assert [r[3] for r in rows] == ["val", "holdout"] and rows[0][0] == "majority class (ham)"
    assert "the train split's most frequent label" in rows[0][-1] and "sft@s0's items" in rows[0][-1]
    # a run before the record said (a stratified sample, whose counts are the split's shares)
    assert "the training sample's most frequent label" in majority_rows(_task(), COLS)[0][-1]
    assert majority_rows(TaskData("spam", Path(".")), COLS) == []
