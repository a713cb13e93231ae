"""Named steps of the RL loop that can be pinned without a model."""

from __future__ import annotations

import pytest
import torch

from labelrl.train import rl_parts as parts


def _batch(informative: list[bool], offset: int) -> parts.StepBatch:
    B, G = len(informative), 2
    return parts.StepBatch(
        example_index=list(range(offset, offset + B)), group_labels=["yes"] * B, prompt_ids=[[1, 2]] * B,
        completion_ids=[[3]] * (B * G), texts=["x"] * (B * G), truncated=[False] * (B * G), graded=[None] * (B * G),
        rewards=torch.zeros(B * G, dtype=torch.float64), loss_mask=torch.ones(B * G, dtype=torch.bool),
        advantages=torch.zeros(B * G, dtype=torch.float64), informative=torch.tensor(informative),
        uniform=~torch.tensor(informative), new_tokens=B * G, sample_seconds=1.0,
    )


def test_dynamic_sampling_keeps_the_first_b_informative_groups_across_rounds():
    # round 1: one informative group of 2; round 2: two more; B = 2 → the second round's
    # last informative group is sampled and logged but not trained on.
    joined = parts.concat_batches([_batch([True, False], 0), _batch([True, True], 2)], limit_informative=2)
    assert joined.informative.tolist() == [True, False, True, False]
    assert joined.example_index == [0, 1, 2, 3] and len(joined.completion_ids) == 8
    assert joined.new_tokens == 8 and joined.sample_seconds == 2.0


def test_loss_normaliser_counts_unmasked_tokens_of_the_chosen_groups():
    batch = _batch([True, False, True], 0)
    batch.completion_ids = [[1, 2, 3], [4], [5, 6], [7], [8, 9], [1]]
    batch.loss_mask = torch.tensor([True, True, True, True, False, True])
    assert parts.loss_normaliser(batch, None, 2) == {"n_sequences": 6, "n_tokens": 3 + 1 + 2 + 1 + 1}
    assert parts.loss_normaliser(batch, [0, 2], 2) == {"n_sequences": 4, "n_tokens": 3 + 1 + 1}


def test_step_seed_is_a_fixed_formula_of_seed_step_and_round():
    # Pinned by hand, so a resumed run (another process, another day) draws the same seed:
    # (seed·1 000 003 + step·1 009 + round) mod (2³¹ − 1)
    assert parts.step_seed(0, 5, 1) == 5 * 1_009 + 1 == 5046
    assert parts.step_seed(3, 2, 0) == 3 * 1_000_003 + 2 * 1_009 == 3_002_027
    # 5000·1 000 003 = 5 000 015 000 = 2·2 147 483 647 + 705 047 706: the modulus wraps it
    assert parts.step_seed(5000, 0, 0) == 705_047_706
    assert len({parts.step_seed(s, t, r) for s in range(3) for t in range(50) for r in range(3)}) == 450


def test_the_rl_memory_plan_counts_the_packed_base_labelrl_sampling_keeps(monkeypatch):
    # Measured on SmolLM2 + LoRA: a plan without the sampler's kept pack predicted 5.3 GB for a
    # 5.7 GB peak. The pack is counted for labelrl's sampler with a frozen base, only.
    from types import SimpleNamespace

    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from labelrl.rollout.fused import clear_fused_cache, kept_bytes
    from labelrl.train import memory as M

    monkeypatch.setattr(M, "current_bytes", lambda device: 10 * 2**20)  # the process's own size drifts
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=512)
    full = LlamaForCausalLM(config)
    lora = get_peft_model(LlamaForCausalLM(config), LoraConfig(r=4, target_modules="all-linear"))
    clear_fused_cache()

    def peak_mb(model, backend):
        cfg = SimpleNamespace(prompts_per_step=2, group_size=4, max_new_tokens=8, backend=backend,
                              gradient_checkpointing=None, memory_budget=1e4)
        return parts.plan_rl_memory(cfg, model, torch.float32, [[1, 2, 3]], slice(None)).predicted_peak_mb

    held_mb = kept_bytes(lora, torch.float32) / 2**20
    assert held_mb > 0
    assert peak_mb(lora, "labelrl") - peak_mb(lora, "hf") == pytest.approx(held_mb, abs=0.05)
    assert peak_mb(full, "labelrl") == pytest.approx(peak_mb(full, "hf"), abs=0.05)
