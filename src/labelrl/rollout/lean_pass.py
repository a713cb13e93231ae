"""The training pass of a LoRA-adapted Llama, Qwen2 or Qwen3 model without its Hugging Face
modules: the same function, with gradients, in fewer and larger operations.

Through the model's modules a layer of SmolLM2 + LoRA on every linear layer runs 21 matrix
products forward (7 base projections, 2 per adapter) and twice that backward, each behind
peft's and transformers' per-module Python, and an RMSNorm of eight elementwise operations.
Here, per layer:

* q/k/v run as one product and gate/up as another (their frozen base weights concatenated);
* each group's adapters run as one pair of products: the A factors stacked [R, in], then the
  B factors, scaled, cut into equal blocks that one batched product runs each against its own
  member's columns of x·Aᵀ (``projection.block_layout``; members of different ranks: one
  block-diagonal [out, R] product instead), so q/k/v's three adapters cost what one does;
* the norms are ``F.rms_norm``, the rotary embedding one roll and one fused multiply-add
  (``llama_layer._rope_qk``), attention ``scaled_dot_product_attention`` with grouped heads;
* a completion shorter than its batch's longest runs over its own tokens: everything but
  attention sees only the tokens that predict a real one.

Precision is what ``labelrl.models.precision.compute`` gives the module pass, rounding for
rounding: in bf16 each base product runs on the bf16 copy of its frozen weight (the copy the
module pass keeps, ``low_precision_weight``; a fused group's members' copies are rows of one
tensor, ``low_precision_group``) with a bf16 result cast to fp32, the adapter's update is an
fp32 product added in fp32 (``fp32_adapter_sum``), and norms, rotary embedding, attention,
residual stream and the vocabulary projection are fp32. Only the
summation order of some products differs (fused and stacked shapes), within float rounding.

``lean_reason`` says why a model must keep the module pass (None: it need not). The pass
requires a plain LoRA adapter on every projection of every layer (labelrl's default,
``target_modules="all-linear"``): a projection left without one returns bf16 from the module
pass, which the gate's activation would then see rounded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from labelrl.models.precision import low_precision_group
from labelrl.rollout.fast_decode import unsupported_reason
from labelrl.rollout.llama_layer import _norm, _rope_qk, attention_masks, real_tokens, rotary_tables
from labelrl.rollout.token_logprobs import token_logprobs
from labelrl.rollout.fused import LLAMA_PROJECTIONS, base_model, frozen_bias, frozen_weight, is_gemma3
from labelrl.rollout.projection import block_layout

__all__ = ["lean_reason", "lean_weights", "lean_logprobs"]


@dataclass
class LeanProjection:
    """base(x) + Δ(x) for one fused group (q/k/v, o, gate/up or down).

    ``weights``: the frozen base in the compute dtype, one concatenated matrix [out, in] in bf16
    (kept between passes, each member's kept cast a view of it: ``low_precision_group``), or
    the members' own fp32 weights,
    whose outputs are concatenated (no fp32 copy of the model). ``a`` [R, in] (the A factors
    stacked) and ``b`` (the scaled B factors) are fp32, in the autograd graph; ``b`` is either
    [k, r, w], Bᵀ cut into k blocks of width w, block j reading the r columns of x·Aᵀ of member
    ``reads[j]`` (``projection.block_layout``), or block-diagonal [out, R]."""

    weights: list[torch.Tensor]
    bias: torch.Tensor | None  # Qwen2's q/k/v bias, in the compute dtype
    a: torch.Tensor
    b: torch.Tensor
    reads: torch.Tensor | None = None  # [k]: the member each block reads (None: block j reads member j)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """fp32 [..., out] from fp32 x [..., in]."""
        low = x.to(self.weights[0].dtype)
        if len(self.weights) == 1:
            y = F.linear(low, self.weights[0], self.bias)
        else:
            y = torch.cat([F.linear(low, w) for w in self.weights], dim=-1)
            y = y if self.bias is None else y + self.bias
        down = F.linear(x, self.a)
        if self.b.dim() == 2:
            return torch.add(y.float(), F.linear(down, self.b))
        # y + each block's update, [k, M, w] on the way and [M, k·w] out (Δ's rows in the order of y's)
        k, r, w = self.b.shape
        lead, down = x.shape[:-1], down.reshape(-1, down.shape[-1] // r, r)
        down = down if self.reads is None else down.index_select(1, self.reads)
        out = torch.baddbmm(y.float().reshape(-1, k, w).transpose(0, 1), down.transpose(0, 1), self.b)
        return out.transpose(0, 1).reshape(*lead, k * w)


@dataclass
class LeanLayer:
    qkv: LeanProjection
    o: LeanProjection
    gate_up: LeanProjection
    down: LeanProjection
    input_norm: torch.Tensor
    mlp_norm: torch.Tensor
    qk_norm: torch.Tensor | None  # Qwen3: [H + KV, D], each query head's then each key head's norm weight


@dataclass
class LeanWeights:
    layers: list[LeanLayer]
    embed: torch.Tensor  # [V, hidden]
    final_norm: torch.Tensor
    head: torch.Tensor  # [V, hidden], applied in fp32
    head_bias: torch.Tensor | None
    eps: float
    n_heads: int
    n_kv_heads: int
    head_dim: int
    rotary: nn.Module
    round_norm_after_weight: bool = False  # passed to llama_layer._rope_qk; Gemma's norms only


def _lora_layer_reason(module: nn.Module, where: str, training: bool) -> str | None:
    from peft.tuners.lora import Linear

    if type(module) is not Linear:
        return f"{where} is a {type(module).__name__}, not a LoRA layer (the lean pass needs one on every projection)"
    active = [name for name in module.active_adapters if name in module.lora_A]
    if module.merged or module.disable_adapters or not active:
        return f"{where} has no active unmerged adapter"
    if frozen_weight(module).requires_grad:
        return f"{where} trains its base weight"
    for name in active:
        if name in module.lora_variant or module.lora_bias.get(name):
            return f"{where} uses a LoRA variant (DoRA or lora_bias) for adapter {name!r}"
        if training and not isinstance(module.lora_dropout[name], nn.Identity):
            return f"{where} applies LoRA dropout while training"
    return None


def lean_reason(model: nn.Module) -> str | None:
    """None when ``lean_logprobs`` computes what the model's own forward computes, else why not."""
    if hasattr(model, "module"):
        return "the model is wrapped for several processes (its wrapper must run the forward)"
    reason = unsupported_reason(model)
    if reason is not None:
        return reason
    base = base_model(model)
    if is_gemma3(base):
        return "Gemma 3 keeps the module pass (sliding-window layers)"
    for i, layer in enumerate(base.model.layers):
        for part, names in LLAMA_PROJECTIONS:
            for name in names:
                why = _lora_layer_reason(getattr(getattr(layer, part), name), f"layers.{i}.{part}.{name}", model.training)
                if why is not None:
                    return why
    if type(base.lm_head) is not nn.Linear or base.lm_head.weight.requires_grad:
        return "the vocabulary projection is adapted or trains"
    return None


def _projection(group: list[nn.Module], dtype: torch.dtype) -> LeanProjection:
    """One fused group's base weights and its adapters' stacked factors (peft's update:
    scaling · B(A(x)), Hu et al. 2021, LoRA, eq. 3, ``lora/layer.py``)."""
    if dtype == torch.float32:
        weights = [frozen_weight(m) for m in group]
    else:
        weights = [low_precision_group([m.base_layer for m in group], dtype)]
    biases = [frozen_bias(m) for m in group]
    bias = None
    if any(b is not None for b in biases):
        bias = torch.cat([b if b is not None else frozen_weight(m).new_zeros(frozen_weight(m).shape[0])
                          for b, m in zip(biases, group)]).to(dtype)
    a_blocks, b_blocks = [], []
    for module in group:
        names = [name for name in module.active_adapters if name in module.lora_A]
        a_blocks += [module.lora_A[name].weight for name in names]
        # one member's adapters side by side: its output rows, their rank columns
        b_blocks.append(torch.cat([module.lora_B[name].weight * module.scaling[name] for name in names], dim=1))
    a = torch.cat(a_blocks)
    layout = block_layout([b.shape[0] for b in b_blocks], [b.shape[1] for b in b_blocks])
    if layout is None:  # torch.block_diag passes each B its own gradient
        return LeanProjection(weights=weights, bias=bias, a=a, b=torch.block_diag(*b_blocks))
    width, reads = layout
    b = torch.cat([block.view(-1, width, block.shape[1]) for block in b_blocks]).transpose(1, 2)  # [k, r, w]
    identity = reads == list(range(len(group)))
    return LeanProjection(weights=weights, bias=bias, a=a, b=b,
                          reads=None if identity else torch.tensor(reads, device=a.device))


def lean_weights(model: nn.Module, dtype: torch.dtype) -> LeanWeights:
    """Everything one pass reads, gathered once per pass (the factors change every step)."""
    base = base_model(model)
    config = base.config
    layers = []
    for layer in base.model.layers:
        groups = [[getattr(getattr(layer, part), name) for name in names] for part, names in LLAMA_PROJECTIONS]
        qkv, o, gate_up, down = (_projection(group, dtype) for group in groups)
        attn = layer.self_attn
        qk_norm = None
        if hasattr(attn, "q_norm"):  # Qwen3: an RMSNorm over each query and key head
            qk_norm = torch.cat([attn.q_norm.weight.expand(config.num_attention_heads, -1),
                                 attn.k_norm.weight.expand(config.num_key_value_heads, -1)])
        layers.append(LeanLayer(qkv=qkv, o=o, gate_up=gate_up, down=down, input_norm=layer.input_layernorm.weight,
                                mlp_norm=layer.post_attention_layernorm.weight, qk_norm=qk_norm))
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return LeanWeights(layers=layers, embed=base.model.embed_tokens.weight, final_norm=base.model.norm.weight,
                       head=base.lm_head.weight, head_bias=base.lm_head.bias, eps=float(config.rms_norm_eps),
                       n_heads=config.num_attention_heads, n_kv_heads=config.num_key_value_heads, head_dim=head_dim,
                       rotary=base.model.rotary_emb)


@dataclass
class Segment:
    """One run of the pass laid out [n, s]: the prefix every prompt shares (one row), the
    prompts (or their remainders after it), the completions, or (one completion per prompt)
    each prompt with its completion after it. Row r of a segment sees the columns its parent,
    row r // ``fan_out`` of the segment before, sees (that row's own ancestors included), then
    its own, causally."""

    ids: torch.Tensor  # [n, s]
    columns: torch.Tensor  # [n, C + s]: which of the C columns seen before and the s own are real
    positions: torch.Tensor  # [n, s] rotary positions
    fan_out: int | None  # rows of this segment after each row of the one before (None: the first segment)
    tokens: torch.Tensor | None  # flat indices into n·s of the tokens computed, ascending (None: all)

    @property
    def size(self) -> int:
        return self.ids.numel() if self.tokens is None else self.tokens.numel()

    def flat(self, values: torch.Tensor) -> torch.Tensor:
        """The computed tokens' entries of ``values`` [n·s, ...]."""
        return values if self.tokens is None else values.index_select(0, self.tokens)

    def laid_out(self, values: torch.Tensor) -> torch.Tensor:
        """The computed tokens' ``values`` [size, ...] in the [n·s, ...] layout, zero elsewhere."""
        if self.tokens is None:
            return values
        return values.new_zeros(self.ids.numel(), *values.shape[1:]).index_copy(0, self.tokens, values)


def _after(seen: torch.Tensor, own: torch.Tensor, fan_out: int) -> torch.Tensor:
    """Each row's keys (or values) ``own`` [n, h, s, d] after its parent's, ``seen``
    [n / fan_out, h, C, d]: one copy into [n, h, C + s, d], whose backward sums each parent's
    ``fan_out`` rows over a dimension (an ``index_select`` by parent would scatter-add them,
    several times slower on CPU)."""
    m = seen.shape[0]
    return torch.cat([seen.unsqueeze(1).expand(m, fan_out, *seen.shape[1:]), own.unflatten(0, (m, fan_out))],
                     dim=3).flatten(0, 1)


def _layer(w: LeanWeights, layer: LeanLayer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
           segments: list[Segment], masks: list[torch.Tensor]) -> torch.Tensor:
    """One decoder layer over every segment's computed tokens x [M, hidden] (fp32; segment by
    segment, in order). Norms, projections and the MLP run on all M tokens at once; attention
    runs per segment on its [n, s] layout after the keys and values its rows' ancestors hold
    (the other slots zero, never seen by a computed token: ``attention_masks`` hides the
    columns that are not real)."""
    h_q, h_kv, d = w.n_heads, w.n_kv_heads, w.head_dim
    qkv = layer.qkv(_norm(x, layer.input_norm, w.eps)).view(-1, h_q + 2 * h_kv, d)
    qk = _rope_qk(qkv[:, : h_q + h_kv], cos, sin, layer.qk_norm, w.eps, w.round_norm_after_weight)
    v = qkv[:, h_q + h_kv:]
    outputs, seen, start = [], None, 0
    for segment, mask in zip(segments, masks):
        (n, s), end = segment.ids.shape, start + segment.size
        seg_qk = segment.laid_out(qk[start:end]).view(n, s, h_q + h_kv, d)
        keys, values = seg_qk[:, :, h_q:].transpose(1, 2), segment.laid_out(v[start:end]).view(n, s, h_kv, d).transpose(1, 2)
        if seen is not None:  # each row after its parent's keys and values
            keys, values = _after(seen[0], keys, segment.fan_out), _after(seen[1], values, segment.fan_out)
        attn = F.scaled_dot_product_attention(seg_qk[:, :, :h_q].transpose(1, 2), keys, values, attn_mask=mask,
                                              scale=d ** -0.5, enable_gqa=True)
        outputs.append(segment.flat(attn.transpose(1, 2).reshape(n * s, h_q * d)))
        seen, start = (keys, values), end
    x = x + layer.o(torch.cat(outputs) if len(outputs) > 1 else outputs[0])
    gate, up = layer.gate_up(_norm(x, layer.mlp_norm, w.eps)).chunk(2, dim=-1)
    return x + layer.down(F.silu(gate) * up)


def _forward(w: LeanWeights, segments: list[Segment], heads: torch.Tensor,
             targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Every layer over the segments' computed tokens, then the log-probs [len(heads)] (fp32) of
    ``targets`` at the rows ``heads`` of the flat token stream (segment by segment, each in its
    ``tokens`` order), computed from the hidden states without the vocabulary-wide logits
    (``token_logprobs``), and the entropy of each of those positions (detached)."""
    device = segments[0].ids.device
    ids = torch.cat([segment.flat(segment.ids.reshape(-1)) for segment in segments])
    positions = torch.cat([segment.flat(segment.positions.reshape(-1)) for segment in segments])
    like = torch.empty(0, dtype=torch.float32, device=device)
    cos, sin = rotary_tables(w, int(positions.max()) + 1, like)
    cos, sin = cos[positions][:, None], sin[positions][:, None]  # [M, 1, D]
    masks = [attention_masks(s.columns, s.ids.shape[1], {None})[None][:, None] for s in segments]  # [n, 1, s, C + s]
    x = F.embedding(ids, w.embed)  # the fp32 residual stream [M, hidden]
    for layer in w.layers:
        x = _layer(w, layer, x, cos, sin, segments, masks)
    hidden = _norm(x.index_select(0, heads), w.final_norm, w.eps)
    bias = None if w.head_bias is None else w.head_bias.float()
    return token_logprobs(hidden, w.head.float(), bias, targets, with_entropy=True)


def _prompt_segments(prompt_ids: Sequence[Sequence[int]], shared: int, pad: int, device) -> list[Segment]:
    """The shared prefix (when ``shared``) and the prompts' rest, each prompt's padding left out."""
    from labelrl.rollout.prefix import remainder_inputs
    from labelrl.rollout.model_inputs import left_pad

    if not shared:
        ids, columns, positions = left_pad(prompt_ids, pad, device)
        return [Segment(ids, columns, positions, fan_out=None, tokens=real_tokens(columns))]
    prefix = torch.tensor([list(prompt_ids[0][:shared])], dtype=torch.long, device=device)
    ids, columns, positions = remainder_inputs(prompt_ids, shared, pad, device)
    return [Segment(prefix, torch.ones_like(prefix), torch.arange(shared, device=device)[None], fan_out=None, tokens=None),
            Segment(ids, columns, positions, fan_out=len(prompt_ids),
                    tokens=real_tokens(columns[:, shared:]))]


def _joined(prompts: Segment, targets: torch.Tensor, mask: torch.Tensor, inputs: torch.Tensor,
            before: int) -> tuple[Segment, list[torch.Tensor]]:
    """The prompts' segment with each row's completion inputs after its prompt (G = 1), and the
    heads in ``lean_logprobs``' order: each row's last prompt token (it predicts the first
    completion token), then the real ``inputs`` (flat indices into [n, width - 1], row by row:
    offset o predicts o + 1)."""
    device = targets.device
    n, width = targets.shape
    s = prompts.ids.shape[1]
    columns = torch.cat([prompts.columns, mask[:, 1:].long()], dim=1)
    own = columns[:, -(s + width - 1):]
    steps = torch.arange(1, width, device=device)
    joined = Segment(torch.cat([prompts.ids, targets[:, :-1]], dim=1), columns,
                     torch.cat([prompts.positions, prompts.positions[:, -1:] + steps], dim=1),
                     fan_out=prompts.fan_out, tokens=real_tokens(own))
    # each slot's place in the flat token stream (slots not computed are never read)
    slot = torch.zeros(own.numel(), dtype=torch.long, device=device)
    computed = torch.arange(own.numel(), device=device) if joined.tokens is None else joined.tokens
    slot[computed] = before + torch.arange(computed.numel(), device=device)
    slot = slot.view(n, s + width - 1)
    return joined, [slot[:, s - 1], slot[:, s:].reshape(-1).index_select(0, inputs)]


def lean_logprobs(model: nn.Module, prompt_ids: Sequence[Sequence[int]], targets: torch.Tensor, mask: torch.Tensor,
                  group_size: int, shared: int, pad: int, dtype: torch.dtype, with_entropy: bool = False,
                  join: bool | None = None):
    """The log-probs [M] (fp32) of each completion's first token and of its other real tokens
    among ``targets`` [N, T] (N = B·G, grouped by prompt; ``mask`` marks the real ones), and where
    they stand: flat indices into N·T (every position 0, then the rest). ``with_entropy``: also
    the policy's entropy [M] (nats, detached) at the same positions, third.

    One pass runs the B prompts once (the prefix they share once before them, when ``shared``)
    and the G completions of each on top of its prompt, as ``completion_logprobs_shared`` runs
    the module pass, but every layer's projections, norms and MLP run on the tokens of all three
    at once (larger products, a third of the operations), and only on real tokens: a prompt's
    left padding and a completion's slots past its end are never computed.

    ``join`` (default: when G = 1, as SFT's items are) runs each prompt and its one completion
    as one segment, one row each: per layer one attention call, one layout and one copy of the
    prompts' keys and values fewer. Each query sees the same keys in the same order either way;
    ``join=False`` keeps them apart (the benchmark's other arm, and the tests' reference)."""
    w = lean_weights(model, dtype)
    n, width = targets.shape
    device = targets.device
    segments = _prompt_segments(prompt_ids, shared, pad, device)
    prompts = segments[-1]
    # each prompt's last token (always real under left padding) predicts its completions' first
    before = sum(segment.size for segment in segments[:-1])
    real_per_prompt = prompts.columns[:, -prompts.ids.shape[1]:].sum(1)
    last = before + real_per_prompt.cumsum(0) - 1
    heads = [last.repeat_interleave(group_size)]
    where = [torch.arange(n, device=device) * width]
    join = group_size == 1 if join is None else join
    if join and group_size != 1:
        raise ValueError(f"join=True with group_size={group_size}: only a prompt's one completion can share its row")
    if width > 1:
        # the token at offset o is an input when token o + 1 is real
        inputs = mask[:, 1:].reshape(-1).nonzero().squeeze(1)
        where.append(inputs // (width - 1) * width + inputs % (width - 1) + 1)
        if join:
            segments[-1], heads = _joined(prompts, targets, mask, inputs, before)
        else:
            parent = torch.arange(len(prompt_ids), device=device).repeat_interleave(group_size)
            columns = torch.cat([prompts.columns.index_select(0, parent), mask[:, 1:].long()], dim=1)
            positions = prompts.positions[:, -1:].index_select(0, parent) + 1 + torch.arange(width - 1, device=device)
            segments.append(Segment(targets[:, :-1], columns, positions, fan_out=group_size,
                                    tokens=None if inputs.numel() == mask[:, 1:].numel() else inputs))
            heads.append(before + prompts.size + torch.arange(inputs.numel(), device=device))
    with torch.autocast(device_type=device.type, enabled=False):  # every dtype is set explicitly
        where = torch.cat(where)
        logprobs, entropy = _forward(w, segments, torch.cat(heads), targets.reshape(-1).index_select(0, where))
    return (logprobs, where, entropy) if with_entropy else (logprobs, where)
