"""Suite-wide settings and fixtures.

Offline hub access, and one torch thread per xdist worker: `make test` runs two workers on
two cores, and letting each worker's torch spawn two threads oversubscribes the cores and
makes every test several times slower.

The trainer fixtures build a trivial synthetic task: is the (repeated) word a fruit? A
random 3M-parameter model cannot discover from scratch that the answer depends on one word
of an 80-token prompt within a CI budget, by SFT or by RL. So the warm start is SFT on a
mixture: known words with true labels (this builds the "read the item" pathway) and the RL
words with labels drawn at random (the model answers them in format, at chance, with
maximal entropy). RL on the RL words then starts at chance and must learn each word's
label from the reward alone.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The shared holdout ledgers (labelrl.evaluate.ledger) live outside run directories; tests must
# neither read nor write the user's. A suite-wide folder here, and a fresh one per test below.
os.environ["LABELRL_LEDGER_DIR"] = tempfile.mkdtemp(prefix="labelrl-test-ledgers-")

if os.environ.get("PYTEST_XDIST_WORKER"):
    import torch

    torch.set_num_threads(1)



@pytest.fixture(autouse=True)
def _own_shared_ledger(tmp_path_factory, monkeypatch):
    """Each test sees an empty shared holdout ledger, so a model evaluated in one test is never
    refused as a repeat in another."""
    monkeypatch.setenv("LABELRL_LEDGER_DIR", str(tmp_path_factory.mktemp("ledgers")))


SFT_FRUIT, SFT_THINGS = ["apple", "pear", "plum"], ["stone", "brick", "steel"]
RL_FRUIT, RL_THINGS = ["grape", "mango"], ["chair", "table"]


def _write(path: Path, rows: list[tuple[str, str]]) -> Path:
    with open(path, "w", encoding="utf-8") as handle:
        for i, (word, label) in enumerate(rows):
            handle.write(json.dumps({"id": f"r{i}", "text": " ".join([word] * 4), "label": label}) + "\n")
    return path


def rl_rows(n: int = 240, seed: int = 1) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        fruit = rng.random() < 0.5
        rows.append((rng.choice(RL_FRUIT if fruit else RL_THINGS), "yes" if fruit else "no"))
    return rows


def warm_start_rows(n: int = 400, seed: int = 0) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        if rng.random() < 0.5:
            fruit = rng.random() < 0.5
            rows.append((rng.choice(SFT_FRUIT if fruit else SFT_THINGS), "yes" if fruit else "no"))
        else:  # an RL word with a coin-flip label: format without knowledge
            rows.append((rng.choice(RL_FRUIT + RL_THINGS), rng.choice(["yes", "no"])))
    return rows


@pytest.fixture(scope="session")
def toy_data(tmp_path_factory) -> Path:
    return _write(tmp_path_factory.mktemp("toy") / "rl_task.jsonl", rl_rows())


@pytest.fixture(scope="session")
def warm_model(tmp_path_factory) -> Path:
    """Run directory of tiny-random after the warm-start SFT (its model in RUN_DIR/model)."""
    from labelrl.train.config import SFTConfig
    from labelrl.train.sft import run_sft

    root = tmp_path_factory.mktemp("warm")
    data = _write(root / "warm.jsonl", warm_start_rows())
    cfg = SFTConfig(model="tiny-random", data=str(data), out=root / "run", lora=False, learning_rate=3e-3,
                    max_steps=150, batch_size=8, eval_every=150, quiet=True)
    run_sft(cfg)
    return root / "run"


@pytest.fixture
def rl_config():
    """``rl_config(model, data, out, **overrides)``: a small RLConfig for the toy task."""
    return make_rl_config


def make_rl_config(model: Path, data: Path, out: Path, **overrides):
    from labelrl.train.config import RLConfig

    base = dict(model=str(model), data=str(data), out=out, lora=False, group_size=8, prompts_per_step=8,
                max_new_tokens=10, steps=4, learning_rate=1e-3, quiet=True)
    base.update(overrides)
    return RLConfig(**base)
