"""Shared fixtures of the trainer tests: a trivial synthetic task and a format-only SFT model."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

FRUIT = ["apple", "pear", "plum", "grape", "mango", "lemon", "peach", "melon"]
THINGS = ["stone", "brick", "steel", "glass", "chair", "table", "spoon", "shelf"]


def write_toy(path: Path, n: int = 240, seed: int = 0) -> Path:
    """A trivial task: is the one-word item a fruit (yes) or not (no)?"""
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as handle:
        for i in range(n):
            fruit = rng.random() < 0.5
            word = rng.choice(FRUIT if fruit else THINGS)
            handle.write(json.dumps({"id": f"t{i}", "text": word, "label": "yes" if fruit else "no"}) + "\n")
    return path


@pytest.fixture(scope="session")
def toy_data(tmp_path_factory) -> Path:
    return write_toy(tmp_path_factory.mktemp("toy") / "toy.jsonl")


@pytest.fixture(scope="session")
def format_model(tmp_path_factory, toy_data) -> Path:
    """tiny-random after SFT on shuffled labels: it answers in the format, at chance."""
    from labelrl.train.config import SFTConfig
    from labelrl.train.sft import run_sft

    out = tmp_path_factory.mktemp("fmt")
    cfg = SFTConfig(model="tiny-random", data=str(toy_data), out=out, lora=False, learning_rate=3e-3,
                    max_steps=150, batch_size=8, eval_every=150, shuffle_labels=True, quiet=True)
    run_sft(cfg)
    return out
