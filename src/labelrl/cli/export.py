"""``labelrl export RUN_DIR --merged OUT``: a trained model as a plain Hugging Face directory.

The result loads with ``AutoModelForCausalLM.from_pretrained(OUT)`` and
``AutoTokenizer.from_pretrained(OUT)`` where labelrl (and peft) are not installed: a LoRA
run's adapter is folded into its base weights (``W + B·A·α/r``, peft's ``merge_and_unload``)
and saved as safetensors with the tokenizer; a full-weight run's model directory is copied
file for file.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import typer
from pydantic import BaseModel, Field, ValidationError
from rich.console import Console

from labelrl.cli.options import fail, format_validation_error
from labelrl.fileio import atomic_write_dir

MODEL_SUBDIR = "model"  # where labelrl sft / rl save the trained model inside a run directory


class ExportConfig(BaseModel):
    """Options of ``labelrl export``; each description is the option's --help text."""

    run_dir: Path = Field(description="A run directory (its trained model is RUN_DIR/model) or a saved model directory.")
    merged: Path = Field(description="Output directory for the standard Hugging Face model (LoRA merged into the weights).")
    force: bool = Field(False, description="Replace OUT if it already exists.")


@dataclass(frozen=True)
class ExportResult:
    """What ``export_merged`` wrote: ``kind`` is 'lora' (merged) or 'full' (copied)."""

    source: Path
    out: Path
    kind: Literal["lora", "full"]


def find_model_dir(run_dir: Path) -> Path:
    """The saved model of a run: ``RUN_DIR/model``, or RUN_DIR itself if it is a model directory."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ValueError(f"run_dir={str(run_dir)!r} is not a directory; pass the --out directory of a labelrl sft or rl run")
    for candidate in (run_dir / MODEL_SUBDIR, run_dir):
        if (candidate / "adapter_config.json").is_file() or (candidate / "config.json").is_file():
            return candidate
    raise ValueError(
        f"run_dir={str(run_dir)!r} holds no saved model (no {MODEL_SUBDIR}/config.json or adapter_config.json); "
        "export a finished run, or pass the model directory itself"
    )


def export_merged(run_dir: Path, out: Path, *, force: bool = False) -> ExportResult:
    """Write the run's model to ``out`` as a standard HF directory; see the module docstring.

    Raises ValueError when the run has no saved model, when ``out`` is the model directory
    itself, or when ``out`` exists and ``force`` is False. ``out`` is written atomically.
    """
    source = find_model_dir(run_dir)
    out = Path(out)
    if out.resolve() == source.resolve() or source.resolve() in out.resolve().parents:
        raise ValueError(f"--merged {out} lies inside the model directory {source}; choose a directory outside it")
    if out.exists() and not force:
        raise ValueError(f"--merged {out} already exists; choose a new directory or pass --force to replace it")
    if (source / "adapter_config.json").is_file():
        _merge_adapter(source, out)
        return ExportResult(source, out, "lora")
    atomic_write_dir(out, lambda tmp: shutil.copytree(source, tmp, dirs_exist_ok=True))
    return ExportResult(source, out, "full")


def _merge_adapter(source: Path, out: Path) -> None:
    from labelrl.models import load_model  # loads torch and transformers: only when needed

    model, tokenizer = load_model(source)
    merged = model.merge_and_unload()

    def fill(tmp: Path) -> None:
        merged.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))

    atomic_write_dir(out, fill)


def register(app: typer.Typer) -> None:
    fields = ExportConfig.model_fields

    @app.command(
        "export",
        help="Export a run's model as a standard Hugging Face directory (LoRA merged) that loads with "
        "AutoModelForCausalLM.from_pretrained, without labelrl.",
    )
    def export(
        run_dir: Path = typer.Argument(..., help=fields["run_dir"].description, show_default=False, metavar="RUN_DIR"),
        merged: Path = typer.Option(..., "--merged", help=fields["merged"].description, show_default=False, metavar="OUT"),
        force: bool = typer.Option(False, "--force", help=fields["force"].description),
    ) -> None:
        try:
            config = ExportConfig(run_dir=run_dir, merged=merged, force=force)
            result = export_merged(config.run_dir, config.merged, force=config.force)
        except ValidationError as error:
            fail(format_validation_error(error))
        except (ValueError, FileNotFoundError) as error:  # no saved model, OUT taken, base model missing
            fail(str(error))
        how = "LoRA merged into the base weights" if result.kind == "lora" else "full weights copied"
        Console().print(f"exported {result.source} → {result.out} ({how})", highlight=False, soft_wrap=True)
