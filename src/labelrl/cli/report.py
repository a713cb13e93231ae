"""``labelrl report RUN_DIR [--out DIR] [--explain]``: the ladder run as report.html and report.md.

Reads the run's files only (no model is loaded, torch is not imported): see
``labelrl.report`` for the sections. ``--explain`` first prints each task's answer sentence and
grid with the verdict's sentences behind its cells (the ladder's console shows the grid only).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from rich.console import Console

from labelrl.cli.options import fail, format_validation_error


class ReportConfig(BaseModel):
    """Options of ``labelrl report``; each description is the option's --help text."""

    model_config = ConfigDict(extra="forbid")

    run_dir: Path = Field(description="A ladder run directory (the --out of `labelrl ladder`, holding ladder.json).")
    out: Optional[Path] = Field(None, description="Directory for report.html, report.md and figures/ (default: RUN_DIR/report).")
    explain: bool = Field(False, description="Print each task's verdict grid and the sentences behind its cells (Δ, interval, items, seeds that agree, what it could detect) before building the report.")


def run_report(cfg: ReportConfig, console: Console) -> dict:
    """Build the report and print one summary line; ValueError when RUN_DIR is not a ladder run."""
    from labelrl.report import build_report

    if cfg.explain:
        import json

        from labelrl.cli.ladder import print_verdicts

        path = Path(cfg.run_dir) / "ladder.json"
        if not path.is_file():
            raise ValueError(f"{cfg.run_dir}: no ladder.json; give the --out directory of `labelrl ladder` or `labelrl demo`")
        print_verdicts(json.loads(path.read_text(encoding="utf-8")), explain=True, out=console)
    result = build_report(cfg.run_dir, cfg.out)
    arms = [a for t in result.run.tasks for a in t.arms]
    failed = sum(a.status == "failed" for a in arms)
    console.print(
        f"[bold]report[/]: {len(result.run.tasks)} task(s), {len(arms)} arm(s)"
        + (f" ([red]{failed} failed[/])" if failed else "")
        + f", {len(result.figures)} figure(s) → {result.html} and {result.markdown}",
        highlight=False, soft_wrap=True,
    )
    return {"html": str(result.html), "markdown": str(result.markdown), "figures": [str(p) for p in result.figures]}


def register(app: typer.Typer) -> None:
    fields = ReportConfig.model_fields

    @app.command("report", help="Build report.html (self-contained) and report.md from a ladder run directory's "
                 "files: comparison table, training curves, failure mechanisms, ROC and routing, distillation.")
    def report(
        run_dir: Path = typer.Argument(..., help=fields["run_dir"].description, show_default=False, metavar="RUN_DIR"),
        out: Optional[Path] = typer.Option(None, "--out", help=fields["out"].description, show_default=False, metavar="DIR"),
        explain: bool = typer.Option(False, "--explain", help=fields["explain"].description),
    ) -> None:
        try:
            run_report(ReportConfig(run_dir=run_dir, out=out, explain=explain), Console())
        except ValidationError as error:
            fail(format_validation_error(error))
        except (ValueError, OSError) as error:
            fail(str(error))
