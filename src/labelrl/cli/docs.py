"""Generate the reference pages (``make docs``); never edit the generated files by hand.

``python -m labelrl.cli.docs`` prints docs/config.md (from the config models);
``python -m labelrl.cli.docs cli`` prints docs/cli.md (every command's ``--help``).
"""

from __future__ import annotations

import sys
from typing import Any, Iterator

from labelrl.cli.options import field_help
from labelrl.train.config import RLConfig, SFTConfig

COMMANDS = {"sft": SFTConfig, "rl": RLConfig}
# The width the CLI reference's help is wrapped at: fixed, so the page is the same on every terminal.
HELP_WIDTH = 100


def render() -> str:
    lines = [
        "# Configuration reference",
        "",
        "Generated from the config models in `src/labelrl/train/config.py` by `make docs`; do not edit.",
        "Every option can be given on the command line (`--group-size 8`) or in a YAML file passed",
        "with `--config FILE` (`group_size: 8`); the command line wins.",
        "",
    ]
    for command, model in COMMANDS.items():
        lines += [f"## `labelrl {command}`", "", (model.__doc__ or "").strip(), "", "| option | help |", "| --- | --- |"]
        for name, field in model.model_fields.items():
            flag = "--" + name.replace("_", "-")
            lines.append(f"| `{flag}` | {field_help(name, field).replace('|', '/')} |")
        lines.append("")
    return "\n".join(lines)


def command_tree() -> Iterator[tuple[list[str], Any, Any]]:
    """Every command of ``labelrl`` with its path (``["data", "show"]``) and a click context,
    groups before their subcommands, in the order ``labelrl --help`` lists them."""
    import typer.main

    from labelrl.cli.main import app

    root = typer.main.get_command(app)

    def walk(command: Any, path: list[str], parent: Any) -> Iterator[tuple[list[str], Any, Any]]:
        ctx = type(command).context_class(
            command, info_name=path[-1] if path else "labelrl", parent=parent,
            terminal_width=HELP_WIDTH, max_content_width=HELP_WIDTH,
        )
        yield path, command, ctx
        if hasattr(command, "list_commands"):
            for sub in command.list_commands(ctx):
                yield from walk(command.get_command(ctx, sub), [*path, sub], ctx)

    yield from walk(root, [], None)


def plain_help(command: Any, ctx: Any) -> str:
    """``--help`` as click prints it without rich's boxes (Typer's rich mode off for the call)."""
    markup = getattr(command, "rich_markup_mode", None)
    command.rich_markup_mode = None
    try:
        return command.get_help(ctx).rstrip()
    finally:
        command.rich_markup_mode = markup


def render_cli() -> str:
    """docs/cli.md: a table of the commands, then each command's ``--help``."""
    tree = list(command_tree())
    lines = [
        "# CLI reference",
        "",
        "Generated from the commands themselves (`labelrl COMMAND --help`, wrapped at "
        f"{HELP_WIDTH} columns) by `make docs`; do not edit.",
        "The options of `sft` and `rl` are also in the [configuration reference](config.md), one",
        "table row each; [Commands](commands.md) says what each command is for, with examples.",
        "",
        "| command | what it does |",
        "| --- | --- |",
    ]
    for path, command, _ in tree[1:]:
        name = " ".join(["labelrl", *path])
        summary = (command.help or "").split("\n\n")[0].replace("|", "/")
        lines.append(f"| [`{name}`](#{'-'.join(['labelrl', *path])}) | {summary} |")
    lines.append("")
    for path, command, ctx in tree:
        name = " ".join(["labelrl", *path])
        lines += [f"## `{name}`", "", "```text", plain_help(command, ctx), "```", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    page = sys.argv[1] if len(sys.argv) > 1 else "config"
    if page not in ("config", "cli"):
        sys.exit(f"unknown page {page!r}: choose config (docs/config.md) or cli (docs/cli.md)")
    print(render() if page == "config" else render_cli(), end="")
