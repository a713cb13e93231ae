"""Predictions tables: the file every analysis after ``labelrl eval`` works from.

Columns (one row per example):

* ``id`` (string), ``label`` (the answer key), ``prediction`` (a label, or null when the
  answer did not parse), ``parse_status`` (``ok`` or a ``labelrl.rewards.ParseStatus`` value);
* scored models only: ``score`` = P(positive label) for binary tasks, or ``score_<label>``
  for every label (rows sum to 1). A CSV file, which has no metadata to name the positive
  label, holds a binary task's scores as ``score_<label>`` columns too.

Parquet files written here carry the label space and the evaluation's provenance (model
and split fingerprints) in the schema metadata under ``labelrl``. Files from elsewhere
(Parquet or CSV with the columns above) work too: their labels are inferred from the
``label``, ``prediction`` and ``score_<label>`` values (integers in numeric order, else
sorted), two labels make a binary task whose positive label is the second one (``1`` of
0/1, ``spam`` of ham/spam, ``yes`` of no/yes) unless ``positive_label`` says otherwise.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from labelrl.data.schema import infer_kind, infer_labels
from labelrl.fileio import atomic_write_bytes
from labelrl.types import LabelSpace, canonical_label

REQUIRED_COLUMNS = ("id", "label", "prediction")
META_KEY = b"labelrl"
SCORE = "score"
SCORE_PREFIX = "score_"


@dataclass
class Predictions:
    """A predictions table, its label space and where it came from (``info``).

    The table is treated as immutable: ``ids``, ``y_true`` and ``y_pred`` are read once.
    """

    table: pa.Table
    labels: LabelSpace
    info: dict = field(default_factory=dict)

    @property
    def n(self) -> int:
        return self.table.num_rows

    @cached_property
    def ids(self) -> list[str]:
        return self.table.column("id").to_pylist()

    @cached_property
    def y_true(self) -> list[str]:
        return self.table.column("label").to_pylist()

    @cached_property
    def y_pred(self) -> list[str | None]:
        return self.table.column("prediction").to_pylist()

    def scores(self) -> np.ndarray | None:
        """[N, K] probabilities in label order, or None for an unscored model."""
        names = self.table.column_names
        if all(f"{SCORE_PREFIX}{label}" in names for label in self.labels.labels):
            cols = [self.table.column(f"{SCORE_PREFIX}{label}").to_numpy(zero_copy_only=False) for label in self.labels.labels]
            return np.stack(cols, axis=1).astype(np.float64)
        if SCORE in names:
            if self.labels.kind != "binary":
                raise ValueError(f"column 'score' needs a binary task, but the labels are {list(self.labels.labels)}; write one score_<label> column per label")
            p = self.table.column(SCORE).to_numpy(zero_copy_only=False).astype(np.float64)
            pos = self.labels.index(self.labels.positive_label)
            return np.stack([1 - p, p] if pos == 1 else [p, 1 - p], axis=1)
        return None

    def take(self, rows: Sequence[int]) -> "Predictions":
        return Predictions(self.table.take(pa.array(list(rows), type=pa.int64())), self.labels, dict(self.info))


def predictions_table(
    ids: Sequence[str],
    y_true: Sequence[str],
    y_pred: Sequence[str | None],
    parse_status: Sequence[str],
    labels: LabelSpace,
    probs: np.ndarray | None = None,
) -> pa.Table:
    """Build the table; ``probs [N, K]`` become ``score`` (binary) or ``score_<label>`` columns."""
    columns = {
        "id": pa.array([str(i) for i in ids], pa.string()),
        "label": pa.array(list(y_true), pa.string()),
        "prediction": pa.array(list(y_pred), pa.string()),
        "parse_status": pa.array(list(parse_status), pa.string()),
    }
    if probs is not None:
        probs = np.asarray(probs, dtype=np.float64)
        if labels.kind == "binary":
            columns[SCORE] = pa.array(probs[:, labels.index(labels.positive_label)], pa.float64())
        else:
            for k, label in enumerate(labels.labels):
                columns[f"{SCORE_PREFIX}{label}"] = pa.array(probs[:, k], pa.float64())
    return pa.table(columns)


PREDICTION_SUFFIXES = (".parquet", ".pq", ".csv")  # what write_predictions writes


def check_predictions_path(path: str | Path) -> Path:
    """``path`` when ``write_predictions`` can write it (by suffix), else a ValueError that names it:
    checked before an evaluation runs, so a bad --out costs no scoring and no holdout look."""
    path = Path(path)
    if path.suffix.lower() not in PREDICTION_SUFFIXES:
        raise ValueError(f"{path}: predictions are written as .parquet or .csv; change the file extension "
                         f"(e.g. {path.with_name(path.name + '.parquet')})")
    return path


def _self_describing(pred: Predictions) -> pa.Table:
    """The table a CSV file holds: a binary task's ``score`` (P(the positive label), which only
    Parquet's metadata names) as one ``score_<label>`` column per label, so that a reader who
    takes the other label as positive still reads each label's own probability."""
    if pred.labels.kind != "binary" or SCORE not in pred.table.column_names:
        return pred.table
    probs = pred.scores()
    table = pred.table.drop_columns([SCORE])
    for k, label in enumerate(pred.labels.labels):
        table = table.append_column(f"{SCORE_PREFIX}{label}", pa.array(probs[:, k], pa.float64()))
    return table


def write_predictions(pred: Predictions, path: str | Path) -> Path:
    """Write Parquet (label space and provenance in the metadata) or CSV (by suffix), atomically."""
    path = check_predictions_path(path)
    sink = pa.BufferOutputStream()
    if path.suffix.lower() == ".csv":
        pacsv.write_csv(_self_describing(pred), sink)
    else:
        meta = {"labels": list(pred.labels.labels), "kind": pred.labels.kind,
                "positive": pred.labels.positive, "info": pred.info}
        table = pred.table.replace_schema_metadata({META_KEY: json.dumps(meta, default=str).encode()})
        pq.write_table(table, sink)
    atomic_write_bytes(path, sink.getvalue().to_pybytes())
    return path


def _read_table(path: Path) -> tuple[pa.Table, dict]:
    if not path.is_file():
        raise ValueError(f"{path}: no such predictions file; write one with `labelrl eval --out FILE.parquet`")
    try:
        if path.suffix.lower() == ".csv":
            options = pacsv.ConvertOptions(strings_can_be_null=True)
            return pacsv.read_csv(path, convert_options=options), {}
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise ValueError(f"{path}: not a readable Parquet or CSV file ({exc})") from None
    raw = (table.schema.metadata or {}).get(META_KEY)
    return table, (json.loads(raw) if raw else {})


def _as_strings(table: pa.Table, name: str) -> pa.Table:
    column = table.column(name)
    if not pa.types.is_string(column.type):
        column = column.cast(pa.string())
    return table.set_column(table.column_names.index(name), name, column)


def _infer_space(table: pa.Table, path: Path, positive_label: str | None) -> LabelSpace:
    observed = [v for v in table.column("label").to_pylist() + table.column("prediction").to_pylist() if v is not None]
    observed += [n[len(SCORE_PREFIX):] for n in table.column_names if n.startswith(SCORE_PREFIX)]
    names = infer_labels(observed)
    if len(names) < 2:
        raise ValueError(f"{path}: found only the label(s) {list(names)}; predictions need at least 2 labels")
    kind = infer_kind(names)
    return LabelSpace(names, kind=kind, positive=_positive(names, kind, positive_label, path))


def _positive(names: Sequence[str], kind: str, positive_label: str | None, path: Path) -> str | None:
    if positive_label is None or kind != "binary":
        return None
    match = [n for n in names if canonical_label(n) == canonical_label(positive_label)]
    if not match:
        raise ValueError(f"--positive-label {positive_label!r} is not one of the labels {list(names)} in {path}")
    return match[0]


def read_predictions(path: str | Path, *, positive_label: str | None = None) -> Predictions:
    """Read a predictions Parquet/CSV and check it (columns, unique ids, known labels)."""
    path = Path(path)
    table, meta = _read_table(path)
    missing = [c for c in REQUIRED_COLUMNS if c not in table.column_names]
    if missing:
        raise ValueError(f"{path}: missing column(s) {missing}; a predictions file needs {list(REQUIRED_COLUMNS)} (and score or score_<label> for scored models)")
    for name in ("id", "label", "prediction", *(["parse_status"] if "parse_status" in table.column_names else [])):
        table = _as_strings(table, name)
    if "parse_status" not in table.column_names:
        status = ["ok" if p is not None else "no_answer" for p in table.column("prediction").to_pylist()]
        table = table.append_column("parse_status", pa.array(status, pa.string()))
    ids = table.column("id").to_pylist()
    if None in ids or len(set(ids)) != len(ids) or None in table.column("label").to_pylist():
        raise ValueError(f"{path}: every row needs a label and a distinct, non-empty id (rows are joined on id)")
    if meta:
        names = tuple(meta["labels"])
        positive = _positive(names, meta["kind"], positive_label, path) or meta.get("positive")
        space = LabelSpace(names, kind=meta["kind"], positive=positive)
        written = LabelSpace(names, kind=meta["kind"], positive=meta.get("positive"))
        if space.kind == "binary" and space.positive_label != written.positive_label and SCORE in table.column_names:
            # the file's score is P(the positive label it was written with); read with the other
            # label as positive, the score must be that label's probability
            at = table.column_names.index(SCORE)
            other = 1.0 - table.column(SCORE).to_numpy(zero_copy_only=False).astype(np.float64)
            table = table.set_column(at, SCORE, pa.array(other, pa.float64()))
    else:
        space = _infer_space(table, path, positive_label)
    for column in ("label", "prediction"):
        for value in set(table.column(column).to_pylist()) - {None}:
            if space.normalise(value) is None:
                raise ValueError(f"{path}: {column} {value!r} is not one of the labels {list(space.labels)}")
    return Predictions(table, space, dict(meta.get("info", {}), source=str(path)))


def join_on_id(a: Predictions, b: Predictions, what: str = "the two files") -> tuple[list[int], list[int]]:
    """Row positions of the ids both tables hold (in ``a``'s order). The answer keys must agree."""
    ids_a = a.ids
    where_b = {i: r for r, i in enumerate(b.ids)}
    rows_a = [r for r, i in enumerate(ids_a) if i in where_b]
    if not rows_a:
        raise ValueError(f"{what} share no id: predictions are joined on id; evaluate both models on the same split")
    rows_b = [where_b[ids_a[r]] for r in rows_a]
    true_a, true_b = a.y_true, b.y_true
    differ = [ids_a[r] for r, s in zip(rows_a, rows_b) if a.labels.normalise(true_a[r]) != b.labels.normalise(true_b[s])]
    if differ:
        raise ValueError(
            f"{what} disagree on the label of {len(differ)} shared id(s) (e.g. {differ[0]!r}): they were scored "
            "against different answer keys; evaluate both with the same `labelrl eval --label-col`"
        )
    return rows_a, rows_b
