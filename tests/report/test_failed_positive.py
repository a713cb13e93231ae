"""One definition of "failed" for every arm: GRPO and CoRPO rollouts built by hand on a 5-grade
task, their failed-positive fractions against the task's threshold (the same failed set for both),
as the trainer logs them and as the report recomputes them, and the breakdown by distance."""

from __future__ import annotations

import pyarrow as pa
import pytest
import torch

from labelrl import metrics_keys as K
from labelrl.advantages import compute_advantages
from labelrl.advantages.diagnostics import advantage_diagnostics
from labelrl.report.collect import failed_positive_breakdown
from labelrl.train.config import RLConfig
from labelrl.train.rl_parts import resolve_algorithm
from labelrl.types import LabelSpace

GRADES = LabelSpace(("1", "2", "3", "4", "5"), kind="ordinal")
G = 4
# Partial credit 1 − |p − r|/4. Group 1, label 3: answers 3, 2, 1, 5 → rewards 1, .75, .5, .5
# (mean .6875). Group 2, label 5: answers 3, 4, 1, unparsed → rewards .5, .75, 0, 0 (mean .3125).
LABELS = ["3"] * G + ["5"] * G
ANSWERS = ["3", "2", "1", "5", "3", "4", "1", None]
REWARDS = torch.tensor([1.0, 0.75, 0.5, 0.5, 0.5, 0.75, 0.0, 0.0], dtype=torch.float64)


def table(advantages: torch.Tensor) -> pa.Table:
    return pa.table({"step": [1] * 8, "label": LABELS, "answer": ANSWERS, "reward": REWARDS.tolist(),
                     "advantage": advantages.tolist()})


def test_grpo_and_corpo_are_judged_against_the_same_failed_set():
    # The task threshold: full credit (1.0) for both arms; CoRPO's τ = 0.75 is only its estimator option.
    base = dict(data="x.jsonl", model="tiny-random", out="o", threshold=0.75)
    grpo = resolve_algorithm(RLConfig(**{**base, "threshold": None}, preset="dr_grpo"), GRADES)
    corpo = resolve_algorithm(RLConfig(**base, preset="corpo"), GRADES)
    assert grpo.success_threshold == corpo.success_threshold == 1.0
    assert corpo.corpo_threshold == 0.75
    # Dr. GRPO: A = r − mean. Group 1: [.3125, .0625, −.1875, −.1875]; group 2: [.1875, .4375, −.3125, −.3125].
    adv_grpo = compute_advantages(REWARDS, G, "dr_grpo")
    # CoRPO: b = max(mean, .75) = .75 in both groups. Group 1: [.25, 0, −.25, −.25]; group 2: [−.25, 0, −.75, −.75].
    adv_corpo = compute_advantages(REWARDS, G, "corpo", threshold=0.75)
    torch.testing.assert_close(adv_grpo, torch.tensor([.3125, .0625, -.1875, -.1875, .1875, .4375, -.3125, -.3125], dtype=torch.float64))
    torch.testing.assert_close(adv_corpo, torch.tensor([.25, 0, -.25, -.25, -.25, 0, -.75, -.75], dtype=torch.float64))
    # Failed (r < 1): 7 rollouts in both arms. GRPO rewards three of them (the .75 of group 1, the
    # .5 and .75 of group 2) → 3/7; CoRPO none.
    logged_grpo = advantage_diagnostics(REWARDS, adv_grpo, G, success_threshold=grpo.success_threshold)
    logged_corpo = advantage_diagnostics(REWARDS, adv_corpo, G, success_threshold=corpo.success_threshold,
                                         corpo_threshold=0.75)
    assert logged_grpo[K.FAILED_POSITIVE_FRAC] == pytest.approx(3 / 7)
    assert logged_corpo[K.FAILED_POSITIVE_FRAC] == 0.0
    # The report recomputes the same fractions from the rollout log with the task's threshold.
    report_grpo = failed_positive_breakdown(table(adv_grpo), 1.0, GRADES.labels, "ordinal")
    report_corpo = failed_positive_breakdown(table(adv_corpo), 1.0, GRADES.labels, "ordinal")
    assert report_grpo["overall"] == {"n_failed": 7, "n_positive": 3, "frac": pytest.approx(3 / 7)}
    assert report_corpo["overall"] == {"n_failed": 7, "n_positive": 0, "frac": 0.0}
    # By distance from the label. One grade off: answer 2 for 3, answer 4 for 5 (both rewarded by
    # GRPO). Two or more off: 1 and 5 for 3, 3 and 1 for 5 (GRPO rewards the 3 for 5). Unparsed: 1.
    by = report_grpo["by_distance"]
    assert (by["one grade off"]["n_failed"], by["one grade off"]["n_positive"]) == (2, 2)
    assert (by["two or more off"]["n_failed"], by["two or more off"]["n_positive"]) == (4, 1)
    assert (by["unparsed"]["n_failed"], by["unparsed"]["n_positive"]) == (1, 0)
    assert all(v["n_positive"] == 0 for v in report_corpo["by_distance"].values())


def test_a_lower_task_threshold_changes_the_failed_set_for_every_arm_alike():
    # Counting one grade off as success (threshold .75): failed = the four rollouts with r ≤ .5.
    adv_grpo = compute_advantages(REWARDS, G, "dr_grpo")
    report = failed_positive_breakdown(table(adv_grpo), 0.75, GRADES.labels, "ordinal")
    logged = advantage_diagnostics(REWARDS, adv_grpo, G, success_threshold=0.75)
    # failed: .5 and .5 of group 1 (A < 0), .5 (A > 0), 0 and 0 of group 2 → 1/5
    assert report["overall"]["n_failed"] == 5 and report["overall"]["n_positive"] == 1
    assert logged[K.FAILED_POSITIVE_FRAC] == pytest.approx(report["overall"]["frac"]) == pytest.approx(1 / 5)
    assert report["by_distance"]["one grade off"]["n_failed"] == 0
