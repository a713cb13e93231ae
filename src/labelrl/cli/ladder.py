"""``labelrl ladder RECIPE``: run a recipe's arms on shared splits, then print and report them."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from labelrl.cli.options import fail

console = Console()

SET_HELP = "Change one recipe value, KEY.PATH=VALUE (repeatable), e.g. --set tasks.spam.limit=2000 --set defaults.rl.steps=50."
FAST_HELP = "Apply the recipe's `fast:` overlay: a smoke-test scale (tiny-random, a few steps)."
PRECISION_OPTION_HELP = ("Compute precision of every arm and evaluation: auto (bf16 where the processor computes it "
                         "natively, else fp32), fp32 or bf16; the same as --set precision=VALUE. [default: the recipe's, auto]")


def precision_sets(precision: str | None, sets: list[str]) -> list[str]:
    """``--precision P`` as the recipe assignment ``precision=P`` (before the user's own --set)."""
    if precision is None:
        return list(sets)
    if precision not in ("auto", "fp32", "bf16"):
        raise ValueError(f"--precision {precision}: not a precision; use auto, fp32 or bf16")
    return [f"precision={precision}", *sets]


def run_ladder_command(recipe_source: str | Path, out: Path | None, *, fast: bool = False, sets: list[str] | None = None,
                       report: bool = True) -> dict:
    """Load the recipe, run the ladder, print the comparison and build the report; returns the state."""
    from labelrl.ladder.recipe import load_recipe
    from labelrl.ladder.run import Ladder

    recipe = load_recipe(recipe_source, fast=fast, sets=sets or [])
    run_dir = Path(out) if out is not None else Path("runs") / (recipe.name + ("-fast" if fast else ""))
    ladder = Ladder(recipe, run_dir, console)
    state = ladder.run()
    for table in comparison_tables(state):
        console.print(table)
    if report:
        from labelrl.report import build_report

        built = build_report(ladder.run_dir)
        state["report"] = {"html": str(built.html), "md": str(built.markdown)}
        console.print(f"report: {built.html} (and {built.markdown})")
    console.print(f"run files: {ladder.run_dir}")
    return state


def _fmt(metrics: dict | None, key: str) -> str:
    return "–" if not metrics or metrics.get(key) is None else f"{metrics[key]:.3f}"


def _status(arm: dict) -> str:
    status = arm.get("status", "pending")
    if status == "done" and arm.get("holdout_same_model_as"):
        return f"= {arm['holdout_same_model_as']}"  # same weights: the holdout result is shared
    if status == "done" and arm.get("holdout_repeat"):
        return "REPEAT"
    return status


def comparison_tables(state: dict) -> list[Table]:
    """One table per task: the ceiling, then every arm's val, holdout and out-of-domain figures
    (point estimates; the report has the intervals). Failed and skipped arms' reasons follow."""
    tables = []
    for task_name in state.get("task_order") or list(state["tasks"]):
        task = state["tasks"][task_name]
        keys = ["accuracy", "balanced_accuracy"] + (["mean_abs_grade_error"] if task.get("kind") == "ordinal" else [])
        columns = [("val", "balanced_accuracy")] + [("holdout", k) for k in keys]
        short = {"accuracy": "acc", "balanced_accuracy": "BA", "mean_abs_grade_error": "|err|"}
        caption = [f"ceiling 1 − ε from {task['ceiling_source']}"] if task.get("ceiling") is not None else []
        caption.append("failed+: mean share of failed rollouts given a positive advantage, over the RL steps; "
                       "= ARM: same weights as ARM, holdout result shared")
        caption += [f"{name}: {arm['status']}: {arm.get('error')}" for name, arm in task["arms"].items()
                    if arm.get("status") in ("failed", "skipped")]
        table = Table(title=f"{task_name}: {task['data']} ({task.get('kind')}), 95% intervals in the report",
                      title_justify="left", caption="\n".join(caption) or None, caption_justify="left")
        table.add_column("arm")
        table.add_column("status")
        for split, key in columns:
            table.add_column(f"{split} {short[key]}", justify="right")
        for ood in task.get("ood", []):
            table.add_column(f"{ood} BA", justify="right")
        table.add_column("failed+", justify="right")  # mean share of failed rollouts given a positive advantage
        if task.get("ceiling") is not None:
            ceiling = [f"{task['ceiling']:.3f}" if k == "accuracy" else "" for _, k in columns]
            table.add_row("ceiling", "", *ceiling, *["" for _ in task.get("ood", [])], "")
        for arm_name in task.get("arm_order") or list(task["arms"]):
            arm = task["arms"].get(arm_name, {})
            cells = [_fmt(arm.get(split), key) for split, key in columns]
            ood = [_fmt((arm.get("ood") or {}).get(name), "balanced_accuracy") for name in task.get("ood", [])]
            kind = arm.get("preset") or arm.get("type")
            failed = _fmt(arm.get("train"), "failed_positive_frac") if arm.get("train") else ""
            table.add_row(arm_name if kind == arm_name else f"{arm_name} ({kind})", _status(arm), *cells, *ood, failed)
        tables.append(table)
    return tables


def register(app: typer.Typer) -> None:
    @app.command("ladder")
    def ladder(
        recipe: str = typer.Argument(..., help="Recipe YAML file, or a built-in recipe name (demo, gpu). See recipes/."),
        out: Optional[Path] = typer.Option(None, "--out", help="Run directory (default runs/RECIPE_NAME). Re-running into it skips finished arms."),
        fast: bool = typer.Option(False, "--fast", help=FAST_HELP),
        set_: list[str] = typer.Option([], "--set", help=SET_HELP),
        report: bool = typer.Option(True, "--report/--no-report", help="Build RUN_DIR/report/report.html and report.md at the end."),
        precision: Optional[str] = typer.Option(None, "--precision", help=PRECISION_OPTION_HELP, metavar="AUTO|FP32|BF16"),
    ) -> None:
        """Run every arm of a recipe (SFT, RL presets, distillation, controls) in dependency order on shared
        splits; each final model is evaluated on val, then once on the holdout. Failed arms are reported and
        the arms that do not need them go on."""
        _guarded(lambda: run_ladder_command(recipe, out, fast=fast, sets=precision_sets(precision, set_), report=report))


def _guarded(fn, *args, **kwargs) -> None:
    from labelrl.ladder.arms import LadderStopped

    try:
        fn(*args, **kwargs)
    except LadderStopped as exc:
        console.print(f"[yellow]ladder stopped[/]: {exc}")
        raise typer.Exit(130)
    except (ValueError, FileNotFoundError) as exc:
        fail(str(exc))
