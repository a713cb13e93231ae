"""Tests for labelrl.rewards.reward_fn: the composite reward and its TRL adapter."""

from __future__ import annotations

import math
import types

import pytest

from labelrl import metrics_keys as K
from labelrl.rewards.parse import ParseStatus
from labelrl.rewards.reward_fn import RewardConfig, completion_text, score_completions, trl_reward_func
from labelrl.types import LabelSpace

BINARY = LabelSpace(("ham", "spam"), kind="binary")


def test_score_completions_parses_grades_and_gates_format():
    config = RewardConfig(labels=BINARY, correct=1, incorrect=-1, failure=-2)
    texts = ["<answer>spam</answer>", "<answer>ham</answer>", "The answer is <answer>spam</answer>", "<answer>eggs</answer>"]
    batch = score_completions(texts, ["spam"] * 4, config=config)
    assert [p.status for p in batch.parses] == [ParseStatus.OK, ParseStatus.OK, ParseStatus.NO_ANSWER, ParseStatus.UNKNOWN_LABEL]
    # correct → 1, wrong → −1, prose around the block fails the strict format gate → −2, unknown label → −2
    assert batch.rewards == [1.0, -1.0, -2.0, -2.0]
    assert batch.correct == [True, False, False, False]
    assert batch.loss_mask == batch.baseline_mask == [True] * 4
    assert batch.truncated == [False] * 4 and len(batch) == 4


def test_items_view_matches_the_columns_and_labels_take_a_kind():
    config = RewardConfig(labels=["1", "2", "3"], kind="ordinal")
    assert config.scale().kind == "ordinal"
    batch = score_completions(["<answer>2</answer>", "x"], ["3", "3"], truncated=[False, True], config=config)
    first, second = batch.items
    # ordinal K = 3: pred 2, ref 3 → 1 − 1/2 = 0.5; the truncated unparseable one → failure 0
    assert (first.reward, first.parse.answer, first.correct, first.truncated) == (0.5, "2", False, False)
    assert (second.reward, second.parse.status, second.loss_mask, second.truncated) == (0.0, ParseStatus.TRUNCATED, True, True)
    with pytest.raises(ValueError, match="contradicts"):
        RewardConfig(labels=BINARY, kind="ordinal")


def test_lenient_parsing_changes_what_the_reward_credits():
    text = "The answer is <answer>spam</answer>"
    strict = score_completions([text], ["spam"], config=RewardConfig(labels=BINARY))
    lenient = score_completions([text], ["spam"], config=RewardConfig(labels=BINARY, parse_mode="lenient"))
    assert (strict.rewards, lenient.rewards) == ([0.0], [1.0])


def test_reasoning_mode_reads_after_the_last_think():
    config = RewardConfig(labels=BINARY, reasoning=True)
    texts = ["<think>not <answer>ham</answer></think><answer>spam</answer>", "<think><answer>spam</answer>"]
    batch = score_completions(texts, ["spam", "spam"], config=config)
    assert batch.rewards == [1.0, 0.0]
    assert batch.parses[1].status is ParseStatus.UNCLOSED_THINK


def test_ordinal_partial_credit_and_per_class_failure_flow_through():
    config = RewardConfig(labels=LabelSpace(("1", "2", "3", "4", "5"), kind="ordinal"), success_threshold=0.75)
    batch = score_completions(["<answer>2</answer>", "<answer>3</answer>", "no"], ["4", "4", "4"], config=config)
    assert batch.rewards == [0.5, 0.75, 0.0]  # 1 − 2/4, 1 − 1/4, failure
    assert batch.correct == [False, True, False]  # τ = 0.75


@pytest.mark.parametrize(
    "policy, extra, rewards, loss_mask, baseline_mask",
    [
        # a truncated completion that still parsed correctly: zero → failure reward
        ("zero", {}, [1.0, 0.0], [True, True], [True, True]),
        ("mask", {}, [1.0, 1.0], [True, False], [True, False]),
        ("mask", {"mask_in_baseline": True}, [1.0, 1.0], [True, False], [True, True]),
        # lengths 5 and 8, cap 8, cache 4: free 4; 5 → (4 − 5)/4 = −0.25; 8 → −1
        ("soft_penalty", {"cache_tokens": 4}, [0.75, 0.0], [True, True], [True, True]),
    ],
)
def test_truncation_policies_in_the_composite(policy, extra, rewards, loss_mask, baseline_mask):
    config = RewardConfig(labels=BINARY, truncation=policy, max_new_tokens=8, **extra)
    batch = score_completions(
        ["<answer>spam</answer>"] * 2, ["spam", "spam"], truncated=[False, True], lengths=[5, 8], config=config
    )
    assert (batch.rewards, batch.loss_mask, batch.baseline_mask) == (rewards, loss_mask, baseline_mask)
    assert batch.correct == [True, True]  # the grader's verdict ignores the truncation policy


def test_config_and_batch_errors_name_the_value():
    with pytest.raises(ValueError, match="unknown truncation policy 'cut'"):
        RewardConfig(labels=BINARY, truncation="cut")
    with pytest.raises(ValueError, match="cache_tokens=None"):
        RewardConfig(labels=BINARY, truncation="soft_penalty", max_new_tokens=8)
    with pytest.raises(ValueError, match="max_new_tokens=None"):
        RewardConfig(labels=BINARY, truncation="soft_penalty", cache_tokens=2)
    with pytest.raises(ValueError, match="correct=0.0 ≤ incorrect=0.0"):
        RewardConfig(labels=BINARY, correct=0)
    config = RewardConfig(labels=["ham", "spam"])
    with pytest.raises(ValueError, match="2 completions but 1 labels"):
        score_completions(["a", "b"], ["ham"], config=config)
    with pytest.raises(ValueError, match="reference label 'eggs'"):
        score_completions(["a"], ["eggs"], config=config)


# --- TRL adapter --------------------------------------------------------------------------

def call_like_trl(func, prompts, completions, completion_ids, **columns):
    """The keyword call of GRPOTrainer._calculate_rewards in TRL 1.16."""
    logged: dict = {}
    reward_kwargs = dict(columns)
    reward_kwargs["trainer_state"] = types.SimpleNamespace(global_step=3)
    reward_kwargs["log_extra"] = lambda column, values: logged.setdefault(column, values)
    reward_kwargs["log_metric"] = lambda name, value: logged.setdefault(name, value)
    out = func(prompts=prompts, completions=completions, completion_ids=completion_ids, **reward_kwargs)
    return out, logged


def test_trl_adapter_with_string_completions_and_truncation_from_ids():
    config = RewardConfig(labels=BINARY, truncation="mask", max_new_tokens=4)
    func = trl_reward_func(config)
    assert func.__name__ == "labelrl_binary_strict"
    completions = ["<answer>spam</answer>", "<answer>ham</answer>", "<answer>sp"]
    ids = [[5, 6, 2], [7, 8, 2], [9, 9, 9, 9]]  # the third reached max_completion_length = 4
    out, logged = call_like_trl(func, ["p"] * 3, completions, ids, label=["spam", "spam", "spam"], text=["x"] * 3)
    # masked (out of loss and baseline) → None, which TRL turns into NaN and drops
    assert out == [1.0, 0.0, None]
    assert logged["parse_status"] == ["ok", "ok", "truncated"]
    assert logged[K.TRUNCATED_FRAC] == pytest.approx(1 / 3)
    assert logged[K.PARSE_FAIL_FRAC] == pytest.approx(1 / 3)


def test_trl_adapter_with_conversational_completions():
    config = RewardConfig(labels=BINARY, reasoning=True, max_new_tokens=16)
    func = trl_reward_func(config, label_column="gold")
    completions = [
        [{"role": "assistant", "content": "<think>an ad</think><answer>spam</answer>"}],
        # a chat-template response parser split the thought off into reasoning_content
        [{"role": "assistant", "reasoning_content": "an ad", "content": "<answer>spam</answer>"}],
        [{"role": "assistant", "content": [{"type": "text", "text": "<think>hi</think>"}, {"type": "text", "text": "<answer>ham</answer>"}]}],
        [{"role": "assistant", "content": "<think>still thinking"}],
    ]
    prompts = [[{"role": "user", "content": "Spam?"}]] * 4
    out, _ = call_like_trl(func, prompts, completions, [[1, 2]] * 4, gold=["spam", "spam", "spam", "spam"])
    assert out == [1.0, 1.0, 0.0, 0.0]


def test_trl_adapter_eos_at_the_cap_is_not_truncation_and_int_labels_work():
    config = RewardConfig(labels=["0", "1"], truncation="zero")
    func = trl_reward_func(config, max_completion_length=3, eos_token_ids=[2])
    out, _ = call_like_trl(func, ["p", "p"], ["<answer>1</answer>"] * 2, [[5, 6, 2], [5, 6, 7]], label=[1, 1])
    # the first ended with EOS exactly at the cap; the second was cut → zero policy → failure
    assert out == [1.0, 0.0]


def test_trl_adapter_soft_penalty_uses_id_lengths():
    config = RewardConfig(labels=BINARY, truncation="soft_penalty", max_new_tokens=8, cache_tokens=4)
    out, _ = call_like_trl(trl_reward_func(config), ["p"], ["<answer>ham</answer>"], [[1] * 6], label=["ham"])
    assert out == [0.5]  # 1 + (4 − 6)/4


def test_trl_adapter_errors():
    with pytest.raises(ValueError, match="max_completion_length=None"):
        trl_reward_func(RewardConfig(labels=BINARY))
    func = trl_reward_func(RewardConfig(labels=BINARY), max_completion_length=8)
    with pytest.raises(ValueError, match=r"label_column='label' is not among the dataset columns \['answer_key'\]"):
        call_like_trl(func, ["p"], ["x"], [[1]], answer_key=["ham"])


def test_completion_text_skips_non_assistant_messages():
    messages = [{"role": "assistant", "content": "a"}, {"role": "tool", "content": "b"}, {"role": "assistant", "content": "c"}]
    assert completion_text(messages) == "a\nc"
    assert completion_text({"content": "solo"}) == "solo"


def test_trl_calculate_rewards_turns_none_into_nan():
    """Run TRL 1.16's own reward collection on a stub trainer: None must arrive as NaN."""
    import torch
    from accelerate import PartialState
    from trl.trainer import grpo_trainer as grpo

    started_here = not PartialState._shared_state  # leave any state other tests set up alone
    PartialState(cpu=True)  # TRL's logger needs an initialised accelerate state
    func = trl_reward_func(RewardConfig(labels=BINARY, truncation="mask", max_new_tokens=4))
    stub = types.SimpleNamespace(
        accelerator=types.SimpleNamespace(device=torch.device("cpu"), is_main_process=True),
        args=types.SimpleNamespace(report_to=[]), state=types.SimpleNamespace(global_step=0),
        reward_funcs=[func], reward_processing_classes=[None], reward_func_names=[func.__name__],
        _log_completion_extra=lambda column, values: None, _log_metric=lambda name, value: None, environments=None,
    )
    inputs = [{"prompt": "p", "label": "spam"}] * 2
    try:
        rewards = grpo.GRPOTrainer._calculate_rewards(
            stub, inputs, ["p", "p"], ["<answer>spam</answer>", "<answer>sp"], [[1, 2], [1, 2, 3, 4]]
        )
    finally:
        if started_here:
            PartialState._reset_state()
    assert rewards.shape == (2, 1)
    assert rewards[0, 0].item() == 1.0 and math.isnan(rewards[1, 0].item())
