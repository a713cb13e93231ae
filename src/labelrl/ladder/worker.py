"""One training run of a ladder in its own process (``labelrl.ladder.side_by_side``).

    python -m labelrl.ladder.worker SPEC.json

SPEC holds the arm type, the config (its class and fields) and the task directory; the worker
sets its thread count before any product runs and trains the run as the ladder would
(``labelrl.ladder.arms.train_arm``).
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    import torch

    torch.set_num_threads(int(spec["threads"]))
    from rich.console import Console

    from labelrl.ladder.arms import train_arm

    module, name = spec["config_class"].split(":")
    cfg = getattr(importlib.import_module(module), name).model_validate(spec["config"])
    train_arm(spec["arm_type"], cfg, Path(spec["task_dir"]), Console())


if __name__ == "__main__":
    main(sys.argv[1])
