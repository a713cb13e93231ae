"""A lean one-token decode step for Llama-like models: Llama (SmolLM2, ``tiny-random``), Qwen2,
Qwen3 and text-only Gemma 3.

At a few rows per step, decoding through the Hugging Face modules costs more in per-module
Python, mask building and cache bookkeeping than in arithmetic. This module computes the same
function as the model's ``forward`` for one new token per row with a handful of tensor ops
per layer:

* the weights come from ``labelrl.rollout.fused``: q/k/v fused into one matrix (and one bias,
  Qwen2's), gate/up into another, packed into oneDNN's layout, a LoRA adapter applied as a
  separate low-rank update; the packed frozen base is kept across calls;
* the key/value cache is a preallocated tensor per layer, filled from the prefill, that holds
  a prompt's keys once for its G rows while their completions are short next to it, and the
  completion columns of the G rows after them (``FastLlamaDecoder``); a group whose rows have
  all finished is dropped with ``index_select``;
* attention is one ``scaled_dot_product_attention`` call per layer over the filled slice of the
  cache (for a sliding-window layer, its last ``sliding_window`` columns of each row), with a
  mask of each row's own columns, the query heads of each key/value head, of each of a group's
  rows, packed as query rows (GQA without repeating the cache);
  the rotary embedding of each row's new position comes from a cos/sin table built once by
  the model's own rotary module (one table per layer type for Gemma 3);
* a step's layers are one call: their tensor operations, written as functions of tensors, are
  compiled once per process by TorchScript (``decode_layers``), which runs the same ATen
  operations without a Python call each (the Python functions where TorchScript cannot compile
  them).

The layer's arithmetic, what each family adds to Llama's layer and where bf16 rounds, is
``labelrl.rollout.llama_layer``'s, shared with the training pass (``labelrl.rollout.lean_pass``).

``unsupported_reason`` says why a model cannot take this path (the sampler then falls back
to the Hugging Face forward): anything that is not exactly one of the four classes with the
activation its family uses, biases only where Qwen2 has them, a position-independent rotary
scheme, causal attention without logit soft-capping, and PEFT adapters other than plain LoRA
on linear layers.
"""

from __future__ import annotations

import math
import warnings
from typing import List, Optional

import torch
import torch.nn.functional as F
from torch import nn

from labelrl.rollout.fused import LayerTensors, LlamaWeights, base_model, clear_fused_cache, fuse_llama
from labelrl.rollout.llama_layer import (_attention_residual, _embed, _logits, _mlp_residual, _norm, _rope_qk, _scale,
                                         _tables, attention_masks, real_tokens)
from labelrl.rollout.projection import project

__all__ = ["FastLlamaDecoder", "LlamaWeights", "fast_prefill", "last_logits", "prefix_kv", "clear_fused_cache", "fuse_llama",
           "unsupported_reason"]

# Rotary schemes whose inverse frequencies do not depend on the sequence length, so one
# cos/sin table serves every step. "dynamic" and "longrope" rescale with the length: refused.
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
ATTENTION_IMPLEMENTATIONS = ("sdpa", "eager")  # both compute softmax(q·kᵀ·scale + mask)·v
# The gate activation each family uses (config.hidden_act, Gemma's config.hidden_activation).
ACTIVATIONS = {"LlamaForCausalLM": "silu", "Qwen2ForCausalLM": "silu", "Qwen3ForCausalLM": "silu",
               "Gemma3ForCausalLM": "gelu_pytorch_tanh"}


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


def _linear_reason(module: nn.Module, where: str, bias_ok: bool = False) -> str | None:
    """Why ``linear_weight`` cannot give this projection's effective weight (None: it can).
    ``bias_ok``: a bias is added as it is (q/k/v, which have one in Qwen2)."""
    if type(module) is nn.Linear:
        return None if module.bias is None or bias_ok else f"{where} has a bias"
    lora_linear = _lora_linear_class()
    if lora_linear is None or type(module) is not lora_linear:
        return f"{where} is a {type(module).__name__}"
    if type(module.base_layer) is not nn.Linear or (module.base_layer.bias is not None and not bias_ok):
        return f"{where} wraps a {type(module.base_layer).__name__} with a bias or of another type"
    if module.merged and module.disable_adapters:
        return f"{where} has a merged adapter that is switched off"
    if getattr(module, "fan_in_fan_out", False):
        return f"{where} stores its LoRA weights transposed (fan_in_fan_out)"
    for name in module.active_adapters:
        if name in module.lora_A and (name in module.lora_variant or module.lora_bias.get(name)):
            return f"{where} uses a LoRA variant (DoRA or lora_bias) for adapter {name!r}"
    return None


def _rope_types(config) -> list[str]:
    """The rotary type of every layer type (Gemma 3 keeps one parameter set per layer type)."""
    params = getattr(config, "rope_parameters", None) or {}
    if params and all(isinstance(value, dict) for value in params.values()):
        return [value.get("rope_type", "default") for value in params.values()]
    return [params.get("rope_type", "default")]


def _config_reason(base: nn.Module) -> str | None:
    """Why the model's configuration is outside what the fast step computes (None: inside)."""
    from transformers.models.gemma3.modeling_gemma3 import Gemma3TextScaledWordEmbedding

    config, family = base.config, type(base).__name__
    gemma = family == "Gemma3ForCausalLM"
    act_name = "hidden_activation" if gemma else "hidden_act"
    act, expected = getattr(config, act_name), ACTIVATIONS[family]
    bad_rope = next((t for t in _rope_types(config) if t not in STATIC_ROPE_TYPES), None)
    embedding = Gemma3TextScaledWordEmbedding if gemma else nn.Embedding
    checks = [
        (act != expected, f"{act_name}={act!r} is not {expected}, which {family} uses"),
        (bad_rope is not None, f"rope_type={bad_rope!r} depends on the sequence length"),
        (config._attn_implementation not in ATTENTION_IMPLEMENTATIONS,
         f"attention implementation {config._attn_implementation!r}"),
        (type(base.model.embed_tokens) is not embedding, "the embedding is wrapped"),
        (len(base.model.layers) != config.num_hidden_layers, "the layer count differs from the config"),
        (any(p.device.type == "meta" for p in base.parameters()), "weights are offloaded (meta device)"),
        # Gemma 3 replaced Gemma 2's attention soft-capping with q/k norms; transformers 5.19 does not
        # apply the value either, but a checkpoint that sets it expects it: refused rather than guessed.
        (getattr(config, "attn_logit_softcapping", None) is not None,
         f"attn_logit_softcapping={getattr(config, 'attn_logit_softcapping', None)} (attention soft-capping)"),
        (bool(getattr(config, "use_bidirectional_attention", False)), "use_bidirectional_attention=True"),
    ]
    return next((why for failed, why in checks if failed), None)


def unsupported_reason(model: nn.Module) -> str | None:
    """None when ``fuse_llama`` computes exactly what the model's forward computes, else why not."""
    from transformers import Gemma3ForCausalLM, LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM

    base = base_model(model)
    if type(base) not in (LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Gemma3ForCausalLM):
        return (f"{type(base).__name__} is not a LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM "
                "or Gemma3ForCausalLM")
    reason = _peft_reason(model) or _config_reason(base)
    if reason is not None:
        return reason
    named = [("lm_head", base.lm_head, False)]
    for i, layer in enumerate(base.model.layers):
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            named.append((f"layers.{i}.self_attn.{name}", getattr(layer.self_attn, name), name != "o_proj"))
        for name in ("gate_proj", "up_proj", "down_proj"):
            named.append((f"layers.{i}.mlp.{name}", getattr(layer.mlp, name), False))
    return next((why for where, module, bias_ok in named if (why := _linear_reason(module, where, bias_ok))), None)


def _prefill_layers(w: LlamaWeights, input_ids: torch.Tensor, columns: torch.Tensor, position_ids: torch.Tensor,
                    prefix: torch.Tensor | None = None, past: list | None = None,
                    last_only: bool = False) -> tuple[torch.Tensor, list]:
    """Every layer over ``input_ids`` [n, L], after ``prefix`` [1, S] when given (tokens every
    row starts with, run once: its columns are the first S of ``columns``) or after the S
    tokens whose keys and values ``past`` holds (``prefix_kv``: each layer's [1, KV, S, D]),
    ``columns`` [n, S + L] marking the real tokens of prefix and input (``attention_masks``).
    Returns the residual stream after the last layer at the real tokens of ``input_ids``
    [M, hidden], row by row in column order (``last_only``: at each row's last token [n, hidden],
    all the next-token logits need: the last layer then computes its keys and values at every
    token, its attention output and MLP at those n only), and each layer's keys and values over
    all S + L columns.

    Norms, projections and the MLP run once per layer over the prefix and every row's real
    tokens together (a left-padded prompt's padding is never computed); attention runs on the
    prefix causally, then on the [n, L] layout after the prefix's keys, its padding slots zero
    and hidden by the mask (a padding query sees itself only, and its output is not read)."""
    n, length = input_ids.shape
    h_q, h_kv, d = w.n_heads, w.n_kv_heads, w.head_dim
    shared = 0 if prefix is None else prefix.shape[1]
    real = real_tokens(columns[:, -length:])
    pick = (lambda t: t) if real is None else (lambda t: t.index_select(0, real))
    like = torch.empty(0, dtype=torch.float32, device=input_ids.device)
    flat_positions = pick(position_ids.reshape(-1))
    ids = pick(input_ids.reshape(-1))
    if shared:
        flat_positions = torch.cat([torch.arange(shared, device=input_ids.device), flat_positions])
        ids = torch.cat([prefix[0], ids])
    tables = {key: (cos[flat_positions][:, None], sin[flat_positions][:, None])  # [S + M, 1, D]
              for key, (cos, sin) in _tables(w, int(position_ids.max()) + 1, like).items()}
    masks = attention_masks(columns, length, {layer.sliding_window for layer in w.layers})
    x = _embed(w, ids)  # the fp32 residual stream [S + M, hidden]
    layer_kv = []
    for i, layer in enumerate(w.layers):
        h = _norm(x, layer.input_norm, w.eps)
        qkv = layer.qkv(h.to(w.dtype), h).view(-1, h_q + 2 * h_kv, d)
        heads = torch.cat([_rope_qk(qkv[:, : h_q + h_kv], *tables[layer.rope_key], layer.qk_norm, w.eps,
                                    w.round_norm_after_weight), qkv[:, h_q + h_kv:].float()],
                          dim=1)  # [S + M, H + 2·KV, D], fp32: q and k rotated, v
        outputs = []
        before = None if past is None else past[i]  # the prefix's keys and values [1, KV, S, D]
        if shared:  # the prefix, causally, once
            first = heads[:shared].transpose(0, 1)[None]  # [1, H + 2·KV, S, D]
            before = first[:, h_q : h_q + h_kv], first[:, h_q + h_kv:]
            attn = F.scaled_dot_product_attention(first[:, :h_q], *before, is_causal=True, scale=_scale(w), enable_gqa=True)
            outputs.append(attn[0].transpose(0, 1).reshape(shared, h_q * d))
            heads = heads[shared:]
        if real is not None:
            heads = heads.new_zeros((n * length, *heads.shape[1:])).index_copy_(0, real, heads)
        heads = heads.view(n, length, h_q + 2 * h_kv, d).transpose(1, 2)  # [n, H + 2·KV, L, D]
        keys, values = heads[:, h_q : h_q + h_kv], heads[:, h_q + h_kv:]
        if before is not None:
            keys = torch.cat([before[0].expand(n, -1, -1, -1), keys], dim=2)
            values = torch.cat([before[1].expand(n, -1, -1, -1), values], dim=2)
        final = last_only and i == len(w.layers) - 1
        queries = slice(-1, None) if final else slice(None)  # left-padded: each row's last column is its last token
        attn = F.scaled_dot_product_attention(heads[:, :h_q, queries], keys, values,
                                              attn_mask=masks[layer.sliding_window][:, None, queries], scale=_scale(w),
                                              enable_gqa=True)
        if final:
            last = columns[:, -length:].sum(dim=1).cumsum(dim=0) - 1 + shared  # in x: after the prefix's rows
            x, out = x.index_select(0, last), attn.reshape(n, h_q * d)
        else:
            outputs.append(pick(attn.transpose(1, 2).reshape(n * length, h_q * d)))
            out = torch.cat(outputs) if shared else outputs[0]
        x = _attention_residual(x, out, layer.o.tensors, layer.attn_out_norm, w.dtype, w.eps)
        x = _mlp_residual(x, layer.mlp_norm, layer.gate_up.tensors, layer.down.tensors, layer.mlp_out_norm, w.dtype, w.eps,
                          w.activation)
        layer_kv.append((keys, values))
    return (x if last_only else x[shared:]), layer_kv


def fast_prefill(weights: LlamaWeights, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 position_ids: torch.Tensor, group_size: int, max_new_tokens: int, prefix: torch.Tensor | None = None):
    """The prefill over left-padded prompts [B, P] on the packed weights: the first logits
    [B·G, V] (fp32) and a ``FastLlamaDecoder`` holding the prompts' keys and values.

    The same computation as the model's forward (and the same roundings as its bf16 autocast)
    without its per-call costs: no weight casts, one fused q/k/v and gate/up product per layer
    on the prompts' real tokens (their left padding is not computed), attention through SDPA's
    fused kernel with a causal-and-padding mask, narrowed to the window on sliding layers.

    ``prefix`` [1, S]: tokens every prompt starts with, run once (``labelrl.rollout.prefix``);
    ``input_ids`` then holds each prompt's remainder in that module's layout
    (``remainder_inputs``: ``attention_mask`` [B, S + R] over prefix and remainder, positions
    from S). Not for sliding-window layers, which count their window in columns.
    """
    logits, layer_kv = _prefill_last(weights, input_ids, attention_mask, position_ids, prefix)
    return logits.repeat_interleave(group_size, dim=0), FastLlamaDecoder(
        weights, layer_kv, attention_mask, position_ids[:, -1:] + 1, group_size, max_new_tokens)


def last_logits(weights: LlamaWeights, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                position_ids: torch.Tensor, prefix: torch.Tensor | None = None, past: list | None = None) -> torch.Tensor:
    """The next-token logits [B, V] (fp32) at each prompt's last token: ``fast_prefill``'s
    first logits, without a decoder (label-token scoring, ``labelrl.evaluate.score``).
    ``past``: the keys and values of a prefix every prompt starts with (``prefix_kv``), which
    ``attention_mask`` and ``position_ids`` count (``labelrl.rollout.prefix.remainder_inputs``)."""
    return _prefill_last(weights, input_ids, attention_mask, position_ids, prefix, past, last_only=True)[0]


def prefix_kv(weights: LlamaWeights, prefix: torch.Tensor) -> list:
    """Each layer's keys and values [1, KV, S, D] (fp32) over ``prefix`` [1, S], for
    ``last_logits`` to start from: a prefix every prompt of a split shares (template, system
    message, rubric) then runs once for the split instead of once per batch. Causal attention
    makes them what the prefix's columns hold in any longer pass, up to float rounding."""
    assert not any(layer.sliding_window for layer in weights.layers), "a sliding window counts columns"
    with torch.autocast(device_type=prefix.device.type, enabled=False):
        positions = torch.arange(prefix.shape[1], device=prefix.device)[None]
        return _prefill_layers(weights, prefix, torch.ones_like(prefix), positions)[1]


def _prefill_last(weights: LlamaWeights, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  position_ids: torch.Tensor, prefix: torch.Tensor | None, past: list | None = None,
                  last_only: bool = False) -> tuple[torch.Tensor, list]:
    """The logits [B, V] at each prompt's last token and every layer's keys and values
    (``_prefill_layers``; ``last_only``: its last layer at the last tokens only)."""
    with torch.autocast(device_type=input_ids.device.type, enabled=False):
        if prefix is not None or past is not None:
            assert not any(layer.sliding_window for layer in weights.layers), "a sliding window counts columns"
        x, layer_kv = _prefill_layers(weights, input_ids, attention_mask, position_ids, prefix, past, last_only)
        if not last_only:
            last = attention_mask[:, -input_ids.shape[1]:].sum(dim=1).cumsum(dim=0) - 1  # each prompt's last token, always real
            x = x.index_select(0, last)
        return _logits(weights, x), layer_kv


# A prompt's G rows share one copy of its keys and values (``FastLlamaDecoder``) while their
# completion columns stay within a small multiple of the prompt's: each query then also scores its
# group's other rows' completion columns (masked), G times the completion part's work, against
# reading the prompt's columns once per step instead of G times. Whole sampling calls of SmolLM2
# (prefill and 31 steps, 2 prompts, one process alternating, AMD EPYC, 2 threads), a copy per
# row → shared, by G · 32 / P: G = 4, P = 136 (0.9): 1,630 → 1,473 ms; G = 8, P = 136 (1.9):
# 2,218 → 2,029; G = 8, P = 104 (2.5): 1,973 → 1,836; G = 4, P = 40 (3.2): 1,196 → 1,157;
# G = 8, P = 70 (3.7): 1,883 → 1,878. Sharing pays up to about G · max_new_tokens = 3.5 · P.
SHARE_PROMPT_UP_TO = 3


class FastLlamaDecoder:
    """Decodes one token per live row per ``step``, over a static KV cache.

    Built right after the prefill (``fast_prefill``, or the Hugging Face forward of a model
    without sliding-window layers): ``layer_kv`` holds each layer's (keys, values)
    [B, KV, P, D] over the B prompts (for a DynamicCache:
    ``[(layer.keys, layer.values) for layer in cache.layers]``), ``attention_mask`` [B, P]
    their left-padding mask, ``next_positions`` [B, 1] each prompt's next rotary position.
    Every prompt's rows are repeated ``group_size`` times (prompt i owns rows i·G … i·G+G−1)
    and room is kept for ``max_new_tokens`` tokens.

    The cache is held per slot group, [groups, KV, P + g·max_new_tokens, D]: a prompt's P
    columns, then at step t the new keys of the group's g rows side by side (its row j's at
    column P + t·g + j). With ``share_prompt`` a group is a prompt's G rows (g = G), so the
    prompt's keys and values are held and read once for its G rows: their queries join one
    attention call as GQA's query heads join their key head, under a mask that shows each row
    its prompt's real columns and its own completion columns (the shared prefix of Juravsky et
    al. 2024, "Hydragen", here in one softmax, the other rows' columns masked out). Without it
    every row is a group of one with its own copy of the prompt. None: share while
    G · max_new_tokens ≤ ``SHARE_PROMPT_UP_TO`` · P. A finished row's slots stay, masked and its
    query zero, until its whole group has finished; the group is then dropped from the cache.
    """

    def __init__(self, weights: LlamaWeights, layer_kv, attention_mask: torch.Tensor, next_positions: torch.Tensor,
                 group_size: int, max_new_tokens: int, share_prompt: bool | None = None):
        self.w = weights
        n_prompts, prompt_len = attention_mask.shape
        if share_prompt is None:
            share_prompt = group_size * max_new_tokens <= SHARE_PROMPT_UP_TO * prompt_len
        per, copies = (group_size, 1) if share_prompt else (1, group_size)  # rows per group, groups per prompt
        self.prompt_len, self.per, self.step_index = prompt_len, per, 0
        width = prompt_len + per * max_new_tokens
        self.keys, self.values = [], []
        for layer_keys, layer_values in layer_kv:
            for source, target in ((layer_keys, self.keys), (layer_values, self.values)):
                shape = (n_prompts, copies, *source.shape[1:2], width, source.shape[-1])
                static = source.new_empty(shape, dtype=torch.float32)  # attention runs in fp32
                static[:, :, :, :prompt_len].copy_(source[:, None])  # each prompt to each of its groups
                target.append(static.flatten(0, 1))  # [groups, KV, width, D]
        device = attention_mask.device
        # [B, per, width], additive: 0 where a row's query may look (its prompt's real columns and
        # its own completion columns), −inf elsewhere
        mask = torch.full((n_prompts, per, width), -math.inf, dtype=torch.float32, device=device)
        mask[:, :, :prompt_len] = torch.where(attention_mask[:, None, :] == 0, -math.inf, 0.0)
        mask[:, :, prompt_len:].view(n_prompts, per, max_new_tokens, per).diagonal(dim1=1, dim2=3).fill_(0.0)
        self.mask = mask.repeat_interleave(copies, dim=0)  # [groups, per, width]
        self.slots = torch.arange(n_prompts * group_size, device=device)  # each live row's slot in groups · per
        self.positions = next_positions[:, 0].repeat_interleave(group_size, dim=0)  # [live rows]
        like = torch.empty(0, dtype=torch.float32, device=device)  # the rotary embedding is applied in fp32
        self.tables = _tables(weights, int(self.positions.max()) + max_new_tokens, like)
        self.scale = _scale(weights)

    def select(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` (indices into the current rows, ascending); a group none of whose
        rows is kept leaves the cache."""
        slots = self.slots.index_select(0, rows)
        self.positions = self.positions.index_select(0, rows)
        groups = torch.unique_consecutive(slots // self.per)
        if len(groups) < self.mask.shape[0]:
            self.keys = [k.index_select(0, groups) for k in self.keys]
            self.values = [v.index_select(0, groups) for v in self.values]
            self.mask = self.mask.index_select(0, groups)
            renumber = torch.zeros(int(slots.max()) // self.per + 1, dtype=torch.long, device=slots.device)
            renumber[groups] = torch.arange(len(groups), device=slots.device)
            slots = renumber[slots // self.per] * self.per + slots % self.per
        self.slots = slots

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Float32 next-token logits [N, V] after feeding ``tokens`` [N] (one per live row)."""
        # The dtypes are set explicitly below; an autocast around the caller must not change them.
        with torch.autocast(device_type=tokens.device.type, enabled=False):
            return self._step(tokens)

    def _masks(self, filled: int) -> dict:
        """{window: (first column, additive mask [groups, 1, per·H/KV, filled − first])} for this
        step, whose keys fill the cache up to column ``filled``. A sliding layer's query sees the
        last ``window`` of its row's columns: its prompt's from P + t + 1 − W on, its own
        completion columns of steps t + 1 − W … t."""
        per, prompt_len, t = self.per, self.prompt_len, self.step_index
        heads_per_kv = self.w.n_heads // self.w.n_kv_heads
        masks = {}
        for window in {layer.sliding_window for layer in self.w.layers}:
            start, mask = 0, self.mask[:, :, :filled]
            if window:
                start = min(prompt_len, max(0, prompt_len + t + 1 - window))
                mask, old = mask[:, :, start:], t + 1 - window  # steps before the window
                if old > 0:
                    mask = mask.clone()
                    mask[:, :, prompt_len - start : prompt_len - start + old * per] = -math.inf
            groups, columns = mask.shape[0], mask.shape[-1]
            if per > 1:  # row j's mask on its H/KV query rows j·H/KV … (j+1)·H/KV − 1
                mask = mask[:, :, None].expand(groups, per, heads_per_kv, columns).reshape(groups, per * heads_per_kv, columns)
            masks[window] = start, mask[:, None]
        return masks

    def _step(self, tokens: torch.Tensor) -> torch.Tensor:
        w, n, per = self.w, tokens.shape[0], self.per
        column = self.prompt_len + self.step_index * per  # this step's keys: columns column … column + per − 1
        masks = self._masks(column + per)
        slots = None if n == self.mask.shape[0] * per else self.slots  # None: every slot holds a live row
        tables = {key: (cos[self.positions][:, None], sin[self.positions][:, None])  # [N, 1, D]
                  for key, (cos, sin) in self.tables.items()}
        # per layer: its mask, first column and rotary table (sliding and global layers differ)
        starts, layer_masks = zip(*(masks[layer.sliding_window] for layer in w.layers))
        cos, sin = zip(*(tables[layer.rope_key] for layer in w.layers))
        x = decode_layers()(_embed(w, tokens), w.layer_tensors, self.keys, self.values, list(layer_masks), list(cos),
                            list(sin), list(starts), column, per, slots, w.n_heads, w.n_kv_heads, self.scale, w.eps,
                            w.dtype, w.round_norm_after_weight, w.activation)
        self.step_index += 1
        self.positions = self.positions + 1
        return _logits(w, x)


def _decode_layer(x: torch.Tensor, layer: LayerTensors, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                  cos: torch.Tensor, sin: torch.Tensor, start: int, column: int, per: int, slots: Optional[torch.Tensor],
                  n_heads: int, n_kv_heads: int, scale: float, eps: float, dtype: torch.dtype,
                  round_norm_after_weight: bool, activation: str) -> torch.Tensor:
    """One layer of ``FastLlamaDecoder.step`` over the live rows' residual stream ``x`` [N, hidden]:
    this step's keys and values written to columns ``column`` … ``column + per − 1`` of the
    layer's cache [groups, KV, width, D], attention over its columns ``start`` … under ``mask``.
    ``slots``: each live row's slot in groups · per (None: every slot holds a live row)."""
    n, h_q, h_kv = x.shape[0], n_heads, n_kv_heads
    groups, d = keys.shape[0], keys.shape[-1]
    h = _norm(x, layer.input_norm, eps)
    qkv = project(layer.qkv, h.to(dtype), h)  # [N, (H + 2·KV)·D]
    qk = _rope_qk(qkv[:, : (h_q + h_kv) * d].view(n, h_q + h_kv, d), cos, sin, layer.qk_norm, eps,
                  round_norm_after_weight)
    v = qkv[:, (h_q + h_kv) * d:].view(n, h_kv, d)
    if slots is not None:  # finished rows' slots get zeros: masked keys, and queries whose output is dropped
        heads = torch.cat([qk, v.float()], dim=1)
        heads = heads.new_zeros([groups * per, heads.shape[1], d]).index_copy_(0, slots, heads)
        qk, v = heads[:, : h_q + h_kv], heads[:, h_q + h_kv:]
    keys[:, :, column : column + per].copy_(qk[:, h_q:].view(groups, per, h_kv, d).transpose(1, 2))
    values[:, :, column : column + per].copy_(v.view(groups, per, h_kv, d).transpose(1, 2))
    # GQA: the H/KV query heads that share a key/value head (of each of the group's rows)
    # become query rows of it.
    q = qk[:, :h_q].reshape(groups, per, h_kv, h_q // h_kv, d).transpose(1, 2).reshape(groups, h_kv, -1, d)
    attn = F.scaled_dot_product_attention(q, keys[:, :, start : column + per], values[:, :, start : column + per],
                                          attn_mask=mask, scale=scale)
    attn = attn.view(groups, h_kv, per, h_q // h_kv, d).transpose(1, 2).reshape(groups * per, h_q * d)
    if slots is not None:
        attn = attn.index_select(0, slots)
    x = _attention_residual(x, attn, layer.o, layer.attn_out_norm, dtype, eps)
    return _mlp_residual(x, layer.mlp_norm, layer.gate_up, layer.down, layer.mlp_out_norm, dtype, eps, activation)


def _decode_layers(x: torch.Tensor, layers: List[LayerTensors], keys: List[torch.Tensor], values: List[torch.Tensor],
                   masks: List[torch.Tensor], cos: List[torch.Tensor], sin: List[torch.Tensor], starts: List[int],
                   column: int, per: int, slots: Optional[torch.Tensor], n_heads: int, n_kv_heads: int, scale: float,
                   eps: float, dtype: torch.dtype, round_norm_after_weight: bool, activation: str) -> torch.Tensor:
    """Every layer of ``FastLlamaDecoder.step`` in turn (``_decode_layer``), layer i with the
    i-th entry of each list: its tensors, cache, mask, rotary table and first column."""
    for i in range(len(layers)):
        x = _decode_layer(x, layers[i], keys[i], values[i], masks[i], cos[i], sin[i], starts[i], column, per, slots,
                          n_heads, n_kv_heads, scale, eps, dtype, round_norm_after_weight, activation)
    return x


# A decode step is ~60 small tensor operations per layer at a few rows, and calling each from
# Python costs about as much as running it: compiled by TorchScript, the step's layers are one
# call. SCRIPT_DECODE_LAYERS = False runs the Python functions (the same operations, the same results).
SCRIPT_DECODE_LAYERS = True
_SCRIPTED: dict = {}


def decode_layers():
    """``_decode_layers`` compiled by TorchScript (once per process), or the Python function where
    ``SCRIPT_DECODE_LAYERS`` is off or this torch cannot compile it."""
    if not SCRIPT_DECODE_LAYERS:
        return _decode_layers
    if "layers" not in _SCRIPTED:
        try:
            with warnings.catch_warnings():  # torch 2.13 marks torch.jit deprecated; its compiled functions still run
                warnings.simplefilter("ignore")
                _SCRIPTED["layers"] = torch.jit.script(_decode_layers)
        except Exception:  # noqa: BLE001 — any failure to compile leaves the Python function, which computes the same
            _SCRIPTED["layers"] = _decode_layers
    return _SCRIPTED["layers"]
