"""The ``vllm`` rollout backend: vLLM samples the B×G completions (GPU machines).

Install with ``pip install 'labelrl[vllm]'``; vLLM needs a CUDA GPU. One engine runs inside
each training process ("colocated", as TRL's ``vllm_mode="colocate"``): vLLM's
``external_launcher`` executor keeps the engine in-process, so under ``accelerate launch``
every process drives its own engine on its own GPU and samples its own share of prompts.

The engine starts from the policy as it is at the first call, written to a temporary
directory (config and weights; no tokenizer: prompts are token ids and the trainer decodes).
Before each call the current policy is synced when its trainable parameters changed:

* full fine-tuning: every weight goes to ``load_weights`` on the engine's model runner, then
  the prefix cache (keys/values computed with the old weights) is reset;
* LoRA: the adapter is saved to a fresh directory and sampled through a new ``LoRARequest``
  (a new id, since vLLM caches adapters by id); the previous adapter is removed from the
  engine and its directory deleted. The base weights never change, so they are not resent.

Samples match ``sample_groups``: G per prompt (``SamplingParams(n=G)``; greedy asks for one
and repeats it), stopping exactly at ``eos_token_ids`` (the model's own EOS list is ignored),
per-prompt seeds, and the log-prob of each sampled token under the raw temperature-1 policy
(``logprobs_mode="raw_logprobs"``, ``logprobs=0``: the sampled token only). vLLM computes in
the engine's dtype with its own kernels, so its samples and log-probs are close to, not
equal to, the trainer's; the trainer recomputes log-probs in its own pass anyway.
"""

from __future__ import annotations

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

from labelrl.rollout.sampler import RolloutBatch, check_prompt_seeds, check_sampling_args, make_generator, normalise_eos

PIP_HINT = "pip install 'labelrl[vllm]'"


@dataclass(frozen=True)
class VLLMApi:
    """The vLLM entry points the backend uses (tests pass stand-ins)."""

    LLM: Callable[..., Any]
    SamplingParams: Callable[..., Any]
    LoRARequest: Callable[..., Any]


def load_vllm_api() -> VLLMApi:
    try:
        from vllm import LLM, SamplingParams
        from vllm.lora.request import LoRARequest
    except ImportError as exc:
        raise ValueError(
            f"rollout backend 'vllm' needs the vllm package, which cannot be imported ({exc}); "
            f"{PIP_HINT} on a machine with a CUDA GPU, or use --backend labelrl"
        ) from None
    return VLLMApi(LLM, SamplingParams, LoRARequest)


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


def write_engine_model(model: torch.nn.Module, directory: Path) -> Path:
    """A Hugging Face directory (config.json, model.safetensors) vLLM can start from."""
    from safetensors.torch import save_file

    base = model.get_base_model() if is_lora(model) else model
    config = base.config.to_dict()
    config.pop("quantization_config", None)  # a GGUF-loaded model's weights are plain tensors by now
    if not config.get("architectures"):
        config["architectures"] = [type(base).__name__]
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2, default=str), encoding="utf-8")
    tensors = {name: t.contiguous().cpu().clone() for name, t in base_weights(model)}
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory


def lora_rank_slot(rank: int) -> int:
    """vLLM's ``max_lora_rank`` takes a few sizes (8, 16, 32, …): the smallest one ≥ rank."""
    slot = 8
    while slot < rank:
        slot *= 2
    return slot


def ensure_launcher_env() -> None:
    """``external_launcher`` reads the torch.distributed variables; a plain single-process run
    has none, so it gets those of a world of one (a launcher's own values are kept)."""
    defaults = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(probe.getsockname()[1])


def engine_model(llm) -> Any:
    """The model inside an in-process vLLM engine (the path TRL's colocate mode uses)."""
    try:
        return llm.llm_engine.model_executor.driver_worker.model_runner.model
    except AttributeError:
        raise ValueError(
            "cannot reach the vLLM engine's model to load new weights (llm.llm_engine.model_executor."
            "driver_worker.model_runner.model); use a vLLM version whose LLM runs in-process with "
            "distributed_executor_backend='external_launcher', or train with --lora (adapters sync by LoRARequest)"
        ) from None


class VLLMSampler:
    """A rollout backend with ``sample_groups``' signature, backed by one vLLM engine.

    ``gpu_memory_utilization`` is the share of the GPU the engine may take (weights and KV
    cache); the rest stays for training. ``max_model_len`` caps prompt + completion tokens
    (default: the model's context). ``engine_options`` go to ``vllm.LLM`` as they are.
    """

    def __init__(self, *, gpu_memory_utilization: float = 0.3, max_model_len: int | None = None,
                 engine_options: dict | None = None, api: VLLMApi | None = None) -> None:
        self.gpu_memory_utilization = gpu_memory_utilization
        self.max_model_len = max_model_len
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
        is accepted for the common interface and not used: the engine computes in its own dtype
        (``engine_options["dtype"]``, vLLM's default otherwise)."""
        check_sampling_args(prompt_ids, group_size=group_size, max_new_tokens=max_new_tokens,
                            pad_token_id=pad_token_id, temperature=temperature, top_p=top_p, top_k=top_k)
        if prompt_seeds is None:
            rng = make_generator(seed, generator)
            prompt_seeds = torch.randint(0, 2**31 - 1, (len(prompt_ids),), generator=rng).tolist()
        else:
            check_prompt_seeds(prompt_seeds, len(prompt_ids), seed, generator)
        started = time.perf_counter()
        self.sync(model)
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

    def sync(self, model: torch.nn.Module) -> None:
        """Start the engine on the first call; afterwards push the policy when it changed."""
        if self.api is None:
            self.api = load_vllm_api()
        if self.llm is None:
            self._start(model)
        elif self._model_ref() is not model:
            raise ValueError("this VLLMSampler's engine serves another model; make one VLLMSampler per policy")
        fingerprint = _fingerprint(model)
        if fingerprint == self._synced:
            return
        if is_lora(model):
            self._push_adapter(model)
        else:
            engine_model(self.llm).load_weights(base_weights(model))
            self.llm.reset_prefix_cache()
        self._synced = fingerprint

    def _start(self, model: torch.nn.Module) -> None:
        self._workdir = Path(tempfile.mkdtemp(prefix="labelrl-vllm-"))
        weakref.finalize(self, shutil.rmtree, str(self._workdir), True)
        directory = write_engine_model(model, self._workdir / "base")
        options = dict(
            model=str(directory), skip_tokenizer_init=True, dtype="auto", seed=0,
            gpu_memory_utilization=self.gpu_memory_utilization, enable_prefix_caching=True,
            distributed_executor_backend="external_launcher", logprobs_mode="raw_logprobs",
        )
        if self.max_model_len is not None:
            options["max_model_len"] = self.max_model_len
        if is_lora(model):
            rank = max(cfg.r for cfg in model.peft_config.values())
            options.update(enable_lora=True, max_loras=1, max_lora_rank=lora_rank_slot(rank))
        options.update(self.engine_options)
        ensure_launcher_env()
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


def _fingerprint(model: torch.nn.Module) -> tuple[int, ...]:
    """Version counters of the trainable parameters: every in-place update (optimizer step,
    checkpoint load) bumps them, so an unchanged tuple means unchanged weights."""
    return tuple(p._version for p in model.parameters() if p.requires_grad)
