"""Resumable checkpoints and saved models, safetensors only.

A checkpoint holds what a resumed run needs to continue bit-for-bit on CPU: the trainable
parameters, the optimizer and scheduler state, the torch RNG state and the step. Data order
and sampling seeds are functions of (seed, step), so they need no saved state. Every
checkpoint is written into a temporary directory and renamed into place.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from labelrl.fileio import atomic_write_dir

CHECKPOINTS = "checkpoints"
MODEL_DIR = "model"
KEEP_LAST = 2


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / CHECKPOINTS / f"step_{step:06d}"


def latest_checkpoint(run_dir: Path) -> Path | None:
    root = Path(run_dir) / CHECKPOINTS
    found = sorted(p for p in root.glob("step_*") if (p / "state.json").is_file()) if root.is_dir() else []
    return found[-1] if found else None


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """Split an optimizer state dict into tensors (safetensors) and plain values (JSON)."""
    state = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    plain: dict[str, Any] = {"param_groups": state["param_groups"], "state": {}}
    for index, slots in state["state"].items():
        plain["state"][str(index)] = {}
        for key, value in slots.items():
            if torch.is_tensor(value):
                tensors[f"{index}.{key}"] = value.detach().contiguous().clone()
            else:
                plain["state"][str(index)][key] = value
    return tensors, plain


def _restore_optimizer(optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], plain: dict) -> None:
    state: dict[int, dict[str, Any]] = {int(i): dict(v) for i, v in plain["state"].items()}
    for name, value in tensors.items():
        index, key = name.split(".", 1)
        state.setdefault(int(index), {})[key] = value
    optimizer.load_state_dict({"state": state, "param_groups": plain["param_groups"]})


def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().contiguous().clone() for n, p in model.named_parameters() if p.requires_grad}


def save_checkpoint(run_dir: Path, step: int, model, optimizer, scheduler, extra: dict) -> Path:
    """Write checkpoint ``step`` atomically and prune all but the last ``KEEP_LAST``."""
    target = checkpoint_dir(run_dir, step)

    def fill(tmp: Path) -> None:
        save_file(trainable_state(model), str(tmp / "trainable.safetensors"))
        tensors, plain = _optimizer_tensors(optimizer)
        tensors["__torch_rng__"] = torch.get_rng_state()
        save_file(tensors, str(tmp / "optimizer.safetensors"))
        state = {"step": step, "optimizer": plain, "scheduler": scheduler.state_dict(), **extra}
        (tmp / "state.json").write_text(json.dumps(state, default=float), encoding="utf-8")

    atomic_write_dir(target, fill)
    older = sorted((Path(run_dir) / CHECKPOINTS).glob("step_*"))[:-KEEP_LAST]
    for old in older:
        shutil.rmtree(old, ignore_errors=True)
    return target


def load_checkpoint(path: Path, model, optimizer, scheduler) -> dict:
    """Restore a checkpoint into live objects; returns its state (``step`` and extras)."""
    path = Path(path)
    weights = load_file(str(path / "trainable.safetensors"))
    params = dict(model.named_parameters())
    missing = sorted(set(weights) - set(params))
    if missing:
        raise ValueError(
            f"checkpoint {path} holds parameters the model lacks (e.g. {missing[0]}); "
            "resume with the same --model and LoRA settings as the original run"
        )
    with torch.no_grad():
        for name, value in weights.items():
            params[name].copy_(value)
    state = json.loads((path / "state.json").read_text(encoding="utf-8"))
    tensors = load_file(str(path / "optimizer.safetensors"))
    torch.set_rng_state(tensors.pop("__torch_rng__"))
    _restore_optimizer(optimizer, tensors, state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    return state


def save_model(run_dir: Path, model, tokenizer, name: str = MODEL_DIR) -> Path:
    """Save the trained model as a loadable directory (adapter or full weights) with its tokenizer."""
    target = Path(run_dir) / name

    def fill(tmp: Path) -> None:
        extra = {"save_embedding_layers": False} if hasattr(model, "peft_config") else {}
        model.save_pretrained(str(tmp), safe_serialization=True, **extra)
        tokenizer.save_pretrained(str(tmp))

    atomic_write_dir(target, fill)
    return target


def save_merged(run_dir: Path, model, tokenizer, name: str = "merged") -> Path:
    """Fold a LoRA adapter into the base weights and save a plain Hugging Face directory."""
    merged = model.merge_and_unload() if hasattr(model, "merge_and_unload") else model
    return save_model(run_dir, merged, tokenizer, name)
