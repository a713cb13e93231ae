"""The sampler–trainer mismatch and its correction (``labelrl.losses.rollout_correction``).

Parity: a real TRL 1.16 GRPOTrainer (tests/losses/test_trl_parity.py's tiny Llama) is told it
samples with vLLM, its rollouts carry crafted sampler log-probs, and its per-token log-prob
helper returns crafted trainer log-probs; TRL's own ``_generate_and_score_completions`` then
computes its ``importance_sampling_ratio`` and ``_compute_loss`` applies it. labelrl's weights
and loss must equal both, for every mode.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_trl_parity import LENGTHS, MAX_COMPLETION, REWARDS, _trainer, _trl_advantages  # noqa: E402

from labelrl.losses import policy_loss  # noqa: E402
from labelrl.losses.rollout_correction import (  # noqa: E402
    ROLLOUT_CORRECTIONS,
    correction_weights,
    mismatch_stats,
)

MODES = ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]
CLIP_MAX = 3.0


def _crafted_mismatch():
    """Trainer log-probs [8, 5] and the sampler's, below or above them by −0.6 … 1.6 nats (ln 3 =
    1.0986: some token ratios exceed 3, and sequence sums land on both sides of ln 3)."""
    gen = torch.Generator().manual_seed(7)
    trainer = -torch.rand(len(LENGTHS), MAX_COMPLETION, generator=gen) * 3
    sampler = trainer - (torch.rand(len(LENGTHS), MAX_COMPLETION, generator=gen) * 2.2 - 0.6)
    mask = torch.arange(MAX_COMPLETION)[None] < torch.tensor(LENGTHS)[:, None]
    return trainer, sampler, mask


def _trl_with_sampler_logprobs(tmp_path, monkeypatch, mode, trainer_logps, sampler_logps):
    trainer = _trainer(tmp_path, loss_type="dapo", epsilon=0.2, epsilon_high=0.28, beta=0.0,
                       vllm_importance_sampling_mode=mode, vllm_importance_sampling_clip_max=CLIP_MAX)
    # TRL applies its correction only when it samples with vLLM; the rollouts come from
    # rollout_func, so no engine is involved (no weight sync: the loaded step is the current one).
    trainer.use_vllm, trainer._last_loaded_step = True, trainer.state.global_step

    def rollout(prompts, _trainer):
        return {"prompt_ids": [[5, 6] for _ in prompts],
                "completion_ids": [[3 + j for j in range(n)] for n in LENGTHS[: len(prompts)]],
                "logprobs": [sampler_logps[i, :n].tolist() for i, n in enumerate(LENGTHS[: len(prompts)])]}

    trainer.rollout_func = rollout
    monkeypatch.setattr(trainer, "_get_per_token_logps_and_entropies",
                        lambda *a, **k: (trainer_logps, torch.zeros_like(trainer_logps), None))
    return trainer, _trl_advantages(trainer, REWARDS)


@pytest.mark.parametrize("mode", MODES)
def test_each_mode_matches_trl_weights_and_loss(tmp_path, monkeypatch, mode):
    old, sampler, mask = _crafted_mismatch()
    trainer, inputs = _trl_with_sampler_logprobs(tmp_path, monkeypatch, mode, old, sampler)
    assert inputs["completion_mask"].bool().equal(mask)  # TRL padded our completions as expected
    trl_ratio = inputs["importance_sampling_ratio"]  # [8, 5] token modes, [8, 1] sequence modes

    weights, bounded = correction_weights(mode, old, sampler, mask, CLIP_MAX)
    torch.testing.assert_close(weights[mask], trl_ratio.expand_as(weights)[mask], atol=1e-6, rtol=1e-6)
    # both kinds of unit are present, so a mode that bounded everything or nothing would fail
    assert 0 < int(bounded.sum()) < bounded.numel()
    assert bounded.numel() == (int(mask.sum()) if mode.startswith("token") else len(LENGTHS))

    # the loss: TRL multiplies each token's clipped-surrogate loss by its ratio
    logps = (old + (torch.rand(old.shape, generator=torch.Generator().manual_seed(3)) - 0.5) * 0.8).requires_grad_(True)
    monkeypatch.setattr(trainer, "_get_per_token_logps_and_entropies",
                        lambda *a, **k: (logps, torch.zeros_like(logps), None))
    trl_loss = trainer._compute_loss(trainer.model, inputs)
    (trl_grad,) = torch.autograd.grad(trl_loss, logps)
    ours, _ = policy_loss(logps, old, inputs["advantages"], mask, surrogate="clip", aggregation="token_mean",
                          eps_low=0.2, eps_high=0.28, token_weights=weights)
    (our_grad,) = torch.autograd.grad(ours, logps)
    torch.testing.assert_close(ours, trl_loss, atol=1e-6, rtol=0)
    torch.testing.assert_close(our_grad, trl_grad, atol=1e-6, rtol=0)
    plain, _ = policy_loss(logps, old, inputs["advantages"], mask, surrogate="clip", aggregation="token_mean",
                           eps_low=0.2, eps_high=0.28)
    assert abs(float(plain.detach()) - float(ours.detach())) > 1e-3  # the weights really changed the loss


def test_reference_values_of_each_mode():
    # one sequence of 3 tokens, log π − log q = [ln 4, ln 2, −ln 2] → token ratios 4, 2, 0.5;
    # sequence ratio 4·2·0.5 = 4; a second, padded sequence [ln 2, pad] → ratio 2 (its pad: 1)
    trainer = torch.tensor([[math.log(4.0), math.log(2.0), -math.log(2.0)], [math.log(2.0), 0.0, 0.0]])
    sampler = torch.zeros(2, 3)
    mask = torch.tensor([[True, True, True], [True, False, False]])
    expect = {
        "token_truncate": ([[3.0, 2.0, 0.5], [2.0, 1.0, 1.0]], [True, False, False, False]),  # 4 → C = 3
        "token_mask": ([[0.0, 2.0, 0.5], [2.0, 1.0, 1.0]], [True, False, False, False]),  # 4 > 3 → dropped
        "sequence_truncate": ([[3.0] * 3, [2.0] * 3], [True, False]),  # 4 → 3; 2 stays
        "sequence_mask": ([[0.0] * 3, [2.0] * 3], [True, False]),  # the first sequence dropped
        "none": ([[1.0] * 3, [1.0] * 3], []),
    }
    assert sorted(expect) == ROLLOUT_CORRECTIONS.names()
    for mode, (weights, bounded) in expect.items():
        got, over = correction_weights(mode, trainer, sampler, mask, 3.0)
        torch.testing.assert_close(got, torch.tensor(weights), atol=1e-6, rtol=0, msg=mode)
        assert over.tolist() == bounded, mode


def test_the_bound_must_exceed_one():
    trainer, sampler, mask = _crafted_mismatch()
    with pytest.raises(ValueError, match="rollout_correction_max=1.0: the bound on π/q must exceed 1"):
        correction_weights("token_mask", trainer, sampler, mask, 1.0)
    with pytest.raises(ValueError, match="unknown rollout correction 'token'"):
        correction_weights("token", trainer, sampler, mask, 3.0)


def test_the_mismatch_is_exactly_zero_when_sampler_and_trainer_agree_and_grows_with_a_perturbation():
    trainer, _, mask = _crafted_mismatch()
    same = mismatch_stats(trainer, trainer.clone(), mask)
    assert same == {"kl_sum": 0.0, "abs_diff_sum": 0.0, "abs_diff_max": 0.0, "tokens": int(mask.sum())}
    noise = torch.randn(trainer.shape, generator=torch.Generator().manual_seed(0))
    kls, means = [], []
    for scale in (1e-3, 1e-2, 1e-1, 1.0):
        stats = mismatch_stats(trainer, trainer + scale * noise, mask)
        kls.append(stats["kl_sum"] / stats["tokens"])
        means.append(stats["abs_diff_sum"] / stats["tokens"])
    assert all(a < b for a, b in zip(kls, kls[1:])) and kls[0] > 0
    assert all(a < b for a, b in zip(means, means[1:]))
    # k3 ≈ ½ (Δ log p)² for small gaps: its mean tracks ½ · mean(Δ²) at scale 1e-2
    small = mismatch_stats(trainer, trainer + 1e-2 * noise, mask)
    half_square = float((0.5 * (1e-2 * noise) ** 2)[mask].mean())
    assert small["kl_sum"] / small["tokens"] == pytest.approx(half_square, rel=0.05)


def test_the_mismatch_reads_only_real_tokens_and_the_kl_is_of_the_sampler_against_the_trainer():
    # one real token with log π − log q = ln 2: ρ = 2, k3 = 2 − 1 − ln 2 = 0.306853 (KL(q ‖ π)
    # sampled from q); the reverse direction would give 1/2 − 1 + ln 2 = 0.193147.
    trainer = torch.tensor([[math.log(2.0), 50.0]])  # a huge gap on a pad position must not count
    sampler = torch.zeros(1, 2)
    stats = mismatch_stats(trainer, sampler, torch.tensor([[True, False]]))
    assert stats["kl_sum"] == pytest.approx(1.0 - math.log(2.0), abs=1e-6)
    assert stats["abs_diff_max"] == pytest.approx(math.log(2.0), abs=1e-6) and stats["tokens"] == 1
