"""What every trainer does around its loop: the run directory, the preflight checks, the
optimizer, the progress display and the order of the training items.

Data preparation lives in ``labelrl.data.prepare``, model preparation in
``labelrl.models.prepare`` and the helpers for several processes in ``labelrl.train.distributed``.
"""

from __future__ import annotations

import math
import random
import shutil
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import torch
import yaml

from labelrl.fileio import atomic_write_text
from labelrl.train.config import ModelOptions
from labelrl.train.memory import peak_resident_bytes


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


FUSED_ADAMW_DEVICES = ("cpu", "cuda")  # where torch 2.13 has a fused AdamW kernel


def lr_factor(step: int, *, warmup: int, total: int, decay: bool) -> float:
    """The learning rate's factor for 0-based optimizer step ``step`` of ``total``.

    A linear warm-up over ``warmup`` steps (Goyal et al. 2017, §2.2), then 1, or with ``decay`` a
    linear decay that would reach 0 one step after the last (Devlin et al. 2019, §A.2): every step
    trains, and the last ones move the model least.
    """
    rise = (step + 1) / warmup
    if not decay:
        return min(1.0, rise)
    return min(1.0, rise, (total - step) / (total - warmup + 1))


def make_optimizer(model, cfg: ModelOptions, total_steps: int):
    """AdamW on the trainable parameters; after a short linear warm-up, the rate of ``cfg.lr_schedule``."""
    params = [p for p in model.parameters() if p.requires_grad]
    # torch's fused kernel: one pass over all tensors instead of a loop of per-tensor ops (a LoRA
    # adapter's 420 tensors on SmolLM2: 33 → 6 ms per step on 2 CPU cores); the same update
    # (Loshchilov & Hutter 2019, Alg. 2), rounded alike up to the order of its operations.
    fused = all(p.device.type in FUSED_ADAMW_DEVICES and p.is_floating_point() for p in params) or None
    optimizer = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay, fused=fused)
    warmup = max(1, min(10, math.ceil(0.05 * total_steps)))
    decay = cfg.lr_schedule == "linear"
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, partial(lr_factor, warmup=warmup, total=total_steps, decay=decay))
    return optimizer, scheduler


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
    return peak_resident_bytes() / 2**20


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


def balanced_indices(labels: Sequence[str], start: int, count: int, seed: int) -> list[int]:
    """Positions ``start … start+count−1`` of an endless label-balanced stream: each run of K
    consecutive positions (K labels) holds one item of every label, the labels' order within the
    run shuffled, and each label's items drawn from their own ``ordered_indices`` stream (a
    minority label's items come round again sooner).

    Drawing prompts this way weighs every label equally, so the expected 0/1 reward is the mean
    of the per-label recalls, the balanced accuracy, where a uniform draw's expected reward is
    plain accuracy, which answering the majority label wins on skewed data. A pure function of
    (seed, position), like ``ordered_indices``.
    """
    keys = sorted(set(labels))
    members = {k: [i for i, lab in enumerate(labels) if lab == k] for k in keys}
    first, last = start // len(keys), (start + count - 1) // len(keys)  # the turns this call reaches
    # each label's stream over those turns, drawn once (a shuffle of its items per epoch, not per position)
    streams = {k: ordered_indices(len(members[k]), first, last - first + 1, seed * 1_000_003 + 104_729 * (j + 1))
               for j, k in enumerate(keys)}
    out = []
    for pos in range(start, start + count):
        turn, slot = divmod(pos, len(keys))
        order = list(keys)
        random.Random(seed * 1_000_003 + 7919 * turn + 1).shuffle(order)
        label = order[slot]
        out.append(members[label][streams[label][turn - first]])
    return out


def training_order(labels: Sequence[str], sampling: str, start: int, count: int, seed: int) -> list[int]:
    """Positions ``start … start+count−1`` of a run's training stream over items with ``labels``:
    ``balanced_indices`` for ``--prompt-sampling balanced``, else ``ordered_indices`` (uniform).
    SFT draws its items and RL its prompts through this one choice."""
    if sampling == "balanced":
        return balanced_indices(labels, start, count, seed)
    return ordered_indices(len(labels), start, count, seed)
