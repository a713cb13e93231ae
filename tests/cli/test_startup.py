"""A fast, tidy command line: importing the CLI loads no heavy library, and every command's
help reads as paragraphs (rich wraps them to the terminal; no line breaks mid-sentence)."""

from __future__ import annotations

import os
import subprocess
import sys

import click
import typer

# Each takes from a tenth of a second (pandas) to several seconds (torch, transformers) to
# import; the commands that need them import them when they run.
HEAVY = ("torch", "transformers", "scipy", "sklearn", "pandas", "matplotlib")


def _imported_modules(code: str) -> set[str]:
    """Top-level modules imported by ``python -X importtime -c code`` (read from its report)."""
    result = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True,
                            timeout=120, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert result.returncode == 0, result.stderr
    names = set()
    for line in result.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    assert "labelrl" in names, result.stderr[-2000:]  # the report was read: labelrl itself is in it
    return names


def test_importing_the_cli_loads_no_heavy_library():
    names = _imported_modules("import labelrl.cli.main")
    assert not names & set(HEAVY), sorted(names & set(HEAVY))


def test_the_check_sees_a_heavy_import_when_there_is_one():
    # The same reading of -X importtime must catch a heavy import, or the test above proves nothing.
    assert "scipy" in _imported_modules("import labelrl.cli.main, labelrl.audit.noise")


def test_help_of_every_command_runs_without_heavy_imports():
    code = (
        "import sys\nfrom typer.testing import CliRunner\nfrom labelrl.cli.main import app\n"
        "runner = CliRunner()\n"
        "for args in ([], *[n.split() for n in sys.argv[1:]]):\n"
        "    result = runner.invoke(app, [*args, '--help'])\n"
        "    assert result.exit_code == 0, (args, result.output)\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in " + repr(HEAVY) + ")\n"
        "assert not heavy, heavy\n"
    )
    commands = list(_commands())  # "data show" too
    result = subprocess.run([sys.executable, "-c", code, *commands], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]


def _commands() -> dict[str, click.Command]:
    from labelrl.cli.main import app

    group = typer.main.get_command(app)
    out = {}
    for name, command in group.commands.items():
        out[name] = command
        for sub, inner in getattr(command, "commands", {}).items():
            out[f"{name} {sub}"] = inner
    return out


def test_command_help_has_no_line_breaks_inside_a_paragraph():
    commands = _commands()
    assert {"sft", "rl", "audit", "ladder", "demo", "eval", "data", "data show"} <= set(commands)
    for name, command in commands.items():
        text = command.help or ""
        assert text.strip(), f"labelrl {name} has no help"
        for paragraph in text.split("\n\n"):
            assert "\n" not in paragraph, f"labelrl {name}: a line break inside {paragraph!r}"


def test_one_line_paragraphs_joins_lines_and_keeps_paragraphs():
    from labelrl.cli.main import one_line_paragraphs

    text = """Run every arm in dependency order on shared
        splits; each is scored once.

        Second paragraph
        here."""
    assert one_line_paragraphs(text) == ("Run every arm in dependency order on shared splits; each is scored once."
                                         "\n\nSecond paragraph here.")
