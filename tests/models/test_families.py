"""The built-in tiny models of the other architecture families (``tiny-qwen2``, ``tiny-qwen3``,
``tiny-gemma3``): each is the architecture it claims with its distinguishing parts really
exercised (random biases and norms, a sliding window shorter than the sequences), the SmolLM2
tokenizer's special ids throughout, the same weights on every load and in another process,
and it survives a save and reload, as a full model and under a LoRA adapter.

The paths each family runs through live beside the tests of those paths: tests/rollout
(sampler, fast decode, training pass), tests/evaluate/test_score_families.py, tests/train/
test_packing_families.py, tests/models/test_precision.py and tests/cli/test_families_cli.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from labelrl.models import BUILTIN_MODELS, load_model, model_fingerprint
from labelrl.models.tiny import GEMMA3_SLIDING_WINDOW, TINY_MODELS, build_tiny

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from numerics import assert_values_within, logit_bound  # noqa: E402

FAMILIES = {"tiny-qwen2": "Qwen2ForCausalLM", "tiny-qwen3": "Qwen3ForCausalLM", "tiny-gemma3": "Gemma3ForCausalLM"}
IDS = torch.tensor([[1, 42, 300, 7, 99, 5, 1200, 31, 8, 4000, 77, 2]])  # 12 tokens > the window of 4


@pytest.fixture(scope="module")
def loaded():
    return {name: load_model(name) for name in FAMILIES}


def test_every_family_is_a_described_builtin():
    assert set(FAMILIES) | {"tiny-random", "smollm2-135m-instruct"} == set(BUILTIN_MODELS)
    for name in FAMILIES:
        assert BUILTIN_MODELS[name] == TINY_MODELS[name].summary and "SmolLM2 tokenizer" in BUILTIN_MODELS[name]


@pytest.mark.parametrize("name", FAMILIES)
def test_family_is_its_architecture_with_the_tokenizers_special_ids(loaded, name):
    model, tokenizer = loaded[name]
    assert type(model).__name__ == FAMILIES[name] and not model.training
    # Gemma3TextConfig defaults to pad 0 / eos 1 / bos 2, other tokens of this vocabulary
    ids = (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id)
    assert ids == (1, 2, 2)
    assert (model.config.bos_token_id, model.config.eos_token_id, model.config.pad_token_id) == ids
    generation = model.generation_config
    assert (generation.bos_token_id, generation.eos_token_id, generation.pad_token_id) == ids
    assert model.config.vocab_size == len(tokenizer) == 49152
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied, as the small Qwen and Gemma models are
    assert 3_000_000 < sum(p.numel() for p in model.parameters()) < 3_500_000
    assert model.config._name_or_path == name  # an adapter on it records the portable built-in name


@pytest.mark.parametrize("name", FAMILIES)
def test_family_is_the_same_on_every_load_and_leaves_global_rng_alone(loaded, name):
    state = torch.get_rng_state()
    again, _ = load_model(name)
    assert torch.equal(torch.get_rng_state(), state)
    assert model_fingerprint(again) == model_fingerprint(loaded[name][0])


def test_families_load_the_same_weights_in_another_process_and_differ_from_each_other(loaded):
    script = ("import json; from labelrl.models import load_model, model_fingerprint; "
              f"print(json.dumps({{n: model_fingerprint(load_model(n)[0]) for n in {list(FAMILIES)!r}}}))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONHASHSEED": "7", "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    there = json.loads(done.stdout.strip().splitlines()[-1])
    here = {name: model_fingerprint(model) for name, (model, _) in loaded.items()}
    assert there == here
    assert len(set(here.values()) | {model_fingerprint(load_model("tiny-random")[0])}) == 4


def test_qwen2_has_random_qkv_biases_and_no_output_bias(loaded):
    attention = loaded["tiny-qwen2"][0].model.layers[0].self_attn
    for projection in (attention.q_proj, attention.k_proj, attention.v_proj):
        assert projection.bias is not None and projection.bias.abs().min() > 0  # drawn, not transformers' zeros
    assert attention.o_proj.bias is None


@pytest.mark.parametrize("name", ["tiny-qwen3", "tiny-gemma3"])
def test_qk_norms_and_layer_norms_are_not_the_identity(loaded, name):
    model = loaded[name][0]
    identity = 0.0 if name == "tiny-gemma3" else 1.0  # Gemma multiplies by 1 + w
    attention = model.model.layers[0].self_attn
    assert attention.head_dim == 32 and attention.q_proj.out_features == 128 != model.config.hidden_size
    for norm in (attention.q_norm, attention.k_norm, model.model.layers[1].input_layernorm, model.model.norm):
        assert (norm.weight - identity).abs().min() > 0  # a path that skipped the norm's weight would show


def test_gemma3_has_its_distinguishing_parts(loaded):
    model = loaded["tiny-gemma3"][0]
    config = model.config
    assert config.layer_types == ["sliding_attention", "full_attention"]
    assert config.sliding_window == GEMMA3_SLIDING_WINDOW
    rope = config.rope_parameters
    assert rope["sliding_attention"]["rope_theta"] != rope["full_attention"]["rope_theta"]
    assert config.query_pre_attn_scalar == 24 != config.head_dim  # query scale 24^-½, not head_dim^-½
    assert config.final_logit_softcapping == 30.0 and config.attn_logit_softcapping is None
    assert float(model.model.embed_tokens.embed_scale) == 8.0  # √hidden
    layer = model.model.layers[0]
    for norm in (layer.post_attention_layernorm, layer.pre_feedforward_layernorm, layer.post_feedforward_layernorm):
        assert norm.weight.abs().min() > 0


@pytest.mark.numerics
def test_gemma3_sliding_window_limits_what_late_tokens_see(loaded):
    # The same weights with a window longer than the sequence: the first 4 positions see the
    # same keys either way; every later one lost keys in tiny-gemma3's sliding layer.
    model, tokenizer = loaded["tiny-gemma3"]
    wide = build_tiny("tiny-gemma3", tokenizer)
    wide.config.sliding_window = 1000
    for layer in wide.model.layers:
        if layer.self_attn.sliding_window is not None:
            layer.self_attn.sliding_window = 1000
    assert model_fingerprint(wide) == model_fingerprint(model)
    with torch.no_grad():
        narrow_logits, wide_logits = model(input_ids=IDS).logits[0], wide.eval()(input_ids=IDS).logits[0]
    # another mask may take another attention kernel: the logits' rounding bound (tests/numerics.py)
    bound = logit_bound(model, IDS.shape[1])
    assert_values_within(narrow_logits[:GEMMA3_SLIDING_WINDOW], wide_logits[:GEMMA3_SLIDING_WINDOW], bound)
    assert (narrow_logits[GEMMA3_SLIDING_WINDOW:] - wide_logits[GEMMA3_SLIDING_WINDOW:]).abs().amax(-1).min() > bound


@pytest.mark.parametrize("name", FAMILIES)
def test_family_saved_as_a_directory_and_as_an_adapter_reloads_with_its_logits(loaded, name, tmp_path):
    from peft import LoraConfig, get_peft_model

    model, tokenizer = loaded[name]
    model.save_pretrained(tmp_path / "full")
    tokenizer.save_pretrained(tmp_path / "full")
    reloaded, _ = load_model(tmp_path / "full")
    assert type(reloaded) is type(model) and model_fingerprint(reloaded) == model_fingerprint(model)

    adapted = get_peft_model(build_tiny(name, tokenizer), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    torch.manual_seed(0)
    with torch.no_grad():
        for param_name, param in adapted.named_parameters():
            if "lora_B" in param_name:  # peft starts B at 0: the adapter would change nothing
                param.normal_(std=0.2)
    adapted.save_pretrained(tmp_path / "adapter")
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == name
    again, again_tokenizer = load_model(tmp_path / "adapter")
    assert type(again.get_base_model()) is type(model) and again_tokenizer.pad_token_id == 2
    with torch.no_grad():
        expected, got = adapted.eval()(input_ids=IDS).logits, again(input_ids=IDS).logits
        base = model(input_ids=IDS).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    assert (got - base).abs().max() > 1e-2  # the adapter was applied, not just the base reloaded
