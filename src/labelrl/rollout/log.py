"""The rollout log: every rollout of every step, one Parquet part file per step.

``RUN_DIR/rollouts/step_000042.parquet`` is written atomically (temp name, then rename), so
a kill loses at most the step in flight and a reader never sees a torn file. Read the
whole log with ``read_rollouts(run_dir)`` or any Parquet reader (pandas, polars, DuckDB)
pointed at the directory. Columns are ``ROLLOUT_SCHEMA``; docs/metrics.md describes them.
"""

from __future__ import annotations

import io
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from labelrl.fileio import atomic_write_bytes

ROLLOUT_SCHEMA = pa.schema(
    [
        pa.field("step", pa.int64()),
        pa.field("prompt_id", pa.string()),
        pa.field("sample_index", pa.int32()),
        pa.field("label", pa.string()),
        pa.field("completion", pa.string()),
        pa.field("completion_tokens", pa.int32()),
        pa.field("truncated", pa.bool_()),
        pa.field("think_closed", pa.bool_()),
        pa.field("parse_status", pa.string()),
        pa.field("answer", pa.string()),
        pa.field("reward", pa.float64()),
        pa.field("advantage", pa.float64()),
        pa.field("group_uniform", pa.bool_()),
        pa.field("skipped", pa.bool_()),
        pa.field("sampler_logprobs", pa.list_(pa.float32())),  # per token, the sampler's log π at temperature 1
    ]
)


def rollout_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "rollouts"


def write_step(run_dir: Path, step: int, rows: dict[str, list]) -> Path:
    """Write one step's rollouts (column name → values) as its own Parquet part."""
    table = pa.Table.from_pydict(rows, schema=ROLLOUT_SCHEMA)
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    path = rollout_dir(run_dir) / f"step_{step:06d}.parquet"
    atomic_write_bytes(path, buffer.getvalue())
    return path


def drop_steps_from(run_dir: Path, step: int) -> None:
    """On resume: remove parts of steps that will be redone."""
    for part in rollout_dir(run_dir).glob("step_*.parquet"):
        if int(part.stem.split("_")[1]) >= step:
            part.unlink()


def read_rollouts(run_dir: Path) -> pa.Table:
    """All logged rollouts of a run, ordered by step."""
    parts = sorted(rollout_dir(run_dir).glob("step_*.parquet"))
    if not parts:
        return ROLLOUT_SCHEMA.empty_table()
    return pa.concat_tables([pq.read_table(p, schema=ROLLOUT_SCHEMA) for p in parts])
