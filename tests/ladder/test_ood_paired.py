"""Paired comparisons on every OOD set (labelrl.ladder.paired_arms via analysis.paired_comparisons):
the holdout's comparisons again on each OOD holdout, the threshold arms' side the parent's OOD scores
under their val-chosen rule, and the verdict's "on OOD" lines."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.metrics import balanced_accuracy_score

from labelrl.evaluate.io import Predictions, predictions_table, write_predictions
from labelrl.ladder.analysis import paired_comparisons, task_verdict
from labelrl.types import LabelSpace

SPAM = LabelSpace(("ham", "spam"), kind="binary", positive="spam")
TSTATE = {"kind": "binary", "positive_label": "spam", "success_threshold": None, "ood": ["tweets"]}
RULE = {"kind": "threshold", "positive_label": "spam", "threshold": 0.3, "chosen_by": "best val balanced accuracy"}


def write(task_dir, name: str, is_spam: np.ndarray, p_spam: np.ndarray) -> None:
    y = ["spam" if v else "ham" for v in is_spam]
    answers = ["spam" if v > 0.5 else "ham" for v in p_spam]
    table = predictions_table([f"i{i}" for i in range(len(y))], y, answers, ["ok"] * len(y), SPAM,
                              np.stack([1 - p_spam, p_spam], 1))
    write_predictions(Predictions(table, SPAM, {"source": name}), task_dir / "eval" / f"{name}.parquet")


@pytest.fixture
def task(tmp_path):
    """On the holdout grpo and corpo score as sft does; on the OOD set grpo answers every item right and corpo
    every item wrong, so any holdout number in an OOD line (or the reverse) shows."""
    rng = np.random.default_rng(3)
    for tag, n in (("holdout", 80), ("ood-tweets", 60)):
        is_spam = rng.random(n) < 0.5
        sft = np.clip(np.where(is_spam, 0.55, 0.35) + 0.2 * rng.standard_normal(n), 0.01, 0.99)
        write(tmp_path, f"sft-{tag}", is_spam, sft)
        if tag == "holdout":  # the threshold arm's own evaluation exists on the holdout only
            write(tmp_path, f"threshold-{tag}", is_spam, (sft >= RULE["threshold"]).astype(float))
        # on the holdout each swaps the scores of a spam item it gets right and one it gets wrong: the
        # same recall and balanced accuracy as sft, yet answers that moved (2 of 80 items differ)
        moved = sft.copy()
        i, j = np.flatnonzero(is_spam & (sft > 0.5))[0], np.flatnonzero(is_spam & (sft <= 0.5))[0]
        moved[[i, j]] = moved[[j, i]]
        grpo = np.where(is_spam, 0.9, 0.1) if tag != "holdout" else moved
        corpo = np.where(is_spam, 0.1, 0.9) if tag != "holdout" else moved
        write(tmp_path, f"grpo-{tag}", is_spam, grpo)
        write(tmp_path, f"corpo-{tag}", is_spam, corpo)
    (tmp_path / "analysis").mkdir()
    rl = {"type": "rl", "status": "done", "from": "sft", "ood": {"tweets": {}}}
    arms = {"sft": {"type": "sft", "status": "done", "ood": {"tweets": {}}},
            "grpo": rl | {"config": {"preset": "grpo"}}, "corpo": rl | {"config": {"preset": "corpo"}},
            "threshold": {"type": "threshold", "status": "done", "from": "sft", "rule": RULE}}
    return tmp_path, arms


def test_every_holdout_comparison_is_made_again_on_the_ood_set(task):
    task_dir, arms = task
    made = paired_comparisons(task_dir, arms, n_boot=200, ood=["tweets"])
    saved = json.loads((task_dir / "analysis" / "paired.json").read_text())
    kinds = {(c["split"], c["kind"], c["a"], c["b"]) for c in saved}
    for split in ("holdout", "ood-tweets"):
        assert {(split, "vs_sft", "sft", "grpo"), (split, "vs_sft", "sft", "corpo"), (split, "vs_threshold", "threshold", "grpo"),
                (split, "vs_threshold", "threshold", "corpo"), (split, "ablation", "grpo", "corpo")} <= kinds
    assert not any(c["kind"] == "vs_majority" and c["split"] != "holdout" for c in saved)
    assert made["left_out"] == {}
    ood = {(c["kind"], c["b"]): c for c in saved if c["split"] == "ood-tweets"}
    # grpo is right on every OOD item: ΔBA vs sft = 1 − BA(sft's argmax on the OOD items)
    sft = _read(task_dir, "sft-ood-tweets")
    sft_ba = balanced_accuracy_score(sft["label"], sft["prediction"])
    assert ood[("vs_sft", "grpo")]["result"]["metrics"]["balanced_accuracy"]["delta"] == pytest.approx(1 - sft_ba)
    # the threshold arm out of domain: sft's OOD scores under the val-chosen rule (P(spam) ≥ 0.3), not its argmax
    thresholded = np.where(sft["score"] >= RULE["threshold"], "spam", "ham")
    t_ba = balanced_accuracy_score(sft["label"], thresholded)
    assert t_ba != pytest.approx(sft_ba)
    assert ood[("vs_threshold", "corpo")]["result"]["metrics"]["balanced_accuracy"]["delta"] == pytest.approx(0 - t_ba)
    assert ood[("vs_threshold", "corpo")]["result"]["n"] == 60


def _read(task_dir, name: str):
    import pandas as pd

    return pd.read_parquet(task_dir / "eval" / f"{name}.parquet")


def test_the_verdict_says_the_ood_comparisons_apart_from_the_holdout_ones(task):
    task_dir, arms = task
    analysis = {"paired": paired_comparisons(task_dir, arms, n_boot=200, ood=["tweets"])}
    by_arm = {v["arm"]: v for v in task_verdict(arms, analysis, TSTATE)}
    grpo, corpo = by_arm["grpo"], by_arm["corpo"]
    # the holdout line is the holdout's (equal predictions: ΔBA 0), never overwritten by the OOD one
    assert grpo["vs_sft"].startswith("vs sft: no detectable difference (ΔBA +0.000")
    head, _, ood_part = grpo["text"].partition("; on OOD tweets: ")
    assert "vs sft: better" in ood_part and "vs threshold (SFT + threshold chosen on val): better" in ood_part
    assert "better" not in head
    # the holdout ablation is in the holdout part, under both arms (equal predictions there: ΔBA 0)
    held = "ablation corpo vs grpo (same parent): no detectable difference (ΔBA +0.000"
    assert held in head and held in corpo["text"].partition("; on OOD tweets: ")[0]
    assert grpo["ablation"] == corpo["ablation"] and grpo["ablation"][0].startswith(held)
    # the ablation (B − A = corpo − grpo) is stated under both of its arms
    line = "ablation corpo vs grpo (same parent): worse (ΔBA -1.000 [-1.000, -1.000] over 60 items; 1/1 seeds lower)"
    assert line in ood_part and line in corpo["text"]
    assert grpo["ood"]["tweets"][0].startswith("vs sft: better")


def test_a_missing_ood_evaluation_is_left_out_with_its_reason(task):
    task_dir, arms = task
    (task_dir / "eval" / "corpo-ood-tweets.parquet").unlink()
    made = paired_comparisons(task_dir, arms, n_boot=50, ood=["tweets"])
    assert {"vs_sft corpo vs sft on ood-tweets", "ablation corpo vs grpo on ood-tweets"} <= set(made["left_out"])
    ood = [c for c in made["comparisons"] if c["split"] == "ood-tweets"]
    assert {(c["kind"], c["b"]) for c in ood} == {("vs_sft", "grpo"), ("vs_threshold", "grpo")}
    # the holdout still fails loudly: a missing holdout evaluation is a broken task, not a left-out set
    (task_dir / "eval" / "corpo-holdout.parquet").unlink()
    with pytest.raises(ValueError, match="no such predictions file"):
        paired_comparisons(task_dir, arms, n_boot=50, ood=["tweets"])


def test_runs_descending_from_the_same_sft_seed_are_paired():
    from labelrl.ladder.paired_arms import root_run, seeds_paired

    arms = {f"sft@s{k}": {"type": "sft"} for k in range(2)}
    arms |= {f"grpo@s{k}": {"type": "rl", "from": f"sft@s{k}"} for k in range(2)}
    arms |= {f"corpo@s{k}": {"type": "rl", "from": f"sft@s{k}"} for k in range(2)}
    arms |= {f"threshold@s{k}": {"type": "threshold", "from": f"sft@s{k}"} for k in range(2)}
    rules = {"threshold@s0 at grpo@s0's val recall": ("sft@s0", {})}
    assert root_run(arms, "threshold@s1") == "sft@s1" and root_run(arms, "threshold@s0 at grpo@s0's val recall", rules) == "sft@s0"
    assert seeds_paired(arms, ["sft@s0", "sft@s1"], ["grpo@s0", "grpo@s1"])
    assert seeds_paired(arms, ["grpo@s0", "grpo@s1"], ["corpo@s0", "corpo@s1"])
    assert seeds_paired(arms, ["threshold@s0", "threshold@s1"], ["grpo@s0", "grpo@s1"])
    assert not seeds_paired(arms, ["sft@s0", "sft@s1"], ["grpo@s1", "grpo@s0"])  # out of order: not seed k with seed k
    assert not seeds_paired(arms, ["sft@s0"], ["grpo@s0"])  # one run: nothing to pair
