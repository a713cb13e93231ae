"""The order of SFT's training items: seeded shuffles, or every label in turn (``--prompt-sampling``)."""

from __future__ import annotations

import collections
import sys
from pathlib import Path

import pytest
from accelerate import Accelerator

from labelrl.train.config import SFTConfig
from labelrl.train.sft import start_sft

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import _write  # noqa: E402


def skewed_rows(n: int = 100, spam: int = 10) -> list[tuple[str, str]]:
    """``spam`` of ``n`` items labelled "spam", the rest "ham", the spam ones last: the file order
    a sorted export would have."""
    return [(f"cheap{i}", "ham") for i in range(n - spam)] + [(f"prize{i}", "spam") for i in range(spam)]


def batches(tmp_path, sampling: str, steps: int = 6, **options) -> list[list[str]]:
    data = _write(tmp_path / "skewed.jsonl", skewed_rows())
    cfg = SFTConfig(model="tiny-random", data=str(data), out=tmp_path / sampling, lora=False, max_steps=steps,
                    batch_size=8, eval_every=0, split_ratios="0.8,0.1,0.1", prompt_sampling=sampling, quiet=True, **options)
    run = start_sft(cfg, Accelerator(cpu=True))
    for item in run.items:  # each item's label is the one its target states
        assert f"<answer>{item.label}</answer>" in run.tokenizer.decode(item.input_ids[item.n_prompt:])
    return [[item.label for item in run.batch(step)] for step in range(steps)]


def test_balanced_sampling_gives_every_batch_each_label_equally_often(tmp_path):
    drawn = batches(tmp_path, "balanced")
    # 8 items of 2 labels: every run of 2 positions holds one of each, so each batch 4 and 4,
    # though 1 item in 10 of the file is spam.
    assert all(collections.Counter(batch) == {"ham": 4, "spam": 4} for batch in drawn)


def test_uniform_sampling_draws_the_labels_as_the_data_holds_them(tmp_path):
    drawn = [label for batch in batches(tmp_path, "uniform") for label in batch]
    # 48 draws from the 80-item train split (about 8 spam): a share near the data's, not half.
    assert drawn.count("spam") < len(drawn) / 4


def test_balanced_sampling_balances_the_labels_the_targets_state(tmp_path):
    # With --shuffle-labels (the control) the targets are shuffled labels: those are what the
    # model is taught, so those are what a batch balances.
    drawn = batches(tmp_path, "balanced", shuffle_labels=True)
    assert all(collections.Counter(batch) == {"ham": 4, "spam": 4} for batch in drawn)


if __name__ == "__main__":
    pytest.main([__file__])
