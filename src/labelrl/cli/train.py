"""``labelrl sft`` and ``labelrl rl``: options come from the config models in labelrl.train.config."""

from __future__ import annotations

import os
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from labelrl.cli.options import config_command
from labelrl.train.config import RLConfig, SFTConfig

console = Console()


def _main_process() -> bool:
    """Under ``accelerate launch``/``torchrun`` only rank 0 prints the summary."""
    return int(os.environ.get("RANK", "0")) == 0


def _fmt(value) -> str:
    return "–" if value is None else f"{value:.3f}"


def _files_table(files: dict[str, str]) -> Table:
    table = Table(title="files", title_justify="left", show_header=False, box=None, padding=(0, 2, 0, 0))
    for what, path in files.items():
        table.add_row(what, path)
    return table


def print_sft_summary(summary: dict, cfg: SFTConfig, out: Console) -> None:
    """Steps, items, the best val figures and the files written (the record: sft_summary.json)."""
    from labelrl.train.summary import long_items_line

    run_dir = Path(cfg.out)
    best = summary["best"]
    out.print(f"[bold green]sft done[/]: {summary['steps']} steps on {summary['train_items']} training items",
              highlight=False)
    if cfg.eval_every:
        table = Table(title=f"best on val (step {best['step']})", title_justify="left")
        table.add_column("balanced accuracy", justify="right")
        table.add_column("accuracy", justify="right")
        table.add_row(_fmt(best.get("eval/balanced_accuracy")), _fmt(best.get("eval/accuracy")))
        out.print(table)
    else:
        out.print(f"the last step's model kept (step {best['step']}; --eval-every 0: not scored on val here, "
                  f"`labelrl eval {run_dir} --split val` scores it)", highlight=False)
    line = long_items_line(run_dir / "long_items_sft.json")
    if line:
        out.print(line, highlight=False)
    files = {"model": summary["model_dir"], "metrics (every step)": str(run_dir / "sft_metrics.jsonl"),
             "summary": str(run_dir / "sft_summary.json")} | ({"merged": summary["merged_dir"]} if "merged_dir" in summary else {})
    out.print(_files_table(files))


def print_rl_summary(summary: dict, cfg: RLConfig, out: Console) -> None:
    """Steps, the rollout figures over the first and last steps and the files written (the
    record: rl_summary.json, metrics.jsonl, rollouts/)."""
    from labelrl.train.summary import long_items_line, rl_figures

    figures = rl_figures(Path(cfg.out))
    state = "stopped early (checkpoint saved; --resume continues)" if summary["stopped_early"] else "done"
    out.print(f"[bold green]rl {cfg.preset} {state}[/]: {summary['steps_done']}/{summary['steps']} steps", highlight=False)
    if figures["rows"]:
        table = Table(title="rollouts (means over the steps)", title_justify="left")
        table.add_column("")
        for title in figures["columns"]:
            table.add_column(title, justify="right")
        for name, values in figures["rows"]:
            table.add_row(name, *[_fmt(v) for v in values])
        out.print(table)
    pace = [f"median {figures['seconds_per_step']:.2f} s per step"] if figures["seconds_per_step"] is not None else []
    pace += [f"peak memory {figures['peak_memory_mb']:.0f} MB"] if figures["peak_memory_mb"] else []
    if pace:
        out.print("; ".join(pace), highlight=False)
    line = long_items_line(Path(cfg.out) / "long_items_rl.json")
    if line:
        out.print(line, highlight=False)
    if summary.get("collapse"):
        from labelrl.train.collapse import collapse_detail

        # a parent that already answered one label needs more SFT, not a gentler RL rate
        fix = ("train the starting model until it answers more than one label (labelrl sft: more --max-steps, another "
               "--learning-rate)" if summary["collapse"].get("inherited") else "lower --learning-rate")
        out.print(f"[bold red]{collapse_detail(summary['collapse'])}[/]: its scores are a constant answer's, not the "
                  f"method's; {fix}", highlight=False)
    out.print(_files_table(figures["files"]))


def _run_sft(cfg: SFTConfig) -> None:
    from labelrl.train.sft import run_sft

    summary = run_sft(cfg)
    if _main_process():
        print_sft_summary(summary, cfg, console)


def _run_rl(cfg: RLConfig) -> None:
    from labelrl.train.rl import run_rl

    summary = run_rl(cfg)
    if _main_process():
        print_rl_summary(summary, cfg, console)


def register(app: typer.Typer) -> None:
    config_command(app, "sft", SFTConfig, _run_sft,
                   help="Supervised fine-tuning on labels (direct) or teacher traces (reasoning): the baseline every RL run must beat.")
    config_command(app, "rl", RLConfig, _run_rl,
                   help="Group-relative RL (GRPO, Dr. GRPO, DAPO, GSPO, RLOO, CoRPO) with the label as verifier; every rollout is logged.")
