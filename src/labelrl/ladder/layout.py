"""Where a ladder task's evaluation files are: ``TASK/eval/ARM-TAG.parquet`` (predictions) and
``TASK/eval/ARM-TAG.json`` (the report), for every arm, tag and derived evaluation.

The arms that write them (``labelrl.ladder.arms``, ``labelrl.ladder.derived``) and the analyses
that read them import this module, which imports no other part of the ladder.
"""

from __future__ import annotations

from pathlib import Path


def eval_paths(task_dir: Path, arm_name: str, tag: str) -> tuple[Path, Path]:
    """(predictions parquet, metrics JSON) of one evaluation; tag is val, holdout, train or
    ood-NAME, with ``-generate`` for a direct arm's generated answers."""
    stem = task_dir / "eval" / f"{arm_name}-{tag}"
    return stem.with_suffix(".parquet"), stem.with_suffix(".json")
