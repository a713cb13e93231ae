"""Reading a finished run's files in tests (imported as ``run_files``; tests/ is put on the path)."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file


def saved_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of ``RUN_DIR/model/*.safetensors``; a run that saved none fails the test."""
    out = {}
    for f in sorted((Path(run_dir) / "model").glob("*.safetensors")):
        out.update(load_file(str(f)))
    assert out, f"no saved weights in {Path(run_dir) / 'model'}"
    return out
