"""The data of a training run: load and validate, reuse (or make) the run directory's splits,
take the training sample, and turn items into prompt token ids."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from labelrl.data.load import load_dataset, write_skipped_rows
from labelrl.data.options import DataOptions
from labelrl.data.prompts import (
    check_labels_expressible,
    render_messages,
    render_prompt,
)
from labelrl.data.sample import flip_labels, sample_examples, sample_record
from labelrl.data.split import load_or_make_splits, select
from labelrl.data.train_labels import TRAIN_LABELS_FILE, read_label_key, replace_labels
from labelrl.fileio import atomic_write_json
from labelrl.types import Dataset, Example

LABEL_NOISE_FILE = "label_noise.json"
SAMPLES_DIR = "samples"


@dataclass
class RunData:
    dataset: Dataset
    train: list[Example]  # the training sample (labels flipped when label_noise > 0, or from train_labels)
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
    """Load and validate the data, reuse (or make) the run directory's shared splits, draw the
    training sample ``cfg.limit`` asks for (``labelrl.data.sample``) with the label noise
    ``cfg.label_noise`` asks for (``draw_training_sample``), and take its labels from
    ``cfg.train_labels`` when given (``labelrl.data.train_labels``). ``write=False`` (a process
    other than the main one) leaves the files (skipped rows, flips, sample ids, training labels)
    to the main process; splits are read, and made only when missing, so the main process goes
    first. ``label_noise_seed: run`` flips with ``cfg.seed``, the seed of a training command."""
    dataset = load_checked_dataset(cfg)
    if dataset.skipped_rows and write:  # --on-bad-row skip: said and saved, never silent
        saved = write_skipped_rows(dataset, run_dir / "skipped_rows.jsonl")
        print(f"skipped {len(dataset.skipped_rows)} bad rows of {cfg.data}; the list is in {saved}", file=sys.stderr)
    splits = load_or_make_splits(dataset, run_dir, seed=cfg.split_seed, ratios=cfg.ratios())
    train = select(dataset, splits, "train")
    if not train:
        raise ValueError(f"--data {cfg.data}: the train split is empty; use more data or other --split-ratios")
    drawn = draw_training_sample(train, dataset.labels.labels, limit=cfg.limit, split_seed=splits.seed,
                                 rate=cfg.label_noise, noise_seed=cfg.label_noise_seed, run_seed=getattr(cfg, "seed", None),
                                 balanced=cfg.train_sample == "balanced")
    sample = drawn.examples
    if write and drawn.noise is not None:
        atomic_write_json(run_dir / LABEL_NOISE_FILE, drawn.noise)
    if write and cfg.limit is not None:
        atomic_write_json(run_dir / SAMPLES_DIR / "train.json", drawn.record)
    if cfg.train_labels is not None:
        sample, relabelled = replace_labels(sample, read_label_key(cfg.train_labels), dataset.labels, str(cfg.train_labels))
        if write:
            atomic_write_json(run_dir / TRAIN_LABELS_FILE, relabelled)
    rubric = None
    if cfg.rubric is not None:
        if not Path(cfg.rubric).is_file():
            raise ValueError(f"--rubric {cfg.rubric}: no such file; give the path of the rubric markdown")
        rubric = Path(cfg.rubric).read_text(encoding="utf-8")
    return RunData(dataset=dataset, train=sample, val=select(dataset, splits, "val"), rubric=rubric, split_seed=splits.seed)


@dataclass
class TrainingSample:
    examples: list[Example]  # what the run trains on (labels flipped when there is label noise)
    record: dict  # sample_record of the items drawn: ids, label counts as drawn next to the split's
    noise: dict | None  # noise_record (LABEL_NOISE_FILE), None without label noise


def draw_training_sample(train: list[Example], labels: Sequence[str], *, limit: int | None, split_seed: int,
                         rate: float, noise_seed: str = "split", run_seed: int | None = None,
                         balanced: bool = False) -> TrainingSample:
    """The training sample of a run, with a share ``rate`` of its labels flipped; ``balanced``:
    drawn label-balanced rather than stratified (``labelrl.data.sample.allocate_balanced``).

    ``noise_seed="split"``: the whole train split is flipped with the split seed, then the sample
    is drawn (stratified by the flipped labels): every run of the splits, whatever its seed,
    trains on the same wrong labels. ``"run"``: the sample is drawn on the true labels (the same
    items for every run), then its labels are flipped with ``run_seed``, so replicate runs
    (other seeds) train on other wrong labels: the control for "the same wrong signal on every
    visit" versus noise that changes from run to run."""
    if rate > 0 and noise_seed == "split":
        pool, flips = flip_labels(train, labels, rate, split_seed)
        sample = sample_examples(pool, limit, split_seed, balanced=balanced)
        return TrainingSample(sample, sample_record("train", sample, pool, seed=split_seed, limit=limit, balanced=balanced),
                              noise_record(rate, split_seed, len(pool), flips, noise_seed))
    sample = sample_examples(train, limit, split_seed, balanced=balanced)
    record = sample_record("train", sample, train, seed=split_seed, limit=limit, balanced=balanced)
    if rate == 0:
        return TrainingSample(sample, record, None)
    if run_seed is None:
        raise ValueError("label_noise_seed=run: the flips are seeded by the run's seed, and this command has none; "
                         "use label_noise_seed=split")
    flipped, flips = flip_labels(sample, labels, rate, run_seed)
    return TrainingSample(flipped, record, noise_record(rate, run_seed, len(sample), flips, noise_seed))


def val_sample(data: RunData, limit: int | None) -> list[Example]:
    """The val items a run scores while it trains (SFT's checkpoint selection, RL's path on val):
    ``limit`` of them, a random sample stratified by label and seeded by the splits' seed
    (``labelrl.data.sample``), all when None. ``labelrl eval`` and the ladder draw their val sample
    the same way (``labelrl.evaluate.setup.load_eval_data``), so with the same limit these are
    the items the ladder's val evaluations score."""
    return sample_examples(data.val, limit, data.split_seed)


def noise_record(rate: float, seed: int, n_train: int, flips: list[dict], noise_seed: str = "split") -> dict:
    """``label_noise.json``: the rate asked for, what seeded the flips (the split's or the run's
    ``seed``), the share flipped among the ``n_train`` items drawn from, and every flip."""
    return {"label_noise": rate, "label_noise_seed": noise_seed, "seed": seed, "n_train": n_train, "n_flipped": len(flips),
            "flipped_share": len(flips) / n_train if n_train else 0.0, "flips": flips}


def prompt_ids(tokenizer, examples: list[Example], data: RunData, mode: str) -> list[list[int]]:
    """Token ids of each example's chat prompt (generation prompt included, no answer)."""
    out = []
    for ex in examples:
        messages = render_messages(ex, labels=data.dataset.labels, mode=mode, rubric=data.rubric)
        text = render_prompt(tokenizer, messages)
        out.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return out
