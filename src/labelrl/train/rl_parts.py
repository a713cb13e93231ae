"""The named steps of the RL loop (labelrl.train.rl), each small and testable on its own."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import torch

from labelrl import metrics_keys as K
from labelrl.advantages import compute_advantages
from labelrl.advantages.diagnostics import uniform_groups
from labelrl.losses import policy_loss
from labelrl.rewards.grade import parse_class_rewards, read_reward_table, success_threshold
from labelrl.rewards.reward_fn import RewardConfig, score_completions
from labelrl.rollout import BACKENDS
from labelrl.rollout.fast_decode import unsupported_reason
from labelrl.rollout.fused import kept_bytes
from labelrl.rollout.lean_pass import lean_reason
from labelrl.rollout.logprobs import completion_logprobs_shared
from labelrl.rollout.prefix import prefix_supported, shared_prefix_length
from labelrl.rollout.sampler import pad_id
from labelrl.train.collapse import answer_recalls, answer_shares
from labelrl.train.distributed import gather_objects
from labelrl.train.memory import plan_memory
from labelrl.train.memory_rl import PROBED_PROMPTS, PassShape, rl_pass_growth_bytes
from labelrl.train.pass_measures import measure_pass, padded_logprobs
from labelrl.train.presets import resolve_preset
from labelrl.train.setup import peak_memory_mb  # noqa: F401  (re-exported for the loop)
from labelrl.types import LabelSpace


@dataclass(frozen=True)
class Algorithm:
    """The three knobs (estimator, surrogate, aggregation) plus the reward definition."""

    estimator: str
    estimator_options: dict
    surrogate: str
    surrogate_options: dict
    aggregation: str
    reward: RewardConfig
    success_threshold: float
    corpo_threshold: float | None
    label_names: tuple[str, ...]
    data_label_share: dict
    dynamic_sampling: bool

    def diagnostic_options(self, batch: "StepBatch") -> dict:
        return {
            "success_threshold": self.success_threshold,
            "labels": batch.group_labels,
            "label_names": list(self.label_names),
            "data_label_share": self.data_label_share,
            "corpo_threshold": self.corpo_threshold,
            "baseline_mask": torch.tensor([g.baseline_mask for g in batch.graded], dtype=torch.bool),
        }


def resolve_algorithm(cfg, labels: LabelSpace, train_labels: list[str] | None = None) -> Algorithm:
    """A preset with the user's overrides, and the reward config, validated together."""
    preset = resolve_preset(cfg.preset, estimator=cfg.estimator, surrogate=cfg.surrogate, aggregation=cfg.aggregation,
                            scale=cfg.scale)
    estimator_options = preset.advantage_options()  # with --scale's scale_by_std / batch_std
    if preset.estimator == "corpo":
        estimator_options["threshold"] = cfg.threshold
    reward = RewardConfig(
        reasoning=cfg.mode == "reasoning",
        parse_mode=cfg.parse_mode,
        labels=list(labels.labels),
        kind=labels.kind,
        correct=cfg.correct_reward,
        incorrect=cfg.incorrect_reward,
        failure=cfg.failure_reward,
        per_class=parse_class_rewards(cfg.class_reward) if cfg.class_reward else None,
        table=read_reward_table(cfg.reward_table) if cfg.reward_table else None,
        truncation=cfg.truncation,
        max_new_tokens=cfg.max_new_tokens,
        cache_tokens=cfg.overlong_cache,
    )
    # One definition of "failed" for every estimator: the task's success threshold (default full
    # credit). CoRPO's τ is an estimator option and may differ from it.
    threshold = cfg.success_threshold if cfg.success_threshold is not None else success_threshold(reward.scale())
    return Algorithm(
        estimator=preset.estimator, estimator_options=estimator_options,
        surrogate=preset.surrogate, surrogate_options=dict(preset.surrogate_options),
        aggregation=preset.aggregation, reward=reward, success_threshold=threshold,
        corpo_threshold=cfg.threshold if preset.estimator == "corpo" else None,
        label_names=labels.labels, data_label_share=_label_share(labels, train_labels or []),
        dynamic_sampling=cfg.dynamic_sampling or preset.dynamic_sampling,
    )


def _label_share(labels: LabelSpace, train_labels: list[str]) -> dict[str, float]:
    counts = Counter(train_labels)
    total = max(1, len(train_labels))
    return {name: counts.get(name, 0) / total for name in labels.labels}


def sampling_options(cfg, tokenizer, dtype: torch.dtype = torch.float32) -> dict:
    eos = [tokenizer.eos_token_id]
    pad = pad_id(tokenizer)
    return dict(group_size=cfg.group_size, max_new_tokens=cfg.max_new_tokens, eos_token_ids=eos,
                pad_token_id=pad, temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k, dtype=dtype)


def plan_rl_memory(cfg, model, dtype: torch.dtype, prompts: list[list[int]], share: slice, single: bool = True):
    """The memory plan of the training pass at its largest: this process's share of the B
    prompts, each the longest training prompt, sharing only the prefix every training prompt
    shares (one process; several run without it), with G completions of ``max_new_tokens``; under
    the lean pass, the batch of the longest prompts instead (``PassShape.next_remainders``).
    What that pass saves is measured on its own shape (``labelrl.train.memory_rl``); with
    checkpointing the plain pass runs instead (transformers drops the cache inside checkpointed
    layers): B·G·(P + T) positions. labelrl's sampler keeps its packed base between steps when
    the base is frozen (LoRA), through every training pass: counted. vLLM's engine is sized by
    its own option and not counted here."""
    prompts_here = len(range(cfg.prompts_per_step)[share])
    longest, G, T = max(len(p) for p in prompts), cfg.group_size, cfg.max_new_tokens
    shared = shared_prefix_length(prompts) if single and prefix_supported(model) else 0
    # The lean pass computes each prompt's real tokens only: the worst batch is the longest prompts,
    # the probe's line rising by the third-longest's bytes per prompt (each later one no longer).
    # The module pass computes the padding too: every prompt costs the longest's.
    lean = single and lean_reason(model) is None
    following = sorted((len(p) - shared for p in prompts), reverse=True)[1:max(PROBED_PROMPTS)] if lean else []
    shape = PassShape(prompts=prompts_here, group_size=G, shared=shared, remainder=longest - shared, new_tokens=T,
                      share_prefix=single, next_remainders=tuple(following))
    held = kept_bytes(model, dtype) if cfg.backend == "labelrl" and unsupported_reason(model) is None else 0
    return plan_memory(model, dtype, tokens=shared + prompts_here * (longest - shared + G * T),
                       tokens_checkpointed=prompts_here * G * (longest + T), logit_positions=prompts_here * G * T,
                       requested=cfg.gradient_checkpointing, budget_gib=cfg.memory_budget, held_bytes=held,
                       knobs="--prompts-per-step, --group-size, --max-new-tokens or --max-prompt-length",
                       pass_growth_bytes=lambda device: rl_pass_growth_bytes(model, shape, dtype, device),
                       pass_holds_logits=not lean)


def step_seed(seed: int, step: int, round_index: int) -> int:
    """Sampling seed of (step, round): a pure function, so resumed runs sample the same."""
    return (seed * 1_000_003 + step * 1_009 + round_index) % (2**31 - 1)


def prompt_seed(seed: int, step: int, round_index: int, position: int) -> int:
    """Sampling seed of the prompt at ``position`` in the step's round: a pure function of
    (seed, step, round, position), never of the process that samples it, so one process
    and several sample the same completions (and resumed runs too)."""
    return (step_seed(seed, step, round_index) * 1_000_033 + position) % (2**31 - 1)


def make_sampler(cfg, prompts: list[list[int]]):
    """The rollout backend; vLLM gets an engine of its own, sized by --vllm-gpu-memory (on a
    CPU: by the B·G sequences of a step), for the longest prompt plus the token cap."""
    sampler = BACKENDS.get(cfg.backend)
    if cfg.backend == "vllm":
        from labelrl.rollout.vllm import VLLMSampler

        longest = max(len(p) for p in prompts)
        sampler = VLLMSampler(gpu_memory_utilization=cfg.vllm_gpu_memory, max_model_len=longest + cfg.max_new_tokens,
                              max_sequences=cfg.prompts_per_step * cfg.group_size)
    return sampler


@dataclass
class StepBatch:
    """One step's groups, contiguous by prompt: rows i*G … i*G+G−1 belong to prompt i."""

    example_index: list[int]  # [B] index into the training items
    group_labels: list[str]  # [B]
    prompt_ids: list[list[int]]  # [B]
    completion_ids: list[list[int]]  # [B*G]
    texts: list[str]  # [B*G]
    truncated: list[bool]  # [B*G]
    graded: list  # [B*G] per-completion grading results
    rewards: torch.Tensor  # [B*G]
    loss_mask: torch.Tensor  # [B*G] bool: False for rollouts the truncation policy masks
    advantages: torch.Tensor  # [B*G]
    informative: torch.Tensor  # [B] bool: some advantage in the group is non-zero
    uniform: torch.Tensor  # [B] bool: all rewards equal
    new_tokens: int
    sample_seconds: float
    sampler_logprobs: list[list[float]] = field(default_factory=list)  # [B*G][length] the sampler's, temperature 1


def _random_rewards(run, positions: list[int], round_index: int) -> list[float]:
    """Control arm: rewards drawn independently of the answer, from the reward scale's values;
    drawn for the whole round and read at this process's ``positions``, so the draw does
    not depend on how many processes share the round."""
    scale = run.algo.reward.scale()
    values = sorted({scale.correct, scale.incorrect})
    rng = random.Random(step_seed(run.cfg.seed, run.step, round_index) + 7)
    G = run.cfg.group_size
    drawn = [rng.choice(values) for _ in range(run.cfg.prompts_per_step * G)]
    return [drawn[p * G + j] for p in positions for j in range(G)]


def grade_and_advantage(run, idx: list[int], rollout, round_index: int, positions: list[int] | None = None) -> StepBatch:
    """Decode, grade with the shared grader, and compute advantages for the groups of ``idx``
    (at ``positions`` in the round, by default 0 … len(idx)−1)."""
    G = run.cfg.group_size
    positions = list(range(len(idx))) if positions is None else positions
    examples = [run.data.train[i] for i in idx]
    labels = [ex.label for ex in examples for _ in range(G)]
    texts = run.tokenizer.batch_decode(rollout.completion_ids, skip_special_tokens=True)
    graded = score_completions(texts, labels, truncated=rollout.truncated, lengths=rollout.lengths, config=run.algo.reward)
    rewards = [g.reward for g in graded.items]
    if run.cfg.random_reward:
        rewards = _random_rewards(run, positions, round_index)
    reward_t = torch.tensor(rewards, dtype=torch.float64)
    baseline_mask = torch.tensor([g.baseline_mask for g in graded.items])
    advantages = compute_advantages(reward_t, G, run.algo.estimator, mask=baseline_mask, **run.algo.estimator_options)
    loss_mask = torch.tensor([g.loss_mask for g in graded.items])
    advantages = torch.where(loss_mask, advantages, torch.zeros_like(advantages))
    informative = (advantages.view(-1, G) != 0).any(dim=1)
    return StepBatch(
        example_index=idx, group_labels=[ex.label for ex in examples],
        prompt_ids=[run.train_prompts[i] for i in idx], completion_ids=rollout.completion_ids,
        texts=texts, truncated=list(rollout.truncated), graded=list(graded.items), rewards=reward_t,
        loss_mask=loss_mask, advantages=advantages, informative=informative,
        uniform=uniform_groups(reward_t, G), new_tokens=int(sum(rollout.lengths)),
        sample_seconds=float(rollout.timings.get("prefill_s", 0.0) + rollout.timings.get("decode_s", 0.0)),
        sampler_logprobs=[list(map(float, row)) for row in rollout.logprobs],
    )


def concat_batches(batches: list[StepBatch], limit_informative: int | None) -> StepBatch:
    """Join dynamic-sampling rounds; beyond ``limit_informative`` informative groups, later
    ones are marked uninformative and their advantages set to 0 (sampled and logged, never
    trained on, whatever the skip rule or β)."""
    if len(batches) == 1 and limit_informative is None:
        return batches[0]
    cat = lambda name: [x for b in batches for x in getattr(b, name)]  # noqa: E731
    informative = torch.cat([b.informative for b in batches])
    advantages = torch.cat([b.advantages for b in batches])
    if limit_informative is not None:
        seen = informative.cumsum(0)
        leftover = informative & (seen > limit_informative)
        informative = informative & ~leftover
        group_size = advantages.numel() // informative.numel()
        advantages = torch.where(leftover.repeat_interleave(group_size), torch.zeros_like(advantages), advantages)
    return StepBatch(
        example_index=cat("example_index"), group_labels=cat("group_labels"), prompt_ids=cat("prompt_ids"),
        completion_ids=cat("completion_ids"), texts=cat("texts"), truncated=cat("truncated"), graded=cat("graded"),
        rewards=torch.cat([b.rewards for b in batches]), loss_mask=torch.cat([b.loss_mask for b in batches]),
        advantages=advantages, informative=informative,
        uniform=torch.cat([b.uniform for b in batches]), new_tokens=sum(b.new_tokens for b in batches),
        sample_seconds=sum(b.sample_seconds for b in batches), sampler_logprobs=cat("sampler_logprobs"),
    )


def gather_batch(accelerator, batch: StepBatch) -> StepBatch:
    """The whole round on every process: each process's groups, in process order (the order
    one process would have sampled them). Sampling ran in parallel, so its time is the
    slowest process's."""
    parts = gather_objects(accelerator, batch)
    if len(parts) == 1:
        return batch
    whole = concat_batches(parts, limit_informative=None)
    whole.sample_seconds = max(b.sample_seconds for b in parts)
    return whole


def training_share(groups: list[int], accelerator) -> list[int]:
    """This process's contiguous, near-equal share of the groups to train on. Every process
    holds the whole batch, so the forward/backward work is split evenly even when the skip
    rule dropped more groups of one process's sampling than of another's."""
    n, rank = accelerator.num_processes, accelerator.process_index
    return groups[rank * len(groups) // n : (rank + 1) * len(groups) // n]


def loss_normaliser(batch: StepBatch, groups: list[int] | None, group_size: int) -> dict[str, int]:
    """Sequence and token counts the aggregation divides by: those of ``groups`` (dynamic
    sampling trains on the informative groups only), else of every group sampled."""
    groups = range(len(batch.prompt_ids)) if groups is None else groups
    rows = [g * group_size + j for g in groups for j in range(group_size)]
    tokens = sum(len(batch.completion_ids[r]) for r in rows if bool(batch.loss_mask[r]))
    return {"n_sequences": len(rows), "n_tokens": tokens}


def policy_loss_for_groups(run, batch: StepBatch, keep: list[int], old_logprobs, normaliser: dict):
    """Per-token log-probs of the kept groups (each prompt computed once) and the loss.

    Under several processes every process pads its completions to the batch's longest and
    skips the shared-prefix pass, so all make the same forward calls whatever their share holds.

    The importance ratio's denominator is this training pass's own log-probs (detached) on
    the first epoch, never the sampler's: with one on-policy epoch the ratio is exactly 1
    whatever the precision, and a bf16 sampler's rounding cannot leak into the loss. The gap
    to the sampler is measured (``pass_measures``) and, with ``--rollout-correction``, corrected
    by importance weights π_trainer/q_sampler on each token's loss, as TRL does
    (``labelrl.losses.rollout_correction``); the weights come from the first epoch's log-probs.
    """
    G = run.cfg.group_size
    rows = [g * G + j for g in keep for j in range(G)]
    single = run.accelerator.num_processes == 1
    width = None if single else max(len(c) for c in batch.completion_ids)
    # The reference pass comes first: it puts the starting weights in place for a moment
    # (labelrl.train.reference), which must not happen while this pass's graph holds them.
    ref = reference_logprobs(run, batch, keep, rows) if run.cfg.beta > 0 else None
    logprobs, real, entropy = completion_logprobs_shared(
        run.model, [batch.prompt_ids[g] for g in keep], [batch.completion_ids[r] for r in rows], G,
        pad_token_id=pad_id(run.tokenizer), min_width=width, dtype=run.dtype, share_prefix=single, with_entropy=True,
    )
    mask = real & batch.loss_mask[rows].unsqueeze(1).to(real.device)
    old = logprobs.detach() if old_logprobs is None else old_logprobs
    sampler = padded_logprobs([batch.sampler_logprobs[r] for r in rows], old) if batch.sampler_logprobs else None
    weights, measures = measure_pass(old, sampler, entropy, real, mask, run.cfg.rollout_correction,
                                     run.cfg.rollout_correction_max)
    loss, stats = policy_loss(
        logprobs, old, batch.advantages[rows].float().to(logprobs.device), mask, surrogate=run.algo.surrogate,
        aggregation=run.algo.aggregation, ref_logprobs=ref, beta=run.cfg.beta,
        max_len=run.cfg.max_new_tokens, token_weights=weights, **normaliser, **run.algo.surrogate_options,
    )
    out = {K.KL: float(stats.get("kl", 0.0)), "tokens": int(mask.sum())}
    if old_logprobs is None:  # measured once per step, on the pass of the weights that sampled the batch
        out["measures"] = measures
    return loss, logprobs, out


@torch.no_grad()
def reference_logprobs(run, batch: StepBatch, keep: list[int], rows: list[int]) -> torch.Tensor:
    """Log-probs under the model this run started from (an SFT adapter it continues included):
    the adapter's starting weights put in place for this pass (labelrl.train.reference)."""
    policy = run.accelerator.unwrap_model(run.model)  # no gradients: no need for the DDP wrapper
    single = run.accelerator.num_processes == 1
    width = None if single else max(len(c) for c in batch.completion_ids)
    with run.reference.active(policy):
        ref, _ = completion_logprobs_shared(
            policy, [batch.prompt_ids[g] for g in keep], [batch.completion_ids[r] for r in rows],
            run.cfg.group_size, pad_token_id=pad_id(run.tokenizer), min_width=width, dtype=run.dtype,
            share_prefix=single,
        )
    return ref


def token_pass_counts(batch: StepBatch, keep: list[int], group_size: int) -> dict:
    """Token positions forwarded and saved: a kept group costs its prompt once plus its
    completions; a skipped group costs nothing (the plain pass would cost G×(prompt+completion))."""
    def group_cost(g: int) -> int:
        return len(batch.prompt_ids[g]) + sum(len(batch.completion_ids[g * group_size + j]) for j in range(group_size))

    def plain_cost(g: int) -> int:
        return sum(len(batch.prompt_ids[g]) + len(batch.completion_ids[g * group_size + j]) for j in range(group_size))

    n_groups = len(batch.prompt_ids)
    done = sum(group_cost(g) for g in keep)
    plain = sum(plain_cost(g) for g in range(n_groups))
    return {K.SKIPPED: n_groups - len(keep), "train/token_passes": done, K.TOKEN_PASSES_SAVED: plain - done}


def rollout_rows(run, batch: StepBatch) -> dict[str, list]:
    """Columns of the rollout log for this step (labelrl.rollout.log.ROLLOUT_SCHEMA)."""
    G = run.cfg.group_size
    n = len(batch.texts)
    group = [i // G for i in range(n)]
    return {
        "step": [run.step] * n,
        "prompt_id": [run.data.train[batch.example_index[g]].id for g in group],
        "sample_index": [i % G for i in range(n)],
        "label": [batch.group_labels[g] for g in group],
        "completion": batch.texts,
        "completion_tokens": [len(c) for c in batch.completion_ids],
        "truncated": batch.truncated,
        "think_closed": [g.parse.think_closed for g in batch.graded],
        "parse_status": [str(g.parse.status.value) for g in batch.graded],
        "answer": [g.parse.answer for g in batch.graded],
        "reward": batch.rewards.tolist(),
        "advantage": batch.advantages.tolist(),
        "group_uniform": [bool(batch.uniform[g]) for g in group],
        "skipped": [not bool(batch.informative[g]) for g in group],
        "sampler_logprobs": batch.sampler_logprobs or [None] * n,
    }


def rollout_metrics(batch: StepBatch) -> dict[str, float]:
    lengths = np.array([len(c) for c in batch.completion_ids], dtype=float)
    parsed_ok = [g.parse.status.value == "ok" for g in batch.graded]
    return {
        K.REWARD_MEAN: float(batch.rewards.mean()),
        K.REWARD_STD: float(batch.rewards.std(unbiased=False)),
        K.ACCURACY: float(np.mean([g.correct for g in batch.graded])),
        K.LENGTH_MEAN: float(lengths.mean()),
        K.LENGTH_P50: float(np.percentile(lengths, 50)),
        K.LENGTH_P90: float(np.percentile(lengths, 90)),
        K.LENGTH_MAX: float(lengths.max()),
        K.TRUNCATED_FRAC: float(np.mean(batch.truncated)),
        K.THINK_CLOSED_FRAC: float(np.mean([g.parse.think_closed for g in batch.graded])),
        K.PARSE_FAIL_FRAC: 1.0 - float(np.mean(parsed_ok)),
    }


def answer_share_metrics(batch: StepBatch, label_names) -> dict[str, float]:
    """``rollout/answer_share/<label>``: each label's share of the step's parsed answers, and
    ``rollout/answer_recall/<label>``: among the step's rollouts whose prompt has that label, the
    share that answered it (an answer whose parse is not ok is wrong; absent when no prompt of
    the step has the label). The collapse detector's series (labelrl.train.collapse)."""
    answers = [g.parse.answer if g.parse.status.value == "ok" else None for g in batch.graded]
    G = len(batch.graded) // max(len(batch.group_labels), 1)  # rows i*G … i*G+G−1 are prompt i's
    labels = [label for label in batch.group_labels for _ in range(G)]
    shares = {K.per_label(K.ANSWER_SHARE, label): share for label, share in answer_shares(answers, label_names).items()}
    recalls = {K.per_label(K.ANSWER_RECALL, label): recall
               for label, recall in answer_recalls(answers, labels, label_names).items() if recall is not None}
    return shares | recalls
