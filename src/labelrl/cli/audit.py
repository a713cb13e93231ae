"""``labelrl audit DATA``: how noisy are the labels, and what accuracy can any model reach?"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal, Optional

import typer
from pydantic import BaseModel, Field, ValidationError, field_validator
from rich.console import Console
from rich.table import Table

from labelrl.cli.options import fail, format_validation_error
from labelrl.data.builtin import BUILTIN_DATASETS
from labelrl.data.options import ENCODING_HELP, valid_encoding

TEXT_WIDTH = 70


class AuditConfig(BaseModel):
    """Options of ``labelrl audit``; each description is the option's --help text."""

    data: str = Field(description=f"A built-in dataset ({', '.join(BUILTIN_DATASETS.names())}) or a .jsonl, .csv or .parquet file.")
    text_col: list[str] = Field(default_factory=list, description="Text column (repeat for several); default: the built-in's, else 'text'.")
    label_col: Optional[str] = Field(None, description="Label column; default: the built-in's, else 'label'.")
    labels: Optional[str] = Field(None, description="The label set in order, comma-separated (lowest grade first for ordinal), e.g. ham,spam.")
    on_bad_row: Literal["error", "skip"] = Field("error", description="What to do with a malformed row: stop with an error naming it, or skip it (the audit notes how many; --json lists them).")
    delimiter: Optional[str] = Field(None, description="CSV files only: the delimiter (',', ';', tab or pipe); sniffed from the header when omitted.")
    encoding: str = Field("utf-8", description=ENCODING_HELP)
    key: Optional[str] = Field(None, description="Columns that identify an item, comma-separated (e.g. passage,driver); default: the text.")
    exact: bool = Field(False, description="Count only byte-identical keys as duplicates (default: compare after case-folding, NFKC, punctuation and whitespace removal).")
    top: int = Field(10, description="How many conflicting and largest duplicate groups to print.")
    n_boot: int = Field(1000, description="Bootstrap resamples (of duplicate groups, or of rated items) for the 95% intervals; 0 skips them.")
    seed: int = Field(0, description="Seed of the bootstrap and split-half resampling.")
    splits: Optional[Path] = Field(None, description="RUN_DIR/splits.json (or RUN_DIR): adds per-split statistics and a test that d is the same in every split.")
    json_path: Optional[Path] = Field(None, description="Write the full audit (every conflicting group included) to this JSON file.")

    _check_encoding = field_validator("encoding")(valid_encoding)

    @field_validator("top", "n_boot")
    @classmethod
    def _not_negative(cls, value: int) -> int:
        if value < 0:
            raise ValueError("must be 0 or more (0 prints no groups / skips the intervals)")
        return value


def _help(name: str) -> str:
    return AuditConfig.model_fields[name].description or ""


def _default(name: str):
    return AuditConfig.model_fields[name].default


def read_splits(path: Path) -> dict[str, list[str]]:
    """Split name → ids from a run directory's splits.json ({"splits": {"train": [ids], ...}})."""
    from labelrl.data.split import SPLIT_NAMES, SPLITS_FILE

    path = Path(path)
    if path.is_dir():
        path = path / SPLITS_FILE
    if not path.is_file():
        raise ValueError(f"--splits {path}: no such file; give RUN_DIR/splits.json as written by the splitter")
    try:
        content = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"--splits {path}: not valid JSON ({exc}); give the splits.json of a run directory") from None
    splits = content.get("splits") if isinstance(content, dict) else None
    if not isinstance(splits, dict) or not all(isinstance(ids, list) for ids in splits.values()):
        raise ValueError(
            f"--splits {path}: expected {{\"splits\": {{\"train\": [ids], \"val\": [ids], ...}}}}; "
            "give the splits.json of a run directory"
        )
    # train, val, holdout first (the file's keys may be sorted alphabetically), then any others.
    names = [n for n in SPLIT_NAMES if n in splits] + [n for n in splits if n not in SPLIT_NAMES]
    return {str(name): [str(i) for i in splits[name]] for name in names}


def _number(block: dict, name: str) -> str:
    value = block.get(name)
    if value is None:
        return "—"
    ci = block.get(f"{name}_ci")
    return f"{value:.3f}" + (f" ({ci[0]:.3f}–{ci[1]:.3f})" if ci else "")


NOISE_ROWS = (
    ("disagreement_rate", "d: pairs disagree"),
    ("flip_rate", "ε: flip rate"),
    ("ceiling", "ceiling = 1 − ε"),
    ("kappa", "κ between copies"),
    ("mean_abs_grade_diff", "mean |Δ grade|"),
)


def _noise_table(report: dict) -> Table:
    scopes = {"overall": report, **report["per_split"]}
    table = Table(title="Duplicates: estimate (95% CI)", title_justify="left")
    table.add_column("")
    for name in scopes:
        table.add_column(name, justify="right")
    table.add_row("rows", *[str(s["n_rows"]) for s in scopes.values()])
    for count in ("n_duplicate_groups", "n_conflicting_groups", "n_pairs", "n_disagreeing_pairs"):
        table.add_row(count.removeprefix("n_").replace("_", " "), *[str(s[count]) for s in scopes.values()])
    for name, title in NOISE_ROWS:
        if name in report:
            table.add_row(title, *[_number(s, name) for s in scopes.values()])
    if report.get("concentrated_pairs"):  # a few groups hold most pairs: show the estimate that counts each once
        for name, title in (("disagreement_rate", "d: each group once"), ("ceiling", "ceiling: each group once")):
            table.add_row(title, *[_number(s.get("group_weighted") or {}, name) for s in scopes.values()])
    return table


def _rater_table(raters: dict) -> Table:
    agg = raters["aggregated"]
    table = Table(title=f"Raters: estimate (95% CI), map {raters['rating_map']}", title_justify="left")
    table.add_column("")
    table.add_column("one rater", justify="right")
    table.add_column(f"mean of ~{agg['raters_per_half_median']:.0f} raters (split-half)", justify="right")
    per_item = raters["raters_per_item"]
    table.add_row("items", str(raters["n_items"]), str(raters["n_items"]))
    table.add_row("raters per item", f"{per_item['min']}–{per_item['max']} (median {per_item['median']:.0f})", "")
    for name, title in NOISE_ROWS[:3]:
        table.add_row(title, _number(raters, name), _number(agg, name))
    return table


def _groups_table(title: str, groups: list[dict], top: int, total: int) -> Table:
    table = Table(title=f"{title} (top {min(top, len(groups))} of {total})", title_justify="left")
    table.add_column("copies", justify="right")
    table.add_column("labels")
    table.add_column("ids")
    table.add_column("text")
    for group in groups[:top]:
        labels = ", ".join(f"{label}×{n}" for label, n in group["label_counts"].items())
        ids = ", ".join(group["ids"][:4]) + (", …" if len(group["ids"]) > 4 else "")
        text = group["texts"][0]
        text = text if len(text) <= TEXT_WIDTH else text[: TEXT_WIDTH - 1] + "…"
        table.add_row(str(len(group["ids"])), labels, ids, text)
    return table


def render(report: dict, console: Console, top: int) -> None:
    """Print an audit report (see labelrl.audit.audit_dataset) as rich tables and notes."""
    counts = ", ".join(f"{label} ({n:,})" for label, n in report["label_counts"].items())  # "1 (136)", not "1 136"
    console.print(
        f"[bold]{report['dataset']}[/]: {report['n_rows']:,} rows, {report['kind']} labels {counts}; "
        f"duplicates by {', '.join(report['key'])} ({report['mode']})"
    )
    if report["n_pairs"] == 0 and not any(s["n_pairs"] for s in report["per_split"].values()):
        console.print("No duplicates found: the labels cannot be checked against copies of the same item.")
    else:
        console.print(_noise_table(report))
    if report.get("uniformity") and report["uniformity"]["p_value"] is not None:
        u = report["uniformity"]
        console.print(f"d the same in every split? chi-square {u['statistic']:.2f}, dof {u['dof']}, p = {u['p_value']:.3g}")
    raters = report.get("per_rater")
    if raters and "skipped" not in raters:
        console.print(_rater_table(raters))
    if report["conflicting_groups"] and top:
        conflicting = report["conflicting_groups"]
        console.print(_groups_table("Conflicting duplicate groups", conflicting, top, len(conflicting)))
    if report["largest_groups"] and top:
        largest = report["largest_groups"]
        console.print(_groups_table("Largest duplicate groups", largest, top, report["n_duplicate_groups"]))
    if report["notes"]:
        console.print("[bold]Notes[/]")
        for note in report["notes"]:
            console.print(f"• {note}", highlight=False)


def run_audit(cfg: AuditConfig, console: Console) -> dict:
    """Load, audit, print, and write --json; ValueError for bad input."""
    from labelrl.audit import audit_dataset
    from labelrl.data import load_dataset
    from labelrl.fileio import atomic_write_json

    dataset = load_dataset(
        cfg.data, text_cols=cfg.text_col or None, label_col=cfg.label_col, labels=cfg.labels,
        on_bad_row=cfg.on_bad_row, delimiter=cfg.delimiter, encoding=cfg.encoding,
    )
    splits = read_splits(cfg.splits) if cfg.splits is not None else None
    report = audit_dataset(
        dataset, splits=splits, key=cfg.key, normalise=not cfg.exact,
        n_boot=cfg.n_boot, seed=cfg.seed, top=cfg.top,
    )
    render(report, console, cfg.top)
    if dataset.skipped_rows:  # --on-bad-row skip: said and kept, never silent
        first = dataset.skipped_rows[0]
        console.print(f"skipped {len(dataset.skipped_rows)} bad rows (first: row {first['row']}: {first['reason']})"
                      + ("; --json lists them" if cfg.json_path is None else f"; listed in {cfg.json_path}"), highlight=False)
        report["skipped_rows"] = list(dataset.skipped_rows)
    if cfg.json_path is not None:
        atomic_write_json(cfg.json_path, report)
        console.print(f"wrote {cfg.json_path}")
    return report


def register(app: typer.Typer) -> None:
    @app.command(
        "audit",
        help="Estimate label noise from duplicates and raters: flip rate ε, the accuracy ceiling 1 − ε, κ, per split.",
    )
    def audit(
        data: str = typer.Argument(..., help=_help("data"), show_default=False, metavar="DATA"),
        text_col: Optional[list[str]] = typer.Option(None, "--text-col", help=_help("text_col"), show_default=False),
        label_col: Optional[str] = typer.Option(None, "--label-col", help=_help("label_col"), show_default=False),
        labels: Optional[str] = typer.Option(None, "--labels", help=_help("labels"), show_default=False),
        on_bad_row: str = typer.Option(_default("on_bad_row"), "--on-bad-row", help=_help("on_bad_row"), metavar="error|skip"),
        delimiter: Optional[str] = typer.Option(None, "--delimiter", help=_help("delimiter"), show_default=False),
        encoding: str = typer.Option(_default("encoding"), "--encoding", help=_help("encoding")),
        key: Optional[str] = typer.Option(None, "--key", help=_help("key"), show_default=False),
        exact: bool = typer.Option(_default("exact"), "--exact", help=_help("exact")),
        top: int = typer.Option(_default("top"), "--top", help=_help("top")),
        n_boot: int = typer.Option(_default("n_boot"), "--n-boot", help=_help("n_boot")),
        seed: int = typer.Option(_default("seed"), "--seed", help=_help("seed")),
        splits: Optional[Path] = typer.Option(None, "--splits", help=_help("splits"), show_default=False),
        json_path: Optional[Path] = typer.Option(None, "--json", help=_help("json_path"), show_default=False),
    ) -> None:
        try:
            cfg = AuditConfig(
                data=data, text_col=text_col or [], label_col=label_col, labels=labels, key=key,
                on_bad_row=on_bad_row, delimiter=delimiter, encoding=encoding,
                exact=exact, top=top, n_boot=n_boot, seed=seed, splits=splits, json_path=json_path,
            )
        except ValidationError as exc:
            fail(format_validation_error(exc))
        try:
            run_audit(cfg, Console())
        except (ValueError, OSError) as exc:
            fail(str(exc))
