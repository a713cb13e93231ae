"""The end-of-run summary: a few figures from the run's files, and the paths written; no dict dump."""

from __future__ import annotations

import json

from rich.console import Console

from labelrl import metrics_keys as K
from labelrl.train.summary import long_items_line, rl_figures, rl_windows


def write_metrics(run_dir, n_steps: int) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = []
    for step in range(1, n_steps + 1):
        lines.append({K.STEP: step, K.REWARD_MEAN: step / 10, K.ACCURACY: 0.5, K.PARSE_FAIL_FRAC: 0.0,
                      K.TRUNCATED_FRAC: 0.0, K.UNIFORM_FRAC: 0.25, K.FAILED_POSITIVE_FRAC: 0.1,
                      K.STEP_SECONDS: float(step), K.PEAK_MEMORY_MB: 100.0 + step,
                      "groups/label_share_informative/great": 0.0})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


def test_windows_average_the_first_and_last_steps(tmp_path):
    write_metrics(tmp_path, 12)
    figures = rl_figures(tmp_path)
    assert figures["columns"] == ["steps 1–5", "steps 8–12"]
    rows = dict(figures["rows"])
    # reward = step/10: mean of 1..5 is 0.3, of 8..12 is 1.0
    assert rows["reward (mean)"] == [0.3, 1.0]
    assert figures["seconds_per_step"] == 6.5 and figures["peak_memory_mb"] == 112.0
    assert figures["files"] == {"metrics (every step)": str(tmp_path / "metrics.jsonl")}  # only files that exist


def test_short_runs_get_one_or_two_non_overlapping_windows():
    records = [{K.STEP: s} for s in (1, 2, 3)]
    assert [t for t, _ in rl_windows(records)] == ["step 1", "step 3"]
    assert [t for t, _ in rl_windows(records[:1])] == ["step 1"]
    assert rl_windows([]) == []


def test_rl_summary_prints_a_table_and_paths_not_a_dict(tmp_path):
    from labelrl.cli.train import print_rl_summary
    from labelrl.train.config import RLConfig

    write_metrics(tmp_path / "rl", 8)
    (tmp_path / "rl" / "model").mkdir()
    console = Console(record=True, width=150)
    cfg = RLConfig(data="x.jsonl", out=tmp_path / "rl", steps=8)
    print_rl_summary({"steps_done": 8, "steps": 8, "stopped_early": False, "last": {"reward/mean": 0.8}}, cfg, console)
    text = console.export_text()
    assert "rl grpo done: 8/8 steps" in text and "steps 1–4" in text and "steps 5–8" in text
    assert "failed answers with a positive advantage" in text and "median 4.50 s per step" in text
    assert str(tmp_path / "rl" / "model") in text and "label_share" not in text and "{" not in text


def test_long_items_line_only_when_items_were_cut(tmp_path):
    record = {"stage": "training items", "policy": "truncate", "limit": "--max-length 64 with their answer",
              "n_items": 40, "ids": ["a", "b"], "prompt_tokens": [90, 80], "budgets": [60, 60]}
    (tmp_path / "long.json").write_text(json.dumps(record))
    assert long_items_line(tmp_path / "long.json") == (
        f"2 of 40 training items cut to fit: --max-length 64 with their answer ({tmp_path / 'long.json'})")
    (tmp_path / "none.json").write_text(json.dumps(record | {"ids": []}))
    assert long_items_line(tmp_path / "none.json") is None and long_items_line(tmp_path / "missing.json") is None


def test_a_collapse_says_what_to_change_rls_rate_or_for_an_inherited_one_the_parents_training(tmp_path):
    from labelrl.cli.train import print_rl_summary
    from labelrl.train.config import RLConfig

    write_metrics(tmp_path / "rl", 8)
    cfg = RLConfig(data="x.jsonl", out=tmp_path / "rl", steps=8)
    flag = {"label": "ham", "step": 4, "share": 1.0, "lift": 0.0, "series": "val", "inherited": False}
    texts = {}
    for inherited in (False, True):
        console = Console(record=True, width=300)
        print_rl_summary({"steps_done": 8, "steps": 8, "stopped_early": False, "last": {"reward/mean": 0.8},
                          "collapse": {**flag, "inherited": inherited}}, cfg, console)
        texts[inherited] = console.export_text()
    assert "collapsed to ham at step 4" in texts[False] and "lower --learning-rate" in texts[False]
    # the starting model already answered ham for every item: a gentler RL rate cannot undo that
    assert "inherited from its parent" in texts[True] and "lower --learning-rate" not in texts[True]
    assert "train the starting model until it answers more than one label" in texts[True]
