"""``labelrl demo``: the built-in ``demo`` recipe through the ladder, then the report.

Binary (sms-spam): audit, direct SFT, GRPO from SFT, threshold sweep, holdout once.
Ordinal (vader-movies, 5 grades, partial credit): direct SFT, GRPO and CoRPO from it, scored
in domain and out of domain on vader-tweets. ``--fast`` runs the same recipe on tiny-random.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from labelrl.cli.ladder import FAST_HELP, PRECISION_OPTION_HELP, SET_HELP, _guarded, precision_sets, run_ladder_command


def register(app: typer.Typer) -> None:
    @app.command("demo")
    def demo(
        out: Optional[Path] = typer.Option(None, "--out", help="Run directory (default runs/demo, or runs/demo-fast with --fast). Re-running into it skips finished arms."),
        fast: bool = typer.Option(False, "--fast", help=FAST_HELP + " Under 2 minutes."),
        set_: list[str] = typer.Option([], "--set", help=SET_HELP + " Scale up with e.g. --set tasks.spam.limit=4000 --set defaults.rl.steps=100."),
        precision: Optional[str] = typer.Option(None, "--precision", help=PRECISION_OPTION_HELP, metavar="AUTO|FP32|BF16"),
    ) -> None:
        """Run the demo recipe (recipes/demo.yaml): does RL on the labels beat direct SFT? Binary sms-spam
        (SFT, GRPO, sweep) and ordinal vader-movies (SFT, GRPO vs CoRPO, out of domain on vader-tweets),
        each final model scored once on the holdout, then a report with every figure."""
        _guarded(lambda: run_ladder_command("demo", out, fast=fast, sets=precision_sets(precision, set_)))
