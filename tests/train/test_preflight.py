"""Checks that refuse a run before compute is spent, each with one clear message."""

from __future__ import annotations

import json
from collections import namedtuple

import pytest

from labelrl.fileio import RunLock
from labelrl.train import rl, setup


def test_a_second_writer_to_a_locked_run_dir_is_refused_with_the_holder_named(warm_model, toy_data, rl_config, tmp_path):
    out = tmp_path / "run"
    with RunLock(out, "rl"):
        with pytest.raises(ValueError, match=r"is in use by pid \d+ \(labelrl rl\); wait for it to finish"):
            rl.run_rl(rl_config(warm_model, toy_data, out, steps=1))
    # released on exit: the run now proceeds
    assert rl.run_rl(rl_config(warm_model, toy_data, out, steps=1, prompts_per_step=1, group_size=2))["steps_done"] == 1


def test_prompts_that_cannot_fit_the_context_are_refused(warm_model, toy_data, rl_config, tmp_path):
    with pytest.raises(ValueError, match=r"--max-new-tokens 5000 leaves no room for a prompt in the model's context of "
                                         r"2048 tokens; lower --max-new-tokens"):
        rl.run_rl(rl_config(warm_model, toy_data, tmp_path / "ctx", max_new_tokens=5000))
    # a cap that leaves room: every prompt longer than the rest is cut (--on-long-item truncate), or refused
    with pytest.raises(ValueError, match=r"^(\d+) of \1 training items do not fit the model's context of 2048 tokens with "
                                         r"--max-new-tokens 2040 to spare .*lower --max-new-tokens$"):
        rl.run_rl(rl_config(warm_model, toy_data, tmp_path / "ctx2", max_new_tokens=2040, on_long_item="error"))


def test_a_full_disk_is_refused_before_training(warm_model, toy_data, rl_config, tmp_path, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(setup.shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 2**20, 2**20))
    with pytest.raises(ValueError, match=r"1 MiB free, but checkpoints and the saved model need about \d+ MiB"):
        rl.run_rl(rl_config(warm_model, toy_data, tmp_path / "disk"))


def test_a_label_the_answer_tag_cannot_express_is_refused(tmp_path, rl_config, warm_model):
    data = tmp_path / "bad_labels.jsonl"
    data.write_text("".join(json.dumps({"text": f"item {i}", "label": "<b>" if i % 2 else "ok"}) + "\n" for i in range(10)))
    with pytest.raises(ValueError, match="label '<b>': labels are written inside <answer>"):
        rl.run_rl(rl_config(warm_model, data, tmp_path / "labels"))
