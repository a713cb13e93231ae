"""``labelrl rl``: the group-relative RL loop.

Each step reads top to bottom: draw prompts → sample G completions each → grade them with
the shared grader → advantages → diagnostics → drop uninformative groups (the skip rule)
→ loss on the rest → optimizer step → log every rollout and the step's metrics →
checkpoint. The algorithm is chosen only through registries (see labelrl.train.presets);
nothing here special-cases one.

Under ``accelerate launch`` with P processes, each process samples, grades and computes
advantages for its own B/P prompts (whole groups, never split), the groups are gathered so
that every process holds the whole batch, each process trains on an equal share of the
kept groups with the whole batch's loss denominators, and DDP sums the gradients once per
optimizer step: the update is the one a single process makes on the same batch. Sampling
seeds depend on (seed, step, prompt position), never on the process. Only the main process
writes files (metrics, rollouts, checkpoints, the model, the summary).
"""

from __future__ import annotations

import contextlib
import re
import signal
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from labelrl import metrics_keys as K
from labelrl.advantages.diagnostics import advantage_diagnostics
from labelrl.data.prepare import prepare_data, prompt_ids
from labelrl.fileio import (
    RunLock,
    append_jsonl,
    atomic_write_json,
    atomic_write_jsonl,
    read_jsonl,
)
from labelrl.models.precision import precision_name
from labelrl.models.prepare import prepare_model
from labelrl.rollout.log import drop_steps_from, write_step
from labelrl.train import rl_parts as parts
from labelrl.train.checkpoint import (
    KEEP_LAST,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
    save_model,
)
from labelrl.train.collapse import run_collapse
from labelrl.train.config import RLConfig
from labelrl.train.memory import report_memory_plan, set_checkpointing
from labelrl.train.pass_measures import step_measures
from labelrl.train.reference import ReferenceWeights
from labelrl.train.distributed import (
    any_process,
    compute_dtype,
    end_training,
    make_accelerator,
    process_share,
    reduce_value,
    start_trackers,
)
from labelrl.train.setup import (
    init_run_dir,
    make_optimizer,
    preflight,
    progress_bar,
    training_order,
)
from labelrl.train.val_scoring import PENDING, pending_end, record_val_point, start_val_path

METRICS_FILE = "metrics.jsonl"
LONG_ITEMS_FILE = "long_items_rl.json"


@dataclass
class RLRun:
    """Everything the loop carries from step to step."""

    cfg: RLConfig
    run_dir: object
    data: object
    model: object  # under several processes the DDP wrapper: the training pass goes through it
    tokenizer: object
    optimizer: object
    scheduler: object
    algo: parts.Algorithm
    train_prompts: list[list[int]]
    step: int = 0
    cursor: int = 0  # position in the stream of training prompts
    nonfinite_in_row: int = 0
    stop_requested: bool = False
    accelerator: object = None
    sampler: object = None
    share: slice = field(default_factory=lambda: slice(None))  # this process's positions in each round's prompts
    dtype: torch.dtype = torch.float32  # compute dtype of sampling and the training pass (--precision)
    memory: object = None  # labelrl.train.memory.MemoryPlan: the preflight's prediction and checkpointing decision
    reference: object = None  # labelrl.train.reference.ReferenceWeights: the starting model, for β > 0

    @property
    def policy(self):
        """The model itself, unwrapped: sampling, reference passes, saving."""
        return self.accelerator.unwrap_model(self.model)

    @property
    def is_main(self) -> bool:
        return self.accelerator.is_main_process


def start_run(cfg: RLConfig, accelerator=None) -> RLRun:
    """Run directory, data, model, optimizer; restores the last checkpoint with --resume.
    The main process prepares the run directory (config, splits) before the others read it."""
    accelerator = accelerator or make_accelerator(cfg, Path(cfg.out), "rl", trackers=False)
    share = process_share(cfg.prompts_per_step, accelerator, "prompts_per_step")
    if cfg.scale == "batch" and accelerator.num_processes > 1:  # each process takes its own share's advantages
        raise ValueError(f"scale='batch' under {accelerator.num_processes} processes: each process computes the advantages "
                         "of its own prompts, so the batch std would depend on the process count; run one process or "
                         "use --scale group or none")
    main = accelerator.is_main_process
    with accelerator.main_process_first():
        run_dir = init_run_dir(cfg, "rl", write=main)
        if main and not cfg.resume and ((run_dir / METRICS_FILE).exists() or latest_checkpoint(run_dir)):
            raise ValueError(f"--out {run_dir} already holds an RL run; pass --resume to continue it, or choose a new --out")
        data = prepare_data(cfg, run_dir, write=main)
    start_trackers(accelerator, cfg, "rl")
    model, tokenizer = prepare_model(cfg)
    # Taken before any checkpoint is restored: on --resume too the reference is the starting model.
    reference = ReferenceWeights(model) if cfg.beta > 0 else None
    train_prompts = fit_train_prompts(cfg, run_dir, data, tokenizer, model, main)
    preflight(model, train_prompts, cfg.max_new_tokens, run_dir, checkpoints=KEEP_LAST + 1)
    dtype = compute_dtype(cfg, accelerator)
    memory = parts.plan_rl_memory(cfg, model, dtype, train_prompts, share, single=accelerator.num_processes == 1)
    set_checkpointing(model, memory.gradient_checkpointing, dtype)
    if main:
        report_memory_plan(memory, cfg.quiet)
    optimizer, scheduler = make_optimizer(model, cfg, cfg.steps)
    model, optimizer = accelerator.prepare(model, optimizer)
    run = RLRun(cfg, run_dir, data, model, tokenizer, optimizer, scheduler,
                algo=parts.resolve_algorithm(cfg, data.dataset.labels, [ex.label for ex in data.train]),
                train_prompts=train_prompts, accelerator=accelerator,
                sampler=parts.make_sampler(cfg, train_prompts), share=share, dtype=dtype, memory=memory,
                reference=reference)
    if cfg.resume:
        resume(run)
    return run


def fit_train_prompts(cfg: RLConfig, run_dir: Path, data, tokenizer, model, main: bool) -> list[list[int]]:
    """Prompt ids of the training items, each within ``--max-prompt-length`` and fitting the
    model's context with ``max_new_tokens`` to spare: ``--on-long-item`` cuts, leaves out or
    refuses the others (``labelrl.data.length``), said before training and saved in
    ``RUN_DIR/long_items_rl.json``. ``data.train`` becomes the items as prompted (cut texts
    included), so the rollout log shows what the model saw. First, ``max_new_tokens`` must hold
    the longest answer tag and the end-of-text token (``labelrl.data.prompts.check_answer_fits``)."""
    from labelrl.data.length import announce, fit_prompts
    from labelrl.data.prompts import check_answer_fits

    check_answer_fits(tokenizer, data.dataset.labels, cfg.max_new_tokens)
    context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if context and cfg.max_new_tokens >= context:
        raise ValueError(f"--max-new-tokens {cfg.max_new_tokens} leaves no room for a prompt in the model's context of "
                         f"{context} tokens; lower --max-new-tokens")
    if context and context - cfg.max_new_tokens < cfg.max_prompt_length:  # the context binds first
        room, fix = context - cfg.max_new_tokens, "lower --max-new-tokens"
        limit = f"the model's context of {context} tokens with --max-new-tokens {cfg.max_new_tokens} to spare"
    else:
        room, fix = cfg.max_prompt_length, "raise --max-prompt-length"
        limit = f"--max-prompt-length {room}"
    _, data.train, prompts, report = fit_prompts(
        tokenizer, data.train, lambda ex: prompt_ids(tokenizer, [ex], data, cfg.mode)[0], room,
        policy=cfg.on_long_item, stage="training items", limit=limit, fix=fix,
    )
    if main:
        announce(report, run_dir / LONG_ITEMS_FILE)
    return prompts


def resume(run: RLRun) -> None:
    """Every process loads the last checkpoint; the main process drops the metrics and
    rollouts of the steps after it, which will be redone."""
    ckpt = latest_checkpoint(run.run_dir)
    metrics_path = run.run_dir / METRICS_FILE
    if ckpt is not None:
        state = load_checkpoint(ckpt, run.policy, run.optimizer, run.scheduler)
        run.step, run.cursor, run.nonfinite_in_row = state["step"], state["cursor"], state["nonfinite_in_row"]
    elif not metrics_path.exists():
        raise ValueError(f"--resume: {run.run_dir} has no checkpoint yet; run without --resume to start")
    # else: killed before its first checkpoint; it restarts from step 0 and the steps it logged are dropped
    if run.is_main:
        # one atomic rewrite: a kill here must not lose the steps the checkpoint covers
        atomic_write_jsonl(metrics_path, [r for r in read_jsonl(metrics_path) if r[K.STEP] <= run.step])
        drop_steps_from(run.run_dir, run.step + 1)
    run.accelerator.wait_for_everyone()


def sample_groups_for_step(run: RLRun) -> parts.StepBatch:
    """B prompts × G completions, graded, with advantages; with dynamic sampling, more
    rounds of B prompts until B informative groups are found or the round cap is hit.
    Each process samples its share of every round; the batch returned is the whole step's."""
    cfg, batches = run.cfg, []
    dynamic = run.algo.dynamic_sampling
    rounds = cfg.max_sampling_rounds if dynamic else 1
    for round_index in range(rounds):
        idx = training_order([ex.label for ex in run.data.train], cfg.prompt_sampling, run.cursor, cfg.prompts_per_step,
                             cfg.seed)
        run.cursor += cfg.prompts_per_step
        positions = list(range(cfg.prompts_per_step))[run.share]
        mine = [idx[p] for p in positions]
        rollout = run.sampler(
            run.policy, [run.train_prompts[i] for i in mine], **parts.sampling_options(cfg, run.tokenizer, run.dtype),
            prompt_seeds=[parts.prompt_seed(cfg.seed, run.step, round_index, p) for p in positions],
        )
        batch = parts.grade_and_advantage(run, mine, rollout, round_index, positions)
        batches.append(parts.gather_batch(run.accelerator, batch))
        if sum(int(b.informative.sum()) for b in batches) >= cfg.prompts_per_step:
            break
    return parts.concat_batches(batches, limit_informative=cfg.prompts_per_step if dynamic else None)


def update_policy(run: RLRun, batch: parts.StepBatch) -> dict:
    """Loss and optimizer step; groups whose advantages are all 0 are never forwarded.

    Skipping is exact: their loss terms are 0 and the aggregation still divides by the
    whole batch's sequence and token counts, so the update equals the one over all groups.
    With β > 0 uniform groups still carry the KL term, so nothing is skipped, except under
    dynamic sampling, whose batch is its informative groups only. Each process
    trains on its share of the kept groups (``parts.training_share``); a process whose share
    is empty runs one kept group with weight 0, so that it still takes part in the
    gradient reduction.
    """
    cfg = run.cfg
    # Dynamic sampling's batch is its B informative groups (DAPO): the rest are never trained on.
    only_informative = run.algo.dynamic_sampling or (cfg.skip_uninformative and cfg.beta == 0)
    keep = batch.informative.nonzero().flatten().tolist() if only_informative else list(range(len(batch.prompt_ids)))
    normaliser = parts.loss_normaliser(batch, keep if run.algo.dynamic_sampling else None, cfg.group_size)
    stats = {K.LOSS: 0.0, K.GRAD_NORM: 0.0, K.KL: 0.0, K.NONFINITE_SKIPPED: 0}
    if keep:
        mine = parts.training_share(keep, run.accelerator)
        stats.update(optimise(run, batch, mine or keep[:1], normaliser, weight=1.0 if mine else 0.0))
    with warnings.catch_warnings():
        # A step whose groups were all skipped makes no optimizer step, yet the schedule
        # still advances one step so it stays a function of the step number.
        warnings.filterwarnings("ignore", message=re.escape("Detected call of `lr_scheduler.step()`"))
        run.scheduler.step()
    run.nonfinite_in_row = run.nonfinite_in_row + 1 if stats[K.NONFINITE_SKIPPED] else 0
    if run.nonfinite_in_row >= cfg.max_nonfinite:
        raise ValueError(
            f"{run.nonfinite_in_row} non-finite losses or gradients in a row at step {run.step + 1}; "
            "the run stopped (the last checkpoint is intact): lower --learning-rate or check the rewards"
        )
    stats[K.LEARNING_RATE] = run.scheduler.get_last_lr()[0]
    stats.update(parts.token_pass_counts(batch, keep, cfg.group_size))
    return stats


def optimise(run: RLRun, batch: parts.StepBatch, groups: list[int], normaliser: dict, weight: float) -> dict:
    """``ppo_epochs`` optimizer steps on ``groups``; statistics of the whole batch.

    Each process's loss already divides by the whole batch's counts, and DDP averages the
    gradients over the P processes, so each process back-propagates P × its loss: the
    average of those is the gradient of the whole batch's loss. A non-finite loss on any
    process skips the step on all.
    """
    cfg, acc = run.cfg, run.accelerator
    n = acc.num_processes
    stats: dict = {}
    old_logprobs = None
    for _ in range(cfg.ppo_epochs):
        loss, logprobs, step_stats = parts.policy_loss_for_groups(run, batch, groups, old_logprobs, normaliser)
        old_logprobs = logprobs.detach() if old_logprobs is None else old_logprobs
        stats.update(_whole_batch_kl(acc, step_stats, weight))
        if any_process(acc, not torch.isfinite(loss)):
            stats[K.NONFINITE_SKIPPED] = 1
            break
        acc.backward(loss * (weight * n) if n > 1 else loss)
        grad_norm = acc.clip_grad_norm_([p for p in run.model.parameters() if p.requires_grad], cfg.max_grad_norm)
        if not torch.isfinite(grad_norm):
            run.optimizer.zero_grad(set_to_none=True)
            stats[K.NONFINITE_SKIPPED] = 1
            break
        run.optimizer.step()
        run.optimizer.zero_grad(set_to_none=True)
        stats.update({K.LOSS: reduce_value(acc, loss.item() * weight) if n > 1 else loss.item(), K.GRAD_NORM: float(grad_norm)})
    return stats


def _whole_batch_kl(acc, step_stats: dict, weight: float) -> dict:
    """The KL statistic as a token mean over every process's tokens; the pass's measures
    (entropy, sampler–trainer mismatch: ``labelrl.train.pass_measures``) over the whole batch."""
    stats = dict(step_stats)
    measures = stats.pop("measures", None)
    if measures is not None:
        stats.update(step_measures(acc, measures, weight))
    tokens = stats.pop("tokens", 0) * weight
    if acc.num_processes > 1:
        total = reduce_value(acc, tokens)
        stats[K.KL] = reduce_value(acc, stats[K.KL] * tokens) / max(total, 1.0)
    return stats


def rl_step(run: RLRun) -> dict:
    started = time.perf_counter()
    batch = sample_groups_for_step(run)
    diagnostics = advantage_diagnostics(batch.rewards, batch.advantages, run.cfg.group_size, **run.algo.diagnostic_options(batch))
    updating = time.perf_counter()
    stats = update_policy(run, batch)
    stats[K.UPDATE_SECONDS] = time.perf_counter() - updating
    run.step += 1
    record = {K.STEP: run.step, **parts.rollout_metrics(batch), **parts.answer_share_metrics(batch, run.algo.label_names),
              **diagnostics, **stats}
    record[K.STEP_SECONDS] = time.perf_counter() - started
    record[K.TOKENS_PER_S] = batch.new_tokens / max(batch.sample_seconds, 1e-9)
    record[K.SAMPLE_SECONDS] = batch.sample_seconds
    record[K.PEAK_MEMORY_MB] = reduce_value(run.accelerator, parts.peak_memory_mb(), "max")
    run.stop_requested = any_process(run.accelerator, run.stop_requested)  # a signal may reach one process only
    record.update(record_val_point(run))  # before the checkpoint: a kill loses the line only with it
    if run.is_main:
        write_step(run.run_dir, run.step, parts.rollout_rows(run, batch))
        append_jsonl(run.run_dir / METRICS_FILE, record)
    run.accelerator.log({k: v for k, v in record.items() if k != K.STEP}, step=run.step)
    if run.step % run.cfg.checkpoint_every == 0 or run.step == run.cfg.steps or run.stop_requested:
        if run.is_main:
            save_checkpoint(run.run_dir, run.step, run.policy, run.optimizer, run.scheduler,
                            {"cursor": run.cursor, "nonfinite_in_row": run.nonfinite_in_row})
        run.accelerator.wait_for_everyone()
    return record


def run_rl(cfg: RLConfig) -> dict:
    """Train for ``cfg.steps`` steps; returns the summary also saved as ``rl_summary.json``.
    The run directory is locked for the whole run (by the main process): a second writer is refused."""
    accelerator = make_accelerator(cfg, Path(cfg.out), "rl", trackers=False)
    with RunLock(cfg.out, "rl") if accelerator.is_main_process else contextlib.nullcontext():
        return _run_rl_locked(cfg, accelerator)


def _run_rl_locked(cfg: RLConfig, accelerator) -> dict:
    run = start_run(cfg, accelerator)

    def request_stop(signum, frame):  # finish the step in flight, checkpoint, stop
        run.stop_requested = True

    previous = {s: signal.signal(s, request_stop) for s in (signal.SIGTERM, signal.SIGINT)}
    last: dict = {}
    try:
        start_val_path(run)  # step 0 (or the resumed step) on val, the file cut back to the checkpoint
        with progress_bar(run.accelerator, cfg.steps, f"rl/{cfg.preset}", quiet=cfg.quiet, start=run.step) as progress:
            started_at = run.step
            while run.step < cfg.steps and not run.stop_requested:
                if cfg.stop_after is not None and run.step + 1 - started_at >= cfg.stop_after:
                    run.stop_requested = True  # this is the last step of the invocation
                last = rl_step(run)
                progress.update(run.step, {
                    "reward": last[K.REWARD_MEAN], "len": last[K.LENGTH_MEAN],
                    "trunc": last[K.TRUNCATED_FRAC], "skip": last[K.SKIPPED],
                })
        summary = finish_run(run, last)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        close = getattr(run.sampler, "close", None)  # a backend that holds an engine (vllm) shuts it down
        if close is not None:
            close()
        end_training(run.accelerator, run.model)
    return summary


def finish_run(run: RLRun, last: dict) -> dict:
    """The final model (when all steps are done) and ``rl_summary.json``, by the main process.

    The summary records ``success_threshold``, the reward below which a rollout counted as failed
    in every diagnostic (``Algorithm.success_threshold``): the report recounts the failed-positive
    rollouts from the log with it, since the config alone does not give it (``--class-reward`` and
    ``--reward-table`` move it)."""
    cfg = run.cfg
    summary = {"steps_done": run.step, "steps": cfg.steps, "stopped_early": run.step < cfg.steps, "last": last,
               "precision": precision_name(run.dtype), "memory": run.memory.as_dict() if run.memory else None,
               "success_threshold": run.algo.success_threshold}
    if run.step >= cfg.steps:
        model_dir = save_model(run.run_dir, run.policy, run.tokenizer) if run.is_main else run.run_dir / "model"
        summary["model_dir"] = str(model_dir)
    if run.is_main:
        pending = pending_end(run)  # --val-path-end: the last val point comes from the final val predictions
        if pending is not None:
            summary[PENDING] = pending
        summary["collapse"] = run_collapse(run)  # from the files: a resumed run's earlier steps too
        atomic_write_json(run.run_dir / "rl_summary.json", summary)
    run.accelerator.wait_for_everyone()
    return summary
