"""The RL loop: resume equality, the skip rule, run files and their schemas, config checks."""

from __future__ import annotations

import dataclasses
import math
import re
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from pydantic import ValidationError

from labelrl import metrics_keys as K
from labelrl.advantages import compute_advantages
from labelrl.fileio import read_jsonl
from labelrl.rollout.log import ROLLOUT_SCHEMA, read_rollouts
from labelrl.train import rl
from labelrl.train.config import RLConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from run_files import saved_weights as _weights  # noqa: E402
from numerics import (  # noqa: E402
    assert_gradients_within, gamma, gradient_bounds, gradient_chain_length, gradient_magnitudes,
)

# Keys whose values depend on wall time or memory, not on the computation.
TIMING_KEYS = {K.STEP_SECONDS, K.TOKENS_PER_S, K.PEAK_MEMORY_MB, K.SAMPLE_SECONDS, K.UPDATE_SECONDS, K.VAL_SECONDS}


def _deterministic(records):
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in records]


def test_stopped_and_resumed_run_equals_an_uninterrupted_one(warm_model, toy_data, rl_config, tmp_path, weights_changed):
    options = dict(steps=4, prompts_per_step=2, group_size=4, max_new_tokens=8, checkpoint_every=1)
    rl.run_rl(rl_config(warm_model, toy_data, tmp_path / "straight", **options))
    weights_changed(warm_model, tmp_path / "straight")  # else the equality below proves nothing
    first = rl.run_rl(rl_config(warm_model, toy_data, tmp_path / "resumed", stop_after=2, **options))
    assert first["steps_done"] == 2 and first["stopped_early"] and "model_dir" not in first
    rl.run_rl(rl_config(warm_model, toy_data, tmp_path / "resumed", resume=True, **options))

    straight, resumed = _weights(tmp_path / "straight"), _weights(tmp_path / "resumed")
    assert straight.keys() == resumed.keys()
    for name in straight:
        assert torch.equal(straight[name], resumed[name]), name
    a = _deterministic(read_jsonl(tmp_path / "straight" / "metrics.jsonl"))
    b = _deterministic(read_jsonl(tmp_path / "resumed" / "metrics.jsonl"))
    assert [r[K.STEP] for r in b] == [1, 2, 3, 4]
    assert a == b
    assert read_rollouts(tmp_path / "straight").equals(read_rollouts(tmp_path / "resumed"))


def test_a_second_run_into_the_same_directory_is_refused(warm_model, toy_data, rl_config, tmp_path):
    rl.run_rl(rl_config(warm_model, toy_data, tmp_path / "run", steps=1, prompts_per_step=1, group_size=2))
    with pytest.raises(ValueError, match="already holds an RL run; pass --resume"):
        rl.run_rl(rl_config(warm_model, toy_data, tmp_path / "run", steps=1, prompts_per_step=1, group_size=2))


def test_a_token_cap_that_cannot_hold_an_answer_and_its_end_token_is_refused_before_training(
        warm_model, toy_data, rl_config, tmp_path):
    # A completion giving the longest answer would hit the cap, count as truncated and earn the
    # failure reward on every step: RL would learn never to give that label.
    from labelrl.data.load import load_dataset
    from labelrl.data.prompts import longest_answer
    from labelrl.models.load import load_tokenizer

    tokens, tag = longest_answer(load_tokenizer(warm_model / "model"), load_dataset(str(toy_data)).labels)
    with pytest.raises(ValueError, match=rf"--max-new-tokens {tokens}: the answer {re.escape(tag)} takes {tokens} "
                                         rf"tokens.*at least {tokens + 1}"):
        rl.run_rl(rl_config(warm_model, toy_data, tmp_path / "short", max_new_tokens=tokens, steps=1))
    assert not (tmp_path / "short" / "metrics.jsonl").exists()
    done = rl.run_rl(rl_config(warm_model, toy_data, tmp_path / "fits", max_new_tokens=tokens + 1, steps=1,
                               prompts_per_step=1, group_size=2))
    assert done["steps_done"] == 1


def test_resume_without_a_checkpoint_says_how_to_start(warm_model, toy_data, rl_config, tmp_path):
    with pytest.raises(ValueError, match="has no checkpoint yet; run without --resume"):
        rl.run_rl(rl_config(warm_model, toy_data, tmp_path / "fresh", resume=True))


def _batch_with_one_uniform_group(run):
    """A real sampled batch whose rewards are set to: group 0 mixed, group 1 uniform.

    Group 0's completions are replaced by four different ones of different lengths: the warm
    start often samples one answer G times, and identical completions with advantages that
    sum to 0 have a zero on-policy gradient, which no denominator can get wrong.
    """
    batch = rl.sample_groups_for_step(run)
    G = run.cfg.group_size
    eos = run.tokenizer.eos_token_id
    for j, text in enumerate(["yes", "no", "yes yes", "no no no"][:G]):
        batch.completion_ids[j] = run.tokenizer.encode(text, add_special_tokens=False) + [eos]
        batch.texts[j], batch.truncated[j] = text, False
        batch.sampler_logprobs[j] = [-1.0] * len(batch.completion_ids[j])  # one per token, as a sampler's
    batch.loss_mask[:G] = True
    rewards = torch.tensor([1.0, 0.0] * (G // 2) + [1.0] * G, dtype=torch.float64)
    batch.rewards = rewards
    batch.advantages = compute_advantages(rewards, G, run.algo.estimator, **run.algo.estimator_options)
    batch.informative = (batch.advantages.view(-1, G) != 0).any(dim=1)
    return batch


def _trainable(run) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in run.model.named_parameters() if p.requires_grad}


def _update_recording_gradients(run, batch, monkeypatch) -> tuple[dict, dict[str, torch.Tensor], dict]:
    """``update_policy`` as it is, with the gradients recorded when they reach the clipping,
    i.e. before the clip and before the optimizer step (Adam's first step is ≈ lr·sign(g)
    and a clip to max_grad_norm rescales any gradient, so a wrong scale would not show in
    the weights), and their magnitudes (tests/numerics.py, ``gradient_magnitudes``)."""
    grads: dict[str, torch.Tensor] = {}
    real_clip = run.accelerator.clip_grad_norm_

    def recording_clip(parameters, max_norm):
        grads.update({n: p.grad.detach().clone() for n, p in run.model.named_parameters() if p.grad is not None})
        return real_clip(parameters, max_norm)

    monkeypatch.setattr(run.accelerator, "clip_grad_norm_", recording_clip)
    with gradient_magnitudes(run.model) as magnitudes:
        stats = rl.update_policy(run, batch)
    return stats, grads, magnitudes


def skip_rule_bounds(run, batch, magnitudes: list[dict]) -> dict[str, float]:
    """Per parameter, how far the two passes' gradients may lie apart in fp32: the kept
    group's rows are the same and only the padding widths differ, so each pass is within
    γ_K·‖M‖_F of the exact gradient (tests/numerics.py), K chaining the forward and backward
    reductions over the longest sequence and the weight gradients' sum over every position
    the unskipped (larger) pass forwards."""
    longest_prompt, longest_completion = max(map(len, batch.prompt_ids)), max(map(len, batch.completion_ids))
    rows = len(batch.prompt_ids) * longest_prompt + len(batch.completion_ids) * longest_completion
    chain = gradient_chain_length(run.model, longest_prompt + longest_completion, rows)
    return gradient_bounds(magnitudes, magnitudes[0].keys(), chain)


def _whole_batch_counts_dropped(batch, groups, group_size):
    """A deliberately wrong skip rule: no whole-batch counts, so the aggregation divides by the
    rows actually forwarded, i.e. by the kept groups' sequences and tokens."""
    return {}


@pytest.mark.numerics
@pytest.mark.parametrize("denominator", ["whole_batch", "kept_groups_wrong"])
@pytest.mark.parametrize("preset", ["grpo", "dr_grpo", "dapo"])
def test_skip_rule_gives_the_gradient_of_the_whole_batch(preset, denominator, warm_model, toy_data, rl_config,
                                                         tmp_path, monkeypatch):
    """Skipping a uniform group before the pass leaves the gradient as it is over all groups.

    Tolerance: the two fp32 passes differ only in padding width, so each gradient tensor lies
    within γ_K·‖M‖_F of the exact one (γ_K ≈ K·2⁻²⁴, K ≈ 1e5 the chain of forward, backward
    and weight-gradient reductions, M = |∂y|ᵀ|x| from the actual tensors; tests/numerics.py),
    a bound that holds for any kernel or summation order, where a lost group or a factor 2
    moves the gradient by O(‖gradient‖).
    The ``kept_groups_wrong`` case is the test of the test: with the whole batch's counts
    dropped from the denominators, the comparison must fail, and the skipped pass's gradient
    must be the unskipped one times the expected factor, to the same bound.
    """
    runs, stats, grads, magnitudes = {}, {}, {}, {}
    for skip in (True, False):
        # fp32: the claim is exact arithmetic. In bf16 the two passes (one group or two) have
        # different shapes, for which oneDNN picks different kernels, so they agree only to bf16
        # rounding (measured: parameters 4e-6 apart after the step).
        cfg = rl_config(warm_model, toy_data, tmp_path / f"skip_{skip}", preset=preset, prompts_per_step=2,
                        group_size=4, skip_uninformative=skip, dynamic_sampling=False, precision="fp32")
        runs[skip] = rl.start_run(cfg)
        # dapo's preset turns on dynamic sampling, whose batch is by definition the
        # informative groups only; here both runs train on the same sampled batch.
        runs[skip].algo = dataclasses.replace(runs[skip].algo, dynamic_sampling=False)
    batch = _batch_with_one_uniform_group(runs[True])
    assert batch.informative.tolist() == [True, False]
    if denominator == "kept_groups_wrong":
        monkeypatch.setattr(rl.parts, "loss_normaliser", _whole_batch_counts_dropped)
    for skip, run in runs.items():
        before = _trainable(run)
        stats[skip], grads[skip], magnitudes[skip] = _update_recording_gradients(run, batch, monkeypatch)
        # the update happened: some trainable weight moved
        after = _trainable(run)
        assert any(not torch.equal(after[n], before[n]) for n in before), f"skip={skip}: no weight changed"
    # Group 0's rewards 1,0,1,0 make its advantages ±a: the on-policy loss is ≈ 0 (the
    # advantages sum to 0), but its gradient Σ_i A_i ∇log π(o_i) is not (the o_i differ).
    norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads[False].values()]))
    assert norm > 1e-3
    # the uniform group costs nothing with the skip rule, G×(prompt+completion) without it
    assert stats[True][K.SKIPPED] == 1 and stats[False][K.SKIPPED] == 0
    assert stats[True]["train/token_passes"] < stats[False]["train/token_passes"]
    assert stats[True][K.TOKEN_PASSES_SAVED] > stats[False][K.TOKEN_PASSES_SAVED]
    if denominator == "whole_batch":
        bounds = skip_rule_bounds(runs[False], batch, [magnitudes[True], magnitudes[False]])
        assert_gradients_within(grads[True], grads[False], bounds)
        # The logged norms differ by the gradients' distance (at most the bounds' root sum of
        # squares) plus each one's own fp32 evaluation: a chain of the largest tensor's n
        # squares, then one square per tensor, and three roundings (γ relative).
        chain = max(g.numel() for g in grads[False].values()) + len(grads[False]) + 3
        logged = stats[True][K.GRAD_NORM], stats[False][K.GRAD_NORM]
        allowed = math.hypot(*bounds.values()) + gamma(chain, torch.float32) * sum(logged)
        assert abs(logged[0] - logged[1]) <= allowed, (logged, allowed)
        return
    with pytest.raises(AssertionError, match="rounding bound"):
        assert_gradients_within(grads[True], grads[False],
                                skip_rule_bounds(runs[False], batch, [magnitudes[True], magnitudes[False]]))
    # The skipped pass divided by the kept group's counts, the unskipped one by both groups':
    # its gradient is larger by whole/kept — 8/4 = 2 sequences (grpo, dr_grpo), or the token
    # counts' ratio (dapo's token_mean) — tensor by tensor, to the bound of the exact
    # gradients E·g and g (the unskipped pass's magnitudes scaled by E, in float64).
    G = 4
    lengths = [len(c) for c in batch.completion_ids]
    mask = batch.loss_mask.tolist()
    tokens = [n if m else 0 for n, m in zip(lengths, mask)]
    expected = 2.0 if preset != "dapo" else sum(tokens) / sum(tokens[:G])
    scaled = {n: expected * g.double() for n, g in grads[False].items()}
    scaled_magnitudes = {n: expected * m for n, m in magnitudes[False].items()}
    assert_gradients_within(grads[True], scaled, skip_rule_bounds(runs[False], batch, [magnitudes[True], scaled_magnitudes]))


def test_run_files_follow_their_documented_schemas(warm_model, toy_data, rl_config, tmp_path):
    out = tmp_path / "run"
    rl.run_rl(rl_config(warm_model, toy_data, out, steps=2, prompts_per_step=2, group_size=4,
                        preset="corpo", threshold=0.5))
    parts = sorted((out / "rollouts").glob("step_*.parquet"))
    assert [p.name for p in parts] == ["step_000001.parquet", "step_000002.parquet"]
    for part in parts:
        assert pq.read_schema(part).remove_metadata() == ROLLOUT_SCHEMA
    table = read_rollouts(out)
    assert table.num_rows == 2 * 2 * 4
    assert set(table.column("sample_index").to_pylist()) == {0, 1, 2, 3}
    required = {K.STEP, K.REWARD_MEAN, K.LENGTH_MEAN, K.TRUNCATED_FRAC, K.THINK_CLOSED_FRAC, K.UNIFORM_FRAC,
                K.FAILED_POSITIVE_FRAC, K.REWARD_STD, K.ACCURACY, K.LENGTH_P50, K.LENGTH_P90, K.LENGTH_MAX,
                K.PARSE_FAIL_FRAC, K.CORPO_CORRECTNESS_REGIME, K.CORPO_PREFERENCE_REGIME, K.LOSS, K.GRAD_NORM,
                K.LEARNING_RATE, K.TOKENS_PER_S, K.STEP_SECONDS, K.PEAK_MEMORY_MB, K.SKIPPED,
                K.per_label(K.LABEL_SHARE_INFORMATIVE, "yes"), K.per_label(K.LABEL_SHARE_DATA, "no")}
    records = read_jsonl(out / "metrics.jsonl")
    assert [r[K.STEP] for r in records] == [1, 2]
    for record in records:
        assert required <= record.keys()
        assert all(isinstance(v, (int, float)) for v in record.values())
    # advantages logged are the ones CoRPO computes from the logged rewards
    rewards = torch.tensor(table.column("reward").to_pylist(), dtype=torch.float64)
    expected = compute_advantages(rewards[:8], 4, "corpo", threshold=0.5)
    assert table.column("advantage").to_pylist()[:8] == pytest.approx(expected.tolist())
    assert (out / "model").is_dir() and (out / "rl_summary.json").is_file()


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(group_size=1), "group_size=1: group-relative RL needs at least 2 completions per prompt; set --group-size 2 or more"),
        (dict(preset="corpo"), "preset corpo needs its correctness threshold: pass --threshold"),
        (dict(bogus=1), "Extra inputs are not permitted"),
    ],
)
def test_config_errors_name_the_value_the_rule_and_the_fix(options, message, tmp_path):
    with pytest.raises(ValidationError, match=message):
        RLConfig(data="sms-spam", out=tmp_path, **options)


def test_non_finite_loss_skips_the_update_and_stops_after_k_in_a_row(warm_model, toy_data, rl_config, tmp_path, monkeypatch):
    run = rl.start_run(rl_config(warm_model, toy_data, tmp_path / "nan", prompts_per_step=2, group_size=4, max_nonfinite=2))
    batch = _batch_with_one_uniform_group(run)
    real = rl.parts.policy_loss_for_groups

    def nan_loss(*args, **kwargs):
        loss, logprobs, stats = real(*args, **kwargs)
        return loss * float("nan"), logprobs, stats

    monkeypatch.setattr(rl.parts, "policy_loss_for_groups", nan_loss)
    before = {n: p.detach().clone() for n, p in run.model.named_parameters()}
    stats = rl.update_policy(run, batch)
    assert stats[K.NONFINITE_SKIPPED] == 1 and run.nonfinite_in_row == 1
    for name, param in run.model.named_parameters():
        assert torch.equal(param, before[name]), name
    with pytest.raises(ValueError, match="2 non-finite losses or gradients in a row .* lower --learning-rate"):
        rl.update_policy(run, batch)


def test_metrics_reach_tensorboard_with_the_same_names(warm_model, toy_data, rl_config, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "tb"
    rl.run_rl(rl_config(warm_model, toy_data, out, steps=2, prompts_per_step=2, group_size=4, report_to="tensorboard"))
    acc = EventAccumulator(str(out / "tracking" / "labelrl-rl"))
    acc.Reload()
    assert K.STEP not in acc.Tags()["scalars"]  # the step is the x axis, not a scalar
    records = read_jsonl(out / "metrics.jsonl")
    for key in (K.REWARD_MEAN, K.LENGTH_MEAN, K.UNIFORM_FRAC, K.FAILED_POSITIVE_FRAC):
        scalars = acc.Scalars(key)
        assert [s.step for s in scalars] == [1, 2]
        assert [s.value for s in scalars] == pytest.approx([r[key] for r in records], rel=1e-6)


def test_random_reward_control_draws_rewards_independently_of_the_answer(warm_model, toy_data, rl_config, tmp_path):
    out = tmp_path / "random"
    rl.run_rl(rl_config(warm_model, toy_data, out, steps=2, prompts_per_step=4, group_size=4, random_reward=True))
    table = read_rollouts(out).to_pylist()
    assert {row["reward"] for row in table} == {0.0, 1.0}
    graded = [1.0 if row["answer"] == row["label"] else 0.0 for row in table]
    assert [row["reward"] for row in table] != graded  # the grader's verdict is not the reward
