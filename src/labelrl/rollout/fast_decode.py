"""A lean one-token decode step for Llama-architecture models (SmolLM2, ``tiny-random``).

At a few rows per step, decoding through the Hugging Face modules costs more in per-module
Python, mask building and cache bookkeeping than in arithmetic. This module computes the same
function as ``LlamaForCausalLM.forward`` for one new token per row with a handful of tensor
ops per layer:

* the weights come from ``labelrl.rollout.fused``: q/k/v fused into one matrix, gate/up into
  another, packed into oneDNN's layout, a LoRA adapter applied as a separate low-rank
  update; the packed frozen base is kept across calls;
* the key/value cache is a preallocated tensor per layer, [rows, kv_heads, max_len, head_dim],
  filled from the Hugging Face prefill cache; a finished row is dropped with ``index_select``;
* attention is ``scaled_dot_product_attention`` over the filled slice of the cache, with the
  left-padding mask, the query heads of each key/value head packed as query rows (GQA
  without repeating the cache); the rotary embedding of each row's new position comes from a
  cos/sin table built once by the model's own rotary module.

Precision (``dtype`` of the weights, ``LlamaWeights.dtype``): in fp32 everything is fp32.
In bf16 the step computes what the training pass computes under bf16 autocast
(``labelrl.models.precision.compute``), rounding for rounding: the projections in bf16 (bf16
weights: decoding is bound by reading them), and in fp32 the residual stream, the RMSNorms,
the rotary embedding, the attention with its key/value cache (the CPU attention kernel is
slower in bf16, and the cache is small next to the weights), and the vocabulary projection,
so the logits a token is drawn from are fp32.

``unsupported_reason`` says why a model cannot take this path (the sampler then falls back
to the Hugging Face forward): anything that is not exactly a ``LlamaForCausalLM`` with SiLU
MLPs, no projection biases and a position-independent rotary scheme, and PEFT adapters other
than plain LoRA on linear layers.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from labelrl.rollout.fused import LlamaWeights, PackedLinear, base_model, clear_fused_cache, fuse_llama

__all__ = ["FastLlamaDecoder", "LlamaWeights", "fast_prefill", "PackedLinear", "clear_fused_cache", "fuse_llama", "rotary_tables",
           "unsupported_reason"]

# Rotary schemes whose inverse frequencies do not depend on the sequence length, so one
# cos/sin table serves every step. "dynamic" and "longrope" rescale with the length: refused.
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
ATTENTION_IMPLEMENTATIONS = ("sdpa", "eager")  # both compute softmax(q·kᵀ·scale + mask)·v


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
    if getattr(module, "fan_in_fan_out", False):
        return f"{where} stores its LoRA weights transposed (fan_in_fan_out)"
    for name in module.active_adapters:
        if name in module.lora_A and (name in module.lora_variant or module.lora_bias.get(name)):
            return f"{where} uses a LoRA variant (DoRA or lora_bias) for adapter {name!r}"
    return None


def unsupported_reason(model: nn.Module) -> str | None:
    """None when ``fuse_llama`` computes exactly what the model's forward computes, else why not."""
    from transformers import LlamaForCausalLM

    base = base_model(model)
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


def fast_prefill(weights: LlamaWeights, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 position_ids: torch.Tensor, group_size: int, max_new_tokens: int):
    """The prefill over left-padded prompts [B, P] on the packed weights: the first logits
    [B·G, V] (fp32) and a ``FastLlamaDecoder`` holding the prompts' keys and values.

    The same computation as the model's forward (and the same roundings as its bf16 autocast)
    without its per-call costs: no weight casts, one fused q/k/v and gate/up product per layer
    on all B·P tokens, attention through SDPA's fused kernel with a causal-and-padding mask
    (a padding query may see itself, so that no row of the softmax is empty).
    """
    with torch.autocast(device_type=input_ids.device.type, enabled=False):
        w, dtype, (n, length) = weights, weights.dtype, input_ids.shape
        h_q, h_kv, d = w.n_heads, w.n_kv_heads, w.head_dim
        like = torch.empty(0, dtype=torch.float32, device=input_ids.device)
        cos, sin = rotary_tables(w, int(position_ids.max()) + 1, like)
        cos, sin = cos[position_ids][:, :, None], sin[position_ids][:, :, None]  # [B, P, 1, D]
        causal = torch.ones((length, length), dtype=torch.bool, device=input_ids.device).tril()
        allowed = (causal & attention_mask.bool()[:, None, :]) | torch.eye(length, dtype=torch.bool, device=causal.device)
        x = F.embedding(input_ids, w.embed).reshape(n * length, -1)  # the fp32 residual stream
        layer_kv = []
        for layer in w.layers:
            h = F.rms_norm(x, x.shape[-1:], layer.input_norm, w.eps).to(dtype)
            qkv = layer.qkv(h).view(n, length, h_q + 2 * h_kv, d)
            qk = qkv[:, :, : h_q + h_kv].float()
            qk = torch.addcmul(qk * cos, qk.roll(d // 2, dims=-1), sin)  # RoPE, as in the decode step
            keys, values = qk[:, :, h_q:].transpose(1, 2), qkv[:, :, h_q + h_kv:].transpose(1, 2).float()
            attn = F.scaled_dot_product_attention(qk[:, :, :h_q].transpose(1, 2), keys, values,
                                                  attn_mask=allowed[:, None], scale=d ** -0.5, enable_gqa=True)
            x = layer.o.add_to(x, attn.transpose(1, 2).reshape(n * length, h_q * d).to(dtype))
            h = F.rms_norm(x, x.shape[-1:], layer.post_norm, w.eps).to(dtype)
            gate, up = layer.gate_up(h).chunk(2, dim=-1)
            x = layer.down.add_to(x, F.silu(gate) * up)
            layer_kv.append((keys, values))
        last = F.rms_norm(x.view(n, length, -1)[:, -1], x.shape[-1:], w.final_norm, w.eps)
        logits = w.lm_head(last).float().repeat_interleave(group_size, dim=0)
    return logits, FastLlamaDecoder(w, layer_kv, attention_mask, position_ids[:, -1:] + 1, group_size, max_new_tokens)


class FastLlamaDecoder:
    """Decodes one token per live row per ``step``, over a static KV cache.

    Built right after the prefill (``fast_prefill``, or the Hugging Face forward):
    ``layer_kv`` holds each layer's (keys, values) [B, KV, P, D] over the B prompts (for a
    DynamicCache: ``[(layer.keys, layer.values) for layer in cache.layers]``),
    ``attention_mask`` [B, P] their left-padding mask, ``next_positions`` [B, 1] each
    prompt's next rotary position. Every prompt's rows are repeated ``group_size`` times
    (prompt i owns rows i·G … i·G+G−1) and room is kept for ``max_new_tokens`` tokens.
    """

    def __init__(self, weights: LlamaWeights, layer_kv, attention_mask: torch.Tensor, next_positions: torch.Tensor,
                 group_size: int, max_new_tokens: int):
        self.w = weights
        n_prompts, prompt_len = attention_mask.shape
        self.length = prompt_len  # filled cache slots, the same for every row (left padding)
        max_len = prompt_len + max_new_tokens
        self.keys, self.values = [], []
        for layer_keys, layer_values in layer_kv:
            for source, target in ((layer_keys, self.keys), (layer_values, self.values)):
                shape = (n_prompts, group_size, *source.shape[1:2], max_len, source.shape[-1])
                static = source.new_empty(shape, dtype=torch.float32)  # attention runs in fp32
                static[:, :, :, :prompt_len].copy_(source[:, None])  # broadcast: each prompt to its G rows
                target.append(static.flatten(0, 1))  # [B·G, KV, max_len, D]
        device = attention_mask.device
        mask = torch.zeros((n_prompts, max_len), dtype=torch.float32, device=device)
        mask[:, :prompt_len].masked_fill_(attention_mask == 0, -math.inf)
        self.mask = mask.repeat_interleave(group_size, dim=0)  # [B·G, max_len]: 0 = a real token, −inf = padding
        self.positions = next_positions[:, 0].repeat_interleave(group_size, dim=0)  # [B·G]
        like = torch.empty(0, dtype=torch.float32, device=device)  # the rotary embedding is applied in fp32
        self.cos, self.sin = rotary_tables(weights, int(self.positions.max()) + max_new_tokens, like)
        self.scale = weights.head_dim ** -0.5

    def select(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` (indices into the current rows, ascending), cache included."""
        self.keys = [k.index_select(0, rows) for k in self.keys]
        self.values = [v.index_select(0, rows) for v in self.values]
        self.mask, self.positions = self.mask.index_select(0, rows), self.positions.index_select(0, rows)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Float32 next-token logits [N, V] after feeding ``tokens`` [N] (one per live row)."""
        # The dtypes are set explicitly below; an autocast around the caller must not change them.
        with torch.autocast(device_type=tokens.device.type, enabled=False):
            return self._step(tokens)

    def _step(self, tokens: torch.Tensor) -> torch.Tensor:
        w, n, slot, dtype = self.w, tokens.shape[0], self.length, self.w.dtype
        h_q, h_kv, d = w.n_heads, w.n_kv_heads, w.head_dim
        cos, sin = self.cos[self.positions][:, None], self.sin[self.positions][:, None]  # [N, 1, D]
        mask = self.mask[:, None, None, : slot + 1]  # [N, 1, 1, T]: the new token sees itself too
        x = F.embedding(tokens, w.embed)  # [N, hidden], the fp32 residual stream
        for layer, keys, values in zip(w.layers, self.keys, self.values):
            h = F.rms_norm(x, x.shape[-1:], layer.input_norm, w.eps).to(dtype)
            qkv = layer.qkv(h)  # [N, (H + 2·KV)·D]
            qk = qkv[:, : (h_q + h_kv) * d].view(n, h_q + h_kv, d).float()
            qk = torch.addcmul(qk * cos, qk.roll(d // 2, dims=-1), sin)  # RoPE on q and k heads at once
            keys[:, :, slot].copy_(qk[:, h_q:])
            values[:, :, slot].copy_(qkv[:, (h_q + h_kv) * d:].view(n, h_kv, d))
            # GQA: the H/KV query heads that share a key/value head become query rows of it.
            q = qk[:, :h_q].reshape(n, h_kv, h_q // h_kv, d)
            attn = F.scaled_dot_product_attention(q, keys[:, :, : slot + 1], values[:, :, : slot + 1],
                                                  attn_mask=mask, scale=self.scale)
            x = layer.o.add_to(x, attn.reshape(n, h_q * d).to(dtype))  # residual + o_proj
            h = F.rms_norm(x, x.shape[-1:], layer.post_norm, w.eps).to(dtype)
            gate, up = layer.gate_up(h).chunk(2, dim=-1)
            x = layer.down.add_to(x, F.silu(gate) * up)  # residual + down_proj (SwiGLU MLP)
        x = F.rms_norm(x, x.shape[-1:], w.final_norm, w.eps)
        self.length += 1
        self.positions = self.positions + 1
        return w.lm_head(x).float()
