"""The weights a fast decode step reads, gathered from a (possibly LoRA-wrapped) Llama, Qwen2,
Qwen3 or Gemma 3 model (the families ``fast_decode.unsupported_reason`` accepts), and the cache
that keeps their packed base between sampling calls.

Per projection the step computes ``x·Wᵀ`` with W packed into oneDNN's blocked layout (q/k/v
concatenated into one matrix, gate/up into another), plus, for a LoRA adapter being
trained, a separate low-rank update ``(x·Aᵀ)·Bᵀ`` (the product and the update are
``labelrl.rollout.projection``'s; this module decides what is packed, folded and kept):

* an adapter that trains (RL with LoRA) changes every step while the base does not, so the
  packed base is kept across sampling calls and each call gathers only the adapter's factors
  (about 2% of SmolLM2's weights at r=16), instead of re-folding and re-packing every weight
  (0.2–0.5 s per call on 2 cores); the price is two small products per projection per step;
* an adapter that is frozen (a saved adapter being evaluated) is folded into W
  (W + scale·B·A, peft's ``get_delta_weight``) and the packed result is kept as well;
* base weights that train (full fine-tuning) change every step: packed anew per call and
  never kept.

The cache is keyed on the compute dtype and, for every packed weight, its storage pointer
and version counter (bumped by in-place updates such as ``optimizer.step`` or
``load_state_dict``), the adapters merged into it (peft merges through ``weight.data``, which
the version counter does not see) and the folded adapters' factors and scales. An edit
through ``.data`` outside peft's merge is not seen: call ``clear_fused_cache`` after one.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple, Optional

import torch
from torch import nn

from labelrl.rollout.projection import LowRank, PackedLinear, Projection, ProjectionTensors, block_layout

LLAMA_PROJECTIONS = (("self_attn", ("q_proj", "k_proj", "v_proj")), ("self_attn", ("o_proj",)),
                     ("mlp", ("gate_proj", "up_proj")), ("mlp", ("down_proj",)))
# model → {compute dtype: (key, packed weights)}; a run uses one dtype, a benchmark may alternate two
_CACHE: "weakref.WeakKeyDictionary[nn.Module, dict]" = weakref.WeakKeyDictionary()


@dataclass
class LayerWeights:
    """One decoder layer. Norm weights are the factor the normalised vector is multiplied by:
    w as stored, or 1 + w for Gemma's zero-centred norms."""

    qkv: Projection  # [(H + 2·KV)·D, hidden] rows: q heads, then k heads, then v heads (+ Qwen2's bias)
    o: Projection  # [hidden, H·D]
    gate_up: Projection  # [2·I, hidden] rows: gate, then up
    down: Projection  # [hidden, I]
    input_norm: torch.Tensor  # [hidden], fp32 as stored
    mlp_norm: torch.Tensor  # [hidden], the norm before the MLP (Llama's "post_attention_layernorm")
    qk_norm: torch.Tensor | None = None  # [H + KV, D] Qwen3 / Gemma 3: the q_norm weight of each query
    # head, then the k_norm weight of each key head (an RMSNorm over each head, before RoPE)
    attn_out_norm: torch.Tensor | None = None  # [hidden] Gemma 3: norm of the attention output
    mlp_out_norm: torch.Tensor | None = None  # [hidden] Gemma 3: norm of the MLP output
    sliding_window: int | None = None  # a query sees the last `sliding_window` slots, itself included
    rope_key: str | None = None  # Gemma 3: the layer type whose RoPE table this layer uses

    @property
    def tensors(self) -> LayerTensors:
        return LayerTensors(self.qkv.tensors, self.o.tensors, self.gate_up.tensors, self.down.tensors, self.input_norm,
                            self.mlp_norm, self.qk_norm, self.attn_out_norm, self.mlp_out_norm)


# Functional form, as ProjectionTensors (labelrl.rollout.projection).
LayerTensors = NamedTuple("LayerTensors", [
    ("qkv", ProjectionTensors), ("o", ProjectionTensors), ("gate_up", ProjectionTensors), ("down", ProjectionTensors),
    ("input_norm", torch.Tensor), ("mlp_norm", torch.Tensor), ("qk_norm", Optional[torch.Tensor]),
    ("attn_out_norm", Optional[torch.Tensor]), ("mlp_out_norm", Optional[torch.Tensor]),
])
LayerTensors.__doc__ = """A layer's tensors (``LayerWeights`` without its Python-side fields), for the decode
step's scripted layers."""


@dataclass
class LlamaWeights:
    """Everything a decode step reads, gathered from a (possibly LoRA-wrapped) model of a
    Llama-like family: the Llama defaults below, and what Qwen3 and Gemma 3 add."""

    layers: list[LayerWeights]
    embed: torch.Tensor  # [V, hidden]
    final_norm: torch.Tensor  # [hidden]
    lm_head: Projection  # [V, hidden], fp32 whatever the compute dtype: logits are fp32
    eps: float  # RMSNorm epsilon
    n_heads: int
    n_kv_heads: int
    head_dim: int
    rotary: nn.Module  # the model's rotary embedding module
    dtype: torch.dtype  # compute dtype of the projections and the KV cache
    base_cached: bool = False  # the packed base came from the cache (nothing was re-packed)
    attn_scale: float | None = None  # query scale; None: head_dim^-½ (Gemma 3: query_pre_attn_scalar^-½)
    embed_scale: torch.Tensor | None = None  # Gemma 3: embeddings × √hidden (the module's fp32 buffer)
    activation: str = "silu"  # of the gate: "silu" (SwiGLU) or "gelu_tanh" (Gemma 3's GeGLU)
    logit_softcap: float | None = None  # Gemma 3: logits ← cap · tanh(logits / cap)
    # Where the q/k norm rounds to the compute dtype: Qwen3 rounds the normalised vector and
    # then multiplies by w (in fp32); Gemma multiplies by 1 + w and rounds the product.
    round_norm_after_weight: bool = False

    @cached_property
    def layer_tensors(self) -> list[LayerTensors]:
        """Each layer's tensors, gathered once for the decode steps that read them."""
        return [layer.tensors for layer in self.layers]

    @property
    def has_low_rank(self) -> bool:
        """Whether a step pays for low-rank updates (a trained adapter not folded in)."""
        projections = [p for layer in self.layers for p in (layer.qkv, layer.o, layer.gate_up, layer.down)]
        return any(p.low_rank is not None for p in projections + [self.lm_head])


def base_model(model: nn.Module) -> nn.Module:
    model = getattr(model, "module", model)  # DistributedDataParallel-style wrapper
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def frozen_weight(module: nn.Module) -> torch.Tensor:
    """The projection's own weight (a LoRA wrapper's base layer weight)."""
    return module.weight if type(module) is nn.Linear else module.base_layer.weight


def _active_lora(module: nn.Module) -> list[str]:
    """Names of the adapters whose update is added to this projection's output (not merged)."""
    if type(module) is nn.Linear or module.merged or module.disable_adapters:
        return []
    return [name for name in module.active_adapters if name in module.lora_A]


def _trains(module: nn.Module, name: str) -> bool:
    return module.lora_A[name].weight.requires_grad or module.lora_B[name].weight.requires_grad


def folded_adapters(module: nn.Module) -> list[str]:
    """Active adapters with frozen factors (a loaded adapter being evaluated): folded into
    the packed weight, which then stays valid until something changes."""
    return [name for name in _active_lora(module) if not _trains(module, name)]


def separate_adapters(module: nn.Module) -> list[str]:
    """Active adapters being trained (they change every step): applied as a low-rank update."""
    return [name for name in _active_lora(module) if _trains(module, name)]


def low_rank(modules: list[nn.Module]) -> LowRank | None:
    """The low-rank update of the concatenation of ``modules`` from their trained adapters
    (None: none). peft's own definition: Δy = scaling · B(A(x)) per adapter (``lora/layer.py``,
    ``Linear.forward``); fan_in_fan_out layers are refused by ``unsupported_reason``. Bᵀ is
    stored transposed and contiguous, [R, out] or [k, r, w] (``LowRank``), the layout the small
    product reads fastest."""
    a_blocks, b_blocks = [], []
    for module in modules:
        names = separate_adapters(module)
        a_blocks += [module.lora_A[name].weight for name in names]
        # one member's adapters side by side: its output rows, their rank columns
        b_blocks.append(torch.cat([module.lora_B[name].weight * module.scaling[name] for name in names], dim=1)
                        if names else frozen_weight(module).new_zeros((frozen_weight(module).shape[0], 0)))
    if not a_blocks:
        return None
    a = torch.cat(a_blocks).float()  # fp32 whatever the compute dtype (see LowRank)
    layout = block_layout([b.shape[0] for b in b_blocks], [b.shape[1] for b in b_blocks])
    if layout is not None and len(layout[1]) == len(modules):  # each member one block
        return LowRank(a=a, blocks=torch.stack([b.t() for b in b_blocks]).float().contiguous())
    return LowRank(a=a, b_t=torch.block_diag(*b_blocks).t().float().contiguous())


def frozen_bias(module: nn.Module) -> torch.Tensor | None:
    """The projection's bias (a LoRA wrapper's base layer bias; LoRA leaves it as it is)."""
    return module.bias if type(module) is nn.Linear else module.base_layer.bias


def _fused_bias(group: list[nn.Module], dtype: torch.dtype) -> torch.Tensor | None:
    """The concatenated biases of a fused group (zeros for a member without one), or None."""
    biases = [frozen_bias(m) for m in group]
    if all(b is None for b in biases):
        return None
    return torch.cat([b if b is not None else frozen_weight(m).new_zeros(frozen_weight(m).shape[0])
                      for b, m in zip(biases, group)]).to(dtype)


def _groups(layer: nn.Module) -> list[list[nn.Module]]:
    return [[getattr(getattr(layer, part), name) for name in names] for part, names in LLAMA_PROJECTIONS]


def _packed_modules(base: nn.Module) -> list[nn.Module]:
    return [m for layer in base.model.layers for group in _groups(layer) for m in group] + [base.lm_head]


def _tensor_key(t: torch.Tensor) -> tuple:
    return t.data_ptr(), t._version


def _cache_key(base: nn.Module, dtype: torch.dtype) -> tuple | None:
    """The cache key of the packed weights (None: a packed weight is trainable, never cached):
    per projection its base weight, the adapters merged into it, and each folded adapter's
    factors and scale."""
    parts: list = [dtype]
    for module in _packed_modules(base):
        weight, bias = frozen_weight(module), frozen_bias(module)
        if weight.requires_grad or (bias is not None and bias.requires_grad):
            return None
        folded = tuple((name, _tensor_key(module.lora_A[name].weight), _tensor_key(module.lora_B[name].weight),
                        float(module.scaling[name])) for name in folded_adapters(module))
        bias_key = None if bias is None else _tensor_key(bias)
        parts.append((_tensor_key(weight), bias_key, tuple(getattr(module, "merged_adapters", ())), folded))
    return tuple(parts)


def effective_weight(module: nn.Module, fold_all: bool = False) -> torch.Tensor:
    """The base weight plus the folded adapters' scale·B·A (peft's ``get_delta_weight``);
    ``fold_all`` folds the trained adapters too."""
    weight = frozen_weight(module)
    names = _active_lora(module) if fold_all else folded_adapters(module)
    deltas = [module.get_delta_weight(name) for name in names]
    return weight + sum(deltas) if deltas else weight


def _pack(base: nn.Module, rows: int, dtype: torch.dtype, fold_all: bool = False) -> list:
    """[(qkv, o, gate_up, down) PackedLinear per layer] + [lm_head PackedLinear, fp32]."""
    packed = []
    for layer in base.model.layers:
        packed.append(tuple(PackedLinear(torch.cat([effective_weight(m, fold_all) for m in group]).to(dtype), rows,
                                         _fused_bias(group, dtype))
                            for group in _groups(layer)))
    packed.append(PackedLinear(effective_weight(base.lm_head, fold_all).float(), rows))
    return packed


def _cached_pack(base: nn.Module, dtype: torch.dtype) -> tuple[tuple | None, list | None]:
    """The cache key of ``base`` in ``dtype`` (None: nothing is kept) and its cached pack while
    still valid (None: none, or stale)."""
    key = _cache_key(base, dtype)
    hit = _CACHE.get(base, {}).get(dtype)
    return key, (hit[1] if key is not None and hit is not None and hit[0] == key else None)


def packed_weights(base: nn.Module, rows: int, dtype: torch.dtype) -> tuple[list, bool]:
    """The packed weights, from the cache when still valid; and whether they were."""
    key, cached = _cached_pack(base, dtype)
    if cached is not None:
        return cached, True
    entries = _CACHE.setdefault(base, {})
    entries.pop(dtype, None)  # stale: free it before packing anew
    packed = _pack(base, rows, dtype)
    if key is not None:
        entries[dtype] = (key, packed)
    return packed, False


def kept_bytes(model: nn.Module, dtype: torch.dtype) -> int:
    """Bytes sampling in ``dtype`` will keep between calls that it does not keep yet: the packed
    base (every decoder projection in ``dtype``, the vocabulary projection in fp32; oneDNN's
    blocked layout adds no more than its padding). 0 when the cache already holds a valid pack,
    and when nothing is kept (a base that trains is packed anew per call and freed)."""
    base = base_model(model)
    key, cached = _cached_pack(base, dtype)
    if key is None or cached is not None:
        return 0
    size = torch.empty((), dtype=dtype).element_size()
    return sum(frozen_weight(m).numel() for m in _packed_modules(base)[:-1]) * size + frozen_weight(base.lm_head).numel() * 4


def clear_fused_cache(model: nn.Module | None = None) -> None:
    """Drop the packed base of ``model`` (of every model when None)."""
    if model is None:
        _CACHE.clear()
    else:
        _CACHE.pop(base_model(model), None)


def fuse_llama(model: nn.Module, rows: int = 8, dtype: torch.dtype = torch.float32,
               fold_all: bool = False) -> LlamaWeights:
    """Gather the weights of a model ``unsupported_reason`` accepts for steps of about
    ``rows`` rows (a layout hint: any row count works), projections and KV cache in
    ``dtype`` (fp32 or bf16), the vocabulary projection in fp32. ``fold_all`` folds trained
    adapters into the packed weights too (packed anew, not kept): no low-rank products per
    step. Call it under ``torch.inference_mode`` so the concatenations record no autograd
    history."""
    base = base_model(model)
    config = base.config
    gemma = is_gemma3(base)
    packed, cached = (_pack(base, rows, dtype, fold_all=True), False) if fold_all else packed_weights(base, rows, dtype)
    # Gemma's norms multiply by 1 + w (Gemma3RMSNorm.forward: `* (1.0 + self.weight.float())`).
    norm = (lambda module: 1.0 + module.weight.float()) if gemma else (lambda module: module.weight)
    optional = (lambda layer, name: norm(getattr(layer, name)) if hasattr(layer, name) else None)
    n_heads, n_kv = config.num_attention_heads, config.num_key_value_heads
    layer_types = getattr(config, "layer_types", None) or ["full_attention"] * len(base.model.layers)
    layers = []
    for layer, projections, layer_type in zip(base.model.layers, packed[:-1], layer_types):
        updates = [None if fold_all else low_rank(group) for group in _groups(layer)]
        qkv, o, gate_up, down = (Projection(p, u) for p, u in zip(projections, updates))
        layers.append(LayerWeights(
            qkv=qkv, o=o, gate_up=gate_up, down=down, input_norm=norm(layer.input_layernorm),
            mlp_norm=norm(layer.pre_feedforward_layernorm if gemma else layer.post_attention_layernorm),
            qk_norm=_stacked_head_norms(optional(layer.self_attn, "q_norm"), optional(layer.self_attn, "k_norm"),
                                        n_heads, n_kv),
            attn_out_norm=norm(layer.post_attention_layernorm) if gemma else None,
            mlp_out_norm=optional(layer, "post_feedforward_layernorm"),
            sliding_window=getattr(layer.self_attn, "sliding_window", None), rope_key=layer_type if gemma else None,
        ))
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return LlamaWeights(
        layers=layers, embed=base.model.embed_tokens.weight, final_norm=norm(base.model.norm),
        lm_head=Projection(packed[-1], None if fold_all else low_rank([base.lm_head])),
        eps=float(config.rms_norm_eps), n_heads=n_heads, n_kv_heads=n_kv,
        head_dim=head_dim, rotary=base.model.rotary_emb, dtype=dtype, base_cached=cached,
        attn_scale=config.query_pre_attn_scalar ** -0.5 if gemma else None,
        embed_scale=base.model.embed_tokens.embed_scale if gemma else None,
        activation="gelu_tanh" if gemma else "silu", logit_softcap=getattr(config, "final_logit_softcapping", None),
        round_norm_after_weight=gemma,
    )


def _stacked_head_norms(q_norm, k_norm, n_heads: int, n_kv_heads: int) -> torch.Tensor | None:
    if q_norm is None:
        return None
    return torch.cat([q_norm.expand(n_heads, -1), k_norm.expand(n_kv_heads, -1)])


def is_gemma3(base: nn.Module) -> bool:
    from transformers import Gemma3ForCausalLM

    return type(base) is Gemma3ForCausalLM
