"""``labelrl eval | sweep | route | ledger``: evaluation from a model, then analyses from files."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from labelrl.cli.options import fail, format_validation_error
from labelrl.evaluate.run import EvalConfig, beside, run_eval

METRIC_ROWS = (
    ("accuracy", "accuracy"), ("balanced_accuracy", "balanced accuracy"), ("precision", "precision"),
    ("recall", "recall"), ("f1", "F1"), ("roc_auc", "ROC-AUC"), ("pr_auc", "PR-AUC (average precision)"),
    ("ece", "calibration error (ECE, 10 bins)"), ("mean_abs_grade_error", "mean |grade error|"),
    ("within_one_accuracy", "within-one accuracy"),
)
POINT_COLUMNS = ("accuracy", "balanced_accuracy", "precision", "recall", "f1")


def _help(name: str) -> str:
    return EvalConfig.model_fields[name].description or ""


def _interval(metrics: dict, name: str) -> str:
    ci = metrics.get(f"{name}_ci")
    return f"{ci[0]:.3f}–{ci[1]:.3f}" if ci else "—"


def metrics_table(metrics: dict, title: str) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_column("95% CI", justify="right")
    for name, shown in METRIC_ROWS:
        if name in metrics:
            value = metrics[name]
            table.add_row(shown, "—" if value is None else f"{value:.3f}", _interval(metrics, name))
    return table


def confusion_table(matrix: dict) -> Table:
    table = Table(title="Confusion matrix (rows: label, columns: prediction)", title_justify="left")
    table.add_column("")
    for name in matrix["columns"]:
        table.add_column(name, justify="right")
    for name, row in zip(matrix["rows"], matrix["counts"]):
        table.add_row(name, *[str(c) for c in row])
    return table


def print_evaluation(report: dict, split: str, console: Console) -> None:
    """The metrics and confusion tables of one evaluation, its repeat mark and the files written."""
    metrics, info, files = report["metrics"], report["info"], report["files"]
    title = (f"{split}: {metrics['n']} examples, model {info['model_spec']} ({info['model_fingerprint'][:12]}), "
             f"{info['method']}; precision/recall/F1: {metrics['averaging']}")
    console.print(metrics_table(metrics, title))
    console.print(confusion_table(metrics["confusion_matrix"]))
    if metrics["n_unparsed"]:
        console.print(f"{metrics['n_unparsed']} of {metrics['n']} answers did not parse; they count as wrong.")
    if info.get("repeat"):
        console.print("[bold yellow]REPEAT holdout evaluation[/]: this model was evaluated on this holdout before; "
                      "this number is not an unbiased estimate and is marked as a repeat in the ledger.")
    written = [files["predictions"]] + [files[k] for k in ("reliability_png", "json") if files.get(k)]
    recorded = f"recorded in {files['ledger']}" if report.get("ledger") else "not recorded (train split: no look at anything held out)"
    look = (report.get("ledger") or {}).get("reading_of")
    if look:
        recorded += f" as a second reading of this model's holdout look of {look['time']}, not a new look"
    console.print(f"wrote {', '.join(written)}; {recorded}")


def print_pass_at_k(report: dict, console: Console) -> None:
    r = report["pass_at_k"]

    def ci(key: str) -> str:
        return f" [{r[key][0]:.3f}, {r[key][1]:.3f}]" if r.get(key) else ""

    console.print(f"{r['split']}: {r['n_items']} items × {r['n_samples']} samples at temperature 1, model {r['model_spec']}: "
                  f"pass@{r['k']} {r['pass_at_k']:.3f}{ci('pass_at_k_ci')}, pass@1 {r['pass_at_1']:.3f}{ci('pass_at_1_ci')}; "
                  "per label " + ", ".join(f"{k} {v:.3f}" for k, v in r["per_label"].items()), highlight=False)
    console.print(f"wrote {report['files']['json']}", highlight=False)


def run_eval_command(cfg: EvalConfig, console: Console) -> dict:
    report = run_eval(cfg)
    if "pass_at_k" in report:
        print_pass_at_k(report, console)
    else:
        print_evaluation(report, cfg.split, console)
    return report


def _points_table(result: dict) -> Table:
    table = Table(title=f"Operating points (positive label {result['positive_label']!r})", title_justify="left")
    for name in ("operating point", "threshold", *POINT_COLUMNS):
        table.add_column(name, justify="left" if name == "operating point" else "right")

    def row(name: str, m: dict, threshold) -> None:
        table.add_row(name, "—" if threshold is None else f"{threshold:.4f}", *[f"{m[c]:.3f}" for c in POINT_COLUMNS])

    row("best balanced accuracy", result["metrics_at_best_balanced_accuracy"], result["best_balanced_accuracy_threshold"])
    if result["metrics_at_target_recall"]:
        row(f"recall ≥ {result['target_recall']:g}", result["metrics_at_target_recall"], result["threshold_at_target_recall"])
    for other in result["compared"]:
        row(f"{other['source']}", other["compared_metrics"], None)
        row("  SFT at the same recall", other["recall_matched_metrics"], other["recall_matched_threshold"])
        row("  closest threshold", other["scored_metrics"], other["threshold"])
    return table


def run_sweep(predictions: Path, compare: list[Path], positive_label: str | None, target_recall: float | None,
              n_boot: int, seed: int, json_path: Path | None, plot: Path | None, console: Console) -> dict:
    from labelrl.evaluate.io import read_predictions
    from labelrl.evaluate.plots import plot_roc
    from labelrl.evaluate.sweep import sweep
    from labelrl.fileio import atomic_write_json

    scored = read_predictions(predictions, positive_label=positive_label)
    others = [read_predictions(p, positive_label=positive_label) for p in compare]
    result = sweep(scored, positive_label=positive_label, target_recall=target_recall, compare=others, n_boot=n_boot,
                   seed=seed)
    console.print(f"{predictions}: {result['n']} examples ({result['n_positive']} positive), ROC-AUC {result['roc_auc']:.3f}")
    console.print(_points_table(result))
    for other in result["compared"]:
        d = other["distance"]
        console.print(f"{other['source']}: {other['verdict']} (point FPR {d['fpr']:.3f}, TPR {d['tpr']:.3f}, SFT curve's "
                      f"TPR there {d['curve_tpr']:.3f}; 95% paired bootstrap over items, {d['n_used']} of {d['n_boot']} "
                      f"resamples, seed {d['seed']}; recall-matched threshold {other['recall_matched_threshold']:.4f}; "
                      f"{other['n_joined']} shared ids)", highlight=False)
    plot = plot or (beside(json_path, ".roc.png") if json_path else None)
    if plot is not None:
        result["plot"] = str(plot_roc(result, plot))
        console.print(f"wrote {plot}")
    if json_path is not None:
        atomic_write_json(json_path, result)
        console.print(f"wrote {json_path}")
    return result


def _band(lo: float, hi: float) -> str:
    return f"[{lo:.2f}, {hi:.2f}" + ("]" if hi >= 1.0 else ")")


def _route_tables(result: dict) -> list[Table]:
    models = Table(title="Models on the shared ids", title_justify="left")
    for name in ("", "accuracy", "balanced accuracy"):
        models.add_column(name, justify="left" if not name else "right")
    for key, shown in (("a", f"A {result['a']['source']}"), ("b", f"B {result['b']['source']}"), ("oracle", "oracle (either right)")):
        models.add_row(shown, f"{result[key]['accuracy']:.3f}", f"{result[key]['balanced_accuracy']:.3f}")
    front = Table(title="Cascade frontier: route A's confidence band [lo, hi) to B", title_justify="left")
    for name in ("band", "share routed", "Δ accuracy", "Δ balanced accuracy"):
        front.add_column(name, justify="right")
    for band in result["cascade"]["frontier"]:
        front.add_row(_band(band["lo"], band["hi"]), f"{band['share_routed']:.1%}",
                      f"{band['delta_accuracy']:+.3f}", f"{band['delta_balanced_accuracy']:+.3f}")
    tables = [models, front] if result["cascade"]["frontier"] else [models]
    disagreement = result["disagreement"]
    groups = [(f"A confidence {_band(r['lo'], r['hi'])}", r) for r in disagreement["by_confidence"]]
    groups += [(r["group"], r) for r in disagreement["by_ambiguity"] or []]
    table = Table(title=f"Disagreements: {disagreement['n_disagree']} of {disagreement['n']}", title_justify="left")
    for name in ("where", "examples", "disagree", "A right", "B right", "neither", "B gain"):
        table.add_column(name, justify="left" if name == "where" else "right")
    for name, r in groups:
        table.add_row(name, str(r["n"]), str(r["n_disagree"]), str(r["a_right"]), str(r["b_right"]),
                      str(r["neither_right"]), str(r["b_gain"]))
    return tables + [table]


def run_route(a_path: Path, b_path: Path, audit: Path | None, steps: int, json_path: Path | None, plot: Path | None,
              console: Console) -> dict:
    from labelrl.evaluate.io import read_predictions
    from labelrl.evaluate.plots import plot_cascade
    from labelrl.evaluate.route import route
    from labelrl.fileio import atomic_write_json

    result = route(read_predictions(a_path), read_predictions(b_path), audit=audit, steps=steps)
    for table in _route_tables(result):
        console.print(table)
    best = result["cascade"]["best"]
    if not result["cascade"]["frontier"]:
        console.print("No confidence band improves balanced accuracy over A alone.")
    console.print(f"best band {_band(best['lo'], best['hi'])}: routes {best['share_routed']:.1%}, "
                  f"Δ balanced accuracy {best['delta_balanced_accuracy']:+.3f} (chosen on these rows: confirm elsewhere)")
    share = result["disagreement"].get("b_gain_share_ambiguous")
    if share is not None:
        console.print(f"{share:.0%} of the examples B gets right and A wrong are ambiguous (conflicting duplicates).")
    for note in result["notes"]:
        console.print(f"note: {note}")
    plot = plot or (beside(json_path, ".cascade.png") if json_path else None)
    if plot is not None:
        result["plot"] = str(plot_cascade(result, plot))
        console.print(f"wrote {plot}")
    if json_path is not None:
        atomic_write_json(json_path, result)
        console.print(f"wrote {json_path}")
    return result


def _fmt(value) -> str:
    return "—" if value is None else f"{value:.3f}"


def _per_reading(readings: dict, name: str) -> str:
    """One figure per reading of a look, in the order of its method column (``0.812 / 0.790``)."""
    return " / ".join(_fmt(m.get(name)) for m in readings.values())


def _record_mark(row: dict) -> str:
    marks = ["[bold yellow]REPEAT[/]"] if row.get("repeat") else []
    if row.get("derived"):
        marks.append("derived")
    if row.get("reading_of"):  # its look is in another splits directory's ledger
        marks.append(f"reading of the look of {row['reading_of'].get('time')}")
    return ", ".join(marks)


def _records_table(rows: list[dict], n_records: int) -> Table:
    """One row per evaluation, a holdout look with all its readings in one row."""
    looks = sum(1 for r in rows if r.get("readings") and not r.get("reading_of"))
    table = Table(title=f"Ledger: {n_records} records, {looks} holdout looks (a look's readings in one row)",
                  title_justify="left")
    for name in ("time", "split", "model", "fingerprint", "n", "method", "accuracy", "balanced accuracy", ""):
        table.add_column(name)
    for r in rows:
        readings = r.get("readings") or {r.get("method") or "scores": r["metrics"]}
        table.add_row(r["time"], r["split"], r["model_spec"], r["model_fingerprint"][:12], str(r["metrics"].get("n", "")),
                      " + ".join(readings), _per_reading(readings, "accuracy"), _per_reading(readings, "balanced_accuracy"),
                      _record_mark(r))
    return table


def _drops_table(drops: list[dict]) -> Table:
    table = Table(title="Val → holdout (largest balanced-accuracy drop first; a look's readings in one row)",
                  title_justify="left")
    for name in ("model", "method", "val from", "val BA", "holdout BA", "drop BA", "val acc", "holdout acc", "drop acc"):
        table.add_column(name)
    for r in drops:
        readings = r["readings"]
        table.add_row(r["model_spec"], " + ".join(readings), " / ".join(x["val_source"] for x in readings.values()),
                      *(_per_reading(readings, f"{what}_{name}") for name in ("balanced_accuracy", "accuracy")
                        for what in ("val", "holdout", "drop")))
    return table


def run_ledger(dirs: list[Path], json_path: Path | None, console: Console) -> dict:
    from labelrl.evaluate.ledger import drop_table, ledger_path, merge_readings, read_ledger
    from labelrl.fileio import atomic_write_json

    records = []
    for d in dirs:
        if not ledger_path(d).is_file():
            raise ValueError(f"{ledger_path(d)}: no ledger; `labelrl eval` writes one beside splits.json")
        records += [dict(r, ledger=str(ledger_path(d))) for r in read_ledger(d)]
    rows = merge_readings(records)
    console.print(_records_table(rows, len(records)))
    drops = drop_table(records)
    if drops:
        console.print(_drops_table(drops))
    result = {"records": records, "rows": rows, "drops": drops}
    if json_path is not None:
        atomic_write_json(json_path, result)
    return result


def _guard(fn, *args) -> None:
    try:
        fn(*args, Console())
    except (ValueError, OSError) as exc:
        fail(str(exc))


def _opt(name: str, *flags: str):
    default = EvalConfig.model_fields[name].default
    return typer.Option(default, *flags, help=_help(name), show_default=default is not None and default is not False)


def register(app: typer.Typer) -> None:
    @app.command("eval", help="Evaluate a run's model (or any model) on val or holdout: metrics with 95% intervals, predictions file, holdout ledger.")
    def eval_command(
        run_or_model: str = typer.Argument(..., help=_help("run_or_model"), metavar="RUN_OR_MODEL", show_default=False),
        split: str = _opt("split", "--split"), data: Optional[str] = _opt("data", "--data"),
        text_col: Optional[list[str]] = typer.Option(None, "--text-col", help=_help("text_col"), show_default=False),
        label_col: Optional[str] = _opt("label_col", "--label-col"), labels: Optional[str] = _opt("labels", "--labels"),
        kind: Optional[str] = _opt("kind", "--kind"), mode: Optional[str] = _opt("mode", "--mode"),
        rubric: Optional[Path] = _opt("rubric", "--rubric"), split_seed: int = _opt("split_seed", "--split-seed"),
        split_ratios: str = _opt("split_ratios", "--split-ratios"),
        on_bad_row: Optional[str] = _opt("on_bad_row", "--on-bad-row"), delimiter: Optional[str] = _opt("delimiter", "--delimiter"),
        encoding: Optional[str] = _opt("encoding", "--encoding"),
        on_long_item: Optional[str] = _opt("on_long_item", "--on-long-item"),
        splits: Optional[Path] = _opt("splits", "--splits"), method: Optional[str] = _opt("method", "--method"),
        out: Optional[Path] = _opt("out", "--out"), json_path: Optional[Path] = _opt("json_path", "--json"),
        allow_repeat_holdout: bool = _opt("allow_repeat_holdout", "--allow-repeat-holdout"),
        limit: Optional[int] = _opt("limit", "--limit"), n_boot: int = _opt("n_boot", "--n-boot"),
        seed: int = _opt("seed", "--seed"), batch_size: int = _opt("batch_size", "--batch-size"),
        max_new_tokens: Optional[int] = _opt("max_new_tokens", "--max-new-tokens"),
        pass_at_k: Optional[int] = _opt("pass_at_k", "--pass-at-k"), pass_samples: int = _opt("pass_samples", "--pass-samples"),
        precision: str = typer.Option("auto", "--precision", help=_help("precision") + " One of: auto/fp32/bf16.",
                                      metavar="AUTO|FP32|BF16"),
    ) -> None:
        values = dict(locals())
        values["text_col"] = values["text_col"] or []
        try:
            cfg = EvalConfig(**values)
        except ValidationError as exc:
            fail(format_validation_error(exc))
        _guard(run_eval_command, cfg)

    @app.command("sweep", help="Sweep a scored model's threshold: ROC, threshold for a target recall, best balanced accuracy, and whether other models' operating points lie on, above or below its ROC curve (ΔTPR at their FPR, with a paired bootstrap interval).")
    def sweep_command(
        predictions: Path = typer.Argument(..., help="Predictions of a scored model (.parquet/.csv with score or score_<label>).", show_default=False),
        positive_label: Optional[str] = typer.Option(None, "--positive-label", help="The positive label (default: the predictions' positive label).", show_default=False),
        target_recall: float = typer.Option(0.9, "--target-recall", help="Report the largest threshold whose recall is at least this."),
        compare: Optional[list[Path]] = typer.Option(None, "--compare", help="Predictions of another model on the same ids (repeatable).", show_default=False),
        n_boot: int = typer.Option(1000, "--n-boot", help="Bootstrap resamples of the items for the interval of each compared point's ΔTPR (its distance above the scored model's ROC curve)."),
        seed: int = typer.Option(0, "--seed", help="Seed of the bootstrap resamples (numpy default_rng)."),
        json_path: Optional[Path] = typer.Option(None, "--json", help="Write the sweep to this JSON file (and the ROC plot beside it).", show_default=False),
        plot: Optional[Path] = typer.Option(None, "--plot", help="ROC plot PNG (default: beside --json).", show_default=False),
    ) -> None:
        _guard(run_sweep, predictions, compare or [], positive_label, target_recall, n_boot, seed, json_path, plot)

    @app.command("route", help="Route between two models: oracle upper bound, confidence cascade over bands of A's confidence, and where they disagree.")
    def route_command(
        a: Path = typer.Argument(..., help="Predictions of model A (scored: its confidence drives the cascade).", metavar="A_PREDICTIONS", show_default=False),
        b: Path = typer.Argument(..., help="Predictions of model B (hard predictions suffice).", metavar="B_PREDICTIONS", show_default=False),
        audit: Optional[Path] = typer.Option(None, "--audit", help="`labelrl audit --json` report: break disagreements down by label ambiguity.", show_default=False),
        steps: int = typer.Option(10, "--steps", min=1, help="Cascade grid: this many equal steps of confidence from 1/K to 1."),
        json_path: Optional[Path] = typer.Option(None, "--json", help="Write the result to this JSON file (and the trade-off plot beside it).", show_default=False),
        plot: Optional[Path] = typer.Option(None, "--plot", help="Cascade trade-off PNG (default: beside --json).", show_default=False),
    ) -> None:
        _guard(run_route, a, b, audit, steps, json_path, plot)

    @app.command("ledger", help="List the evaluations recorded beside the splits (repeats and derived records marked; a holdout look with all its readings in one row) and the val → holdout drop per model.")
    def ledger_command(
        dirs: list[Path] = typer.Argument(..., help="Run (or splits) directories whose ledger.jsonl to read.", metavar="RUN_DIR...", show_default=False),
        json_path: Optional[Path] = typer.Option(None, "--json", help="Write the records and the drop table to this JSON file.", show_default=False),
    ) -> None:
        _guard(run_ledger, dirs, json_path)
