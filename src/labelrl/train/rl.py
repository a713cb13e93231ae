"""``labelrl rl``: the group-relative RL loop.

Each step reads top to bottom: draw prompts → sample G completions each → grade them with
the shared grader → advantages → diagnostics → drop uninformative groups (the skip rule)
→ loss on the rest → optimizer step → log every rollout and the step's metrics →
checkpoint. The algorithm is chosen only through registries (see labelrl.train.presets);
nothing here special-cases one.
"""

from __future__ import annotations

import re
import signal
import time
import warnings
from dataclasses import dataclass

import torch

from labelrl import metrics_keys as K
from labelrl.advantages.diagnostics import advantage_diagnostics
from labelrl.fileio import RunLock, append_jsonl, atomic_write_json, read_jsonl
from labelrl.rollout import BACKENDS
from labelrl.rollout.log import drop_steps_from, write_step
from labelrl.train import rl_parts as parts
from labelrl.train.checkpoint import KEEP_LAST, latest_checkpoint, load_checkpoint, save_checkpoint, save_model
from labelrl.train.config import RLConfig
from labelrl.train.progress import StepProgress
from labelrl.train.setup import (
    init_run_dir, make_accelerator, make_optimizer, ordered_indices, preflight, prepare_data, prepare_model, prompt_ids,
)

METRICS_FILE = "metrics.jsonl"


@dataclass
class RLRun:
    """Everything the loop carries from step to step."""

    cfg: RLConfig
    run_dir: object
    data: object
    model: object
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


def start_run(cfg: RLConfig) -> RLRun:
    """Run directory, data, model, optimizer; restores the last checkpoint with --resume."""
    run_dir = init_run_dir(cfg, "rl")
    metrics_path = run_dir / METRICS_FILE
    if not cfg.resume and (metrics_path.exists() or latest_checkpoint(run_dir)):
        raise ValueError(f"--out {run_dir} already holds an RL run; pass --resume to continue it, or choose a new --out")
    data = prepare_data(cfg, run_dir)
    model, tokenizer = prepare_model(cfg)
    optimizer, scheduler = make_optimizer(model, cfg, cfg.steps)
    accelerator = make_accelerator(cfg, run_dir, "rl")
    model, optimizer = accelerator.prepare(model, optimizer)
    train_prompts = prompt_ids(tokenizer, data.train, data, cfg.mode)
    preflight(model, train_prompts, cfg.max_new_tokens, run_dir, checkpoints=KEEP_LAST + 1)
    run = RLRun(cfg, run_dir, data, model, tokenizer, optimizer, scheduler,
                algo=parts.resolve_algorithm(cfg, data.dataset.labels, [ex.label for ex in data.train]),
                train_prompts=train_prompts, accelerator=accelerator)
    if cfg.resume:
        ckpt = latest_checkpoint(run_dir)
        if ckpt is None:
            raise ValueError(f"--resume: {run_dir} has no checkpoint yet; run without --resume to start")
        state = load_checkpoint(ckpt, model, optimizer, scheduler)
        run.step, run.cursor, run.nonfinite_in_row = state["step"], state["cursor"], state["nonfinite_in_row"]
        kept = [r for r in read_jsonl(metrics_path) if r[K.STEP] <= run.step]
        metrics_path.unlink(missing_ok=True)
        for record in kept:
            append_jsonl(metrics_path, record)
        drop_steps_from(run_dir, run.step + 1)
    return run


def sample_groups_for_step(run: RLRun) -> parts.StepBatch:
    """B prompts × G completions, graded, with advantages; with dynamic sampling, more
    rounds of B prompts until B informative groups are found or the round cap is hit."""
    cfg, batches = run.cfg, []
    dynamic = run.algo.dynamic_sampling
    rounds = cfg.max_sampling_rounds if dynamic else 1
    for round_index in range(rounds):
        idx = ordered_indices(len(run.train_prompts), run.cursor, cfg.prompts_per_step, cfg.seed)
        run.cursor += cfg.prompts_per_step
        rollout = BACKENDS.get(cfg.backend)(
            run.model, [run.train_prompts[i] for i in idx], **parts.sampling_options(cfg, run.tokenizer),
            seed=parts.step_seed(cfg.seed, run.step, round_index),
        )
        batch = parts.grade_and_advantage(run, idx, rollout, round_index)
        batches.append(batch)
        if sum(int(b.informative.sum()) for b in batches) >= cfg.prompts_per_step:
            break
    return parts.concat_batches(batches, limit_informative=cfg.prompts_per_step if dynamic else None)


def update_policy(run: RLRun, batch: parts.StepBatch) -> dict:
    """Loss and optimizer step; groups whose advantages are all 0 are never forwarded.

    Skipping is exact: their loss terms are 0 and the aggregation still divides by the
    whole batch's sequence and token counts, so the update equals the one over all groups.
    With β > 0 uniform groups still carry the KL term, so nothing is skipped.
    """
    cfg = run.cfg
    skip = cfg.skip_uninformative and cfg.beta == 0
    keep = batch.informative.nonzero().flatten().tolist() if skip else list(range(len(batch.prompt_ids)))
    normaliser = parts.loss_normaliser(batch, keep if run.algo.dynamic_sampling else None, cfg.group_size)
    stats = {K.LOSS: 0.0, K.GRAD_NORM: 0.0, K.KL: 0.0, K.NONFINITE_SKIPPED: 0}
    if keep:
        old_logprobs = None
        for _ in range(cfg.ppo_epochs):
            loss, logprobs, step_stats = parts.policy_loss_for_groups(run, batch, keep, old_logprobs, normaliser)
            old_logprobs = logprobs.detach() if old_logprobs is None else old_logprobs
            stats.update(step_stats)
            if not torch.isfinite(loss):
                stats[K.NONFINITE_SKIPPED] = 1
                break
            run.accelerator.backward(loss)
            grad_norm = run.accelerator.clip_grad_norm_([p for p in run.model.parameters() if p.requires_grad], cfg.max_grad_norm)
            if not torch.isfinite(grad_norm):
                run.optimizer.zero_grad(set_to_none=True)
                stats[K.NONFINITE_SKIPPED] = 1
                break
            run.optimizer.step()
            run.optimizer.zero_grad(set_to_none=True)
            stats.update({K.LOSS: loss.item(), K.GRAD_NORM: float(grad_norm)})
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


def rl_step(run: RLRun) -> dict:
    started = time.perf_counter()
    batch = sample_groups_for_step(run)
    diagnostics = advantage_diagnostics(batch.rewards, batch.advantages, run.cfg.group_size, **run.algo.diagnostic_options(batch))
    stats = update_policy(run, batch)
    run.step += 1
    write_step(run.run_dir, run.step, parts.rollout_rows(run, batch))
    record = {K.STEP: run.step, **parts.rollout_metrics(batch), **diagnostics, **stats}
    record[K.STEP_SECONDS] = time.perf_counter() - started
    record[K.TOKENS_PER_S] = batch.new_tokens / max(batch.sample_seconds, 1e-9)
    record[K.PEAK_MEMORY_MB] = parts.peak_memory_mb()
    append_jsonl(run.run_dir / METRICS_FILE, record)
    run.accelerator.log({k: v for k, v in record.items() if k != K.STEP}, step=run.step)
    if run.step % run.cfg.checkpoint_every == 0 or run.step == run.cfg.steps or run.stop_requested:
        save_checkpoint(run.run_dir, run.step, run.model, run.optimizer, run.scheduler,
                        {"cursor": run.cursor, "nonfinite_in_row": run.nonfinite_in_row})
    return record


def run_rl(cfg: RLConfig) -> dict:
    """Train for ``cfg.steps`` steps; returns the summary also saved as ``rl_summary.json``.
    The run directory is locked for the whole run: a second writer is refused."""
    with RunLock(cfg.out, "rl"):
        return _run_rl_locked(cfg)


def _run_rl_locked(cfg: RLConfig) -> dict:
    run = start_run(cfg)

    def request_stop(signum, frame):  # finish the step in flight, checkpoint, stop
        run.stop_requested = True

    previous = {s: signal.signal(s, request_stop) for s in (signal.SIGTERM, signal.SIGINT)}
    last: dict = {}
    try:
        with StepProgress(cfg.steps, f"rl/{cfg.preset}", quiet=cfg.quiet, start=run.step) as progress:
            started_at = run.step
            while run.step < cfg.steps and not run.stop_requested:
                if cfg.stop_after is not None and run.step + 1 - started_at >= cfg.stop_after:
                    run.stop_requested = True  # this is the last step of the invocation
                last = rl_step(run)
                progress.update(run.step, {
                    "reward": last[K.REWARD_MEAN], "len": last[K.LENGTH_MEAN],
                    "trunc": last[K.TRUNCATED_FRAC], "skip": last[K.SKIPPED],
                })
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        run.accelerator.end_training()
    summary = {"steps_done": run.step, "steps": cfg.steps, "stopped_early": run.step < cfg.steps, "last": last}
    if run.step >= cfg.steps:
        summary["model_dir"] = str(save_model(run.run_dir, run.accelerator.unwrap_model(run.model), run.tokenizer))
    atomic_write_json(run.run_dir / "rl_summary.json", summary)
    return summary
