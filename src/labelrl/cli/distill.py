"""``labelrl distill``: rejection-sampled teacher traces for CoT-SFT; ``labelrl compare``: the
matched-data decomposition of direct SFT vs CoT-SFT (filter effect, objective effect)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from labelrl.audit.judge_types import JudgeError
from labelrl.cli.options import err_console, fail, format_validation_error
from labelrl.distill.run import DistillConfig, run_distill_config


def _rate(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def render_survival(summary: dict, console: Console) -> None:
    table = Table(title="Trace survival (an item survives when a trace matching its label was kept)", title_justify="left")
    for column in ("", "items", "survived", "rate", "mean attempts"):
        table.add_column(column, justify="left" if not column else "right")
    rows = [("overall", summary["overall"])] + [(f"label {k}", v) for k, v in summary["per_label"].items()]
    rows += [(f"confidence {k}", v) for k, v in summary.get("by_confidence", {}).items()]
    for name, c in rows:
        table.add_row(name, str(c["n_items"]), str(c["n_survived"]), _rate(c["survival_rate"]), _rate(c["mean_attempts_used"]))
    console.print(table)
    chars = summary["trace_chars"]
    if chars["n"]:
        console.print(f"kept traces: {chars['n']}, length in characters: median {chars['p50']:.0f}, p90 "
                      f"{chars['p90']:.0f}, max {chars['max']}", highlight=False)
    console.print(f"wrote {summary['files']['traces']} and {summary['files']['summary']}", highlight=False)


def predictions_path(source: Path, split: str) -> Path:
    """A predictions file as given, or a run directory's ``eval/RUN_NAME-SPLIT.parquet`` (where
    ``labelrl eval RUN --split SPLIT`` writes it)."""
    if source.is_dir():
        found = source / "eval" / f"{source.name}-{split}.parquet"
        if not found.is_file():
            raise ValueError(f"{source}: no {found.relative_to(source)}; run `labelrl eval {source} --split {split}` "
                             "first, or give a predictions file")
        return found
    if not source.is_file():
        raise ValueError(f"{source}: no such run directory or predictions file")
    return source


def run_compare_command(runs: list[Path], split: str, names: list[str] | None, n_boot: int, seed: int,
                        json_path: Path | None, console: Console) -> dict:
    from labelrl.distill.compare import ROLES, compare_models
    from labelrl.evaluate.io import read_predictions
    from labelrl.fileio import atomic_write_json

    if len(runs) != 3:
        raise ValueError(f"{len(runs)} runs given: compare takes three, in order: direct SFT on all items, direct SFT "
                         "on the survivors (`labelrl sft --only-ids-from`), CoT-SFT on the survivors")
    names = names or [r.name for r in runs]
    if len(names) != 3:
        raise ValueError(f"--names {','.join(names)}: give three names, one per run")
    preds = [read_predictions(predictions_path(r, split)) for r in runs]
    result = compare_models(*preds, names=names, n_boot=n_boot, seed=seed)
    table = Table(title=f"Balanced accuracy on {result['n']} shared items (95% paired bootstrap)", title_justify="left")
    for column in ("role", "run", "BA", "95% CI"):
        table.add_column(column)
    for role in ROLES:
        m = result["models"][role]
        ci = m["balanced_accuracy_ci"]
        table.add_row(role, m["name"], f"{m['balanced_accuracy']:.3f}", f"{ci[0]:.3f}–{ci[1]:.3f}" if ci else "—")
    console.print(table)
    for key in ("filter_effect", "objective_effect"):
        ci = result[f"{key}_ci"]
        console.print(f"{key.replace('_', ' ')}: {result[key]:+.3f}" + (f" ({ci[0]:+.3f} to {ci[1]:+.3f})" if ci else ""), highlight=False)
    reg = result["regressions"]
    console.print(f"regressions (direct right, CoT wrong): {reg['n']}; by direct confidence: "
                  + ", ".join(f"{b} {v['n_regressed']}/{v['n_direct_right']}" for b, v in reg["by_band"].items()), highlight=False)
    if json_path is not None:
        atomic_write_json(json_path, result)
    return result


def _help(name: str) -> str:
    return DistillConfig.model_fields[name].description or ""


def _opt(name: str, flag: str, default=None):
    return typer.Option(default, flag, help=_help(name), show_default=default is not None)


def register(app: typer.Typer) -> None:
    d = {n: f.default for n, f in DistillConfig.model_fields.items()}

    @app.command("distill", help="Teacher reasoning traces by rejection sampling: the teacher never sees the label; "
                 "only traces whose conclusion matches it are kept. Resumable; every attempt is journaled.")
    def distill(
        data: str = typer.Argument(..., help=_help("data"), metavar="DATA", show_default=False),
        teacher: str = _opt("teacher", "--teacher", ...), teacher_model: Optional[str] = _opt("teacher_model", "--teacher-model"),
        out: Path = _opt("out", "--out", ...), attempts: int = _opt("attempts", "--attempts", d["attempts"]),
        keep: str = _opt("keep", "--keep", d["keep"]), rubric: Optional[Path] = _opt("rubric", "--rubric"),
        limit: Optional[int] = _opt("limit", "--limit"), run_dir: Optional[Path] = _opt("run_dir", "--run-dir"),
        split: str = _opt("split", "--split", d["split"]), split_seed: int = _opt("split_seed", "--split-seed", d["split_seed"]),
        split_ratios: str = _opt("split_ratios", "--split-ratios", d["split_ratios"]),
        max_new_tokens: int = _opt("max_new_tokens", "--max-new-tokens", d["max_new_tokens"]),
        temperature: float = _opt("temperature", "--temperature", d["temperature"]), seed: int = _opt("seed", "--seed", d["seed"]),
        trace_format: str = _opt("trace_format", "--trace-format", d["trace_format"]),
        difficulty: Optional[Path] = _opt("difficulty", "--difficulty"),
        concurrency: int = _opt("concurrency", "--concurrency", d["concurrency"]),
        timeout: float = _opt("timeout", "--timeout", d["timeout"]), retries: int = _opt("retries", "--retries", d["retries"]),
        backoff: float = _opt("backoff", "--backoff", d["backoff"]),
        api_key_env: str = _opt("api_key_env", "--api-key-env", d["api_key_env"]),
        text_col: Optional[list[str]] = _opt("text_col", "--text-col"), label_col: Optional[str] = _opt("label_col", "--label-col"),
        labels: Optional[str] = _opt("labels", "--labels"), json_path: Optional[Path] = _opt("json_path", "--json"),
        on_bad_row: str = _opt("on_bad_row", "--on-bad-row", d["on_bad_row"]),
        delimiter: Optional[str] = _opt("delimiter", "--delimiter"),
        encoding: str = _opt("encoding", "--encoding", d["encoding"]),
        precision: str = typer.Option(d["precision"], "--precision", help=_help("precision") + " One of: auto/fp32/bf16.",
                                      metavar="AUTO|FP32|BF16"),
    ) -> None:
        values = dict(locals())
        values["text_col"] = text_col or []
        try:
            cfg = DistillConfig(**values)
        except ValidationError as exc:
            fail(format_validation_error(exc))
        try:
            render_survival(run_distill_config(cfg), Console())
        except (ValueError, JudgeError, OSError) as exc:
            fail(str(exc))
        except KeyboardInterrupt:
            err_console.print("interrupted: attempts made so far are kept in the journal; re-run the same command to resume")
            raise typer.Exit(130)

    _register_compare(app)


def _register_compare(app: typer.Typer) -> None:
    @app.command("compare", help="Direct SFT on all items vs direct SFT on the distill survivors vs CoT-SFT on them: "
                 "balanced accuracy with intervals, filter and objective effects, per-item regressions.")
    def compare(
        runs: list[Path] = typer.Argument(..., help="Three run directories (or predictions files), in order: direct on all, direct on survivors, CoT on survivors.", metavar="RUN...", show_default=False),
        split: str = typer.Option("val", "--split", help="Split whose predictions to compare (run directories)."),
        names: Optional[str] = typer.Option(None, "--names", help="Comma-separated names of the three runs (default: their file names).", show_default=False),
        n_boot: int = typer.Option(1000, "--n-boot", help="Bootstrap resamples for the intervals (0: none)."),
        seed: int = typer.Option(0, "--seed", help="Bootstrap seed."),
        json_path: Optional[Path] = typer.Option(None, "--json", help="Also write the comparison to this JSON file.", show_default=False),
    ) -> None:
        try:
            run_compare_command(runs, split, [n.strip() for n in names.split(",")] if names else None, n_boot, seed, json_path, Console())
        except (ValueError, OSError) as exc:
            fail(str(exc))
