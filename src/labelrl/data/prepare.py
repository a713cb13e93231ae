"""The data of a training run: load and validate, reuse (or make) the run directory's splits,
take the training sample, and turn items into prompt token ids."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from labelrl.data.load import load_dataset, write_skipped_rows
from labelrl.data.options import DataOptions
from labelrl.data.prompts import (
    check_labels_expressible,
    render_messages,
    render_prompt,
)
from labelrl.data.split import load_or_make_splits, select
from labelrl.types import Dataset, Example


@dataclass
class RunData:
    dataset: Dataset
    train: list[Example]
    val: list[Example]
    rubric: str | None


def load_checked_dataset(cfg: DataOptions) -> Dataset:
    """The dataset the options name, refused when the answer tag cannot express its labels."""
    dataset = load_dataset(cfg.data, text_cols=cfg.text_col, label_col=cfg.label_col, labels=cfg.label_list(),
                           kind=cfg.kind, on_bad_row=cfg.on_bad_row)
    check_labels_expressible(dataset.labels)
    return dataset


def prepare_data(cfg: DataOptions, run_dir: Path, *, write: bool = True) -> RunData:
    """Load and validate the data, and reuse (or make) the run directory's shared splits.
    ``write=False`` (a process other than the main one) leaves the skipped-rows report to the
    main process; splits are read, and made only when missing, so the main process goes first."""
    dataset = load_checked_dataset(cfg)
    if dataset.skipped_rows and write:  # --on-bad-row skip: said and saved, never silent
        saved = write_skipped_rows(dataset, run_dir / "skipped_rows.jsonl")
        print(f"skipped {len(dataset.skipped_rows)} bad rows of {cfg.data}; the list is in {saved}", file=sys.stderr)
    splits = load_or_make_splits(dataset, run_dir, seed=cfg.split_seed)
    train = select(dataset, splits, "train")
    if cfg.limit is not None:
        train = train[: cfg.limit]
    val = select(dataset, splits, "val")
    rubric = None
    if cfg.rubric is not None:
        if not Path(cfg.rubric).is_file():
            raise ValueError(f"--rubric {cfg.rubric}: no such file; give the path of the rubric markdown")
        rubric = Path(cfg.rubric).read_text(encoding="utf-8")
    if not train:
        raise ValueError(f"--data {cfg.data}: the train split is empty; use more data or other split ratios")
    return RunData(dataset=dataset, train=train, val=val, rubric=rubric)


def prompt_ids(tokenizer, examples: list[Example], data: RunData, mode: str) -> list[list[int]]:
    """Token ids of each example's chat prompt (generation prompt included, no answer)."""
    out = []
    for ex in examples:
        messages = render_messages(ex, labels=data.dataset.labels, mode=mode, rubric=data.rubric)
        text = render_prompt(tokenizer, messages)
        out.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return out
