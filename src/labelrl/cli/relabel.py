"""``labelrl relabel DATA --rubric RUBRIC.md --judge SPEC``: relabel a dataset under a written
rubric, with an adjudicator for unsure items, a self-agreement audit and a resumable journal."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from labelrl.audit.judge_types import JudgeError
from labelrl.audit.relabel_run import RelabelConfig, run_relabel_config
from labelrl.cli.options import err_console, fail, format_validation_error

def _help(name: str) -> str:
    return RelabelConfig.model_fields[name].description or ""


def _default(name: str):
    return RelabelConfig.model_fields[name].default


def _rate(value: float | None, ci: list[float] | None = None) -> str:
    if value is None:
        return "—"
    return f"{value:.3f}" + (f" ({ci[0]:.3f}–{ci[1]:.3f})" if ci else "")


def render(summary: dict, console: Console) -> None:
    """Print a relabel summary (see labelrl.audit.relabel.summarise)."""
    status = summary["judge_status"]
    console.print(
        f"[bold]{summary['dataset']}[/]: {summary['n_items']} items relabelled by {summary['judge']}; "
        f"judge replies ok {status['ok']}, no confidence {status['no_confidence']}, unparseable {status['unparseable']}",
        highlight=False,
    )
    console.print(
        f"below --min-confidence {summary['min_confidence']:g}: {summary['n_low_confidence']}; adjudicated "
        f"{summary['n_adjudicated']}; final label differs from the original for {summary['n_changed']} "
        f"({_rate(summary['changed_rate'])})", highlight=False,
    )
    agreement = summary["agreement_with_original"]
    table = Table(title="Agreement with the original labels", title_justify="left")
    table.add_column("")
    table.add_column("judge", justify="right")
    table.add_column("final", justify="right")
    table.add_row("items compared", str(agreement["judge"]["n"]), str(agreement["final"]["n"]))
    table.add_row("agreement", _rate(agreement["judge"]["agreement"]), _rate(agreement["final"]["agreement"]))
    table.add_row("Cohen's κ", _rate(agreement["judge"]["kappa"]), _rate(agreement["final"]["kappa"]))
    for name, block in agreement["judge"]["per_class"].items():
        final = agreement["final"]["per_class"][name]
        table.add_row(f"originally {name} (n={block['n']})", _rate(block["agreement"]), _rate(final["agreement"]))
    console.print(table)
    sa = summary["self_agreement"]
    if sa["n_sample"]:
        console.print(
            f"Self-agreement (95% CI) on {sa['n_compared']} of {sa['n_sample']} items: {_rate(sa['agreement'], sa['agreement_ci'])}"
            + (f", κ {_rate(sa['kappa'], sa['kappa_ci'])}, judge flip rate ε {_rate(sa['flip_rate'], sa['flip_rate_ci'])}"
               if sa["agreement"] is not None else ""), highlight=False,
        )
    for note in summary["notes"]:
        console.print(f"• {note}", highlight=False)
    console.print(f"wrote {summary['files']['out']} and {summary['files']['summary']}", highlight=False)


def run_relabel_command(cfg: RelabelConfig, console: Console, progress_console: Console | None) -> dict:
    """Relabel (``labelrl.audit.relabel_run``), print the summary, write ``--json``."""
    from labelrl.fileio import atomic_write_json

    summary = run_relabel_config(cfg, progress_console)
    render(summary, console)
    if cfg.json_path is not None:
        atomic_write_json(cfg.json_path, summary)
        console.print(f"wrote {cfg.json_path}", highlight=False)
    return summary


def register(app: typer.Typer) -> None:
    @app.command(
        "relabel",
        help="Relabel a dataset with a judge applying a written rubric; unsure items go to an adjudicator. "
        "Writes a new file with provenance columns, audits the judge's self-agreement, resumes where it stopped.",
    )
    def relabel(
        data: str = typer.Argument(..., help=_help("data"), show_default=False, metavar="DATA"),
        rubric: Path = typer.Option(..., "--rubric", help=_help("rubric"), show_default=False),
        judge: str = typer.Option(..., "--judge", help=_help("judge"), show_default=False),
        judge_model: Optional[str] = typer.Option(None, "--judge-model", help=_help("judge_model"), show_default=False),
        adjudicator: Optional[str] = typer.Option(None, "--adjudicator", help=_help("adjudicator"), show_default=False),
        adjudicator_model: Optional[str] = typer.Option(None, "--adjudicator-model", help=_help("adjudicator_model"), show_default=False),
        min_confidence: float = typer.Option(_default("min_confidence"), "--min-confidence", help=_help("min_confidence")),
        self_agreement_sample: int = typer.Option(_default("self_agreement_sample"), "--self-agreement-sample", help=_help("self_agreement_sample")),
        seed: int = typer.Option(_default("seed"), "--seed", help=_help("seed")),
        out: Optional[Path] = typer.Option(None, "--out", help=_help("out"), show_default=False),
        concurrency: int = typer.Option(_default("concurrency"), "--concurrency", help=_help("concurrency")),
        timeout: float = typer.Option(_default("timeout"), "--timeout", help=_help("timeout")),
        retries: int = typer.Option(_default("retries"), "--retries", help=_help("retries")),
        backoff: float = typer.Option(_default("backoff"), "--backoff", help=_help("backoff")),
        api_key_env: str = typer.Option(_default("api_key_env"), "--api-key-env", help=_help("api_key_env")),
        text_col: Optional[list[str]] = typer.Option(None, "--text-col", help=_help("text_col"), show_default=False),
        label_col: Optional[str] = typer.Option(None, "--label-col", help=_help("label_col"), show_default=False),
        labels: Optional[str] = typer.Option(None, "--labels", help=_help("labels"), show_default=False),
        limit: Optional[int] = typer.Option(None, "--limit", help=_help("limit"), show_default=False),
        only_ids: Optional[Path] = typer.Option(None, "--only-ids", help=_help("only_ids"), show_default=False),
        on_bad_row: str = typer.Option(_default("on_bad_row"), "--on-bad-row", help=_help("on_bad_row"), metavar="error|skip"),
        delimiter: Optional[str] = typer.Option(None, "--delimiter", help=_help("delimiter"), show_default=False),
        encoding: str = typer.Option(_default("encoding"), "--encoding", help=_help("encoding")),
        json_path: Optional[Path] = typer.Option(None, "--json", help=_help("json_path"), show_default=False),
    ) -> None:
        values = dict(locals())
        values["text_col"] = text_col or []
        try:
            cfg = RelabelConfig(**values)
        except ValidationError as exc:
            fail(format_validation_error(exc))
        try:
            run_relabel_command(cfg, Console(), Console(stderr=True))
        except (ValueError, JudgeError, OSError) as exc:
            fail(str(exc))
        except KeyboardInterrupt:
            err_console.print("interrupted: answers received so far are kept in the journal; re-run the same command to resume")
            raise typer.Exit(130)
