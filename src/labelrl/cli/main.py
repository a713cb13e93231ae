"""The ``labelrl`` command line: one module per command, each exposing ``register(app)``."""

from __future__ import annotations

import importlib
import warnings

import typer

# peft asks transformers 5 for a renamed attribute on every adapter load; the message is for
# peft's authors, not for people running labelrl.
warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)

app = typer.Typer(
    name="labelrl",
    help=(
        "Fine-tune small language models on labelled data with SFT and group-relative RL "
        "(GRPO, Dr. GRPO, DAPO, RLOO, CoRPO), and measure honestly whether RL helped."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)

# Command modules under labelrl.cli; each defines register(app).
COMMAND_MODULES = ("data", "train", "audit", "relabel", "ladder", "demo", "evaluate", "export", "distill", "report",
                   "rescore")

for _name in COMMAND_MODULES:
    importlib.import_module(f"labelrl.cli.{_name}").register(app)


def main() -> None:  # pragma: no cover - thin entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
