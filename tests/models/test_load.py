"""Tests for labelrl.models.load.

Every test here runs against a fresh ``LABELRL_CACHE`` (a temporary directory for this module),
so the suite passes on a machine with an empty cache: the first tiny-random load builds the
SmolLM2 tokenizer cache from the GGUF (~4 s). The default ``~/.cache/labelrl`` is never touched.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from transformers import AutoModelForCausalLM

from labelrl.models import BUILTIN_MODELS, load_model, load_tokenizer, model_fingerprint
from labelrl.models import cache
from labelrl.models.load import smollm2_gguf_path

PROMPT = "Is this message spam? WINNER!! Claim your free prize now"


@pytest.fixture(scope="module", autouse=True)
def fresh_cache(tmp_path_factory):
    root = tmp_path_factory.mktemp("labelrl_cache")
    before = os.environ.get("LABELRL_CACHE")
    os.environ["LABELRL_CACHE"] = str(root)
    yield root
    if before is None:
        os.environ.pop("LABELRL_CACHE", None)
    else:
        os.environ["LABELRL_CACHE"] = before


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-random")


def _logits(model, tokenizer, text=PROMPT):
    batch = tokenizer([text], return_tensors="pt")
    with torch.no_grad():
        return model(**batch).logits


def test_importing_forces_offline_mode():
    import huggingface_hub.constants

    assert os.environ["HF_HUB_OFFLINE"] == "1"
    assert os.environ["TRANSFORMERS_OFFLINE"] == "1"
    assert huggingface_hub.constants.HF_HUB_OFFLINE is True


def test_builtin_names_are_described():
    assert set(BUILTIN_MODELS) == {"smollm2-135m-instruct", "tiny-random", "tiny-qwen2", "tiny-qwen3", "tiny-gemma3"}
    assert all(isinstance(text, str) and text for text in BUILTIN_MODELS.values())


def test_tiny_random_is_small_deterministic_and_leaves_global_rng_alone(tiny):
    model, _ = tiny
    state = torch.get_rng_state()
    again, _ = load_model("tiny-random")
    assert torch.equal(torch.get_rng_state(), state)
    n_params = sum(p.numel() for p in model.parameters())
    # 49152*64 tied embedding + 2 layers * (attention 12288 + mlp 24576 + norms 128) + final norm 64
    assert n_params == 49152 * 64 + 2 * (12288 + 24576 + 128) + 64 < 5_000_000
    first, second = model.state_dict(), again.state_dict()
    assert first.keys() == second.keys()
    assert all(torch.equal(first[key], second[key]) for key in first)
    assert model_fingerprint(model) == model_fingerprint(again)
    assert not model.training
    assert model.config.num_hidden_layers == 2 and model.config.hidden_size == 64
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied


def test_tiny_random_tokenizer_is_the_smollm2_chat_tokenizer(tiny):
    model, tokenizer = tiny
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token is not None and tokenizer.pad_token_id == tokenizer.eos_token_id
    assert len(tokenizer) == model.config.vocab_size == 49152
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert "<|im_start|>user\nhi<|im_end|>" in text and text.endswith("<|im_start|>assistant\n")
    assert model.generation_config.pad_token_id == tokenizer.pad_token_id
    standalone = load_tokenizer("tiny-random")
    assert standalone(PROMPT).input_ids == tokenizer(PROMPT).input_ids
    marker = cache.read_marker(cache.cache_root() / "tokenizers" / "smollm2")
    assert marker["kind"] == "tokenizer" and marker["source"]["name"] == "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_saved_model_reloads_by_path_with_identical_logits(tiny, tmp_path):
    model, tokenizer = tiny
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded, loaded_tokenizer = load_model(tmp_path)
    assert loaded_tokenizer(PROMPT).input_ids == tokenizer(PROMPT).input_ids
    assert torch.equal(_logits(loaded, loaded_tokenizer), _logits(model, tokenizer))
    assert model_fingerprint(loaded) == model_fingerprint(model)
    assert load_model(str(tmp_path), dtype="bfloat16")[0].dtype == torch.bfloat16


def test_pickled_weights_are_refused_unless_allowed(tiny, tmp_path):
    model, tokenizer = tiny
    model.config.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"only pickled weights \(pytorch_model.bin\).*allow_pickle=True"):
        load_model(tmp_path)
    loaded, _ = load_model(tmp_path, allow_pickle=True)
    assert torch.equal(_logits(loaded, tokenizer), _logits(model, tokenizer))


def test_unknown_spec_names_it_lists_builtins_and_refuses_hub(tmp_path):
    with pytest.raises(ValueError) as raised:
        load_model("HuggingFaceTB/SmolLM2-135M-Instruct")
    message = str(raised.value)
    assert "'HuggingFaceTB/SmolLM2-135M-Instruct'" in message
    assert "smollm2-135m-instruct" in message and "tiny-random" in message
    assert "not downloaded" in message and "directory" in message
    with pytest.raises(ValueError, match="neither config.json"):
        load_model(tmp_path)  # exists, but empty
    with pytest.raises(ValueError, match="dtype='int8'"):
        load_model("tiny-random", dtype="int8")


def test_model_dir_without_tokenizer_is_refused(tiny, tmp_path):
    tiny[0].save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="no tokenizer.*tokenizer.save_pretrained"):
        load_model(tmp_path)


def test_fingerprint_changes_with_any_value(tiny):
    model, _ = tiny
    base = model_fingerprint(model)
    # a fresh load of the same weights, a separate object, has the same fingerprint
    assert len(base) == 64 and model_fingerprint(load_model("tiny-random")[0]) == base
    param = model.model.layers[1].mlp.down_proj.weight
    original = param[3, 5].item()
    with torch.no_grad():
        param[3, 5] = original + 1e-3
        try:
            assert model_fingerprint(model) != base
        finally:
            param[3, 5] = original
    assert model_fingerprint(model) == base
    assert model_fingerprint(copy.deepcopy(model).to(torch.bfloat16)) != base  # dtype counts


def _make_adapter(directory, *, save_tokenizer):
    from peft import LoraConfig, get_peft_model

    base, tokenizer = load_model("tiny-random")
    # init_lora_weights=False draws B at random too, so the adapter really changes the logits.
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        peft_model = get_peft_model(base, config).eval()
    peft_model.save_pretrained(directory)
    if save_tokenizer:
        tokenizer.save_pretrained(directory)
    return peft_model, tokenizer


@pytest.mark.parametrize("save_tokenizer", [False, True])
def test_adapter_dir_loads_on_its_builtin_base(tiny, tmp_path, save_tokenizer):
    from peft import PeftModel

    peft_model, tokenizer = _make_adapter(tmp_path, save_tokenizer=save_tokenizer)
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "tiny-random"  # portable: a name, not a path
    loaded, loaded_tokenizer = load_model(tmp_path)
    assert isinstance(loaded, PeftModel) and not loaded.training
    assert not any(p.requires_grad for p in loaded.parameters())
    assert loaded_tokenizer(PROMPT).input_ids == tokenizer(PROMPT).input_ids
    expected = _logits(peft_model, tokenizer)
    assert torch.allclose(_logits(loaded, loaded_tokenizer), expected, atol=1e-6, rtol=0)
    assert not torch.allclose(_logits(tiny[0], tiny[1]), expected, atol=1e-3)
    assert load_tokenizer(tmp_path)(PROMPT).input_ids == tokenizer(PROMPT).input_ids


def test_adapter_on_a_directory_base_and_bad_bases(tiny, tmp_path):
    base_dir, adapter_dir = tmp_path / "base", tmp_path / "adapter"
    tiny[0].save_pretrained(base_dir)
    tiny[1].save_pretrained(base_dir)
    peft_model, tokenizer = _make_adapter(adapter_dir, save_tokenizer=False)
    config_path = adapter_dir / "adapter_config.json"
    config = json.loads(config_path.read_text())
    config["base_model_name_or_path"] = str(base_dir)
    config_path.write_text(json.dumps(config))
    loaded, _ = load_model(adapter_dir)
    assert torch.allclose(_logits(loaded, tokenizer), _logits(peft_model, tokenizer), atol=1e-6, rtol=0)
    config["base_model_name_or_path"] = "some-org/some-model"
    config_path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match="names base model 'some-org/some-model'.*not downloaded"):
        load_model(adapter_dir)


# Run in fresh interpreters that start with offline mode explicitly disabled by the user.
_TOKENIZER_CHILD = textwrap.dedent(
    """
    import os
    from labelrl.models import load_tokenizer
    tok = load_tokenizer("tiny-random")
    print(os.environ["HF_HUB_OFFLINE"], os.environ["TRANSFORMERS_OFFLINE"], tok.eos_token, len(tok))
    """
)


def test_two_processes_build_the_tokenizer_cache_concurrently(tmp_path):
    env = {**os.environ, "LABELRL_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "0"}
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _TOKENIZER_CHILD],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [child.communicate(timeout=300) for child in children]
    assert [child.returncode for child in children] == [0, 0], [err[-2000:] for _, err in outputs]
    assert [out.split() for out, _ in outputs] == [["1", "1", "<|im_end|>", "49152"]] * 2
    entry = tmp_path / "tokenizers" / "smollm2"
    assert cache.read_marker(entry)["kind"] == "tokenizer"
    assert {"tokenizer.json", "tokenizer_config.json", cache.MARKER_NAME} <= set(os.listdir(entry))
    assert [p.name for p in entry.parent.iterdir()] == ["smollm2"]  # no temp dirs left
    assert load_tokenizer("tiny-random").chat_template is not None


@pytest.mark.slow
def test_smollm2_first_load_converts_and_cached_load_matches(tmp_path, monkeypatch):
    monkeypatch.setenv("LABELRL_CACHE", str(tmp_path))
    try:
        _check_smollm2_first_and_cached_load()
    finally:
        shutil.rmtree(tmp_path / "models", ignore_errors=True)  # 517 MB; pytest keeps old tmp dirs


def _check_smollm2_first_and_cached_load():
    started = time.perf_counter()
    first, tokenizer = load_model("smollm2-135m-instruct")
    first_s = time.perf_counter() - started
    started = time.perf_counter()
    cached, cached_tokenizer = load_model("smollm2-135m-instruct")
    cached_s = time.perf_counter() - started
    config = cached.config
    assert (config.num_hidden_layers, config.hidden_size, config.vocab_size) == (30, 576, 49152)
    assert not hasattr(config, "quantization_config") or config.quantization_config is None
    assert cached_tokenizer.eos_token == "<|im_end|>" and cached_tokenizer.chat_template
    assert torch.equal(_logits(first, tokenizer), _logits(cached, cached_tokenizer))
    # The cached plain copy computes what transformers' own GGUF loader computes.
    gguf = smollm2_gguf_path()
    reference = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    assert torch.allclose(_logits(reference, tokenizer), _logits(cached, cached_tokenizer), atol=1e-5, rtol=0)
    assert model_fingerprint(first) == model_fingerprint(cached)
    # Converting dequantises 272 tensors (~30 s); the cached copy is one safetensors read (~1 s).
    assert cached_s < first_s / 4, (first_s, cached_s)
    assert cached.name_or_path == "smollm2-135m-instruct"
    # The tokenizer cache is then filled from the model cache rather than the GGUF.
    assert load_tokenizer("smollm2-135m-instruct")(PROMPT).input_ids == tokenizer(PROMPT).input_ids
