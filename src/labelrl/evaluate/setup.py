"""What an evaluation needs before anything is predicted: the examples of one split
(``load_eval_data``, ``EvalData``) and the loaded model (``prepare``, ``EvalSetup``).

A run directory (``RUN_DIR`` with ``model/`` and ``splits.json``) stands for its saved model;
its data options come from ``RUN_DIR/sft_config.yaml`` or ``rl_config.yaml`` (the newer)
unless others are given, and its ``splits.json`` defines val and holdout. A bare model (a
built-in name or a model directory) needs data options and a splits directory.
``labelrl.evaluate.predict`` runs the model over the prepared split.
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import yaml

from labelrl.data import load_dataset
from labelrl.data.options import DataOptions
from labelrl.data.sample import sample_examples
from labelrl.data.split import (
    SPLIT_NAMES,
    SPLITS_FILE,
    load_or_make_splits,
    load_splits,
    select,
    splits_fingerprint,
)
from labelrl.evaluate.ledger import holdout_fingerprint
from labelrl.models.prepare import resolve_model_spec
from labelrl.types import Dataset, Example, LabelSpace

RUN_CONFIG_FILES = ("sft_config.yaml", "rl_config.yaml")


@dataclass
class EvalData:
    """The examples of one split, with what is needed to prompt for them and to cite them."""

    examples: list[Example]
    labels: LabelSpace
    options: DataOptions
    rubric: str | None
    split: str
    splits_dir: Path
    split_fingerprint: str
    label_col: str | None
    holdout_fingerprint: str | None = None  # content of the whole holdout split (labelrl.evaluate.ledger)


@dataclass
class EvalSetup:
    """A loaded model and the data it is evaluated on."""

    model_spec: str
    model: object
    tokenizer: object
    model_fingerprint: str
    data: EvalData
    dtype: object = None  # compute dtype (torch.float32 when None)


def is_run_dir(path: str | Path) -> bool:
    path = Path(path)
    return path.is_dir() and ((path / "model").is_dir() or (path / SPLITS_FILE).is_file())


def _has_run_config(path: Path) -> bool:
    return any((path / name).is_file() for name in RUN_CONFIG_FILES)


def run_data_options(run_dir: str | Path) -> DataOptions:
    """The data options a run was trained with (the newer of its sft/rl config files)."""
    found = [Path(run_dir) / name for name in RUN_CONFIG_FILES if (Path(run_dir) / name).is_file()]
    if not found:
        raise ValueError(f"{run_dir}: no {' or '.join(RUN_CONFIG_FILES)}, so its data is unknown; pass --data (and its column options)")
    path = max(found, key=lambda p: p.stat().st_mtime)
    config = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return DataOptions(**{k: v for k, v in config.items() if k in DataOptions.model_fields})


def _read_rubric(options: DataOptions) -> str | None:
    if options.rubric is None:
        return None
    if not Path(options.rubric).is_file():
        raise ValueError(f"--rubric {options.rubric}: no such file; give the path of the rubric markdown the model was trained with")
    return Path(options.rubric).read_text(encoding="utf-8")


def _load(options: DataOptions, label_col: str | None, labels: LabelSpace | None = None) -> Dataset:
    return load_dataset(
        options.data, text_cols=options.text_col, label_col=label_col,
        labels=list(labels.labels) if labels else options.label_list(),
        kind=labels.kind if labels else options.kind,
        positive=labels.positive if labels else None, on_bad_row=options.on_bad_row, delimiter=options.delimiter,
        encoding=options.encoding,
    )


def _relabel(examples: list[Example], key: Dataset, label_col: str) -> list[Example]:
    """The same examples with their label read from ``label_col`` (texts must match)."""
    by_id = {ex.id: ex for ex in key.examples}
    out = []
    for ex in examples:
        other = by_id.get(ex.id)
        if other is None or other.text != ex.text:
            raise ValueError(f"--label-col {label_col}: example {ex.id!r} has no usable label there (or its text differs); fix that column or choose another")
        out.append(dataclasses.replace(ex, label=other.label))
    return out


def load_eval_data(
    options: DataOptions, splits_dir: str | Path, split: str, *, label_col: str | None = None, limit: int | None = None
) -> EvalData:
    """The examples of ``split``, checked against ``splits_dir/splits.json`` (made when absent).

    The dataset must be the one the splits were made from (same fingerprint). With
    ``label_col``, that column is the answer key instead of the training label column. With
    ``limit``, a random sample of the split stratified by label, seeded by the splits' seed
    (``labelrl.data.sample``): every model evaluated on these splits gets the same items. The
    train split's sample is drawn as the run's training sample was (``options.train_sample``), so
    the items scored are the items trained on (without label noise, whose flips change the labels
    the sample is drawn on).
    """
    if split not in SPLIT_NAMES:
        raise ValueError(f"split {split!r}: evaluate on 'val' or 'holdout' (or 'train', for scores of the training "
                         "items, e.g. their difficulty; never a measure of skill)")
    splits_dir = Path(splits_dir)
    dataset = _load(options, options.label_col)
    if (splits_dir / SPLITS_FILE).is_file():
        splits = load_splits(splits_dir)
        if splits_fingerprint(dataset, splits.seed, splits.ratios) != splits.fingerprint:
            raise ValueError(
                f"{splits_dir / SPLITS_FILE}: made from other data than {options.data!r} with these columns "
                "(dataset fingerprints differ); evaluate with the data options the splits were made with"
            )
    else:
        splits = load_or_make_splits(dataset, splits_dir, seed=options.split_seed, ratios=options.ratios())
    examples = sample_examples(select(dataset, splits, split), limit, splits.seed,
                               balanced=split == "train" and options.train_sample == "balanced")
    if not examples:
        raise ValueError(f"split {split!r} is empty in {splits_dir}; use more data or other split ratios")
    if label_col is not None and label_col != options.label_col:
        examples = _relabel(examples, _load(options, label_col, dataset.labels), label_col)
    return EvalData(examples, dataset.labels, options, _read_rubric(options), split, splits_dir,
                    splits.fingerprint, label_col, holdout_fingerprint(select(dataset, splits, "holdout")))


def prepare(
    model_spec_or_run_dir: str,
    data_options: DataOptions | None,
    split: str,
    *,
    splits_dir: str | Path | None = None,
    label_col: str | None = None,
    limit: int | None = None,
    overrides: dict | None = None,
    precision: str = "fp32",
) -> EvalSetup:
    """Load the data, then the model, and fingerprint the model (nothing is predicted yet).
    ``precision`` (auto, fp32, bf16) is resolved for the model's device: the compute dtype of
    scoring and generation. The model is frozen (``requires_grad`` off): nothing here trains
    it, and the fast decode path keeps the packed weights of a frozen model across batches.

    ``splits_dir`` defaults to the run directory; ``data_options`` to the run's data config
    (the model's run directory first, else ``splits_dir``'s), with ``overrides`` (e.g.
    ``{"on_bad_row": "skip"}``) replacing the run's values.
    """
    run_dir = Path(model_spec_or_run_dir) if is_run_dir(model_spec_or_run_dir) else None
    if splits_dir is None:
        if run_dir is None:
            raise ValueError(f"{model_spec_or_run_dir!r} is not a run directory: pass --splits DIR (a run directory, or where splits.json and the ledger should live)")
        splits_dir = run_dir
    if data_options is None:
        config_dir = run_dir if run_dir is not None and _has_run_config(run_dir) else Path(splits_dir)
        if not _has_run_config(config_dir):
            raise ValueError(f"neither {model_spec_or_run_dir!r} nor {splits_dir} holds a run config ({' or '.join(RUN_CONFIG_FILES)}), so the data is unknown; pass --data")
        data_options = run_data_options(config_dir)
    if overrides:
        data_options = data_options.model_copy(update=overrides)
    if limit is not None and limit < 1:
        raise ValueError(f"limit={limit}: evaluate at least 1 example; drop --limit to use the whole split")
    data = load_eval_data(data_options, splits_dir, split, label_col=label_col, limit=limit)
    spec = resolve_model_spec(str(model_spec_or_run_dir))
    if run_dir is not None and spec == str(model_spec_or_run_dir):
        raise ValueError(f"{run_dir}: this run directory holds no saved model (no {run_dir / 'model'}); wait for the run to finish or pass a model")
    from labelrl.models.precision import resolve_dtype

    model, tokenizer, fingerprint = _SHARED[spec] if _SHARED is not None and spec in _SHARED else _load_frozen(spec)
    if _SHARED is not None:
        _SHARED[spec] = model, tokenizer, fingerprint
    dtype = resolve_dtype(precision, next(model.parameters()).device)
    return EvalSetup(spec, model, tokenizer, fingerprint, data, dtype)


def _load_frozen(spec: str) -> tuple:
    """(model, tokenizer, fingerprint): the model frozen, fingerprinted as saved (the ledger's
    identity), and any adapter folded into its base: one product per layer instead of the
    base's and the low-rank pair's (label-token scoring of the demo's movies val: 1.55×
    faster); the scores move by float rounding only."""
    from labelrl.models import load_model, model_fingerprint

    model, tokenizer = load_model(spec)
    model.requires_grad_(False)
    fingerprint = model_fingerprint(model)
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    return model, tokenizer, fingerprint


# The models ``prepare`` loaded within ``shared_models()`` (None outside it), by model spec.
_SHARED: dict[str, tuple] | None = None


@contextmanager
def shared_models() -> Iterator[None]:
    """Within this block ``prepare`` loads each model once: the val, holdout and out-of-domain
    evaluations of one run share its loaded model, tokenizer and fingerprint. Each load costs
    about 2.4 s at one thread (SmolLM2 with its adapter: load and fold 1.65 s, fingerprint
    0.5 s, tokenizer 0.27 s), against some 14 s to score 512 vader-movies items. Nothing an
    evaluation does changes the model (``prepare`` freezes it); the models are let go at the
    block's end, so a worker holds none between its runs."""
    global _SHARED
    outer = _SHARED
    _SHARED = {} if outer is None else outer
    try:
        yield
    finally:
        _SHARED = outer
