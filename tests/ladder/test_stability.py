"""labelrl.ladder.stability: the spread over seeds, the step-to-step changes from a run's files, and
CoRPO against GRPO paired by seed, with the arithmetic in comments."""

from __future__ import annotations

import json

import pytest

from labelrl import metrics_keys as K
from labelrl.evaluate.val_path import VAL_PATH_FILE
from labelrl.ladder.stability import (add_stability, difference_words, estimator_family, median_abs_change,
                                      seed_differences, seed_sd, stability_analysis)


def test_median_abs_change_takes_the_median_of_the_absolute_steps():
    # |Δ| = 0.5, 0.2, 0.0, 0.4 → sorted 0.0, 0.2, 0.4, 0.5 → median (0.2 + 0.4) / 2 = 0.3
    assert median_abs_change([0.0, 0.5, 0.3, 0.3, 0.7]) == pytest.approx(0.3)
    # a non-finite or missing value is skipped, not counted as a jump: 0.1 → 0.2 → 0.4: |Δ| 0.1, 0.2 → 0.15
    assert median_abs_change([0.1, None, float("nan"), 0.2, 0.4]) == pytest.approx(0.15)
    # one jump in a steady run: |Δ| 0, 0, 0.9 → the median 0 (a mean would say 0.3)
    assert median_abs_change([0.5, 0.5, 0.5, -0.4]) == 0.0
    assert median_abs_change([0.4]) is None and median_abs_change([]) is None


def test_seed_sd_is_the_sample_standard_deviation():
    # mean 0.7; deviations ±0.1 → Σ = 0.02, / (n − 1 = 1) → sd √0.02 ≈ 0.1414 (ddof 0 would give 0.1)
    assert seed_sd([0.6, 0.8]) == pytest.approx(0.02 ** 0.5)
    assert seed_sd([0.6]) is None and seed_sd([0.6, None]) is None


def test_seed_differences_pair_by_seed_and_run_the_sign_test():
    corpo = {0: 0.10, 1: 0.20, 2: 0.05, 3: None}
    grpo = {0: 0.30, 1: 0.10, 2: 0.05, 3: 0.2, 4: 0.3}
    d = seed_differences(corpo, grpo)
    # shared seeds with both values: 0, 1, 2 → −0.2, +0.1, 0.0; mean −0.0333; one lower
    assert d["by_seed"] == pytest.approx({"0": -0.2, "1": 0.1, "2": 0.0})
    assert d["mean"] == pytest.approx(-0.1 / 3) and d["n_seeds"] == 3 and d["n_lower"] == 1
    # the sign test counts the non-zero ones: 1 of 2 below 0 → two-sided p = 1
    assert d["sign_test_p"] == pytest.approx(1.0)
    # six seeds all lower: p = 2 · 0.5⁶ = 0.03125 → "steadier"; five cannot get below 0.0625
    six = seed_differences({s: 0.1 for s in range(6)}, {s: 0.3 for s in range(6)})
    assert six["sign_test_p"] == pytest.approx(0.03125)
    assert "corpo steadier" in difference_words(six, "reward", "corpo", "grpo")
    five = seed_differences({s: 0.1 for s in range(5)}, {s: 0.3 for s in range(5)})
    assert five["sign_test_p"] == pytest.approx(0.0625)
    words = difference_words(five, "reward", "corpo", "grpo")
    assert "lower in 5 of 5 seeds" in words and "no detectable difference (fewer than 6 seeds" in words
    assert "less steady" in difference_words(seed_differences({s: 0.5 for s in range(6)}, {s: 0.3 for s in range(6)}),
                                             "reward", "corpo", "grpo")


def test_the_estimator_family_reads_the_resolved_algorithm():
    assert estimator_family({"type": "rl", "algorithm": {"estimator": "corpo"}}) == "corpo"
    assert estimator_family({"type": "rl", "algorithm": {"estimator": "dr_grpo"}}) == "grpo"
    assert estimator_family({"type": "rl", "algorithm": {"estimator": "rloo"}}) is None
    assert estimator_family({"type": "random_reward", "algorithm": {"estimator": "grpo"}}) is None


def write_run(task_dir, name: str, rewards: list[float], val_ba: list[float]) -> None:
    run = task_dir / name
    run.mkdir(parents=True)
    # written out of step order: the figures must follow the steps, not the lines
    records = [{K.STEP: i + 1, K.REWARD_MEAN: r} for i, r in enumerate(rewards)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in reversed(records)))
    (run / VAL_PATH_FILE).write_text("".join(json.dumps({"step": 2 * i, "balanced_accuracy": v}) + "\n"
                                             for i, v in enumerate(val_ba)))


def rl(name: str, estimator: str, seed: int, ba: float) -> dict:
    return {"type": "rl", "status": "done", "from": f"sft@s{seed}", "seed": seed, "replicate_of": name,
            "algorithm": {"estimator": estimator}, "holdout": {"balanced_accuracy": ba}}


@pytest.fixture
def task(tmp_path):
    (tmp_path / "analysis").mkdir()
    arms = {f"sft@s{s}": {"type": "sft", "status": "done", "seed": s, "replicate_of": "sft",
                          "holdout": {"balanced_accuracy": 0.6 + 0.1 * s}} for s in (0, 1)}
    # corpo: rewards 0.5, 0.6, 0.6, 0.7 → |Δ| 0.1, 0, 0.1 → 0.1; grpo: 0.2, 0.8, 0.1, 0.9 → 0.6, 0.7, 0.8 → 0.7
    write_run(tmp_path, "corpo@s0", [0.5, 0.6, 0.6, 0.7], [0.5, 0.52, 0.5])  # val |Δ| 0.02, 0.02 → 0.02
    write_run(tmp_path, "grpo@s0", [0.2, 0.8, 0.1, 0.9], [0.5, 0.7, 0.5])  # val 0.2
    # seed 1: corpo 0.3 → 0.1 → 0.3: 0.2; grpo 0.3 → 0.35 → 0.3: 0.05 (here GRPO is the steadier one)
    write_run(tmp_path, "corpo@s1", [0.3, 0.1, 0.3], [0.6, 0.6])  # val 0
    write_run(tmp_path, "grpo@s1", [0.3, 0.35, 0.3], [0.6, 0.9])  # val 0.3
    arms |= {"corpo@s0": rl("corpo", "corpo", 0, 0.70), "corpo@s1": rl("corpo", "corpo", 1, 0.74),
             "grpo@s0": rl("grpo", "grpo", 0, 0.60), "grpo@s1": rl("grpo", "grpo", 1, 0.80)}
    return tmp_path, arms


def grouped(arms):
    from labelrl.ladder.kinds import groups

    return groups(arms)


def test_figures_per_arm_and_corpo_against_grpo_by_seed(task):
    task_dir, arms = task
    made = stability_analysis(task_dir, arms, grouped(arms))
    assert json.loads((task_dir / "analysis" / "stability.json").read_text())["arms"].keys() == {"sft", "corpo", "grpo"}
    corpo, grpo, sft = made["arms"]["corpo"], made["arms"]["grpo"], made["arms"]["sft"]
    assert corpo["per_run"]["corpo@s0"]["reward_step_change"] == pytest.approx(0.1)
    assert grpo["per_run"]["grpo@s0"]["reward_step_change"] == pytest.approx(0.7)
    assert corpo["per_run"]["corpo@s1"]["reward_step_change"] == pytest.approx(0.2)
    assert grpo["per_run"]["grpo@s1"]["val_step_change"] == pytest.approx(0.3)
    assert corpo["per_run"]["corpo@s0"]["n_val_points"] == 3
    # sd of (0.70, 0.74) = 0.04 / √2 ≈ 0.0283; of (0.60, 0.80) ≈ 0.1414; sft has no step figures
    assert corpo["holdout_balanced_accuracy_sd"] == pytest.approx(0.04 / 2 ** 0.5)
    assert grpo["holdout_balanced_accuracy_sd"] == pytest.approx(0.2 / 2 ** 0.5)
    assert "reward_step_change" not in sft["per_run"]["sft@s0"]
    (c,) = made["corpo_vs_grpo"]
    assert (c["a"], c["b"], c["parent"]) == ("corpo", "grpo", ["sft"])
    # reward: s0 0.1 − 0.7 = −0.6, s1 0.2 − 0.05 = +0.15: paired by seed, not by the order of the lists
    assert c["reward_step_change"]["by_seed"] == pytest.approx({"0": -0.6, "1": 0.15})
    assert c["val_step_change"]["by_seed"] == pytest.approx({"0": 0.02 - 0.2, "1": 0.0 - 0.3})
    assert c["val_step_change"]["n_lower"] == 2 and c["val_step_change"]["sign_test_p"] == pytest.approx(0.5)


def test_the_verdict_gets_the_figures_and_only_corpo_the_comparison(task):
    task_dir, arms = task
    made = stability_analysis(task_dir, arms, grouped(arms))
    verdicts = [{"arm": "corpo", "text": "corpo: vs sft: x"}, {"arm": "grpo", "text": "grpo: vs sft: y"},
                {"arm": "other", "text": "other: z"}]
    add_stability(verdicts, made)
    corpo, grpo, other = verdicts
    assert corpo["text"].startswith("corpo: vs sft: x; stability over 2 seeds: holdout BA sd 0.028")
    assert "stability vs grpo (same parent, paired by seed): median |Δreward| per step: corpo − grpo -0.2250" in corpo["text"]
    assert "lower in 2 of 2 seeds; sign test p 0.50: no detectable difference" in corpo["text"]
    assert "holdout BA sd over seeds corpo 0.028 vs grpo 0.141 (side by side, untested)" in corpo["text"]
    assert "stability vs" not in grpo["text"] and "holdout BA sd 0.141" in grpo["text"]
    assert other["stability"] is None and other["text"] == "other: z"


def test_other_parents_and_single_runs_are_not_compared(task):
    task_dir, arms = task
    for s in (0, 1):
        arms[f"grpo@s{s}"]["from"] = f"sft_b@s{s}"
        arms[f"sft_b@s{s}"] = {"type": "sft", "status": "done", "seed": s, "replicate_of": "sft_b", "holdout": {}}
    assert stability_analysis(task_dir, arms, grouped(arms))["corpo_vs_grpo"] == []
    single = {"sft": {"type": "sft", "status": "done"}, "grpo": rl("grpo", "grpo", 0, 0.6) | {"replicate_of": None}}
    assert "no arm has 2 or more seeds" in stability_analysis(task_dir, single, grouped(single))["note"]
