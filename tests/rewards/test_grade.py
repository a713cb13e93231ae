"""Reference and property tests for labelrl.rewards.grade."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labelrl.rewards.grade import RewardScale, grade, is_correct, success_threshold
from labelrl.types import LabelSpace

BINARY = LabelSpace(("ham", "spam"), kind="binary")
GRADES = LabelSpace(("1", "2", "3", "4", "5"), kind="ordinal")


def test_binary_default_and_signed_values():
    scale = RewardScale(labels=BINARY)
    assert (grade("spam", "spam", scale), grade("ham", "spam", scale), grade(None, "spam", scale)) == (1.0, 0.0, 0.0)
    signed = RewardScale(labels=BINARY, correct=1, incorrect=-1)
    # failure defaults to the incorrect value: −1
    assert (grade("ham", "ham", signed), grade("spam", "ham", signed), grade(None, "ham", signed)) == (1.0, -1.0, -1.0)


def test_labels_compare_trimmed_and_case_folded():
    scale = RewardScale(labels=BINARY)
    assert grade(" SPAM ", "Spam", scale) == 1.0


def test_categorical_wrong_class_earns_incorrect_whatever_the_distance():
    scale = RewardScale.from_labels(["neg", "neu", "pos"])  # categorical: order carries no credit
    assert scale.kind == "categorical"
    assert [grade(p, "pos", scale) for p in ("neg", "neu", "pos")] == [0.0, 0.0, 1.0]


def test_ordinal_linear_partial_credit_k5():
    scale = RewardScale(labels=GRADES)
    # 1 − |pred − ref| / (K − 1) with K = 5, ref "4" (index 3):
    # pred 1: 1 − 3/4 = 0.25; pred 2: 1 − 2/4 = 0.5; pred 3: 0.75; pred 4: 1; pred 5: 0.75
    assert [grade(p, "4", scale) for p in "12345"] == [0.25, 0.5, 0.75, 1.0, 0.75]
    # ref "1": pred "5" is K − 1 = 4 grades away → 1 − 4/4 = 0
    assert grade("5", "1", scale) == 0.0
    # failure is the incorrect value (0), below the worst parsed answer for ref "4" (0.25)
    assert grade(None, "4", scale) == 0.0


def test_ordinal_partial_credit_maps_onto_custom_values():
    scale = RewardScale(labels=GRADES, correct=1, incorrect=-1)
    # −1 + (1 − (−1)) · (1 − 2/4) = −1 + 2 · 0.5 = 0
    assert grade("2", "4", scale) == 0.0
    # −1 + 2 · (1 − 1/4) = 0.5
    assert grade("3", "4", scale) == 0.5


def test_per_class_values_make_a_missed_positive_cost_more():
    scale = RewardScale(
        labels=BINARY,
        per_class={"spam": {"incorrect": -2.0}, "ham": {"correct": 0.5, "incorrect": -0.5}},
    )
    assert grade("ham", "spam", scale) == -2.0  # missed spam
    assert grade("spam", "ham", scale) == -0.5  # false alarm
    assert grade("spam", "spam", scale) == 1.0  # global correct value
    assert grade("ham", "ham", scale) == 0.5
    # failure defaults to the class's incorrect value
    assert (grade(None, "spam", scale), grade(None, "ham", scale)) == (-2.0, -0.5)
    # per-class threshold: the class's correct reward; without a label, the lowest of them
    assert (success_threshold(scale, "spam"), success_threshold(scale, "ham"), success_threshold(scale)) == (1.0, 0.5, 0.5)


def test_per_class_keys_are_matched_case_insensitively():
    scale = RewardScale(labels=BINARY, per_class={" SPAM": {"incorrect": -3}})
    assert grade("ham", "spam", scale) == -3.0


def test_user_table_and_its_failure_default():
    table = {"lo": {"lo": 1, "mid": 0.2, "hi": -1}, "mid": {"lo": 0.3, "mid": 1, "hi": 0.3}, "hi": {"lo": -1, "mid": 0.2, "hi": 1}}
    scale = RewardScale.from_labels(["lo", "mid", "hi"], kind="ordinal", table=table)
    assert grade("hi", "lo", scale) == -1.0
    assert grade("lo", "mid", scale) == 0.3
    assert grade(None, "mid", scale) == 0.3  # lowest entry of row "mid"
    assert grade(None, "lo", scale) == -1.0
    assert RewardScale.from_labels(["lo", "mid", "hi"], table=table, failure=-5).failure_for("mid") == -5.0


def test_explicit_failure_and_unknown_answers():
    scale = RewardScale(labels=BINARY, failure=-0.5)
    assert grade(None, "ham", scale) == -0.5
    assert grade("eggs", "ham", scale) == -0.5  # not a label: graded as a failure
    with pytest.raises(ValueError, match="reference label 'eggs' is not one of"):
        grade("ham", "eggs", scale)


def test_success_threshold_and_is_correct():
    binary = RewardScale(labels=BINARY, correct=2, incorrect=-1)
    assert success_threshold(binary) == 2.0
    assert is_correct("spam", "spam", binary) and not is_correct("ham", "spam", binary)
    assert not is_correct(None, "spam", binary) and not is_correct("eggs", "spam", binary)
    exact = RewardScale(labels=GRADES)
    assert success_threshold(exact) == 1.0  # default: the exact-grade reward
    assert is_correct("4", "4", exact) and not is_correct("3", "4", exact)
    within_one = RewardScale(labels=GRADES, success_threshold=0.75)
    # one grade off: 1 − 1/4 = 0.75 ≥ τ = 0.75 → success; two off: 0.5 < 0.75 → failure
    assert is_correct("3", "4", within_one) and is_correct("5", "4", within_one)
    assert not is_correct("2", "4", within_one)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(labels=BINARY, correct=0, incorrect=1), "correct=0.0 ≤ incorrect=1.0"),
        (dict(labels=BINARY, per_class={"spam": {"correct": -1}}), "reference 'spam': correct=-1.0"),
        (dict(labels=BINARY, per_class={"eggs": {"correct": 2}}), "per_class names 'eggs'"),
        (dict(labels=BINARY, per_class={"spam": {"bonus": 2}}), "bonus"),
        (dict(labels=BINARY, table={"ham": {"ham": 1, "spam": 0}}), "table\\['spam'\\] lacks predictions"),
        (dict(labels=BINARY, table={"ham": {"ham": 1, "spam": 1}, "spam": {"ham": 0, "spam": 1}}), "strictly the most"),
        (dict(labels=BINARY, table={"ham": {"ham": 1, "spam": 0}, "spam": {"ham": 0, "spam": 1}}, per_class={}), "both given"),
        (dict(labels=BINARY, success_threshold=0.5), "only ordinal scales"),
        (dict(labels=GRADES, success_threshold=1.5), "success_threshold=1.5"),
        (dict(labels=GRADES, success_threshold=0.0), "success_threshold=0.0"),
        (dict(labels=BINARY, correct=math.inf), "not finite"),
    ],
)
def test_invalid_scales_raise_value_error_naming_the_problem(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RewardScale(**kwargs)


def test_from_labels_builds_label_space_and_checks_kind():
    scale = RewardScale.from_labels(["a", "b", "c"], kind="ordinal", correct=2)
    assert (scale.kind, scale.correct, grade("c", "a", scale)) == ("ordinal", 2.0, 0.0)
    assert RewardScale.from_labels(BINARY).kind == "binary"
    with pytest.raises(ValueError, match="contradicts"):
        RewardScale.from_labels(BINARY, kind="ordinal")
    with pytest.raises(ValueError, match="single string"):
        RewardScale.from_labels("a,b")


@settings(max_examples=150, deadline=None)
@given(
    k=st.integers(2, 7),
    kind=st.sampled_from(["categorical", "ordinal"]),
    correct=st.floats(-5, 5),
    gap=st.floats(0.01, 5),
    per_class_incorrect=st.lists(st.floats(-10, 0), min_size=7, max_size=7),
)
def test_failure_never_beats_a_parsed_answer_and_correct_is_the_row_maximum(k, kind, correct, gap, per_class_incorrect):
    names = tuple(f"g{i}" for i in range(k))
    per_class = {name: {"incorrect": correct - gap + extra} for name, extra in zip(names, per_class_incorrect)}
    scale = RewardScale(labels=LabelSpace(names, kind=kind), correct=correct, incorrect=correct - gap, per_class=per_class)
    for ref in names:
        row = [grade(pred, ref, scale) for pred in names]
        assert grade(None, ref, scale) <= min(row) + 1e-12
        assert max(row) == grade(ref, ref, scale) == correct
        assert [is_correct(pred, ref, scale) for pred in names] == [pred == ref for pred in names]


def test_class_rewards_and_reward_tables_from_the_command_line(tmp_path):
    from labelrl.rewards.grade import parse_class_rewards, read_reward_table

    # spam=2 (correct), ham=1 correct and -0.5 wrong: steering toward spam recall through the reward
    per_class = parse_class_rewards("spam=2, ham=1/-0.5")
    scale = RewardScale.from_labels(["ham", "spam"], kind="binary", per_class=per_class)
    assert grade("spam", "spam", scale) == 2.0 and grade("ham", "spam", scale) == 0.0
    assert grade("ham", "ham", scale) == 1.0 and grade("spam", "ham", scale) == -0.5
    with pytest.raises(ValueError, match="LABEL=CORRECT"):
        parse_class_rewards("spam:2")
    path = tmp_path / "table.yaml"
    path.write_text("'1': {'1': 1.0, '2': 0.5, '3': 0.0}\n'2': {'1': 0.25, '2': 1.0, '3': 0.25}\n'3': {'1': 0.0, '2': 0.5, '3': 1.0}\n")
    table = read_reward_table(path)
    scale = RewardScale.from_labels(["1", "2", "3"], kind="ordinal", table=table)
    assert grade("2", "1", scale) == 0.5 and grade("1", "2", scale) == 0.25  # asymmetric
    with pytest.raises(ValueError, match="no such file"):
        read_reward_table(tmp_path / "missing.yaml")


def test_a_yaml_reward_table_keeps_yes_and_no_as_labels(tmp_path):
    # YAML 1.1 reads a bare yes/no as a boolean: {yes: {yes: 1}} would name the label True
    from labelrl.rewards.grade import read_reward_table

    path = tmp_path / "table.yaml"
    path.write_text("yes: {yes: 1.0, no: -0.5}\nno: {no: 1, yes: 0}\n", encoding="utf-8")
    assert read_reward_table(path) == {"yes": {"yes": 1.0, "no": -0.5}, "no": {"no": 1.0, "yes": 0.0}}
