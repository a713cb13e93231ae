"""The RL pass's saved bytes: measured at 2 and 3 prompts of the run's shape, the line predicts
a larger step's exactly, and the plan prices that pass instead of a plain pass over B·(P + G·T)
tokens, reading the process's memory before its probes run."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from labelrl.train import memory as M
from labelrl.train import memory_rl as R


def tiny_llama():
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=1000, max_position_embeddings=1024)
    return LlamaForCausalLM(config)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("share_prefix", [True, False])
def test_the_line_through_two_and_three_prompts_gives_a_larger_steps_bytes(dtype, share_prefix):
    model = tiny_llama()
    shape = R.PassShape(prompts=9, group_size=4, shared=40 if share_prefix else 0, remainder=60, new_tokens=20,
                        share_prefix=share_prefix)
    measured = R.saved_by_pass(model, shape, dtype)
    # Each prompt brings the same tensors. Whole prompts: the same bytes per prompt, to the byte.
    # With a shared prefix the bytes per extra prompt vary by up to 2.5% from one B to the next
    # (measured on this model: 3.63–3.72 MB in bf16, 4.06–4.15 MB in fp32), hence 3%.
    assert R.rl_pass_saved_bytes(model, shape, dtype) == pytest.approx(measured, rel=0.03 if share_prefix else 1e-9)


def test_the_shared_prefix_saves_less_than_every_prompt_whole():
    # the prefix runs once and its keys are cached once per prompt, not recomputed per prompt:
    # what the plan would miss if it priced B·(P + G·T) plain positions
    model = tiny_llama()
    shared = R.PassShape(prompts=4, group_size=2, shared=64, remainder=8, new_tokens=6)
    whole = R.PassShape(prompts=4, group_size=2, shared=64, remainder=8, new_tokens=6, share_prefix=False)
    assert R.saved_by_pass(model, shared, torch.float32) < R.saved_by_pass(model, whole, torch.float32)


def test_few_prompts_are_measured_whole(monkeypatch):
    measured = []
    monkeypatch.setattr(R, "saved_by_pass", lambda model, shape, dtype: measured.append(shape.prompts) or 100)
    for prompts in (1, 2):
        assert R.rl_pass_saved_bytes(None, R.PassShape(prompts, 2, 0, 10, 4), torch.float32) == 100
    assert measured == [1, 2]


def test_the_plan_prices_the_measured_pass_and_reads_memory_before_probing(monkeypatch):
    model = tiny_llama()
    read = []
    monkeypatch.setattr(M, "current_bytes", lambda device: read.append("memory") or 10 * M.GIB)

    def measured(device) -> float:
        read.append("probe")
        return 1.5 * M.GIB

    plan = M.plan_memory(model, torch.float32, tokens=100, logit_positions=0, requested=None, budget_gib=100.0,
                         pass_growth_bytes=measured)
    assert read == ["memory", "probe"]
    trainable = sum(p.numel() for p in model.parameters()) * M.OPTIMIZER_BYTES_PER_TRAINABLE
    # 10 GiB held + the optimizer state + the 1.5 GiB the pass adds
    assert plan.predicted_peak_mb * 2**20 == pytest.approx(10 * M.GIB + trainable + 1.5 * M.GIB)
    assert plan.held_mb * 2**20 == pytest.approx(10 * M.GIB + trainable)


def test_the_cpu_growth_adds_to_the_saved_bytes_and_another_device_counts_them(monkeypatch):
    # the factor's value is checked against real peaks by tests/train/test_memory_prediction_slow.py
    model = tiny_llama()
    monkeypatch.setattr(R, "rl_pass_saved_bytes", lambda model, shape, dtype: 1000.0)
    shape = R.PassShape(4, 2, 0, 10, 4)
    assert R.rl_pass_growth_bytes(model, shape, torch.float32, torch.device("cpu")) > 1000.0
    assert R.rl_pass_growth_bytes(model, shape, torch.float32, torch.device("meta")) == 1000.0  # not a CPU heap


def test_a_pass_that_holds_no_logits_is_priced_without_their_copies(monkeypatch):
    # the lean pass reads the vocabulary in slices (labelrl.rollout.token_logprobs): its measured
    # bytes hold no logits, and no gradient or softmax workspace of them is added either
    model = tiny_llama()
    monkeypatch.setattr(M, "current_bytes", lambda device: 10 * M.GIB)
    options = dict(tokens=100, logit_positions=50, requested=None, budget_gib=100.0,
                   pass_growth_bytes=lambda device: 1.5 * M.GIB)
    holds = M.plan_memory(model, torch.float32, **options)
    sliced = M.plan_memory(model, torch.float32, **options, pass_holds_logits=False)
    logit_bytes = 50 * model.config.vocab_size * 4
    assert (holds.predicted_peak_mb - sliced.predicted_peak_mb) * 2**20 == pytest.approx((M.LOGIT_COPIES - 1) * logit_bytes)
    # checkpointing runs the module pass, which holds them
    assert holds.predicted_peak_checkpointed_mb == sliced.predicted_peak_checkpointed_mb


def rl_plan_inputs(adapted: bool, prompts_per_step: int):
    """tiny-llama, with LoRA on every projection when ``adapted`` (the lean pass runs in one
    process), and the few fields of an RL config ``plan_rl_memory`` reads."""
    from types import SimpleNamespace

    from peft import LoraConfig, get_peft_model

    model = tiny_llama()
    if adapted:
        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear")).train()
    cfg = SimpleNamespace(prompts_per_step=prompts_per_step, group_size=2, max_new_tokens=4, backend="labelrl",
                          gradient_checkpointing=None, memory_budget=None)
    return model, cfg


@pytest.mark.parametrize("adapted, single, holds", [(True, True, False), (True, False, True), (False, True, True)])
def test_the_rl_plan_prices_logits_only_where_the_module_pass_runs(adapted, single, holds, monkeypatch):
    from labelrl.train import rl_parts

    model, cfg = rl_plan_inputs(adapted, prompts_per_step=2)
    seen = {}
    monkeypatch.setattr(rl_parts, "plan_memory", lambda *args, **options: seen.update(options))
    rl_parts.plan_rl_memory(cfg, model, torch.float32, [[1] * 20 + [2, 3], [1] * 20 + [4]], slice(None), single=single)
    assert seen["pass_holds_logits"] is holds


@pytest.mark.parametrize("adapted", [True, False])
def test_the_lean_plan_probes_the_longest_prompts_not_copies_of_the_longest(adapted, monkeypatch):
    # the lean pass leaves a prompt's padding out: its worst batch is the longest prompts; the
    # module pass computes the padding, so each prompt costs what the longest does
    from labelrl.train import rl_parts

    model, cfg = rl_plan_inputs(adapted, prompts_per_step=4)
    shapes = []
    monkeypatch.setattr(rl_parts, "rl_pass_growth_bytes", lambda model, shape, dtype, device: shapes.append(shape) or 0.0)
    prompts = [[1] * 20 + [2 + k] * k for k in (30, 5, 10, 7)]  # 20 shared, then 30, 5, 10 and 7 tokens
    rl_parts.plan_rl_memory(cfg, model, torch.float32, prompts, slice(None))
    (shape,) = shapes
    assert (shape.shared, shape.remainder) == (20, 30)
    expected = (30, 10, 7, 30) if adapted else (30, 30, 30, 30)  # a prompt past the probed ones: the longest's
    assert tuple(shape.remainder_of(b) for b in range(4)) == expected
    probe_prompts, _ = R._probe_inputs(R.replace(shape, prompts=3), 1000)
    assert [len(p) - 20 for p in probe_prompts] == list(expected[:3])
