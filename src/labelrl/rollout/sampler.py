"""The shared-prompt KV-cache sampler: G completions for each of B prompts.

Each prompt is run through the model once (the B prompts batched with left padding), its
key/value cache then serves its G samples (repeated G times along the batch dimension, or, in
the fast decoder while the completions are short next to the prompt, held once and read once
for the G rows), and all B*G samples decode together, one token per step. Compared with
``model.generate(num_return_sequences=G)``, which copies every prompt G times before the first
forward pass, the prefill costs B prompt passes instead of B*G. For the Llama, Qwen2, Qwen3 and Gemma 3 models
``labelrl.rollout.fast_decode`` supports (``fast=True``, the default) the prefill and the decode
steps run on its packed weights, and the tokens every prompt starts with (chat template and
system message) are prefilled once (``labelrl.rollout.prefix``'s layout; not on sliding-window
layers); other models run through their own forward (``HFStepper``).

The helpers here (argument checks, logit warping, seeding, eval mode) and the left padding of
``labelrl.rollout.model_inputs`` are shared by every backend, so the backends agree on what each
argument means.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import torch
import torch.nn.functional as F

from labelrl.models.precision import check_compute_dtype, compute
from labelrl.rollout.fast_decode import fast_prefill, fuse_llama, unsupported_reason
from labelrl.rollout.model_inputs import cache_kwarg, left_pad, new_cache


@dataclass
class RolloutBatch:
    """B prompts × G samples, grouped contiguously: prompt i owns rows i*G … i*G+G−1.

    ``logprobs[r][t]`` is log π(token t | prompt, tokens < t) under the model's raw
    distribution at temperature 1, whatever temperature/top-k/top-p the token was drawn
    with: that is the quantity the trainer's importance ratio compares against, and what
    ``labelrl.rollout.logprobs.completion_logprobs`` recomputes with gradients.
    """

    completion_ids: list[list[int]]  # [B*G][length], EOS included when produced
    logprobs: list[list[float]]  # [B*G][length], nats, temperature-1 policy
    truncated: list[bool]  # [B*G] hit max_new_tokens without producing EOS
    lengths: list[int]  # [B*G] number of generated tokens
    prompt_index: list[int]  # [B*G] row → index of its prompt in the input list
    group_size: int
    timings: dict[str, float] = field(default_factory=dict)  # prefill_s, decode_s, new_tokens


def check_sampling_args(
    prompt_ids: Sequence[Sequence[int]], *, group_size: int, max_new_tokens: int,
    pad_token_id: int, temperature: float, top_p: float, top_k: int,
) -> None:
    """Raise ValueError naming the value, the rule and the fix for bad user input."""
    if len(prompt_ids) == 0:
        raise ValueError("prompt_ids is empty: sampling needs at least one prompt; pass a list of token-id lists")
    for i, prompt in enumerate(prompt_ids):
        if len(prompt) == 0:
            raise ValueError(f"prompt_ids[{i}] is empty: every prompt needs at least one token; add a BOS or chat-template token")
    if group_size < 1:
        raise ValueError(f"group_size={group_size}: need at least 1 completion per prompt; set group_size to 1 or more")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens}: need room for at least one token; set max_new_tokens to 1 or more")
    if not isinstance(pad_token_id, int) or pad_token_id < 0:
        raise ValueError(f"pad_token_id={pad_token_id!r}: must be a token id (int >= 0); pass the tokenizer's pad or EOS id")
    if not (temperature >= 0 and math.isfinite(temperature)):
        raise ValueError(f"temperature={temperature}: must be finite and >= 0 (0 means greedy); set e.g. temperature=1.0")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p={top_p}: the nucleus mass must lie in (0, 1]; use 1.0 to switch nucleus sampling off")
    if top_k < 0:
        raise ValueError(f"top_k={top_k}: must be >= 0; use 0 to switch top-k off")


def check_prompt_seeds(prompt_seeds: Sequence[int], n_prompts: int, seed, generator) -> None:
    """``prompt_seeds`` replaces ``seed``/``generator`` and needs one seed per prompt."""
    if seed is not None or generator is not None:
        raise ValueError("prompt_seeds was given with seed or generator: pass one way of seeding "
                         "(prompt_seeds for one stream per prompt, seed or generator for one stream)")
    if len(prompt_seeds) != n_prompts:
        raise ValueError(f"{len(prompt_seeds)} prompt_seeds for {n_prompts} prompts: pass one seed per prompt")


def normalise_eos(eos_token_ids: int | Sequence[int] | None) -> list[int]:
    """One id, several ids or None (no stop token: every sample runs to max_new_tokens)."""
    if eos_token_ids is None:
        return []
    if isinstance(eos_token_ids, int):
        return [eos_token_ids]
    return [int(t) for t in eos_token_ids]


def make_generator(seed: int | None, generator: torch.Generator | None) -> torch.Generator:
    """The CPU generator that draws every sample: ``generator`` as given, a fresh one seeded
    with ``seed``, or (neither) one seeded from torch's global RNG, so ``torch.manual_seed``
    still makes an unseeded call reproducible."""
    if seed is not None and generator is not None:
        raise ValueError("seed and generator were both given: pass one (seed for a fresh stream, generator to continue one)")
    if generator is not None:
        return generator
    if seed is None:
        seed = int(torch.randint(0, 2**62, (1,)).item())
    return torch.Generator(device="cpu").manual_seed(int(seed))


def warp_logits(logits: torch.Tensor, *, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Float32 scores [N, V] to sample from: temperature, then top-k, then top-p (the order
    ``generate`` applies them); tokens outside the kept set get -inf.

    top-k keeps every token tied with the k-th score; top-p keeps, in decreasing order, each
    token whose strictly-more-likely tokens hold less than ``top_p`` of the mass (so the most
    likely token always survives). ``temperature`` must be > 0 here; 0 is handled as argmax.
    """
    scores = logits.float() / temperature
    vocab = scores.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(scores, top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, -math.inf)
    if top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
        probs = sorted_scores.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs
        drop_sorted = mass_before >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, -math.inf)
    return scores


# The draw finds the block of the vocabulary the uniform falls in from the blocks' totals, then
# the token within it: a running sum over one block instead of the whole vocabulary (which, in
# float64 over 49k tokens at 8 rows, cost more than a millisecond of each decode step on 2 cores).
DRAW_BLOCK = 1024


def draw_tokens(
    logits: torch.Tensor, *, temperature: float, top_k: int, top_p: float,
    generator: torch.Generator | None = None, uniforms: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Next token per row [N] from raw logits [N, V], and its log-prob [N] under the
    temperature-1 policy softmax(logits) (fp32): argmax at temperature 0, else a draw.

    The draw inverts each row's cumulative distribution at one uniform number u ∈ [0, 1):
    the token is the first whose cumulative probability exceeds u (an exact draw from
    softmax(scores); tokens that top-k/top-p removed have probability 0 and are never
    chosen). ``uniforms`` [N] (float64, see ``row_uniforms``) when given, else fresh ones
    from ``generator``, drawn on the CPU so one seed gives the same tokens on every device.
    One random number per row: the Gumbel-max draw used before needed V exponentials per
    row, 6 ms of a ~40 ms decode step at 8 rows × 49k tokens on this CPU. The log-prob is
    read from the draw's own softmax when the draw is the temperature-1 policy's."""
    if temperature == 0:
        tokens = logits.argmax(dim=-1)
        return tokens, logprobs_of_tokens(logits, tokens)
    plain = temperature == 1 and not 0 < top_k < logits.shape[-1] and top_p >= 1.0  # warp_logits would keep every score
    scores = logits.float() if plain else warp_logits(logits, temperature=temperature, top_k=top_k, top_p=top_p)
    if uniforms is None:
        uniforms = torch.rand(scores.shape[0], dtype=torch.float64, generator=generator)
    probs = torch.softmax(scores, dim=-1)
    tokens = inverse_cdf(probs, uniforms.to(probs.device))
    if plain:  # log p of a drawn token: it holds at least ~1e-16 of the mass, far from fp32's underflow
        return tokens, probs.gather(-1, tokens[:, None]).squeeze(-1).log()
    return tokens, logprobs_of_tokens(logits, tokens)


def logprobs_of_tokens(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[token] per row, fp32."""
    logits = logits.float()
    return logits.gather(-1, tokens[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor, block: int = DRAW_BLOCK) -> torch.Tensor:
    """Per row of ``probs`` [N, V] (fp32, ≥ 0), the first token whose cumulative probability,
    summed in float64, exceeds u × the row's total, ``uniforms`` [N] (float64, in [0, 1)).

    Two levels: the blocks' totals locate the block, a running sum within it the token. Both are
    float64 sums of the same fp32 numbers, in different orders, so they can disagree by a few
    units of 2⁻⁵³ of the total; when u × total falls in that sliver past the block's own running
    sum (or past the last block's end), the last token of positive probability before it is
    taken. So a token of probability 0 is never chosen.
    """
    rows, vocab = probs.shape
    blocks = -(-vocab // block)
    padded = probs if blocks * block == vocab else F.pad(probs, (0, blocks * block - vocab))
    by_block = padded.view(rows, blocks, block)
    totals = by_block.sum(dim=-1, dtype=torch.float64)  # [N, blocks]
    block_cdf = totals.cumsum(dim=-1)
    threshold = (uniforms * block_cdf[:, -1]).unsqueeze(-1)
    chosen = torch.minimum(torch.searchsorted(block_cdf, threshold, right=True), _last_positive(totals))  # [N, 1]
    before = torch.where(chosen > 0, block_cdf.gather(-1, (chosen - 1).clamp(min=0)), 0.0)
    inside = by_block.gather(1, chosen[:, :, None].expand(rows, 1, block)).squeeze(1)  # [N, block]
    offset = torch.searchsorted(inside.double().cumsum(dim=-1), threshold - before, right=True)
    offset = torch.minimum(offset, _last_positive(inside))
    return (chosen * block + offset).squeeze(-1)


def _last_positive(values: torch.Tensor) -> torch.Tensor:
    """Per row of ``values`` [N, K], the index of its last positive entry [N, 1]."""
    return values.shape[-1] - 1 - (values > 0).flip(-1).int().argmax(dim=-1, keepdim=True)


def row_uniforms(live: torch.Tensor, generators: Sequence[torch.Generator], group_size: int) -> torch.Tensor:
    """One uniform number [len(live)] per live row (float64), each group's rows from its own generator.

    ``live`` holds ascending original row indices (row r belongs to prompt r // G), so each
    group's live rows are contiguous; a group draws only for its own live rows, so its
    samples do not depend on which other prompts share the batch.
    """
    groups, counts = torch.unique_consecutive(live // group_size, return_counts=True)
    return torch.cat([torch.rand(int(n), dtype=torch.float64, generator=generators[int(g)])
                      for g, n in zip(groups.tolist(), counts.tolist())])


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """Dropout off while sampling; each submodule's own train/eval flag is restored after."""
    flags = {module: module.training for module in model.modules()}
    model.eval()
    try:
        yield
    finally:
        for module, training in flags.items():
            module.training = training


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def pad_id(tokenizer) -> int:
    """The tokenizer's pad id, else its end-of-sequence id (padding is always masked out)."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def sample_groups(
    model: torch.nn.Module,
    prompt_ids: Sequence[Sequence[int]],
    *,
    group_size: int,
    max_new_tokens: int,
    eos_token_ids: int | Sequence[int] | None,
    pad_token_id: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    prompt_seeds: Sequence[int] | None = None,
    fast: bool = True,
    dtype: torch.dtype = torch.float32,
) -> RolloutBatch:
    """Sample ``group_size`` completions for each prompt, sharing each prompt's KV cache.

    The B prompts are prefilled once, left-padded in one batch; the cache serves each
    prompt's G rows (repeated G times on the batch dimension, or held once for them:
    ``fast_decode.FastLlamaDecoder``) and the B*G samples decode together. A sample stops at
    any of ``eos_token_ids`` (kept in its completion) or after ``max_new_tokens`` (then
    ``truncated``). A finished sample is dropped from the decoding batch (its cache rows with
    it, or, in a prompt's shared cache, once its whole group has finished), which is what
    padding it would do, without the compute; decoding stops once every sample has finished.

    Sampling: ``temperature`` 0 is greedy (argmax, the same tokens as
    ``model.generate(do_sample=False)``); otherwise temperature, top-k (0: off) and top-p
    (1.0: off) are applied in that order on float32 logits and a token is drawn with a CPU
    ``torch.Generator``: ``seed`` starts a fresh one, ``generator`` continues yours; the
    same seed and inputs give the same samples. ``prompt_seeds`` (one per prompt, instead of
    ``seed``/``generator``) gives each prompt's group its own generator, so a prompt's
    samples are the same whichever other prompts share the call: a trainer split over
    several processes then samples what one process would. The model's own forward (the
    fallback) runs in eval mode, each module's flag restored after; the fast path runs no
    module. Log-probs are those of the temperature-1 policy (see
    RolloutBatch).

    ``fast`` (default) decodes with ``labelrl.rollout.fast_decode`` when the model is one
    it supports (Llama, Qwen2, Qwen3, Gemma 3) (LoRA adapters are folded into the weights for the call), else, or with
    ``fast=False``, through the model's own forward; both give the same logits up to float
    rounding. ``timings["fast_decode"]`` is 1.0 when the fast path ran.

    ``dtype`` is the compute dtype (``labelrl.models.precision``): fp32, or bf16 for the
    projections, attention and KV cache with the residual stream, norms and logits in fp32
    (the fast path as in ``fast_decode``, the prefill and the fallback under bf16 autocast).
    Sampling always draws from fp32 logits.
    """
    check_sampling_args(prompt_ids, group_size=group_size, max_new_tokens=max_new_tokens,
                        pad_token_id=pad_token_id, temperature=temperature, top_p=top_p, top_k=top_k)
    check_compute_dtype(dtype)
    options = _draw_options(len(prompt_ids), group_size, temperature, top_p, top_k, seed, generator, prompt_seeds)
    use_fast = fast and unsupported_reason(model) is None
    # The fast path reads the weights and never runs a module, so only the model's own forward
    # needs eval mode (setting and restoring every module's flag costs ~10 ms a call on SmolLM2).
    with torch.inference_mode(), contextlib.nullcontext() if use_fast else eval_mode(model):
        started = time.perf_counter()
        weights = fuse_llama(model, len(prompt_ids) * group_size, dtype) if use_fast else None
        fused = time.perf_counter()
        logits, stepper = _prefill(model, prompt_ids, group_size, pad_token_id, weights, max_new_tokens, dtype)
        prefilled = time.perf_counter()
        refold = (lambda: fuse_llama(model, len(prompt_ids) * group_size, dtype, fold_all=True)) if use_fast else None
        steps = _decode(stepper, logits, max_new_tokens, normalise_eos(eos_token_ids), options, refold)
        finished = time.perf_counter()
    batch = _assemble(steps, len(prompt_ids), group_size, max_new_tokens, normalise_eos(eos_token_ids))
    batch.timings = {"fuse_s": fused - started, "prefill_s": prefilled - fused, "decode_s": finished - prefilled,
                     "new_tokens": float(sum(batch.lengths)), "fast_decode": float(weights is not None),
                     "fuse_cached": float(weights is not None and weights.base_cached)}
    return batch


def _draw_options(n_prompts: int, group_size: int, temperature: float, top_p: float, top_k: int, seed: int | None,
                  generator: torch.Generator | None, prompt_seeds: Sequence[int] | None) -> dict:
    """How ``_decode`` draws tokens: the sampling knobs and one generator for the call, or one
    per prompt (``prompt_seeds``)."""
    options: dict = dict(temperature=temperature, top_k=top_k, top_p=top_p)
    if prompt_seeds is None:
        options["generator"] = make_generator(seed, generator)
    else:
        check_prompt_seeds(prompt_seeds, n_prompts, seed, generator)
        options["generators"] = [torch.Generator(device="cpu").manual_seed(int(s)) for s in prompt_seeds]
        options["group_size"] = group_size
    return options


class HFStepper:
    """One decode step through the model's own forward and a DynamicCache (the fallback path);
    the same ``step``/``select`` interface as ``fast_decode.FastLlamaDecoder``."""

    def __init__(self, model, cache, attention_mask: torch.Tensor, next_positions: torch.Tensor,
                 dtype: torch.dtype = torch.float32):
        self.model, self.cache, self.cache_arg, self.dtype = model, cache, cache_kwarg(model), dtype
        self.attention_mask, self.positions = attention_mask, next_positions  # [N, T], [N, 1]

    def select(self, rows: torch.Tensor) -> None:
        self.cache.batch_select_indices(rows)
        self.attention_mask, self.positions = self.attention_mask[rows], self.positions[rows]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Float32 next-token logits [N, V] after feeding ``tokens`` [N]."""
        ones = self.attention_mask.new_ones((len(tokens), 1))
        self.attention_mask = torch.cat([self.attention_mask, ones], dim=-1)
        with compute(self.model, self.dtype):
            out = self.model(input_ids=tokens[:, None], attention_mask=self.attention_mask, position_ids=self.positions,
                             use_cache=True, **{self.cache_arg: self.cache})
        self.positions = self.positions + 1
        return out.logits[:, -1].float()


def _prefill(model, prompt_ids, group_size: int, pad_token_id: int, weights, max_new_tokens: int,
             dtype: torch.dtype = torch.float32):
    """One forward over the B prompts (at ``dtype``); returns the first logits [B*G, V] and a
    stepper over B*G rows: with ``weights``, ``fast_prefill`` and the fast decoder, else the
    model's own forward and ``HFStepper``."""
    device = model_device(model)
    if weights is not None:
        from labelrl.rollout.prefix import prefill_inputs

        # the tokens every prompt starts with (template, system message) run once
        sliding = any(layer.sliding_window for layer in weights.layers)
        *inputs, prefix = prefill_inputs(prompt_ids, pad_token_id, device, sliding)
        return fast_prefill(weights, *inputs, group_size, max_new_tokens, prefix=prefix)
    input_ids, attention_mask, position_ids = left_pad(prompt_ids, pad_token_id, device)
    cache = new_cache(model)
    with compute(model, dtype):
        out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                    use_cache=True, logits_to_keep=1, **{cache_kwarg(model): cache})
    logits = out.logits[:, -1].float().repeat_interleave(group_size, dim=0)  # [B*G, V]
    cache.batch_repeat_interleave(group_size)
    next_positions = (position_ids[:, -1:] + 1).repeat_interleave(group_size, dim=0)
    return logits, HFStepper(model, cache, attention_mask.repeat_interleave(group_size, dim=0), next_positions, dtype)


# A trained LoRA adapter costs two small products per projection per decode step, while folding
# it into the weights costs one re-pack (labelrl.rollout.fused). Which is cheaper depends on how
# many steps a call will take, unknown in advance: as in the ski-rental problem (Karlin et al.
# 1988), pay per step until the running cost nears that of folding, then fold. On SmolLM2 at
# r=16 (2 cores) folding cost as much as 30–90 steps of low-rank products; after 64 steps the
# rest of the call runs on folded weights, never more than about twice the cheaper choice.
FOLD_AFTER_STEPS = 64


def _decode(stepper, logits, max_new_tokens: int, eos: list[int], options: dict, refold=None):
    """Decode until every row has stopped; returns per step (live rows, tokens, log-probs).
    ``refold`` (fast path) builds weights with every adapter folded in, used from step
    ``FOLD_AFTER_STEPS`` on when the current weights carry low-rank updates."""
    live = torch.arange(logits.shape[0])  # original row index of each live row
    eos_ids = torch.tensor(eos, dtype=torch.long, device=logits.device)
    generators, group_size = options.pop("generators", None), options.pop("group_size", None)
    steps = []
    for step in range(max_new_tokens):
        uniforms = None
        if generators is not None and options["temperature"] > 0:
            uniforms = row_uniforms(live, generators, group_size)
        tokens, logprobs = draw_tokens(logits, uniforms=uniforms, **options)
        steps.append((live, tokens.cpu(), logprobs.cpu()))
        keep = ~torch.isin(tokens, eos_ids)
        if step == max_new_tokens - 1 or not keep.any():
            break
        if not keep.all():
            rows = keep.nonzero().squeeze(-1)
            stepper.select(rows)
            live, tokens = live[rows.cpu()], tokens[rows]
        if step + 1 == FOLD_AFTER_STEPS and refold is not None and stepper.w.has_low_rank:
            stepper.w = refold()
        logits = stepper.step(tokens)
    return steps


def _assemble(steps, n_prompts: int, group_size: int, max_new_tokens: int, eos: list[int]) -> RolloutBatch:
    rows = n_prompts * group_size
    completion_ids: list[list[int]] = [[] for _ in range(rows)]
    logprobs: list[list[float]] = [[] for _ in range(rows)]
    for live, tokens, step_logprobs in steps:
        for row, token, logprob in zip(live.tolist(), tokens.tolist(), step_logprobs.tolist()):
            completion_ids[row].append(token)
            logprobs[row].append(logprob)
    eos_set = set(eos)
    truncated = [len(c) == max_new_tokens and c[-1] not in eos_set for c in completion_ids]
    return RolloutBatch(
        completion_ids=completion_ids, logprobs=logprobs, truncated=truncated,
        lengths=[len(c) for c in completion_ids],
        prompt_index=[r // group_size for r in range(rows)], group_size=group_size,
    )
