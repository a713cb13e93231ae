"""Two training runs one after another against the same two side by side, as a ladder with
``workers: 1`` and ``workers: 2`` trains them (``labelrl.ladder.side_by_side``); or two
label-token scorings (``--kind eval``), to see whether scoring would gain the same way.

    .venv/bin/python benchmarks/side_by_side.py [--kind rl|sft|eval] [--data sms-spam] [--steps 12]
        [--items 512] [--runs 3] [--model smollm2-135m-instruct] [--json OUT]

Each arm trains two runs of the same config but their seeds (0 and 1) through the command line
(`labelrl rl` or `labelrl sft`, SmolLM2-135M-Instruct + LoRA r=16, bf16 where the CPU has it):

- ``one after another``: each run in turn, with every core's threads (``workers: 1``);
- ``side by side``: both at once, each in its own process with cores / 2 threads
  (``OMP_NUM_THREADS``, as the ladder's workers).

Both arms start two processes, so model loading is in both. RL runs keep every group's training
pass (``--no-skip-uninformative``: a model that has not learnt the answer format would otherwise
skip it), 4 prompts × G = 4, at most 12 new tokens: the demo's shape. SFT runs the demo's batches
of 8. ``--kind eval`` scores ``--items`` val items with the base model (`labelrl eval --split val`,
the ladder's batches of 32). The arms alternate ``--runs`` times; medians of the wall time of two runs and their ratio,
ending with ``side by side vs one after another: R×`` (above 1: side by side is faster).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from common import busy_note, cpu_line, timing_args  # noqa: E402

ARMS = ("one after another", "side by side")


def extra(parser) -> None:
    parser.add_argument("--kind", choices=("rl", "sft", "eval"), default="rl")
    parser.add_argument("--data", default="sms-spam", help="a built-in dataset (the demo's: sms-spam, vader-movies)")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="a built-in model (tiny-random: a smoke run)")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--items", type=int, default=512, help="--kind eval: val items a scoring reads")


def command(args, out: Path, seed: int) -> list[str]:
    if args.kind == "eval":  # the two scorings differ by the sample they draw (--seed), as two arms' would not
        return [sys.executable, "-m", "labelrl.cli.main", "eval", args.model, "--data", args.data, "--split", "val",
                "--limit", str(args.items), "--seed", str(seed), "--n-boot", "200", "--precision", args.precision,
                "--out", str(out / "val.parquet"), "--splits", str(out)]
    base = [sys.executable, "-m", "labelrl.cli.main", args.kind, "--model", args.model, "--data", args.data,
            "--out", str(out), "--seed", str(seed), "--limit", "320", "--quiet", "--precision", args.precision]
    if args.kind == "rl":
        return base + ["--steps", str(args.steps), "--prompts-per-step", "4", "--group-size", "4",
                       "--max-new-tokens", "12", "--checkpoint-every", str(args.steps), "--no-val-path",
                       "--no-skip-uninformative"]
    return base + ["--max-steps", str(args.steps), "--batch-size", "8", "--eval-every", str(10 * args.steps)]


def two_runs(args, root: Path, side_by_side: bool) -> float:
    cores = len(os.sched_getaffinity(0))
    env = dict(os.environ, OMP_NUM_THREADS=str(max(1, cores // 2))) if side_by_side else dict(os.environ)
    outs = [root / f"{'pair' if side_by_side else 'seq'}-{time.monotonic_ns()}-{seed}" for seed in (0, 1)]
    started = time.perf_counter()
    if side_by_side:
        procs = [subprocess.Popen(command(args, out, seed), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                 for seed, out in enumerate(outs)]
        results = [(p.wait(), p.stderr.read()) for p in procs]
    else:
        results = []
        for seed, out in enumerate(outs):
            done = subprocess.run(command(args, out, seed), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            results.append((done.returncode, done.stderr))
    seconds = time.perf_counter() - started
    for code, err in results:
        if code != 0:
            raise SystemExit(f"a run failed (exit {code}):\n{err.decode(errors='replace')[-3000:]}")
    return seconds


def main() -> None:
    args = timing_args(__doc__.splitlines()[0], runs=3, extra=extra)
    print(cpu_line())
    size = f"{args.items} val items a scoring" if args.kind == "eval" else f"{args.steps} steps a run"
    print(f"{busy_note()}; {len(os.sched_getaffinity(0))} cores; {args.kind} on {args.data}, {size}")
    times: dict[str, list[float]] = {arm: [] for arm in ARMS}
    with tempfile.TemporaryDirectory(prefix="side_by_side_") as tmp:
        for repeat in range(args.runs):
            order = ARMS if repeat % 2 == 0 else ARMS[::-1]  # neither arm always goes first
            for arm in order:
                times[arm].append(two_runs(args, Path(tmp), arm == "side by side"))
                print(f"  run {repeat + 1}: {arm}: {times[arm][-1]:.1f} s", flush=True)
    medians = {arm: statistics.median(v) for arm, v in times.items()}
    ratio = medians["one after another"] / medians["side by side"]
    for arm in ARMS:
        print(f"{arm:>17}: {medians[arm]:6.1f} s for two runs (median of {len(times[arm])})")
    print(f"side by side vs one after another: {ratio:.2f}×")
    if args.json:
        args.json.write_text(json.dumps({"cpu": cpu_line(), "kind": args.kind, "data": args.data, "steps": args.steps, "items": args.items,
                                         "seconds": times, "median_seconds": medians, "ratio": ratio}, indent=2))


if __name__ == "__main__":
    main()
