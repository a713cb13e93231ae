"""The rollout log and the predictions file are plain Parquet: pandas and DuckDB read them
with no labelrl code, and get the same rows and numbers labelrl wrote."""

from __future__ import annotations

# duckdb is in the dev extra and pandas comes with datasets: missing, they fail these tests.
import duckdb
import numpy as np
import pandas as pd
import pytest

from labelrl.evaluate.io import Predictions, predictions_table, read_predictions, write_predictions
from labelrl.rollout.log import ROLLOUT_SCHEMA, write_step
from labelrl.types import LabelSpace

G = 4


def _step_rows(step: int, rewards: list[float]) -> dict[str, list]:
    n = len(rewards)
    rows = {
        "step": [step] * n,
        "prompt_id": [f"p{step}_{i // G}" for i in range(n)],
        "sample_index": [i % G for i in range(n)],
        "label": ["spam" if i // G % 2 else "ham" for i in range(n)],
        "completion": [f"<answer>{'spam' if r else 'ham'}</answer>" for r in rewards],
        "completion_tokens": [5 + i for i in range(n)],
        "truncated": [False] * n,
        "think_closed": [False] * n,
        "parse_status": ["ok"] * n,
        "answer": ["spam" if r else "ham" for r in rewards],
        "reward": rewards,
        "advantage": [r - 0.5 for r in rewards],
        "group_uniform": [False] * n,
        "skipped": [False] * n,
        "sampler_logprobs": [[-0.5] * (5 + i) for i in range(n)],
    }
    assert set(rows) == set(ROLLOUT_SCHEMA.names)
    return rows


@pytest.fixture
def run(tmp_path):
    run = tmp_path / "run"
    write_step(run, 1, _step_rows(1, [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0]))  # 2 groups
    write_step(run, 2, _step_rows(2, [1.0, 1.0, 1.0, 0.0]))  # 1 group
    labels = LabelSpace(("ham", "spam"), kind="binary", positive="spam")
    table = predictions_table(
        ["a", "b", "c", "d"], ["ham", "spam", "spam", "ham"], ["ham", "spam", "ham", None],
        ["ok", "ok", "ok", "no_answer"], labels, probs=np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.5, 0.5]]),
    )
    write_predictions(Predictions(table, labels, {"source": "test"}), run / "predictions.parquet")
    return run


def test_duckdb_counts_and_aggregates_the_rollout_log(run):
    pattern = str(run / "rollouts" / "*.parquet")
    (count,) = duckdb.connect().execute(f"SELECT count(*) FROM '{pattern}'").fetchone()
    assert count == 12  # 8 rollouts at step 1 + 4 at step 2
    per_step = duckdb.connect().execute(
        f"SELECT step, count(DISTINCT prompt_id), avg(reward) FROM '{pattern}' GROUP BY step ORDER BY step"
    ).fetchall()
    # step 1: 2 prompts, mean reward 2/8 = 0.25; step 2: 1 prompt, 3/4 = 0.75
    assert per_step == [(1, 2, 0.25), (2, 1, 0.75)]


def test_pandas_reads_the_rollout_directory_with_its_types(run):
    frame = pd.read_parquet(run / "rollouts")
    assert len(frame) == 12 and list(frame.columns) == ROLLOUT_SCHEMA.names
    assert frame["truncated"].dtype == bool and frame["reward"].dtype == np.float64
    assert frame.groupby("step")["reward"].sum().to_dict() == {1: 2.0, 2: 3.0}


def test_duckdb_and_pandas_read_the_predictions_labelrl_wrote(run):
    path = run / "predictions.parquet"
    ours = read_predictions(path)
    # accuracy over all 4 rows: a and b right, c wrong, d unparsed (NULL counts as wrong) → 0.5
    (accuracy, unparsed) = duckdb.connect().execute(
        f"SELECT avg(CASE WHEN prediction = label THEN 1 ELSE 0 END), count(*) FILTER (WHERE prediction IS NULL) FROM '{path}'"
    ).fetchone()
    assert accuracy == 0.5 and unparsed == 1
    frame = pd.read_parquet(path)
    assert frame["id"].tolist() == ours.ids and frame["prediction"].tolist()[:3] == ours.y_pred[:3]
    assert frame["score"].tolist() == pytest.approx([0.1, 0.8, 0.4, 0.5])  # P(spam), the positive label
