"""``labelrl rescore RUN_DIR``: the logged rollouts of an RL run re-graded with another parser.

The strict parser reads exactly one well-formed ``<answer>…</answer>`` (after ``</think>`` in
reasoning mode); a lenient parser takes any label it can find. The reward a lenient parser
would have paid on the same completions shows how much of a reward curve is format, not skill:
the inflation is lenient − strict mean reward, per step. Both are recomputed from the logged
completion texts with the run's own reward settings (``rl_config.yaml``) and the shared grader,
so they are comparable with each other; the strict value also matches the logged reward
(unless the run used the random-reward control).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml

from labelrl.fileio import atomic_write_json


def rescore_run(run_dir: str | Path, parse_mode: str = "lenient", *, write: bool = True) -> dict:
    """Per step and overall: mean reward and parse success under the strict parser and under
    ``parse_mode``, the inflation, and the share of rollouts whose answer the two parsers read
    differently; saved as ``RUN_DIR/rescore-MODE.json``."""
    from labelrl.data.prepare import load_checked_dataset
    from labelrl.rewards.reward_fn import score_completions
    from labelrl.rollout.log import read_rollouts
    from labelrl.train.config import RLConfig
    from labelrl.train.rl_parts import resolve_algorithm

    run_dir = Path(run_dir)
    config = run_dir / "rl_config.yaml"
    if not config.is_file():
        raise ValueError(f"{run_dir}: no rl_config.yaml, so not an RL run directory; give the --out of `labelrl rl`")
    table = read_rollouts(run_dir)
    if table.num_rows == 0:
        raise ValueError(f"{run_dir}: no logged rollouts (rollouts/step_*.parquet); the run has not completed a step")
    cfg = RLConfig(**(yaml.safe_load(config.read_text(encoding="utf-8")) or {}))
    labels = load_checked_dataset(cfg).labels
    columns = {name: table.column(name).to_pylist() for name in ("step", "label", "completion", "truncated", "completion_tokens", "reward")}
    graded = {}
    for mode in ("strict", parse_mode):
        reward = resolve_algorithm(cfg.model_copy(update={"parse_mode": mode}), labels).reward
        graded[mode] = score_completions(columns["completion"], columns["label"], truncated=columns["truncated"],
                                         lengths=columns["completion_tokens"], config=reward)
    result = _summary(columns, graded["strict"], graded[parse_mode], parse_mode)
    result.update(run_dir=str(run_dir), random_reward=bool(cfg.random_reward))
    if write:
        atomic_write_json(run_dir / f"rescore-{parse_mode}.json", result)
    return result


def _summary(columns: dict, strict, other, mode: str) -> dict:
    steps = np.asarray(columns["step"])
    r_strict, r_other = np.asarray(strict.rewards, dtype=float), np.asarray(other.rewards, dtype=float)
    ok_strict = np.array([p.ok for p in strict.parses])
    ok_other = np.array([p.ok for p in other.parses])
    changed = np.array([a.answer != b.answer for a, b in zip(strict.parses, other.parses)])

    def block(mask: np.ndarray) -> dict:
        return {"n": int(mask.sum()), "reward_strict": float(r_strict[mask].mean()), f"reward_{mode}": float(r_other[mask].mean()),
                "inflation": float(r_other[mask].mean() - r_strict[mask].mean()),
                "parsed_strict": float(ok_strict[mask].mean()), f"parsed_{mode}": float(ok_other[mask].mean()),
                "answer_changed": float(changed[mask].mean())}

    return {"parse_mode": mode, "overall": block(np.ones(len(steps), dtype=bool)),
            "per_step": [{"step": int(s), **block(steps == s)} for s in np.unique(steps)],
            "logged_reward_mean": float(np.mean(columns["reward"]))}
