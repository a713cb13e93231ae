"""``labelrl eval`` as a function: evaluate a model on one split, write the predictions, the
metrics JSON and the reliability plot, and record the evaluation in the ledger.

The command module only parses options and prints; the ladder calls ``evaluate_and_write``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

from labelrl.models.precision import PRECISION_HELP


class EvalConfig(BaseModel):
    """Options of ``labelrl eval``; each description is the option's --help text."""

    model_config = ConfigDict(extra="forbid")

    run_or_model: str = Field(description="A run directory (its saved model, data config and splits) or a model: a built-in name or a model directory.")
    split: Literal["val", "holdout"] = Field("val", description="Which split to evaluate on. Holdout evaluations are recorded in the ledger, once per model.")
    data: Optional[str] = Field(None, description="Data to evaluate on (default: the run's data config). Built-in name or JSONL/CSV/Parquet file.")
    text_col: list[str] = Field(default_factory=list, description="With --data: text column(s) of the prompt (repeatable).")
    label_col: Optional[str] = Field(None, description="The answer key: any label column (e.g. relabelled vs original labels). With --data it is also the data's label column.")
    labels: Optional[str] = Field(None, description="With --data: the label set, comma-separated, in grade order for ordinal labels.")
    kind: Optional[Literal["binary", "categorical", "ordinal"]] = Field(None, description="With --data: the label kind (inferred when omitted).")
    mode: Optional[Literal["direct", "reasoning"]] = Field(None, description="With --data: the answer mode the model was trained for (default: direct).")
    rubric: Optional[Path] = Field(None, description="With --data: the rubric file the model was trained with.")
    split_seed: int = Field(0, description="With --data and no splits.json yet: seed of the split made in --splits.")
    splits: Optional[Path] = Field(None, description="Directory of splits.json and ledger.jsonl (default: the run directory); needed for a bare model.")
    method: Optional[Literal["scores", "generate"]] = Field(None, description="scores: label-token probabilities (direct models); generate: greedy decoding parsed strictly (default: scores for direct mode, generate for reasoning).")
    out: Optional[Path] = Field(None, description="Predictions file (.parquet or .csv) (default: SPLITS_DIR/eval/NAME-SPLIT.parquet).")
    json_path: Optional[Path] = Field(None, description="Write the metrics, the ledger record and the file paths to this JSON file.")
    allow_repeat_holdout: bool = Field(False, description="Evaluate a model on the holdout again; the result is recorded and marked as a repeat.")
    limit: Optional[int] = Field(None, ge=1, description="Evaluate only the first N examples of the split.")
    n_boot: int = Field(1000, ge=0, description="Bootstrap resamples for the 95% intervals (0: none).")
    seed: int = Field(0, description="Seed of the bootstrap.")
    batch_size: int = Field(16, ge=1, description="Prompts per forward pass.")
    max_new_tokens: Optional[int] = Field(None, ge=1, description="generate: token cap per answer (default: direct 8 past the longest answer tag, reasoning 256).")
    precision: Literal["auto", "fp32", "bf16"] = Field("auto", description=PRECISION_HELP)

    @model_validator(mode="after")
    def _data_flags_need_data(self) -> "EvalConfig":
        given = [f"--{n.replace('_', '-')}" for n in ("text_col", "labels", "kind", "mode", "rubric") if getattr(self, n)]
        if self.data is None and given:
            raise ValueError(f"{', '.join(given)} describe the data and only apply with --data; drop them or add --data")
        return self

    def data_options(self):
        from labelrl.data.options import DataOptions

        if self.data is None:
            return None
        return DataOptions(data=self.data, text_col=self.text_col or None, label_col=self.label_col, labels=self.labels,
                           kind=self.kind, mode=self.mode or "direct", rubric=self.rubric, split_seed=self.split_seed)


def default_out(setup, split: str) -> Path:
    """``SPLITS_DIR/eval/NAME-SPLIT.parquet``, NAME the run (or model) directory's name."""
    spec = Path(setup.model_spec)
    name = spec.parent.name if spec.name == "model" else spec.name
    return Path(setup.data.splits_dir) / "eval" / f"{name}-{split}.parquet"


def beside(path: Path, suffix: str) -> Path:
    """``path`` with its suffix replaced: ``x.json`` → ``x.reliability.png``."""
    return path.with_name(path.name.removesuffix(path.suffix) + suffix)


def evaluate_and_write(setup, cfg: EvalConfig) -> dict:
    """Evaluate a prepared setup (``labelrl.evaluate.predict.prepare``) and write its files:
    the predictions, the reliability plot (scored models), ``cfg.json_path``. Returns
    ``{"metrics", "info", "ledger", "files"}`` (the JSON file's content)."""
    from labelrl.evaluate.io import write_predictions
    from labelrl.evaluate.ledger import ledger_path
    from labelrl.evaluate.plots import plot_reliability
    from labelrl.evaluate.predict import evaluate_split
    from labelrl.fileio import atomic_write_json

    result = evaluate_split(setup, method=cfg.method, allow_repeat_holdout=cfg.allow_repeat_holdout, n_boot=cfg.n_boot,
                            seed=cfg.seed, batch_size=cfg.batch_size, max_new_tokens=cfg.max_new_tokens)
    pred, metrics = result.predictions, result.metrics
    out = cfg.out or default_out(setup, cfg.split)
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
    """Load the data and the model ``cfg`` names, then ``evaluate_and_write``; ValueError for bad input."""
    from labelrl.evaluate.predict import prepare

    setup = prepare(cfg.run_or_model, cfg.data_options(), cfg.split, splits_dir=cfg.splits,
                    label_col=cfg.label_col, limit=cfg.limit, precision=cfg.precision)
    return evaluate_and_write(setup, cfg)
