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

import atexit
import json
import os
import pickle
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The shared holdout ledgers (labelrl.evaluate.ledger) live outside run directories; tests must
# neither read nor write the user's. A suite-wide folder here, and a fresh one per test below.
os.environ["LABELRL_LEDGER_DIR"] = tempfile.mkdtemp(prefix="labelrl-test-ledgers-")
atexit.register(shutil.rmtree, os.environ["LABELRL_LEDGER_DIR"], ignore_errors=True)

if os.environ.get("PYTEST_XDIST_WORKER"):
    import torch

    torch.set_num_threads(1)



@pytest.fixture(autouse=True, scope="module")
def _module_shared_ledger(tmp_path_factory):
    """A module's own shared holdout ledger while its module-scoped fixtures run (a ladder built
    once for a file's tests): two files that train the same tiny model on the same toy data
    make equal weights, and one file's look must not become a reading of the other's."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LABELRL_LEDGER_DIR", str(tmp_path_factory.mktemp("module-ledgers")))
        yield


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


# --- two runs, not one call twice ---------------------------------------------------------

_FRESH_CALL = """
import importlib, pickle, sys
module, qualname, args, kwargs = pickle.loads(open(sys.argv[1], "rb").read())
func = importlib.import_module(module)
for part in qualname.split("."):
    func = getattr(func, part)
open(sys.argv[2], "wb").write(pickle.dumps(func(*args, **kwargs)))
"""


def call_in_fresh_process(func, *args, **kwargs):
    """``func(*args, **kwargs)`` computed in a new Python interpreter with another hash seed.

    Determinism is two runs compared, never one call compared with itself: a seeded function
    that leaned on ``hash()`` of a string, set order, global RNG state or anything else the
    process carries would agree with itself in this process and still differ in the next
    run. ``func`` must be importable by module and name; arguments and result go by pickle.
    """
    ours = os.environ.get("PYTHONHASHSEED")
    env = {**os.environ, "PYTHONHASHSEED": "2" if ours == "1" else "1", "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        request, answer = Path(tmp) / "request.pkl", Path(tmp) / "answer.pkl"
        request.write_bytes(pickle.dumps((func.__module__, func.__qualname__, args, kwargs)))
        result = subprocess.run([sys.executable, "-c", _FRESH_CALL, str(request), str(answer)], env=env,
                                capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        return pickle.loads(answer.read_bytes())


@pytest.fixture
def fresh_process():
    """``fresh_process(func, *args, **kwargs)``: the call made in a new interpreter (see
    ``call_in_fresh_process``)."""
    return call_in_fresh_process


def saved_model_weights(run_dir: Path) -> dict:
    """Every tensor of the safetensors files in ``RUN_DIR/model`` (or in a model directory)."""
    from safetensors.torch import load_file

    model_dir = Path(run_dir) / "model" if (Path(run_dir) / "model").is_dir() else Path(run_dir)
    files = sorted(model_dir.glob("*.safetensors"))
    assert files, f"no safetensors weights in {model_dir}"
    out: dict = {}
    for path in files:
        out.update(load_file(str(path)))
    return out


def assert_weights_changed(before: Path | str, after: Path) -> None:
    """Training moved some saved weight between two run (or model) directories, or between a
    built-in model (``"tiny-random"``) and a run: without it, a test that compares two trained
    runs, or claims that a model learned, proves nothing."""
    import torch

    if not Path(before).exists():
        from labelrl.models import load_model

        start = load_model(str(before))[0].state_dict()
    else:
        start = saved_model_weights(before)
    end = saved_model_weights(after)
    shared = start.keys() & end.keys()
    assert shared, f"no weight names in common between {before} and {after}"
    changed = [name for name in sorted(shared) if not torch.equal(start[name], end[name])]
    assert changed, f"training changed none of the {len(shared)} saved tensors of {after}"


@pytest.fixture
def weights_changed():
    """``weights_changed(before, after_dir)``: assert that training moved a saved weight."""
    return assert_weights_changed


def assert_fresh_adapter_trained(after: Path) -> None:
    """A LoRA adapter trained from scratch moved: PEFT starts every ``lora_B`` at zero (labelrl
    keeps that default), so a non-zero ``lora_B`` is training's doing."""
    weights = saved_model_weights(after)
    lora_b = {name: t for name, t in weights.items() if "lora_B" in name}
    assert lora_b, f"no lora_B tensors in {after}: not a LoRA adapter"
    assert any(bool(t.abs().sum() > 0) for t in lora_b.values()), f"every lora_B of {after} is still zero: nothing trained"


@pytest.fixture
def adapter_trained():
    """``adapter_trained(run_dir)``: assert that a LoRA adapter trained from scratch moved."""
    return assert_fresh_adapter_trained
