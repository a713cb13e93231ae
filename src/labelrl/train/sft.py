"""``labelrl sft``: supervised fine-tuning, the baseline every RL run must beat.

Direct mode trains on ``<answer>LABEL</answer>``; reasoning mode trains on kept teacher
traces. The loss covers the assistant's tokens only (its answer and the end-of-turn
token). Each batch's items are packed into a few rows (``labelrl.train.packing``; attention
stays within each item), and a memory preflight (``labelrl.train.memory``) turns on
activation checkpointing when the largest batch would not fit the memory budget. Every ``eval_every`` steps the model is scored on val by label-token probabilities
and the best model by ``select_metric`` is kept in ``RUN_DIR/model``; with ``eval_every`` 0 the
last step's model is (the ladder scores every SFT model on its val sample after training).
"""

from __future__ import annotations

import contextlib
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from labelrl import metrics_keys as K
from labelrl.data.prepare import RunData, prepare_data, prompt_ids, val_sample
from labelrl.data.prompts import answer_target
from labelrl.evaluate.metrics import basic_metrics
from labelrl.fileio import RunLock, append_jsonl, atomic_write_json
from labelrl.models.precision import compute, precision_name
from labelrl.models.prepare import prepare_model
from labelrl.rollout.lean_pass import lean_logprobs, lean_reason
from labelrl.rollout.logprobs import right_pad
from labelrl.rollout.prefix import checkpointing, prefix_cache, prefix_supported, shared_prefix_length
from labelrl.rollout.sampler import model_device, pad_id
from labelrl.train.checkpoint import save_merged, save_model
from labelrl.train.config import SFTConfig
from labelrl.train.memory import MemoryPlan, plan_memory, report_memory_plan, set_checkpointing
from labelrl.train.packing import (
    IGNORE,
    BatchLayout,
    first_fit_decreasing,
    kept_positions,
    packed_layout,
    padded_layout,
    prefix_layout,
)
from labelrl.train.distributed import (
    broadcast_from_main,
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
    peak_memory_mb,
    preflight,
    progress_bar,
    training_order,
)


LONG_ITEMS_FILE = "long_items_sft.json"


@dataclass
class SFTItem:
    input_ids: list[int]  # prompt then target
    n_prompt: int  # loss starts after these
    label: str = ""  # the label the target states (after --shuffle-labels): what --prompt-sampling balanced balances


def build_items(tokenizer, data: RunData, cfg: SFTConfig, traces: dict[str, str] | None) -> list[SFTItem]:
    """Prompt ids + assistant target ids (+ end of turn) for every training example.

    An item whose prompt and target exceed ``--max-length`` is cut, left out or refused by
    ``--on-long-item`` (``labelrl.data.length``); the count and ids are printed before training
    and saved in ``RUN_DIR/long_items_sft.json``.
    """
    from accelerate import PartialState

    from labelrl.data.length import announce, fit_prompts

    examples = data.train
    if traces is not None:
        examples = [ex for ex in examples if ex.id in traces]
        if not examples:
            raise ValueError(f"--traces {cfg.traces}: no kept trace matches a training item id")
    if cfg.only_ids_from is not None:
        keep = load_kept_traces(cfg.only_ids_from)
        examples = [ex for ex in examples if ex.id in keep]
        if not examples:
            raise ValueError(f"--only-ids-from {cfg.only_ids_from}: no kept trace matches a training item id; "
                             "distill traces from this run's train split (`labelrl distill --run-dir RUN`)")
    labels = [ex.label for ex in examples]
    if cfg.shuffle_labels:
        random.Random(cfg.seed).shuffle(labels)
    targets = [tokenizer(answer_target(label, cfg.mode, trace=traces.get(ex.id) if traces else None),
                         add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
               for ex, label in zip(examples, labels)]
    kept, _, prompts, report = fit_prompts(
        tokenizer, examples, lambda ex: prompt_ids(tokenizer, [ex], data, cfg.mode)[0],
        [cfg.max_length - len(t) for t in targets], policy=cfg.on_long_item, stage="training items",
        limit=f"--max-length {cfg.max_length} with their answer", fix="raise --max-length",
    )
    if PartialState().is_main_process:
        announce(report, Path(cfg.out) / LONG_ITEMS_FILE)
    return [SFTItem(p_ids + targets[i], len(p_ids), str(labels[i])) for i, p_ids in zip(kept, prompts)]


def batch_layout(batch: list[SFTItem], pad: int, pack: bool = True, share_prefix: bool = False) -> BatchLayout:
    """The token layout of ``batch``: packed rows, or one left-padded row per item; with
    ``share_prefix``, the prefix all items start with run once (``prefix_layout``) when that
    computes fewer token positions."""
    seqs, n_prompt = [it.input_ids for it in batch], [it.n_prompt for it in batch]
    layout = (packed_layout if pack else padded_layout)(seqs, n_prompt, pad)
    shared = shared_prefix_length(seqs, keep=[len(s) - n + 1 for s, n in zip(seqs, n_prompt)]) if share_prefix else 0
    if shared and shared + len(seqs) * max(len(s) - shared for s in seqs) < layout.slots:
        return prefix_layout(seqs, n_prompt, pad, shared)
    return layout


def sft_loss(model, batch: list[SFTItem] | BatchLayout, pad: int, dtype: torch.dtype = torch.float32,
             pack: bool = True, share_prefix: bool = False) -> torch.Tensor:
    """Mean cross-entropy over the assistant tokens of a batch (items, or their layout).

    The output projection (the largest matrix product for a small model with a 49k
    vocabulary) runs only on the positions that predict a target token (``logits_to_keep``
    as an index), never on the prompts. A layout with a prefix runs it once and keeps its
    KV cache, with gradients, for every row.
    """
    layout = batch if isinstance(batch, BatchLayout) else batch_layout(batch, pad, pack, share_prefix)
    device = model_device(model)
    keep = kept_positions(layout.labels)
    mask = layout.attention_mask.to(device) if layout.attention_mask is not None else None
    # use_cache=False: transformers tells packed items apart by their restarting positions
    # only when no cache is built (masking_utils._preprocess_mask_arguments)
    extra: dict = {"use_cache": False}
    if layout.prefix:
        cache, arg = prefix_cache(model, layout.prefix, layout.input_ids.shape[0], dtype, device)
        extra = {arg: cache, "use_cache": True}
    with compute(model, dtype):
        logits = model(input_ids=layout.input_ids.to(device), attention_mask=mask, position_ids=layout.position_ids.to(device),
                       logits_to_keep=keep.to(device), **extra).logits
    labels = layout.labels[:, keep].to(device)
    logits = logits.float()
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=IGNORE)


def sft_loss_lean(model, batch: list[SFTItem], pad: int, dtype: torch.dtype = torch.float32,
                  share_prefix: bool = False) -> torch.Tensor:
    """``sft_loss`` through ``labelrl.rollout.lean_pass``: the same mean cross-entropy over the
    assistant tokens, as the mean of their negative log-probs, each computed from its hidden
    state without the vocabulary-wide logits.

    Each item is a prompt with one completion, its answer (G = 1), run as one segment of the
    pass (``lean_logprobs``' ``join``). Every layer runs on the real tokens only (no row padding,
    no packing slack), and with ``share_prefix`` the prefix all the prompts start with runs once. The caller checks ``sft_lean_reason`` first.
    """
    prompts = [it.input_ids[: it.n_prompt] for it in batch]
    targets, mask = right_pad([it.input_ids[it.n_prompt:] for it in batch], pad, model_device(model))
    shared = shared_prefix_length(prompts) if share_prefix else 0
    logprobs, _ = lean_logprobs(model, prompts, targets, mask, 1, shared, pad, dtype)
    return -logprobs.mean()


def evaluate_val(model, tokenizer, data: RunData, cfg: SFTConfig, dtype: torch.dtype = torch.float32) -> dict[str, float]:
    """Accuracy and balanced accuracy on (at most ``eval_limit``) val items.

    Direct mode scores the label tokens (one forward pass, no generation); reasoning mode
    greedy-decodes and parses with the strict parser (an unparseable answer is wrong).
    """
    val = val_sample(data, cfg.eval_limit)
    if not val:
        return {}
    prompts = prompt_ids(tokenizer, val, data, cfg.mode)
    if cfg.mode == "direct":
        from labelrl.evaluate.predict import score_counted

        what = (f"a val sample (--eval-limit {cfg.eval_limit} of {len(data.val)})" if len(val) < len(data.val)
                else f"val (all {len(val)}; --eval-limit {cfg.eval_limit})")
        probs = score_counted(model, tokenizer, prompts, data.dataset.labels, batch_size=16,
                              description=f"scoring {what}", plain=cfg.quiet, dtype=dtype)
        names = data.dataset.labels.labels
        pred = [names[i] for i in probs.argmax(-1).tolist()]
    else:
        pred = greedy_answers(model, tokenizer, prompts, data, max_new_tokens=cfg.max_length, dtype=dtype)
    m = basic_metrics([ex.label for ex in val], pred)
    return {K.EVAL_ACCURACY: m["accuracy"], K.EVAL_BALANCED_ACCURACY: m["balanced_accuracy"]}


def greedy_answers(model, tokenizer, prompts: list[list[int]], data: RunData, *, max_new_tokens: int,
                   dtype: torch.dtype = torch.float32) -> list[str | None]:
    """Greedy completions, strictly parsed in reasoning mode (None when unparseable)."""
    from labelrl.rewards import parse_answer
    from labelrl.rollout import sample_groups

    out = sample_groups(model, prompts, group_size=1, max_new_tokens=max_new_tokens,
                        eos_token_ids=[tokenizer.eos_token_id], pad_token_id=pad_id(tokenizer), temperature=0.0,
                        dtype=dtype)
    texts = tokenizer.batch_decode(out.completion_ids, skip_special_tokens=True)
    return [parse_answer(t, reasoning=True, labels=data.dataset.labels).answer for t in texts]


def run_sft(cfg: SFTConfig) -> dict:
    """Train, evaluate, keep the best model; returns the summary also saved as ``sft_summary.json``.
    The run directory is locked for the whole run (by the main process): a second writer is refused.

    Under ``accelerate launch`` with P processes each process takes its B/P items of every
    batch; the loss is normalised over the whole batch's assistant tokens, so the update
    equals one process's on the same batch. The main process evaluates and writes files.
    """
    accelerator = make_accelerator(cfg, Path(cfg.out), "sft", trackers=False)
    with RunLock(cfg.out, "sft") if accelerator.is_main_process else contextlib.nullcontext():
        run = None
        try:
            run = start_sft(cfg, accelerator)
            return _sft_loop(run)
        finally:
            end_training(accelerator, run.model if run is not None else None)


@dataclass
class SFTRun:
    """What the SFT loop carries from step to step."""

    cfg: SFTConfig
    accelerator: object
    run_dir: Path
    data: RunData
    model: object  # under several processes the DDP wrapper
    tokenizer: object
    optimizer: object
    scheduler: object
    items: list[SFTItem]
    total: int  # optimizer steps
    share: slice  # this process's items of every batch
    pad: int
    dtype: torch.dtype
    memory: MemoryPlan
    lean_reason: str | None = None  # why the step keeps the module pass (None: it runs the lean one)

    def batch(self, step: int) -> list[SFTItem]:
        """The items of ``step`` (0-based): a pure function of (seed, position)."""
        size = self.cfg.batch_size
        return [self.items[i] for i in item_order(self.items, self.cfg, step * size, size)]


def item_order(items: list[SFTItem], cfg: SFTConfig, start: int, count: int) -> list[int]:
    """Positions ``start … start+count−1`` of the run's item stream: seeded per-epoch shuffles, or
    with ``--prompt-sampling balanced`` every label in turn (``balanced_indices``), as RL draws its
    prompts, so SFT's expected loss weighs each label's items equally, as balanced accuracy does."""
    return training_order([it.label for it in items], cfg.prompt_sampling, start, count, cfg.seed)


def start_sft(cfg: SFTConfig, accelerator) -> SFTRun:
    """Run directory, data, items, model with the memory plan applied, optimizer."""
    share = process_share(cfg.batch_size, accelerator, "batch_size")
    main = accelerator.is_main_process
    with accelerator.main_process_first():
        run_dir = init_run_dir(cfg, "sft", write=main)
        data = prepare_data(cfg, run_dir, write=main)
    start_trackers(accelerator, cfg, "sft")
    model, tokenizer = prepare_model(cfg)
    traces = load_kept_traces(cfg.traces) if cfg.mode == "reasoning" else None
    items = build_items(tokenizer, data, cfg, traces)
    preflight(model, [it.input_ids for it in items], 0, run_dir, checkpoints=1)
    total = cfg.max_steps or max(1, round(cfg.epochs * len(items) / cfg.batch_size))
    pad, dtype = pad_id(tokenizer), compute_dtype(cfg, accelerator)
    run = SFTRun(cfg, accelerator, run_dir, data, model, tokenizer, None, None, items, total, share, pad, dtype, None)
    run.memory = plan_sft_memory(run)
    set_checkpointing(model, run.memory.gradient_checkpointing, dtype)
    if main:
        report_memory_plan(run.memory, cfg.quiet)
    optimizer, run.scheduler = make_optimizer(model, cfg, total)
    run.model, run.optimizer = accelerator.prepare(model, optimizer)
    run.lean_reason = sft_lean_reason(run.model)
    return run


def sft_lean_reason(model) -> str | None:
    """None when the SFT step may run ``sft_loss_lean``, else why it keeps the module pass:
    ``labelrl.rollout.lean_pass.lean_reason`` (full fine-tuning, a LoRA variant, several
    processes, a model family it does not cover), or activation checkpointing, which the
    lean pass does not do (it keeps every layer's activations, as the plain module pass does)."""
    if checkpointing(model):
        return "activation checkpointing is on (the memory plan chose it; the lean pass keeps every activation)"
    return lean_reason(model)


def may_share_prefix(run: SFTRun) -> bool:
    """Whether a batch may run its shared prompt prefix once (``prefix_layout``): one process
    only (processes whose shares share different prefixes would make other forward calls) and a
    model that attends over every earlier key (``labelrl.rollout.prefix.prefix_supported``)."""
    return run.accelerator.num_processes == 1 and prefix_supported(run.model)


def plan_sft_memory(run: SFTRun) -> MemoryPlan:
    """The memory plan for the run's largest batch (this process's share, in its layout): the
    most token positions of any step, found from the item lengths, then laid out once."""
    cfg, size = run.cfg, run.cfg.batch_size
    order = item_order(run.items, cfg, 0, run.total * size)  # every step's items, in one pass
    batches = [[run.items[i] for i in order[s * size : (s + 1) * size]][run.share] for s in range(run.total)]

    def slots(batch: list[SFTItem]) -> int:
        lengths = [len(it.input_ids) for it in batch]
        rows = len(first_fit_decreasing(lengths, max(lengths))) if cfg.pack else len(lengths)
        return rows * max(lengths)

    worst_batch = max(batches, key=slots)
    worst = batch_layout(worst_batch, run.pad, cfg.pack)
    positions = worst.input_ids.shape[0] * len(kept_positions(worst.labels))
    tokens = worst.slots
    # Without checkpointing a batch's shared prompt prefix may run once (sft_step): the plain
    # pass's largest batch is then the largest of those layouts.
    if may_share_prefix(run):
        tokens = max(batch_layout(b, run.pad, cfg.pack, share_prefix=True).slots for b in batches if b)
    # Without checkpointing the lean pass runs where it applies (one process: several wrap the
    # model, which keeps the module pass): priced on its own shape.
    lean = run.accelerator.num_processes == 1 and lean_reason(run.model) is None
    growth = (lambda device: lean_sft_growth_bytes(run, worst_batch, device)) if lean else None
    return plan_memory(run.model, run.dtype, tokens=tokens, tokens_checkpointed=worst.slots, logit_positions=positions,
                       requested=cfg.gradient_checkpointing, budget_gib=cfg.memory_budget,
                       pass_growth_bytes=growth, pass_holds_logits=not lean)


def lean_sft_growth_bytes(run: SFTRun, batch: list[SFTItem], device) -> float:
    """What ``sft_loss_lean`` on ``batch`` adds to the process's peak, as RL's lean pass is priced
    (``labelrl.train.memory_rl``): its saved bytes measured on the batch's 2 and 3 longest items and
    extended by the line through them to the whole batch (each item brings its own tokens, and
    taking the longest first prices every later one as long as the third), on a CPU grown by
    the heap (``HEAP_GROWTH_RL``, plus a fixed part per frozen weight)."""
    from labelrl.train.memory import saved_bytes_of
    from labelrl.train.memory_rl import extended, grown_by_heap

    longest = sorted(batch, key=lambda it: -len(it.input_ids))
    share = may_share_prefix(run)

    def saved(k: int) -> int:
        items = longest[:k]
        # the lean pass's shapes: each item's prompt and answer lengths, and the prefix they share
        shared = shared_prefix_length([it.input_ids[: it.n_prompt] for it in items]) if share else 0
        key = ("sft lean pass", tuple((it.n_prompt, len(it.input_ids)) for it in items), shared, run.dtype)
        return saved_bytes_of(run.model, lambda: sft_loss_lean(run.model, items, run.pad, run.dtype, share), key=key)

    return grown_by_heap(run.model, extended(saved, len(longest)), device)


def _sft_loop(run: SFTRun) -> dict:
    cfg, accelerator = run.cfg, run.accelerator
    main, model = accelerator.is_main_process, run.model
    select_key = K.EVAL_BALANCED_ACCURACY if cfg.select_metric == "balanced_accuracy" else K.EVAL_ACCURACY
    best: dict = {"step": None, select_key: float("-inf")}
    metrics_path = run.run_dir / "sft_metrics.jsonl"
    if main:
        metrics_path.unlink(missing_ok=True)
    with progress_bar(accelerator, run.total, "sft", quiet=cfg.quiet) as progress:
        for step in range(run.total):
            record = {K.STEP: step + 1, **sft_step(run, run.batch(step))}
            if cfg.eval_every and ((step + 1) % cfg.eval_every == 0 or step + 1 == run.total):
                if main:
                    record.update(evaluate_val(accelerator.unwrap_model(model), run.tokenizer, run.data, cfg, run.dtype))
                    # ties go to the later (longer-trained) model
                    if record.get(select_key, float("-inf")) >= best[select_key]:
                        best = {"step": step + 1, **{k: record[k] for k in record if k.startswith("eval/")}}
                        save_model(run.run_dir, accelerator.unwrap_model(model), run.tokenizer)
                accelerator.wait_for_everyone()
            record[K.PEAK_MEMORY_MB] = reduce_value(accelerator, peak_memory_mb(), "max")
            if main:
                append_jsonl(metrics_path, record)
            accelerator.log({k: v for k, v in record.items() if k != K.STEP}, step=step + 1)
            progress.update(step + 1, {"loss": record[K.LOSS], "val_ba": record.get(K.EVAL_BALANCED_ACCURACY)})
    if not cfg.eval_every:  # no evaluation chose a model: the last step's is the run's
        best = {"step": run.total}
        if main:
            save_model(run.run_dir, accelerator.unwrap_model(model), run.tokenizer)
        accelerator.wait_for_everyone()
    return finish_sft(run, best)


def finish_sft(run: SFTRun, best: dict) -> dict:
    """``sft_summary.json`` (and the merged model with --merge), written by the main process."""
    summary = {"steps": run.total, "train_items": len(run.items), "best": best, "model_dir": str(run.run_dir / "model"),
               "precision": precision_name(run.dtype), "memory": run.memory.as_dict(),
               "training_pass": "lean" if run.lean_reason is None else f"module ({run.lean_reason})"}
    if run.accelerator.is_main_process:
        if run.cfg.merge:
            from labelrl.models import load_model

            best_model, best_tok = load_model(str(run.run_dir / "model"))
            summary["merged_dir"] = str(save_merged(run.run_dir, best_model, best_tok))
        atomic_write_json(run.run_dir / "sft_summary.json", summary)
    return broadcast_from_main(run.accelerator, summary)


def target_tokens(items: list[SFTItem]) -> int:
    """Assistant tokens the loss covers (everything after each prompt)."""
    return sum(len(it.input_ids) - it.n_prompt for it in items)


def sft_step(run: SFTRun, batch: list[SFTItem]) -> dict:
    """One optimizer step on ``batch``, this process computing the loss of ``batch[share]``.

    The loss is the mean over the whole batch's assistant tokens: this process's mean
    times its share of the tokens, times P because DDP averages the P gradients.
    """
    accelerator, started = run.accelerator, time.perf_counter()
    mine = batch[run.share]
    share = may_share_prefix(run) and not checkpointing(run.model)  # checkpointed layers drop the cache
    if run.lean_reason is None:
        layout = None
        loss = sft_loss_lean(run.model, mine, run.pad, run.dtype, share_prefix=share)
    else:
        layout = batch_layout(mine, run.pad, run.cfg.pack, share_prefix=share)
        loss = sft_loss(run.model, layout, run.pad, run.dtype)
    n = accelerator.num_processes
    if n > 1:
        fraction = target_tokens(mine) / target_tokens(batch)
        accelerator.backward(loss * (fraction * n))
        loss_value = reduce_value(accelerator, loss.item() * fraction)
    else:
        accelerator.backward(loss)
        loss_value = loss.item()
    grad_norm = accelerator.clip_grad_norm_(run.model.parameters(), run.cfg.max_grad_norm)
    run.optimizer.step()
    run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    seconds = time.perf_counter() - started
    tokens_here = sum(len(it.input_ids) for it in mine)  # a shared prefix counts per item
    # the lean pass computes real tokens only: no padding, whatever prefix it shares
    real_here, slots_here = (tokens_here, tokens_here) if layout is None else (layout.real_tokens, layout.slots)
    real, slots = reduce_value(accelerator, real_here), reduce_value(accelerator, slots_here)
    tokens = reduce_value(accelerator, tokens_here)
    return {K.LOSS: loss_value, K.GRAD_NORM: float(grad_norm), K.LEARNING_RATE: run.scheduler.get_last_lr()[0],
            K.STEP_SECONDS: seconds, K.PADDING_SHARE: 1.0 - real / slots, K.TRAIN_TOKENS_PER_S: tokens / seconds}


def load_kept_traces(path) -> dict[str, str]:
    """Item id → trace text for the kept traces of a ``labelrl distill`` traces file (JSONL)."""
    from labelrl.fileio import read_jsonl

    records = read_jsonl(path)
    if not records:
        raise ValueError(f"--traces {path}: no traces found; run `labelrl distill` first")
    return {str(r["id"]): r["trace"] for r in records if r.get("kept")}
