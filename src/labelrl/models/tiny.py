"""Built-in tiny models with fixed-seed random weights, one per supported architecture family.

Each is built offline from its transformers config class with the SmolLM2 tokenizer (so every
prompt, chat template and label tokenises the same way for all of them), from one seed, in a
``fork_rng`` block: the same weights on every load, the caller's RNG untouched. They exist to
run every labelrl path (sampler, fast decode, training passes, scoring, export, bf16) on the
architectures users bring, in seconds:

- ``tiny-random``: Llama (SmolLM2's family): RMSNorm, SwiGLU, RoPE, GQA, no biases.
- ``tiny-qwen2``: Qwen2 / Qwen2.5: Llama plus biases on the q/k/v projections.
- ``tiny-qwen3``: Qwen3: no biases, an RMSNorm over each query and key head (before RoPE), and
  a head dimension that is not hidden/heads (as in Qwen3-0.6B: 16 heads × 128 > 1024).
- ``tiny-gemma3``: text-only ``Gemma3ForCausalLM``: (1 + w) RMSNorms, four norms per layer
  (around attention and around the MLP), q/k norms, embeddings scaled by √hidden, GELU-tanh
  MLP, queries scaled by ``query_pre_attn_scalar``^-½ (not head_dim^-½), tanh soft-capping of
  the final logits, and a sliding-window layer (window 4, smaller than any test sequence) before
  a global one, each with its own RoPE base.

``tiny-random`` keeps transformers' default initialisation (its weights, and so every test
pinned to them, are unchanged). The other three then draw their norm weights and projection
biases at random too: transformers initialises norms to the identity and biases to zero, so a
path that forgot a q/k norm, used w instead of 1 + w, or dropped a bias would compute exactly
the same numbers as the model and pass any equality test.

Gemma 3's ``attn_logit_softcapping`` stays None: Gemma 3 replaced Gemma 2's attention soft-capping
with the q/k norms, and transformers 5.19's ``Gemma3Attention`` does not pass the value to its
attention function anyway.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import torch
import transformers

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

TINY_RANDOM = "tiny-random"
TINY_QWEN2 = "tiny-qwen2"
TINY_QWEN3 = "tiny-qwen3"
TINY_GEMMA3 = "tiny-gemma3"
TINY_SEED = 0
GEMMA3_SLIDING_WINDOW = 4  # tokens a sliding layer's query sees, itself included
# Standard deviation of the random norm weights (around 1, or around 0 for Gemma's 1 + w) and
# biases: about the size of a projection's output at init (0.02 · √64 · O(1)), so they matter.
PERTURB_STD = 0.1


@dataclass(frozen=True)
class TinySpec:
    """One built-in tiny model: its description, config and class."""

    summary: str
    config: Callable[[Any], "PretrainedConfig"]  # tokenizer → config
    # transformers' class, by name: importing a modeling module costs ~0.3 s, paid on use only
    model_class: str
    perturb: bool  # draw norm weights and biases at random (see the module docstring)


def _special_ids(tokenizer: Any) -> dict[str, int]:
    # Every family's config gets the tokenizer's own ids (Gemma3TextConfig defaults to Gemma's
    # pad 0 / eos 1 / bos 2, which in the SmolLM2 vocabulary are other tokens): generate() and
    # the generation config then stop and pad where the tokenizer does.
    return dict(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id)


def _common(tokenizer: Any) -> dict[str, Any]:
    return dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                tie_word_embeddings=True, **_special_ids(tokenizer))


def tiny_random_config(tokenizer: Any) -> "transformers.LlamaConfig":
    """The ``tiny-random`` architecture: 2 layers, hidden 64, 4 heads, 2 kv heads, tied embeddings."""
    return transformers.LlamaConfig(**_common(tokenizer))


def tiny_qwen2_config(tokenizer: Any) -> "transformers.Qwen2Config":
    """``tiny-qwen2``: hidden 64 in 2 heads of 32 and 1 kv head; Qwen2 always has q/k/v biases
    (none on o_proj). Qwen2 derives head_dim from hidden / heads, and vLLM's CPU attention takes
    head sizes 32, 64, …: with 2 heads the model runs on the vLLM CPU engine too."""
    return transformers.Qwen2Config(**{**_common(tokenizer), "num_attention_heads": 2, "num_key_value_heads": 1})


def tiny_qwen3_config(tokenizer: Any) -> "transformers.Qwen3Config":
    """``tiny-qwen3``: the tiny-random shape with head_dim 32 (4 × 32 = 128 ≠ hidden 64)."""
    return transformers.Qwen3Config(**_common(tokenizer), head_dim=32)


def tiny_gemma3_config(tokenizer: Any) -> "transformers.Gemma3TextConfig":
    """``tiny-gemma3``: a sliding layer (window 4, RoPE base 10⁴) then a global one (base 10⁶),
    head_dim 32, query scale 24^-½, final logits soft-capped at 30 (Gemma 2's value)."""
    return transformers.Gemma3TextConfig(
        **_common(tokenizer), head_dim=32, query_pre_attn_scalar=24, sliding_window=GEMMA3_SLIDING_WINDOW,
        layer_types=["sliding_attention", "full_attention"], final_logit_softcapping=30.0,
    )


TINY_MODELS: dict[str, TinySpec] = {
    TINY_RANDOM: TinySpec("3.2M-param Llama (2 layers, hidden 64) with fixed-seed random weights and the "
                          "SmolLM2 tokenizer, for tests and smoke runs", tiny_random_config, "LlamaForCausalLM", False),
    TINY_QWEN2: TinySpec("3.2M-param Qwen2 (hidden 64 in 2 heads of 32, 1 kv head, q/k/v biases), fixed-seed random weights, "
                         "SmolLM2 tokenizer, for tests and smoke runs", tiny_qwen2_config, "Qwen2ForCausalLM", True),
    TINY_QWEN3: TinySpec("3.2M-param Qwen3 (q/k RMSNorm, head_dim 32), fixed-seed random weights, SmolLM2 "
                         "tokenizer, for tests and smoke runs", tiny_qwen3_config, "Qwen3ForCausalLM", True),
    TINY_GEMMA3: TinySpec("3.2M-param text-only Gemma 3 (a sliding-window layer of 4 tokens and a global one), "
                          "fixed-seed random weights, SmolLM2 tokenizer, for tests and smoke runs",
                          tiny_gemma3_config, "Gemma3ForCausalLM", True),
}


def _perturb_norms_and_biases(model: torch.nn.Module) -> None:
    """Norm weights w ← w + N(0, σ²) and every bias ← N(0, σ²), σ = PERTURB_STD, in module order
    (so the draw is fixed by the seed)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.add_(torch.randn_like(param) * PERTURB_STD)
            elif name.endswith(".bias"):
                param.copy_(torch.randn_like(param) * PERTURB_STD)


def build_tiny(name: str, tokenizer: Any) -> "PreTrainedModel":
    """The float32 built-in tiny model ``name`` (a key of ``TINY_MODELS``), from seed ``TINY_SEED``.

    The seed is applied inside ``fork_rng``, so the caller's global RNG state is untouched and
    every call (with the same torch/transformers versions) returns identical weights.
    """
    spec = TINY_MODELS[name]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(TINY_SEED)
        model = getattr(transformers, spec.model_class)(spec.config(tokenizer))
        if spec.perturb:
            _perturb_norms_and_biases(model)
    set_builtin_name(model, name)
    return model


def set_builtin_name(model: torch.nn.Module, name: str) -> None:
    """Name ``model`` by its built-in spec. PEFT records ``model.name_or_path`` as an adapter's
    base; a built-in name keeps the adapter portable (a cache path would tie it to one machine)."""
    model.config._name_or_path = name
    model.name_or_path = name
