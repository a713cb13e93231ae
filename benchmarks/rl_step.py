"""RL step throughput: labelrl's RL step against TRL 1.16's GRPOTrainer, side by side, fp32 and bf16.

    .venv/bin/python benchmarks/rl_step.py [--json OUT] [--steps N] [--group-sizes 4 8] [--threads T]

Same model (SmolLM2-135M-Instruct, LoRA r=16, alpha 32, all linear layers, same seed), same
data (sms-spam training prompts rendered by labelrl's prompt template), same shape (2 prompts
× G completions, at most 32 new tokens, temperature 1), CPU, and identical grading (labelrl's
grader; TRL gets it through ``labelrl.rewards.reward_fn.trl_reward_func`` with the reward
settings labelrl's trainer resolves). Each framework runs one warm-up step, then ``--steps``
timed steps; figures are medians over the timed steps.

Rows per G:

- ``labelrl`` — the default trainer at its default precision (``auto``: bf16 on a CPU with
  native bf16). The raw model never writes ``<answer>…</answer>``, so every group is uniform
  (reward 0, advantages 0) and the skip rule drops the whole training pass: this row times
  sampling and grading only.
- ``labelrl fp32`` / ``labelrl bf16`` (no skip) — ``skip_uninformative=False``: the training
  pass runs on every group, as TRL's does; this is the fair comparison.
- ``trl fp32`` — ``GRPOTrainer.train()`` with ``bf16=False`` (the setting of this script's
  earlier figures), and ``trl bf16`` with ``bf16=True``, which is GRPOConfig's own default in
  TRL 1.16 and which it accepts on CPU (accelerate's bf16 autocast). Both keep TRL's other
  defaults, gradient checkpointing included. A callback records the end of each step.

JSON: ``labelrl_steps_per_s`` (labelrl, no skip, default precision), ``trl_steps_per_s`` (TRL
with ``bf16=False``), ``trl_faster`` (the TRL row with more steps/s on this machine) and
``ratio_vs_trl``: labelrl's default against TRL's faster setting; ``ratio_vs_trl_fp32`` and
``ratio_vs_trl_bf16`` against each; per-precision keys ``labelrl_fp32_steps_per_s``,
``labelrl_bf16_steps_per_s``, ``trl_bf16_steps_per_s``, ``ratio_fp32_vs_trl``,
``ratio_bf16_vs_trl_bf16``.

Each row runs in its own subprocess (the script re-invokes itself with ``--only``) so that
peak resident memory is that framework's alone. The rows of one G take turns step by step
(``run_paired``): each process loads and runs its warm-up step, then waits; step k of every row
runs before step k + 1 of any, one process at a time, the order rotated each round. A shared
machine's speed drifts over the minutes a row takes, and the turns spread that drift over
every row instead of charging it to whichever ran then. The rows ``ratio_vs_trl`` compares
(labelrl's default precision without skip, and both TRL rows) take turns with each other; the
other two labelrl rows then take theirs. ``ratio_vs_trl_by_round`` lists the ratio of each
round's back-to-back pair. Compare ratios within one invocation, not absolute figures across
runs.

Model FLOP/s = (2 × P × generated tokens + 4 × P × trained tokens) / step seconds, P the
base model's parameters: a forward pass costs about 2 FLOPs per weight per token, the
backward pass through frozen weights (LoRA) about 2 more for the activation gradients; the
LoRA weight gradients are negligible. Trained tokens are prompt + completion tokens of every
sequence in the training pass (labelrl's shared-prompt pass counts each prompt once per
group, so its figure is the work it did, not the work a plain pass would do). Prompt prefill
during sampling is left out. For labelrl the training pass is also timed alone
(``perf/update_seconds``): its model FLOP/s = 4 × P × trained tokens / update seconds. Next
to them, the FLOP/s of a 2048×2048 matrix product in fp32 and in bf16.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from common import busy_note, cpu_line, machine_rates, rates_line, read_bandwidth  # noqa: E402  (benchmarks/common.py; the script's folder is on sys.path)
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from labelrl.fileio import atomic_write_json  # noqa: E402

MODEL = "smollm2-135m-instruct"
DATA = "sms-spam"
PROMPTS_PER_STEP = 2
MAX_NEW_TOKENS = 32
SEED = 0
LEARNING_RATE = 1e-4
VARIANTS = ("labelrl", "labelrl_fp32", "labelrl_bf16", "trl_fp32", "trl_bf16")
LABELS = {"labelrl": "labelrl (default, skip)", "labelrl_fp32": "labelrl fp32", "labelrl_bf16": "labelrl bf16",
          "trl_fp32": "trl fp32 (bf16=False)", "trl_bf16": "trl bf16 (bf16=True)"}
RESULT_MARK = "RL_STEP_RESULT "
READY_MARK = "RL_STEP_READY"  # a --paired child is between steps, waiting for its go on stdin


def rl_config(group_size: int, steps: int, out: Path, skip: bool, precision: str = "auto",
              prompts_per_step: int = PROMPTS_PER_STEP):
    from labelrl.train.config import RLConfig

    return RLConfig(
        model=MODEL, data=DATA, lora=True, lora_r=16, lora_alpha=32, group_size=group_size,
        prompts_per_step=prompts_per_step, max_new_tokens=MAX_NEW_TOKENS, steps=steps, quiet=True,
        out=out, seed=SEED, learning_rate=LEARNING_RATE, skip_uninformative=skip,
        checkpoint_every=10_000, precision=precision,
        val_path=False,  # TRL scores nothing on val between steps; the last step would score 200 items
    )


def base_params(model) -> int:
    """Parameters of the base model (LoRA adapter weights excluded)."""
    return sum(p.numel() for n, p in model.named_parameters() if "lora_" not in n)


def run_labelrl(group_size: int, steps: int, skip: bool, out: Path, precision: str, gate=None) -> dict:
    """One warm-up and ``steps`` timed calls of ``labelrl.train.rl.rl_step``; ``gate()``, when
    given, is called before each timed step and returns when the step may start."""
    from labelrl import metrics_keys as K
    from labelrl.models.precision import precision_name
    from labelrl.train.rl import rl_step, start_run
    from labelrl.train.setup import peak_memory_mb

    run = start_run(rl_config(group_size, 1 + steps, out, skip, precision))
    n_params = base_params(run.model)
    seconds, generated, trained, skipped, rewards, sample_s, update_s = [], [], [], [], [], [], []
    for index in range(1 + steps):
        if index and gate is not None:
            gate()
        started = time.perf_counter()
        record = rl_step(run)
        elapsed = time.perf_counter() - started
        if index == 0:
            continue  # warm-up
        seconds.append(elapsed)
        generated.append(record[K.LENGTH_MEAN] * PROMPTS_PER_STEP * group_size)
        trained.append(record["train/token_passes"])
        skipped.append(record[K.SKIPPED])
        rewards.append(record[K.REWARD_MEAN])
        sample_s.append(record[K.SAMPLE_SECONDS])
        update_s.append(record[K.UPDATE_SECONDS])
    return {"seconds": seconds, "generated_tokens": generated, "trained_tokens": trained,
            "groups_skipped": skipped, "reward_mean": rewards, "params": n_params,
            "peak_rss_mb": peak_memory_mb(), "sample_seconds": sample_s, "update_seconds": update_s,
            "precision": precision_name(run.dtype)}


def trl_dataset_and_reward(group_size: int, steps: int, out: Path):
    """The prompts labelrl draws for its first ``1 + steps`` steps (as text), with labels,
    and labelrl's reward in TRL's signature, resolved exactly as labelrl's trainer does."""
    from datasets import Dataset

    from labelrl.data.prepare import prepare_data
    from labelrl.data.prompts import render_messages, render_prompt
    from labelrl.models import load_model
    from labelrl.rewards.reward_fn import trl_reward_func
    from labelrl.train import rl_parts as parts
    from labelrl.train.setup import init_run_dir, ordered_indices

    cfg = rl_config(group_size, 1 + steps, out, True)
    data = prepare_data(cfg, init_run_dir(cfg, "rl"))
    algo = parts.resolve_algorithm(cfg, data.dataset.labels, [ex.label for ex in data.train])
    torch.manual_seed(SEED)
    model, tokenizer = load_model(MODEL)
    picked = ordered_indices(len(data.train), 0, (1 + steps) * PROMPTS_PER_STEP, SEED)
    examples = [data.train[i] for i in picked]
    texts = [render_prompt(tokenizer, render_messages(ex, labels=data.dataset.labels, mode=cfg.mode, rubric=data.rubric))
             for ex in examples]
    dataset = Dataset.from_dict({"prompt": texts, "label": [ex.label for ex in examples]})
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else None
    reward = trl_reward_func(algo.reward, "label", max_completion_length=MAX_NEW_TOKENS, eos_token_ids=eos)
    return model, tokenizer, dataset, reward


def run_trl(group_size: int, steps: int, out: Path, bf16: bool, gate=None) -> dict:
    """``GRPOTrainer.train()`` for ``1 + steps`` steps; step times from a callback: from the
    previous ``on_step_end`` (the first: ``on_train_begin``) to the step's own, so a step holds
    its batch fetch, generation, grading, loss, backward, optimizer step and the previous step's
    logging. ``gate()``, when given, is called at the end of each step but the last, and the
    next step's time starts when it returns."""
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from labelrl.train.setup import peak_memory_mb

    model, tokenizer, dataset, reward = trl_dataset_and_reward(group_size, steps, out / "data")
    n_params = base_params(model)
    lengths: list[list[int]] = []

    def counting_reward(prompts=None, completions=None, completion_ids=None, **columns):
        lengths.append([len(ids) for ids in completion_ids])
        return reward(prompts=prompts, completions=completions, completion_ids=completion_ids, **columns)

    counting_reward.__name__ = reward.__name__
    prompt_tokens = [len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in dataset["prompt"]]
    begins: list[float] = []
    ends: list[float] = []

    class StepTimes(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            begins.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kwargs):
            ends.append(time.perf_counter())
            if state.global_step < args.max_steps:
                if gate is not None:
                    gate()
                begins.append(time.perf_counter())

    args = GRPOConfig(
        output_dir=str(out / "trl"), per_device_train_batch_size=PROMPTS_PER_STEP * group_size,
        num_generations=group_size, max_completion_length=MAX_NEW_TOKENS, use_cpu=True, bf16=bf16,
        report_to=[], logging_steps=1, save_strategy="no", max_steps=1 + steps, learning_rate=LEARNING_RATE,
        seed=SEED, beta=0.0, temperature=1.0, lr_scheduler_type="constant", top_p=1.0, max_grad_norm=1.0, disable_tqdm=True,
    )
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")
    torch.manual_seed(SEED)
    trainer = GRPOTrainer(model=model, reward_funcs=[counting_reward], args=args, train_dataset=dataset,
                          processing_class=tokenizer, peft_config=lora, callbacks=[StepTimes()])
    trainer.train()
    step_seconds = [end - begin for begin, end in zip(begins, ends)][1:]
    generated = [sum(step) for step in lengths][1:]
    mean_prompt = statistics.mean(prompt_tokens)
    # TRL's training pass forwards every sequence, prompt included, G times per prompt.
    trained = [sum(step) + len(step) * mean_prompt for step in lengths][1:]
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h][1:]
    return {"seconds": step_seconds, "generated_tokens": generated, "trained_tokens": trained,
            "groups_skipped": [0] * len(step_seconds), "reward_mean": rewards, "params": n_params,
            "peak_rss_mb": peak_memory_mb(), "precision": "bf16" if bf16 else "fp32",
            "gradient_checkpointing": bool(getattr(args, "activation_checkpointing", None) or args.gradient_checkpointing)}


def run_only(args) -> None:
    """Child process: one variant at one G; prints one JSON result line."""
    if args.threads:
        torch.set_num_threads(args.threads)
    group_size = args.group_sizes[0]
    gate = None
    if args.paired:
        def gate():  # tell the parent this process is between steps, and wait for its go
            print(READY_MARK, flush=True)
            if not sys.stdin.readline():
                raise SystemExit("the parent process closed its pipe before the last step")
    with tempfile.TemporaryDirectory(prefix="rl_step_") as tmp:
        out = Path(tmp)
        if args.only.startswith("trl"):
            result = run_trl(group_size, args.steps, out, bf16=args.only == "trl_bf16", gate=gate)
        else:
            precision = {"labelrl": "auto", "labelrl_fp32": "fp32", "labelrl_bf16": "bf16"}[args.only]
            result = run_labelrl(group_size, args.steps, args.only == "labelrl", out / "run", precision, gate=gate)
    result.update(variant=args.only, group_size=group_size, torch_threads=torch.get_num_threads())
    print(RESULT_MARK + json.dumps(result), flush=True)


class Child:
    """One variant's process, started with ``--paired``: it loads, runs its warm-up step, then
    runs each timed step when told to."""

    def __init__(self, variant: str, group_size: int, args):
        command = [sys.executable, __file__, "--only", variant, "--steps", str(args.steps),
                   "--group-sizes", str(group_size), "--paired"]
        if args.threads:
            command += ["--threads", str(args.threads)]
        self.variant, self.group_size = variant, group_size
        self.stderr = tempfile.TemporaryFile(mode="w+")  # a file, not a pipe: a full pipe would stall the child
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
                                        text=True)

    def wait_for(self, *marks: str) -> str:
        """The child's next stdout line that starts with one of ``marks`` (others are skipped)."""
        for line in self.process.stdout:
            if line.startswith(marks):
                return line
        self.process.wait()
        self.fail(f"failed (exit {self.process.returncode})")

    def fail(self, what: str) -> None:
        """Raises, after writing the tail of the child's stderr."""
        self.stderr.seek(0)
        sys.stderr.write(self.stderr.read()[-4000:])
        raise RuntimeError(f"{self.variant} at G={self.group_size} {what}; its stderr is above")

    def step(self, last: bool) -> str:
        """Runs one timed step; returns when it is done (the last: with the result line, once
        the process has exited, so that freeing its memory overlaps no other row's step)."""
        self.process.stdin.write("go\n")
        self.process.stdin.flush()
        if not last:
            return self.wait_for(READY_MARK)
        line = self.wait_for(RESULT_MARK)
        self.process.stdin.close()
        if self.process.wait() != 0:
            self.fail(f"exited with {self.process.returncode} after its result")
        return line

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.stderr.close()


def run_paired(variants: list[str], group_size: int, args) -> dict[str, dict]:
    """Each variant's raw figures, their timed steps taken in turns: step k of every variant runs
    before step k + 1 of any, one process at a time (the others wait between steps), the order
    rotated each round. A change in the machine's speed then reaches every variant alike instead
    of whichever one was running. The processes start one after another, each waiting after its
    warm-up, so no two warm-ups overlap."""
    children = []
    try:
        for variant in variants:
            children.append(Child(variant, group_size, args))
            children[-1].wait_for(READY_MARK)
        results = {}
        for step in range(args.steps):
            shift = step % len(children)
            last = step == args.steps - 1
            for child in children[shift:] + children[:shift]:
                line = child.step(last)
                if last:
                    results[child.variant] = json.loads(line[len(RESULT_MARK):])
        return results
    finally:
        for child in children:
            child.close()


def summarise(raw: dict) -> dict:
    """Medians of one variant's timed steps."""
    step_s = statistics.median(raw["seconds"])
    generated = statistics.median(raw["generated_tokens"])
    trained = statistics.median(raw["trained_tokens"])
    out = {
        "steps_per_s": 1 / step_s, "step_s_median": step_s, "step_s": raw["seconds"],
        "generated_tokens_per_s": generated / step_s,
        "model_flops": (2 * raw["params"] * generated + 4 * raw["params"] * trained) / step_s,
        "generated_tokens_median": generated, "trained_tokens_median": trained,
        "groups_skipped": raw["groups_skipped"], "reward_mean": raw["reward_mean"],
        "peak_rss_mb": raw["peak_rss_mb"], "precision": raw["precision"],
    }
    if "update_seconds" in raw:
        update_s = statistics.median(raw["update_seconds"])
        out.update(sample_s_median=statistics.median(raw["sample_seconds"]), update_s_median=update_s,
                   training_pass_flops=4 * raw["params"] * trained / update_s if trained else 0.0)
    return out


def measure_group(group_size: int, args) -> dict:
    from labelrl.models.precision import precision_name, resolve_dtype

    # ratio_vs_trl's rows take turns with each other, three processes at a time (at G = 8 their
    # peaks added to 14.9 GB on SmolLM2); the other two labelrl rows then take turns with each other.
    default = "labelrl_" + precision_name(resolve_dtype("auto"))  # the no-skip row at the default precision
    first = [default, "trl_fp32", "trl_bf16"]
    raw = run_paired(first, group_size, args)
    raw.update(run_paired([variant for variant in VARIANTS if variant not in first], group_size, args))
    rows = {variant: summarise(raw[variant]) for variant in VARIANTS}
    if default != "labelrl_" + rows["labelrl"]["precision"]:
        raise RuntimeError(f"the default trainer ran in {rows['labelrl']['precision']}, not {default.removeprefix('labelrl_')} as resolved here")
    sps = {name: row["steps_per_s"] for name, row in rows.items()}
    faster = max(("trl_fp32", "trl_bf16"), key=lambda name: sps[name])
    return {
        "group_size": group_size, "rows": rows, "labelrl_default_precision": rows["labelrl"]["precision"],
        "labelrl_steps_per_s": sps[default], "labelrl_skip_steps_per_s": sps["labelrl"],
        "labelrl_fp32_steps_per_s": sps["labelrl_fp32"], "labelrl_bf16_steps_per_s": sps["labelrl_bf16"],
        "trl_steps_per_s": sps["trl_fp32"], "trl_bf16_steps_per_s": sps["trl_bf16"],
        # against TRL's faster setting on this machine, whichever precision that is
        "trl_faster": faster, "ratio_vs_trl": sps[default] / sps[faster],
        # step k of the two rows ran back to back (run_paired): the spread of the ratio within pairs
        "ratio_vs_trl_by_round": [trl / ours for ours, trl in zip(raw[default]["seconds"], raw[faster]["seconds"])],
        "ratio_vs_trl_fp32": sps[default] / sps["trl_fp32"], "ratio_vs_trl_bf16": sps[default] / sps["trl_bf16"],
        "ratio_fp32_vs_trl": sps["labelrl_fp32"] / sps["trl_fp32"],
        "ratio_bf16_vs_trl_bf16": sps["labelrl_bf16"] / sps["trl_bf16"],
        "ratio_vs_trl_with_skip": sps["labelrl"] / sps["trl_fp32"],
        "labelrl_bf16_vs_fp32": sps["labelrl_bf16"] / sps["labelrl_fp32"],
    }


def render(report: dict) -> None:
    table = Table(title=f"RL step, SmolLM2-135M + LoRA r=16, {PROMPTS_PER_STEP} prompts × G, ≤{MAX_NEW_TOKENS} new tokens, "
                        f"median of {report['steps']} steps after 1 warm-up")
    for column in ("G", "framework", "s/step", "vs trl fp32", "vs trl bf16", "sample s", "train s", "gen tok/s",
                   "GFLOP/s step | train pass", "peak RSS MB", "skipped", "reward"):
        table.add_column(column, justify="right")
    for cell in report["results"]:
        trl, trl16 = cell["trl_steps_per_s"], cell["trl_bf16_steps_per_s"]
        for variant in VARIANTS:
            row = cell["rows"][variant]
            train_pass = f" | {row['training_pass_flops'] / 1e9:.1f}" if row.get("training_pass_flops") else ""
            table.add_row(
                str(cell["group_size"]), LABELS[variant] + (f" [{row['precision']}]" if variant == "labelrl" else ""),
                f"{row['step_s_median']:.2f}", f"{row['steps_per_s'] / trl:.2f}×", f"{row['steps_per_s'] / trl16:.2f}×",
                f"{row['sample_s_median']:.2f}" if "sample_s_median" in row else "–",
                f"{row['update_s_median']:.2f}" if "update_s_median" in row else "–",
                f"{row['generated_tokens_per_s']:.1f}", f"{row['model_flops'] / 1e9:.1f}{train_pass}",
                f"{row['peak_rss_mb']:.0f}", "/".join(str(s) for s in row["groups_skipped"]),
                "/".join(f"{r:.2f}" for r in row["reward_mean"]),
            )
    console = Console(width=max(Console().width, 150))
    console.print(table)
    # sampling is bound by reading the weights, the training pass by products: both rates say how the host compares
    console.print(rates_line(report["matmul_flops"]) + f"; memory read {report['memory_read_bytes_per_s'] / 1e9:.1f} GB/s"
                  + "; model FLOP/s = (2·P·generated + 4·P·trained tokens) / step "
                  "time; training pass = 4·P·trained tokens / its own time")
    console.print("ratio_vs_trl: labelrl at its default precision without the skip rule (trains on every group, as TRL "
                  "does) against TRL's faster setting on this machine ("
                  + ", ".join(f"G={c['group_size']}: {LABELS[c['trl_faster']]}, {c['ratio_vs_trl']:.2f}×; step by step "
                              + "/".join(f"{r:.2f}" for r in c["ratio_vs_trl_by_round"]) for c in report["results"])
                  + "); the 'labelrl (default, skip)' row skips the training pass of uniform groups (all groups here: the "
                  "raw model earns 0).")
    console.print(f"machine: {report['machine']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the figures to this JSON file")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per framework after 1 warm-up (median reported)")
    parser.add_argument("--group-sizes", type=int, nargs="+", default=[4, 8], help="completions per prompt (G)")
    parser.add_argument("--threads", type=int, help="torch CPU threads in every process (default: torch's choice)")
    parser.add_argument("--only", choices=VARIANTS, help=argparse.SUPPRESS)  # child process
    parser.add_argument("--paired", action="store_true", help=argparse.SUPPRESS)  # child: each timed step on a go
    args = parser.parse_args()
    print(cpu_line(), flush=True)  # the kind of CPU every figure below belongs to
    if args.steps < 1:
        raise ValueError(f"--steps {args.steps}: the median needs at least 1 timed step; pass --steps 1 or more")
    if args.only:
        run_only(args)
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    machine = busy_note()
    results = [measure_group(g, args) for g in args.group_sizes]
    first = results[0]
    report = {
        "model": MODEL, "data": DATA, "prompts_per_step": PROMPTS_PER_STEP, "max_new_tokens": MAX_NEW_TOKENS,
        "steps": args.steps, "group_sizes": args.group_sizes, "torch_threads": torch.get_num_threads(),
        **{key: first[key] for key in first if key.endswith("_steps_per_s") or key.startswith("ratio")},
        "labelrl_default_precision": first["labelrl_default_precision"], "matmul_flops": machine_rates(),
        "memory_read_bytes_per_s": read_bandwidth(),
        "results": results, "machine": f"start: {machine}; end: {busy_note()}",
    }
    render(report)
    if args.json:
        atomic_write_json(args.json, report)


if __name__ == "__main__":
    main()
