"""Every `labelrl …` command the README and the hand-written docs pages show is a command that exists:
its subcommand path prints `--help` with exit code 0, and every `--option` it uses is one of that
command's options. A renamed command or option fails here instead of in a reader's terminal."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from labelrl.cli.docs import command_tree
from labelrl.cli.main import app

ROOT = Path(__file__).resolve().parents[1]
GENERATED = {"cli.md", "config.md"}  # rendered from the commands themselves
PAGES = [ROOT / "README.md", *(p for p in sorted((ROOT / "docs").glob("*.md")) if p.name not in GENERATED)]
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
INLINE = re.compile(r"`(labelrl [^`]+)`")


def shown_commands(text: str) -> list[str]:
    """The `labelrl …` command lines of a Markdown text: lines of its code blocks (continuation
    lines joined) and inline code spans that start with `labelrl`."""
    commands = []
    for block in FENCE.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip().removeprefix("$ ")
            if line.startswith("labelrl ") or line.startswith(".venv/bin/labelrl "):
                commands.append(line)
    outside = FENCE.sub("", text)
    commands += [span.replace("\\|", "|") for span in INLINE.findall(outside)]
    return commands


def check(command_line: str, commands: dict[tuple[str, ...], object]) -> tuple[tuple[str, ...], list[str]]:
    """The subcommand path of ``command_line`` and what is wrong with it (nothing: [])."""
    tokens = shlex.split(command_line, comments=True)[1:]
    path: tuple[str, ...] = ()
    while tokens and (*path, tokens[0]) in commands:
        path = (*path, tokens.pop(0))
    command = commands[path]
    if hasattr(command, "list_commands"):
        return path, [f"{command_line!r}: `labelrl {' '.join(path)}` needs a subcommand, got {tokens[:1]}"]
    known = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)} | {"--help"}
    unknown = [t.split("=")[0] for t in tokens if t.startswith("--") and t.split("=")[0] not in known]
    return path, [f"{command_line!r}: `labelrl {' '.join(path)}` has no option {u}" for u in unknown]


@pytest.fixture(scope="module")
def commands():
    return {tuple(path): command for path, command, _ in command_tree()}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_command_shown_parses(page, commands):
    shown = shown_commands(page.read_text(encoding="utf-8"))
    if page.name == "README.md":
        assert len(shown) >= 10, "the README shows fewer commands than it did: is the extraction still working?"
    problems, paths = [], set()
    for line in shown:
        path, wrong = check(line, commands)
        problems += wrong
        paths.add(path)
    assert problems == []
    runner = CliRunner()
    for path in sorted(paths):
        result = runner.invoke(app, [*path, "--help"])
        assert result.exit_code == 0, f"labelrl {' '.join(path)} --help: exit {result.exit_code}\n{result.output}"


def test_the_check_sees_a_wrong_command(commands):
    text = (
        "Run `labelrl audit sms-spam --json a.json` or\n\n```bash\nlabelrl data show sms-spam \\\n"
        "    --no-such-flag 1\nlabelrl data\nlabelrl nosuch sms-spam\nlabelrl rl --model m --steps=3 # --not-an-option\n```\n"
        "`labelrl eval RUN --split val\\|holdout`\n"
    )
    shown = shown_commands(text)
    assert shown == [
        "labelrl data show sms-spam      --no-such-flag 1",
        "labelrl data",
        "labelrl nosuch sms-spam",
        "labelrl rl --model m --steps=3 # --not-an-option",
        "labelrl audit sms-spam --json a.json",
        "labelrl eval RUN --split val|holdout",
    ]
    results = [check(line, commands) for line in shown]
    assert [path for path, _ in results] == [("data", "show"), ("data",), (), ("rl",), ("audit",), ("eval",)]
    assert [len(wrong) for _, wrong in results] == [1, 1, 1, 0, 0, 0]
    assert "has no option --no-such-flag" in results[0][1][0]
    assert "needs a subcommand" in results[1][1][0]
    assert "got ['nosuch']" in results[2][1][0]
