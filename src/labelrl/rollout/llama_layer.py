"""One layer of a Llama-like model (Llama, Qwen2, Qwen3, text-only Gemma 3) as functions of
tensors, computing what the model's own modules compute: the RMSNorms, the rotary embedding
(``rotary_tables``, ``_rope_qk``), the attention and MLP residuals, the final logits, and the
masks of a left-padded batch (``attention_masks``, ``real_tokens``).

The prefill and the one-token decode step of ``labelrl.rollout.fast_decode`` run their layers
on these; the training pass of ``labelrl.rollout.lean_pass`` takes its norms, rotary embedding
and masks from here. The weights come from ``labelrl.rollout.fused``, each projection's product
from ``labelrl.rollout.projection``.

What each family adds to Llama's layer, as transformers 5.19 computes it (``modeling_qwen2``,
``modeling_qwen3``, ``modeling_gemma3``): Qwen2 biases on q/k/v; Qwen3 an RMSNorm over each
query and key head before RoPE; Gemma 3 the same q/k norms, (1 + w) norm weights, a norm on
the attention output and on the MLP output, embeddings × √hidden, a GELU-tanh gate, queries
scaled by ``query_pre_attn_scalar``^-½, sliding-window layers with their own RoPE base, and
tanh soft-capping of the final logits. Sliding windows count cache slots, as transformers'
``sliding_window_overlay`` does (a query sees slots s − W + 1 … s).

Precision (``dtype`` of the weights, ``LlamaWeights.dtype``): in fp32 everything is fp32. In
bf16 the prefill and the decode step compute what the training pass computes under bf16
autocast (``labelrl.models.precision.compute``), rounding for rounding: the projections in bf16
(bf16 weights: decoding is bound by reading them), and in fp32 the residual stream, the
RMSNorms, the rotary embedding, the attention with its key/value cache (the CPU attention
kernel is slower in bf16, and the cache is small next to the weights), and the vocabulary
projection, so the logits a token is drawn from are fp32. A trained adapter's low-rank update
is computed in fp32 from the fp32 input (before its rounding for the base product) and its sum
with the projection stays fp32, as ``fp32_adapter_sum`` has it. A norm whose input is a
projection output (q/k norms, Gemma's output norms) rounds its result back to that output's
dtype, as transformers does.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from labelrl.rollout.fused import LlamaWeights
from labelrl.rollout.projection import ProjectionTensors, project, project_add


def rotary_tables(weights: LlamaWeights, n_positions: int, like: torch.Tensor,
                  layer_type: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos [n_positions, D] and the signed sin [n_positions, D] for positions 0 … n_positions−1
    (of ``layer_type``'s RoPE parameters, for Gemma 3; None: the model's one rotary scheme).

    RoPE (Su et al. 2021, RoFormer eq. 34) as transformers applies it: x·cos + rotate_half(x)·sin
    with rotate_half(x) = (−x₂, x₁). Here rotate_half(x)·sin = roll(x, D/2)·sin_signed, where
    sin_signed carries the minus sign on its first half: one roll instead of slice-negate-concat.
    """
    positions = torch.arange(n_positions, device=like.device)[None]
    extra = () if layer_type is None else (layer_type,)
    cos, sin = weights.rotary(like, positions, *extra)  # [1, n, D] each, already in like.dtype
    half = weights.head_dim // 2
    sin_signed = torch.cat([-sin[0, :, :half], sin[0, :, half:]], dim=-1)
    return cos[0].contiguous(), sin_signed.contiguous()


def _tables(weights: LlamaWeights, n_positions: int, like: torch.Tensor) -> dict:
    """{rope_key: (cos, sin)} for every layer's rotary scheme."""
    return {key: rotary_tables(weights, n_positions, like, key) for key in {layer.rope_key for layer in weights.layers}}


# --- one layer, as the model computes it (shared by the prefill and the decode step) ---------

# These are functions of tensors, with typing's annotations, so that TorchScript can compile the
# decode step's layers from them (``fast_decode.decode_layers``); the prefill and the training pass
# call them too.

def _norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x, x.shape[-1:], weight, eps)


def _exact_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / rms(x) with transformers' own ops, bit for bit: used where the result is rounded to
    bf16 next (q/k norms, Gemma's output norms), since ``F.rms_norm`` differs in the last fp32
    bit now and then, and a bf16 rounding can turn that into a 1/256 difference that a cached
    key then carries into every later step."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _embed(w: LlamaWeights, ids: torch.Tensor) -> torch.Tensor:
    """The fp32 residual stream's start (Gemma 3: × √hidden, as its scaled embedding module)."""
    x = F.embedding(ids, w.embed)
    return x if w.embed_scale is None else x * w.embed_scale.to(x.dtype)


def _rope_qk(qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, qk_norm: Optional[torch.Tensor], eps: float,
             round_norm_after_weight: bool) -> torch.Tensor:
    """The q and k heads [..., H + KV, D] (the projection's output: compute-dtype values, or
    fp32 where an adapter's update joined them) normed by ``qk_norm`` where the family norms
    them (``LlamaWeights.round_norm_after_weight`` says where the norm rounds), then rotated;
    fp32."""
    given = qk.dtype  # where the norm rounds its result, as transformers' norms do
    qk = qk.float()
    if qk_norm is not None:
        normed = _exact_norm(qk, eps)
        if round_norm_after_weight:  # Gemma3RMSNorm: (x̂ · (1 + w)).type_as(x)
            qk = (normed * qk_norm).to(given).float()
        else:  # Qwen3RMSNorm: w · x̂.to(input dtype)
            qk = normed.to(given).float() * qk_norm
    return torch.addcmul(qk * cos, qk.roll(qk.shape[-1] // 2, dims=-1), sin)  # RoPE on q and k heads at once


def _attention_residual(x: torch.Tensor, attn: torch.Tensor, o: ProjectionTensors, out_norm: Optional[torch.Tensor],
                        dtype: torch.dtype, eps: float) -> torch.Tensor:
    """x + o_proj(attn) [Gemma 3: + norm(o_proj(attn)) by ``out_norm``, rounded to the
    projection output's dtype]; ``attn`` fp32, rounded to the compute dtype for the base
    product, as it is for the update."""
    if out_norm is None:
        return project_add(o, x, attn.to(dtype), attn)
    out = project(o, attn.to(dtype), attn)
    return x + (_exact_norm(out.float(), eps) * out_norm).to(out.dtype)


def _mlp_residual(x: torch.Tensor, norm: torch.Tensor, gate_up: ProjectionTensors, down: ProjectionTensors,
                  out_norm: Optional[torch.Tensor], dtype: torch.dtype, eps: float, activation: str) -> torch.Tensor:
    """x + down(act(gate) · up) of the x normed by ``norm`` [Gemma 3: the MLP output normed by
    ``out_norm`` too]."""
    h = _norm(x, norm, eps)
    halves = project(gate_up, h.to(dtype), h).chunk(2, dim=-1)  # gate, up
    # fp32 where an adapter's update joined gate/up (fp32_adapter_sum), then rounded for the product
    gate = halves[0]
    hidden = (F.silu(gate) if activation == "silu" else F.gelu(gate, approximate="tanh")) * halves[1]
    if out_norm is None:
        return project_add(down, x, hidden.to(dtype), hidden)
    out = project(down, hidden.to(dtype), hidden)
    return x + (_exact_norm(out.float(), eps) * out_norm).to(out.dtype)


def _logits(w: LlamaWeights, x: torch.Tensor) -> torch.Tensor:
    """fp32 logits from the last hidden states (Gemma 3: soft-capped as its forward does)."""
    logits = w.lm_head(_norm(x, w.final_norm, w.eps)).float()
    if w.logit_softcap is not None:
        logits = torch.tanh(logits / w.logit_softcap) * w.logit_softcap
    return logits


def _scale(w: LlamaWeights) -> float:
    return w.attn_scale if w.attn_scale is not None else w.head_dim ** -0.5


def attention_masks(columns: torch.Tensor, length: int, windows) -> dict:
    """{window: bool mask [n, L, C + L]} for ``length`` queries after C cached
    columns, ``columns`` [n, C + L] marking the real tokens: a query at column C + i sees the real
    columns up to its own (within ``window`` of it, when not None), and always itself, so that a
    padding query's softmax is not empty (its output is never read: no real query sees it)."""
    before = columns.shape[1] - length
    query = torch.arange(before, before + length, device=columns.device)
    distance = query[:, None] - torch.arange(before + length, device=columns.device)[None, :]  # query − key column
    allowed = (distance >= 0) & columns.bool()[:, None, :]
    return {window: (allowed & (distance < window) if window else allowed) | (distance == 0) for window in windows}


def real_tokens(columns: torch.Tensor) -> torch.Tensor | None:
    """Flat indices of the real slots of ``columns`` [n, s] (None: every slot is real)."""
    real = columns.reshape(-1).nonzero().squeeze(1)
    return None if real.numel() == columns.numel() else real
