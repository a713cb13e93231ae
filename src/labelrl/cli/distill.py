"""``labelrl distill``: rejection-sampled teacher traces for CoT-SFT; ``labelrl compare``: the
matched-data decomposition of direct SFT vs CoT-SFT (filter effect, objective effect)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

import typer
from pydantic import BaseModel, Field, ValidationError
from rich.console import Console
from rich.table import Table

from labelrl.audit.judges import DEFAULT_API_KEY_ENV, JudgeError, JudgeSpec
from labelrl.cli.options import err_console, fail, format_validation_error

SPEC_HELP = "a local model (anything load_model takes, e.g. tiny-random or a model directory) or an OpenAI-compatible endpoint URL http://HOST:PORT/v1"


class DistillConfig(BaseModel):
    """Options of ``labelrl distill``; each description is the option's --help text."""

    data: str = Field(description="A built-in dataset or a .jsonl, .csv or .parquet file.")
    teacher: str = Field(description=f"The teacher: {SPEC_HELP}. It sees the item and rubric, never the label.")
    teacher_model: Optional[str] = Field(None, description="Model name to request from an endpoint --teacher.")
    out: Path = Field(description="Traces file (.jsonl); its attempts journal and summary are written beside it.")
    attempts: int = Field(4, ge=1, description="At most this many teacher attempts per item (attempt a uses seed SEED+a).")
    keep: Literal["first", "all"] = Field("first", description="Keep the first matching trace of an item, or every matching one.")
    rubric: Optional[Path] = Field(None, description="Text or Markdown file with the labelling rules, shown to the teacher.")
    limit: Optional[int] = Field(None, ge=1, description="Distill only the first N items (a trial run).")
    run_dir: Optional[Path] = Field(None, description="Run directory whose splits to use (made there if absent); without it every item of DATA is used.")
    split: Literal["train", "val", "holdout"] = Field("train", description="With --run-dir: the split whose items get traces.")
    split_seed: int = Field(0, description="With --run-dir: seed of the split (as --split-seed of sft).")
    max_new_tokens: int = Field(512, ge=1, description="Token cap of each teacher reply.")
    temperature: float = Field(0.7, ge=0, description="Teacher sampling temperature (0: greedy, so every attempt of a local teacher is the same).")
    seed: int = Field(0, description="Seed of the first attempt.")
    difficulty: Optional[Path] = Field(None, description="Predictions file (with scores) of the direct SFT model on these items: survival is also reported by its confidence band.")
    concurrency: int = Field(4, ge=1, description="Endpoint requests in flight at once (a local teacher runs one at a time).")
    timeout: float = Field(60.0, gt=0, description="Seconds an endpoint request may wait for the server.")
    retries: int = Field(3, ge=0, description="Further attempts after a failed endpoint request (exponential backoff with jitter).")
    backoff: float = Field(0.5, ge=0, description="Seconds before the first retry; doubled for each later one (capped at 8 s).")
    api_key_env: str = Field(DEFAULT_API_KEY_ENV, description="Environment variable holding the endpoint API key (never logged or saved).")
    text_col: list[str] = Field(default_factory=list, description="Text column (repeat for several); default: the built-in's, else 'text'.")
    label_col: Optional[str] = Field(None, description="Label column; default: the built-in's, else 'label'.")
    labels: Optional[str] = Field(None, description="The label set in order, comma-separated, e.g. ham,spam.")
    json_path: Optional[Path] = Field(None, description="Also write the summary to this JSON file (it is always saved as OUT.summary.json).")

    def teacher_spec(self) -> JudgeSpec:
        return JudgeSpec(spec=self.teacher, model=self.teacher_model, api_key_env=self.api_key_env,
                         timeout_s=self.timeout, retries=self.retries, concurrency=self.concurrency,
                         backoff_s=self.backoff, temperature=self.temperature, flag="--teacher")


def load_examples(cfg: DistillConfig):
    """The items to distill (the run directory's split, or all of DATA) and their label space."""
    from labelrl.data.load import load_dataset
    from labelrl.data.split import load_or_make_splits, select

    dataset = load_dataset(cfg.data, text_cols=cfg.text_col or None, label_col=cfg.label_col, labels=cfg.labels)
    examples = list(dataset.examples)
    if cfg.run_dir is not None:
        examples = select(dataset, load_or_make_splits(dataset, cfg.run_dir, seed=cfg.split_seed), cfg.split)
    if cfg.limit is not None:
        examples = examples[: cfg.limit]
    if not examples:
        raise ValueError(f"--split {cfg.split}: no items to distill; use more data or another split")
    return examples, dataset.labels


def run_distill_command(cfg: DistillConfig, console: Console) -> dict:
    """Validate the cheap things first (paths, rubric, data, teacher spec), then load the teacher,
    run, and write and print the summary."""
    from labelrl.audit.judges import load_judge
    from labelrl.audit.relabel import read_rubric
    from labelrl.distill.reject import item_confidence, survival_summary
    from labelrl.distill.teacher import distill_paths, run_distill
    from labelrl.evaluate.io import read_predictions
    from labelrl.fileio import atomic_write_json, read_jsonl

    paths = distill_paths(cfg.out)
    rubric = read_rubric(cfg.rubric) if cfg.rubric is not None else None
    examples, labels = load_examples(cfg)
    confidence = None
    if cfg.difficulty is not None:
        pred = read_predictions(cfg.difficulty)
        confidence = item_confidence(pred.ids, pred.scores())
        if not confidence:
            raise ValueError(f"--difficulty {cfg.difficulty}: has no score columns; give the predictions of a scored "
                             "direct model (`labelrl eval` of a direct SFT run)")
    spec = cfg.teacher_spec()
    spec.check()
    teacher = load_judge(spec, labels, rubric)
    records = run_distill(examples, labels, rubric, teacher, paths, attempts=cfg.attempts, keep=cfg.keep,
                          max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, seed=cfg.seed,
                          concurrency=cfg.concurrency if spec.is_endpoint else 1)
    attempts = [r for r in read_jsonl(paths.journal) if r.get("kind") == "attempt"]
    summary = survival_summary(records, confidence=confidence, attempts=attempts)
    summary.update(teacher=teacher.name, attempts=cfg.attempts, keep=cfg.keep, trace_length_unit="characters",
                   files={"traces": str(paths.out), "attempts": str(paths.journal), "summary": str(paths.summary)})
    atomic_write_json(paths.summary, summary)
    render_survival(summary, console)
    if cfg.json_path is not None:
        atomic_write_json(cfg.json_path, summary)
    return summary


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
                         "on the survivors (--only-ids-from), CoT-SFT on the survivors")
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
        max_new_tokens: int = _opt("max_new_tokens", "--max-new-tokens", d["max_new_tokens"]),
        temperature: float = _opt("temperature", "--temperature", d["temperature"]), seed: int = _opt("seed", "--seed", d["seed"]),
        difficulty: Optional[Path] = _opt("difficulty", "--difficulty"),
        concurrency: int = _opt("concurrency", "--concurrency", d["concurrency"]),
        timeout: float = _opt("timeout", "--timeout", d["timeout"]), retries: int = _opt("retries", "--retries", d["retries"]),
        backoff: float = _opt("backoff", "--backoff", d["backoff"]),
        api_key_env: str = _opt("api_key_env", "--api-key-env", d["api_key_env"]),
        text_col: Optional[list[str]] = _opt("text_col", "--text-col"), label_col: Optional[str] = _opt("label_col", "--label-col"),
        labels: Optional[str] = _opt("labels", "--labels"), json_path: Optional[Path] = _opt("json_path", "--json"),
    ) -> None:
        values = dict(locals())
        values["text_col"] = text_col or []
        try:
            cfg = DistillConfig(**values)
        except ValidationError as exc:
            fail(format_validation_error(exc))
        try:
            run_distill_command(cfg, Console())
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
