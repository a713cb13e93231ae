"""The majority-class baseline's pure parts (labelrl.ladder.majority); its row and paired verdicts
in a task are tested in test_collapse_ladder.py."""

from __future__ import annotations

import pytest

from labelrl.evaluate.io import Predictions, predictions_table
from labelrl.ladder.majority import constant_predictions, majority_label
from labelrl.types import LabelSpace

SPAM = LabelSpace(("ham", "spam"), kind="binary", positive="spam")


def test_the_most_frequent_label_and_the_first_label_on_a_tie():
    assert majority_label({"ham": 20, "spam": 30}, ["ham", "spam"]) == "spam"
    # a tie goes to the task's label order, not to the counts' order (catches max over the dict)
    assert majority_label({"spam": 25, "ham": 25}, ["ham", "spam"]) == "ham"
    assert majority_label({"ham": 25, "spam": 25}, ["spam", "ham"]) == "spam"
    # a label with no items counts 0
    assert majority_label({"2": 4}, ["1", "2", "3"]) == "2"


def test_a_balanced_training_sample_takes_the_majority_from_the_train_split(tmp_path):
    import json

    from labelrl.ladder.majority import _task_label, counted_from

    train = {"draw": "balanced", "label_counts": {"ham": 160, "spam": 160}, "split_label_counts": {"ham": 3800, "spam": 580}}
    (tmp_path / "samples.json").write_text(json.dumps({"train": train}))
    # equal counts would give the tie to the first label whichever is the majority: here "spam" first
    assert _task_label(tmp_path, ["spam", "ham"]) == "ham"
    assert counted_from(tmp_path) == "train split"  # what the report's note names
    train["draw"] = "stratified"
    train["label_counts"] = {"ham": 40, "spam": 280}  # a stratified sample's own counts are read
    (tmp_path / "samples.json").write_text(json.dumps({"train": train}))
    assert _task_label(tmp_path, ["spam", "ham"]) == "spam"
    assert counted_from(tmp_path) == "training sample"


def test_no_counts_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="label counts \\{\\} hold none of the labels \\['ham', 'spam'\\]"):
        majority_label({}, ["ham", "spam"])


def test_constant_predictions_keep_the_items_and_their_labels():
    truth = ["ham", "spam", "spam"]
    table = predictions_table(["a", "b", "c"], truth, ["spam", "ham", None], ["ok", "ok", "no_answer"], SPAM,
                              [[0.3, 0.7], [0.6, 0.4], [0.5, 0.5]])
    constant = constant_predictions(Predictions(table, SPAM, {}), "ham")
    assert constant.ids == ["a", "b", "c"] and constant.y_true == truth
    assert constant.y_pred == ["ham", "ham", "ham"] and constant.scores() is None  # no model, so no scores
    with pytest.raises(ValueError, match="majority label 'eggs' is not one of the labels"):
        constant_predictions(Predictions(table, SPAM, {}), "eggs")
