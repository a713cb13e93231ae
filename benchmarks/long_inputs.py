"""SFT on long-tailed texts: tokens/s, padding share and peak memory, before and after.

    .venv/bin/python benchmarks/long_inputs.py [--json OUT] [--steps 12] [--items 2000] [--threads T]

The data are generated here (nothing is downloaded): ``--items`` synthetic product reviews
whose lengths follow a log-normal law fitted to the reviews of the issue that motivated this
(median ≈ 280 characters, 90th percentile ≈ 790, longest ≈ 4,900), with a positive/negative
label; the texts are made of fixed review sentences drawn with a seeded generator, so every
run sees the same file. SmolLM2-135M-Instruct + LoRA r=16, batch 8, ``--max-length 1400``,
the same items in the same order for every arm (the order is a function of the seed).

Arms, each in its own process so that its peak resident memory is its own:

* ``before``: fp32, every item left-padded to the longest of its batch, every activation kept
  (``--precision fp32 --no-pack --no-gradient-checkpointing``): SFT as it was;
* ``after``: the defaults (``--precision auto``, packed rows, checkpointing when the memory
  preflight predicts the batch above ``--memory-budget``, by default half the machine);
* ``after-4gib``: the defaults with ``--memory-budget 4``.

Per arm: the median over the steps after the first of item tokens per second
(``perf/tokens_per_s``: prompt + target tokens, padding excluded) and of step seconds, the
mean padding share (``perf/padding_share``), the peak resident memory (``perf/peak_memory_mb``
at the last step, which includes the final validation pass on ``--eval-limit`` items), and the
preflight's prediction and decision. Before a memory-hungry arm starts, the machine's
available memory is checked against the preflight's prediction; an arm that would not fit
is reported as skipped rather than pushed into swap or the OOM killer on a shared machine.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from common import busy_note, cpu_line  # noqa: E402  (benchmarks/common.py)

ARMS = {
    "before": dict(precision="fp32", pack=False, gradient_checkpointing=False),
    "after": dict(),
    "after-4gib": dict(memory_budget=4.0),
}
RESULT_MARK = "LONG_INPUTS_RESULT "
MEDIAN_CHARS, P90_CHARS, MAX_CHARS = 280, 790, 4900
POSITIVE = ["It works exactly as described and I would buy it again.", "Setup took five minutes and it has been flawless since.",
            "The battery easily lasts the whole day.", "Customer service answered within an hour and fixed it.",
            "Solid build, quiet, and the price was fair.", "My kids use it every day and it still looks new."]
NEGATIVE = ["It stopped working after two weeks.", "The manual is useless and the app keeps crashing.",
            "It arrived scratched and the seller never replied.", "Far too loud for an apartment.",
            "The battery barely lasts an afternoon.", "I returned it and the refund took a month."]
NEUTRAL = ["I ordered the blue one in March.", "It comes in a cardboard box with a short cable.",
           "We mostly use it in the kitchen.", "The size is about what the photos suggest.",
           "Delivery was on a Tuesday.", "I compared three models before choosing this one."]


def review_lengths(n: int, seed: int) -> list[int]:
    """Log-normal lengths in characters: median e^μ = 280 and 90th percentile e^(μ + 1.2816σ) = 790
    give μ = ln 280, σ = ln(790/280) / 1.2816 ≈ 0.81; capped at 4,900."""
    rng = random.Random(seed)
    mu, sigma = math.log(MEDIAN_CHARS), math.log(P90_CHARS / MEDIAN_CHARS) / 1.2816
    return [min(MAX_CHARS, max(40, int(rng.lognormvariate(mu, sigma)))) for _ in range(n)]


def make_reviews(path: Path, n: int, seed: int = 0) -> dict:
    """Write ``n`` labelled reviews to ``path`` (CSV: id, text, label); returns length statistics."""
    rng = random.Random(seed + 1)
    rows, lengths = [], review_lengths(n, seed)
    for i, target in enumerate(lengths):
        label = rng.choice(["positive", "negative"])
        own, other = (POSITIVE, NEGATIVE) if label == "positive" else (NEGATIVE, POSITIVE)
        sentences = []
        while sum(len(s) + 1 for s in sentences) < target:
            pool = rng.choices([own, NEUTRAL, other], weights=[5, 4, 1])[0]
            sentences.append(rng.choice(pool))
        rows.append({"id": f"r{i}", "text": " ".join(sentences)[:target], "label": label})
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=["id", "text", "label"])
        writer.writeheader()
        writer.writerows(rows)
    chars = sorted(len(r["text"]) for r in rows)
    return {"items": n, "chars_p50": chars[n // 2], "chars_p90": chars[int(0.9 * n)], "chars_max": chars[-1]}


def sft_config(data: Path, out: Path, args, **options):
    from labelrl.train.config import SFTConfig

    return SFTConfig(model="smollm2-135m-instruct", data=str(data), text_col=["text"], label_col="label", lora=True,
                     batch_size=8, max_length=1400, max_steps=args.steps, eval_every=10_000, eval_limit=args.eval_limit,
                     quiet=True, out=out, seed=0, **options)


def run_arm(arm: str, data: Path, args) -> dict:
    """Child process: train ``args.steps`` steps of one arm; its metrics and memory plan."""
    import torch

    from labelrl.train.sft import run_sft

    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="long_inputs_") as tmp:
        summary = run_sft(sft_config(data, Path(tmp) / "run", args, **ARMS[arm]))
        records = [json.loads(line) for line in (Path(tmp) / "run" / "sft_metrics.jsonl").open()]
    timed = records[1:] or records
    return {"arm": arm, "precision": summary["precision"], "memory_plan": summary["memory"],
            "tokens_per_s": statistics.median(r["perf/tokens_per_s"] for r in timed),
            "step_s": statistics.median(r["perf/step_seconds"] for r in timed),
            "padding_share": statistics.mean(r["perf/padding_share"] for r in records),
            "peak_memory_mb": records[-1]["perf/peak_memory_mb"], "steps": len(records),
            "per_step": [{k: r[k] for k in ("perf/tokens_per_s", "perf/padding_share", "perf/step_seconds")} for r in records]}


def available_mb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def child(arm: str, data: Path, args) -> dict:
    command = [sys.executable, __file__, "--only", arm, "--data", str(data), "--steps", str(args.steps),
               "--eval-limit", str(args.eval_limit)] + (["--threads", str(args.threads)] if args.threads else [])
    done = subprocess.run(command, capture_output=True, text=True)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith(RESULT_MARK)]
    if done.returncode != 0 or not lines:
        sys.stderr.write(done.stderr[-4000:])
        return {"arm": arm, "skipped": f"failed (exit {done.returncode}); stderr above"}
    return json.loads(lines[-1][len(RESULT_MARK):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--steps", type=int, default=12, help="SFT steps per arm (the first is not timed)")
    parser.add_argument("--items", type=int, default=2000, help="reviews to generate")
    parser.add_argument("--eval-limit", type=int, default=16, help="val items scored at the last step")
    parser.add_argument("--threads", type=int)
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--before-needs-mb", type=int, default=16_000,
                        help="run the 'before' arm only with this much memory available (it peaked at 14.6 GB in the issue)")
    parser.add_argument("--only", choices=list(ARMS), help=argparse.SUPPRESS)
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    print(cpu_line(), flush=True)  # the kind of CPU every figure below belongs to
    if args.only:
        print(RESULT_MARK + json.dumps(run_arm(args.only, args.data, args)), flush=True)
        return
    with tempfile.TemporaryDirectory(prefix="long_reviews_") as tmp:
        data = Path(tmp) / "reviews.csv"
        lengths = make_reviews(data, args.items)
        machine = busy_note()
        results = {}
        for arm in args.arms:
            free = available_mb()
            if arm == "before" and free is not None and free < args.before_needs_mb:
                results[arm] = {"arm": arm, "skipped": f"{free:.0f} MB available < {args.before_needs_mb} MB it may need"}
                continue
            results[arm] = child(arm, data, args) | {"available_mb_at_start": free}
            print(json.dumps({arm: {k: v for k, v in results[arm].items() if k != "per_step"}}), flush=True)
    report = {"data": lengths, "steps": args.steps, "batch_size": 8, "max_length": 1400, "arms": results,
              "machine": f"start: {machine}; end: {busy_note()}"}
    before, after = results.get("before", {}), results.get("after", {})
    if "tokens_per_s" in before and "tokens_per_s" in after:
        report["tokens_per_s_after_vs_before"] = after["tokens_per_s"] / before["tokens_per_s"]
    render(report)
    if args.json:
        from labelrl.fileio import atomic_write_json

        atomic_write_json(args.json, report)


def render(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    data = report["data"]
    table = Table(title=f"SFT, SmolLM2 + LoRA r=16, batch 8, max length 1400, {data['items']} generated reviews "
                        f"(chars p50 {data['chars_p50']}, p90 {data['chars_p90']}, max {data['chars_max']}), "
                        f"median of steps 2–{report['steps']}")
    for column in ("arm", "precision", "tokens/s", "s/step", "padding share", "peak MB", "predicted MB", "checkpointing"):
        table.add_column(column, justify="right")
    for arm, row in report["arms"].items():
        if "tokens_per_s" not in row:
            table.add_row(arm, row.get("skipped", "?"), *[""] * 6)
            continue
        plan = row["memory_plan"]
        predicted = plan["predicted_peak_checkpointed_mb"] if plan["gradient_checkpointing"] else plan["predicted_peak_mb"]
        table.add_row(arm, row["precision"], f"{row['tokens_per_s']:.0f}", f"{row['step_s']:.2f}",
                      f"{row['padding_share']:.0%}", f"{row['peak_memory_mb']:.0f}", f"{predicted:.0f}",
                      f"{'on' if plan['gradient_checkpointing'] else 'off'} ({plan['reason']})")
    console = Console(width=max(Console().width, 150))
    console.print(table)
    if "tokens_per_s_after_vs_before" in report:
        console.print(f"tokens/s after / before: {report['tokens_per_s_after_vs_before']:.2f}×")
    console.print(f"machine: {report['machine']}")


if __name__ == "__main__":
    main()
