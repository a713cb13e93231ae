"""Build a Typer command from a pydantic config model.

Each config field becomes ``--field-name`` with the field's description as its help, so
the config model is the single source for ``--help`` and docs/config.md. Values come from
``--config FILE.yaml`` first; options given on the command line override them.
"""

from __future__ import annotations

import inspect
import sys
import types
import typing
from pathlib import Path
from typing import Any, Callable, Literal, Optional

import typer
import yaml
from pydantic import BaseModel, ValidationError
from rich.console import Console

err_console = Console(stderr=True)


def fail(message: str, code: int = 2) -> typing.NoReturn:
    """Print one clear error line (no traceback) and exit."""
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _unwrap_optional(annotation: Any) -> Any:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _cli_type(annotation: Any) -> tuple[Any, str | None]:
    """The type Typer parses, and the choices to show in help for Literal fields."""
    annotation = _unwrap_optional(annotation)
    origin = typing.get_origin(annotation)
    if origin is Literal:
        choices = [str(c) for c in typing.get_args(annotation)]
        return str, "|".join(choices)
    if origin in (list, tuple, typing.List):
        inner = typing.get_args(annotation)[0] if typing.get_args(annotation) else str
        return list[_cli_type(inner)[0]], None
    if annotation in (str, int, float, bool, Path):
        return annotation, None
    return str, None


def field_help(name: str, field: Any) -> str:
    """Help text for one field: its description, its choices and its default."""
    text = field.description or ""
    _, choices = _cli_type(field.annotation)
    if choices:
        text += f" One of: {choices}."
    if not field.is_required():
        default = field.get_default(call_default_factory=True)
        if default not in (None, [], ()):
            text += f" [default: {default}]"
    else:
        text += " [required]"
    return text.strip()


def _option_for(name: str, field: Any) -> inspect.Parameter:
    cli_type, choices = _cli_type(field.annotation)
    flag = "--" + name.replace("_", "-")
    decls = [f"{flag}/--no-{name.replace('_', '-')}"] if cli_type is bool else [flag]
    option = typer.Option(
        None,
        *decls,
        help=field_help(name, field),
        show_default=False,
        metavar=choices.upper() if choices else None,
    )
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=Optional[cli_type]
    )


def load_config(model: type[BaseModel], config_file: Path | None, overrides: dict) -> BaseModel:
    """YAML values, then command-line overrides (only the options actually given)."""
    values: dict[str, Any] = {}
    if config_file is not None:
        if not config_file.is_file():
            raise ValueError(f"--config {config_file}: no such file; give the path of a YAML config")
        loaded = yaml.safe_load(config_file.read_text(encoding="utf-8")) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"--config {config_file}: the file must hold a YAML mapping of option: value")
        values.update({k.replace("-", "_"): v for k, v in loaded.items()})
        unknown = sorted(set(values) - set(model.model_fields))
        if unknown:
            known = ", ".join(model.model_fields)
            raise ValueError(f"--config {config_file}: unknown keys {unknown}; known keys: {known}")
    values.update({k: v for k, v in overrides.items() if v is not None})
    return model(**values)


def format_validation_error(error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        msg = item["msg"].removeprefix("Value error, ")
        if not item["loc"]:  # a cross-field check: its message names the values itself
            lines.append(msg)
            continue
        where = "--" + "-".join(str(p) for p in item["loc"]).replace("_", "-")
        value = item.get("input")
        shown = "" if isinstance(value, dict) else f" (got {value!r})"
        lines.append(f"{where}: {msg}{shown}")
    return "; ".join(lines)


def config_command(
    app: typer.Typer,
    name: str,
    model: type[BaseModel],
    run: Callable[[BaseModel], Any],
    *,
    help: str,
) -> None:
    """Register ``name`` on ``app``: one option per field of ``model``, plus ``--config``."""
    params = [
        inspect.Parameter(
            "config",
            inspect.Parameter.KEYWORD_ONLY,
            default=typer.Option(None, "--config", help="YAML file with any of these options; command-line options override it."),
            annotation=Optional[Path],
        )
    ]
    params += [_option_for(n, f) for n, f in model.model_fields.items()]

    def command(**kwargs: Any) -> None:
        config_file = kwargs.pop("config")
        try:
            cfg = load_config(model, config_file, kwargs)
        except ValidationError as exc:
            fail(format_validation_error(exc))
        except ValueError as exc:
            fail(str(exc))
        try:
            run(cfg)
        except (ValueError, FileNotFoundError) as exc:
            fail(str(exc))
        except KeyboardInterrupt:
            err_console.print("interrupted", style="yellow")
            sys.exit(130)

    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__name__ = name.replace("-", "_")
    app.command(name, help=help)(command)
