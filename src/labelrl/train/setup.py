"""What every trainer does before its loop: the run directory, data and splits, model and optimizer."""

from __future__ import annotations

import math
import random
import shutil
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

from labelrl.data import load_dataset, write_skipped_rows
from labelrl.data.prompts import check_labels_expressible, render_messages, render_prompt
from labelrl.data.split import load_or_make_splits, select
from labelrl.fileio import atomic_write_text
from labelrl.models import BUILTIN_MODELS, load_model
from labelrl.rollout.sampler import model_device  # noqa: F401  (re-exported for the trainers)
from labelrl.train.config import DataOptions, ModelOptions
from labelrl.types import Dataset, Example

RUN_MODEL_DIR = "model"


@dataclass
class RunData:
    dataset: Dataset
    train: list[Example]
    val: list[Example]
    rubric: str | None


def init_run_dir(cfg, command: str, *, write: bool = True) -> Path:
    """Create the run directory and save the resolved config (``<command>_config.yaml``);
    with ``write=False`` (a process other than the main one) only the path is returned."""
    run_dir = Path(cfg.out)
    if not write:
        return run_dir
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".write_probe"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise ValueError(f"--out {run_dir}: cannot write there ({exc.strerror}); choose a writable directory") from None
    atomic_write_text(run_dir / f"{command}_config.yaml", yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    return run_dir


def load_checked_dataset(cfg: DataOptions) -> Dataset:
    """The dataset the options name, refused when the answer tag cannot express its labels."""
    dataset = load_dataset(cfg.data, text_cols=cfg.text_col, label_col=cfg.label_col, labels=cfg.label_list(),
                           kind=cfg.kind, on_bad_row=cfg.on_bad_row)
    check_labels_expressible(dataset.labels)
    return dataset


def prepare_data(cfg: DataOptions, run_dir: Path, *, write: bool = True) -> RunData:
    """Load and validate the data, and reuse (or make) the run directory's shared splits.
    ``write=False`` (a process other than the main one) leaves the skipped-rows report to the
    main process; splits are read, and made only when missing, so the main process goes first."""
    dataset = load_checked_dataset(cfg)
    if dataset.skipped_rows and write:  # --on-bad-row skip: said and saved, never silent
        saved = write_skipped_rows(dataset, run_dir / "skipped_rows.jsonl")
        print(f"skipped {len(dataset.skipped_rows)} bad rows of {cfg.data}; the list is in {saved}", file=sys.stderr)
    splits = load_or_make_splits(dataset, run_dir, seed=cfg.split_seed)
    train = select(dataset, splits, "train")
    if cfg.limit is not None:
        train = train[: cfg.limit]
    val = select(dataset, splits, "val")
    rubric = None
    if cfg.rubric is not None:
        if not Path(cfg.rubric).is_file():
            raise ValueError(f"--rubric {cfg.rubric}: no such file; give the path of the rubric markdown")
        rubric = Path(cfg.rubric).read_text(encoding="utf-8")
    if not train:
        raise ValueError(f"--data {cfg.data}: the train split is empty; use more data or other split ratios")
    return RunData(dataset=dataset, train=train, val=val, rubric=rubric)


def prompt_ids(tokenizer, examples: list[Example], data: RunData, mode: str) -> list[list[int]]:
    """Token ids of each example's chat prompt (generation prompt included, no answer)."""
    out = []
    for ex in examples:
        messages = render_messages(ex, labels=data.dataset.labels, mode=mode, rubric=data.rubric)
        text = render_prompt(tokenizer, messages)
        out.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return out


def preflight(model, prompts: list[list[int]], new_tokens: int, run_dir: Path, *, checkpoints: int) -> None:
    """Checks that fail in seconds rather than hours into a run, each with one clear message:
    every prompt plus ``new_tokens`` fits the model's context, and the run directory has
    room for ``checkpoints`` checkpoints (trainable weights and two AdamW moments) and the
    saved model."""
    context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if context:
        too_long = [len(p) for p in prompts if len(p) + new_tokens > context]
        if too_long:
            raise ValueError(
                f"{len(too_long)} of {len(prompts)} prompts (longest {max(too_long)} tokens) plus {new_tokens} "
                f"new tokens exceed the model's context of {context} tokens; shorten the texts, lower the "
                "token cap, or leave those items out of the data"
            )
    trainable = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    needed = 3 * trainable * checkpoints + total
    free = shutil.disk_usage(run_dir).free
    if free < needed:
        raise ValueError(
            f"--out {run_dir}: {free / 2**20:.0f} MiB free, but checkpoints and the saved model need about "
            f"{needed / 2**20:.0f} MiB; free some space or choose another --out"
        )


def resolve_model_spec(spec: str) -> str:
    """A run directory stands for the model it saved (``RUN_DIR/model``)."""
    saved = Path(spec) / RUN_MODEL_DIR
    return str(saved) if saved.is_dir() else spec


def prepare_model(cfg: ModelOptions):
    """Load the model and make the right parameters trainable.

    LoRA on a plain model adds a fresh adapter on every linear layer; LoRA on a saved
    adapter (an SFT run) keeps training that adapter, so the result stays one adapter on
    the original base; full fine-tuning folds any adapter in first.
    """
    from peft import LoraConfig, PeftModel, get_peft_model

    spec = resolve_model_spec(cfg.model)
    torch.manual_seed(cfg.seed)
    model, tokenizer = load_model(spec, trust_remote_code=cfg.trust_remote_code)
    if isinstance(model, PeftModel):
        if cfg.lora:
            for name, param in model.named_parameters():
                param.requires_grad = "lora_" in name
        else:
            model = model.merge_and_unload()
    elif cfg.lora:
        # Recorded in adapter_config.json so load_model(adapter_dir) finds the same base.
        base_name = spec if spec in BUILTIN_MODELS else str(Path(spec).resolve())
        lora = LoraConfig(
            r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=0.0,
            target_modules="all-linear", task_type="CAUSAL_LM",
        )
        with warnings.catch_warnings():
            # peft asks transformers 5 for a renamed attribute; the message is for peft's authors
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            model = get_peft_model(model, lora)
        model.peft_config["default"].base_model_name_or_path = base_name
    if not cfg.lora:
        for param in model.parameters():
            param.requires_grad = True
    model.train()
    return model, tokenizer


def make_optimizer(model, cfg: ModelOptions, total_steps: int):
    """AdamW on the trainable parameters with a constant learning rate after a short warm-up."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    warmup = max(1, min(10, math.ceil(0.05 * total_steps)))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup))
    return optimizer, scheduler


def make_accelerator(cfg: ModelOptions, run_dir: Path, command: str, *, trackers: bool = True):
    """One CPU, one GPU or many (``accelerate launch``): device placement, backward and
    gradient clipping go through accelerate; bf16 autocast where the GPU supports it.
    With ``--report-to`` the same metrics also reach that tracker (``trackers=False``
    defers that to ``start_trackers``, e.g. until the run directory has been checked).

    Under several processes ``prepare`` wraps the model in DistributedDataParallel, whose
    forward calls (with gradients) broadcast buffers: every process must make the same
    forward calls through the wrapper, which the trainers ensure.
    """
    from accelerate import Accelerator

    cuda = torch.cuda.is_available()
    accelerator = Accelerator(
        cpu=not cuda, mixed_precision="bf16" if cuda and torch.cuda.is_bf16_supported() else "no",
        log_with=cfg.report_to, project_dir=str(run_dir / "tracking") if cfg.report_to else None,
    )
    if trackers:
        start_trackers(accelerator, cfg, command)
    return accelerator


def start_trackers(accelerator, cfg: ModelOptions, command: str) -> None:
    if cfg.report_to:
        flat = {k: (v if isinstance(v, (int, float, str, bool)) else str(v)) for k, v in cfg.model_dump().items()}
        accelerator.init_trackers(f"labelrl-{command}", config=flat)


def process_share(total: int, accelerator, option: str) -> slice:
    """This process's contiguous share of the ``total`` items of every step (all of them
    for a single process); ``option`` names the setting in the error."""
    n, rank = accelerator.num_processes, accelerator.process_index
    if total % n:
        flag = "--" + option.replace("_", "-")
        raise ValueError(
            f"{option}={total} does not split evenly over {n} processes: each process takes an equal share "
            f"of every step; set {flag} to a multiple of {n}"
        )
    size = total // n
    return slice(rank * size, (rank + 1) * size)


def gather_objects(accelerator, obj) -> list:
    """``obj`` of every process, in process order (``[obj]`` for a single process)."""
    if accelerator.num_processes == 1:
        return [obj]
    out = [None] * accelerator.num_processes
    torch.distributed.all_gather_object(out, obj)
    return out


def reduce_value(accelerator, value: float, op: str = "sum") -> float:
    """``value`` summed (``op="sum"``) or maximised (``"max"``) over processes."""
    if accelerator.num_processes == 1:
        return value
    tensor = torch.tensor([float(value)], dtype=torch.float64, device=accelerator.device)
    torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.SUM if op == "sum" else torch.distributed.ReduceOp.MAX)
    return float(tensor.item())


def any_process(accelerator, flag: bool) -> bool:
    """True on every process when ``flag`` is true on any (keeps their loops in step)."""
    return reduce_value(accelerator, float(bool(flag)), "max") > 0


def broadcast_from_main(accelerator, obj):
    """The main process's ``obj``, on every process."""
    if accelerator.num_processes == 1:
        return obj
    box = [obj]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


class _Silent:
    """Stands in for a progress bar on processes other than the main one."""

    def __enter__(self) -> "_Silent":
        return self

    def __exit__(self, *exc) -> None:
        return None

    def update(self, step: int, figures: dict) -> None:
        return None


def progress_bar(accelerator, total: int, name: str, *, quiet: bool, start: int = 0):
    """The step progress display, on the main process only."""
    from labelrl.train.progress import StepProgress

    return StepProgress(total, name, quiet=quiet, start=start) if accelerator.is_main_process else _Silent()


def peak_memory_mb() -> float:
    """Peak resident memory of this process (CUDA peak allocation when on GPU)."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def ordered_indices(n: int, start: int, count: int, seed: int) -> list[int]:
    """Positions ``start … start+count−1`` of an endless stream of seeded per-epoch permutations.

    Data order is a pure function of (seed, position), so a resumed run needs only its
    position to draw the same items an uninterrupted run would.
    """
    out, cached_epoch, order = [], None, []
    for pos in range(start, start + count):
        epoch, offset = divmod(pos, n)
        if epoch != cached_epoch:
            order = list(range(n))
            random.Random(seed * 1_000_003 + epoch).shuffle(order)
            cached_epoch = epoch
        out.append(order[offset])
    return out
