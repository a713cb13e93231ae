"""Parity with TRL 1.16's GRPOTrainer: same rewards → same advantages, same inputs → same loss.

A real GRPOTrainer is built on a tiny randomly initialised Llama (1 layer, hidden 16) and a
word-level tokenizer; rollouts come from a fixed ``rollout_func`` and rewards from a dataset
column, so TRL's own ``_generate_and_score_completions`` computes the advantages. For the
loss, TRL's per-token log-prob helper is replaced by crafted tensors and ``_compute_loss``
is called directly; no model forward is involved.
"""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is marked experimental
# TRL is a declared dependency (the dev extra): a missing TRL fails these tests, it does not skip them.
import transformers  # noqa: E402
import trl  # noqa: E402

from labelrl.advantages import compute_advantages  # noqa: E402
from labelrl.losses import policy_loss  # noqa: E402

G = 4
MAX_COMPLETION = 5
# Completion lengths 2, 5, 3, 1 | 4, 5, 2, 3 (B = 2 prompts × G = 4).
LENGTHS = [2, 5, 3, 1, 4, 5, 2, 3]
TRL_EPS = 1e-4  # TRL 1.16 adds 1e-4 to the std; labelrl defaults to 1e-6 (verl)


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<pad>", "<eos>", "<unk>"] + [f"w{i}" for i in range(29)]
    vocab = {w: i for i, w in enumerate(words)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )


def _model(tokenizer):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    return transformers.LlamaForCausalLM(config)


def _rollout(prompts, trainer):
    """Fixed completions (token ids 3…, no EOS) of the LENGTHS above; prompts are 2 tokens."""
    completions = [[3 + j for j in range(n)] for n in LENGTHS[: len(prompts)]]
    return {
        "prompt_ids": [[5, 6] for _ in prompts],
        "completion_ids": completions,
        "logprobs": [[-1.0] * n for n in LENGTHS[: len(prompts)]],
    }


def reward_from_column(prompts, completions, reward, **kwargs):
    return list(reward)


def _trainer(tmp_path, **config):
    from datasets import Dataset

    tokenizer = _tokenizer()
    args = trl.GRPOConfig(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=2 * G, num_generations=G,
        max_completion_length=MAX_COMPLETION, use_cpu=True, bf16=False, report_to=[],
        logging_steps=1, save_strategy="no", **config,
    )
    dataset = Dataset.from_dict({"prompt": ["w1 w2"] * 4, "reward": [0.0] * 4})
    # Saved to disk and passed by path: with beta > 0 TRL loads its reference copy from there.
    model_dir = tmp_path / "tiny-llama"
    _model(tokenizer).save_pretrained(model_dir)
    trainer = trl.GRPOTrainer(
        model=str(model_dir), reward_funcs=[reward_from_column], args=args,
        train_dataset=dataset, processing_class=tokenizer, rollout_func=_rollout,
    )
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    return trainer


def _trl_advantages(trainer, rewards):
    inputs = [{"prompt": "w1 w2", "reward": float(r)} for r in rewards]
    return trainer._generate_and_score_completions(inputs)


REWARDS = [0.2, 0.4, 0.4, 1.0, 0.0, 0.0, 0.0, 0.0]  # one informative group, one uniform


@pytest.mark.parametrize(
    "scale_rewards, estimator, options",
    [
        ("group", "grpo", {"eps": TRL_EPS}),  # both: sample std (ddof 1) of the group
        ("batch", "grpo", {"eps": TRL_EPS, "batch_std": True}),  # group mean, batch std
        ("none", "dr_grpo", {}),  # r − group mean
    ],
)
def test_advantages_match_trl(tmp_path, scale_rewards, estimator, options):
    trainer = _trainer(tmp_path, scale_rewards=scale_rewards)
    trl_adv = _trl_advantages(trainer, REWARDS)["advantages"]
    ours = compute_advantages(torch.tensor(REWARDS), G, estimator, **options)
    torch.testing.assert_close(ours, trl_adv, atol=1e-6, rtol=0)
    assert ours[:4].abs().sum() > 0.9  # the informative group really moved (Dr. GRPO: |A| sums to 1.0)


def _crafted(n_seq: int, width: int):
    gen = torch.Generator().manual_seed(1)
    logps = (-torch.rand(n_seq, width, generator=gen) * 3).requires_grad_(True)
    # Old log-probs differ by up to ±0.6 in log space so both clip sides are exercised.
    old = logps.detach() + (torch.rand(n_seq, width, generator=gen) - 0.5) * 1.2
    ref = logps.detach() + (torch.rand(n_seq, width, generator=gen) - 0.5) * 0.8
    return logps, old, ref


def _trl_loss_on_crafted(trainer, monkeypatch, beta: float):
    """TRL's advantages of ``REWARDS``, crafted current/old/reference log-probs in its layout, and
    TRL's own ``_compute_loss`` on them with its gradient: (inputs, logps, old, ref, loss, grad)."""
    inputs = _trl_advantages(trainer, REWARDS)
    logps, old, ref = _crafted(*inputs["completion_mask"].shape)
    inputs["old_per_token_logps"] = old
    if beta:
        inputs["ref_per_token_logps"] = ref
    monkeypatch.setattr(
        trainer, "_get_per_token_logps_and_entropies",
        lambda *a, **k: (logps, torch.zeros_like(logps), None),
    )
    trl_loss = trainer._compute_loss(trainer.model, inputs)
    (trl_grad,) = torch.autograd.grad(trl_loss, logps)
    return inputs, logps, old, ref, trl_loss, trl_grad


@pytest.mark.parametrize(
    "loss_type, aggregation, eps_high, beta, kl_ratio_correction",
    [
        ("grpo", "seq_mean_token_mean", 0.2, 0.0, False),
        ("dr_grpo", "seq_mean_token_sum_norm", 0.2, 0.0, False),
        ("dapo", "token_mean", 0.28, 0.0, False),
        ("bnpo", "token_mean", 0.2, 0.0, False),
        ("grpo", "seq_mean_token_mean", 0.2, 0.04, False),  # plain k3 per token (DeepSeekMath)
        ("dapo", "token_mean", 0.28, 0.04, True),  # k3 × ratio, TRL's default
    ],
)
def test_loss_matches_trl(tmp_path, monkeypatch, loss_type, aggregation, eps_high, beta, kl_ratio_correction):
    trainer = _trainer(
        tmp_path, loss_type=loss_type, epsilon=0.2, epsilon_high=eps_high, beta=beta,
        use_bias_correction_kl=kl_ratio_correction,
    )
    inputs, logps, old, ref, trl_loss, trl_grad = _trl_loss_on_crafted(trainer, monkeypatch, beta)
    mask = inputs["completion_mask"]
    assert mask.sum(dim=1).tolist() == LENGTHS  # TRL padded our completions as expected

    ours, stats = policy_loss(
        logps, old, inputs["advantages"], mask.bool(), surrogate="clip", aggregation=aggregation,
        ref_logprobs=ref if beta else None, beta=beta, max_len=MAX_COMPLETION,
        kl_ratio_correction=kl_ratio_correction, eps_low=0.2, eps_high=eps_high,
    )
    (our_grad,) = torch.autograd.grad(ours, logps)
    torch.testing.assert_close(ours, trl_loss, atol=1e-6, rtol=0)
    torch.testing.assert_close(our_grad, trl_grad, atol=1e-6, rtol=0)
    assert stats["clip_low_frac"] + stats["clip_high_frac"] > 0  # clipping really happened


@pytest.mark.parametrize(
    "loss_type, aggregation, eps_low, eps_high, beta",
    [
        ("grpo", "seq_mean_token_mean", 3e-4, 4e-4, 0.0),  # GSPO's setup (TRL's paper index: loss_type grpo)
        # Wider ranges: sequence 0's ratio (0.846, A < 0) is clipped below 0.9; sequence 2 (1.196) is not.
        ("grpo", "seq_mean_token_mean", 0.1, 0.1, 0.04),  # plain k3 added per token
        ("dapo", "token_mean", 0.1, 0.15, 0.0),
        ("dr_grpo", "seq_mean_token_sum_norm", 0.1, 0.1, 0.0),
    ],
)
def test_gspo_loss_matches_trl_sequence_level(tmp_path, monkeypatch, loss_type, aggregation, eps_low, eps_high, beta):
    trainer = _trainer(
        tmp_path, loss_type=loss_type, importance_sampling_level="sequence", epsilon=eps_low,
        epsilon_high=eps_high, beta=beta, use_bias_correction_kl=False,
    )
    inputs, logps, old, ref, trl_loss, trl_grad = _trl_loss_on_crafted(trainer, monkeypatch, beta)
    mask = inputs["completion_mask"]

    common = dict(ref_logprobs=ref if beta else None, beta=beta, max_len=MAX_COMPLETION, eps_low=eps_low, eps_high=eps_high)
    ours, stats = policy_loss(logps, old, inputs["advantages"], mask.bool(), surrogate="gspo", aggregation=aggregation, **common)
    (our_grad,) = torch.autograd.grad(ours, logps)
    torch.testing.assert_close(ours, trl_loss, atol=1e-6, rtol=0)
    torch.testing.assert_close(our_grad, trl_grad, atol=1e-6, rtol=0)
    # The crafted token ratios vary within each sequence, so the token-level loss is another number:
    # the parity above is GSPO's, not clip's under another name.
    token_level, _ = policy_loss(logps, old, inputs["advantages"], mask.bool(), surrogate="clip", aggregation=aggregation, **common)
    assert abs(token_level.item() - ours.item()) > 1e-3
    assert stats["clip_low_frac"] + stats["clip_high_frac"] > 0  # some sequences were clipped


SCALE_REWARDS = [0.2, 0.4, 0.4, 1.0, 0.0, 1.0, 1.0, 1.0]  # two informative groups with different stds


@pytest.mark.parametrize(
    "preset, scale, scale_rewards",
    [
        ("grpo", None, "group"),  # unset: each preset keeps its own (GRPO divides by the group std)
        ("dr_grpo", None, "none"),  # (Dr. GRPO by nothing)
        ("grpo", "batch", "batch"),
        ("grpo", "none", "none"),
        ("dr_grpo", "group", "group"),
        ("dr_grpo", "batch", "batch"),
    ],
)
def test_scale_through_the_rl_config_matches_trl_scale_rewards(tmp_path, preset, scale, scale_rewards):
    from labelrl.train.config import RLConfig
    from labelrl.train.rl_parts import resolve_algorithm
    from labelrl.types import LabelSpace

    cfg = RLConfig(data="sms-spam", out=tmp_path / "run", preset=preset, scale=scale)
    assert cfg.scale == scale_rewards  # the saved config names the scale in force
    algo = resolve_algorithm(cfg, LabelSpace(("ham", "spam"), kind="binary"))  # as the RL loop resolves it
    ours = compute_advantages(torch.tensor(SCALE_REWARDS), G, algo.estimator, **algo.estimator_options, eps=TRL_EPS)
    trl_adv = _trl_advantages(_trainer(tmp_path, scale_rewards=scale_rewards), SCALE_REWARDS)["advantages"]
    torch.testing.assert_close(ours, trl_adv, atol=1e-6, rtol=0)
    # the three scales give three different answers here, so the match pins the one chosen
    others = {s: compute_advantages(torch.tensor(SCALE_REWARDS), G, "grpo", eps=TRL_EPS,
                                    scale_by_std=s == "group", batch_std=s == "batch")
              for s in ("group", "batch", "none") if s != scale_rewards}
    assert all((other - ours).abs().max() > 0.05 for other in others.values())
