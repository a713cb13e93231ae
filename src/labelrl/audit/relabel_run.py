"""``labelrl relabel`` as a function: its config, and the run (rubric, items, judges, phases,
summary). The command module parses options and prints; the ladder's relabel arms call
``run_relabel_config``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal, Optional

from pydantic import BaseModel, Field, field_validator, model_validator

from labelrl.audit.judge_types import DEFAULT_API_KEY_ENV, JudgeSpec
from labelrl.data.options import ENCODING_HELP, valid_encoding

SPEC_HELP = "a local model (anything load_model takes, e.g. tiny-random or a model directory) or an OpenAI-compatible endpoint URL http://HOST:PORT/v1"


class RelabelConfig(BaseModel):
    """Options of ``labelrl relabel``; each description is the option's --help text."""

    data: str = Field(description="A built-in dataset or a .jsonl, .csv or .parquet file to relabel.")
    rubric: Path = Field(description="Text or Markdown file with the labelling rules the judge applies.")
    judge: str = Field(description=f"The judge: {SPEC_HELP}.")
    judge_model: Optional[str] = Field(None, description="Model name to request from an endpoint --judge (the name the server serves: vLLM's --served-model-name, else the path it was started with; GET URL/models lists them).")
    adjudicator: Optional[str] = Field(None, description=f"Decides the items the judge is unsure of (a stronger model): {SPEC_HELP}.")
    adjudicator_model: Optional[str] = Field(None, description="Model name to request from an endpoint --adjudicator (the name the server serves: vLLM's --served-model-name, else the path it was started with; GET URL/models lists them).")
    min_confidence: float = Field(0.7, description="Items whose judge confidence is below this (or missing) go to the adjudicator.")
    self_agreement_sample: int = Field(200, description="How many random items the judge labels a second time (an independent seeded sample) to measure its self-agreement; 0 skips it. Fewer than a few hundred give wide intervals.")
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
    only_ids: Optional[Path] = Field(None, description="JSON file with a list of item ids: relabel only those items (e.g. the samples a ladder task uses).")
    on_bad_row: Literal["error", "skip"] = Field("error", description="What to do with a malformed row: stop with an error naming it, or leave it out of the output and list it in OUT.skipped_rows.jsonl.")
    delimiter: Optional[str] = Field(None, description="CSV files only: the delimiter (',', ';', tab or pipe); sniffed from the header when omitted.")
    encoding: str = Field("utf-8", description=ENCODING_HELP)
    json_path: Optional[Path] = Field(None, description="Also write the summary to this JSON file (it is always saved as OUT.summary.json).")

    _check_encoding = field_validator("encoding")(valid_encoding)

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


def run_relabel_config(cfg: RelabelConfig, progress_console=None) -> dict:
    """Validate everything cheap first (rubric, data, paths, judge specs), then load the judges
    and run; ValueError / JudgeError / OSError for bad input or an unreachable endpoint. Returns
    the summary (also saved as ``OUT.summary.json``)."""
    from labelrl.audit.judges import load_judge
    from labelrl.audit.relabel import output_paths, read_rubric, run_relabel

    rubric = read_rubric(cfg.rubric)
    items = _items(cfg)
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
    return summary


def _items(cfg: RelabelConfig):
    from labelrl.audit.relabel import load_items

    only = _read_ids(cfg.only_ids) if cfg.only_ids is not None else None
    return load_items(cfg.data, text_cols=cfg.text_col, label_col=cfg.label_col, labels=cfg.labels, limit=cfg.limit,
                      on_bad_row=cfg.on_bad_row, delimiter=cfg.delimiter, encoding=cfg.encoding,
                      only_ids=only)


def final_labels(cfg: RelabelConfig) -> dict[str, str | None]:
    """Item id → ``label_final`` of a finished relabel run (its output rows are in item order)."""
    from labelrl.audit.relabel import output_paths

    items = _items(cfg)
    return {ex.id: row.get("label_final") for ex, row in zip(items.examples, _read_rows(output_paths(items, cfg.out).out))}


def _read_ids(path: Path) -> list[str]:
    if not Path(path).is_file():
        raise ValueError(f"--only-ids {path}: no such file; give a JSON file holding a list of item ids")
    ids = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(ids, list):
        raise ValueError(f"--only-ids {path}: expected a JSON list of item ids")
    return [str(i) for i in ids]


def _read_rows(path: Path) -> list[dict]:
    """The relabelled rows, in item order (JSONL or Parquet)."""
    if Path(path).suffix.lower() == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
