"""``labelrl ladder RECIPE``: run a recipe's arms on shared splits, then print and report them."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from labelrl.cli.options import fail

console = Console()

SET_HELP = "Change one recipe value, KEY.PATH=VALUE (repeatable), e.g. --set tasks.spam.limit=2000 --set defaults.rl.steps=50."
FAST_HELP = "Apply the recipe's `fast:` overlay: a smoke-test scale (tiny-random, a few steps)."
PRECISION_OPTION_HELP = ("Compute precision of every arm and evaluation: auto (bf16 where the processor computes it "
                         "natively, else fp32), fp32 or bf16; the same as --set precision=VALUE. [default: the recipe's, auto]")


def precision_sets(precision: str | None, sets: list[str]) -> list[str]:
    """``--precision P`` as the recipe assignment ``precision=P`` (before the user's own --set)."""
    if precision is None:
        return list(sets)
    if precision not in ("auto", "fp32", "bf16"):
        raise ValueError(f"--precision {precision}: not a precision; use auto, fp32 or bf16")
    return [f"precision={precision}", *sets]


def run_ladder_command(recipe_source, out: Path | None, *, fast: bool = False, sets: list[str] | None = None,
                       report: bool = True) -> dict:
    """Load the recipe (a path, a built-in name, or an already validated Recipe), run the ladder,
    print the verdict and the comparison and build the report; returns the state."""
    from labelrl.ladder.recipe import Recipe, load_recipe
    from labelrl.ladder.run import Ladder

    recipe = recipe_source if isinstance(recipe_source, Recipe) else load_recipe(recipe_source, fast=fast, sets=sets or [])
    run_dir = Path(out) if out is not None else Path("runs") / (recipe.name + ("-fast" if fast else ""))
    ladder = Ladder(recipe, run_dir, console)
    started = time.monotonic()
    state = ladder.run()
    print_verdicts(state)
    for table in comparison_tables(state):
        console.print(table)
    report_seconds = None
    if report:
        from labelrl.report import build_report

        building = time.monotonic()
        built = build_report(ladder.run_dir)
        report_seconds = time.monotonic() - building
        state["report"] = {"html": str(built.html), "md": str(built.markdown)}
        console.print(f"report: {built.html} (and {built.markdown})")
    console.print(phase_table(state, report_seconds, time.monotonic() - started))
    console.print(f"run files: {ladder.run_dir}")
    return state


def phase_table(state: dict, report_seconds: float | None, wall_seconds: float) -> Table:
    """Where this ladder's time went (``phases``, which the ladder records: labelrl.ladder.phases),
    the report and the whole run."""
    from labelrl.report.render import minutes

    table = Table(title="time per phase", title_justify="left")
    for column in ("task", "phase", "what", "time"):
        table.add_column(column, justify="right" if column == "time" else "left")
    for row in state["phases"]:
        table.add_row(row["task"], row["phase"], row["what"], minutes(row["seconds"]))
    if report_seconds is not None:
        table.add_row("", "report", "figures, HTML and Markdown", minutes(report_seconds))
    table.add_row("", "all", "this invocation, wall clock (finished arms reused)", minutes(wall_seconds))
    return table


def print_verdicts(state: dict, explain: bool = False, out: Console | None = None) -> None:
    """Each task's answer sentence and grid (labelrl.ladder.grid), before the tables; with
    ``explain``, the verdict's sentences behind the cells too (labelrl.ladder.analysis.task_verdict),
    which ``labelrl report RUN_DIR --explain`` prints. A task without a grid prints its sentences."""
    out = out or console
    out.rule("verdict")
    hidden = False
    for task_name in state.get("task_order") or list(state["tasks"]):
        task = state["tasks"][task_name]
        lines = [v["text"] for v in task.get("verdict") or []]
        if not lines:
            note = (task.get("analysis") or {}).get("note") or "no finished RL arm to compare with its SFT parent"
            lines = [note]
        out.print(f"[bold]{task_name}[/] ({task.get('data')}):", highlight=False)
        shown = print_grid((task.get("analysis") or {}).get("grid"), out)
        if explain or not shown:
            for line in lines:
                out.print(f"  • {line}", highlight=False, soft_wrap=False)
        else:
            hidden = True
    if hidden:
        out.print(f"the sentence behind each cell: labelrl report {state.get('run_dir', 'RUN_DIR')} --explain "
                  "(and the report's verdict section)", highlight=False, soft_wrap=True)


def print_grid(grid: dict | None, out: Console | None = None) -> bool:
    """The task's answer sentence and its grid (labelrl.ladder.grid); False when there is none."""
    out = out or console
    if not grid or "rows" not in grid or not grid["rows"]:
        return False
    from labelrl.ladder.grid import legend
    from labelrl.report.grid_table import grid_lines

    header, *rows = grid_lines(grid)
    table = Table(*header, box=None, pad_edge=False)
    for row in rows:
        table.add_row(*row)
    out.print(f"  {grid['sentence']}", highlight=False)
    out.print(table)
    out.print(f"  {legend(grid)}", highlight=False)
    return True


def _fmt(metrics: dict | None, key: str) -> str:
    return "–" if not metrics or metrics.get(key) is None else f"{metrics[key]:.3f}"


def _status(arm: dict) -> str:
    status = arm.get("status", "pending")
    same = arm.get("holdout_same_model_as")
    if status == "done" and same:  # same weights: the holdout result is shared
        return "= earlier look" if "/" in same else f"= {same}"
    if status == "done" and arm.get("holdout_repeat"):
        return "REPEAT"
    if status == "done" and (arm.get("train") or {}).get("collapse"):  # evaluated, but it answers one label
        return "done, collapsed"
    return status


def _collapse_notes(task: dict) -> list[str]:
    """A caption line per RL arm flagged collapsed to one answer (labelrl.train.collapse)."""
    from labelrl.train.collapse import collapse_detail

    return [f"{name}: {collapse_detail(arm['train']['collapse'])}: a constant answer's scores, not the method's"
            for name, arm in task["arms"].items() if (arm.get("train") or {}).get("collapse")]


def _majority_row(task: dict, columns: list[tuple[str, str]]) -> list[str] | None:
    """The majority-class constant predictor's row (labelrl.ladder.majority), when it was scored."""
    majority = (task.get("analysis") or {}).get("majority") or {}
    if "label" not in majority:
        return None
    return [f"majority class ({majority['label']})", "constant", *[_fmt(majority.get(split), key) for split, key in columns],
            *["" for _ in task.get("ood", [])], ""]


def comparison_tables(state: dict) -> list[Table]:
    """One table per task: the ceiling, then every arm's val, holdout and out-of-domain figures
    (point estimates; the report has the intervals). Failed and skipped arms' reasons follow, and
    the values each tuned arm chose on val."""
    from labelrl.ladder.recipe import run_label
    from labelrl.ladder.tune import tune_note

    tables = []
    for task_name in state.get("task_order") or list(state["tasks"]):
        task = state["tasks"][task_name]
        keys = ["accuracy", "balanced_accuracy"] + (["mean_abs_grade_error"] if task.get("kind") == "ordinal" else [])
        columns = [("val", "balanced_accuracy")] + [("holdout", k) for k in keys]
        short = {"accuracy": "acc", "balanced_accuracy": "BA", "mean_abs_grade_error": "|err|"}
        caption = [f"ceiling 1 − ε from {task['ceiling_source']}"] if task.get("ceiling") is not None else []
        caption.append("failed+: mean share of failed rollouts given a positive advantage, over the RL steps; "
                       "= ARM: same weights as ARM, holdout result shared")
        caption += [f"{name}: same weights as {arm['holdout_same_model_as']}, whose holdout look it shares"
                    for name, arm in task["arms"].items() if "/" in (arm.get("holdout_same_model_as") or "")]
        caption += [f"{name}: {arm['status']}: {arm.get('error')}" for name, arm in task["arms"].items()
                    if arm.get("status") in ("failed", "skipped")]
        caption += _collapse_notes(task)
        caption += [f"{name}: {note}" for name, arm in task["arms"].items() if (note := tune_note(arm))]
        kind = f"{task.get('kind')}" + (f", positive label {task['positive_label']}" if task.get("positive_label") else "")
        table = Table(title=f"{task_name}: {task['data']} ({kind}), 95% intervals in the report",
                      title_justify="left", caption="\n".join(caption) or None, caption_justify="left")
        table.add_column("arm", no_wrap=True)  # cut to "dr_grpo@…", a name no longer says which seed
        table.add_column("status")
        for split, key in columns:
            table.add_column(f"{split} {short[key]}", justify="right")
        for ood in task.get("ood", []):
            table.add_column(f"{ood} BA", justify="right")
        table.add_column("failed+", justify="right")  # mean share of failed rollouts given a positive advantage
        if task.get("ceiling") is not None:
            ceiling = [f"{task['ceiling']:.3f}" if k == "accuracy" else "" for _, k in columns]
            table.add_row("ceiling", "", *ceiling, *["" for _ in task.get("ood", [])], "")
        if (majority := _majority_row(task, columns)) is not None:
            table.add_row(*majority)
        for arm_name in task.get("arm_order") or list(task["arms"]):
            arm = task["arms"].get(arm_name, {})
            cells = [_fmt(arm.get(split), key) for split, key in columns]
            ood = [_fmt((arm.get("ood") or {}).get(name), "balanced_accuracy") for name in task.get("ood", [])]
            failed = _fmt(arm.get("train"), "failed_positive_frac") if arm.get("train") else ""
            table.add_row(run_label(arm_name, arm.get("preset") or arm.get("type"), arm.get("replicate_of")), _status(arm), *cells, *ood, failed)
            for rl, matched in (arm.get("matched") or {}).items():  # a threshold arm's recall-matched thresholds
                # under its threshold arm's row: "→ grpo@s0 recall" (the name again would widen the column)
                table.add_row(f"  → {rl} recall", "derived", "", *[_fmt(matched.get("holdout"), k) for _, k in columns[1:]],
                              *["" for _ in task.get("ood", [])], "")
        for group, values in replicate_means(task, [k for _, k in columns[1:]]).items():
            table.add_row(group, f"mean ± sd of {values['n']} seeds", "", *values["cells"], *["" for _ in task.get("ood", [])], "")
        tables.append(table)
    return tables


def replicate_means(task: dict, keys: list[str]) -> dict[str, dict]:
    """Per replicated arm: "mean ± sd" over its seeds of each holdout metric in ``keys``."""
    import statistics

    runs: dict[str, list[dict]] = {}
    for arm in task["arms"].values():
        if arm.get("replicate_of") and arm.get("holdout"):
            runs.setdefault(arm["replicate_of"], []).append(arm["holdout"])
    out = {}
    for group, holdouts in runs.items():
        cells = []
        for key in keys:
            values = [h[key] for h in holdouts if isinstance(h.get(key), (int, float))]
            cells.append(f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}" if len(values) > 1 else "–")
        out[group] = {"n": len(holdouts), "cells": cells}
    return out


def data_recipe(data: str, *, budget: str, model: str | None, text_col: list[str], label_col: str | None,
                labels: str | None, kind: str | None, rubric: Path | None, on_bad_row: str, delimiter: str | None,
                sets: list[str], encoding: str = "utf-8", positive: str | None = None):
    """The default recipe for ``--data`` (labelrl.ladder.default_recipe), validated with ``--set``."""
    from labelrl.data.load import load_dataset
    from labelrl.data.prompts import longest_answer
    from labelrl.ladder.default_recipe import budget_model, default_recipe, length_note
    from labelrl.ladder.recipe import recipe_from_dict
    from labelrl.models.load import load_tokenizer

    if budget == "gpu":
        import torch

        if not torch.cuda.is_available():  # its full epochs and 300 steps of G = 8 would take a CPU many hours
            raise ValueError("--budget gpu: no CUDA GPU is visible to torch (torch.cuda.is_available() is False), and "
                             "this budget's full SFT epochs and 300 RL steps of G = 8 would run on the CPU for many hours; "
                             "use --budget cpu (sized for a CPU: SmolLM2 with LoRA, three seeds), or run on a machine "
                             "with a GPU")
    dataset = load_dataset(data, text_cols=text_col or None, label_col=label_col, labels=labels, kind=kind,
                           positive=positive, on_bad_row=on_bad_row, delimiter=delimiter, encoding=encoding)
    console.print(data_line(data, dataset, kind=kind, labels=labels), highlight=False, soft_wrap=True)  # a path stays whole
    if dataset.labels.kind == "binary" and not positive:
        note_positive(dataset.labels.positive_label, dataset.label_counts())
    spec = budget_model(budget, model)  # RL's token cap must hold the longest answer in this model's tokens
    tokenizer = load_tokenizer(spec) if spec else None
    answer = longest_answer(tokenizer, dataset.labels)[0] if tokenizer else None
    raw = default_recipe(data, kind=dataset.labels.kind, labels=list(dataset.labels.labels), budget=budget, model=model,
                         answer_tokens=answer, text_col=text_col or None, label_col=label_col, label_list=labels, rubric=rubric,
                         positive=dataset.labels.positive if positive else None,
                         data_options={"on_bad_row": on_bad_row if on_bad_row != "error" else None, "delimiter": delimiter,
                                       "encoding": encoding if encoding != "utf-8" else None})
    if tokenizer is not None and (note := length_note(text_lengths(tokenizer, dataset.examples), budget, next(iter(raw["tasks"])))):
        console.print(note, highlight=False)
    return recipe_from_dict(raw, f"--data {data}", Path.cwd(), sets=sets)


def text_lengths(tokenizer, examples, most: int = 2000) -> list[int]:
    """The token lengths of up to ``most`` of the items' texts (evenly spaced through the file,
    so a file sorted by label or by length is seen whole)."""
    step = max(1, len(examples) // most)
    texts = [e.text for e in examples[::step]]
    return [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]] if texts else []


SHOWN_LABELS = 12


def data_line(data: str, dataset, *, kind: str | None, labels: str | None) -> str:
    """What the ladder read, before anything trains: items, the label kind (and, inferred, how
    to say otherwise), each label's count (in grade order for a scale, else most first) and the
    labels too rare to be measured well."""
    from labelrl.data.schema import is_scale
    from labelrl.data.split import label_notes

    space = dataset.labels
    counts = list(dataset.label_counts().items())
    if space.kind != "ordinal":
        counts.sort(key=lambda item: -item[1])
    k = len(counts)
    if space.kind == "binary":
        why = f" (positive label {space.positive_label})"
    elif kind or labels:
        why = ""
    elif space.kind == "ordinal":
        why = (" (every label a number: a scale; --kind categorical if it is not one)" if is_scale(space.labels)
               else " (the file's ordered categories, lowest first)")
    else:
        why = " (--kind ordinal --labels LOW,…,HIGH if the labels are a scale)"
    shown = ", ".join(f"{label} ({n:,})" for label, n in counts[:SHOWN_LABELS])
    more = f", and {k - SHOWN_LABELS} more" if k > SHOWN_LABELS else ""
    skipped = f" ({len(dataset.skipped_rows):,} bad rows skipped)" if dataset.skipped_rows else ""
    line = f"{data}: {len(dataset):,} items{skipped}, {k} labels, {space.kind}{why}: {shown}{more}"
    notes = label_notes(dataset, declared=bool(labels))
    return line + "".join(f". {note}" for note in notes)


def note_positive(positive: str, counts: dict[str, int]) -> None:
    """Say so when the positive label the loader's rule picked (the second in sorted order) is the
    majority: a detection task's positive label is usually the rare one ("ok" of fraud/ok)."""
    share = counts.get(positive, 0) / max(1, sum(counts.values()))
    other = next((label for label in counts if label != positive), None)
    if share > 0.5 and other is not None:
        console.print(f"positive label: {positive} (the second in sorted order), {share:.0%} of the rows; the sweep and "
                      f"the verdict's operating points read its recall and precision. If {other} is the label to "
                      f"detect, add --positive {other}", highlight=False)


def register(app: typer.Typer) -> None:
    @app.command("ladder")
    def ladder(
        recipe: Optional[str] = typer.Argument(None, help="Recipe YAML file, or a built-in recipe name (demo, gpu, noise, reasoning). See recipes/. Or leave it out and give --data.", show_default=False),
        out: Optional[Path] = typer.Option(None, "--out", help="Run directory (default runs/RECIPE_NAME, or runs/FILE-BUDGET with --data). Re-running into it skips finished arms."),
        fast: bool = typer.Option(False, "--fast", help=FAST_HELP),
        set_: list[str] = typer.Option([], "--set", help=SET_HELP),
        report: bool = typer.Option(True, "--report/--no-report", help="Build RUN_DIR/report/report.html and report.md at the end."),
        data: Optional[str] = typer.Option(None, "--data", help="Your own data (JSONL, CSV, Parquet) or a built-in dataset: builds the default recipe for its label kind (SFT, GRPO, Dr. GRPO, CoRPO for ordinal labels, SFT + threshold), writes it to RUN_DIR/recipe.yaml, runs it and prints the verdict.", show_default=False),
        budget: str = typer.Option("smoke", "--budget", help="With --data: smoke (tiny-random, minutes: the plumbing), cpu (SmolLM2 with LoRA, 3 seeds, 512-item val and holdout samples: a real run on a CPU, measured as the demo is: 10–17 minutes on 2 cores for the files in docs/your-data.md, texts of 25–65 tokens on average; on longer texts it says first about how many times longer), gpu (--model, full epochs, 3 seeds).", metavar="smoke|cpu|gpu"),
        model: Optional[str] = typer.Option(None, "--model", help="With --data: the model to fine-tune (default: the budget's).", show_default=False),
        text_col: Optional[list[str]] = typer.Option(None, "--text-col", help="With --data: text column(s) of the prompt (repeatable).", show_default=False),
        label_col: Optional[str] = typer.Option(None, "--label-col", help="With --data: the label column.", show_default=False),
        labels: Optional[str] = typer.Option(None, "--labels", help="With --data: the label set, comma-separated, in grade order for ordinal labels.", show_default=False),
        kind: Optional[str] = typer.Option(None, "--kind", help="With --data: binary, categorical or ordinal (inferred when omitted).", show_default=False),
        positive: Optional[str] = typer.Option(None, "--positive", metavar="LABEL", help="With --data, binary labels: the positive label, whose recall and precision the sweep and the verdict's operating points read (default: the second in sorted order, e.g. spam of ham/spam, ok of fraud/ok).", show_default=False),
        rubric: Optional[Path] = typer.Option(None, "--rubric", help="With --data: a Markdown file with the labelling rules, shown in every prompt.", show_default=False),
        on_bad_row: str = typer.Option("error", "--on-bad-row", help="With --data: stop on a malformed row, or skip it and save the list.", metavar="error|skip"),
        delimiter: Optional[str] = typer.Option(None, "--delimiter", help="With --data, CSV files: the delimiter (sniffed from the header when omitted).", show_default=False),
        encoding: str = typer.Option("utf-8", "--encoding", help="With --data, CSV and JSONL files: the text encoding, any Python codec name (e.g. cp1252, latin-1)."),
        precision: Optional[str] = typer.Option(None, "--precision", help=PRECISION_OPTION_HELP, metavar="AUTO|FP32|BF16"),
    ) -> None:
        """Run every arm of a recipe (SFT, RL presets, SFT + threshold, distillation, controls, relabelling) in
        dependency order on shared splits and samples; each final model is evaluated on val, then once on the
        holdout; every RL arm is compared, paired on the same items, with SFT and with SFT + threshold, and
        the verdict is printed first. With --data instead of a recipe: the default recipe for your file."""
        if (recipe is None) == (data is None):
            fail("give a recipe (a YAML file or a built-in name) or --data FILE, not both and not neither; "
                 "e.g. labelrl ladder --data reviews.csv --text-col text --label-col label")
        if data is not None:
            if fast:
                fail("--fast overlays a recipe's fast: section; with --data use --budget smoke")
            try:
                built = data_recipe(data, budget=budget, model=model, text_col=text_col or [], label_col=label_col,
                                    labels=labels, kind=kind, rubric=rubric, on_bad_row=on_bad_row, delimiter=delimiter,
                                    encoding=encoding, sets=precision_sets(precision, set_), positive=positive)
            except (ValueError, FileNotFoundError) as exc:
                fail(str(exc))
            out = out or Path("runs") / f"{built.name}-{budget}"
            _guarded(lambda: run_ladder_command(built, out, report=report))
            console.print(f"recipe: {Path(out) / 'recipe.yaml'} (edit it and run `labelrl ladder {Path(out) / 'recipe.yaml'} "
                          f"--out {out}` to re-run; finished arms are kept)", highlight=False)
            return
        _guarded(lambda: run_ladder_command(recipe, out, fast=fast, sets=precision_sets(precision, set_), report=report))


def _guarded(fn, *args, **kwargs) -> None:
    from labelrl.ladder.arms import LadderStopped

    try:
        fn(*args, **kwargs)
    except LadderStopped as exc:
        console.print(f"[yellow]ladder stopped[/]: {exc}")
        raise typer.Exit(130)
    except (ValueError, FileNotFoundError) as exc:
        fail(str(exc))
