"""labelrl.report.verdict_tables and the verdict section: the greedy-generation point, the stability
figures with CoRPO against GRPO, and the evaluation set of every paired comparison, from the files."""

from __future__ import annotations

from pathlib import Path

from labelrl.report.conclusions import paired_table, verdict
from labelrl.report.render import FigureSink
from labelrl.report.run_data import TaskData
from labelrl.report.verdict_tables import generation_table, stability_tables

POINT = {"n": 10, "n_unparsed": 2, "labels": {
    "ham": {"recall": 0.5, "recall_ci": [0.2, 0.8], "precision": 0.75, "precision_ci": [0.3, 0.95], "n_true": 6, "n_answered": 4},
    "spam": {"recall": 1.0, "recall_ci": [0.5, 1.0], "precision": None, "precision_ci": None, "n_true": 4, "n_answered": 0}}}
STABILITY = {
    "arms": {"corpo": {"type": "rl", "runs": ["corpo@s0", "corpo@s1"], "holdout_balanced_accuracy_sd": 0.0283,
                       "per_run": {"corpo@s0": {"seed": 0, "holdout_balanced_accuracy": 0.70, "reward_step_change": 0.1,
                                                "val_step_change": 0.02},
                                   "corpo@s1": {"seed": 1, "holdout_balanced_accuracy": 0.74, "reward_step_change": 0.2,
                                                "val_step_change": 0.0}}}},
    "corpo_vs_grpo": [{"a": "corpo", "b": "grpo", "holdout_balanced_accuracy_sd": [0.0283, 0.1414],
                       "reward_step_change": {"by_seed": {"0": -0.6, "1": 0.15}, "mean": -0.225, "n_lower": 1, "n_seeds": 2,
                                              "sign_test_p": 1.0},
                       "val_step_change": {"by_seed": {"0": -0.18, "1": -0.3}, "mean": -0.24, "n_lower": 2, "n_seeds": 2,
                                           "sign_test_p": 0.5}}]}


def task() -> TaskData:
    t = TaskData(name="spam", dir=Path("."), data="sms-spam", ood_names=["tweets"])
    t.verdict = [{"arm": "grpo", "text": "grpo: …", "generation": {"points": {"grpo": POINT}, "sweep": "its val point on the curve (x)"}}]
    t.stability = STABILITY
    return t


def test_the_generation_table_has_a_row_per_label_with_its_intervals():
    (table,) = generation_table(task())
    assert table.rows[0][:7] == ["grpo", "ham", "6", "0.500 [0.200, 0.800]", "0.750 [0.300, 0.950]", "2 of 10",
                                 "its val point on the curve (x)"]
    assert table.rows[1][:5] == ["", "spam", "4", "1.000 [0.500, 1.000]", "—"]  # never answered: no precision
    assert generation_table(TaskData(name="x", dir=Path("."))) == []


def test_the_stability_tables_give_each_seed_and_the_paired_differences():
    runs, paired = stability_tables(task())
    assert runs.rows[0] == ["corpo", "corpo@s0", "0", "0.700", "0.028", "0.1000", "0.0200"]
    assert runs.rows[1][:5] == ["", "corpo@s1", "1", "0.740", ""]
    assert paired.rows[0] == ["corpo − grpo", "median |Δ mean reward| per step", "s0: -0.6000, s1: +0.1500", "-0.2250",
                              "1 of 2", "1.00", "corpo 0.028 vs grpo 0.141"]
    assert paired.rows[1][4:6] == ["2 of 2", "0.50"]
    assert stability_tables(TaskData(name="x", dir=Path("."))) == []


def test_the_verdict_section_names_the_ood_sets_and_holds_both_tables(tmp_path):
    blocks = verdict(task(), FigureSink(tmp_path))
    assert "comparisons on the holdout and on each OOD set's holdout (tweets)" in blocks[0].text
    captions = [getattr(b, "caption", "") for b in blocks]
    assert any("without logit access" in c for c in captions) and any("CoRPO against GRPO" in c for c in captions)


def test_the_paired_table_says_which_set_each_comparison_is_on():
    t = task()
    result = {"n": 60, "n_runs": [1, 1], "n_boot": 100, "metrics": {"balanced_accuracy": {"delta": 0.1, "ci": [0.0, 0.2]}},
              "verdict": "grpo vs sft: no detectable difference"}
    t.paired = [{"kind": "vs_sft", "a": "sft", "b": "grpo", "result": result},  # written before splits were named
                {"kind": "vs_sft", "split": "ood-tweets", "a": "sft", "b": "grpo", "result": result}]
    (table,) = paired_table(t)
    assert [row[2] for row in table.rows] == ["holdout", "OOD tweets"] and table.columns[2] == "set"
    assert "on the holdout and on each OOD set" in table.caption
