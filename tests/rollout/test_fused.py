"""The packed weights of the fast decode path: kept across calls while valid, rebuilt when the
weights change (optimizer step, in-place load, peft merge), a trained LoRA adapter applied as a
low-rank update equal to its merged weights, and the bf16 step close to bf16 autocast."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from labelrl.models.precision import compute
from labelrl.rollout import sample_groups
from labelrl.rollout.fast_decode import FastLlamaDecoder, clear_fused_cache, fuse_llama
from labelrl.rollout.fused import _CACHE, base_model, kept_bytes
from labelrl.rollout.projection import _mkldnn_linear_available
from labelrl.rollout.sampler import HFStepper, _prefill

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from numerics import assert_values_within, logprob_bound  # noqa: E402

PROMPTS = [[1, 5, 6, 7, 8, 9, 10], [1, 20, 21], [1, 30, 31, 32, 33]]


def tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=512, max_position_embeddings=256, initializer_range=0.2)
    return LlamaForCausalLM(config).eval()


def lora_model(seed: int = 0):
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)
    base = tiny_llama(seed)
    torch.manual_seed(seed + 1)
    return get_peft_model(base, config)


def run(model, fast: bool = True, **options):
    """``sample_groups`` on PROMPTS; the batch also carries ``logprob_bound``, how far another
    route's log-probs of the same tokens may lie (tests/numerics.py), from the weights as they
    were when it ran."""
    settings = {**dict(group_size=3, max_new_tokens=10, eos_token_ids=None, pad_token_id=0, temperature=1.0, seed=4),
                **options}
    batch = sample_groups(model, PROMPTS, fast=fast, **settings)
    batch.logprob_bound = logprob_bound(model, max(map(len, PROMPTS)) + settings["max_new_tokens"])
    return batch


def optimizer_step(model, params) -> None:
    """One SGD step that moves every given parameter (a loss over all logits)."""
    optimizer = torch.optim.SGD(params, lr=0.5)
    model.train()
    loss = model(input_ids=torch.tensor([PROMPTS[0]])).logits.square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    model.eval()


def assert_same_samples(a, b, atol=None):
    """The same tokens, and log-probs within ``atol``: by default the larger of the two runs'
    rounding bounds (the fast and the HF paths, or packed weights rebuilt, run other kernels)."""
    assert a.completion_ids == b.completion_ids
    bound = max(a.logprob_bound, b.logprob_bound) if atol is None else atol
    for row, (x, y) in enumerate(zip(a.logprobs, b.logprobs)):
        assert_values_within(torch.tensor(x), torch.tensor(y), bound, f"row {row}")


@pytest.mark.numerics
def test_frozen_model_packs_once_and_reuses_the_packed_weights():
    model = tiny_llama().requires_grad_(False)
    first, second = run(model), run(model)
    assert (first.timings["fuse_cached"], second.timings["fuse_cached"]) == (0.0, 1.0)
    assert_same_samples(first, second, atol=0)
    assert_same_samples(second, run(model, fast=False))  # and what it reuses is right
    clear_fused_cache(model)
    assert run(model).timings["fuse_cached"] == 0.0


@pytest.mark.numerics
def test_trained_lora_keeps_the_packed_base_and_follows_the_adapter_after_an_optimizer_step():
    wrapped = lora_model()
    adapter = [p for p in wrapped.parameters() if p.requires_grad]
    assert adapter and all("lora_" in n for n, p in wrapped.named_parameters() if p.requires_grad)
    before = run(wrapped)
    optimizer_step(wrapped, adapter)
    after = run(wrapped)
    assert after.timings["fuse_cached"] == 1.0  # the base did not change: nothing re-packed
    assert after.completion_ids != before.completion_ids  # the adapter step changed the policy ...
    merged = copy.deepcopy(wrapped).merge_and_unload()
    assert_same_samples(after, run(merged, fast=False))  # ... and the sampler follows it exactly
    assert_same_samples(after, run(wrapped, fast=False))


@pytest.mark.numerics
def test_full_fine_tuning_repacks_after_every_optimizer_step():
    model = tiny_llama()  # every weight trains
    before = run(model)
    optimizer_step(model, list(model.parameters()))
    after = run(model)
    assert (before.timings["fuse_cached"], after.timings["fuse_cached"]) == (0.0, 0.0)
    assert after.completion_ids != before.completion_ids
    assert_same_samples(after, run(model, fast=False))
    assert base_model(model) not in _CACHE or not _CACHE[base_model(model)]  # nothing kept for trained weights


@pytest.mark.numerics
def test_in_place_loads_of_frozen_weights_invalidate_the_cache():
    model = tiny_llama(seed=0).requires_grad_(False)
    run(model)
    model.load_state_dict(tiny_llama(seed=7).state_dict())  # copy_ into the same tensors: bumps their versions
    loaded = run(model)
    assert loaded.timings["fuse_cached"] == 0.0
    assert_same_samples(loaded, run(tiny_llama(seed=7), fast=False))


@pytest.mark.numerics
def test_a_frozen_adapter_is_folded_kept_and_refolded_after_a_peft_merge():
    wrapped = lora_model().requires_grad_(False)  # an adapter being evaluated
    merged = copy.deepcopy(wrapped).merge_and_unload()
    first, second = run(wrapped), run(wrapped)
    assert second.timings["fuse_cached"] == 1.0
    assert_same_samples(second, run(merged, fast=False))
    # peft merges through weight.data (no version bump); the merged-adapter list is in the key
    wrapped.merge_adapter()
    after_merge = run(wrapped)
    assert after_merge.timings["fuse_cached"] == 0.0
    assert_same_samples(after_merge, run(merged, fast=False))  # not W + 2·ΔW
    wrapped.unmerge_adapter()
    assert_same_samples(run(wrapped), first)


FED = [torch.randint(3, 512, (9,), generator=torch.Generator().manual_seed(s)) for s in range(5)]


def step_logits(model, dtype, fast: bool):
    """Prefill and five steps feeding the same fixed tokens (``FED``) at ``dtype``; the logits
    of each step and the stepper."""
    with torch.inference_mode():
        weights = fuse_llama(model, 9, dtype) if fast else None
        logits, stepper = _prefill(model, PROMPTS, 3, 0, weights, len(FED) + 1, dtype)
        out = [logits] + [stepper.step(tokens) for tokens in FED]
    return out, stepper


def max_error(logits, reference) -> float:
    return max((a - b).abs().max().item() for a, b in zip(logits, reference))


def test_bf16_decode_computes_what_bf16_autocast_computes():
    model = tiny_llama()
    fast16, stepper = step_logits(model, torch.bfloat16, fast=True)
    assert isinstance(stepper, FastLlamaDecoder)
    qkv = stepper.w.layers[0].qkv.base
    assert stepper.w.dtype == torch.bfloat16
    if _mkldnn_linear_available(torch.zeros(1, dtype=torch.bfloat16)):
        assert qkv.packed.dtype == torch.bfloat16  # oneDNN's blocked bf16 copy
    else:  # no native bf16 matrix products on this CPU: F.linear on the bf16 weight
        assert qkv.packed is None and qkv.weight.dtype == torch.bfloat16
    assert stepper.keys[0].dtype == torch.float32  # attention and its cache stay fp32, as in the training pass
    assert all(logits.dtype == torch.float32 for logits in fast16)
    hf16, hf_stepper = step_logits(model, torch.bfloat16, fast=False)
    assert isinstance(hf_stepper, HFStepper)
    # the same roundings in the same places as the HF forward under labelrl's bf16 compute
    # (fp32 residual stream, norms, rotary embedding and attention; bf16 projections; fp32
    # vocabulary projection)
    for a, b in zip(fast16, hf16):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    fast32, _ = step_logits(model, torch.float32, fast=True)
    assert max_error(fast16, fast32) > 1e-3  # bf16 really ran


def test_bf16_low_rank_update_is_as_accurate_as_bf16_autocast_and_as_folding():
    # Rounding orders differ (peft rounds B(A(x)) per linear, the fast path folds the scale into
    # B, folding rounds W + scale·B·A once), so the fair test is the error against the fp32
    # result: measured 0.1–0.22 for each on this model, whose logits reach ±7, while the
    # adapter itself moves them by 7–9.
    wrapped = lora_model()
    merged = copy.deepcopy(wrapped).merge_and_unload().requires_grad_(False)
    reference, _ = step_logits(merged, torch.float32, fast=False)
    separate, _ = step_logits(wrapped, torch.bfloat16, fast=True)
    autocast, _ = step_logits(wrapped, torch.bfloat16, fast=False)
    folded, _ = step_logits(merged, torch.bfloat16, fast=True)
    err = max_error(separate, reference)
    assert err <= 1.5 * max(max_error(autocast, reference), max_error(folded, reference)) + 0.02
    with wrapped.disable_adapter():
        no_adapter, _ = step_logits(wrapped, torch.bfloat16, fast=True)
    assert max_error(no_adapter, reference) > 20 * err  # an update left out would show


@pytest.mark.numerics
def test_a_long_call_folds_the_trained_adapter_midway_and_samples_the_same(monkeypatch):
    from labelrl.rollout import fused, sampler

    wrapped = lora_model()
    merged = copy.deepcopy(wrapped).merge_and_unload()
    folds = []
    real_pack = fused._pack
    monkeypatch.setattr(fused, "_pack", lambda *a, **k: folds.append(k.get("fold_all", False)) or real_pack(*a, **k))
    monkeypatch.setattr(sampler, "FOLD_AFTER_STEPS", 4)  # 64 on real runs; 4 keeps the test short
    long = run(wrapped, max_new_tokens=10)
    assert True in folds  # folded at step 4 ...
    assert_same_samples(long, run(merged, fast=False, max_new_tokens=10))  # ... and the samples did not change
    folds.clear()
    run(wrapped, max_new_tokens=4)
    assert True not in folds  # a short call never folds


@pytest.mark.parametrize("name", ["tiny-qwen2", "tiny-qwen3", "tiny-gemma3"])
def test_bf16_decode_of_each_family_rounds_where_bf16_autocast_rounds(name):
    # fp32 kernels differ in their last bit now and then (the HF path's attention runs another
    # SDPA layout), and where a bf16 rounding follows, that bit can flip the rounding: a cached
    # key then carries a 1/256 difference into later steps of that row. So most, not all,
    # (step, row) pairs match to 1e-5; a rounding put in another place (e.g. Qwen3's q/k norm
    # rounded after its weight, as Gemma's is) moves every one of them (measured: 100%).
    from labelrl.models import load_model

    model = load_model(name)[0]
    fast16, stepper = step_logits(model, torch.bfloat16, fast=True)
    assert isinstance(stepper, FastLlamaDecoder) and stepper.w.dtype == torch.bfloat16
    hf16, _ = step_logits(model, torch.bfloat16, fast=False)
    fp32, _ = step_logits(model, torch.float32, fast=False)
    errors = torch.stack([(a - b).abs().amax(-1) for a, b in zip(fast16, hf16)])  # [steps, rows]
    assert (errors > 1e-5).float().mean() <= 0.15 and errors.max() < 5e-3
    below_bf16 = torch.stack([(a - b).abs().amax(-1) for a, b in zip(hf16, fp32)])
    assert below_bf16.min() > 1e-4  # bf16 really ran, in every row


def _packed_storage_bytes(model) -> int:
    entries = _CACHE.get(base_model(model), {})
    linears = [p for _, packed in entries.values() for layer in packed for p in (layer if isinstance(layer, tuple) else (layer,))]
    # oneDNN's packed tensors are opaque (no storage to read): their elements × element size
    return sum(t.numel() * t.element_size() for t in (p.packed if p.packed is not None else p.weight for p in linears))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kept_bytes_is_what_the_packed_base_holds_once_sampling_keeps_it(dtype):
    # The memory plan of an RL run counts these bytes: the pack outlives every sampling call.
    wrapped = lora_model()
    clear_fused_cache(wrapped)
    expected = kept_bytes(wrapped, dtype)
    assert expected > 0 and _packed_storage_bytes(wrapped) == 0
    run(wrapped, dtype=dtype)
    held = _packed_storage_bytes(wrapped)
    assert held == expected
    assert kept_bytes(wrapped, dtype) == 0  # held already: nothing more to come


def test_kept_bytes_is_zero_when_the_base_trains():
    model = tiny_llama()
    assert kept_bytes(model, torch.float32) == 0
    run(model)
    assert _packed_storage_bytes(model) == 0


def test_block_layout_cuts_equal_blocks_and_names_the_member_each_reads():
    from labelrl.rollout.projection import block_layout

    assert block_layout([576, 192, 192], [16, 16, 16]) == (192, [0, 0, 0, 1, 2])  # SmolLM2's q/k/v
    assert block_layout([1536, 1536], [16, 16]) == (1536, [0, 1])  # gate/up
    assert block_layout([896, 128, 128], [8, 8, 8]) == (128, [0] * 7 + [1, 2])  # Qwen2-0.5B's q/k/v
    assert block_layout([576], [16]) is None  # one member: one product already
    assert block_layout([1536, 1536], [16, 8]) is None  # ranks differ: the block-diagonal product


def test_the_sampler_runs_gate_up_as_blocks_and_q_k_v_block_diagonal_with_the_same_update():
    """gate/up (each member one block) is held as blocks, q/k/v (q twice as wide as k) as one
    block-diagonal Bᵀ. On integer-valued factors every sum is exact, so the blocked update
    equals the block-diagonal one (``dense_t``) bit for bit."""
    from labelrl.rollout.projection import LowRank

    model = lora_model()
    with torch.no_grad():
        generator = torch.Generator().manual_seed(0)
        for name, parameter in model.named_parameters():
            if "lora_" in name:
                parameter.copy_(torch.randint(-2, 3, parameter.shape, generator=generator).float())
    with torch.inference_mode():
        layer = fuse_llama(model, 3, torch.float32).layers[0]
        assert layer.qkv.low_rank.blocks is None and layer.qkv.low_rank.b_t.shape == (12, 128)
        gate_up = layer.gate_up.low_rank
        assert gate_up.b_t is None and gate_up.blocks.shape == (2, 4, 128)
        dense = LowRank(a=gate_up.a, b_t=gate_up.dense_t())
        assert torch.equal(dense.b_t[:4, 128:], torch.zeros(4, 128)) and torch.equal(dense.b_t[4:, :128], torch.zeros(4, 128))
        x = torch.randint(-2, 3, (3, 64), generator=generator).float()
        y = torch.randint(-2, 3, (3, 256), generator=generator).float()
        down = x @ gate_up.a.t()
        assert torch.equal(gate_up.add(y.clone(), down), dense.add(y.clone(), down))
        assert not torch.equal(gate_up.add(y.clone(), down), y)  # the update is not zero
