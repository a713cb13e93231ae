"""``labelrl eval`` as a function: evaluate a model on one split, write the predictions, the
metrics JSON and the reliability plot, and record the evaluation in the ledger.

The command module only parses options and prints; the ladder calls ``evaluate_and_write``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from labelrl.data.options import valid_encoding

from labelrl.models.precision import PRECISION_HELP


class EvalConfig(BaseModel):
    """Options of ``labelrl eval``; each description is the option's --help text."""

    model_config = ConfigDict(extra="forbid")

    run_or_model: str = Field(description="A run directory (its saved model, data config and splits) or a model: a built-in name or a model directory.")
    split: Literal["val", "holdout", "train"] = Field("val", description="Which split to evaluate on. Holdout evaluations are recorded in the ledger: one look per model, which a second method's reading of the same model joins (reading a method again is a repeat); train gives the training items' scores (their difficulty), is never recorded and measures nothing.")
    data: Optional[str] = Field(None, description="Data to evaluate on (default: the run's data config). Built-in name or JSONL/CSV/Parquet file.")
    text_col: list[str] = Field(default_factory=list, description="With --data: text column(s) of the prompt (repeatable).")
    label_col: Optional[str] = Field(None, description="The answer key: any label column (e.g. relabelled vs original labels). With --data it is also the data's label column.")
    labels: Optional[str] = Field(None, description="With --data: the label set, comma-separated, in grade order for ordinal labels.")
    kind: Optional[Literal["binary", "categorical", "ordinal"]] = Field(None, description="With --data: the label kind (inferred when omitted).")
    mode: Optional[Literal["direct", "reasoning"]] = Field(None, description="With --data: the answer mode the model was trained for (default: direct).")
    rubric: Optional[Path] = Field(None, description="With --data: the rubric file the model was trained with.")
    split_seed: int = Field(0, description="With --data and no splits.json yet: seed of the split made in --splits.")
    split_ratios: str = Field("0.8,0.1,0.1", description="With --data and no splits.json yet: shares of train, val and holdout of the split made in --splits.")
    on_bad_row: Optional[Literal["error", "skip"]] = Field(None, description="What to do with a malformed row: stop with an error naming it, or skip it (default: the run's choice, else error).")
    delimiter: Optional[str] = Field(None, description="CSV files only: the delimiter (',', ';', tab or pipe) (default: the run's, else sniffed from the header).")
    encoding: Optional[str] = Field(None, description="CSV and JSONL files: the text encoding, any Python codec name (e.g. cp1252, latin-1) (default: the run's, else utf-8).")
    on_long_item: Optional[Literal["truncate", "skip", "error"]] = Field(None, description="An item whose prompt and answer do not fit the model's context: cut its text to fit, leave it out, or stop (default: the run's choice, else truncate). The count and ids are printed and saved with the predictions.")
    splits: Optional[Path] = Field(None, description="Directory of splits.json and ledger.jsonl (default: the run directory); needed for a bare model.")
    method: Optional[Literal["scores", "generate"]] = Field(None, description="scores: label-token probabilities (direct models); generate: greedy decoding parsed strictly (default: scores for direct mode, generate for reasoning).")
    out: Optional[Path] = Field(None, description="Predictions file (.parquet or .csv) (default: SPLITS_DIR/eval/NAME-SPLIT.parquet).")
    json_path: Optional[Path] = Field(None, description="Write the metrics, the ledger record and the file paths to this JSON file.")
    allow_repeat_holdout: bool = Field(False, description="Evaluate a model on the holdout again; the result is recorded and marked as a repeat.")
    limit: Optional[int] = Field(None, ge=1, description="Evaluate a random sample of N examples of the split, stratified by label and seeded by the splits' seed (every model gets the same items).")
    n_boot: int = Field(1000, ge=0, description="Bootstrap resamples for the 95% intervals (0: none).")
    seed: int = Field(0, description="Seed of the bootstrap.")
    batch_size: int = Field(16, ge=1, description="Prompts per forward pass (label-token scoring on the packed weights of a Llama, Qwen or Gemma 3 model takes at least 32).")
    max_new_tokens: Optional[int] = Field(None, ge=1, description="generate: token cap per answer (default: direct 8 past the longest answer tag, reasoning 256); a cap that cannot hold the longest answer tag and its end-of-text token is refused before anything is scored.")
    pass_at_k: Optional[int] = Field(None, ge=1, description="Instead of scoring, sample --pass-samples answers per item at temperature 1 and report pass@k (unbiased estimator): does the model ever sample the right label in k tries? val or train only.")
    pass_samples: int = Field(8, ge=1, description="--pass-at-k: answers sampled per item (n ≥ k).")
    precision: Literal["auto", "fp32", "bf16"] = Field("auto", description=PRECISION_HELP)

    _check_encoding = field_validator("encoding")(valid_encoding)

    @field_validator("out")
    @classmethod
    def _out_is_a_predictions_file(cls, out: Optional[Path]) -> Optional[Path]:
        from labelrl.evaluate.io import check_predictions_path

        return None if out is None else check_predictions_path(out)

    @model_validator(mode="after")
    def _data_flags_need_data(self) -> "EvalConfig":
        given = [f"--{n.replace('_', '-')}" for n in ("text_col", "labels", "kind", "mode", "rubric") if getattr(self, n)]
        if self.data is None and given:
            raise ValueError(f"{', '.join(given)} describe the data and only apply with --data; drop them or add --data")
        return self

    def data_overrides(self) -> dict:
        """The data options given here that replace a run's own (with or without --data)."""
        return {k: getattr(self, k) for k in ("on_bad_row", "delimiter", "encoding", "on_long_item") if getattr(self, k) is not None}

    def data_options(self):
        from labelrl.data.options import DataOptions

        if self.data is None:
            return None
        return DataOptions(data=self.data, text_col=self.text_col or None, label_col=self.label_col, labels=self.labels,
                           kind=self.kind, mode=self.mode or "direct", rubric=self.rubric, split_seed=self.split_seed,
                           split_ratios=self.split_ratios, **self.data_overrides())


def default_out(setup, split: str) -> Path:
    """``SPLITS_DIR/eval/NAME-SPLIT.parquet``, NAME the run (or model) directory's name."""
    spec = Path(setup.model_spec)
    name = spec.parent.name if spec.name == "model" else spec.name
    return Path(setup.data.splits_dir) / "eval" / f"{name}-{split}.parquet"


def beside(path: Path, suffix: str) -> Path:
    """``path`` with its suffix replaced: ``x.json`` → ``x.reliability.png``."""
    return path.with_name(path.name.removesuffix(path.suffix) + suffix)


def evaluate_and_write(setup, cfg: EvalConfig) -> dict:
    """Evaluate a prepared setup (``labelrl.evaluate.setup.prepare``) and write its files:
    the predictions, the reliability plot (scored models), ``cfg.json_path``. Returns
    ``{"metrics", "info", "ledger", "files"}`` (the JSON file's content)."""
    from labelrl.evaluate.io import write_predictions
    from labelrl.evaluate.ledger import ledger_path
    from labelrl.evaluate.plots import plot_reliability
    from labelrl.evaluate.predict import evaluate_split
    from labelrl.fileio import atomic_write_json

    out = cfg.out or default_out(setup, cfg.split)
    paths = {"predictions": str(Path(out).resolve()), "report": str(Path(cfg.json_path).resolve()) if cfg.json_path else None}
    result = evaluate_split(setup, method=cfg.method, allow_repeat_holdout=cfg.allow_repeat_holdout, n_boot=cfg.n_boot,
                            seed=cfg.seed, batch_size=cfg.batch_size, max_new_tokens=cfg.max_new_tokens,
                            record_extra={"files": paths})
    pred, metrics = result.predictions, result.metrics
    write_predictions(pred, out)
    files = {"predictions": str(out), "reliability_png": None, "json": str(cfg.json_path) if cfg.json_path else None,
             "ledger": str(ledger_path(setup.data.splits_dir))}
    if "reliability" in metrics:
        files["reliability_png"] = str(plot_reliability(metrics, beside(cfg.json_path or out, ".reliability.png")))
    report = {"metrics": metrics, "info": pred.info, "ledger": result.record, "files": files}
    if cfg.json_path is not None:
        atomic_write_json(cfg.json_path, report)
    return report


def run_eval(cfg: EvalConfig) -> dict:
    """Load the data and the model ``cfg`` names, then ``evaluate_and_write`` (or, with
    ``pass_at_k``, ``pass_at_k_and_write``); ValueError for bad input."""
    from labelrl.evaluate.setup import prepare

    if cfg.pass_at_k is not None:
        refuse_pass_at_k_on_holdout(cfg.split)
    setup = prepare(cfg.run_or_model, cfg.data_options(), cfg.split, splits_dir=cfg.splits,
                    label_col=cfg.label_col, limit=cfg.limit, overrides=cfg.data_overrides(), precision=cfg.precision)
    if cfg.pass_at_k is not None:
        return pass_at_k_and_write(setup, cfg)
    return evaluate_and_write(setup, cfg)


def refuse_pass_at_k_on_holdout(split: str) -> None:
    """pass@k is never a holdout reading: it samples each item many times and keeps the best of
    k, and it is not recorded in the ledger, so on the holdout it would be an unrecorded look."""
    if split == "holdout":
        raise ValueError("--pass-at-k samples the model many times per item and reports the best of k; run it on "
                         "--split val (the holdout is for each final model's one look)")


def pass_at_k_and_write(setup, cfg: EvalConfig) -> dict:
    """pass@k of a prepared setup (``labelrl.evaluate.passk``), written to ``cfg.json_path`` or
    ``SPLITS_DIR/eval/NAME-SPLIT-pass.json``; returns ``{"pass_at_k", "files"}``. A holdout setup
    is refused (``refuse_pass_at_k_on_holdout``)."""
    from labelrl.evaluate.passk import sample_pass_at_k
    from labelrl.fileio import atomic_write_json

    refuse_pass_at_k_on_holdout(setup.data.split)

    result = sample_pass_at_k(setup, k=cfg.pass_at_k, n=cfg.pass_samples, max_new_tokens=cfg.max_new_tokens,
                              seed=cfg.seed, batch_size=max(1, cfg.batch_size // cfg.pass_samples), n_boot=cfg.n_boot)
    path = cfg.json_path or beside(default_out(setup, cfg.split), "-pass.json")
    report = {"pass_at_k": result, "files": {"json": str(path)}}
    atomic_write_json(path, report)
    return report
