"""The fast decode step computes what the Hugging Face forward computes: per-step logits and
log-probs to their rounding bound (tests/numerics.py: the two paths run other kernels), the
same greedy completions as ``generate``, the same samples as the HF-forward path for the
same seeds, LoRA folded exactly, and an honest fallback for models it does not cover; for
Llama and for the built-in Qwen2, Qwen3 and Gemma 3 models (q/k/v biases, q/k norms, Gemma's
norms, scaled embeddings, GELU, query scale, soft-capped logits and a 4-token sliding window,
shorter than every sequence here)."""

from __future__ import annotations

import copy
import dataclasses
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may reach a model hub

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from labelrl.models import load_model  # noqa: E402
from labelrl.rollout import fused, sample_groups  # noqa: E402
from labelrl.rollout.fast_decode import FastLlamaDecoder, fuse_llama, unsupported_reason  # noqa: E402
from labelrl.rollout.model_inputs import left_pad  # noqa: E402
from labelrl.rollout.projection import PackedLinear  # noqa: E402
from labelrl.rollout.sampler import HFStepper, _prefill  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from numerics import assert_values_within, gamma, logit_bound, logprob_bound, product_bound  # noqa: E402

PROMPTS = [[1, 5, 6, 7, 8, 9, 10], [1, 20, 21], [1, 30, 31, 32, 33]]  # lengths 7, 3, 5: left padding
LONGEST_PROMPT = max(map(len, PROMPTS))
FAMILIES = ["tiny-qwen2", "tiny-qwen3", "tiny-gemma3"]


def tiny_llama(seed: int = 0, vocab: int = 512, **extra) -> LlamaForCausalLM:
    """The tiny-random architecture (2 layers, hidden 64, 4 heads over 2 kv heads), with
    weights large enough (init 0.2) that logits spread and greedy paths branch."""
    torch.manual_seed(seed)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=vocab, max_position_embeddings=256,
                         initializer_range=0.2, **extra)
    return LlamaForCausalLM(config).eval()


def tiny_gemma3(**extra):
    """A 1-layer sliding-window Gemma 3 text model, for the configurations the fast path refuses."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    config = Gemma3TextConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                              num_key_value_heads=2, head_dim=16, vocab_size=512, sliding_window=4,
                              layer_types=["sliding_attention"], initializer_range=0.2, **extra)
    return Gemma3ForCausalLM(config).eval()


@pytest.fixture(scope="module")
def model():
    return tiny_llama()


@pytest.fixture(params=["shared", "per-row"])
def prompt_layout(request, monkeypatch):
    """The decoder's cache both ways: a prompt's keys held once for its G rows, or once per row
    (by default ``SHARE_PROMPT_UP_TO`` decides per call from the prompts' and completions' lengths)."""
    import labelrl.rollout.fast_decode as fast_decode

    monkeypatch.setattr(fast_decode, "SHARE_PROMPT_UP_TO", 10**9 if request.param == "shared" else 0)
    return request.param


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    """A built-in model of another family (Llama is ``model``)."""
    return load_model(request.param)[0]


def run(model, fast: bool, prompts=PROMPTS, **options):
    defaults = dict(group_size=3, max_new_tokens=12, eos_token_ids=None, pad_token_id=0, temperature=0.0)
    return sample_groups(model, prompts, fast=fast, **{**defaults, **options})


def step_logits(model, prompts, group_size: int, tokens_per_step, keep_per_step, fast: bool):
    """Feed the given tokens step by step, dropping rows as ``keep_per_step`` says; the
    logits [live, V] of every step, the prefill's first."""
    with torch.inference_mode():
        weights = fuse_llama(model) if fast else None
        logits, stepper = _prefill(model, prompts, group_size, 0, weights, len(tokens_per_step) + 1)
        assert isinstance(stepper, FastLlamaDecoder if fast else HFStepper)
        out = [logits]
        for tokens, keep in zip(tokens_per_step, keep_per_step):
            if keep is not None:
                stepper.select(keep)
            out.append(stepper.step(tokens))
    return out


@pytest.mark.numerics
def test_step_logits_match_hf_stepper_and_unpadded_forward(model, prompt_layout):
    assert_step_logits_match(model)


@pytest.mark.numerics
def test_family_step_logits_match_hf_stepper_and_unpadded_forward(family, prompt_layout):
    assert unsupported_reason(family) is None
    assert_step_logits_match(family)


def test_a_prompts_rows_share_its_keys_while_their_completions_are_short(model):
    # P = 7 columns, G = 3: shared while 3 · max_new_tokens ≤ 3 · 7 (SHARE_PROMPT_UP_TO)
    def cache_groups(max_new_tokens: int):
        with torch.inference_mode():
            return _prefill(model, PROMPTS, 3, 0, fuse_llama(model), max_new_tokens)[1]

    shared, per_row = cache_groups(7), cache_groups(8)
    assert [tuple(k.shape) for k in shared.keys] == [(3, 2, 7 + 3 * 7, 16)] * 2  # one copy per prompt
    assert [tuple(k.shape) for k in per_row.keys] == [(9, 2, 7 + 8, 16)] * 2  # one per row
    shared.select(torch.tensor([0, 1, 2, 6, 7, 8]))  # prompt 1's rows all finished: its group leaves
    assert shared.keys[0].shape[0] == 2 and shared.slots.tolist() == [0, 1, 2, 3, 4, 5]
    shared.select(torch.tensor([1, 2, 3, 5]))  # a row of each group: both stay, the rows' slots kept
    assert shared.keys[0].shape[0] == 2 and shared.slots.tolist() == [1, 2, 3, 5]
    per_row.select(torch.tensor([0, 4, 8]))
    assert per_row.keys[0].shape[0] == 3 and per_row.slots.tolist() == [0, 1, 2]


def assert_step_logits_match(model, prompts=PROMPTS):
    # 9 rows; after step 2 rows 1, 4, 5, 8 finish, after step 4 rows 0 and 6 do too
    steps = [torch.randint(3, 512, (9,), generator=torch.Generator().manual_seed(s)) for s in range(6)]
    keep = [None, None, torch.tensor([0, 2, 3, 6, 7]), None, torch.tensor([1, 2, 4]), None]
    for i, rows in enumerate(keep):  # feed only live rows' tokens
        live = torch.arange(9) if i == 0 else live[rows] if rows is not None else live
        steps[i] = steps[i][: len(live)]
    fast = step_logits(model, prompts, 3, steps, keep, fast=True)
    slow = step_logits(model, prompts, 3, steps, keep, fast=False)
    # The smallest plausible bug: one layer skipped in the fast path. On tiny_llama the logits then
    # move by 5.8 (the last layer left out) or 9.5 (the first), against a bound of 0.0027 and a
    # measured difference of 6e-6: test_planted_a_fast_decoder_that_skips_a_layer_fails_….
    bound = logit_bound(model, max(map(len, prompts)) + len(steps))
    for step, (a, b) in enumerate(zip(fast, slow)):
        assert_values_within(a, b, bound, f"step {step}")
    # and against a plain forward over each surviving row's whole unpadded sequence
    live, history = torch.arange(9), [[] for _ in range(9)]
    for tokens, rows in zip(steps, keep):
        live = live[rows] if rows is not None else live
        for row, token in zip(live.tolist(), tokens.tolist()):
            history[row].append(token)
    for row in live.tolist():
        ids = torch.tensor([prompts[row // 3] + history[row]])
        with torch.inference_mode():
            reference = model(input_ids=ids).logits[0, -1]
        assert_values_within(fast[-1][live.tolist().index(row)], reference, bound, f"row {row}")


# 20 tokens every prompt starts with (a template's header and system message), after the leading 1
PREFIXED = [[1, *range(100, 120), *p[1:]] for p in PROMPTS]


def prefill_prefixes(monkeypatch) -> list[int]:
    """A spy on the fast prefill: the length of the prefix each call ran once (0: none)."""
    import labelrl.rollout.sampler as sampler_module

    seen, real = [], sampler_module.fast_prefill
    monkeypatch.setattr(sampler_module, "fast_prefill",
                        lambda *a, prefix=None, **k: seen.append(0 if prefix is None else prefix.shape[1])
                        or real(*a, prefix=prefix, **k))
    return seen


@pytest.mark.numerics
@pytest.mark.parametrize("name", ["llama", "tiny-qwen2", "tiny-qwen3"])
def test_prompts_sharing_a_prefix_prefill_it_once_with_the_same_step_logits(name, monkeypatch):
    model = tiny_llama() if name == "llama" else load_model(name)[0]
    seen = prefill_prefixes(monkeypatch)
    # against the HF forward over the whole left-padded prompts, and each row's unpadded sequence
    assert_step_logits_match(model, PREFIXED)
    assert seen == [1 + 20]
    greedy = run(model, True, PREFIXED)
    assert greedy.completion_ids == run(model, False, PREFIXED).completion_ids


@pytest.mark.parametrize("prompts, computed", [(PROMPTS, 7 + 3 + 5), (PREFIXED, 21 + (6 + 2 + 4))])
def test_the_prefill_computes_each_prompts_real_tokens_only(model, prompts, computed):
    # left padding widens the batch to the longest prompt (3 × 7 and 21 + 3 × 6 slots); the
    # projections see the real tokens alone (the shared prefix once), attention the padded layout,
    # and a layer's projection runs once over the prefix and the prompts' tokens together
    seen = []
    with torch.inference_mode():
        weights = fuse_llama(model)
        qkv = weights.layers[0].qkv
        weights.layers[0].qkv = lambda x, exact=None: seen.append(x.shape[0]) or qkv(x, exact)
        _prefill(model, prompts, 3, 0, weights, 4)
    assert seen == [computed]


def test_a_sliding_window_model_prefills_its_prompts_whole(monkeypatch):
    # Gemma 3's sliding layers count their window in cache columns: the padding between a
    # shared prefix and a short remainder would take the place of the prefix's last keys
    family = load_model("tiny-gemma3")[0]
    seen = prefill_prefixes(monkeypatch)
    run(family, True, PREFIXED)
    assert seen == [0]


@pytest.mark.numerics
def test_greedy_equals_hf_path_and_generate_with_rows_ending_apart(model, prompt_layout):
    assert_greedy_equals_generate(model)


@pytest.mark.numerics
def test_family_greedy_equals_hf_path_and_generate_with_rows_ending_apart(family, prompt_layout):
    assert_greedy_equals_generate(family)


def skip_a_layer_in_the_fast_path(monkeypatch, layer: int) -> None:
    """The planted bug: the packed weights without decoder layer ``layer`` wherever the sampler or
    this module packs them (``fuse_llama``); the Hugging Face path keeps every layer."""
    import labelrl.rollout.sampler as sampler_module

    def skipped(*args, **kwargs):
        weights = fused.fuse_llama(*args, **kwargs)
        dropped = layer % len(weights.layers)
        return dataclasses.replace(weights, layers=[w for i, w in enumerate(weights.layers) if i != dropped])

    monkeypatch.setattr(sampler_module, "fuse_llama", skipped)
    monkeypatch.setitem(globals(), "fuse_llama", skipped)  # step_logits above


@pytest.mark.numerics
def test_planted_a_fast_decoder_that_skips_a_layer_fails_greedy_equality_and_the_logit_bound(model, monkeypatch):
    """The twins of the step-logit comparison and of greedy equality with ``generate``, one layer
    of tiny_llama's two left out of the fast path: the last, whose absence shows least (the
    logits move by 5.8, against 9.5 without the first; the bound allows 0.0027)."""
    skip_a_layer_in_the_fast_path(monkeypatch, layer=-1)
    with pytest.raises(AssertionError, match="rounding bound"):
        assert_step_logits_match(model)
    with pytest.raises(AssertionError, match="greedy tokens: the fast path's differ"):
        assert_greedy_equals_generate(model)


def assert_greedy_equals_generate(model):
    """The sampler's fast path against its Hugging Face path and ``generate``: the same greedy
    tokens (exact: no near-tie on these models), log-probs within their rounding bound. The
    smallest plausible bug it must catch, a layer skipped in the fast path, changes the tokens
    (on tiny_llama from the first one: test_planted_a_fast_decoder_that_skips_a_layer_fails_…)."""
    free = run(model, fast=True, eos_token_ids=None)
    # an EOS that prompt 0 emits mid-way and the others may not: rows end at different steps
    eos = free.completion_ids[0][4]
    fast, slow = run(model, fast=True, eos_token_ids=[eos]), run(model, fast=False, eos_token_ids=[eos])
    assert fast.timings["fast_decode"] == 1.0 and slow.timings["fast_decode"] == 0.0
    assert fast.completion_ids == slow.completion_ids, "greedy tokens: the fast path's differ from the HF path's"
    assert len(set(fast.lengths)) > 1  # rows really finished at different times
    ids, mask, _ = left_pad(PROMPTS, 0)
    out = model.generate(ids.repeat_interleave(3, 0), attention_mask=mask.repeat_interleave(3, 0), do_sample=False,
                         max_new_tokens=12, eos_token_id=eos, pad_token_id=0)
    expected = []
    for tokens in out[:, ids.shape[1]:].tolist():
        expected.append(tokens[: tokens.index(eos) + 1] if eos in tokens else tokens)
    assert fast.completion_ids == expected, "greedy tokens: the fast path's differ from generate's"
    assert_same_logprobs(model, fast, slow, 12)


@pytest.mark.parametrize("options", [
    dict(seed=11, temperature=1.0),
    dict(seed=12, temperature=0.7, top_k=40, top_p=0.9),
    dict(prompt_seeds=[1, 2, 3], temperature=1.0),
])
@pytest.mark.numerics
def test_sampled_completions_equal_hf_path_for_the_same_seed(model, prompt_layout, options):
    # The same logits (to float rounding) and the same uniform draws give the same tokens; on
    # these models no rounding difference is close enough to flip a draw.
    assert_same_samples_as_hf_path(model, options)


# top-k, not top-p: over a near-flat 49k-token distribution the nucleus boundary is a float-rounding tie
@pytest.mark.numerics
@pytest.mark.parametrize("options", [dict(seed=11, temperature=1.0), dict(prompt_seeds=[1, 2, 3], temperature=0.7, top_k=20)])
def test_family_sampled_completions_equal_hf_path_for_the_same_seed(family, prompt_layout, options):
    assert_same_samples_as_hf_path(family, options)


def assert_same_samples_as_hf_path(model, options):
    fast = run(model, fast=True, max_new_tokens=16, eos_token_ids=[7, 9], **options)
    slow = run(model, fast=False, max_new_tokens=16, eos_token_ids=[7, 9], **options)
    assert fast.timings["fast_decode"] == 1.0
    assert fast.completion_ids == slow.completion_ids
    assert fast.truncated == slow.truncated
    assert_same_logprobs(model, fast, slow, 16)


def assert_same_logprobs(model, a, b, max_new_tokens: int) -> None:
    """Row by row, the two batches' log-probs within the rounding bound of a log-prob over the
    longest prompt plus ``max_new_tokens`` (tests/numerics.py)."""
    bound = logprob_bound(model, LONGEST_PROMPT + max_new_tokens)
    assert len(a.logprobs) == len(b.logprobs)
    for row, (x, y) in enumerate(zip(a.logprobs, b.logprobs)):
        assert_values_within(torch.tensor(x), torch.tensor(y), bound, f"row {row}")


def lora_model(seed: int = 0, **lora_options):
    from peft import LoraConfig, get_peft_model

    base = tiny_llama(seed)
    config = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False, **lora_options)
    torch.manual_seed(seed + 1)
    return get_peft_model(base, config)


@pytest.mark.numerics
def test_lora_wrapped_model_decodes_like_its_merged_equivalent():
    wrapped = lora_model()
    merged = copy.deepcopy(wrapped).merge_and_unload()
    ids = torch.tensor([PROMPTS[0]])
    with torch.inference_mode():
        # merged weights W + s·B·A are rounded once more: inside the adapter chain's bound
        assert_values_within(wrapped(input_ids=ids).logits, merged(input_ids=ids).logits, logit_bound(wrapped, ids.shape[1]))
        with wrapped.disable_adapter():  # the adapter really moves the logits: folding it is no no-op
            assert (wrapped(input_ids=ids).logits - merged(input_ids=ids).logits).abs().max() > 0.1
    assert unsupported_reason(wrapped) is None
    for options in (dict(temperature=0.0), dict(temperature=1.0, seed=5)):
        fast = assert_decodes_like(wrapped, merged, **options)
        assert fast.completion_ids == run(wrapped, fast=False, eos_token_ids=[7], **options).completion_ids


def assert_decodes_like(wrapped, reference_model, **options):
    """``wrapped`` on the fast path against ``reference_model`` on the Hugging Face path: the same
    tokens, log-probs within their rounding bound. The smallest plausible bug it must catch: the
    adapter left out of the fast path (the logits move by 8.5 on lora_model, the bound allows
    0.0028): test_planted_a_fast_decoder_that_drops_the_adapter_fails_…."""
    fast = run(wrapped, fast=True, eos_token_ids=[7], **options)
    reference = run(reference_model, fast=False, eos_token_ids=[7], **options)
    assert fast.timings["fast_decode"] == 1.0
    assert fast.completion_ids == reference.completion_ids, "tokens: the fast path's differ from the reference's"
    assert_same_logprobs(wrapped, fast, reference, 12)
    return fast


@pytest.mark.numerics
def test_planted_a_fast_decoder_that_drops_the_adapter_fails_the_comparison_with_the_merged_model(monkeypatch):
    wrapped = lora_model()
    merged = copy.deepcopy(wrapped).merge_and_unload()
    # the bug: neither the low-rank updates (a trained adapter) nor a folded one reach the packed weights
    monkeypatch.setattr(fused, "low_rank", lambda modules: None)
    monkeypatch.setattr(fused, "effective_weight", lambda module, fold_all=False: fused.frozen_weight(module))
    fused.clear_fused_cache(wrapped)
    for options in (dict(temperature=0.0), dict(temperature=1.0, seed=5)):
        with pytest.raises(AssertionError, match="tokens: the fast path's differ from the reference's"):
            assert_decodes_like(wrapped, merged, **options)
    # what the bug decodes is the base model: the patch removed the adapter and nothing else
    assert_decodes_like(wrapped, tiny_llama(seed=0), temperature=1.0, seed=5)


@pytest.mark.numerics
def test_family_lora_adapter_decodes_like_its_merged_equivalent(family):
    # Qwen2's q/k/v biases stay outside the adapter (peft adds B·A to the weight only)
    from peft import LoraConfig, get_peft_model

    wrapped = get_peft_model(copy.deepcopy(family), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    torch.manual_seed(1)
    with torch.no_grad():
        for name, param in wrapped.named_parameters():
            if "lora_B" in name:  # peft starts B at 0: the adapter would change nothing
                param.normal_(std=0.3)
    merged = copy.deepcopy(wrapped).merge_and_unload()
    assert unsupported_reason(wrapped) is None
    fast, reference = run(wrapped, fast=True, temperature=1.0, seed=5), run(merged, fast=False, temperature=1.0, seed=5)
    assert fast.timings["fast_decode"] == 1.0
    assert fast.completion_ids == reference.completion_ids
    assert fast.completion_ids != run(family, fast=False, temperature=1.0, seed=5).completion_ids  # the adapter counts
    assert_same_logprobs(wrapped, fast, reference, 12)


@pytest.mark.numerics
def test_lora_with_adapter_switched_off_decodes_the_base_model():
    wrapped = lora_model(seed=0)
    with wrapped.disable_adapter():
        fast = run(wrapped, fast=True, temperature=1.0, seed=3)
    reference = run(tiny_llama(seed=0), fast=False, temperature=1.0, seed=3)  # the same base weights, no adapter
    assert fast.timings["fast_decode"] == 1.0
    assert fast.completion_ids == reference.completion_ids
    assert_same_logprobs(wrapped, fast, reference, 12)  # the adapter's rank counted: a bound, not a measurement


def trained_lora(base):
    """``base`` with a LoRA adapter on every projection whose B factors are away from 0 (peft
    starts them at 0, where the low-rank updates would add nothing)."""
    from peft import LoraConfig, get_peft_model

    wrapped = get_peft_model(copy.deepcopy(base), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    torch.manual_seed(1)
    with torch.no_grad():
        for name, param in wrapped.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.3)
    return wrapped


@pytest.mark.numerics
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["llama", *FAMILIES])
def test_the_scripted_decode_layers_compute_what_the_python_functions_compute(name, dtype, prompt_layout, monkeypatch):
    # TorchScript runs the layers' tensor operations without a Python call each: the same
    # operations, so every step's logits are bit-identical. The trained adapter runs the low-rank
    # updates (gate/up in blocks, q/k/v block-diagonal), and dropping one row at step 2 and the
    # last at step 3 runs the decoder's path for slots whose row has finished.
    import labelrl.rollout.fast_decode as fast_decode

    model = trained_lora(tiny_llama() if name == "llama" else load_model(name)[0])
    group_size, rows = 3, 3 * len(PROMPTS)
    generator = torch.Generator().manual_seed(0)
    tokens = [torch.randint(1, 100, (rows - (step >= 2) - (step >= 3),), generator=generator) for step in range(5)]
    logits = {}
    for scripted in (True, False):
        monkeypatch.setattr(fast_decode, "SCRIPT_DECODE_LAYERS", scripted)
        assert isinstance(fast_decode.decode_layers(), torch.jit.ScriptFunction) == scripted
        with torch.inference_mode():
            first, stepper = _prefill(model, PROMPTS, group_size, 0, fuse_llama(model, dtype=dtype), 6, dtype)
            logits[scripted] = [first]
            for step, fed in enumerate(tokens):
                if step in (2, 3):
                    live = len(fed) + 1
                    stepper.select(torch.arange(1, live) if step == 2 else torch.arange(live - 1))
                logits[scripted].append(stepper.step(fed))
    assert all(torch.equal(a, b) for a, b in zip(logits[True], logits[False], strict=True))
    assert logits[True][-1].shape[0] == rows - 2


def test_a_torch_that_cannot_script_the_layers_decodes_with_the_python_functions(model, monkeypatch):
    import labelrl.rollout.fast_decode as fast_decode

    def refuse(function):
        raise RuntimeError("this torch has no TorchScript")

    monkeypatch.setattr(fast_decode, "_SCRIPTED", {})
    monkeypatch.setattr(torch.jit, "script", refuse)
    assert fast_decode.decode_layers() is fast_decode._decode_layers
    fast = run(model, True)
    assert fast.timings["fast_decode"] == 1.0
    assert fast.completion_ids == run(model, False).completion_ids


@pytest.mark.parametrize("build, reason", [
    (lambda: tiny_llama(mlp_bias=True), "bias"),
    (lambda: tiny_llama(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}), "rope_type"),
    (lambda: tiny_llama(hidden_act="gelu"), "hidden_act"),
    (lambda: lora_model(use_dora=True), "DoRA"),
    (lambda: tiny_llama(attention_bias=True), "o_proj has a bias"),  # q/k/v biases are taken, an output bias is not
    (lambda: tiny_gemma3(attn_logit_softcapping=50.0), "attn_logit_softcapping"),
    (lambda: tiny_gemma3(hidden_activation="silu"), "hidden_activation"),
])
def test_unsupported_models_fall_back_to_the_hf_forward(build, reason):
    model = build().eval()
    assert reason in unsupported_reason(model)
    fast, slow = run(model, fast=True), run(model, fast=False)
    assert fast.timings["fast_decode"] == 0.0
    assert fast.completion_ids == slow.completion_ids


def test_other_architectures_are_refused():
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                           num_key_value_heads=2, vocab_size=64)
    assert "MistralForCausalLM is not a LlamaForCausalLM, Qwen2ForCausalLM" in unsupported_reason(MistralForCausalLM(config))


@pytest.mark.numerics
def test_packed_linear_equals_f_linear_for_any_row_count():
    torch.manual_seed(0)
    weight, residual_dim = torch.randn(96, 32), 96
    linear = PackedLinear(weight, rows=8)
    with torch.inference_mode():
        for rows in (1, 5, 8, 13):
            x, residual = torch.randn(rows, 32), torch.randn(rows, residual_dim)
            # two kernels' x·Wᵀ: 2·γ_32·|x|·|W|ᵀ entrywise; adding the residual is one more rounding
            product = product_bound(x, weight.t())
            assert_values_within(linear(x), F.linear(x, weight), product, f"{rows} rows")
            added = 2 * gamma(weight.shape[1] + 1, torch.float32) * (residual.abs() + x.abs() @ weight.abs().t())
            assert_values_within(linear.add_to(residual, x), residual + F.linear(x, weight), added, f"{rows} rows, added")


@pytest.fixture(scope="module")
def smollm2():
    """SmolLM2 and two prompts of different lengths (left padding)."""
    model, tokenizer = load_model("smollm2-135m-instruct")
    text = "Classify this message as spam or ham: WINNER!! You have been selected for a free cruise. Reply now."
    ids = tokenizer(text)["input_ids"]
    return model, tokenizer, [ids, ids[5:]]


def assert_smollm2_step_logits_match(model, prompts) -> None:
    """Every step's logits [rows, 49152] of the fast path within the rounding bound of the HF path's.

    The worst case (``logit_bound``: γ_K·L, K ≈ 1.75·10⁵ roundings over 30 layers, L = 601) allows
    12.6 and passes SmolLM2 with any one of 21 of its 30 layers left out of the fast path (the
    logits then move by 3.9, layer 14 left out, to 49, layer 29). The smallest plausible bug it
    must catch is that one skipped layer. The probabilistic model (``probabilistic=True``:
    γ̃_K = λ·√K·u, λ = 7, ``numerics.ROUNDING_LAMBDA``) allows 0.21: 18× under the least visible
    skipped layer (test_planted_a_smollm2_fast_decoder_that_skips_any_one_layer_fails_the_logit_bound)
    and 2,900× over the measured difference (7.1e-5 on AMX, 6.7e-5 on AVX2 kernels). Unlike the
    worst case it is a model: it assumes the roundings are independent of one another."""
    steps = [torch.randint(100, 40000, (4,), generator=torch.Generator().manual_seed(s)) for s in range(4)]
    keep = [None, torch.tensor([0, 1, 3]), None, None]
    steps[1:] = [s[:3] for s in steps[1:]]
    fast = step_logits(model, prompts, 2, steps, keep, fast=True)
    slow = step_logits(model, prompts, 2, steps, keep, fast=False)
    bound = logit_bound(model, max(map(len, prompts)) + len(steps), probabilistic=True)
    for step, (a, b) in enumerate(zip(fast, slow)):
        assert_values_within(a, b, bound, f"step {step}")


@pytest.mark.slow
@pytest.mark.numerics
def test_planted_a_smollm2_fast_decoder_that_skips_any_one_layer_fails_the_logit_bound(smollm2, monkeypatch):
    model, _, prompts = smollm2
    for layer in range(model.config.num_hidden_layers):
        skip_a_layer_in_the_fast_path(monkeypatch, layer)
        with pytest.raises(AssertionError, match="rounding bound"):
            assert_smollm2_step_logits_match(model, prompts)


@pytest.mark.slow
@pytest.mark.numerics
def test_smollm2_fast_decode_matches_hf_forward_and_generate(smollm2):
    model, tokenizer, prompts = smollm2
    assert_smollm2_step_logits_match(model, prompts)
    options = dict(group_size=2, max_new_tokens=12, eos_token_ids=[tokenizer.eos_token_id], pad_token_id=0)
    greedy = sample_groups(model, prompts, temperature=0.0, **options)
    assert greedy.timings["fast_decode"] == 1.0
    assert greedy.completion_ids == sample_groups(model, prompts, temperature=0.0, fast=False, **options).completion_ids
    padded, mask, _ = left_pad(prompts, 0)
    out = model.generate(padded.repeat_interleave(2, 0), attention_mask=mask.repeat_interleave(2, 0), do_sample=False,
                         max_new_tokens=12, eos_token_id=tokenizer.eos_token_id, pad_token_id=0)
    expected = [row[: row.index(tokenizer.eos_token_id) + 1] if tokenizer.eos_token_id in row else row
                for row in out[:, padded.shape[1]:].tolist()]
    assert greedy.completion_ids == expected
