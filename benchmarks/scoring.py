"""Label-token scoring against generating the answer, on SmolLM2 and sms-spam val prompts, fp32 and bf16.

    .venv/bin/python benchmarks/scoring.py [--json OUT] [--runs 3] [--prompts 32] [--batch-size 8] [--threads N]

The prompts are the first ``--prompts`` val items of sms-spam (group-aware split, seed 0) in
direct mode. Methods, each over all prompts in batches of ``--batch-size``:

* ``scores/fp32``, ``scores/bf16``: ``labelrl.evaluate.score.score_labels``, one forward pass
  per batch over prompt + ``<answer>``, P(label) from the label tokens; no generation;
* ``generate/labelrl/fp32``, ``generate/labelrl/bf16``: greedy decoding with labelrl's
  sampler, at most 8 new tokens (enough for ``<answer>spam</answer>``), stopping at EOS;
* ``generate/hf/fp32``: the same with Hugging Face ``generate``.

Agreement of bf16 with fp32 is measured: the share of prompts whose scored label is the same,
the largest difference of a label probability, and the share of identical greedy answers.

Each figure is the median of ``--runs`` timed runs after one warm-up, methods alternating
run by run so machine noise hits all alike; the ratio (examples/s of scoring over
examples/s of generating) is the figure to compare across machines. The ratio of the
fastest runs is printed too: on a shared machine those are the least disturbed.

Model FLOP/s = useful forward FLOPs / median seconds (``common.forward_flops``): scoring
forwards prompt + ``<answer>`` and projects one position per prompt onto the vocabulary
(one pass per label, each projecting its label's positions, when labels share a first
token); generating forwards the prompt and each new token and projects one position per
new token. Next to it, the FLOP/s of a 2048×2048 matrix product in fp32 and in bf16: what the
machine can do at best in each.
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
from common import DTYPES, busy_note, cpu_line, forward_flops, machine_rates, rates_line  # noqa: E402  (benchmarks/common.py)

MAX_NEW_TOKENS = 8


def val_prompts(tokenizer, n: int):
    dataset = load_dataset("sms-spam")
    examples = select(dataset, make_splits(dataset, seed=0), "val")[:n]
    ids = []
    for ex in examples:
        text = render_prompt(tokenizer, render_messages(ex, labels=dataset.labels, mode="direct"))
        ids.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return dataset.labels, examples, ids


def run_scores(model, tokenizer, prompts, labels, batch_size, dtype):
    """Predicted labels and their probabilities, and (token positions forwarded, positions projected)."""
    probs = score_labels(model, tokenizer, prompts, labels, batch_size=batch_size, dtype=dtype)
    prefix = len(tokenizer(ANSWER_PREFIX, add_special_tokens=False)["input_ids"])
    label_ids = label_token_ids(tokenizer, labels)
    forwarded = [len(p) + prefix for p in prompts]
    if len({ids[0] for ids in label_ids}) == len(label_ids):  # one pass, the last position projected
        work = (sum(forwarded), len(prompts))
    else:  # one pass per label, its label's positions (and one past them) projected
        work = (sum(sum(forwarded) + len(prompts) * len(ids) for ids in label_ids),
                sum(len(prompts) * (len(ids) + 1) for ids in label_ids))
    return ([labels.labels[i] for i in probs.argmax(-1).tolist()], probs), work


def run_generate(sampler, model, tokenizer, prompts, labels, batch_size, dtype):
    """Parsed answers and the raw completions, and (token positions forwarded, positions projected)."""
    answers, completions, new_tokens = [], [], 0
    for start in range(0, len(prompts), batch_size):
        batch = sampler(model, prompts[start : start + batch_size], group_size=1, max_new_tokens=MAX_NEW_TOKENS,
                        eos_token_ids=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, temperature=0.0,
                        dtype=dtype)
        new_tokens += sum(batch.lengths)
        completions += batch.completion_ids
        for ids, truncated in zip(batch.completion_ids, batch.truncated):
            text = tokenizer.decode(ids, skip_special_tokens=True)
            answers.append(parse_answer(text, reasoning=False, labels=labels, truncated=truncated).answer)
    return (answers, completions), (sum(map(len, prompts)) + new_tokens, new_tokens)


def agreement(outputs: dict) -> dict:
    """bf16 against fp32: same scored label, largest probability difference, same greedy answer."""
    (pred32, p32), (pred16, p16) = outputs["scores/fp32"], outputs["scores/bf16"]
    gen32, gen16 = outputs["generate/labelrl/fp32"][1], outputs["generate/labelrl/bf16"][1]
    return {"scored_label_same_share": sum(a == b for a, b in zip(pred32, pred16)) / len(pred32),
            "max_probability_difference": float((p32 - p16).abs().max()),
            "greedy_completion_same_share": sum(a == b for a, b in zip(gen32, gen16)) / len(gen32)}


def methods_for(model, tokenizer, prompts, labels, batch_size) -> dict:
    methods = {}
    for name, dtype in DTYPES.items():
        methods[f"scores/{name}"] = lambda d=dtype: run_scores(model, tokenizer, prompts, labels, batch_size, d)
    for name, dtype in DTYPES.items():
        methods[f"generate/labelrl/{name}"] = lambda d=dtype: run_generate(sample_groups, model, tokenizer, prompts,
                                                                             labels, batch_size, d)
    methods["generate/hf/fp32"] = lambda: run_generate(generate_groups, model, tokenizer, prompts, labels, batch_size,
                                                       torch.float32)
    return methods


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    print(cpu_line(), flush=True)  # the kind of CPU every figure below belongs to
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load_model("smollm2-135m-instruct")
    model.requires_grad_(False)  # evaluation: frozen weights, packed once
    labels, examples, prompts = val_prompts(tokenizer, args.prompts)
    methods = methods_for(model, tokenizer, prompts, labels, args.batch_size)
    machine = busy_note()
    seconds: dict[str, list[float]] = {name: [] for name in methods}
    outputs, work = {}, {}
    for name, fn in methods.items():  # warm-up (allocator, kernels)
        outputs[name], work[name] = fn()
    for _ in range(args.runs):
        for name, fn in methods.items():
            started = time.perf_counter()
            fn()
            seconds[name].append(time.perf_counter() - started)
    truth = [ex.label for ex in examples]
    rows = {}
    for name, times in seconds.items():
        median, answers = statistics.median(times), outputs[name][0]
        rows[name] = {
            "median_s": median, "runs_s": times, "examples_per_s": len(prompts) / median,
            "parsed_share": sum(a is not None for a in answers) / len(prompts),
            "accuracy": sum(a == t for a, t in zip(answers, truth)) / len(prompts),
            "tokens_forwarded": work[name][0], "positions_projected": work[name][1],
            "model_flops": forward_flops(model, *work[name]) / median,
        }
    eps = lambda name: rows[name]["examples_per_s"]  # noqa: E731
    ratios = {"scores_bf16_vs_fp32": eps("scores/bf16") / eps("scores/fp32"),
              "scores_bf16_vs_generate_hf_fp32": eps("scores/bf16") / eps("generate/hf/fp32"),
              "scores_fp32_vs_generate_hf_fp32": eps("scores/fp32") / eps("generate/hf/fp32"),
              "generate_labelrl_bf16_vs_fp32": eps("generate/labelrl/bf16") / eps("generate/labelrl/fp32")}
    result = {"model": "smollm2-135m-instruct", "dataset": "sms-spam val", "prompts": len(prompts),
              "prompt_tokens_mean": sum(map(len, prompts)) / len(prompts), "batch_size": args.batch_size,
              "max_new_tokens": MAX_NEW_TOKENS, "runs": args.runs, "threads": torch.get_num_threads(),
              "matmul_flops": machine_rates(), "methods": rows, "speedup": ratios,
              "bf16_agreement": agreement(outputs), "machine": f"start: {machine}; end: {busy_note()}"}
    render(result, args)
    if args.json:
        atomic_write_json(args.json, result)


def render(result: dict, args) -> None:
    table = Table(title=f"{result['prompts']} sms-spam val prompts, batch {args.batch_size}, median of {args.runs}")
    for col in ("method", "median s", "examples/s", "parsed", "accuracy", "GFLOP/s"):
        table.add_column(col, justify="left" if col == "method" else "right")
    for name, row in result["methods"].items():
        table.add_row(name, f"{row['median_s']:.2f}", f"{row['examples_per_s']:.2f}", f"{row['parsed_share']:.0%}",
                      f"{row['accuracy']:.2f}", f"{row['model_flops'] / 1e9:.1f}")
    console = Console(width=max(Console().width, 120))
    console.print(table)
    console.print(rates_line(result["matmul_flops"]) + " (model GFLOP/s: useful forward FLOPs per second, see the "
                  "module docstring)")
    for name, ratio in result["speedup"].items():
        console.print(f"{name}: {ratio:.2f}× the examples per second (medians)")
    console.print(f"bf16 vs fp32: {result['bf16_agreement']}")
    console.print(f"machine: {result['machine']}")


if __name__ == "__main__":
    main()
