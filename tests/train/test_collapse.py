"""The collapse detector (labelrl.train.collapse): reference cases of the rule (share and lift),
both series read from a run's files, the per-step answer shares and recalls, and end to end
through ``run_rl`` on tiny-random."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from rich.console import Console

from labelrl import metrics_keys as K
from labelrl.fileio import read_jsonl
from labelrl.rollout.log import read_rollouts
from labelrl.train.collapse import (
    answer_recalls,
    answer_shares,
    collapse_detail,
    collapse_text,
    detect_collapse,
    evals_needed,
    find_collapse,
    lift,
    rollout_series,
)
from labelrl.train.rl_parts import answer_share_metrics


def blind(s: float) -> dict[str, float]:
    """The recalls of answers that carry no information on a ham/spam task: ham with probability
    ``s`` whatever the item, so recall ham = s and spam = 1 − s, BA = 1/2, lift 0 (at any mix).
    ``s`` = 0 stands for nothing parsed: every answer wrong."""
    return {"ham": s, "spam": 1 - s} if s else {"ham": 0.0, "spam": 0.0}


def ham(*shares: float, start: int = 1) -> list[tuple[int, dict[str, float], dict[str, float]]]:
    """A series whose points give ham ``share`` and spam the rest (a 0 share: nothing parsed), each
    with information-free answers (``blind``)."""
    return [(start + i, {"ham": s, "spam": (1 - s) if s else 0.0}, blind(s)) for i, s in enumerate(shares)]


def binary(ham_items: float, ham_recall: float, spam_recall: float) -> tuple[dict[str, float], dict[str, float]]:
    """(answer shares, recalls) of a model with these recalls on a task whose items are
    ``ham_items`` ham: ham share = p·r_ham + (1 − p)·(1 − r_spam)."""
    share = ham_items * ham_recall + (1 - ham_items) * (1 - spam_recall)
    return {"ham": share, "spam": 1 - share}, {"ham": ham_recall, "spam": spam_recall}


def repeat(point: tuple[dict, dict], n: int = 3) -> list[tuple[int, dict, dict]]:
    return [(step, *point) for step in range(1, n + 1)]


# ---------------------------------------------------------------- the rule


def test_three_steps_in_a_row_at_or_above_the_share_are_a_collapse_at_the_first_of_them():
    # steps 2, 3, 4 hold ham ≥ 0.95 (0.96, 1.0, 0.97), each with lift 0 → collapsed at step 2,
    # share (0.96 + 1.0 + 0.97) / 3 = 0.9767. Catches reporting the step where k is reached (4).
    flag = find_collapse(ham(0.5, 0.96, 1.0, 0.97, 0.9))
    assert flag["label"] == "ham" and flag["step"] == 2 and flag["inherited"] is False
    assert flag["share"] == pytest.approx((0.96 + 1.0 + 0.97) / 3) and flag["lift"] == pytest.approx(0.0)


def test_k_not_reached_in_a_row_is_no_collapse():
    # ham ≥ 0.95 at steps 1, 2, 4, 5 (four steps in all) but never three in a row: step 3's 0.5 ends each run.
    # Catches counting the steps above the share instead of consecutive ones.
    assert find_collapse(ham(0.96, 1.0, 0.5, 0.97, 0.99)) is None
    # share 0.94 < 0.95 at step 2 ends the run too (the threshold is ≥ 0.95, not ≥ 0.9)
    assert find_collapse(ham(0.96, 0.94, 1.0, 1.0)) is None


def test_the_share_threshold_is_inclusive():
    # exactly 0.95 three times: 0.95 ≥ 0.95 → collapsed at step 1
    assert find_collapse(ham(0.95, 0.95, 0.95))["step"] == 1


def test_a_constant_ham_on_a_task_mostly_ham_is_a_collapse():
    # sms-spam: 86.6% of the items are ham. "ham" on every item: recall ham 1, spam 0 → BA 1/2,
    # lift (1/2 − 1/2) / (1 − 1/2) = 0 < 0.25, share 1.0 ≥ 0.95 → collapsed at the first point.
    # Catches the old exemption of a label that is ≥ 0.8 of the items (it returned None here).
    shares, recall = binary(0.866, 1.0, 0.0)
    assert shares == pytest.approx({"ham": 1.0, "spam": 0.0})
    flag = find_collapse([(s, shares, recall) for s in range(6)])
    assert (flag["label"], flag["step"], flag["lift"]) == ("ham", 0, 0.0)


def test_a_sound_model_answering_mostly_ham_on_that_task_is_not_a_collapse():
    # 86.6% ham, ham recall 1, spam recall 0.9: ham share 0.866 + 0.134 · 0.1 = 0.8794 (≈ 88%; with
    # spam recall 0.9 no model answers ham more often); BA 0.95, lift (0.95 − 0.5)/0.5 = 0.9.
    shares, recall = binary(0.866, 1.0, 0.9)
    assert shares["ham"] == pytest.approx(0.8794) and lift(recall) == pytest.approx(0.9)
    assert find_collapse(repeat((shares, recall))) is None
    # even with the share bound lowered to 0.85 (0.8794 ≥ 0.85), its lift 0.9 ≥ 0.25 keeps it unflagged:
    # catches a rule that reads the answer share alone
    assert find_collapse(repeat((shares, recall)), share=0.85) is None
    # the same shares with no information (recalls 0.8794 and 0.1206: BA 1/2) are flagged at 0.85
    assert find_collapse(repeat((shares, blind(shares["ham"]))), share=0.85)["label"] == "ham"


def test_one_grade_of_five_on_96_percent_of_items_is_a_collapse():
    # grades 1–5 make up 10%, 15%, 30%, 25%, 20% of the items. The model answers "3" on 96% of them;
    # the other 4% are the most informative they can be: grade-1 items answered "1".
    # recalls: 1: 0.04 / 0.10 = 0.4, 2: 0, 3: 1 (every grade-3 item answered 3), 4: 0, 5: 0
    # BA = 1.4 / 5 = 0.28, lift = (0.28 − 0.2) / 0.8 = 0.1 < 0.25 → collapsed to 3.
    shares = {"1": 0.04, "2": 0.0, "3": 0.96, "4": 0.0, "5": 0.0}
    recall = {"1": 0.4, "2": 0.0, "3": 1.0, "4": 0.0, "5": 0.0}
    assert lift(recall) == pytest.approx(0.1)
    flag = find_collapse(repeat((shares, recall)))
    assert flag["label"] == "3" and flag["lift"] == pytest.approx(0.1)
    # catches K = the labels answered ({1, 3}) instead of the labels with items: BA 0.7, lift 0.4 → not flagged
    assert lift({"1": 0.4, "3": 1.0}) == pytest.approx(0.4)


def test_the_rule_reads_information_not_shares():
    # a 97%-ham task, answers 96.5% ham at two points:
    # sound: spam recall 0.9 → ham recall (0.965 − 0.03 · 0.1) / 0.97 = 0.99175, BA 0.94588, lift 0.89 → not flagged
    sound = binary(0.97, 0.962 / 0.97, 0.9)
    # blind: spam recall 0 (its 3% answered ham) → ham recall (0.965 − 0.03) / 0.97 = 0.96392, BA 0.48196,
    # lift −0.0361 → flagged
    blind_one = binary(0.97, 0.935 / 0.97, 0.0)
    assert sound[0]["ham"] == pytest.approx(0.965) and blind_one[0]["ham"] == pytest.approx(0.965)
    assert lift(sound[1]) == pytest.approx(0.8918, abs=1e-4) and lift(blind_one[1]) == pytest.approx(-0.0361, abs=1e-4)
    # same shares, opposite verdicts: catches any rule of shares (and item shares) alone
    assert find_collapse(repeat(sound)) is None
    assert find_collapse(repeat(blind_one))["label"] == "ham"


def test_the_lift_bound_is_strict():
    # a 90%-ham task, ham recall 1: spam recall 0.25 → ham share 0.9 + 0.1 · 0.75 = 0.975, BA 0.625,
    # lift exactly 0.25: not below 0.25, no collapse; spam recall 0.2 → lift 0.2 < 0.25 → collapse
    assert find_collapse(repeat(binary(0.9, 1.0, 0.25))) is None
    assert find_collapse(repeat(binary(0.9, 1.0, 0.2)))["label"] == "ham"
    # the bound is a setting: at max_lift 0.3 the first is flagged too
    assert find_collapse(repeat(binary(0.9, 1.0, 0.25)), max_lift=0.3)["label"] == "ham"


def test_lift_is_over_the_labels_that_have_items():
    # a constant answer: lift 0 whatever the mix and K
    assert lift({"ham": 1.0, "spam": 0.0}) == 0.0
    assert lift({"1": 0.0, "2": 0.0, "3": 1.0, "4": 0.0, "5": 0.0}) == 0.0
    # every item right: 1; a label without items (None) is left out of K: {1, 0.5} → BA 0.75, lift 0.5
    assert lift({"a": 1.0, "b": 1.0, "c": 1.0}) == 1.0
    assert lift({"ham": 1.0, "spam": 0.5, "eggs": None}) == pytest.approx(0.5)
    # below chance is negative; fewer than 2 labels with items is no evidence
    assert lift({"ham": 0.2, "spam": 0.3}) == pytest.approx(-0.5)
    assert lift({"ham": 1.0, "spam": None}) is None and lift({}) is None


def test_a_point_with_one_label_s_items_neither_counts_nor_ends_a_run():
    # steps 1, 3, 4 collapsed to ham; step 2's items are all ham (spam recall None): one label, no lift,
    # passed over → collapsed at step 1 with k = 3, and nothing with k = 4 (step 2 is not a fourth point).
    # Catches counting the recall None as 0 (lift 0: step 2 would count, and k = 4 would flag).
    series = ham(1.0, 1.0, 1.0, 1.0)
    series[1] = (2, {"ham": 1.0, "spam": 0.0}, {"ham": 1.0, "spam": None})
    assert find_collapse(series)["step"] == 1
    assert find_collapse(series, steps=4) is None
    # a sound point in its place (lift 0.9) ends the run instead: no three in a row
    series[1] = (2, *binary(0.97, 0.962 / 0.97, 0.9))
    assert find_collapse(series) is None


def test_the_first_run_is_reported_and_a_label_switch_ends_a_run():
    # spam at steps 1–3 (ham share 0.02 → spam 0.98), then ham at steps 6–8: the first collapse is spam at step 1
    series = ham(0.02, 0.02, 0.02, 0.5, 0.5, 1.0, 1.0, 1.0)
    assert (find_collapse(series)["label"], find_collapse(series)["step"]) == ("spam", 1)
    # spam, ham, ham, spam: each step has one label ≥ 0.95, but never the same one three times in a row.
    # Catches a run that counts "some label above the share" without checking it is the same label.
    assert find_collapse(ham(0.02, 1.0, 1.0, 0.02)) is None


def test_a_step_with_nothing_parsed_neither_counts_nor_ends_a_run():
    # ham 1.0, nothing parsed, ham 1.0, ham 0.97: three parsed points in a row → collapsed at step 1;
    # the empty step 2 is not a fourth point either (a flag needs k = 4 parsed points → none).
    series = ham(1.0, 0.0, 1.0, 0.97)
    assert find_collapse(series)["step"] == 1
    assert find_collapse(series, steps=4) is None


def test_a_label_the_start_was_collapsed_to_is_flagged_as_inherited():
    # ham was the start's collapse: the run's collapse to ham is still flagged, marked inherited
    # (catches the old silent exemption); a collapse to another label is the run's own
    flag = find_collapse(ham(1.0, 1.0, 1.0), inherited={"ham"})
    assert (flag["label"], flag["step"], flag["inherited"]) == ("ham", 1, True)
    assert find_collapse(ham(0.01, 0.01, 0.01), inherited={"ham"})["inherited"] is False


@pytest.mark.parametrize("options, message", [
    ({"share": 0.5}, "collapse_share=0.5: must be in \\(0.5, 1\\]"),
    ({"steps": 0}, "collapse_steps=0: a collapse needs at least 1 step"),
    ({"max_lift": 0.0}, "collapse_max_lift=0.0: must be in \\(0, 1\\].*--collapse-max-lift 0.25"),
    ({"max_lift": 1.5}, "collapse_max_lift=1.5: must be in \\(0, 1\\]"),
])
def test_settings_out_of_range_are_refused_by_name(options, message):
    with pytest.raises(ValueError, match=message):
        find_collapse(ham(1.0), **options)


@pytest.mark.parametrize("n_evals, needed", [(0, 1), (1, 1), (2, 1), (3, 1), (4, 2), (5, 2), (6, 3), (10, 3)])
def test_evals_needed_is_k_but_at_most_half_the_evaluations(n_evals, needed):
    # min(k = 3, ⌊n / 2⌋), at least 1
    assert evals_needed(n_evals, 3) == needed


def test_answer_shares_leave_unparsed_answers_out_of_the_denominator():
    # 2 ham + 1 spam parsed of 4: ham 2/3, spam 1/3 (not 2/4 and 1/4, which counts the unparsed one)
    assert answer_shares(["ham", None, "ham", "spam"], ["ham", "spam"]) == pytest.approx({"ham": 2 / 3, "spam": 1 / 3})
    assert answer_shares([None, None], ["ham", "spam"]) == {"ham": 0.0, "spam": 0.0}


def test_answer_recalls_count_unparsed_answers_as_wrong():
    # ham items answered ham, None, spam → 1/3 (not 1/2: the unparsed one is wrong, not left out);
    # spam items answered spam, ham → 1/2; no eggs item → None
    recall = answer_recalls(["ham", None, "spam", "spam", "ham"], ["ham", "ham", "ham", "spam", "spam"],
                            ["ham", "spam", "eggs"])
    assert recall == pytest.approx({"ham": 1 / 3, "spam": 1 / 2, "eggs": None})
    with pytest.raises(ValueError, match="2 answers for 1 labels"):
        answer_recalls(["ham", "spam"], ["ham"], ["ham", "spam"])


def test_the_step_metrics_count_only_answers_whose_parse_is_ok():
    def graded(status: str, answer: str | None):
        return SimpleNamespace(parse=SimpleNamespace(status=SimpleNamespace(value=status), answer=answer))

    # two prompts, G = 3: a spam prompt answered spam, spam, ham; a ham prompt answered a truncated
    # "ham" (not ok), an unknown label, ham. An unknown_label parse carries no answer; a truncated one
    # may still name a label but is not "ok".
    batch = SimpleNamespace(group_labels=["spam", "ham"],
                            graded=[graded("ok", "spam"), graded("ok", "spam"), graded("ok", "ham"),
                                    graded("truncated", "ham"), graded("unknown_label", None), graded("ok", "ham")])
    metrics = answer_share_metrics(batch, ("ham", "spam", "eggs"))
    # shares over the 4 ok answers: ham 2/4, spam 2/4, eggs 0; recalls: spam 2/3, ham 1/3 (counting
    # the truncated "ham" would give 2/3); eggs has no prompt this step: no recall logged
    assert metrics == pytest.approx({f"{K.ANSWER_SHARE}/ham": 0.5, f"{K.ANSWER_SHARE}/spam": 0.5,
                                     f"{K.ANSWER_SHARE}/eggs": 0.0,
                                     f"{K.ANSWER_RECALL}/spam": 2 / 3, f"{K.ANSWER_RECALL}/ham": 1 / 3})


def test_texts_name_label_and_step_or_the_inheritance():
    flag = {"label": "ham", "step": 5, "share": 0.97, "series": "rollouts"}
    assert collapse_text(flag) == "collapsed to ham at step 5"
    assert collapse_detail(flag) == "collapsed to ham at step 5 (0.97 of the parsed rollout answers)"
    inherited = {**flag, "inherited": True, "series": "val"}
    assert collapse_text(inherited) == "collapsed to ham (inherited from its parent)"
    assert collapse_text(inherited, "sft") == "collapsed to ham (inherited from sft)"
    assert collapse_detail(inherited, "sft") == "collapsed to ham (inherited from sft) (0.97 of the greedy val answers)"


# ---------------------------------------------------------------- from a run's files


def write_run(run_dir, ham_shares: list[float], val: list[tuple[int, float, dict | None]] | None = None,
              recall: bool = True, entropy: list[float] | None = None):
    """metrics.jsonl with ham's answer share per step and information-free recalls (``blind``;
    none with ``recall=False``, as a file written before they were logged), and optionally
    val_path.jsonl as the in-loop val scoring writes it: (step, ham's share, recall or ``blind``'s);
    ``entropy``: ``rollout/entropy_mean`` per step."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "metrics.jsonl", "w", encoding="utf-8") as f:
        for step, s, r in ham(*ham_shares):
            record = {K.STEP: step, f"{K.ANSWER_SHARE}/ham": s["ham"], f"{K.ANSWER_SHARE}/spam": s["spam"],
                      f"{K.LABEL_SHARE_DATA}/ham": 0.5, f"{K.LABEL_SHARE_DATA}/spam": 0.5}
            if recall:
                record |= {f"{K.ANSWER_RECALL}/ham": r["ham"], f"{K.ANSWER_RECALL}/spam": r["spam"]}
            if entropy is not None:
                record[K.ENTROPY_MEAN] = entropy[step - 1]
            f.write(json.dumps(record) + "\n")
    if val is not None:
        with open(run_dir / "val_path.jsonl", "w", encoding="utf-8") as f:
            for step, s, r in val:
                f.write(json.dumps({"step": step, "n": 40, "label_share": {"ham": s, "spam": 1 - s},
                                    "recall": blind(s) if r is None else r}) + "\n")
    return run_dir


def test_rollouts_alone_when_there_is_no_val_path(tmp_path):
    run = write_run(tmp_path / "run", [0.5, 0.5, 1.0, 1.0, 1.0, 1.0])
    assert detect_collapse(run) == {"label": "ham", "step": 3, "share": 1.0, "lift": 0.0, "inherited": False,
                                    "series": "rollouts"}


# The entropy before a collapse (module docstring): k = 3, collapse at step 8 (steps 8–10 all ham).
# early window: steps 1–3; before window: the last 3 steps before 8 outside it, steps 5–7.
COLLAPSING = [0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 1.0, 1.0, 1.0]


def test_the_note_says_entropy_fell_before_the_collapse(tmp_path):
    # early mean (2.0 + 2.2 + 1.8) / 3 = 2.0; before mean (1.5 + 1.4 + 1.3) / 3 = 1.4 < 0.8 × 2.0 = 1.6 → fell.
    # Steps 4 (2.5, between the windows) and 8–10 (0.1, the collapse itself) must not count.
    entropy = [2.0, 2.2, 1.8, 2.5, 1.5, 1.4, 1.3, 0.1, 0.1, 0.1]
    flag = detect_collapse(write_run(tmp_path / "run", COLLAPSING, entropy=entropy))
    assert flag["step"] == 8 and flag["entropy"] == {
        "fell": True, "early": pytest.approx(2.0), "before": pytest.approx(1.4),
        "early_steps": [1, 3], "before_steps": [5, 7]}
    assert collapse_detail(flag) == ("collapsed to ham at step 8 (1.00 of the parsed rollout answers); entropy fell "
                                     "before it (2.00 → 1.40 nats per token, steps 1–3 → 5–7)")


def test_the_note_says_entropy_did_not_fall_when_it_held_within_the_margin(tmp_path):
    # before mean (1.8 + 1.7 + 1.5) / 3 = 1.667 ≥ 0.8 × 2.0 = 1.6: a fall of 17%, within the margin.
    # The collapse's own steps fall to 0.1: counting them would have called it a fall.
    entropy = [2.0, 2.2, 1.8, 0.5, 1.8, 1.7, 1.5, 0.1, 0.1, 0.1]
    flag = detect_collapse(write_run(tmp_path / "run", COLLAPSING, entropy=entropy))
    assert flag["entropy"]["fell"] is False and flag["entropy"]["before"] == pytest.approx(5 / 3)
    assert collapse_detail(flag).endswith("; entropy did not fall before it (2.00 → 1.67 nats per token, steps 1–3 → 5–7)")


def test_the_note_says_too_early_to_tell_and_nothing_without_entropy(tmp_path):
    # a collapse at step 3: steps 1–2 fill the early window and leave none before it
    flag = detect_collapse(write_run(tmp_path / "early", [0.5, 0.5, 1.0, 1.0, 1.0], entropy=[2.0, 1.0, 0.5, 0.5, 0.5]))
    assert flag["step"] == 3 and flag["entropy"]["fell"] is None and flag["entropy"]["early_steps"] == [1, 2]
    assert collapse_detail(flag).endswith("; too few steps before it to tell whether entropy fell")
    # a run that logged no entropy: no entropy in the flag, no clause in the note
    flag = detect_collapse(write_run(tmp_path / "old", COLLAPSING))
    assert "entropy" not in flag and collapse_detail(flag) == "collapsed to ham at step 8 (1.00 of the parsed rollout answers)"


def test_the_rollout_series_reads_shares_and_recalls():
    records = [{K.STEP: 1, f"{K.ANSWER_SHARE}/ham": 1.0, f"{K.ANSWER_SHARE}/spam": 0.0, f"{K.ANSWER_RECALL}/ham": 1.0},
               {K.STEP: 2, "reward/mean": 0.5}]  # no shares: not a point
    assert rollout_series(records) == [(1, {"ham": 1.0, "spam": 0.0}, {"ham": 1.0})]


def test_a_metrics_file_without_recalls_is_never_flagged(tmp_path):
    # written before rollout/answer_recall was logged: no point has 2 labels' recall, so no evidence
    run = write_run(tmp_path / "run", [1.0, 1.0, 1.0, 1.0], recall=False)
    assert detect_collapse(run) is None


def test_the_val_series_flags_earlier_with_fewer_evaluations(tmp_path):
    # rollouts collapse at step 5; val evaluations at steps 0, 2, 4, 6: three after the start, so
    # k = min(3, ⌊3 / 2⌋) = 1 evaluation, and step 4's ham 1.0 (lift 0) flags it at step 4 < 5
    run = write_run(tmp_path / "run", [0.5, 0.5, 0.6, 0.7, 1.0, 1.0, 1.0],
                    val=[(0, 0.5, None), (2, 0.6, None), (4, 1.0, None), (6, 1.0, None)])
    assert detect_collapse(run) == {"label": "ham", "step": 4, "share": 1.0, "lift": 0.0, "inherited": False,
                                    "series": "val"}
    # with the rollouts' collapse first (step 1), the rollouts flag wins
    run = write_run(tmp_path / "early", [1.0, 1.0, 1.0], val=[(0, 0.5, None), (2, 1.0, None)])
    assert detect_collapse(run)["series"] == "rollouts"


def test_a_collapse_the_starting_model_already_had_is_flagged_as_inherited(tmp_path):
    # the starting model (val step 0) answers ham on 97% of val items with no information (lift 0):
    # the run's collapse to ham is the parent's doing; flagged, marked inherited (never silent)
    run = write_run(tmp_path / "run", [1.0, 1.0, 1.0, 1.0], val=[(0, 0.97, None), (2, 1.0, None), (4, 1.0, None)])
    assert detect_collapse(run) == {"label": "ham", "step": 1, "share": 1.0, "lift": 0.0, "inherited": True,
                                    "series": "rollouts"}
    # a start that answers ham on 97% of items but informatively (spam recall 0.9: lift 0.89) is not
    # collapsed, so the run's collapse is its own. Catches judging the start by its share alone.
    sound = {"ham": 0.99, "spam": 0.9}
    run = write_run(tmp_path / "sound", [1.0, 1.0, 1.0, 1.0], val=[(0, 0.97, sound), (2, 1.0, None), (4, 1.0, None)])
    assert detect_collapse(run)["inherited"] is False


def test_val_items_that_are_all_one_label_are_no_evidence(tmp_path):
    # every val item is ham (spam recall null): ham on every val answer has no lift to judge → passed over
    run = write_run(tmp_path / "run", [0.5, 0.5, 0.5], val=[(0, 0.6, None), (2, 1.0, {"ham": 1.0, "spam": None})])
    assert detect_collapse(run) is None
    # with spam items on val answered ham (recall 0), the same answers are a collapse: catches a null
    # recall read as 0
    run = write_run(tmp_path / "spam", [0.5, 0.5, 0.5], val=[(0, 0.6, None), (2, 1.0, {"ham": 1.0, "spam": 0.0})])
    assert detect_collapse(run) == {"label": "ham", "step": 2, "share": 1.0, "lift": 0.0, "inherited": False,
                                    "series": "val"}


# ---------------------------------------------------------------- end to end through run_rl

# The warm start (tests/conftest.py) answers the toy task's RL words at chance. The task pays a
# right "yes" 1 and a right "no" 0.1 (--class-reward yes=1/0,no=0.1/0), and Dr. GRPO leaves the
# advantages unscaled, so "yes" groups push ten times harder: at 1e-3 the policy drifts toward
# answering "yes" to everything, at 1e-4 it stays near its start. Measured over 12 steps on
# MKL/oneDNN's AMX kernels with 1 and 2 threads and held to AVX2: at 1e-3 "yes" takes 0.85–1.0 of
# the parsed answers over two steps in a row by step 5 to 11 (at 1e-4 it never passes 0.73). The
# rounding-dependent trajectories differ step by step, so the test asks for a collapse to "yes"
# under the rule set to 0.85 for 2 steps, not for one step. On the toy task's even mix a share of
# 0.85 leaves a lift of at most 0.3 (lift = r_yes + r_no − 1 ≤ r_no ≤ r_yes − 0.7), and a policy
# drifting to "yes" keeps little: its points fall under --collapse-max-lift 0.25. The val path is
# off: the warm start's val answers are one word whose label the kernels decide, and a collapse
# the start already has would be flagged as inherited.
FAST = dict(steps=12, group_size=4, prompts_per_step=8, max_new_tokens=8, checkpoint_every=4, preset="dr_grpo",
            class_reward="yes=1/0,no=0.1/0", val_path=False, collapse_share=0.85, collapse_steps=2)


def test_a_high_learning_rate_collapses_and_the_summary_says_so(warm_model, toy_data, rl_config, tmp_path):
    from labelrl.cli.train import print_rl_summary
    from labelrl.train.rl import run_rl

    cfg = rl_config(warm_model, toy_data, tmp_path / "high", learning_rate=1e-3, **FAST)
    summary = run_rl(cfg)
    flag = summary["collapse"]
    assert flag is not None and (flag["label"], flag["series"]) == ("yes", "rollouts") and 2 <= flag["step"] <= 11
    assert flag["inherited"] is False and flag["lift"] < 0.25
    # the flag is the first of two points in a row at ≥ 0.85 "yes" with lift < 0.25, as the metrics file
    # logged them (a step whose prompts all had one label is no evidence and is left out)
    points = [(step, shares["yes"], lift(recall)) for step, shares, recall in
              rollout_series(read_jsonl(tmp_path / "high" / "metrics.jsonl")) if lift(recall) is not None]
    at = next(i for i, (step, _, _) in enumerate(points) if step == flag["step"])
    assert all(points[at + i][1] >= 0.85 and points[at + i][2] < 0.25 for i in range(2))
    assert at == 0 or not (points[at - 1][1] >= 0.85 and points[at - 1][2] < 0.25)
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
    # the logged shares are the rollout log's parsed answers per step, unparsed ones left out; the
    # recalls are over the step's rollouts of each label, unparsed ones wrong, absent without any
    rollouts = read_rollouts(tmp_path / "low").to_pylist()
    for record in read_jsonl(tmp_path / "low" / "metrics.jsonl"):
        step = [r for r in rollouts if r["step"] == record[K.STEP]]
        answers = [r["answer"] for r in step if r["parse_status"] == "ok"]
        for label in ("yes", "no"):
            expected = answers.count(label) / len(answers) if answers else 0.0
            assert record[f"{K.ANSWER_SHARE}/{label}"] == pytest.approx(expected)
            mine = [r["parse_status"] == "ok" and r["answer"] == label for r in step if r["label"] == label]
            assert record.get(f"{K.ANSWER_RECALL}/{label}") == (pytest.approx(sum(mine) / len(mine)) if mine else None)
