"""labelrl.ladder.generation_point: a direct RL arm's greedy-generation operating point per label,
and the sweep's verdict on whether that point is a threshold on the SFT parent's scores."""

from __future__ import annotations

import numpy as np
import pytest

from labelrl.evaluate.io import Predictions, predictions_table, write_predictions
from labelrl.ladder.analysis import _sweeps, task_verdict
from labelrl.ladder.generation_point import generated_name, generation_points, label_point, wilson
from labelrl.types import LabelSpace

SPAM = LabelSpace(("ham", "spam"), kind="binary", positive="spam")
TSTATE = {"kind": "binary", "positive_label": "spam", "success_threshold": None}


def test_label_point_counts_recall_and_precision_per_label():
    y_true = ["spam", "spam", "spam", "spam", "ham", "ham", "ham", "ham", "ham", "ham"]
    y_pred = ["spam", "spam", "ham", None, "spam", "ham", "ham", "ham", "ham", None]
    p = label_point(y_true, y_pred, ["ham", "spam"])
    # spam: 2 of 4 spam items answered spam (the unparsed one is a miss) → recall 0.5;
    # 3 spam answers, 2 right → precision 2/3
    assert p["labels"]["spam"]["recall"] == pytest.approx(0.5) and p["labels"]["spam"]["precision"] == pytest.approx(2 / 3)
    # ham: 4 of 6 ham items answered ham → 2/3; 5 ham answers, 4 right → 0.8
    assert p["labels"]["ham"]["recall"] == pytest.approx(4 / 6) and p["labels"]["ham"]["precision"] == pytest.approx(0.8)
    assert (p["n"], p["n_unparsed"], p["labels"]["ham"]["n_answered"]) == (10, 2, 5)
    assert p["labels"]["spam"]["recall_ci"] == pytest.approx(wilson(2, 4))
    # never answered: precision undefined, not 0
    none = label_point(["a", "b"], ["a", "a"], ["a", "b"])
    assert none["labels"]["b"]["precision"] is None and none["labels"]["b"]["precision_ci"] is None


def test_wilson_matches_the_closed_form():
    # Wilson (1927): (p̂ + z²/2n ± z·√(p̂(1−p̂)/n + z²/4n²)) / (1 + z²/n), z = 1.959964
    k, n, z = 7, 20, 1.959963984540054
    p = k / n
    centre, half = p + z * z / (2 * n), z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    assert wilson(k, n) == pytest.approx([(centre - half) / (1 + z * z / n), (centre + half) / (1 + z * z / n)])
    assert wilson(0, 0) is None


def write(task_dir, name: str, is_spam: np.ndarray, answers, p_spam: np.ndarray | None = None) -> None:
    y = ["spam" if v else "ham" for v in is_spam]
    probs = None if p_spam is None else np.stack([1 - p_spam, p_spam], 1)
    table = predictions_table([f"i{i}" for i in range(len(y))], y, list(answers), ["ok"] * len(y), SPAM, probs)
    write_predictions(Predictions(table, SPAM, {"source": name}), task_dir / "eval" / f"{name}.parquet")


@pytest.fixture
def task(tmp_path):
    """sft scores the val items; grpo's greedy generations are sft thresholded at 0.6 (a point on sft's
    curve), corpo's answer at random (not a threshold); both have generated holdout answers."""
    rng = np.random.default_rng(0)
    is_spam = rng.random(200) < 0.4
    sft = np.clip(np.where(is_spam, 0.65, 0.35) + 0.2 * rng.standard_normal(200), 0, 1)
    label = lambda v: np.where(v, "spam", "ham")  # noqa: E731
    write(tmp_path, "sft-val", is_spam, label(sft > 0.5), sft)
    for arm in ("grpo", "corpo"):
        write(tmp_path, f"{arm}-val", is_spam, label(sft > 0.5), sft)  # label-token answers: sft's own point
    write(tmp_path, "grpo-val-generate", is_spam, label(sft >= 0.6))
    write(tmp_path, "corpo-val-generate", is_spam, label(rng.random(200) < 0.5))
    write(tmp_path, "grpo-holdout-generate", is_spam[:10], ["spam"] * 3 + ["ham"] * 5 + [None] * 2)
    write(tmp_path, "corpo-holdout-generate", is_spam[:10], label(is_spam[:10]))
    (tmp_path / "analysis").mkdir()
    arms = {"sft": {"type": "sft", "status": "done"},
            "grpo": {"type": "rl", "status": "done", "from": "sft", "config": {"mode": "direct"}},
            "corpo": {"type": "rl", "status": "done", "from": "sft", "config": {"mode": "direct"}},
            "cot_rl": {"type": "cot_rl", "status": "done", "from": "sft", "config": {"mode": "reasoning"}}}
    write(tmp_path, "cot_rl-val", is_spam, label(sft > 0.5))
    write(tmp_path, "cot_rl-holdout-generate", is_spam[:10], label(is_spam[:10]))  # not a direct RL arm
    return tmp_path, arms, is_spam


def test_the_sweep_asks_whether_each_generated_point_is_a_threshold(task):
    task_dir, arms, _ = task
    made = _sweeps(task_dir, arms, TSTATE)
    verdicts = made["verdicts"]
    # grpo's generations are sft thresholded at 0.6: a vertex of sft's curve, ΔTPR exactly 0
    assert verdicts[generated_name("grpo")]["reproduced"] is True
    assert verdicts[generated_name("grpo")]["verdict"].startswith("on the curve (ΔTPR at its FPR +0.000 [+0.000, +0.000]; ")
    assert verdicts[generated_name("grpo")]["rests_on"] == "distance"
    # corpo's answer at random: near the diagonal, far below a curve with a real ranking
    assert verdicts[generated_name("corpo")]["verdict"].startswith("below the curve (ΔTPR at its FPR -")
    assert verdicts[generated_name("corpo")]["reproduced"] is False
    assert generated_name("cot_rl") not in verdicts  # reasoning arms answer by generation anyway


def test_the_verdict_states_the_generated_point_and_its_sweep(task):
    task_dir, arms, is_spam = task
    sweep = _sweeps(task_dir, arms, TSTATE)
    analysis = {"paired": {"comparisons": []}, "sweep": sweep,
                "generation": generation_points(task_dir, arms, {n: [n] for n in arms})}
    by_arm = {v["arm"]: v for v in task_verdict(arms, analysis, TSTATE)}
    grpo = by_arm["grpo"]
    point = grpo["generation"]["points"]["grpo"]
    truth = ["spam" if v else "ham" for v in is_spam[:10]]
    expected = label_point(truth, ["spam"] * 3 + ["ham"] * 5 + [None] * 2, ["ham", "spam"])
    assert point == expected
    assert "greedy generation, no logits (holdout): recall ham " in grpo["text"]
    assert "2 of 10 answers unparsed; its val point on the curve (ΔTPR at its FPR +0.000 " in grpo["text"]
    assert "its val point below the curve (ΔTPR at its FPR -" in by_arm["corpo"]["text"]
    assert by_arm["cot_rl"]["generation"] is None and "greedy generation" not in by_arm["cot_rl"]["text"]


def test_arms_without_generated_answers_are_left_out_with_a_reason(task):
    task_dir, arms, _ = task
    for arm in ("grpo", "corpo"):
        (task_dir / "eval" / f"{arm}-holdout-generate.parquet").unlink()
    made = generation_points(task_dir, arms, {n: [n] for n in arms})
    assert "generate_eval: false" in made["note"]


def test_several_seeds_give_means_and_a_tally_of_the_sweep_verdicts():
    from labelrl.ladder.generation_point import add_generation_points

    runs = {"grpo@s0": label_point(["a", "b", "b"], ["a", "b", "a"], ["a", "b"]),  # recall a 1, b 0.5
            "grpo@s1": label_point(["a", "b", "b"], ["b", "b", "b"], ["a", "b"])}  # recall a 0, b 1
    sweeps = {generated_name("grpo@s0"): {"verdict": "uninformative: a constant predictor (…)", "reproduced": False},
              generated_name("grpo@s1"): {"verdict": "on the curve (ΔTPR at its FPR +0.010 [-0.02, +0.04]; …)",
                                          "reproduced": True}}
    verdicts = [{"arm": "grpo", "text": "grpo: x"}]
    add_generation_points(verdicts, {"arms": {"grpo": runs}}, sweeps)
    text = verdicts[0]["text"]
    # means over the seeds: recall a (1 + 0) / 2 = 0.5, b (0.5 + 1) / 2 = 0.75; precision a (0.5 + —) → 0.5
    assert "recall a 0.500, b 0.750; precision a 0.500, b 0.833 (means over 2 seeds)" in text
    # an uninformative seed is named as such, never counted as off the curve; "on the curve" first
    assert text.endswith("its val point against a threshold on the SFT model: on the curve in 1, uninformative in 1 of 2 seeds")


def test_the_tally_counts_each_verdict_word_in_a_fixed_order():
    from labelrl.ladder.generation_point import sweep_tally

    found = [{"verdict": v} for v in ("below the curve (ΔTPR at its FPR -0.200 [-0.30, -0.10]; …)",
                                      "above the curve (ΔTPR at its FPR +0.150 [+0.05, +0.25]; …)",
                                      "below the curve (ΔTPR at its FPR -0.100 [-0.18, -0.02]; …)")]
    # heads are the verdict words, not the text up to a ":" (the numbers differ per seed)
    assert sweep_tally(found) == "above the curve in 1, below the curve in 2 of 3 seeds"
