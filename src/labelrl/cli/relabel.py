"""``labelrl relabel DATA --rubric RUBRIC.md --judge SPEC``: relabel a dataset under a written
rubric, with an adjudicator for unsure items, a self-agreement audit and a resumable journal."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

import typer
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator
from rich.console import Console
from rich.table import Table

from labelrl.audit.judge_types import DEFAULT_API_KEY_ENV, JudgeError, JudgeSpec
from labelrl.cli.options import err_console, fail, format_validation_error

SPEC_HELP = "a local model (anything load_model takes, e.g. tiny-random or a model directory) or an OpenAI-compatible endpoint URL http://HOST:PORT/v1"


class RelabelConfig(BaseModel):
    """Options of ``labelrl relabel``; each description is the option's --help text."""

    data: str = Field(description="A built-in dataset or a .jsonl, .csv or .parquet file to relabel.")
    rubric: Path = Field(description="Text or Markdown file with the labelling rules the judge applies.")
    judge: str = Field(description=f"The judge: {SPEC_HELP}.")
    judge_model: Optional[str] = Field(None, description="Model name to request from an endpoint --judge.")
    adjudicator: Optional[str] = Field(None, description=f"Decides the items the judge is unsure of (a stronger model): {SPEC_HELP}.")
    adjudicator_model: Optional[str] = Field(None, description="Model name to request from an endpoint --adjudicator.")
    min_confidence: float = Field(0.7, description="Items whose judge confidence is below this (or missing) go to the adjudicator.")
    self_agreement_sample: int = Field(50, description="How many random items the judge labels a second time (an independent seeded sample) to measure its self-agreement; 0 skips it.")
    seed: int = Field(0, description="Seed of the self-agreement sample and its second pass.")
    out: Optional[Path] = Field(None, description="Output file (.jsonl or .parquet); never the input. Default: DATA_NAME.relabelled.jsonl beside the input.")
    concurrency: int = Field(4, description="Endpoint requests in flight at once.")
    timeout: float = Field(30.0, description="Seconds an endpoint request may wait for the server before it counts as timed out.")
    retries: int = Field(3, description="Further attempts after a failed endpoint request (exponential backoff with jitter).")
    backoff: float = Field(0.5, description="Seconds before the first retry; doubled for each later one (capped at 8 s).")
    api_key_env: str = Field(DEFAULT_API_KEY_ENV, description="Environment variable holding the endpoint API key (sent as a bearer token; never logged or saved).")
    text_col: list[str] = Field(default_factory=list, description="Text column (repeat for several); default: the built-in's, else 'text'.")
    label_col: Optional[str] = Field(None, description="Label column; default: the built-in's, else 'label'.")
    labels: Optional[str] = Field(None, description="The label set in order, comma-separated, e.g. ham,spam.")
    limit: Optional[int] = Field(None, description="Relabel only the first N rows (a trial run).")
    on_bad_row: Literal["error", "skip"] = Field("error", description="What to do with a malformed row: stop with an error naming it, or leave it out of the output and list it in OUT.skipped_rows.jsonl.")
    delimiter: Optional[str] = Field(None, description="CSV files only: the delimiter (',', ';', tab or pipe); sniffed from the header when omitted.")
    json_path: Optional[Path] = Field(None, description="Also write the summary to this JSON file (it is always saved as OUT.summary.json).")

    @field_validator("min_confidence")
    @classmethod
    def _probability(cls, value: float) -> float:
        if not 0.0 <= value <= 1.0:
            raise ValueError("a confidence lies in [0, 1]")
        return value

    @field_validator("self_agreement_sample", "retries")
    @classmethod
    def _not_negative(cls, value: int) -> int:
        if value < 0:
            raise ValueError("must be 0 or more")
        return value

    @field_validator("concurrency", "limit")
    @classmethod
    def _positive(cls, value: int | None) -> int | None:
        if value is not None and value < 1:
            raise ValueError("must be 1 or more")
        return value

    @model_validator(mode="after")
    def _models_need_specs(self) -> "RelabelConfig":
        if self.adjudicator_model and not self.adjudicator:
            raise ValueError(f"--adjudicator-model {self.adjudicator_model}: there is no --adjudicator; give --adjudicator URL too")
        return self

    def judge_spec(self, role: str) -> JudgeSpec | None:
        spec = self.judge if role == "judge" else self.adjudicator
        if spec is None:
            return None
        return JudgeSpec(
            spec=spec, model=self.judge_model if role == "judge" else self.adjudicator_model,
            api_key_env=self.api_key_env, timeout_s=self.timeout, retries=self.retries,
            concurrency=self.concurrency, backoff_s=self.backoff, flag=f"--{role}",
        )


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
    """Validate everything cheap first (rubric, data, paths, judge specs), then load the judges
    and run; ValueError / JudgeError / OSError for bad input or an unreachable endpoint."""
    from labelrl.audit.judges import load_judge
    from labelrl.audit.relabel import load_items, output_paths, read_rubric, run_relabel
    from labelrl.fileio import atomic_write_json

    rubric = read_rubric(cfg.rubric)
    items = load_items(cfg.data, text_cols=cfg.text_col, label_col=cfg.label_col, labels=cfg.labels, limit=cfg.limit,
                       on_bad_row=cfg.on_bad_row, delimiter=cfg.delimiter)
    paths = output_paths(items, cfg.out)
    specs = {role: cfg.judge_spec(role) for role in ("judge", "adjudicator")}
    for spec in specs.values():
        if spec is not None:
            spec.check()
    judges = {role: load_judge(spec, items.labels, rubric) if spec else None for role, spec in specs.items()}
    summary = run_relabel(
        items, rubric, judges["judge"], judges["adjudicator"], paths,
        min_confidence=cfg.min_confidence, self_agreement_sample=cfg.self_agreement_sample, seed=cfg.seed,
        console=progress_console,
    )
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
        on_bad_row: str = typer.Option(_default("on_bad_row"), "--on-bad-row", help=_help("on_bad_row"), metavar="error|skip"),
        delimiter: Optional[str] = typer.Option(None, "--delimiter", help=_help("delimiter"), show_default=False),
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
