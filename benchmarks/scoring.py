"""Label-token scoring against generating the answer, on SmolLM2 and sms-spam val prompts.

    .venv/bin/python benchmarks/scoring.py [--json OUT] [--runs 3] [--prompts 32] [--batch-size 8] [--threads N]

The prompts are the first ``--prompts`` val items of sms-spam (group-aware split, seed 0) in
direct mode. Methods, each over all prompts in batches of ``--batch-size``:

* ``scores``: ``labelrl.evaluate.score.score_labels``, one forward pass per batch over
  prompt + ``<answer>``, P(label) from the label tokens; no generation;
* ``generate/labelrl``: greedy decoding with labelrl's sampler, at most 8 new tokens
  (enough for ``<answer>spam</answer>``), stopping at EOS;
* ``generate/hf``: the same with Hugging Face ``generate``.

Each figure is the median of ``--runs`` timed runs after one warm-up, methods alternating
run by run so machine noise hits all alike; the ratio (examples/s of scoring over
examples/s of generating) is the figure to compare across machines. The ratio of the
fastest runs is printed too: on a shared machine those are the least disturbed.

Model FLOP/s = useful forward FLOPs / median seconds (``common.forward_flops``): scoring
forwards prompt + ``<answer>`` and projects one position per prompt onto the vocabulary
(one pass per label, each projecting its label's positions, when labels share a first
token); generating forwards the prompt and each new token and projects one position per
new token. Next to it, the FLOP/s of a 2048×2048 fp32 matrix product: what the machine can
do at best.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from labelrl.data import load_dataset  # noqa: E402
from labelrl.data.prompts import ANSWER_PREFIX, render_messages, render_prompt  # noqa: E402
from labelrl.data.split import make_splits, select  # noqa: E402
from labelrl.fileio import atomic_write_json  # noqa: E402
from labelrl.evaluate.score import label_token_ids, score_labels  # noqa: E402
from labelrl.models import load_model  # noqa: E402
from labelrl.rewards import parse_answer  # noqa: E402
from labelrl.rollout import generate_groups, sample_groups  # noqa: E402
from common import forward_flops, matmul_flops  # noqa: E402  (benchmarks/common.py; the script's folder is on sys.path)

MAX_NEW_TOKENS = 8


def val_prompts(tokenizer, n: int):
    dataset = load_dataset("sms-spam")
    examples = select(dataset, make_splits(dataset, seed=0), "val")[:n]
    ids = []
    for ex in examples:
        text = render_prompt(tokenizer, render_messages(ex, labels=dataset.labels, mode="direct"))
        ids.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return dataset.labels, examples, ids


def run_scores(model, tokenizer, prompts, labels, batch_size):
    """Predicted labels, and (token positions forwarded, positions projected)."""
    probs = score_labels(model, tokenizer, prompts, labels, batch_size=batch_size)
    prefix = len(tokenizer(ANSWER_PREFIX, add_special_tokens=False)["input_ids"])
    label_ids = label_token_ids(tokenizer, labels)
    forwarded = [len(p) + prefix for p in prompts]
    if len({ids[0] for ids in label_ids}) == len(label_ids):  # one pass, the last position projected
        work = (sum(forwarded), len(prompts))
    else:  # one pass per label, its label's positions (and one past them) projected
        work = (sum(sum(forwarded) + len(prompts) * len(ids) for ids in label_ids),
                sum(len(prompts) * (len(ids) + 1) for ids in label_ids))
    return [labels.labels[i] for i in probs.argmax(-1).tolist()], work


def run_generate(sampler, model, tokenizer, prompts, labels, batch_size):
    """Parsed answers, and (token positions forwarded, positions projected)."""
    answers, new_tokens = [], 0
    for start in range(0, len(prompts), batch_size):
        batch = sampler(model, prompts[start : start + batch_size], group_size=1, max_new_tokens=MAX_NEW_TOKENS,
                        eos_token_ids=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, temperature=0.0)
        new_tokens += sum(batch.lengths)
        for ids, truncated in zip(batch.completion_ids, batch.truncated):
            text = tokenizer.decode(ids, skip_special_tokens=True)
            answers.append(parse_answer(text, reasoning=False, labels=labels, truncated=truncated).answer)
    return answers, (sum(map(len, prompts)) + new_tokens, new_tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load_model("smollm2-135m-instruct")
    labels, examples, prompts = val_prompts(tokenizer, args.prompts)
    methods = {
        "scores": lambda: run_scores(model, tokenizer, prompts, labels, args.batch_size),
        "generate/labelrl": lambda: run_generate(sample_groups, model, tokenizer, prompts, labels, args.batch_size),
        "generate/hf": lambda: run_generate(generate_groups, model, tokenizer, prompts, labels, args.batch_size),
    }
    seconds: dict[str, list[float]] = {name: [] for name in methods}
    answers, work = {}, {}
    for name, fn in methods.items():  # warm-up (allocator, kernels)
        answers[name], work[name] = fn()
    for _ in range(args.runs):
        for name, fn in methods.items():
            started = time.perf_counter()
            fn()
            seconds[name].append(time.perf_counter() - started)
    truth = [ex.label for ex in examples]
    rows = {}
    for name, times in seconds.items():
        median = statistics.median(times)
        rows[name] = {
            "median_s": median, "runs_s": times, "examples_per_s": len(prompts) / median,
            "parsed_share": sum(a is not None for a in answers[name]) / len(prompts),
            "accuracy": sum(a == t for a, t in zip(answers[name], truth)) / len(prompts),
            "tokens_forwarded": work[name][0], "positions_projected": work[name][1],
            "model_flops": forward_flops(model, *work[name]) / median,
        }
    ratios = {f"scores_vs_{name}": rows["scores"]["examples_per_s"] / rows[name]["examples_per_s"]
              for name in methods if name != "scores"}
    # On a shared machine the fastest run of each method is the least disturbed one.
    best_ratios = {f"scores_vs_{name}": min(seconds[name]) / min(seconds["scores"]) for name in methods if name != "scores"}
    result = {"model": "smollm2-135m-instruct", "dataset": "sms-spam val", "prompts": len(prompts),
              "prompt_tokens_mean": sum(map(len, prompts)) / len(prompts), "batch_size": args.batch_size,
              "max_new_tokens": MAX_NEW_TOKENS, "runs": args.runs, "threads": torch.get_num_threads(),
              "matmul_flops": matmul_flops(), "methods": rows, "speedup": ratios, "speedup_best_runs": best_ratios}
    table = Table(title=f"{len(prompts)} sms-spam val prompts, batch {args.batch_size}, median of {args.runs}")
    for col in ("method", "median s", "examples/s", "parsed", "accuracy", "GFLOP/s"):
        table.add_column(col, justify="left" if col == "method" else "right")
    for name, row in rows.items():
        table.add_row(name, f"{row['median_s']:.2f}", f"{row['examples_per_s']:.2f}", f"{row['parsed_share']:.0%}",
                      f"{row['accuracy']:.2f}", f"{row['model_flops'] / 1e9:.1f}")
    console = Console()
    console.print(table)
    console.print(f"fp32 2048×2048 matmul: {result['matmul_flops'] / 1e9:.1f} GFLOP/s (model GFLOP/s: useful forward "
                  "FLOPs per second, see the module docstring)")
    for name, ratio in ratios.items():
        console.print(f"{name}: {ratio:.2f}× the examples per second (medians; best runs {best_ratios[name]:.2f}×)")
    if args.json:
        atomic_write_json(args.json, result)
        console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
