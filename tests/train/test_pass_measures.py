"""What the RL step measures beside its loss (``labelrl.train.pass_measures``), through the real
loop on the warm-started tiny model: the sampler's log-probs carried into the rollout log, the
entropy and the sampler–trainer mismatch in the step's metrics, and the rollout correction's
weights reaching the loss."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from labelrl import metrics_keys as K
from labelrl.rollout.log import read_rollouts
from labelrl.rollout.logprobs import completion_logprobs_shared
from labelrl.train import rl
from labelrl.train import rl_parts as parts
from labelrl.train.pass_measures import step_measures

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from numerics import logprob_bound  # noqa: E402

FP32 = dict(precision="fp32", steps=1, prompts_per_step=2, group_size=4, max_new_tokens=8, skip_uninformative=False,
            val_path=False)


def test_the_rollout_log_carries_the_sampler_logprobs_of_the_temperature_1_policy(warm_model, toy_data, rl_config,
                                                                                  tmp_path):
    # sampled at temperature 0.7 with top-k 5, the logged log-probs are still the raw policy's
    # (what the trainer computes): equal to the training pass's on the same weights, in fp32
    run = rl.start_run(rl_config(warm_model, toy_data, tmp_path / "run", temperature=0.7, top_k=5, **FP32))
    batch = rl.sample_groups_for_step(run)
    assert [len(r) for r in batch.sampler_logprobs] == [len(c) for c in batch.completion_ids]
    with torch.no_grad():
        trainer, mask = completion_logprobs_shared(run.policy, batch.prompt_ids, batch.completion_ids, 4,
                                                   pad_token_id=parts.pad_id(run.tokenizer))
    gaps = [abs(q - float(trainer[r, t])) for r, row in enumerate(batch.sampler_logprobs) for t, q in enumerate(row)]
    # two fp32 routes to one log-prob (tests/numerics.py); those of the tempered top-5 distribution
    # would differ by far more (the bound is checked to be below what temperature alone moves)
    longest = max(len(p) for p in batch.prompt_ids) + FP32["max_new_tokens"]
    bound = logprob_bound(run.policy, longest)
    assert max(gaps) <= bound, (max(gaps), bound)
    tempered = torch.log_softmax(trainer.new_tensor([0.0, 1.0, 2.0]) / 0.7, -1)[0] - torch.log_softmax(
        trainer.new_tensor([0.0, 1.0, 2.0]), -1)[0]
    assert bound < abs(float(tempered))

    record = rl.rl_step(run)
    table = read_rollouts(tmp_path / "run")
    logged = table.column("sampler_logprobs").to_pylist()
    assert [len(r) for r in logged] == table.column("completion_tokens").to_pylist()
    assert all(v <= 0 and math.isfinite(v) for row in logged for v in row)
    # the step measured the same sampler against the trainer: fp32 on both sides, the gap is rounding
    # k3 = e^d − 1 − d ≤ d²·e^|d| / 2 for a gap d within the bound
    assert 0 <= record[K.MISMATCH_KL] <= bound ** 2 * math.exp(bound) / 2 and record[K.MISMATCH_LOGP_DIFF_MAX] <= bound
    assert record[K.MISMATCH_LOGP_DIFF_MEAN] <= record[K.MISMATCH_LOGP_DIFF_MAX]
    vocab = run.policy.config.vocab_size
    assert 0 < record[K.ENTROPY_P10] <= record[K.ENTROPY_MEAN] <= math.log(vocab)
    assert K.MISMATCH_MASKED_FRAC not in record and K.MISMATCH_CLIPPED_FRAC not in record  # mode none


def _step_with_shifted_sampler(run, shift: float) -> dict:
    """One step whose sampler reports every token ``shift`` nats less likely than it was (so the
    trainer/sampler ratio is e^shift on every token): a sampler the trainer disagrees with."""
    real = run.sampler

    def shifted(*args, **kwargs):
        batch = real(*args, **kwargs)
        batch.logprobs = [[v - shift for v in row] for row in batch.logprobs]
        return batch

    run.sampler = shifted
    return rl.rl_step(run)


@pytest.fixture(scope="module")
def uncorrected(warm_model, toy_data, tmp_path_factory) -> dict:
    """The first step without correction; its gradient does not depend on the sampler's log-probs."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from conftest import make_rl_config

    run = rl.start_run(make_rl_config(warm_model, toy_data, tmp_path_factory.mktemp("plain") / "run", **FP32))
    record = _step_with_shifted_sampler(run, 2.0)
    assert record[K.GRAD_NORM] > 0
    assert record[K.MISMATCH_KL] == pytest.approx(math.exp(2) - 1 - 2, rel=1e-4)  # k3 = ρ − 1 − log ρ at log ρ = 2
    return record


@pytest.mark.parametrize("mode, shift, key, bounded, factor", [
    ("token_truncate", 2.0, K.MISMATCH_CLIPPED_FRAC, 1.0, 3.0),  # ρ = e² = 7.39 on every token, clipped to C = 3
    ("sequence_mask", 2.0, K.MISMATCH_MASKED_FRAC, 1.0, 0.0),  # ρ_seq = e^(2L) > 3: every sequence dropped
    ("token_truncate", 0.5, K.MISMATCH_CLIPPED_FRAC, 0.0, math.exp(0.5)),  # ρ = 1.65 < 3: the ratio itself
])
def test_the_correction_reaches_the_gradient_and_is_counted(mode, shift, key, bounded, factor, uncorrected, warm_model,
                                                            toy_data, rl_config, tmp_path):
    # the same first step (same seeds) with every token's ratio at e^shift: the correction's weight
    # is the same on every token, so it scales the gradient by it (pre-clipping norm; the on-policy
    # loss value is ~0, so the gradient is what shows the weights)
    run = rl.start_run(rl_config(warm_model, toy_data, tmp_path / "run", rollout_correction=mode, **FP32))
    record = _step_with_shifted_sampler(run, shift)
    assert record[key] == bounded
    assert record[K.GRAD_NORM] == pytest.approx(factor * uncorrected[K.GRAD_NORM], rel=1e-4, abs=1e-12)


class OneProcess:
    num_processes = 1


def test_step_measures_from_raw_measures():
    # entropies 0.1 … 1.0: mean 0.55, 10th percentile 0.19 (numpy's linear interpolation);
    # mismatch sums over 4 tokens; 1 of 4 sequences masked
    raw = {"entropy": np.linspace(0.1, 1.0, 10, dtype=np.float32),
           "mismatch": {"kl_sum": 0.02, "abs_diff_sum": 0.4, "abs_diff_max": 0.3, "tokens": 4},
           "bounded": (1, 4, K.MISMATCH_MASKED_FRAC)}
    out = step_measures(OneProcess(), raw, 1.0)
    assert out == pytest.approx({K.ENTROPY_MEAN: 0.55, K.ENTROPY_P10: 0.19, K.MISMATCH_KL: 0.005,
                                 K.MISMATCH_LOGP_DIFF_MEAN: 0.1, K.MISMATCH_LOGP_DIFF_MAX: 0.3,
                                 K.MISMATCH_MASKED_FRAC: 0.25})
    # a process that ran a group with weight 0 (its share was empty) measures nothing
    assert step_measures(OneProcess(), raw, 0.0) == {K.MISMATCH_MASKED_FRAC: 0.0}
