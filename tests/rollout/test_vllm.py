"""The ``vllm`` backend: RequestOutput → RolloutBatch, sampling parameters, and the weight-sync
call sequence, against a small stand-in engine; the real engine (vLLM's CPU build) is tested
in tests/rollout/test_vllm_engine_slow.py."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from pydantic import ValidationError  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from labelrl.rollout.vllm import (  # noqa: E402
    VLLMApi,
    VLLMSampler,
    base_weights,
    engine_dtype,
    kv_cache_bytes,
    lora_rank_slot,
    to_rollout,
)

EOS = 2
HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.fixture(autouse=True)
def _launcher_env_restored():
    """The sampler sets RANK, WORLD_SIZE, … for vLLM's external launcher while an engine starts
    (launcher_env); should a failing test leave them behind, they would make accelerate in a
    later test of the same worker wait on a process group that does not exist."""
    keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    saved = {key: os.environ.get(key) for key in keys}
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def completion(index: int, tokens: list[int], logprobs: list[float], *, decoys: bool = True):
    """A CompletionOutput-shaped object; each position's dict also holds a decoy token, as
    vLLM's does when more than the sampled token is asked for."""
    positions = []
    for token, lp in zip(tokens, logprobs):
        entry = {token: SimpleNamespace(logprob=lp, rank=1)}
        if decoys:
            entry[token + 1000] = SimpleNamespace(logprob=-9.0, rank=2)
        positions.append(entry)
    return SimpleNamespace(index=index, token_ids=tuple(tokens), logprobs=positions, finish_reason=None)


def test_request_outputs_become_a_grouped_rollout_batch():
    outputs = [
        # prompt 0: samples arrive out of index order; one ends at EOS, one runs to the cap
        SimpleNamespace(outputs=[completion(1, [7, 8, 9], [-0.5, -0.6, -0.7]), completion(0, [5, EOS], [-0.1, -0.2])]),
        # prompt 1: EOS exactly at the cap is a finished sample, not a truncated one
        SimpleNamespace(outputs=[completion(0, [4, 4, EOS], [-1.0, -1.1, -1.2]), completion(1, [3], [-2.0])]),
    ]
    batch = to_rollout(outputs, group_size=2, max_new_tokens=3, eos=[EOS])
    assert batch.completion_ids == [[5, EOS], [7, 8, 9], [4, 4, EOS], [3]]
    assert batch.logprobs == [[-0.1, -0.2], [-0.5, -0.6, -0.7], [-1.0, -1.1, -1.2], [-2.0]]
    assert batch.truncated == [False, True, False, False]
    assert batch.lengths == [2, 3, 3, 1]
    assert batch.prompt_index == [0, 0, 1, 1] and batch.group_size == 2


def test_greedy_repeats_the_one_sample_and_bad_outputs_are_refused():
    outputs = [SimpleNamespace(outputs=[completion(0, [5, 6], [-0.3, -0.4])])]
    batch = to_rollout(outputs, group_size=3, max_new_tokens=4, eos=[EOS], repeat=3)
    assert batch.completion_ids == [[5, 6]] * 3 and batch.prompt_index == [0, 0, 0]
    with pytest.raises(ValueError, match="returned 1 samples for prompt 0, expected 3"):
        to_rollout(outputs, group_size=3, max_new_tokens=4, eos=[EOS])
    no_logprobs = [SimpleNamespace(outputs=[SimpleNamespace(index=0, token_ids=(5,), logprobs=None)])]
    with pytest.raises(ValueError, match="logprobs=0"):
        to_rollout(no_logprobs, group_size=1, max_new_tokens=4, eos=[EOS])


# --- a stand-in engine that records what the backend asks of it ---------------------------


class FakeEngine:
    """``vllm.LLM``'s surface the backend uses: generate, reset_prefix_cache, the in-process
    worker's reload_weights, and llm_engine.remove_lora. Every call lands in ``events``; the
    launcher variables seen at start land in ``env``."""

    instances: list["FakeEngine"] = []

    def __init__(self, **options):
        self.options = options
        self.env = {key: os.environ.get(key) for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
        self.events: list[tuple] = [("init", options["model"])]

        def reload_weights(weights_iterator, is_checkpoint_format):
            assert is_checkpoint_format is True  # Hugging Face tensors, not kernel-format ones
            self.events.append(("reload_weights", dict(weights_iterator)))

        self.llm_engine = SimpleNamespace(
            model_executor=SimpleNamespace(driver_worker=SimpleNamespace(reload_weights=reload_weights)),
            remove_lora=lambda lora_id: self.events.append(("remove_lora", lora_id)),
        )
        FakeEngine.instances.append(self)

    def reset_prefix_cache(self):
        self.events.append(("reset_prefix_cache",))

    def generate(self, prompts, params, use_tqdm=True, lora_request=None):
        self.events.append(("generate", [p["prompt_token_ids"] for p in prompts], params, lora_request))
        outputs = []
        for prompt, p in zip(prompts, params):
            last = prompt["prompt_token_ids"][-1]
            samples = [completion(i, [last + i, EOS], [-0.5, -0.25], decoys=False) for i in range(p.n)]
            outputs.append(SimpleNamespace(outputs=samples))
        return outputs


FAKE_API = VLLMApi(LLM=FakeEngine, SamplingParams=lambda **kw: SimpleNamespace(**kw),
                   LoRARequest=lambda name, lora_id, path: SimpleNamespace(lora_name=name, lora_int_id=lora_id, lora_path=path))


def tiny_llama(tied: bool = False) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=64, max_position_embeddings=64, tie_word_embeddings=tied)
    return LlamaForCausalLM(config)


def sample(sampler, model, **overrides):
    options = dict(group_size=2, max_new_tokens=4, eos_token_ids=[EOS], pad_token_id=0, temperature=1.0,
                   prompt_seeds=[11, 12])
    options.update(overrides)
    return sampler(model, [[1, 5], [1, 9, 10]], **options)


def names(events):
    return [e[0] for e in events]


def test_sampling_parameters_follow_sample_groups_meaning(monkeypatch):
    monkeypatch.setattr(FakeEngine, "instances", [])
    model = tiny_llama()
    sampler = VLLMSampler(api=FAKE_API, gpu_memory_utilization=0.25, max_model_len=40)
    batch = sample(sampler, model, top_k=0, top_p=0.9)
    engine = FakeEngine.instances[0]
    _, prompts, params, lora = engine.events[-1]
    assert prompts == [[1, 5], [1, 9, 10]] and lora is None
    first = vars(params[0])
    # n = G per prompt; stop exactly at our EOS list (the model's own EOS ignored); top-k 0 is
    # vLLM's -1 (off); the sampled token's log-prob only; each prompt its own seed
    assert first["n"] == 2 and first["stop_token_ids"] == [EOS] and first["ignore_eos"] is True
    assert first["top_k"] == -1 and first["top_p"] == 0.9 and first["temperature"] == 1.0
    assert first["max_tokens"] == 4 and first["logprobs"] == 0 and first["detokenize"] is False
    assert [p.seed for p in params] == [11, 12]
    assert engine.options["gpu_memory_utilization"] == 0.25 and engine.options["max_model_len"] == 40
    assert engine.options["logprobs_mode"] == "raw_logprobs" and engine.options["skip_tokenizer_init"] is True
    assert engine.options["distributed_executor_backend"] == "external_launcher"
    assert batch.completion_ids == [[5, EOS], [6, EOS], [10, EOS], [11, EOS]]
    greedy = sample(sampler, model, temperature=0.0)
    assert [p.n for p in engine.events[-1][2]] == [1, 1]
    assert greedy.completion_ids == [[5, EOS], [5, EOS], [10, EOS], [10, EOS]]


def test_full_weights_are_loaded_into_the_engine_only_after_they_change(monkeypatch):
    monkeypatch.setattr(FakeEngine, "instances", [])
    model = tiny_llama()
    sampler = VLLMSampler(api=FAKE_API)
    sample(sampler, model)
    engine = FakeEngine.instances[0]
    # the engine starts from a directory holding the current weights under Hugging Face names
    start = Path(engine.options["model"])
    config = json.loads((start / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    saved = load_file(str(start / "model.safetensors"))
    assert saved.keys() == dict(model.named_parameters()).keys()
    assert names(engine.events) == ["init", "generate"]

    sample(sampler, model)  # unchanged weights: nothing to send
    assert names(engine.events) == ["init", "generate", "generate"]

    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(input_ids=torch.tensor([[1, 2, 3]])).logits.sum().backward()
    optimizer.step()
    sample(sampler, model)
    assert names(engine.events)[3:] == ["reload_weights", "reset_prefix_cache", "generate"]
    sent = engine.events[3][1]
    assert sent.keys() == saved.keys()
    for name, param in model.named_parameters():
        assert torch.equal(sent[name], param.detach()), name
    assert not torch.equal(sent["model.embed_tokens.weight"], saved["model.embed_tokens.weight"])
    with pytest.raises(ValueError, match="serves another model"):
        sample(sampler, tiny_llama())


def test_lora_adapters_go_by_a_new_request_each_time_and_old_ones_are_removed(monkeypatch):
    from peft import LoraConfig, get_peft_model

    monkeypatch.setattr(FakeEngine, "instances", [])
    model = get_peft_model(tiny_llama(), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0))
    sampler = VLLMSampler(api=FAKE_API)
    sample(sampler, model)
    engine = FakeEngine.instances[0]
    assert engine.options["enable_lora"] is True and engine.options["max_lora_rank"] == 8
    base = load_file(str(Path(engine.options["model"]) / "model.safetensors"))
    assert base.keys() == dict(tiny_llama().named_parameters()).keys()  # plain names, no adapter
    assert names(engine.events) == ["init", "reset_prefix_cache", "generate"]
    first = engine.events[-1][3]
    assert first.lora_int_id == 1 and (Path(first.lora_path) / "adapter_config.json").is_file()

    sample(sampler, model)  # unchanged adapter: the same request, nothing saved
    assert names(engine.events)[3:] == ["generate"] and engine.events[-1][3] is first

    with torch.no_grad():
        next(p for n, p in model.named_parameters() if "lora_B" in n).add_(0.5)
    sample(sampler, model)
    assert names(engine.events)[4:] == ["remove_lora", "reset_prefix_cache", "generate"]
    assert engine.events[4][1] == 1
    second = engine.events[-1][3]
    assert second.lora_int_id == 2 and second.lora_name != first.lora_name
    assert not Path(first.lora_path).exists() and Path(second.lora_path).is_dir()
    saved = load_file(str(Path(second.lora_path) / "adapter_model.safetensors"))
    assert any(torch.equal(t, p.detach()) for t in saved.values() for n, p in model.named_parameters() if "lora_B" in n)


def test_base_weights_of_a_lora_model_carry_the_plain_names():
    from peft import LoraConfig, get_peft_model

    plain = tiny_llama()
    wrapped = get_peft_model(tiny_llama(), LoraConfig(r=4, target_modules="all-linear"))
    assert [n for n, _ in base_weights(wrapped)] == [n for n, _ in base_weights(plain)]
    assert [lora_rank_slot(r) for r in (1, 8, 9, 16, 64, 65)] == [8, 8, 16, 16, 64, 128]


@pytest.mark.skipif(HAS_VLLM, reason="checks the message shown when vllm is missing")
def test_without_vllm_the_backend_says_how_to_install_it(tmp_path):
    from labelrl.rollout import BACKENDS
    from labelrl.train.config import RLConfig

    with pytest.raises(ValidationError, match=r"backend='vllm' needs the vllm package.*pip install 'labelrl\[vllm\]'"):
        RLConfig(data="sms-spam", out=tmp_path, backend="vllm")
    with pytest.raises(ValueError, match=r"pip install 'labelrl\[vllm\]'.*; choose one of hf, labelrl"):
        BACKENDS.get("vllm")
    with pytest.raises(ValueError, match=r"pip install 'labelrl\[vllm\]'"):
        VLLMSampler()(tiny_llama(), [[1, 2]], group_size=2, max_new_tokens=2, eos_token_ids=[EOS], pad_token_id=0)


def test_a_tied_head_is_written_untied_and_resent_with_the_embedding(monkeypatch):
    """vLLM's in-place reload does not re-tie a head that shares the embedding's weight (on its
    CPU platform the head kept sampling from the old embedding): the engine model is untied,
    and every sync sends the head under its own name, equal to the trained embedding."""
    monkeypatch.setattr(FakeEngine, "instances", [])
    model = tiny_llama(tied=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    sampler = VLLMSampler(api=FAKE_API)
    sample(sampler, model)
    engine = FakeEngine.instances[0]
    start = Path(engine.options["model"])
    assert json.loads((start / "config.json").read_text())["tie_word_embeddings"] is False
    saved = load_file(str(start / "model.safetensors"))
    assert saved.keys() == dict(model.named_parameters()).keys() | {"lm_head.weight"}
    assert torch.equal(saved["lm_head.weight"], saved["model.embed_tokens.weight"])
    assert model.config.tie_word_embeddings is True  # the policy itself stays tied

    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    model(input_ids=torch.tensor([[1, 2, 3]])).logits.sum().backward()
    optimizer.step()
    sample(sampler, model)
    sent = engine.events[-3][1]
    assert torch.equal(sent["lm_head.weight"], model.model.embed_tokens.weight.detach())
    assert not torch.equal(sent["lm_head.weight"], saved["lm_head.weight"])


def test_on_vllms_cpu_platform_the_engine_is_eager_with_a_stated_kv_cache(monkeypatch):
    monkeypatch.setattr(FakeEngine, "instances", [])
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    cpu_api = VLLMApi(FAKE_API.LLM, FAKE_API.SamplingParams, FAKE_API.LoRARequest, on_cpu=True)
    model = tiny_llama()
    sampler = VLLMSampler(api=cpu_api, max_model_len=40, max_sequences=6)
    sample(sampler, model, dtype=torch.bfloat16)
    engine = FakeEngine.instances[0]
    # 2 (keys, values) · 1 layer · 2 kv heads · head_dim 8 · 2 bytes (bf16) · 6 sequences · 40 positions
    # = 7,680 bytes, doubled = 15,360 < the 64 MiB floor
    assert engine.options["kv_cache_memory_bytes"] == 64 * 2**20 and engine.options["enforce_eager"] is True
    assert engine.options["dtype"] == "bfloat16"
    big = SimpleNamespace(num_attention_heads=9, hidden_size=576, num_key_value_heads=3, num_hidden_layers=30)
    # SmolLM2: 2 · 30 layers · 3 kv heads · 64 · 4 bytes = 46,080 bytes a position; · 16 · 1,000, doubled
    assert kv_cache_bytes(big, sequences=16, tokens=1000, dtype=torch.float32) == 2 * 46_080 * 16_000
    # the launcher variables exist while the engine starts, and are gone afterwards
    assert engine.env["RANK"] == "0" and engine.env["WORLD_SIZE"] == "1" and engine.env["MASTER_PORT"].isdigit()
    assert all(key not in os.environ for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))
    gpu = VLLMSampler(api=FAKE_API)
    sample(gpu, model, dtype=torch.float32)
    assert "kv_cache_memory_bytes" not in FakeEngine.instances[1].options
    assert FakeEngine.instances[1].options["dtype"] == "float32"


def test_a_launchers_own_variables_are_kept(monkeypatch):
    monkeypatch.setattr(FakeEngine, "instances", [])
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.delenv("MASTER_PORT", raising=False)
    sample(VLLMSampler(api=FAKE_API), tiny_llama())
    assert FakeEngine.instances[0].env["RANK"] == "3" and FakeEngine.instances[0].env["WORLD_SIZE"] == "4"
    assert os.environ["RANK"] == "3" and os.environ["WORLD_SIZE"] == "4" and "MASTER_PORT" not in os.environ


def test_close_shuts_the_engine_and_deletes_its_files(monkeypatch):
    monkeypatch.setattr(FakeEngine, "instances", [])
    model = tiny_llama()
    sampler = VLLMSampler(api=FAKE_API)
    sample(sampler, model)
    workdir = Path(FakeEngine.instances[0].options["model"]).parent
    assert workdir.is_dir()
    sampler.close()
    assert sampler.llm is None and not workdir.exists()
    sampler.close()  # twice is harmless
    sample(sampler, model)  # the next call starts a new engine
    assert len(FakeEngine.instances) == 2


def test_engine_dtype_names_and_refuses_others():
    assert [engine_dtype(d) for d in (None, torch.float32, torch.bfloat16)] == ["auto", "float32", "bfloat16"]
    with pytest.raises(ValueError, match="dtype=torch.float64: .*choose --precision fp32 or bf16"):
        engine_dtype(torch.float64)


def test_a_vllm_without_reload_weights_gets_load_weights_on_the_runners_model(monkeypatch):
    from labelrl.rollout.vllm import reload_engine_weights

    loaded = []
    runner = SimpleNamespace(model=SimpleNamespace(load_weights=lambda weights: loaded.append(dict(weights))))
    older = SimpleNamespace(llm_engine=SimpleNamespace(model_executor=SimpleNamespace(
        driver_worker=SimpleNamespace(model_runner=runner))))
    reload_engine_weights(older, iter([("w", torch.ones(2))]))
    assert list(loaded[0]) == ["w"]
    with pytest.raises(ValueError, match="cannot reach the vLLM engine's worker.*--lora"):
        reload_engine_weights(SimpleNamespace(llm_engine=SimpleNamespace()), iter([]))
