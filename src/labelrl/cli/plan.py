"""``labelrl plan RUN_DIR --delta 0.03``: the holdout items and seeds a difference would need.

Reads each task's ``analysis/paired.json`` (no model is loaded) and, per comparison on its
tested metric, prints the smallest difference it could detect now and the items needed to
detect ``--delta`` at 1, 3, 5 and 10 seeds (``labelrl.evaluate.plan``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from rich.console import Console
from rich.table import Table

from labelrl.cli.options import fail, format_validation_error


class PlanConfig(BaseModel):
    """Options of ``labelrl plan``; each description is the option's --help text."""

    model_config = ConfigDict(extra="forbid")

    run_dir: Path = Field(description="A finished ladder run directory (the --out of `labelrl ladder`, holding ladder.json).")
    delta: float = Field(0.03, gt=0, lt=1, description="The difference to detect (balanced accuracy, or ROC-AUC for the ranking), e.g. 0.03.")
    seeds: list[int] = Field([1, 3, 5, 10], description="Numbers of seeds to plan for, comma-separated.")
    kinds: Optional[list[str]] = Field(None, description="Only these comparison kinds (vs_sft, vs_threshold, ablation, …; default: all).")
    json_path: Optional[Path] = Field(None, description="Also write the plan as JSON to this file.")

    @field_validator("seeds", mode="before")
    @classmethod
    def _seeds(cls, value):
        if isinstance(value, str):
            try:
                value = [int(v) for v in value.split(",") if v.strip()]
            except ValueError:
                raise ValueError(f"--seeds {value!r}: give whole numbers separated by commas, e.g. 1,3,5,10") from None
        if not value or any(v < 1 for v in value):
            raise ValueError(f"--seeds {value}: give at least one number of seeds, each 1 or more, e.g. 1,3,5,10")
        return value


def run_plan(cfg: PlanConfig, console: Console) -> dict:
    """Every task's plan (module docstring), printed as one table per task; ValueError when RUN_DIR
    is not a finished ladder run."""
    from labelrl.evaluate.plan import plan_comparison

    state_file = cfg.run_dir / "ladder.json"
    if not state_file.is_file():
        raise ValueError(f"{cfg.run_dir}: no ladder.json, so not a ladder run directory; give the --out of `labelrl ladder`")
    state = json.loads(state_file.read_text(encoding="utf-8"))
    out: dict = {"delta": cfg.delta, "tasks": {}}
    for task in state.get("task_order") or list(state.get("tasks") or {}):
        path = cfg.run_dir / task / "analysis" / "paired.json"
        if not path.is_file():
            continue
        comparisons = [c for c in json.loads(path.read_text(encoding="utf-8"))
                       if "result" in c and (cfg.kinds is None or c.get("kind") in cfg.kinds)]
        plans = [plan_comparison(c, cfg.delta, tuple(cfg.seeds)) for c in comparisons if c["result"].get("family")]
        out["tasks"][task] = plans
        table = Table(title=f"{task}: items needed to detect |Δ| = {cfg.delta:g} (80% power, each comparison's Holm level)")
        for column in ("comparison", "set", "now: items × seeds", "could detect now", *[f"{s} seed(s)" for s in cfg.seeds]):
            table.add_column(column)
        for p in plans:
            needed = [("—" if v is None else f"{v:,}") + ("" if p["seeds_measured"] or s == 1 else " (≥)")
                      for s, v in p["items_needed"].items()]
            table.add_row(f"{p['b']} vs {p['a']} ({p['kind']}, {p['metric']})", p["split"], f"{p['n']} × {p['seeds']}",
                          f"{p['detectable_now']:.3f}", *needed)
        console.print(table)
    console.print("—: no number of items suffices at that many seeds (training noise alone is larger); (≥): measured with "
                  "one seed, so the seeds' part of the spread is unknown and the figure is a lower bound", highlight=False)
    if cfg.json_path:
        cfg.json_path.write_text(json.dumps(out, indent=2), encoding="utf-8")
    return out


def register(app: typer.Typer) -> None:
    fields = PlanConfig.model_fields

    @app.command("plan", help="From a finished ladder run's paired comparisons: the smallest difference each could "
                 "detect, and how many holdout items and seeds a chosen difference (--delta) would need.")
    def plan(
        run_dir: Path = typer.Argument(..., help=fields["run_dir"].description, show_default=False, metavar="RUN_DIR"),
        delta: float = typer.Option(0.03, "--delta", help=fields["delta"].description),
        seeds: str = typer.Option("1,3,5,10", "--seeds", help=fields["seeds"].description),
        kinds: Optional[str] = typer.Option(None, "--kinds", help=fields["kinds"].description, show_default=False),
        json_path: Optional[Path] = typer.Option(None, "--json", help=fields["json_path"].description, show_default=False),
    ) -> None:
        try:
            cfg = PlanConfig(run_dir=run_dir, delta=delta, seeds=seeds, json_path=json_path,
                             kinds=[k.strip() for k in kinds.split(",")] if kinds else None)
            run_plan(cfg, Console())
        except ValidationError as error:
            fail(format_validation_error(error))
        except (ValueError, OSError) as error:
            fail(str(error))
