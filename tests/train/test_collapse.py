"""The collapse detector (labelrl.train.collapse): reference cases of the rule, both series read
from a run's files, the per-step answer shares, and end to end through ``run_rl`` on tiny-random."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from rich.console import Console

from labelrl import metrics_keys as K
from labelrl.fileio import read_jsonl
from labelrl.rollout.log import read_rollouts
from labelrl.train.collapse import (
    answer_shares,
    collapse_detail,
    collapse_text,
    detect_collapse,
    evals_needed,
    find_collapse,
)
from labelrl.train.rl_parts import answer_share_metrics

EVEN = {"ham": 0.5, "spam": 0.5}


def ham(*shares: float, start: int = 1) -> list[tuple[int, dict[str, float]]]:
    """A series whose points give ham ``share`` and spam the rest (a 0 share: nothing parsed)."""
    return [(start + i, {"ham": s, "spam": (1 - s) if s else 0.0}) for i, s in enumerate(shares)]


# ---------------------------------------------------------------- the rule


def test_three_steps_in_a_row_at_or_above_the_share_are_a_collapse_at_the_first_of_them():
    # steps 2, 3, 4 hold ham ≥ 0.95 (0.96, 1.0, 0.97) → collapsed at step 2, share (0.96 + 1.0 + 0.97) / 3 = 0.9767.
    # Catches reporting the step where k is reached (4) instead of the run's first step.
    flag = find_collapse(ham(0.5, 0.96, 1.0, 0.97, 0.9), EVEN)
    assert flag["label"] == "ham" and flag["step"] == 2
    assert flag["share"] == pytest.approx((0.96 + 1.0 + 0.97) / 3)


def test_k_not_reached_in_a_row_is_no_collapse():
    # ham ≥ 0.95 at steps 1, 2, 4, 5 (four steps in all) but never three in a row: step 3's 0.5 ends each run.
    # Catches counting the steps above the share instead of consecutive ones.
    assert find_collapse(ham(0.96, 1.0, 0.5, 0.97, 0.99), EVEN) is None
    # share 0.94 < 0.95 at step 2 ends the run too (the threshold is ≥ 0.95, not ≥ 0.9)
    assert find_collapse(ham(0.96, 0.94, 1.0, 1.0), EVEN) is None


def test_the_share_threshold_is_inclusive():
    # exactly 0.95 three times: 0.95 ≥ 0.95 → collapsed at step 1
    assert find_collapse(ham(0.95, 0.95, 0.95), EVEN)["step"] == 1


def test_answering_the_training_majority_of_a_skewed_task_is_not_a_collapse():
    # ham is 85% of the training items: 0.85 ≥ 0.8, so ham on every answer is what a sound model nearly does
    assert find_collapse(ham(1.0, 1.0, 1.0), {"ham": 0.85, "spam": 0.15}) is None
    # at 79% (< 0.8) the same answers are a collapse; catches a test on the answered label's complement
    assert find_collapse(ham(1.0, 1.0, 1.0), {"ham": 0.79, "spam": 0.21})["label"] == "ham"
    # the exemption is per label: collapsing to the minority label spam (15% of the items) is flagged
    assert find_collapse(ham(0.01, 0.01, 0.01), {"ham": 0.85, "spam": 0.15})["label"] == "spam"


def test_the_first_run_is_reported_and_a_label_switch_ends_a_run():
    # spam at steps 1–3 (ham share 0.02 → spam 0.98), then ham at steps 6–8: the first collapse is spam at step 1
    series = ham(0.02, 0.02, 0.02, 0.5, 0.5, 1.0, 1.0, 1.0)
    assert (find_collapse(series, EVEN)["label"], find_collapse(series, EVEN)["step"]) == ("spam", 1)
    # spam, ham, ham, spam: each step has one label ≥ 0.95, but never the same one three times in a row.
    # Catches a run that counts "some label above the share" without checking it is the same label.
    assert find_collapse(ham(0.02, 1.0, 1.0, 0.02), EVEN) is None


def test_a_step_with_nothing_parsed_neither_counts_nor_ends_a_run():
    # ham 1.0, nothing parsed, ham 1.0, ham 0.97: three parsed points in a row → collapsed at step 1;
    # the empty step 2 is not a fourth point either (a flag needs k = 4 parsed points → none).
    series = ham(1.0, 0.0, 1.0, 0.97)
    assert find_collapse(series, EVEN)["step"] == 1
    assert find_collapse(series, EVEN, steps=4) is None


def test_an_inherited_label_is_never_flagged():
    assert find_collapse(ham(1.0, 1.0, 1.0), EVEN, inherited={"ham"}) is None
    assert find_collapse(ham(0.01, 0.01, 0.01), EVEN, inherited={"ham"})["label"] == "spam"


@pytest.mark.parametrize("options, message", [
    ({"share": 0.5}, "collapse_share=0.5: must be in \\(0.5, 1\\]"),
    ({"steps": 0}, "collapse_steps=0: a collapse needs at least 1 step"),
    ({"max_label_share": 0.0}, "collapse_max_label_share=0.0: must be in \\(0, 1\\]"),
])
def test_settings_out_of_range_are_refused_by_name(options, message):
    with pytest.raises(ValueError, match=message):
        find_collapse(ham(1.0), EVEN, **options)


@pytest.mark.parametrize("n_evals, needed", [(0, 1), (1, 1), (2, 1), (3, 1), (4, 2), (5, 2), (6, 3), (10, 3)])
def test_evals_needed_is_k_but_at_most_half_the_evaluations(n_evals, needed):
    # min(k = 3, ⌊n / 2⌋), at least 1
    assert evals_needed(n_evals, 3) == needed


def test_answer_shares_leave_unparsed_answers_out_of_the_denominator():
    # 2 ham + 1 spam parsed of 4: ham 2/3, spam 1/3 (not 2/4 and 1/4, which counts the unparsed one)
    assert answer_shares(["ham", None, "ham", "spam"], ["ham", "spam"]) == pytest.approx({"ham": 2 / 3, "spam": 1 / 3})
    assert answer_shares([None, None], ["ham", "spam"]) == {"ham": 0.0, "spam": 0.0}


def test_the_step_metrics_count_only_answers_whose_parse_is_ok():
    def graded(status: str, answer: str | None):
        return SimpleNamespace(parse=SimpleNamespace(status=SimpleNamespace(value=status), answer=answer))

    # an unknown_label parse carries no answer; a truncated one may still name a label but is not "ok"
    batch = SimpleNamespace(graded=[graded("ok", "spam"), graded("ok", "spam"), graded("ok", "ham"),
                                    graded("truncated", "ham"), graded("unknown_label", None)])
    metrics = answer_share_metrics(batch, ("ham", "spam"))
    assert metrics == pytest.approx({f"{K.ANSWER_SHARE}/ham": 1 / 3, f"{K.ANSWER_SHARE}/spam": 2 / 3})


def test_texts_name_label_and_step():
    flag = {"label": "ham", "step": 5, "share": 0.97, "series": "rollouts"}
    assert collapse_text(flag) == "collapsed to ham at step 5"
    assert collapse_detail(flag) == "collapsed to ham at step 5 (0.97 of the parsed rollout answers)"


# ---------------------------------------------------------------- from a run's files


def write_run(run_dir, ham_shares: list[float], val: list[tuple[int, float]] | None = None, data_ham: float = 0.5):
    """metrics.jsonl with ham's answer share per step (and the training items' shares), and
    optionally val_path.jsonl as the in-loop val scoring writes it: (step, ham's share)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "metrics.jsonl", "w", encoding="utf-8") as f:
        for step, s in ham(*ham_shares):
            f.write(json.dumps({K.STEP: step, f"{K.ANSWER_SHARE}/ham": s["ham"], f"{K.ANSWER_SHARE}/spam": s["spam"],
                                f"{K.LABEL_SHARE_DATA}/ham": data_ham, f"{K.LABEL_SHARE_DATA}/spam": 1 - data_ham}) + "\n")
    if val is not None:
        with open(run_dir / "val_path.jsonl", "w", encoding="utf-8") as f:
            for step, s in val:
                f.write(json.dumps({"step": step, "n": 40, "label_share": {"ham": s, "spam": 1 - s}}) + "\n")
    return run_dir


def test_rollouts_alone_when_there_is_no_val_path(tmp_path):
    run = write_run(tmp_path / "run", [0.5, 0.5, 1.0, 1.0, 1.0, 1.0])
    assert detect_collapse(run) == {"label": "ham", "step": 3, "share": 1.0, "series": "rollouts"}


def test_the_val_series_flags_earlier_with_fewer_evaluations(tmp_path):
    # rollouts collapse at step 5; val evaluations at steps 0, 2, 4, 6: three after the start, so
    # k = min(3, ⌊3 / 2⌋) = 1 evaluation, and step 4's ham 1.0 flags it at step 4 < 5
    run = write_run(tmp_path / "run", [0.5, 0.5, 0.6, 0.7, 1.0, 1.0, 1.0], val=[(0, 0.5), (2, 0.6), (4, 1.0), (6, 1.0)])
    assert detect_collapse(run) == {"label": "ham", "step": 4, "share": 1.0, "series": "val"}
    # with the rollouts' collapse first (step 1), the rollouts flag wins
    run = write_run(tmp_path / "early", [1.0, 1.0, 1.0], val=[(0, 0.5), (2, 1.0)])
    assert detect_collapse(run)["series"] == "rollouts"


def test_a_label_the_starting_model_already_answered_is_inherited_in_both_series(tmp_path):
    # the starting model (val step 0) answers ham on 97% of val items: the parent's doing, not the run's
    run = write_run(tmp_path / "run", [1.0, 1.0, 1.0, 1.0], val=[(0, 0.97), (2, 1.0), (4, 1.0)])
    assert detect_collapse(run) is None


def test_val_items_that_are_all_one_label_are_answered_right_not_collapsed(tmp_path):
    # every val item is ham: after training, ham on every val answer is right (val share 1.0 ≥ 0.8)
    run = write_run(tmp_path / "run", [0.5, 0.5, 0.5], val=[(0, 0.6), (2, 1.0)])
    assert detect_collapse(run, val_item_share={"ham": 1.0, "spam": 0.0}) is None
    # measured against the training items (50% ham) instead, the same answers read as a collapse:
    # catches judging the val series by the training items' shares
    assert detect_collapse(run) == {"label": "ham", "step": 2, "share": 1.0, "series": "val"}


# ---------------------------------------------------------------- end to end through run_rl

# The warm start (tests/conftest.py) answers the toy task's RL words at chance. The task pays a
# right "yes" 1 and a right "no" 0.1 (--class-reward yes=1/0,no=0.1/0), and Dr. GRPO leaves the
# advantages unscaled, so "yes" groups push ten times harder: at 1e-3 the policy drifts toward
# answering "yes" to everything, at 1e-4 it stays near its start. Measured over 12 steps on
# MKL/oneDNN's AMX kernels with 1 and 2 threads and held to AVX2: at 1e-3 "yes" takes 0.85–1.0 of
# the parsed answers over two steps in a row by step 5 to 11 (at 1e-4 it never passes 0.73). The
# rounding-dependent trajectories differ step by step, so the test asks for a collapse to "yes"
# under the rule set to 0.85 for 2 steps, not for one step. The val path is off: the warm start's
# val answers are one word whose label the kernels decide, and a label the start already answers
# is never flagged.
FAST = dict(steps=12, group_size=4, prompts_per_step=8, max_new_tokens=8, checkpoint_every=4, preset="dr_grpo",
            class_reward="yes=1/0,no=0.1/0", val_path=False, collapse_share=0.85, collapse_steps=2)


def test_a_high_learning_rate_collapses_and_the_summary_says_so(warm_model, toy_data, rl_config, tmp_path):
    from labelrl.cli.train import print_rl_summary
    from labelrl.train.rl import run_rl

    cfg = rl_config(warm_model, toy_data, tmp_path / "high", learning_rate=1e-3, **FAST)
    summary = run_rl(cfg)
    flag = summary["collapse"]
    assert flag is not None and (flag["label"], flag["series"]) == ("yes", "rollouts") and 2 <= flag["step"] <= 11
    # the flag is the first of two steps in a row at ≥ 0.85 "yes", as the metrics file logged them
    shares = {r[K.STEP]: r[f"{K.ANSWER_SHARE}/yes"] for r in read_jsonl(tmp_path / "high" / "metrics.jsonl")}
    assert all(shares[flag["step"] + i] >= 0.85 for i in range(2)) and shares[flag["step"] - 1] < 0.85
    assert json.loads((tmp_path / "high" / "rl_summary.json").read_text())["collapse"] == flag
    console = Console(record=True, width=200)
    print_rl_summary(summary, cfg, console)
    assert f"collapsed to yes at step {flag['step']}" in console.export_text()


def test_a_low_learning_rate_is_not_flagged_and_the_answer_shares_match_the_rollout_log(
        warm_model, toy_data, rl_config, tmp_path):
    from labelrl.cli.train import print_rl_summary
    from labelrl.train.rl import run_rl

    cfg = rl_config(warm_model, toy_data, tmp_path / "low", learning_rate=1e-4, **FAST)
    summary = run_rl(cfg)
    assert summary["collapse"] is None
    console = Console(record=True, width=200)
    print_rl_summary(summary, cfg, console)
    assert "collapsed" not in console.export_text()
    # the logged shares are the rollout log's parsed answers per step, unparsed ones left out
    rollouts = read_rollouts(tmp_path / "low").to_pylist()
    for record in read_jsonl(tmp_path / "low" / "metrics.jsonl"):
        answers = [r["answer"] for r in rollouts if r["step"] == record[K.STEP] and r["parse_status"] == "ok"]
        for label in ("yes", "no"):
            expected = answers.count(label) / len(answers) if answers else 0.0
            assert record[f"{K.ANSWER_SHARE}/{label}"] == pytest.approx(expected)
