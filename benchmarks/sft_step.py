"""The SFT step through the lean pass against the module pass, every arm in one process.

    .venv/bin/python benchmarks/sft_step.py [--data sms-spam] [--model smollm2-135m-instruct] [--runs 6] [--batch-size 8]
        [--mode direct] [--precision bf16|fp32] [--threads N] [--json OUT]

The demo's SFT shapes: SmolLM2-135M-Instruct + LoRA r=16 on every linear layer, batches of 8
training items of ``--data`` (the demo's sms-spam, or vader-movies), the answer tag and the
end-of-turn token as the loss's targets. One run's model and optimizer serve every arm; each
step takes the next batch, and the arms alternate step by step (module, apart, lean, module, …),
so the host's noise falls on all alike:

- ``module``: the loss through peft's and transformers' modules, the batch packed into rows
  or its shared prompt prefix run once, whichever computes fewer positions
  (``labelrl.train.sft.sft_loss``);
- ``lean``: the same loss through ``labelrl.rollout.lean_pass`` (``sft_loss_lean``): fused
  q/k/v and gate/up products, stacked adapters, real tokens only, log-probs without logits,
  each item's prompt and answer as one segment (``lean_logprobs(join=True)``, G = 1);
- ``apart``: the lean pass with the prompts and the answers as two segments (``join=False``:
  per layer one attention call, one layout and a copy of the prompts' keys and values more).

A step is the forward, backward, gradient clipping and the AdamW update. One warm-up step of
each arm, then ``--runs`` of each; medians and their ratios, ending with ``joined vs apart: R×``
and ``lean vs module: R×``. The arms update the same weights, so their losses drift together;
their times are what is compared.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import contextlib  # noqa: E402

from common import busy_note, cpu_line, machine_rates, rates_line, read_bandwidth, timing_args  # noqa: E402

ARMS = ("module", "apart", "lean")


def extra(parser) -> None:
    parser.add_argument("--data", default="sms-spam", help="a built-in dataset (the demo's: sms-spam, vader-movies)")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="a built-in model (tiny-random: a smoke run)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--mode", choices=("direct",), default="direct")


def start(args, out: Path):
    from accelerate import Accelerator

    from labelrl.train.config import SFTConfig
    from labelrl.train.sft import start_sft

    precision = "bf16" if args.precision == "bf16" else "fp32"
    cfg = SFTConfig(model=args.model, data=args.data, lora=True, batch_size=args.batch_size,
                    max_steps=2 * (args.runs + 1), eval_every=10_000, quiet=True, out=out, seed=0,
                    limit=320, precision=precision, gradient_checkpointing=False)
    return start_sft(cfg, Accelerator(cpu=True))


@contextlib.contextmanager
def answers_apart():
    """``sft_loss_lean`` with each item's prompt and answer as two segments."""
    import labelrl.train.sft as sft

    kept = sft.lean_logprobs
    sft.lean_logprobs = lambda *args: kept(*args, join=False)
    try:
        yield
    finally:
        sft.lean_logprobs = kept


def main() -> None:
    import torch

    from labelrl.train.sft import sft_step

    args = timing_args(__doc__.splitlines()[0], runs=6, extra=extra)
    print(cpu_line())
    print(f"{rates_line(machine_rates())}; memory read {read_bandwidth() / 1e9:.1f} GB/s; {busy_note()}")
    with tempfile.TemporaryDirectory(prefix="sft_step_") as tmp:
        run = start(args, Path(tmp) / "run")
        if run.lean_reason is not None:
            raise SystemExit(f"the lean pass does not apply here: {run.lean_reason}")
        times: dict[str, list[float]] = {arm: [] for arm in ARMS}
        tokens: dict[str, list[int]] = {arm: [] for arm in ARMS}
        step = 0
        for repeat in range(args.runs + 1):
            for arm in ARMS:
                run.lean_reason = None if arm != "module" else "benchmark: the module arm"
                batch = run.batch(step)
                with answers_apart() if arm == "apart" else contextlib.nullcontext():
                    started = time.perf_counter()
                    sft_step(run, batch)
                    seconds = time.perf_counter() - started
                step += 1
                if repeat:  # the first step of each arm warms up
                    times[arm].append(seconds)
                    tokens[arm].append(sum(len(it.input_ids) for it in batch))
    print(f"{args.model} + LoRA r=16, {args.data}, batch {args.batch_size}, {args.precision}, "
          f"{torch.get_num_threads()} threads, {args.runs} steps per arm (alternating)")
    medians = {arm: statistics.median(times[arm]) for arm in ARMS}
    for arm in ARMS:
        rate = sum(tokens[arm]) / sum(times[arm])
        print(f"  {arm:<6} step {medians[arm]:.3f} s (median; {min(times[arm]):.3f}–{max(times[arm]):.3f}), "
              f"{rate:,.0f} tokens/s")
    ratio = medians["module"] / medians["lean"]
    print(f"joined vs apart: {medians['apart'] / medians['lean']:.2f}×")
    if args.json is not None:
        import json

        args.json.write_text(json.dumps({"cpu": cpu_line(), "times": times, "tokens": tokens, "ratio": ratio}, indent=1))
    print(f"lean vs module: {ratio:.2f}×")


if __name__ == "__main__":
    main()
