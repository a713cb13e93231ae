"""``DataOptions``: which data, which columns, which labels and which split a command uses.

Shared by every command that reads a dataset (``sft``, ``rl``, ``eval``, the ladder); each
field's description is the single source for ``--help`` and docs/config.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

ENCODING_HELP = ("CSV and JSONL files: the text encoding, any Python codec name (e.g. cp1252, latin-1, utf-16); "
                 "a UTF-8 byte-order mark is dropped.")


def valid_encoding(value: str | None) -> str | None:
    """``value`` when it names a text codec (``labelrl.data.load.check_encoding``); ValueError otherwise
    (worded for a config field, whose error already names the flag and the value)."""
    from labelrl.data.load import check_encoding

    if value is not None:
        try:
            check_encoding(value)
        except ValueError:
            raise ValueError("not a text encoding Python knows; give e.g. utf-8, cp1252, latin-1 or utf-16 "
                             "(any name codecs.lookup accepts)") from None
    return value


class DataOptions(BaseModel):
    """Which data, which columns, which labels, which split."""

    model_config = ConfigDict(extra="forbid")

    data: str = Field(description="Built-in dataset name (sms-spam, vader-tweets, vader-movies) or a JSONL/CSV/Parquet file or a `datasets` directory.")
    text_col: Optional[list[str]] = Field(None, description="Column(s) that fill the prompt (repeatable). Built-in datasets need none.")
    label_col: Optional[str] = Field(None, description="Column holding the label. Built-in datasets need none.")
    labels: Optional[str] = Field(None, description="Declared label set, comma-separated, in grade order for ordinal labels (e.g. 'ham,spam'). Inferred when omitted.")
    kind: Optional[Literal["binary", "categorical", "ordinal"]] = Field(None, description="Label kind; inferred when omitted.")
    on_bad_row: Literal["error", "skip"] = Field("error", description="What to do with a malformed row: stop with an error naming it, or skip it and save the list of skipped rows.")
    limit: Optional[int] = Field(None, ge=1, description="Train on a random sample of N training items, stratified by label or label-balanced (--train-sample; seeded by --split-seed, so every run of the splits gets the same items); the ids are saved in RUN_DIR/samples/train.json.")
    train_sample: Literal["stratified", "balanced"] = Field("stratified", description="How --limit draws the training sample: stratified (each label its share of the train split) or balanced (each label an equal share of the limit, all of its items when it has fewer, the rest shared among the others). With --prompt-sampling balanced, a balanced sample gives a rare label many items to cycle through rather than the few its share keeps (a 2% label: 7 of 49 items in a 320-item sample). Without --limit the whole split is used either way.")
    split_seed: int = Field(0, description="Seed of the group-aware train/val/holdout split (shared by every run in a run directory) and of the samples drawn from it.")
    split_ratios: str = Field("0.8,0.1,0.1", description="Shares of train, val and holdout, comma-separated, summing to 1 (e.g. 0.7,0.1,0.2 for a larger holdout); part of the splits' fingerprint.")
    label_noise: float = Field(0.0, ge=0, lt=1, description="Control: flip this share of the training labels (seeded as --label-noise-seed says, each to another label chosen uniformly); val and holdout keep their labels. The flips are saved in RUN_DIR/label_noise.json.")
    label_noise_seed: Literal["split", "run"] = Field("split", description="What seeds the flips of --label-noise: 'split' (the split seed: the whole train split is flipped, then the sample drawn, so every run of the splits trains on the same wrong labels) or 'run' (the sample is drawn on the true labels, then its labels are flipped with this run's --seed, so runs with other seeds train on other wrong labels).")
    train_labels: Optional[Path] = Field(None, description="JSON file whose labels replace the training sample's: id → label, or a relabel arm's answer_key.json. The sample's items stay the same (drawn on the data's own labels); an item the file has no label for keeps its own. Val and holdout keep their labels. What was trained on is saved in RUN_DIR/train_labels.json. The ladder sets it from an arm's `labels_from`.")
    delimiter: Optional[str] = Field(None, description="CSV files only: the delimiter (',', ';', tab or pipe); sniffed from the header when omitted.")
    encoding: str = Field("utf-8", description=ENCODING_HELP)
    on_long_item: Literal["truncate", "skip", "error"] = Field("truncate", description="An item whose prompt does not fit (sft: --max-length with its answer; rl: the model's context minus --max-new-tokens; eval: the context minus the answer): cut its text to fit, leave it out, or stop. The count and ids are printed before training and saved in the run directory.")
    mode: Literal["direct", "reasoning"] = Field("direct", description="Answer mode: 'direct' answers <answer>LABEL</answer> at once; 'reasoning' thinks in <think>…</think> first.")
    rubric: Optional[Path] = Field(None, description="Markdown file with the written labelling rules, included in the prompt.")

    @field_validator("split_ratios", mode="before")
    @classmethod
    def _ratios_text(cls, value: Any) -> Any:
        if isinstance(value, (list, tuple)):  # YAML lists: [0.7, 0.1, 0.2]
            return ",".join(str(v) for v in value)
        return value

    _check_encoding = field_validator("encoding")(valid_encoding)

    @field_validator("split_ratios")
    @classmethod
    def _check_ratios(cls, value: str) -> str:
        parse_ratios(value)
        return value

    @model_validator(mode="after")
    def _one_label_source(self) -> "DataOptions":
        if self.train_labels is not None and self.label_noise > 0:
            raise ValueError(f"train_labels={self.train_labels} with label_noise={self.label_noise}: flipping labels that "
                             "another answer key replaces mixes two controls; drop one of them")
        return self

    def label_list(self) -> list[str] | None:
        return [x.strip() for x in self.labels.split(",")] if self.labels else None

    def ratios(self) -> tuple[float, float, float]:
        return parse_ratios(self.split_ratios)


def parse_ratios(text: str) -> tuple[float, float, float]:
    """``"0.8,0.1,0.1"`` → (0.8, 0.1, 0.1), checked by ``labelrl.data.split.check_ratios``."""
    from labelrl.data.split import check_ratios

    try:
        values = [float(x) for x in str(text).split(",")]
    except ValueError:
        raise ValueError(f"split_ratios={text!r}: give three numbers separated by commas, e.g. 0.8,0.1,0.1") from None
    return check_ratios(values)
