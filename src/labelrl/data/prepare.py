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
from labelrl.data.sample import flip_labels, sample_examples, sample_record
from labelrl.data.split import load_or_make_splits, select
from labelrl.fileio import atomic_write_json
from labelrl.types import Dataset, Example

LABEL_NOISE_FILE = "label_noise.json"
SAMPLES_DIR = "samples"


@dataclass
class RunData:
    dataset: Dataset
    train: list[Example]  # the training sample (labels flipped when label_noise > 0)
    val: list[Example]
    rubric: str | None
    split_seed: int = 0  # seeds the samples drawn from the splits (e.g. the val sample of --eval-limit)


def load_checked_dataset(cfg: DataOptions) -> Dataset:
    """The dataset the options name, refused when the answer tag cannot express its labels."""
    dataset = load_dataset(cfg.data, text_cols=cfg.text_col, label_col=cfg.label_col, labels=cfg.label_list(),
                           kind=cfg.kind, on_bad_row=cfg.on_bad_row, delimiter=cfg.delimiter,
                           encoding=cfg.encoding)
    check_labels_expressible(dataset.labels)
    return dataset


def prepare_data(cfg: DataOptions, run_dir: Path, *, write: bool = True) -> RunData:
    """Load and validate the data, reuse (or make) the run directory's shared splits, flip the
    training labels ``cfg.label_noise`` asks for, and draw the training sample ``cfg.limit``
    asks for (``labelrl.data.sample``). ``write=False`` (a process other than the main one)
    leaves the files (skipped rows, flips, sample ids) to the main process; splits are read,
    and made only when missing, so the main process goes first."""
    dataset = load_checked_dataset(cfg)
    if dataset.skipped_rows and write:  # --on-bad-row skip: said and saved, never silent
        saved = write_skipped_rows(dataset, run_dir / "skipped_rows.jsonl")
        print(f"skipped {len(dataset.skipped_rows)} bad rows of {cfg.data}; the list is in {saved}", file=sys.stderr)
    splits = load_or_make_splits(dataset, run_dir, seed=cfg.split_seed, ratios=cfg.ratios())
    train = select(dataset, splits, "train")
    if not train:
        raise ValueError(f"--data {cfg.data}: the train split is empty; use more data or other --split-ratios")
    if cfg.label_noise > 0:
        train, flips = flip_labels(train, dataset.labels.labels, cfg.label_noise, splits.seed)
        if write:
            atomic_write_json(run_dir / LABEL_NOISE_FILE, noise_record(cfg.label_noise, splits.seed, len(train), flips))
    sample = sample_examples(train, cfg.limit, splits.seed)
    if write and cfg.limit is not None:
        atomic_write_json(run_dir / SAMPLES_DIR / "train.json", sample_record("train", sample, train, seed=splits.seed, limit=cfg.limit))
    rubric = None
    if cfg.rubric is not None:
        if not Path(cfg.rubric).is_file():
            raise ValueError(f"--rubric {cfg.rubric}: no such file; give the path of the rubric markdown")
        rubric = Path(cfg.rubric).read_text(encoding="utf-8")
    return RunData(dataset=dataset, train=sample, val=select(dataset, splits, "val"), rubric=rubric, split_seed=splits.seed)


def val_sample(data: RunData, limit: int | None) -> list[Example]:
    """The val items a run scores while it trains (SFT's checkpoint selection, RL's path on val):
    ``limit`` of them, a random sample stratified by label and seeded by the splits' seed
    (``labelrl.data.sample``), all when None. ``labelrl eval`` and the ladder draw their val sample
    the same way (``labelrl.evaluate.predict.load_eval_data``), so with the same limit these are
    the items the ladder's val evaluations score."""
    return sample_examples(data.val, limit, data.split_seed)


def noise_record(rate: float, seed: int, n_train: int, flips: list[dict]) -> dict:
    """``label_noise.json``: the rate asked for, the share flipped and every flip."""
    return {"label_noise": rate, "seed": seed, "n_train": n_train, "n_flipped": len(flips),
            "flipped_share": len(flips) / n_train if n_train else 0.0, "flips": flips}


def prompt_ids(tokenizer, examples: list[Example], data: RunData, mode: str) -> list[list[int]]:
    """Token ids of each example's chat prompt (generation prompt included, no answer)."""
    out = []
    for ex in examples:
        messages = render_messages(ex, labels=data.dataset.labels, mode=mode, rubric=data.rubric)
        text = render_prompt(tokenizer, messages)
        out.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return out
