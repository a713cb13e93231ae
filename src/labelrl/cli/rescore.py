"""``labelrl rescore RUN_DIR --parse-mode lenient``: what a lenient parser would have paid."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from labelrl.cli.options import fail


def print_rescore(result: dict, console: Console) -> None:
    mode = result["parse_mode"]
    table = Table(title=f"{result['run_dir']}: strict vs {mode} parser on the logged rollouts", title_justify="left")
    for column in ("step", "rollouts", "reward strict", f"reward {mode}", "inflation", "parsed strict", f"parsed {mode}",
                   "answer read differently"):
        table.add_column(column, justify="right")
    rows = result["per_step"] + [{"step": "all", **result["overall"]}]
    for r in rows:
        table.add_row(str(r["step"]), str(r["n"]), f"{r['reward_strict']:.3f}", f"{r[f'reward_{mode}']:.3f}",
                      f"{r['inflation']:+.3f}", f"{r['parsed_strict']:.3f}", f"{r[f'parsed_{mode}']:.3f}",
                      f"{r['answer_changed']:.3f}")
    console.print(table)
    if result["random_reward"]:
        console.print("note: this run used the random-reward control; its logged rewards were not these grades.")
    console.print(f"wrote {Path(result['run_dir']) / f'rescore-{mode}.json'}", highlight=False)


def register(app: typer.Typer) -> None:
    @app.command("rescore", help="Re-grade an RL run's logged rollouts with another parser (default lenient) and "
                 "report the reward inflation per step: how much of the reward curve is format, not skill.")
    def rescore(
        run_dir: Path = typer.Argument(..., help="An RL run directory (the --out of `labelrl rl`).", show_default=False),
        parse_mode: str = typer.Option("lenient", "--parse-mode", help="The parser to compare with the strict one: lenient or strict."),
        json_path: Optional[Path] = typer.Option(None, "--json", help="Also write the result to this JSON file.", show_default=False),
    ) -> None:
        from labelrl.fileio import atomic_write_json
        from labelrl.train.rescore import rescore_run

        try:
            result = rescore_run(run_dir, parse_mode)
        except (ValueError, OSError) as exc:
            fail(str(exc))
        print_rescore(result, Console())
        if json_path is not None:
            atomic_write_json(json_path, result)
