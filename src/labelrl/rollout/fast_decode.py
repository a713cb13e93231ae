"""A lean one-token decode step for Llama-architecture models (SmolLM2, ``tiny-random``).

At a few rows per step, decoding through the Hugging Face modules costs more in per-module
Python, mask building and cache bookkeeping than in arithmetic. This module computes the same
function as ``LlamaForCausalLM.forward`` for one new token per row with a handful of tensor
ops per layer:

* the weights are read once per ``sample_groups`` call (``fuse_llama``): q/k/v concatenated
  into one matrix, gate/up into another, and a LoRA adapter folded in (W + scale·B·A);
* the key/value cache is a preallocated tensor per layer, [rows, kv_heads, max_len, head_dim],
  filled from the Hugging Face prefill cache; a finished row is dropped with ``index_select``;
* attention is ``scaled_dot_product_attention`` over the filled slice of the cache, with the
  left-padding mask, the query heads of each key/value head packed as query rows (GQA
  without repeating the cache); the rotary embedding of each row's new position comes from a
  cos/sin table built once by the model's own rotary module.

``unsupported_reason`` says why a model cannot take this path (the sampler then falls back
to the Hugging Face forward): anything that is not exactly a ``LlamaForCausalLM`` with SiLU
MLPs, no projection biases and a position-independent rotary scheme, and PEFT adapters other
than plain LoRA on linear layers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

# Rotary schemes whose inverse frequencies do not depend on the sequence length, so one
# cos/sin table serves every step. "dynamic" and "longrope" rescale with the length: refused.
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
ATTENTION_IMPLEMENTATIONS = ("sdpa", "eager")  # both compute softmax(q·kᵀ·scale + mask)·v


def _mkldnn_linear_available(weight: torch.Tensor) -> bool:
    return (weight.device.type == "cpu" and weight.dtype == torch.float32 and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight") and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


class PackedLinear:
    """x·Wᵀ for a weight W [out, in] that is applied to the same few rows many times.

    On a CPU with oneDNN the weight is reordered once into oneDNN's blocked layout (the same
    ops torch.compile's CPU backend emits for a frozen linear layer): at 8 rows a decode step
    then runs its matrix products about 1.5–2× faster than ``F.linear``, which repacks the
    weight on every call. Elsewhere it is ``F.linear``. Results agree to float rounding.
    """

    def __init__(self, weight: torch.Tensor, rows: int):
        self.packed = None
        self.weight = weight
        if _mkldnn_linear_available(weight):
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), rows)
            self.weight = None  # the packed copy is all a step needs

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None:
            return F.linear(x, self.weight)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, None, "none", [], "")

    def add_to(self, residual: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """residual + x·Wᵀ, in one op where the backend fuses it."""
        if self.packed is None:
            return torch.addmm(residual, x, self.weight.t())
        return torch.ops.mkldnn._linear_pointwise.binary(x, residual, self.packed, None, "add")


@dataclass
class LayerWeights:
    qkv: PackedLinear  # [(H + 2·KV)·D, hidden] rows: q heads, then k heads, then v heads
    o: PackedLinear  # [hidden, H·D]
    gate_up: PackedLinear  # [2·I, hidden] rows: gate, then up
    down: PackedLinear  # [hidden, I]
    input_norm: torch.Tensor  # [hidden]
    post_norm: torch.Tensor  # [hidden]


@dataclass
class LlamaWeights:
    """Everything a decode step reads, gathered from a (possibly LoRA-wrapped) Llama."""

    layers: list[LayerWeights]
    embed: torch.Tensor  # [V, hidden]
    final_norm: torch.Tensor  # [hidden]
    lm_head: PackedLinear  # [V, hidden]
    eps: float  # RMSNorm epsilon
    n_heads: int
    n_kv_heads: int
    head_dim: int
    rotary: nn.Module  # the model's LlamaRotaryEmbedding


def _base_model(model: nn.Module) -> nn.Module:
    model = getattr(model, "module", model)  # DistributedDataParallel-style wrapper
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _peft_reason(model: nn.Module) -> str | None:
    """Why a PEFT wrapper cannot be folded into plain weights (None: it can, or there is none)."""
    model = getattr(model, "module", model)
    configs = getattr(model, "peft_config", None)
    if not configs:
        return None
    active = getattr(model, "active_adapters", None) or list(configs)
    for name in active:
        peft_type = str(getattr(configs[name], "peft_type", ""))
        if not peft_type.endswith("LORA") or peft_type.endswith("ADALORA"):
            return f"PEFT adapter {name!r} is {peft_type}, only plain LoRA is folded"
    return None


def _lora_linear_class():
    try:
        from peft.tuners.lora import Linear
    except ImportError:
        return None
    return Linear


def _linear_reason(module: nn.Module, where: str) -> str | None:
    """Why ``linear_weight`` cannot give this projection's effective weight (None: it can)."""
    if type(module) is nn.Linear:
        return None if module.bias is None else f"{where} has a bias"
    lora_linear = _lora_linear_class()
    if lora_linear is None or type(module) is not lora_linear:
        return f"{where} is a {type(module).__name__}"
    if type(module.base_layer) is not nn.Linear or module.base_layer.bias is not None:
        return f"{where} wraps a {type(module.base_layer).__name__} with a bias or of another type"
    if module.merged and module.disable_adapters:
        return f"{where} has a merged adapter that is switched off"
    for name in module.active_adapters:
        if name in module.lora_A and (name in module.lora_variant or module.lora_bias.get(name)):
            return f"{where} uses a LoRA variant (DoRA or lora_bias) for adapter {name!r}"
    return None


def linear_weight(module: nn.Module) -> torch.Tensor:
    """The [out, in] matrix the projection applies: its weight, plus scale·B·A for each
    active LoRA adapter that is not merged (peft's own ``get_delta_weight``)."""
    if type(module) is nn.Linear:
        return module.weight
    weight = module.base_layer.weight
    if module.merged or module.disable_adapters:
        return weight
    deltas = [module.get_delta_weight(name) for name in module.active_adapters if name in module.lora_A]
    return weight + sum(deltas) if deltas else weight


def unsupported_reason(model: nn.Module) -> str | None:
    """None when ``fuse_llama`` computes exactly what the model's forward computes, else why not."""
    from transformers import LlamaForCausalLM

    base = _base_model(model)
    if type(base) is not LlamaForCausalLM:
        return f"{type(base).__name__} is not a LlamaForCausalLM"
    config = base.config
    reason = _peft_reason(model)
    rope_type = (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")
    checks = [
        (reason is not None, reason),
        (config.hidden_act != "silu", f"hidden_act={config.hidden_act!r} is not silu"),
        (rope_type not in STATIC_ROPE_TYPES, f"rope_type={rope_type!r} depends on the sequence length"),
        (config._attn_implementation not in ATTENTION_IMPLEMENTATIONS,
         f"attention implementation {config._attn_implementation!r}"),
        (type(base.model.embed_tokens) is not nn.Embedding, "the embedding is wrapped"),
        (len(base.model.layers) != config.num_hidden_layers, "the layer count differs from the config"),
        (any(p.device.type == "meta" for p in base.parameters()), "weights are offloaded (meta device)"),
    ]
    for failed, why in checks:
        if failed:
            return why
    named = [("lm_head", base.lm_head)]
    for i, layer in enumerate(base.model.layers):
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            named.append((f"layers.{i}.self_attn.{name}", getattr(layer.self_attn, name)))
        for name in ("gate_proj", "up_proj", "down_proj"):
            named.append((f"layers.{i}.mlp.{name}", getattr(layer.mlp, name)))
    return next((why for where, module in named if (why := _linear_reason(module, where))), None)


def fuse_llama(model: nn.Module, rows: int = 8) -> LlamaWeights:
    """Gather, fuse and pack the weights of a model ``unsupported_reason`` accepts, for steps
    of about ``rows`` rows (a layout hint: any row count works). Call it under
    ``torch.inference_mode`` so the concatenations record no autograd history."""
    base = _base_model(model)
    config = base.config
    layers = []
    for layer in base.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        qkv = torch.cat([linear_weight(attn.q_proj), linear_weight(attn.k_proj), linear_weight(attn.v_proj)])
        gate_up = torch.cat([linear_weight(mlp.gate_proj), linear_weight(mlp.up_proj)])
        layers.append(LayerWeights(
            qkv=PackedLinear(qkv, rows), o=PackedLinear(linear_weight(attn.o_proj), rows),
            gate_up=PackedLinear(gate_up, rows), down=PackedLinear(linear_weight(mlp.down_proj), rows),
            input_norm=layer.input_layernorm.weight, post_norm=layer.post_attention_layernorm.weight,
        ))
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return LlamaWeights(
        layers=layers, embed=base.model.embed_tokens.weight, final_norm=base.model.norm.weight,
        lm_head=PackedLinear(linear_weight(base.lm_head), rows), eps=float(config.rms_norm_eps),
        n_heads=config.num_attention_heads, n_kv_heads=config.num_key_value_heads, head_dim=head_dim,
        rotary=base.model.rotary_emb,
    )


def rotary_tables(weights: LlamaWeights, n_positions: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos [n_positions, D] and the signed sin [n_positions, D] for positions 0 … n_positions−1.

    RoPE (Su et al. 2021, RoFormer eq. 34) as transformers applies it: x·cos + rotate_half(x)·sin
    with rotate_half(x) = (−x₂, x₁). Here rotate_half(x)·sin = roll(x, D/2)·sin_signed, where
    sin_signed carries the minus sign on its first half: one roll instead of slice-negate-concat.
    """
    positions = torch.arange(n_positions, device=like.device)[None]
    cos, sin = weights.rotary(like, positions)  # [1, n, D] each, already in like.dtype
    half = weights.head_dim // 2
    sin_signed = torch.cat([-sin[0, :, :half], sin[0, :, half:]], dim=-1)
    return cos[0].contiguous(), sin_signed.contiguous()


class FastLlamaDecoder:
    """Decodes one token per live row per ``step``, over a static KV cache.

    Built right after the Hugging Face prefill: ``cache`` is its DynamicCache over the B
    prompts, ``attention_mask`` [B, P] its left-padding mask, ``next_positions`` [B, 1] each
    prompt's next rotary position. Every prompt's rows are repeated ``group_size`` times
    (prompt i owns rows i·G … i·G+G−1) and room is kept for ``max_new_tokens`` tokens.
    """

    def __init__(self, weights: LlamaWeights, cache, attention_mask: torch.Tensor, next_positions: torch.Tensor,
                 group_size: int, max_new_tokens: int):
        self.w = weights
        n_prompts, prompt_len = attention_mask.shape
        self.length = prompt_len  # filled cache slots, the same for every row (left padding)
        max_len = prompt_len + max_new_tokens
        self.keys, self.values = [], []
        for layer in cache.layers:
            for source, target in ((layer.keys, self.keys), (layer.values, self.values)):
                static = source.new_empty((n_prompts, group_size, *source.shape[1:2], max_len, source.shape[-1]))
                static[:, :, :, :prompt_len].copy_(source[:, None])  # broadcast: each prompt to its G rows
                target.append(static.flatten(0, 1))  # [B·G, KV, max_len, D]
        like = cache.layers[0].keys
        mask = torch.zeros((n_prompts, max_len), dtype=like.dtype, device=like.device)
        mask[:, :prompt_len].masked_fill_(attention_mask == 0, -math.inf)
        self.mask = mask.repeat_interleave(group_size, dim=0)  # [B·G, max_len]: 0 = a real token, −inf = padding
        self.positions = next_positions[:, 0].repeat_interleave(group_size, dim=0)  # [B·G]
        self.cos, self.sin = rotary_tables(weights, int(self.positions.max()) + max_new_tokens, like)
        self.scale = weights.head_dim ** -0.5

    def select(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` (indices into the current rows, ascending), cache included."""
        self.keys = [k.index_select(0, rows) for k in self.keys]
        self.values = [v.index_select(0, rows) for v in self.values]
        self.mask, self.positions = self.mask.index_select(0, rows), self.positions.index_select(0, rows)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Float32 next-token logits [N, V] after feeding ``tokens`` [N] (one per live row)."""
        w, n, slot = self.w, tokens.shape[0], self.length
        h_q, h_kv, d = w.n_heads, w.n_kv_heads, w.head_dim
        cos, sin = self.cos[self.positions][:, None], self.sin[self.positions][:, None]  # [N, 1, D]
        mask = self.mask[:, None, None, : slot + 1]  # [N, 1, 1, T]: the new token sees itself too
        x = F.embedding(tokens, w.embed)  # [N, hidden]
        for layer, keys, values in zip(w.layers, self.keys, self.values):
            h = F.rms_norm(x, x.shape[-1:], layer.input_norm, w.eps)
            qkv = layer.qkv(h)  # [N, (H + 2·KV)·D]
            qk = qkv[:, : (h_q + h_kv) * d].view(n, h_q + h_kv, d)
            qk = torch.addcmul(qk * cos, qk.roll(d // 2, dims=-1), sin)  # RoPE on q and k heads at once
            keys[:, :, slot].copy_(qk[:, h_q:])
            values[:, :, slot].copy_(qkv[:, (h_q + h_kv) * d:].view(n, h_kv, d))
            # GQA: the H/KV query heads that share a key/value head become query rows of it.
            q = qk[:, :h_q].reshape(n, h_kv, h_q // h_kv, d)
            attn = F.scaled_dot_product_attention(q, keys[:, :, : slot + 1], values[:, :, : slot + 1],
                                                  attn_mask=mask, scale=self.scale)
            x = layer.o.add_to(x, attn.reshape(n, h_q * d))  # residual + o_proj
            h = F.rms_norm(x, x.shape[-1:], layer.post_norm, w.eps)
            gate, up = layer.gate_up(h).chunk(2, dim=-1)
            x = layer.down.add_to(x, F.silu(gate) * up)  # residual + down_proj (SwiGLU MLP)
        x = F.rms_norm(x, x.shape[-1:], w.final_norm, w.eps)
        self.length += 1
        self.positions = self.positions + 1
        return w.lm_head(x).float()
