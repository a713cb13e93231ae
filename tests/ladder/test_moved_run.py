"""A ladder run directory copied elsewhere and re-run there with one more arm keeps its finished
arms and runs the new one.

A finished arm's recorded config holds absolute paths under the directory it ran in (``out``,
an RL arm's ``model`` = its parent's directory, the splits). Comparing those strings as they
are refuses every moved run ("finished in DIR with another config"); comparing them relative to
each run directory recognises the arms by what they computed.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_ladder import toy_recipe, toy_rows, write  # noqa: E402

from labelrl.ladder import Ladder, load_recipe, read_state  # noqa: E402
from labelrl.ladder.tune_grid import relative_to_run  # noqa: E402


def _recipe(data: Path, arms: dict) -> dict:
    raw = toy_recipe(data, None)
    task = raw["tasks"]["toy"]
    task.pop("rubric")
    task["eval_label_cols"] = ["label_clean"]
    task["arms"] = arms
    return raw


def test_a_copied_run_keeps_its_finished_arms_and_runs_the_added_one(tmp_path):
    data = write(tmp_path / "toy.jsonl", toy_rows())
    arms = {"sft": {"type": "sft"}, "grpo": {"type": "rl", "from": "sft", "preset": "grpo"}}
    first = Ladder(load_recipe(write(tmp_path / "r1.yaml", _recipe(data, arms))), tmp_path / "run", Console(quiet=True)).run()
    assert {a["status"] for a in first["tasks"]["toy"]["arms"].values()} == {"done"}
    # the recorded configs name the first directory: what made the old comparison refuse the copy
    assert first["tasks"]["toy"]["arms"]["grpo"]["config"]["model"].startswith(str((tmp_path / "run").resolve()))

    moved = tmp_path / "elsewhere" / "run"
    shutil.copytree(tmp_path / "run", moved)
    finished = {p: p.stat().st_mtime_ns for p in (moved / "toy").rglob("*")
                if p.is_file() and p.parent.name in ("sft", "grpo", "model", "eval")}
    holdout_looks = [line for line in (moved / "toy" / "ledger.jsonl").read_text().splitlines() if '"holdout"' in line]
    again = Ladder(load_recipe(write(tmp_path / "r2.yaml", _recipe(data, arms | {"corpo": {
        "type": "rl", "from": "sft", "preset": "corpo", "threshold": 0.5}}))), moved, Console(quiet=True)).run()

    toy = again["tasks"]["toy"]["arms"]
    assert {n: a["status"] for n, a in toy.items()} == {"sft": "done", "grpo": "done", "corpo": "done"}
    changed = [p for p, t in finished.items() if p.stat().st_mtime_ns != t]
    assert changed == [], changed  # nothing of the finished arms retrained or re-evaluated
    assert (moved / "toy" / "eval" / "corpo-holdout.json").is_file()
    # the trainer records the threshold its diagnostics used (plain rewards: the correct reward)
    assert json.loads((moved / "toy" / "corpo" / "rl_summary.json").read_text())["success_threshold"] == 1.0
    after = [line for line in (moved / "toy" / "ledger.jsonl").read_text().splitlines() if '"holdout"' in line]
    assert after[:len(holdout_looks)] == holdout_looks  # the finished arms looked at the holdout once, in the first run
    new_looks = [json.loads(line) for line in after[len(holdout_looks):]]
    assert new_looks and all(r["model_spec"] == str(moved.resolve() / "toy" / "corpo" / "model") for r in new_looks)
    assert not any(r.get("repeat") for r in new_looks)
    # the new arm trains from the copy's SFT model, and the finished arms' paths now name the copy
    assert toy["corpo"]["config"]["model"] == str(moved.resolve() / "toy" / "sft")
    assert toy["grpo"]["config"]["model"] == str(moved.resolve() / "toy" / "sft")
    assert not any(str((tmp_path / "run").resolve()) in json.dumps(a["config"]) for a in toy.values())
    assert read_state(moved)["run_dir"] == str(moved.resolve())
    # a third run in the copy (its state now written there) still keeps everything
    third = Ladder(load_recipe(tmp_path / "r2.yaml"), moved, Console(quiet=True))
    assert third.state["tasks"]["toy"]["arms"]["corpo"]["status"] == "done"


def test_a_moved_run_still_refuses_a_changed_config(tmp_path):
    """The relative comparison must not hide a real change: a finished arm whose recorded config
    differs in a value (not a location) is still refused in the new directory."""
    data = write(tmp_path / "toy.jsonl", toy_rows())
    raw = _recipe(data, {"sft": {"type": "sft"}})
    old_dir, new_dir = (tmp_path / "old").resolve(), (tmp_path / "new").resolve()
    ladder = Ladder(load_recipe(write(tmp_path / "r.yaml", raw)), old_dir, Console(quiet=True))
    config = ladder.configs["toy"]["sft"].model_dump(mode="json")
    new_dir.mkdir()
    for lr, refused in ((config["learning_rate"], False), (config["learning_rate"] * 2, True)):
        state = {"format": 1, "recipe": "toy", "run_dir": str(old_dir),
                 "tasks": {"toy": {"arms": {"sft": {"status": "done", "config": {**config, "learning_rate": lr}}}}}}
        (new_dir / "ladder.json").write_text(json.dumps(state), encoding="utf-8")
        if refused:
            with pytest.raises(ValueError, match=r"tasks\.toy\.arms\.sft: finished in .* with another config"):
                Ladder(load_recipe(tmp_path / "r.yaml"), new_dir, Console(quiet=True))
        else:
            moved = Ladder(load_recipe(tmp_path / "r.yaml"), new_dir, Console(quiet=True))
            assert moved.state["tasks"]["toy"]["arms"]["sft"]["config"]["out"] == str(new_dir / "toy" / "sft")


def test_relative_to_run_rewrites_only_paths_under_the_run_directory():
    value = {"out": "/r/run/toy/sft", "model": "/r/run", "data": "/r/data.jsonl", "name": "/r/run2/x",
             "list": ["/r/run/toy/eval", "sft", 3]}
    assert relative_to_run(value, "/r/run") == {
        "out": "<run_dir>/toy/sft", "model": "<run_dir>", "data": "/r/data.jsonl",
        "name": "/r/run2/x",  # a sibling whose name starts like the run directory is not under it
        "list": ["<run_dir>/toy/eval", "sft", 3]}
