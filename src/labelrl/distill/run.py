"""``labelrl distill`` as a function: the items of a split, the teacher, rejection-sampled
traces and their survival summary. The command module parses options and prints; the ladder
calls ``run_distill_config``."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

from pydantic import BaseModel, Field, field_validator

from labelrl.audit.judge_types import DEFAULT_API_KEY_ENV, JudgeSpec
from labelrl.data.options import ENCODING_HELP, valid_encoding
from labelrl.models.precision import PRECISION_HELP

SPEC_HELP = "a local model (anything load_model takes, e.g. tiny-random or a model directory) or an OpenAI-compatible endpoint URL http://HOST:PORT/v1"


class DistillConfig(BaseModel):
    """Options of ``labelrl distill``; each description is the option's --help text."""

    data: str = Field(description="A built-in dataset or a .jsonl, .csv or .parquet file.")
    teacher: str = Field(description=f"The teacher: {SPEC_HELP}. It sees the item and rubric, never the label.")
    teacher_model: Optional[str] = Field(None, description="Model name to request from an endpoint --teacher (the name the server serves: vLLM's --served-model-name, else the path it was started with; GET URL/models lists them).")
    out: Path = Field(description="Traces file (.jsonl); its attempts journal and summary are written beside it.")
    attempts: int = Field(4, ge=1, description="At most this many teacher attempts per item (attempt a uses seed SEED+a).")
    keep: Literal["first", "all"] = Field("first", description="Keep the first matching trace of an item, or every matching one.")
    rubric: Optional[Path] = Field(None, description="Text or Markdown file with the labelling rules, shown to the teacher.")
    limit: Optional[int] = Field(None, ge=1, description="Distill a random sample of N items, stratified by label (seeded by --split-seed).")
    train_sample: Literal["stratified", "balanced"] = Field("stratified", description="How --limit draws the items: each label its share (stratified) or an equal share, all of a label's items when it has fewer (balanced): the training sample of sft and rl runs with the same --train-sample.")
    run_dir: Optional[Path] = Field(None, description="Run directory whose splits to use (made there if absent); without it every item of DATA is used.")
    split: Literal["train", "val", "holdout"] = Field("train", description="With --run-dir: the split whose items get traces.")
    split_seed: int = Field(0, description="With --run-dir: seed of the split (as --split-seed of sft).")
    split_ratios: str = Field("0.8,0.1,0.1", description="With --run-dir: shares of train, val and holdout (as --split-ratios of sft).")
    max_new_tokens: int = Field(512, ge=1, description="Token cap of each teacher reply.")
    temperature: float = Field(0.7, ge=0, description="Teacher sampling temperature (0: greedy, so every attempt of a local teacher is the same).")
    trace_format: Literal["free", "constrained"] = Field("free", description="free: the teacher writes the <think>…</think><answer>…</answer> format itself and a reply that does not parse is rejected. constrained (a local teacher only, for small models that ignore the format): the reply is opened with <think>, the teacher's reasoning runs until it starts a tag or reaches the token cap, and the answer is drawn from its own label probabilities after that reasoning; every reply parses, so only agreement with the label decides.")
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
    on_bad_row: Literal["error", "skip"] = Field("error", description="What to do with a malformed row: stop with an error naming it, or skip it and list it in NAME.skipped_rows.jsonl beside OUT (NAME.jsonl).")
    delimiter: Optional[str] = Field(None, description="CSV files only: the delimiter (',', ';', tab or pipe); sniffed from the header when omitted.")
    encoding: str = Field("utf-8", description=ENCODING_HELP)
    json_path: Optional[Path] = Field(None, description="Also write the summary to this JSON file (it is always saved as OUT.summary.json).")
    precision: Literal["auto", "fp32", "bf16"] = Field("auto", description=PRECISION_HELP + " Applies to a local teacher.")

    _check_encoding = field_validator("encoding")(valid_encoding)

    def teacher_spec(self) -> JudgeSpec:
        return JudgeSpec(spec=self.teacher, model=self.teacher_model, api_key_env=self.api_key_env,
                         timeout_s=self.timeout, retries=self.retries, concurrency=self.concurrency,
                         backoff_s=self.backoff, temperature=self.temperature, flag="--teacher",
                         precision=self.precision)


def load_examples(cfg: DistillConfig):
    """The items to distill (the run directory's split, or all of DATA) and their label space."""
    import sys

    from labelrl.data.load import load_dataset, write_skipped_rows
    from labelrl.data.options import parse_ratios
    from labelrl.data.sample import sample_examples
    from labelrl.data.split import load_or_make_splits, select

    dataset = load_dataset(cfg.data, text_cols=cfg.text_col or None, label_col=cfg.label_col, labels=cfg.labels,
                           on_bad_row=cfg.on_bad_row, delimiter=cfg.delimiter, encoding=cfg.encoding)
    if dataset.skipped_rows:  # --on-bad-row skip: said and saved, never silent
        saved = write_skipped_rows(dataset, Path(cfg.out).with_name(Path(cfg.out).stem + ".skipped_rows.jsonl"))
        print(f"skipped {len(dataset.skipped_rows)} bad rows of {cfg.data}; the list is in {saved}", file=sys.stderr)
    examples = list(dataset.examples)
    seed = cfg.split_seed
    if cfg.run_dir is not None:
        splits = load_or_make_splits(dataset, cfg.run_dir, seed=cfg.split_seed, ratios=parse_ratios(cfg.split_ratios))
        examples, seed = select(dataset, splits, cfg.split), splits.seed
    examples = sample_examples(examples, cfg.limit, seed, balanced=cfg.train_sample == "balanced")
    if not examples:
        raise ValueError(f"--split {cfg.split}: no items to distill; use more data or another split")
    return examples, dataset.labels


def run_distill_config(cfg: DistillConfig) -> dict:
    """Validate the cheap things first (paths, rubric, data, teacher spec), then load the teacher,
    run, and write the summary (``OUT.summary.json``, and ``cfg.json_path``); returns it."""
    from labelrl.audit.judges import load_judge
    from labelrl.audit.relabel import read_rubric
    from labelrl.distill.reject import item_confidence, survival_summary
    from labelrl.distill.teacher import distill_paths, run_distill
    from labelrl.evaluate.io import read_predictions
    from labelrl.fileio import atomic_write_json, read_jsonl
    from labelrl.progress import Counter

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
    if cfg.trace_format == "constrained" and spec.is_endpoint:
        raise ValueError(f"--trace-format constrained: the teacher {cfg.teacher} is an endpoint, whose replies labelrl "
                         "cannot steer token by token; give a local teacher (a built-in model or a model directory), "
                         "or use --trace-format free")
    teacher = load_judge(spec, labels, rubric)
    if cfg.trace_format == "constrained":
        from labelrl.distill.constrained import ConstrainedTeacher

        teacher = ConstrainedTeacher(teacher, labels)
        teacher.think_budget(cfg.max_new_tokens)  # a cap too small for the tags fails before any attempt
    with Counter(len(examples), f"distilling traces from {teacher.name}") as count:
        records = run_distill(examples, labels, rubric, teacher, paths, attempts=cfg.attempts, keep=cfg.keep,
                              max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, seed=cfg.seed,
                              concurrency=cfg.concurrency if spec.is_endpoint else 1, on_item=lambda _: count.advance())
    attempts = [r for r in read_jsonl(paths.journal) if r.get("kind") == "attempt"]
    summary = survival_summary(records, confidence=confidence, attempts=attempts)
    summary.update(teacher=teacher.name, attempts=cfg.attempts, keep=cfg.keep, trace_format=cfg.trace_format,
                   trace_length_unit="characters",
                   files={"traces": str(paths.out), "attempts": str(paths.journal), "summary": str(paths.summary)})
    if not summary["overall"]["n_survived"]:  # before the summary is saved, so a rerun (the ladder's too) tries again
        raise ValueError(no_traces_message(cfg, summary, attempts))
    atomic_write_json(paths.summary, summary)
    if cfg.json_path is not None:
        atomic_write_json(cfg.json_path, summary)
    return summary


def no_traces_message(cfg: DistillConfig, summary: dict, attempts: list[dict]) -> str:
    """Why no item kept a trace, and what to change: the replies' parse outcomes say whether the
    teacher ignored the format, ran out of tokens, or answered but never the label."""
    from collections import Counter

    from labelrl.distill.teacher import distill_paths

    statuses = Counter(str(a.get("status")) for a in attempts)
    parsed = statuses.get("ok", 0)
    seen = ", ".join(f"{n} {status}" for status, n in statuses.most_common())
    fixes = [f"raise --attempts (now {cfg.attempts})"]
    if parsed < len(attempts):
        fixes.append(f"raise --max-new-tokens (now {cfg.max_new_tokens}) if replies were cut off")
        if cfg.trace_format == "free":
            fixes.append("use a teacher that follows the <think>…</think><answer>…</answer> format, or, with a local "
                         "teacher, --trace-format constrained")
    fixes.append("use a stronger teacher")
    return (f"no trace kept: 0 of {summary['overall']['n_items']} items got a reply whose answer matched its label in "
            f"{len(attempts)} attempts ({parsed} parsed; replies: {seen}); the attempts are saved in "
            f"{distill_paths(cfg.out).journal}, and a re-run reuses them. To get traces: "
            + "; ".join(fixes))
