"""labelrl.evaluate.val_path: one checkpoint's record from label probabilities, and its ROC point."""

from __future__ import annotations

import numpy as np
import pytest

from labelrl.evaluate.val_path import read_val_path, roc_point, val_point
from labelrl.fileio import append_jsonl
from labelrl.types import LabelSpace

YES_NO = LabelSpace(("no", "yes"), kind="binary", positive="yes")
# (P(no), P(yes)) per item; the answer is the most probable label, the first on a tie.
TRUE = ["no", "no", "no", "yes", "yes", "yes"]
PROBS = np.array([[0.9, 0.1],    # no  → no
                  [0.4, 0.6],    # no  → yes (false positive)
                  [0.7, 0.3],    # no  → no
                  [0.2, 0.8],    # yes → yes
                  [0.65, 0.35],  # yes → no (miss)
                  [0.5, 0.5]])   # yes → no (tie: the first label)


def test_binary_record_by_hand():
    r = val_point(YES_NO, TRUE, PROBS)
    assert r["n"] == 6
    # recall no = 2/3 (items 0, 2), recall yes = 1/3 (item 3 only: the tie answers "no").
    # A tie broken towards the last label would give recall yes 2/3.
    assert r["recall"] == pytest.approx({"no": 2 / 3, "yes": 1 / 3})
    # answers: no, yes, no, yes, no, no → share no 4/6, yes 2/6
    assert r["label_share"] == pytest.approx({"no": 4 / 6, "yes": 2 / 6})
    # accuracy (2 + 1) / 6 = 0.5; balanced accuracy (2/3 + 1/3) / 2 = 0.5
    assert r["accuracy"] == pytest.approx(0.5) and r["balanced_accuracy"] == pytest.approx(0.5)
    # TPR = recall yes = 1/3; FPR = negatives answered yes = 1/3 (not 1 − TPR = 2/3)
    assert (r["fpr"], r["tpr"]) == pytest.approx((1 / 3, 1 / 3))
    # ROC-AUC of P(yes): positives 0.8, 0.35, 0.5 against negatives 0.1, 0.6, 0.3:
    # 0.8 beats 3, 0.35 beats 2 (0.1, 0.3), 0.5 beats 2 → 7/9. (The AUC of the answers would be 0.5.)
    assert r["roc_auc"] == pytest.approx(7 / 9)
    assert r["positive_label"] == "yes"


def test_categorical_record_has_no_roc_fields_and_null_recall_for_an_absent_label():
    labels = LabelSpace(("a", "b", "c"), kind="categorical")
    probs = np.array([[0.5, 0.3, 0.2], [0.1, 0.7, 0.2], [0.2, 0.2, 0.6]])
    r = val_point(labels, ["a", "b", "b"], probs)
    # answers a, b, c: recall a 1, b 1/2, c absent from the sample (null, not 0: nothing to recall)
    assert r["recall"] == {"a": 1.0, "b": 0.5, "c": None}
    assert r["label_share"] == pytest.approx({"a": 1 / 3, "b": 1 / 3, "c": 1 / 3})
    assert not {"fpr", "tpr", "roc_auc", "positive_label"} & r.keys()


def test_one_class_sample_has_no_auc_and_a_null_fpr():
    r = val_point(YES_NO, ["yes", "yes"], np.array([[0.3, 0.7], [0.6, 0.4]]))
    assert r["roc_auc"] is None and r["fpr"] is None and r["tpr"] == 0.5


def test_shape_mismatch_names_the_shapes():
    with pytest.raises(ValueError, match=r"shape \(6, 3\) for 6 items and 2 labels"):
        val_point(YES_NO, TRUE, np.ones((6, 3)) / 3)


def test_roc_point_takes_the_positive_label_it_is_given():
    record = {"recall": {"no": 2 / 3, "yes": 1 / 3}}
    assert roc_point(record, "yes", ["no", "yes"]) == pytest.approx((1 / 3, 1 / 3))
    # with "no" positive: TPR = recall no = 2/3, FPR = 1 − recall yes = 2/3
    assert roc_point(record, "no", ["no", "yes"]) == pytest.approx((2 / 3, 2 / 3))
    assert roc_point({"recall": {"no": None, "yes": 1.0}}, "yes", ["no", "yes"]) is None
    with pytest.raises(ValueError, match="needs a binary task"):
        roc_point(record, "yes", ["a", "b", "yes"])


def test_read_val_path_sorts_by_step_and_ignores_a_torn_last_line(tmp_path):
    for step in (4, 0, 2):
        append_jsonl(tmp_path / "val_path.jsonl", {"step": step, "n": 3})
    with open(tmp_path / "val_path.jsonl", "a", encoding="utf-8") as handle:
        handle.write('{"step": 6, "n"')  # a kill mid-append
    assert [r["step"] for r in read_val_path(tmp_path)] == [0, 2, 4]
    assert read_val_path(tmp_path / "absent") == []
