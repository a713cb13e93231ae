"""The few figures that say how a training run went, read from its files, for the end-of-run
summary the command prints (the full record stays in ``metrics.jsonl`` and the summary JSON)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from labelrl import metrics_keys as K

WINDOW = 5  # steps averaged at the start and at the end of an RL run (one step's figures are noisy)

# (metric, what the table calls it): the rollout figures that tell whether RL is learning
RL_FIGURES = (
    (K.REWARD_MEAN, "reward (mean)"),
    (K.ACCURACY, "rollout accuracy"),
    (K.PARSE_FAIL_FRAC, "unparseable answers"),
    (K.TRUNCATED_FRAC, "truncated completions"),
    (K.UNIFORM_FRAC, "uniform groups (no learning signal)"),
    (K.FAILED_POSITIVE_FRAC, "failed answers with a positive advantage"),
)


def read_records(path: Path) -> list[dict]:
    path = Path(path)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _mean(records: list[dict], key: str) -> float | None:
    values = [r[key] for r in records if isinstance(r.get(key), (int, float))]
    return sum(values) / len(values) if values else None


def rl_windows(records: list[dict], window: int = WINDOW) -> list[tuple[str, list[dict]]]:
    """(title, records) of the first and the last ``window`` steps; one window when the run is
    too short for two that do not overlap."""
    if not records:
        return []
    n = min(window, len(records) // 2)
    if n == 0:
        return [(f"step {records[0][K.STEP]}", records)]
    first, last = records[:n], records[-n:]
    span = lambda rs: f"step {rs[0][K.STEP]}" if len(rs) == 1 else f"steps {rs[0][K.STEP]}–{rs[-1][K.STEP]}"  # noqa: E731
    return [(span(first), first), (span(last), last)]


def rl_figures(run_dir: Path) -> dict:
    """``{"columns": [titles], "rows": [(name, [values])], "seconds_per_step", "peak_memory_mb",
    "files": {what: path}}`` of an RL run directory."""
    run_dir = Path(run_dir)
    records = read_records(run_dir / "metrics.jsonl")
    windows = rl_windows(records)
    rows = [(name, [_mean(rs, key) for _, rs in windows]) for key, name in RL_FIGURES
            if any(key in r for r in records)]
    seconds = [r[K.STEP_SECONDS] for r in records if K.STEP_SECONDS in r]
    peak = max((r[K.PEAK_MEMORY_MB] for r in records if K.PEAK_MEMORY_MB in r), default=None)
    files = {"model": run_dir / "model", "metrics (every step)": run_dir / "metrics.jsonl",
             "rollouts (every completion)": run_dir / "rollouts", "summary": run_dir / "rl_summary.json",
             "long items": run_dir / "long_items_rl.json"}
    return {"columns": [title for title, _ in windows], "rows": rows,
            "seconds_per_step": statistics.median(seconds) if seconds else None, "peak_memory_mb": peak,
            "files": {k: str(v) for k, v in files.items() if v.exists()}}


def long_items_line(path: Path) -> str | None:
    """``3 of 320 training items cut to fit: --max-length 512 …`` from a long-items record
    (``labelrl.data.length``), or None when it lists no item."""
    path = Path(path)
    if not path.is_file():
        return None
    record = json.loads(path.read_text(encoding="utf-8"))
    if not record.get("ids"):
        return None
    done = {"truncate": "cut to fit", "skip": "left out", "error": "refused"}[record["policy"]]
    return f"{len(record['ids'])} of {record['n_items']} {record['stage']} {done}: {record['limit']} ({path})"
