"""Helpers shared by the reliability tests: the ``labelrl`` command line, its environment,
and run files compared with wall-time and memory figures left out."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from labelrl import metrics_keys as K

# Metrics that measure the machine (wall time, memory, throughput), not the computation.
TIMING_PREFIX = "perf/"
TIMING_KEYS = frozenset({K.TOKENS_PER_S})


def labelrl_argv(*args: str) -> list[str]:
    """The installed ``labelrl`` entry point (beside this interpreter), else ``python -m``."""
    script = Path(sys.executable).with_name("labelrl")
    head = [str(script)] if script.is_file() else [sys.executable, "-m", "labelrl.cli.main"]
    return [*head, *args]


def cli_env(**extra: str) -> dict[str, str]:
    """The test's environment, offline, one torch thread (the runs compared must share it)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "COLUMNS": "200"}
    env.update(extra)
    return env


def deterministic(records: list[dict]) -> list[dict]:
    """Metrics records without the timing keys (``perf/*``, ``rollout/tokens_per_s``)."""
    return [{k: v for k, v in r.items() if not k.startswith(TIMING_PREFIX) and k not in TIMING_KEYS}
            for r in records]


def saved_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the safetensors files in a saved model directory."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    assert files, f"no safetensors weights in {model_dir}"
    out: dict[str, torch.Tensor] = {}
    for path in files:
        out.update(load_file(str(path)))
    return out


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs"
