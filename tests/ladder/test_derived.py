"""The ``threshold`` arm: the SFT model's holdout scores with a rule chosen on val, checked against
scikit-learn on the same scores, recorded in the ledger as derived, never as a new look."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.metrics import accuracy_score, balanced_accuracy_score

from labelrl.evaluate.io import Predictions, predictions_table, write_predictions
from labelrl.evaluate.ledger import earlier_looks, read_ledger, record_evaluation
from labelrl.evaluate.metrics import classification_metrics
from labelrl.ladder.derived import ThresholdConfig, evaluate_threshold_arm, matched_name
from labelrl.types import LabelSpace

SPAM = LabelSpace(("ham", "spam"), kind="binary", positive="spam")
MOVIES = LabelSpace(("1", "2", "3", "4", "5"), kind="ordinal")


def scored(n: int, seed: int, labels: LabelSpace = SPAM, shift: float = 0.0) -> Predictions:
    """A scored model whose default rule (argmax) is biased: its scores favour the first label by ``shift``."""
    rng = np.random.default_rng(seed)
    truth = rng.integers(0, labels.k, n)
    logits = rng.normal(0, 1, (n, labels.k))
    logits[np.arange(n), truth] += 1.5
    logits[:, 0] += shift
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    table = predictions_table([f"i{i}" for i in range(n)], [labels.labels[t] for t in truth],
                              [labels.labels[i] for i in probs.argmax(axis=1)], ["ok"] * n, labels, probs)
    return Predictions(table, labels, {"model_spec": "run/sft/model", "model_fingerprint": "fp-sft",
                                       "split_fingerprint": "sp", "holdout_fingerprint": "hold-1", "method": "scores"})


def hard(pred_pos: np.ndarray, like: Predictions) -> Predictions:
    answers = ["spam" if p else "ham" for p in pred_pos]
    return Predictions(predictions_table(like.ids, like.y_true, answers, ["ok"] * like.n, SPAM), SPAM, {})


def write_parent(task_dir, labels: LabelSpace = SPAM, shift: float = 1.0) -> tuple[Predictions, Predictions]:
    val, holdout = scored(300, 1, labels, shift), scored(200, 2, labels, shift)
    for split, pred in (("val", val), ("holdout", holdout)):
        write_predictions(pred, task_dir / "eval" / f"sft-{split}.parquet")
    # the parent's one look at the holdout
    metrics = classification_metrics(holdout.y_true, holdout.y_pred, labels, scores=holdout.scores(), n_boot=0)
    record_evaluation(task_dir, split="holdout", model_spec="run/sft/model", model_fingerprint="fp-sft",
                      split_fingerprint="sp", metrics=metrics, holdout_fp="hold-1")
    return val, holdout


def test_val_chosen_threshold_on_the_holdout_matches_sklearn_and_is_no_new_look(tmp_path):
    task = tmp_path / "task"
    val, holdout = write_parent(task)
    # an RL arm's val predictions: positive for the top 35% of SFT's val scores
    p_val = val.scores()[:, 1]
    rl_val = p_val >= np.quantile(p_val, 0.65)
    write_predictions(hard(rl_val, val), task / "eval" / "grpo-val.parquet")
    cfg = ThresholdConfig(out=task / "threshold", parent=task / "sft", n_boot=50)
    state = evaluate_threshold_arm(task, "threshold", cfg, ["grpo"], "spam")

    # (a) the threshold is the one with the best val balanced accuracy, found by brute force here
    y_val = np.array(val.y_true) == "spam"
    best = max(np.unique(p_val), key=lambda t: (balanced_accuracy_score(y_val, p_val >= t), t))
    assert state["rule"]["threshold"] == pytest.approx(best)
    assert balanced_accuracy_score(y_val, p_val >= best) > balanced_accuracy_score(y_val, p_val >= 0.5)  # it moved
    # its holdout metrics are scikit-learn's on the same holdout scores
    y_hold, p_hold = np.array(holdout.y_true), holdout.scores()[:, 1]
    pred = np.where(p_hold >= best, "spam", "ham")
    assert state["holdout"]["balanced_accuracy"] == pytest.approx(balanced_accuracy_score(y_hold, pred))
    assert state["holdout"]["accuracy"] == pytest.approx(accuracy_score(y_hold, pred))
    # (b) matched to the RL arm's val recall
    recall = (rl_val & y_val).sum() / y_val.sum()
    t = state["matched"]["grpo"]["rule"]["threshold"]
    assert (p_val[y_val] >= t).mean() >= recall - 1e-12 and state["matched"]["grpo"]["rule"]["val_metrics"]["recall"] >= recall
    assert (task / "eval" / f"{matched_name('threshold', 'grpo')}-holdout.parquet").is_file()

    # the ledger: derived records, and still exactly one look at the holdout by the SFT model
    records = read_ledger(task)
    derived = [r for r in records if r.get("derived")]
    assert {r["split"] for r in derived} == {"val", "holdout"} and len([r for r in derived if r["split"] == "holdout"]) == 2
    assert all(r["method"] == "threshold" and r["derived_from"] == "run/sft/model" for r in derived)
    looks = earlier_looks(task, "fp-sft", "sp", "hold-1")
    assert len(looks) == 1 and not looks[0].get("derived")


def test_a_rerun_reads_the_derived_evaluations_back(tmp_path):
    task = tmp_path / "task"
    write_parent(task)
    cfg = ThresholdConfig(out=task / "threshold", parent=task / "sft", n_boot=20, recall_match=False)
    first = evaluate_threshold_arm(task, "threshold", cfg, [], "spam")
    lines = len(read_ledger(task))
    again = evaluate_threshold_arm(task, "threshold", cfg, [], "spam")
    assert again["holdout"] == first["holdout"] and len(read_ledger(task)) == lines


def test_ordinal_tasks_get_per_label_offsets_that_beat_argmax_on_val(tmp_path):
    task = tmp_path / "task"
    val, _ = write_parent(task, MOVIES, shift=1.2)  # grade 1 over-predicted by the biased scores
    cfg = ThresholdConfig(out=task / "threshold", parent=task / "sft", n_boot=20)
    state = evaluate_threshold_arm(task, "threshold", cfg, ["grpo"], None)
    assert state["rule"]["kind"] == "offsets" and state["matched"] == {}  # recall matching is for binary tasks
    assert state["rule"]["offsets"]["1"] == 0.0
    argmax_ba = balanced_accuracy_score(val.y_true, val.y_pred)
    assert state["rule"]["val_metrics"]["balanced_accuracy"] > argmax_ba + 0.02
    report = json.loads((task / "eval" / "threshold-val.json").read_text())
    assert report["metrics"]["balanced_accuracy"] == pytest.approx(state["rule"]["val_metrics"]["balanced_accuracy"])


def test_missing_parent_predictions_are_a_clear_error(tmp_path):
    cfg = ThresholdConfig(out=tmp_path / "threshold", parent=tmp_path / "sft")
    with pytest.raises(ValueError, match="parent 'sft'"):
        evaluate_threshold_arm(tmp_path, "threshold", cfg, [], "spam")


def test_a_rule_chosen_on_a_handful_of_val_items_of_a_label_says_so(tmp_path):
    """rare.csv's val split held 4 "fraud" messages: a threshold chosen there reached val BA 1.000
    and less than SFT on the holdout. The arm's state names the thin label, and the console line
    and the report's note say its holdout figure is the measure."""
    from labelrl.evaluate.decision import MIN_RULE_ITEMS, thin_labels, thin_words
    from labelrl.report.comparison import _status_note
    from labelrl.report.run_data import ArmData

    task = tmp_path / "task"
    val, holdout = write_parent(task)
    assert thin_labels(val) == {}  # 300 items of two labels: both well covered
    keep = [i for i, y in enumerate(val.y_true) if y == "ham"] + [i for i, y in enumerate(val.y_true) if y == "spam"][:4]
    write_predictions(val.take(keep), task / "eval" / "sft-val.parquet")
    cfg = ThresholdConfig(out=task / "threshold", parent=task / "sft", n_boot=20, recall_match=False)
    state = evaluate_threshold_arm(task, "threshold", cfg, [], "spam")
    assert state["thin_val"] == {"spam": 4}
    words = thin_words(state["thin_val"])
    assert words == "val held only 4 'spam' items: a rule chosen on so few fits them; its holdout figure is the measure"
    arm = ArmData(name="threshold", type="threshold", status="done", dir=task / "threshold", parent="sft",
                  rule=state["rule"], thin_val=state["thin_val"])
    assert _status_note(arm).endswith("; " + words)
    # the edge of the rule: MIN_RULE_ITEMS items is enough, one fewer is not; a label val lacks counts 0
    labels = LabelSpace(("a", "b", "c"), kind="categorical")
    n = MIN_RULE_ITEMS
    table = predictions_table([f"i{i}" for i in range(2 * n - 1)], ["a"] * n + ["b"] * (n - 1), ["a"] * (2 * n - 1),
                              ["ok"] * (2 * n - 1), labels)
    assert thin_labels(Predictions(table, labels, {})) == {"b": n - 1, "c": 0}
    assert thin_words({"b": 1}).startswith("val held only 1 'b' item:")
