"""The verdict at a glance (labelrl.ladder.grid): each cell from a constructed comparison, and the
answer sentence built from the cells."""

from labelrl.evaluate.family import correct
from labelrl.ladder.grid import answer, cell, sweep_word, task_grid
from labelrl.report.grid_table import grid_lines


def comparison(kind, b, delta, se, *, split="holdout", size=1, others=(), **extra):
    """A paired.json entry whose tested metric has Δ and se, corrected in a family with ``others``."""
    metric = "roc_auc" if kind == "curve_vs_sft" else "balanced_accuracy"
    family = correct([(delta, se), *others])[0]
    return {"kind": kind, "split": split, "a": "sft", "b": b,
            "result": {"n": 500, "metrics": {metric: {"delta": delta, "se": se, "pair_deltas": [delta]}},
                       "family": {**family, "metric": metric}}, **extra}


def test_each_cell_reads_the_corrected_decision():
    # Δ = +0.028, se = 0.01: z = 2.8, p = 0.0051 → better alone, "▲ +0.028"
    assert cell(comparison("vs_sft", "grpo", 0.028, 0.01)) == {"word": "better", "text": "▲ +0.028", "delta": 0.028}
    assert cell(comparison("vs_sft", "grpo", -0.062, 0.01))["text"] == "▼ -0.062"
    # the same +0.028 in a family of 20 with nothing else: Holm's first step 0.0025 < p → "=" with what
    # it could detect, (z(1 − 0.00125) + z(0.8))·0.01 = (3.023 + 0.842)·0.01 = 0.0386
    crowded = cell(comparison("vs_sft", "grpo", 0.028, 0.01, others=[(0.0, 0.01)] * 19))
    assert crowded["word"] == "none" and crowded["text"] == "= (≥0.039)"
    # a collapsed side that loses reads "collapsed", never ▼; a side that is not a result says so
    assert cell(comparison("vs_sft", "grpo", -0.3, 0.01, collapsed={"b": "collapsed to ham at step 5"}))["text"] == "collapsed"
    assert cell(comparison("vs_sft", "grpo", 0.0, 0.01, not_a_result={"b": "did not move its parent"}))["word"] == "not a result"


def test_the_grid_has_a_column_per_comparison_made_and_the_sentence_follows_the_cells():
    comparisons = [
        comparison("vs_sft", "grpo", 0.028, 0.01), comparison("vs_sft", "corpo", 0.022, 0.008),
        comparison("vs_threshold", "grpo", -0.065, 0.02), comparison("vs_threshold", "corpo", -0.01, 0.02),
        comparison("vs_sft", "grpo", 0.004, 0.01, split="ood-tweets"),
    ]
    verdicts = [{"arm": "grpo", "runs": ["grpo"], "sweep": "operating point on the curve (ΔTPR …)",
                 "failed_positive": "failed-positive fraction 0.248 (failed: reward below 1.0)"},
                {"arm": "corpo", "runs": ["corpo"], "sweep": None,
                 "failed_positive": "failed-positive fraction 0.000 (failed: reward below 1.0)"}]
    grid = task_grid(verdicts, comparisons)
    assert grid["columns"] == ["vs SFT", "vs SFT + threshold", "tweets vs SFT", "sweep", "failed+"]
    header, grpo, corpo = grid_lines(grid)
    assert grpo[:4] == ["grpo", "▲ +0.028", "▼ -0.065", "= (≥0.028)"]  # (1.960 + 0.842)·0.01 = 0.028
    assert grpo[4:] == ["on curve", "0.248"] and corpo[3:] == ["—", "—", "0.000"]
    # the sentence: nobody beats the threshold baseline, grpo is worse than it; both beat SFT
    assert grid["sentence"] == ("No RL arm beats SFT + threshold; grpo is worse than SFT + threshold by 0.065 BA; "
                                "grpo and corpo beat SFT by 0.022–0.028 BA.")


def test_an_arm_that_beats_the_threshold_is_named_first_and_a_collapse_is_named():
    rows = [{"arm": "grpo", "cells": {"vs SFT + threshold": {"word": "better", "delta": 0.032},
                                      "vs SFT": {"word": "none", "delta": -0.03}}},
            {"arm": "dapo", "cells": {"vs SFT + threshold": {"word": "collapsed", "delta": -0.3},
                                      "vs SFT": {"word": "collapsed", "delta": -0.33}}}]
    assert answer(rows) == ("grpo beats SFT + threshold by 0.032 BA; no RL arm beats SFT; dapo: collapsed or not a result "
                            "(see its line).")


def test_sweep_words():
    assert sweep_word("operating point above the curve (ΔTPR +0.1 …)") == "above"
    assert sweep_word("operating point uninformative: a (near-)constant predictor") == "uninformative"
    assert sweep_word(None) == "—"
    # pooled over seeds: the pooled position, not a seed's in the tally after it
    assert sweep_word("operating point on the curve (ΔTPR at its FPR -0.051 [-0.145, +0.035], mean over 3 seeds; "
                      "by seed: on the curve in 2, below the curve in 1 of 3 seeds)") == "on curve"
    assert sweep_word("operating point above the curve (ΔTPR at its FPR +0.069 [+0.012, +0.147], mean over 3 seeds; "
                      "by seed: on the curve in 1, above the curve in 2 of 3 seeds)") == "above"
    assert sweep_word("operating point against a threshold on the SFT model: on the curve in 2, "
                      "uninformative in 1 of 3 seeds") == "uninformative"


def test_with_several_seeds_each_cell_says_how_many_agree_in_sign():
    def seeded(delta, se, pair_deltas):
        c = comparison("vs_sft", "grpo", delta, se)
        c["result"]["metrics"]["balanced_accuracy"]["pair_deltas"] = pair_deltas
        return c

    # all three seeds below: "▼ -0.095 3/3"; the mean above with one seed below: "= (≥…) 2/3"
    assert cell(seeded(-0.095, 0.02, [-0.12, -0.08, -0.085]))["text"] == "▼ -0.095 3/3"
    assert cell(seeded(-0.095, 0.02, [-0.12, -0.08, -0.085]))["seeds"] == [3, 3]
    assert cell(seeded(0.04, 0.05, [0.1, 0.05, -0.03]))["text"] == "= (≥0.140) 2/3"  # (1.960 + 0.842)·0.05
    # a seed with no difference does not agree with a non-zero mean; one seed: no count
    assert cell(seeded(0.03, 0.01, [0.05, 0.04, 0.0]))["text"] == "▲ +0.030 2/3"
    assert cell(seeded(0.03, 0.01, [0.03]))["text"] == "▲ +0.030"


def test_the_console_grid_explains_the_seed_count():
    from rich.console import Console

    from labelrl.cli.ladder import print_grid

    c = comparison("vs_sft", "grpo", -0.095, 0.02)
    c["result"]["metrics"]["balanced_accuracy"]["pair_deltas"] = [-0.12, -0.08, -0.085]
    out = Console(record=True, width=200)
    assert print_grid(task_grid([{"arm": "grpo", "runs": ["grpo@s0", "grpo@s1", "grpo@s2"]}], [c]), out)
    text = " ".join(out.export_text().split())
    assert "▼ -0.095 3/3" in text and "k/n: of the n seeds' paired Δ, the k with the sign of their mean" in text
    # one seed: no count in any cell, and the legend does not explain one
    one = Console(record=True, width=200)
    print_grid(task_grid([{"arm": "grpo", "runs": ["grpo"]}], [comparison("vs_sft", "grpo", -0.095, 0.02)]), one)
    text = " ".join(one.export_text().split())
    assert "▼ -0.095 " in text and "3/3" not in text and "k/n" not in text


def test_an_arm_with_a_collapsed_run_is_marked_in_its_row_whatever_its_cells_read():
    """One of three seeds collapsed to "spam" while the arm's seed-averaged Δ reads "=": the cell
    alone would hide the collapse, so the row's name carries it and the sentence names the arm;
    with one run the mark has no count, a collapse the parent already had says so, and an arm with
    no collapsed run keeps its plain name."""
    comparisons = [comparison("vs_sft", arm, delta, 0.065)
                   for arm, delta in (("grpo", -0.062), ("corpo", 0.01), ("dapo", -0.01), ("rloo", 0.0), ("dr_grpo", 0.0))]
    flag, inherited = {"label": "spam", "step": 24}, {"label": "ham", "inherited": True}
    verdicts = [{"arm": "grpo", "runs": ["grpo@s0", "grpo@s1", "grpo@s2"],
                 "collapsed": {"text": "collapsed in 1 of 3 seeds (grpo@s1 to spam at step 24)", "runs": {"grpo@s1": flag}}},
                {"arm": "corpo", "runs": ["corpo@s0", "corpo@s1", "corpo@s2"], "collapsed": None},
                {"arm": "dapo", "runs": ["dapo"], "collapsed": {"text": "collapsed to spam at step 24", "runs": {"dapo": flag}}},
                {"arm": "rloo", "runs": ["rloo"], "collapsed": {"text": "collapsed to ham (inherited from sft)",
                                                                "runs": {"rloo": inherited}}},
                {"arm": "dr_grpo", "runs": ["dr_grpo@s0", "dr_grpo@s1", "dr_grpo@s2"],
                 "collapsed": {"text": "collapsed in 2 of 3 seeds (…)", "runs": {"dr_grpo@s0": inherited, "dr_grpo@s2": flag}}}]
    grid = task_grid(verdicts, comparisons)
    _, grpo, corpo, dapo, rloo, dr_grpo = grid_lines(grid)
    assert grpo[:2] == ["grpo (collapsed 1/3)", "= (≥0.182)"]  # (1.960 + 0.842)·0.065 = 0.182
    assert corpo[0] == "corpo" and dapo[0] == "dapo (collapsed)" and rloo[0] == "rloo (collapsed, inherited)"
    assert dr_grpo[0] == "dr_grpo (collapsed 2/3, 1 inherited)"
    assert grid["rows"][0]["collapsed"] == {"k": 1, "n": 3, "inherited": 0} and grid["rows"][1]["collapsed"] is None
    assert grid["sentence"].endswith("grpo, dapo, rloo and dr_grpo: collapsed or not a result (see its line).")
