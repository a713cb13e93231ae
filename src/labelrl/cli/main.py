"""The ``labelrl`` command line: one module per command, each exposing ``register(app)``."""

from __future__ import annotations

import importlib
import inspect
import re
import warnings

import typer

# peft asks transformers 5 for a renamed attribute on every adapter load; the message is for
# peft's authors, not for people running labelrl.
warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)

app = typer.Typer(
    name="labelrl",
    help=(
        "Fine-tune small language models on labelled data with SFT and group-relative RL "
        "(GRPO, Dr. GRPO, DAPO, GSPO, RLOO, CoRPO), and measure honestly whether RL helped."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)

# Command modules under labelrl.cli; each defines register(app).
COMMAND_MODULES = ("data", "train", "audit", "relabel", "ladder", "demo", "evaluate", "export", "distill", "report",
                   "plan", "rescore")



def one_line_paragraphs(text: str | None) -> str | None:
    """Help text with each paragraph on one line: rich re-wraps it to the terminal, while a
    docstring's own line breaks would show up mid-sentence ("on shared / splits")."""
    if not text:
        return text
    paragraphs = re.split(r"\n\s*\n", inspect.cleandoc(text))
    return "\n\n".join(" ".join(line.strip() for line in p.splitlines() if line.strip()) for p in paragraphs)


def _unwrap_help(typer_app: typer.Typer) -> None:
    """Give every command (and command group) of ``typer_app`` one-line paragraphs of help."""
    for info in typer_app.registered_commands:
        info.help = one_line_paragraphs(info.help or inspect.getdoc(info.callback))
    for group in typer_app.registered_groups:
        inner = group.typer_instance
        inner.info.help = one_line_paragraphs(group.help or inner.info.help)
        group.help = inner.info.help
        _unwrap_help(inner)


# The command modules import only typer, rich and pydantic at module level; torch,
# transformers, scipy, scikit-learn, pandas and matplotlib are imported inside the commands
# that need them, so `labelrl --help` starts fast (tests/cli/test_startup.py checks this).
for _name in COMMAND_MODULES:
    importlib.import_module(f"labelrl.cli.{_name}").register(app)
_unwrap_help(app)


def main() -> None:  # pragma: no cover - thin entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
