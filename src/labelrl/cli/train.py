"""``labelrl sft`` and ``labelrl rl``: options come from the config models in labelrl.train.config."""

from __future__ import annotations

import json
import os

import typer
from rich.console import Console

from labelrl.cli.options import config_command
from labelrl.train.config import RLConfig, SFTConfig

console = Console()


def _main_process() -> bool:
    """Under ``accelerate launch``/``torchrun`` only rank 0 prints the summary."""
    return int(os.environ.get("RANK", "0")) == 0


def _run_sft(cfg: SFTConfig) -> None:
    from labelrl.train.sft import run_sft

    summary = run_sft(cfg)
    if not _main_process():
        return
    best = summary["best"]
    console.print(f"[bold green]sft done[/]: {summary['steps']} steps on {summary['train_items']} items; "
                  f"best val at step {best['step']}: " + ", ".join(f"{k} {v:.3f}" for k, v in best.items() if k != "step"))
    console.print(f"model: {summary['model_dir']}")


def _run_rl(cfg: RLConfig) -> None:
    from labelrl.train.rl import run_rl

    summary = run_rl(cfg)
    if not _main_process():
        return
    state = "stopped early (checkpoint saved; --resume continues)" if summary["stopped_early"] else "done"
    console.print(f"[bold green]rl {state}[/]: {summary['steps_done']}/{summary['steps']} steps")
    console.print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in summary["last"].items()}, indent=None))
    if "model_dir" in summary:
        console.print(f"model: {summary['model_dir']}")


def register(app: typer.Typer) -> None:
    config_command(app, "sft", SFTConfig, _run_sft,
                   help="Supervised fine-tuning on labels (direct) or teacher traces (reasoning): the baseline every RL run must beat.")
    config_command(app, "rl", RLConfig, _run_rl,
                   help="Group-relative RL (GRPO, Dr. GRPO, DAPO, RLOO, CoRPO) with the label as verifier; every rollout is logged.")
