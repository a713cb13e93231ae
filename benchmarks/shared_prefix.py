"""The prompt prefix a batch shares, run once: SFT steps, RL training passes and label-token
scoring, with and without it, on SmolLM2-135M-Instruct + LoRA r=16 and the demo's prompts.

    .venv/bin/python benchmarks/shared_prefix.py [--json OUT] [--runs 5] [--precision bf16|fp32] [--threads N]

Tasks, as the demo renders them (direct mode, SmolLM2's chat template): sms-spam (no rubric)
and vader-movies with ``rubrics/sentiment5.md``; the first training items of each (group-aware
split, seed 0). Workloads, each timed with the shared prefix on and off:

* ``sft``: one SFT step's forward and backward on 8 items (prompt + ``<answer>L</answer>``),
  packed rows when the prefix is off (the default layout), ``prefix_layout`` when on;
* ``rl``: the training pass of one RL step, 4 prompts × G = 4 completions of the answer
  format (``completion_logprobs_shared``, forward and backward);
* ``score``: label-token scoring of 64 val prompts in batches of 16 (``score_labels``).

"Off" raises ``labelrl.rollout.prefix.MIN_SHARED`` past any prompt, so every route takes its
plain pass; nothing else changes. Each figure is the median of ``--runs`` timed runs after one
warm-up, on and off alternating run by run so machine noise hits both alike; the ratio
off/on is the figure to compare across machines. The CPU, its bf16/AMX flags, the threads and
the load average are printed next to the table.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

import labelrl.rollout.prefix as prefix_module  # noqa: E402
from labelrl.data import load_dataset  # noqa: E402
from labelrl.data.prompts import answer_target, render_messages, render_prompt  # noqa: E402
from labelrl.data.split import make_splits, select  # noqa: E402
from labelrl.evaluate.score import score_labels  # noqa: E402
from labelrl.fileio import atomic_write_json  # noqa: E402
from labelrl.rollout import completion_logprobs_shared  # noqa: E402
from labelrl.train.sft import SFTItem, batch_layout, sft_loss  # noqa: E402
from common import DTYPES, busy_note, cpu_line, timing_args  # noqa: E402  (benchmarks/common.py)

RUBRIC = Path(__file__).resolve().parents[1] / "src" / "labelrl" / "recipes" / "rubrics" / "sentiment5.md"
TASKS = {"spam": ("sms-spam", None), "movies": ("vader-movies", RUBRIC)}
G = 4


def lora_model():
    from peft import LoraConfig, get_peft_model

    from labelrl.models import load_model

    torch.manual_seed(0)
    model, tokenizer = load_model("smollm2-135m-instruct")
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear",
                                             task_type="CAUSAL_LM"))
    return model.train(), tokenizer


def task_inputs(tokenizer, dataset_name: str, rubric: Path | None):
    dataset = load_dataset(dataset_name)
    splits = make_splits(dataset, seed=0)
    text = rubric.read_text(encoding="utf-8") if rubric else None

    def ids(examples):
        return [tokenizer(render_prompt(tokenizer, render_messages(ex, labels=dataset.labels, mode="direct", rubric=text)),
                          add_special_tokens=False)["input_ids"] for ex in examples]

    train, val = select(dataset, splits, "train")[:8], select(dataset, splits, "val")[:64]
    prompts = ids(train)
    targets = [tokenizer(answer_target(ex.label, "direct"), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
               for ex in train]
    items = [SFTItem(p + t, len(p)) for p, t in zip(prompts, targets)]
    return dataset.labels, items, prompts[:4], [targets[(i + j) % len(targets)] for i in range(4) for j in range(G)], ids(val)


def workloads(model, tokenizer, task, dtype):
    labels, items, rl_prompts, completions, val = task
    pad = tokenizer.pad_token_id

    def sft():
        model.zero_grad(set_to_none=True)
        sft_loss(model, batch_layout(items, pad, pack=True, share_prefix=True), pad, dtype).backward()

    def rl():
        model.zero_grad(set_to_none=True)
        logprobs, mask = completion_logprobs_shared(model, rl_prompts, completions, G, pad_token_id=pad, dtype=dtype)
        (logprobs * mask).sum().backward()

    def score():
        score_labels(model, tokenizer, val, labels, batch_size=16, dtype=dtype)

    return {"sft": sft, "rl": rl, "score": score}


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main() -> None:
    args = timing_args(__doc__.split("\n\n")[0])
    dtype, console = DTYPES[args.precision], Console()
    model, tokenizer = lora_model()
    on = prefix_module.MIN_SHARED
    results = {}
    for task_name, (dataset_name, rubric) in TASKS.items():
        task = task_inputs(tokenizer, dataset_name, rubric)
        shared = prefix_module.shared_prefix_length([it.input_ids for it in task[1]])
        for name, fn in workloads(model, tokenizer, task, dtype).items():
            seconds = {"on": [], "off": []}
            for run in range(args.runs + 1):  # run 0 warms up
                for arm in ("on", "off"):
                    prefix_module.MIN_SHARED = on if arm == "on" else 10**9
                    elapsed = timed(fn)
                    if run:
                        seconds[arm].append(elapsed)
            prefix_module.MIN_SHARED = on
            medians = {arm: statistics.median(v) for arm, v in seconds.items()}
            results[f"{task_name}/{name}"] = {"shared_prefix_tokens": shared, "seconds": seconds, "median": medians,
                                              "speedup": medians["off"] / medians["on"]}
            console.print(f"{task_name}/{name}: off {medians['off']:.3f} s, on {medians['on']:.3f} s", highlight=False)
    table = Table(title=f"shared prefix on/off, SmolLM2 + LoRA r=16, {args.precision}, median of {args.runs}")
    for column in ("workload", "prefix tokens", "off (s)", "on (s)", "off/on"):
        table.add_column(column, justify="right" if column != "workload" else "left")
    for key, r in results.items():
        table.add_row(key, str(r["shared_prefix_tokens"]), f"{r['median']['off']:.3f}", f"{r['median']['on']:.3f}",
                      f"{r['speedup']:.2f}×")
    console.print(table)
    console.print(f"{cpu_line()}; threads {torch.get_num_threads()}; {busy_note()}", highlight=False)
    if args.json:
        atomic_write_json(args.json, {"cpu": cpu_line(), "precision": args.precision, "runs": args.runs, "results": results})


if __name__ == "__main__":
    main()
