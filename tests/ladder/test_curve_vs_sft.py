"""labelrl.ladder.curve_vs_sft: the curve and the point in paired.json and in each RL arm's verdict."""

from __future__ import annotations

import json

import numpy as np

from labelrl.evaluate.io import Predictions, predictions_table, write_predictions
from labelrl.fileio import atomic_write_json
from labelrl.ladder.analysis import task_verdict
from labelrl.ladder.curve_vs_sft import KIND, add_curve_point, curve_point_comparisons
from labelrl.types import LabelSpace

SPAM = LabelSpace(("ham", "spam"), kind="binary", positive="spam")
TSTATE = {"kind": "binary", "positive_label": "spam", "success_threshold": None}


def write_holdout(task_dir, arm: str, is_spam: np.ndarray, p_spam: np.ndarray, scored: bool = True) -> None:
    y = ["spam" if v else "ham" for v in is_spam]
    answers = ["spam" if v > 0.5 else "ham" for v in p_spam]
    probs = np.stack([1 - p_spam, p_spam], 1) if scored else None
    table = predictions_table([f"i{i}" for i in range(len(y))], y, answers, ["ok"] * len(y), SPAM, probs)
    write_predictions(Predictions(table, SPAM, {}), task_dir / "eval" / f"{arm}-holdout.parquet")


def collapsed_task(task_dir):
    """sft answers at a middle threshold; grpo ranks the items exactly as sft does (P(spam)⁴, strictly
    increasing) but answers spam only where sft's P(spam) > 0.5^¼ ≈ 0.84: a move along the curve."""
    rng = np.random.default_rng(0)
    is_spam = rng.random(120) < 0.4
    sft = np.clip(np.where(is_spam, 0.7, 0.3) + 0.25 * rng.standard_normal(120), 0, 1)
    write_holdout(task_dir, "sft", is_spam, sft)
    write_holdout(task_dir, "grpo", is_spam, sft ** 4)
    return {"sft": {"type": "sft", "status": "done"},
            "grpo": {"type": "rl", "status": "done", "from": "sft", "train": {"failed_positive_frac": 0.1}}}


def test_comparisons_are_added_to_paired_json_once_and_keep_the_other_kinds(tmp_path):
    arms = collapsed_task(tmp_path)
    (tmp_path / "analysis").mkdir()
    atomic_write_json(tmp_path / "analysis" / "paired.json", [{"kind": "vs_sft", "a": "sft", "b": "grpo", "result": {}}])
    made = curve_point_comparisons(tmp_path, arms, TSTATE, n_boot=200)
    curve_point_comparisons(tmp_path, arms, TSTATE, n_boot=200)  # a re-analysis replaces, never duplicates
    entries = json.loads((tmp_path / "analysis" / "paired.json").read_text())
    assert [c["kind"] for c in entries] == ["vs_sft", KIND]
    entry = entries[1]
    assert (entry["a"], entry["b"], entry["a_runs"], entry["b_runs"]) == ("sft", "grpo", ["sft"], ["grpo"])
    metrics = entry["result"]["metrics"]
    # a monotone transform of the same scores: the same ranking (ΔAUC 0 on every draw), another point
    assert metrics["roc_auc"]["delta"] == 0.0 and metrics["roc_auc"]["ci"] == [0.0, 0.0]
    assert metrics["recall"]["b"] < metrics["recall"]["a"] and metrics["recall"]["ci"][1] < 0
    assert made["comparisons"][0]["curve"] == entry["result"]["curve"]


def test_the_verdict_states_the_curve_and_the_point(tmp_path):
    arms = collapsed_task(tmp_path)
    (tmp_path / "analysis").mkdir()
    analysis = {"paired": {"comparisons": [{"kind": "vs_sft", "a": "sft", "b": "grpo", "verdict": "v",
                                            "words": "worse (ΔBA -0.2 [-0.3, -0.1] over 120 items)"}]},
                "curve_point": curve_point_comparisons(tmp_path, arms, TSTATE, n_boot=200)}
    [verdict] = task_verdict(arms, analysis, TSTATE)
    # equal scores: Δ = 0 on every draw, so se = 0 and nothing larger than 0 could have been missed
    assert verdict["curve"].startswith("curve: ΔROC-AUC +0.000 [+0.000, +0.000] (no detectable difference, could detect "
                                       "|ROC-AUC| ≥ 0.000; grpo ")
    assert verdict["curve"].endswith("over 120 items; 1/1 seeds no different)")
    assert verdict["point"].startswith("point (grpo vs sft, positive 'spam'): recall ")
    # the text keeps the answers' verdict and adds the ranking and the point after it
    text = verdict["text"]
    assert text.startswith("grpo: vs sft: worse (ΔBA")
    assert text.index("vs sft: worse") < text.index("; curve: ΔROC-AUC") < text.index("; point (grpo vs sft")


def test_unscored_arms_and_other_label_kinds_are_left_out_with_a_reason(tmp_path):
    arms = collapsed_task(tmp_path)
    rng = np.random.default_rng(1)
    write_holdout(tmp_path, "grpo", rng.random(120) < 0.4, rng.random(120), scored=False)  # scored by generation
    made = curve_point_comparisons(tmp_path, arms, TSTATE, n_boot=50)
    assert made["comparisons"] == [] and "no label-token scores" in made["left_out"]["grpo"]
    assert "for binary tasks" in curve_point_comparisons(tmp_path, arms, {"kind": "ordinal"}, 50)["note"]
    verdicts = [{"arm": "grpo", "text": "grpo: vs sft: worse"}]
    add_curve_point(verdicts, made)
    assert verdicts == [{"arm": "grpo", "text": "grpo: vs sft: worse", "curve": None, "point": None}]
