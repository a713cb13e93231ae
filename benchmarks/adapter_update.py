"""The RL step with a LoRA adapter's update in bf16 (peft's forward under autocast; the
sampler's low-rank products in bf16) against fp32 (``precision._lean_lora_forward``; the
sampler's fp32 low-rank update), alternating step by step in one process.

    .venv/bin/python benchmarks/adapter_update.py [--json OUT] [--runs 6] [--threads N]

The step is ``benchmarks/rl_step.py``'s at G = 4 in bf16 without the skip rule (every group
trains): SmolLM2-135M-Instruct + LoRA r=16 on all linear layers, 2 sms-spam prompts × 4
completions of at most 32 tokens, sampling and the training pass. "bf16 update" puts back what
both ran before: the sampler's factors in bf16 with the update summed in bf16, and peft's own
LoRA forward (``profile_step.peft_adapter_forward``). One warm-up step of each,
then ``--runs`` steps of each, alternating so the machine's noise hits both alike; medians of
the step and of its sampling and training parts, and their ratios. The two arms train the same
run, so their rewards are not comparable; their times are.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from common import busy_note, cpu_line, timing_args  # noqa: E402  (benchmarks/common.py)
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

import labelrl.rollout.fused as fused  # noqa: E402
from labelrl import metrics_keys as K  # noqa: E402
from labelrl.fileio import atomic_write_json  # noqa: E402
from profile_step import peft_adapter_forward  # noqa: E402  (benchmarks/profile_step.py)
from rl_step import rl_config  # noqa: E402  (benchmarks/rl_step.py)

GROUP_SIZE = 4


def _bf16_call(self, x: torch.Tensor) -> torch.Tensor:
    y = self.base(x)
    return y if self.low_rank is None else torch.addmm(y, x @ self.low_rank.a.t(), self.low_rank.b_t)


def _bf16_add_to(self, residual: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    out = self.base.add_to(residual, x)
    return out if self.low_rank is None else out + (x @ self.low_rank.a.t()) @ self.low_rank.b_t


@contextlib.contextmanager
def bf16_update():
    """The adapter's update in bf16, in the sampler and in the training pass."""
    kept = fused.Projection.__call__, fused.Projection.add_to, fused.low_rank

    def bf16_low_rank(modules):
        update = kept[2](modules)
        return None if update is None else fused.LowRank(a=update.a.bfloat16(), b_t=update.b_t.bfloat16())

    fused.Projection.__call__, fused.Projection.add_to, fused.low_rank = _bf16_call, _bf16_add_to, bf16_low_rank
    try:
        with peft_adapter_forward():
            yield
    finally:
        fused.Projection.__call__, fused.Projection.add_to, fused.low_rank = kept


ARMS = (("bf16 update", bf16_update), ("fp32 update (default)", contextlib.nullcontext))


def main() -> None:
    from labelrl.train.rl import rl_step, start_run

    args = timing_args(__doc__.split("\n\n")[0])
    console = Console()
    console.print(cpu_line(), highlight=False)
    machine = busy_note()
    figures: dict[str, dict[str, list[float]]] = {label: {"step": [], "sample": [], "train": []} for label, _ in ARMS}
    with tempfile.TemporaryDirectory(prefix="adapter_update_") as tmp:
        # one step more than it takes: the run's last step would score val, which is not timed here
        run = start_run(rl_config(GROUP_SIZE, 2 * (args.runs + 1) + 1, Path(tmp) / "run", skip=False, precision=args.precision))
        for index in range(args.runs + 1):
            for label, context in ARMS:
                with context():
                    started = time.perf_counter()
                    record = rl_step(run)
                    elapsed = time.perf_counter() - started
                if index == 0:
                    continue  # warm-up
                figures[label]["step"].append(elapsed)
                figures[label]["sample"].append(record[K.SAMPLE_SECONDS])
                figures[label]["train"].append(record[K.UPDATE_SECONDS])
    medians = {label: {part: statistics.median(values) for part, values in parts.items()} for label, parts in figures.items()}
    table = Table(title=f"RL step, SmolLM2-135M + LoRA r=16, 2 prompts × G={GROUP_SIZE}, ≤32 new tokens, {args.precision}, "
                        f"median of {args.runs} alternating steps")
    for column in ("arm", "s/step", "sampling s", "training s"):
        table.add_column(column, justify="right")
    for label, row in medians.items():
        table.add_row(label, *(f"{row[part]:.2f}" for part in ("step", "sample", "train")))
    before, after = medians[ARMS[0][0]], medians[ARMS[1][0]]
    table.add_row("ratio bf16 / fp32", *(f"{before[part] / after[part]:.2f}×" for part in ("step", "sample", "train")))
    console.print(table)
    console.print(f"{cpu_line()}; start: {machine}; end: {busy_note()}", highlight=False)
    if args.json:
        atomic_write_json(args.json, {"cpu": cpu_line(), "precision": args.precision, "runs": args.runs,
                                      "medians": medians, "steps": figures})


if __name__ == "__main__":
    main()
