"""``labelrl data show``: what a dataset holds, before any model sees it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from labelrl.cli.options import fail
from labelrl.data.builtin import builtin_help
from labelrl.data.options import ENCODING_HELP

SHOWN_SKIPPED = 10


def _table(summary: dict) -> Table:
    table = Table(title=f"{summary['name']}  ({summary['source']})", show_header=True, header_style="bold")
    table.add_column("quantity")
    table.add_column("value", justify="right")
    table.add_column("share", justify="right")
    table.add_row("rows", str(summary["n_rows"]), "")
    positive = f" (positive: {summary['positive']})" if summary["positive"] else ""
    table.add_row("labels", f"{summary['kind']}{positive}", "")
    for label, count in summary["label_counts"].items():
        table.add_row(f"  label {label}", str(count), f"{summary['label_shares'][label]:.1%}")
    for key, title in [
        ("exact_duplicate", "exact duplicate groups (rows)"),
        ("normalised_duplicate", "normalised duplicate groups (rows)"),
    ]:
        table.add_row(title, f"{summary[key + '_groups']} ({summary[key + '_rows']})", "")
    table.add_row("groups with conflicting labels (rows)",
                  f"{summary['conflicting_groups']} ({summary['conflicting_rows']})", "")
    lengths = summary["text_length_chars"]
    table.add_row("text length p10 / p50 / p90 / max (chars)",
                  f"{lengths['p10']:.0f} / {lengths['p50']:.0f} / {lengths['p90']:.0f} / {lengths['max']}", "")
    table.add_row("skipped rows", str(summary["n_skipped"]), "")
    return table


def _skipped_table(rows: list[dict]) -> Table:
    table = Table(title=f"skipped rows (first {min(len(rows), SHOWN_SKIPPED)} of {len(rows)})", header_style="bold")
    for name in ("row", "column", "value", "reason"):
        table.add_column(name)
    for r in rows[:SHOWN_SKIPPED]:
        table.add_row(str(r["row"]), str(r["column"] or ""), repr(r["value"])[:60], r["reason"])
    return table


def show(
    source: Annotated[str, typer.Argument(metavar="NAME_OR_PATH", help=(
        "Built-in dataset name (sms-spam, vader-tweets, vader-movies), or a JSONL/CSV/Parquet "
        "file, or a directory written by datasets.Dataset.save_to_disk."))],
    text_col: Annotated[Optional[list[str]], typer.Option("--text-col", metavar="NAME", help=(
        "Column holding the item text; repeat for several (joined as 'col: value' lines). "
        "Default: the built-in's, else a column named 'text'."))] = None,
    label_col: Annotated[Optional[str], typer.Option("--label-col", metavar="NAME", help=(
        "Column holding the label. Default: the built-in's, else a column named 'label'. "
        "vader-* also offer 'polarity' (binary)."))] = None,
    labels: Annotated[Optional[str], typer.Option("--labels", metavar="A,B,C", help=(
        "Declared label set, comma-separated, lowest grade first for ordinal labels "
        "(e.g. 'ham,spam'). Rows with other labels are bad rows. Default: inferred."))] = None,
    kind: Annotated[Optional[str], typer.Option("--kind", metavar="binary|categorical|ordinal", help=(
        "Label kind. Default: inferred (2 labels: binary; numeric labels or a column of ordered categories: ordinal; else categorical)."))] = None,
    positive: Annotated[Optional[str], typer.Option("--positive", metavar="LABEL", help=(
        "Positive label of a binary task. Default: the built-in's, else the second label."))] = None,
    id_col: Annotated[Optional[str], typer.Option("--id-col", metavar="NAME", help=(
        "Column holding a unique id per row. Default: the built-in's, else the row number."))] = None,
    on_bad_row: Annotated[str, typer.Option("--on-bad-row", metavar="error|skip", help=(
        "What to do with a malformed row: 'error' stops naming it; 'skip' skips it and lists it."))] = "error",
    delimiter: Annotated[Optional[str], typer.Option("--delimiter", metavar="CHAR", help=(
        "CSV files only: the delimiter (',', ';', tab or pipe). Default: sniffed from the header."))] = None,
    encoding: Annotated[str, typer.Option("--encoding", metavar="CODEC", help=ENCODING_HELP)] = "utf-8",
    json_out: Annotated[Optional[Path], typer.Option("--json", metavar="OUT", help=(
        "Also write the numbers (n_rows, label_counts, duplicates, lengths, skipped rows) to this JSON file."))] = None,
) -> None:
    """Rows, label counts, duplicate groups, text lengths and skipped rows of a dataset."""
    from labelrl.data.load import load_dataset
    from labelrl.data.split import label_notes, summarize  # numpy: imported only when the command runs
    from labelrl.fileio import atomic_write_json

    try:
        dataset = load_dataset(
            source, text_cols=text_col, label_col=label_col, labels=labels, kind=kind,
            positive=positive, id_col=id_col, on_bad_row=on_bad_row, delimiter=delimiter,
            encoding=encoding,
        )
        summary = summarize(dataset)
        if json_out is not None:
            atomic_write_json(json_out, summary)
    except ValueError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"{exc.filename or source}: {exc.strerror or exc}; check the path and its permissions")
    console = Console()
    console.print(_table(summary))
    for note in label_notes(dataset, declared=bool(labels)):
        console.print(note, highlight=False)
    if summary["skipped_rows"]:
        console.print(_skipped_table(summary["skipped_rows"]))
    if json_out is not None:
        console.print(f"wrote {json_out}")


def register(app: typer.Typer) -> None:
    """Add the ``data`` command group to ``app``."""
    data_app = typer.Typer(
        help=f"Inspect labelled datasets. Built-ins: {builtin_help()}.",
        no_args_is_help=True,
    )
    data_app.command("show")(show)
    app.add_typer(data_app, name="data")
