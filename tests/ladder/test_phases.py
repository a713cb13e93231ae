"""Time per phase of a ladder, from its state."""

from __future__ import annotations

from labelrl.ladder.phases import phase_times
from labelrl.report.render import minutes


def test_training_per_arm_scoring_summed_over_arms_and_threshold_arms_count_as_scoring():
    state = {"task_order": ["spam"], "tasks": {"spam": {
        "arm_order": ["sft", "grpo", "threshold", "never_ran"], "seconds_analysis": 4.0,
        "arms": {"sft": {"type": "sft", "seconds_train": 100.0, "seconds_eval": 20.0, "seconds": 120.0},
                 "grpo": {"type": "rl", "seconds_train": 60.0, "seconds_eval": 30.0, "seconds": 90.0},
                 "threshold": {"type": "threshold", "seconds": 2.5},
                 "never_ran": {"type": "rl", "status": "skipped"}}}}}
    rows = phase_times(state)
    # scoring = 20 (sft) + 30 (grpo) + 2.5 (threshold: no training, its whole time is scoring);
    # a wrong version summing `seconds` of trained arms would count their training twice (262.5)
    assert [(r["phase"], r["what"], r["seconds"]) for r in rows] == [
        ("train", "sft (sft)", 100.0), ("train", "grpo (rl)", 60.0),
        ("scoring", "every arm's evaluations", 52.5), ("analysis", "sweeps, routing, paired comparisons", 4.0)]


def test_minutes_reads_as_a_person_would():
    assert minutes(42.4) == "42 s" and minutes(65) == "1 min 05 s" and minutes(1265.6) == "21 min 06 s"
