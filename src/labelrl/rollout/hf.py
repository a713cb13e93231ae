"""The ``hf`` rollout backend: the same interface as ``sample_groups``, on ``model.generate``.

It is the reference the shared-prompt sampler is checked against, and the fallback for
models whose cache the sampler cannot share. ``generate`` copies each prompt G times before
prefilling, so its prompt cost is B*G passes where ``sample_groups`` pays B.
"""

from __future__ import annotations

import time
from typing import Sequence

import torch
from transformers import GenerationConfig

from labelrl.models.precision import compute
from labelrl.rollout.model_inputs import left_pad
from labelrl.rollout.sampler import (
    RolloutBatch, check_prompt_seeds, check_sampling_args, eval_mode, make_generator, model_device, normalise_eos,
)


def generate_groups(
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
    dtype: torch.dtype = torch.float32,
) -> RolloutBatch:
    """``sample_groups`` semantics through ``model.generate``.

    Sampling uses ``num_return_sequences=G`` (rows come back grouped by prompt); greedy
    (temperature 0) repeats each prompt G times instead, since ``generate`` refuses several
    return sequences without sampling. Every processor this interface does not name is set
    neutral (repetition penalty 1, no top-k unless asked) and the stop tokens are exactly
    ``eos_token_ids`` (an empty list stays empty), so a model's own ``generation_config``
    cannot change the distribution or where samples end. ``generate`` draws from torch's
    global RNG: it is seeded from ``seed``/``generator`` inside ``torch.random.fork_rng``,
    so the caller's global RNG state is left untouched. Log-probs come from the unprocessed
    logits (``output_logits``), i.e. the temperature-1 policy; they cost N×steps×V floats of
    memory. ``generate`` does not time its prefill apart: all time is in ``decode_s``.
    ``generate`` draws a whole batch from one stream, so ``prompt_seeds`` (one seed per
    prompt, see ``sample_groups``) costs one ``generate`` call per prompt. ``dtype`` bf16 runs
    ``generate`` under bf16 autocast with the vocabulary projection in fp32.
    """
    check_sampling_args(prompt_ids, group_size=group_size, max_new_tokens=max_new_tokens,
                        pad_token_id=pad_token_id, temperature=temperature, top_p=top_p, top_k=top_k)
    if prompt_seeds is not None:
        check_prompt_seeds(prompt_seeds, len(prompt_ids), seed, generator)
        options = dict(group_size=group_size, max_new_tokens=max_new_tokens, eos_token_ids=eos_token_ids,
                       pad_token_id=pad_token_id, temperature=temperature, top_p=top_p, top_k=top_k, dtype=dtype)
        return join_batches([generate_groups(model, [prompt], seed=int(s), **options)
                             for prompt, s in zip(prompt_ids, prompt_seeds)])
    rng = make_generator(seed, generator)
    eos = normalise_eos(eos_token_ids)
    greedy = temperature == 0
    device = model_device(model)
    input_ids, attention_mask, _ = left_pad(prompt_ids, pad_token_id, device)
    if greedy:
        input_ids = input_ids.repeat_interleave(group_size, dim=0)
        attention_mask = attention_mask.repeat_interleave(group_size, dim=0)
    config = _generation_config(group_size, max_new_tokens, eos, pad_token_id, greedy, temperature, top_p, top_k)
    global_seed = int(torch.randint(0, 2**62, (1,), generator=rng).item())
    devices = [device.index or 0] if device.type == "cuda" else []
    started = time.perf_counter()
    with torch.inference_mode(), eval_mode(model), torch.random.fork_rng(devices=devices), compute(model, dtype):
        torch.manual_seed(global_seed)
        out = model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config)
    elapsed = time.perf_counter() - started
    new_tokens = out.sequences[:, input_ids.shape[1]:].cpu()
    logprobs = _token_logprobs(out.logits, new_tokens)
    batch = _split_completions(new_tokens, logprobs, eos, len(prompt_ids), group_size, max_new_tokens)
    batch.timings = {"prefill_s": 0.0, "decode_s": elapsed, "new_tokens": float(sum(batch.lengths))}
    return batch


def join_batches(batches: list[RolloutBatch]) -> RolloutBatch:
    """Concatenate rollouts of consecutive prompt lists (prompt indices renumbered, times summed)."""
    joined = RolloutBatch(completion_ids=[], logprobs=[], truncated=[], lengths=[], prompt_index=[],
                          group_size=batches[0].group_size, timings={})
    offset = 0
    for batch in batches:
        joined.completion_ids += batch.completion_ids
        joined.logprobs += batch.logprobs
        joined.truncated += batch.truncated
        joined.lengths += batch.lengths
        joined.prompt_index += [offset + i for i in batch.prompt_index]
        offset += max(batch.prompt_index) + 1
        for key, value in batch.timings.items():
            joined.timings[key] = joined.timings.get(key, 0.0) + value
    return joined


def _generation_config(group_size, max_new_tokens, eos, pad_token_id, greedy, temperature, top_p, top_k):
    options = dict(
        max_new_tokens=max_new_tokens, min_new_tokens=0, eos_token_id=eos, pad_token_id=pad_token_id,
        return_dict_in_generate=True, output_logits=True, use_cache=True, num_beams=1,
        repetition_penalty=1.0, no_repeat_ngram_size=0,
    )
    if greedy:
        options.update(do_sample=False, num_return_sequences=1)
    else:
        options.update(do_sample=True, num_return_sequences=group_size, temperature=temperature,
                       top_p=top_p, top_k=top_k)
    return GenerationConfig(**options)


def _token_logprobs(step_logits: tuple[torch.Tensor, ...], new_tokens: torch.Tensor) -> torch.Tensor:
    """[N, S] log-softmax of each step's raw logits at the token generated, step by step so
    at most one [N, V] float32 block is alive at a time."""
    columns = [
        torch.log_softmax(logits.float().cpu(), dim=-1).gather(-1, new_tokens[:, s:s + 1])
        for s, logits in enumerate(step_logits)
    ]
    return torch.cat(columns, dim=1) if columns else torch.zeros(new_tokens.shape)


def _split_completions(new_tokens, logprobs, eos: list[int], n_prompts: int, group_size: int,
                       max_new_tokens: int) -> RolloutBatch:
    """Cut each row after its first EOS; a row without EOS ran to the cap (no padding)."""
    eos_set = set(eos)
    completion_ids, completion_logprobs, truncated = [], [], []
    for tokens, row_logprobs in zip(new_tokens.tolist(), logprobs.tolist()):
        end = next((t + 1 for t, token in enumerate(tokens) if token in eos_set), len(tokens))
        completion_ids.append(tokens[:end])
        completion_logprobs.append(row_logprobs[:end])
        truncated.append(end == max_new_tokens and tokens[end - 1] not in eos_set)
    return RolloutBatch(
        completion_ids=completion_ids, logprobs=completion_logprobs, truncated=truncated,
        lengths=[len(c) for c in completion_ids],
        prompt_index=[r // group_size for r in range(n_prompts * group_size)], group_size=group_size,
    )
