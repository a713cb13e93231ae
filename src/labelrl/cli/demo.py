"""``labelrl demo``: the longest real pipeline, end to end, on the built-in data.

audit (label ceiling) → direct SFT (the baseline) → GRPO and CoRPO from the SFT model →
val balanced accuracy of every arm by label-token scoring, printed side by side with the
ceiling. ``--fast`` runs the same pipeline on ``tiny-random`` in about a minute.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console
from rich.table import Table

from labelrl.cli.options import config_command

console = Console()


class DemoConfig(BaseModel):
    """``labelrl demo``: audit, SFT, GRPO and CoRPO on sms-spam, compared on val."""

    model_config = ConfigDict(extra="forbid")

    out: Path = Field(Path("runs/demo"), description="Run directory (one sub-directory per arm).")
    fast: bool = Field(False, description="Smoke-test scale: tiny-random, a few steps; about a minute.")
    data: str = Field("sms-spam", description="Built-in dataset or file to run on.")
    limit: int = Field(400, ge=8, description="Training items used (a subsample keeps the CPU demo short).")
    sft_steps: int = Field(48, ge=1, description="SFT optimizer steps (batch 8).")
    rl_steps: int = Field(12, ge=1, description="RL steps per RL arm.")
    eval_limit: int = Field(128, ge=8, description="Val items scored for the comparison table.")
    threshold: float = Field(0.5, description="CoRPO correctness threshold τ (0/1 rewards: 0.5).")
    seed: int = Field(0, description="Seed of every arm.")


def _arms(cfg: DemoConfig):
    from labelrl.train.config import RLConfig, SFTConfig

    model = "tiny-random" if cfg.fast else "smollm2-135m-instruct"
    common = dict(data=cfg.data, limit=cfg.limit, seed=cfg.seed, quiet=False)
    tiny = dict(lora=False, learning_rate=3e-3) if cfg.fast else {}
    sft = SFTConfig(model=model, out=cfg.out / "sft", max_steps=cfg.sft_steps, batch_size=8,
                    eval_every=cfg.sft_steps, eval_limit=cfg.eval_limit, **common, **tiny)
    rl_common = dict(model=str(cfg.out / "sft"), steps=cfg.rl_steps, group_size=4, prompts_per_step=4,
                     max_new_tokens=12, checkpoint_every=cfg.rl_steps, **common,
                     **(dict(lora=False, learning_rate=1e-3) if cfg.fast else dict(learning_rate=5e-5)))
    return sft, {
        "grpo": RLConfig(out=cfg.out / "rl_grpo", preset="grpo", **rl_common),
        "corpo": RLConfig(out=cfg.out / "rl_corpo", preset="corpo", threshold=cfg.threshold, **rl_common),
    }


def _val_metrics(run_dir: Path, sft_cfg) -> dict:
    from labelrl.models import load_model
    from labelrl.train.sft import evaluate_val
    from labelrl.train.setup import prepare_data

    model, tokenizer = load_model(str(run_dir / "model"))
    return evaluate_val(model, tokenizer, prepare_data(sft_cfg, run_dir), sft_cfg)


def run_demo(cfg: DemoConfig) -> dict:
    from labelrl import metrics_keys as K
    from labelrl.audit import audit_dataset
    from labelrl.data import load_dataset
    from labelrl.fileio import atomic_write_json, read_jsonl
    from labelrl.train.checkpoint import latest_checkpoint
    from labelrl.train.rl import run_rl
    from labelrl.train.sft import run_sft

    sft_cfg, rl_cfgs = _arms(cfg)
    console.rule("1/4 label audit")
    audit = audit_dataset(load_dataset(cfg.data), n_boot=200, seed=cfg.seed, top=0)
    atomic_write_json(cfg.out / "audit.json", audit)
    console.rule("2/4 direct SFT (the baseline)")
    if (sft_cfg.out / "sft_summary.json").exists():  # finished arms are not redone
        console.print(f"reusing the finished SFT run in {sft_cfg.out}")
    else:
        run_sft(sft_cfg)
    rows = {"sft": _val_metrics(cfg.out / "sft", sft_cfg)}
    for i, (name, rl_cfg) in enumerate(rl_cfgs.items(), start=3):
        console.rule(f"{i}/4 {name} from the SFT model")
        if (rl_cfg.out / "model").is_dir():
            console.print(f"reusing the finished {name} run in {rl_cfg.out}")
        else:  # a killed arm continues from its last checkpoint
            run_rl(rl_cfg.model_copy(update={"resume": latest_checkpoint(rl_cfg.out) is not None}))
        metrics = read_jsonl(rl_cfg.out / "metrics.jsonl")
        rows[name] = {**_val_metrics(rl_cfg.out, sft_cfg),
                      "reward_first": metrics[0][K.REWARD_MEAN], "reward_last": metrics[-1][K.REWARD_MEAN],
                      "failed_positive": sum(m[K.FAILED_POSITIVE_FRAC] for m in metrics) / len(metrics)}
    summary = {"ceiling": audit.get("ceiling"), "arms": rows}
    atomic_write_json(cfg.out / "demo_summary.json", summary)
    _print(summary, cfg)
    return summary


def _print(summary: dict, cfg: DemoConfig) -> None:
    from labelrl import metrics_keys as K

    def fmt(value):
        return "–" if value is None else f"{value:.3f}"

    table = Table(title=f"{cfg.data}: val metrics ({cfg.eval_limit} items, label-token scoring)")
    for column in ("arm", "accuracy", "balanced acc.", "reward first→last step", "failed-positive frac"):
        table.add_column(column, justify="right" if column != "arm" else "left")
    table.add_row("label ceiling (1 − ε)", fmt(summary["ceiling"]), "", "", "")
    for name, row in summary["arms"].items():
        rewards = f"{fmt(row.get('reward_first'))} → {fmt(row.get('reward_last'))}" if "reward_first" in row else ""
        table.add_row(name, fmt(row.get(K.EVAL_ACCURACY)), fmt(row.get(K.EVAL_BALANCED_ACCURACY)), rewards,
                      fmt(row.get("failed_positive")) if "failed_positive" in row else "")
    console.print(table)
    console.print(f"run files: {cfg.out}")


def register(app: typer.Typer) -> None:
    config_command(app, "demo", DemoConfig, run_demo,
                   help="Run the demo pipeline: label audit, direct SFT, GRPO and CoRPO from SFT, compared on val.")
