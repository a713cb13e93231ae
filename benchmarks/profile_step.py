"""Where the RL training pass spends its time: a ``torch.profiler`` table of the share inside
matrix products and outside them (casts, attention, elementwise ops, the vocabulary's
log-softmax, the Python between operators).

    .venv/bin/python benchmarks/profile_step.py [--json OUT] [--runs 5] [--precision bf16|fp32] [--threads N]

The pass is ``benchmarks/rl_step.py``'s: SmolLM2-135M-Instruct + LoRA r=16 (all linear
layers), 2 sms-spam training prompts × G = 4 completions of 32 tokens, the shared-prompt
forward (``completion_logprobs_shared``) and its backward. One warm-up pass, then ``--runs``
profiled passes of each of four variants, each keeping the changes before it: "before"
(autocast casts every frozen weight at every forward call, and peft's LoRA forward computes
the update in bf16), "base cast once" (the frozen base's bf16 copy kept between forward calls,
``labelrl.models.precision.frozen_weights_cast_once``), "+ fp32 adapter update" (the update in
fp32 without peft's casts, ``precision._lean_lora_forward``), these three through the model's
modules, and "+ lean pass" (``labelrl.rollout.lean_pass``, the default: fused q/k/v and
gate/up products, each group's adapters as one pair of products, no per-module Python). Each operator's
self time (its own, without the operators it calls) is summed per category over the passes.
"outside operators" is the wall time minus every operator's self time: Python, the autograd
engine's bookkeeping and module hooks. Then ``--runs`` passes of each without the profiler,
the variants alternating, for the seconds and rates. Model FLOP/s = 4 × P × (prompt +
completion positions) / seconds (forward 2, backward through frozen weights 2 per weight per
token), next to the 2048² matrix product's rate in the same precision.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections import defaultdict

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from common import DTYPES, busy_note, cpu_line, forward_flops, machine_rates, timing_args  # noqa: E402  (benchmarks/common.py)
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from labelrl.fileio import atomic_write_json  # noqa: E402
from labelrl.rollout import completion_logprobs_shared  # noqa: E402
from shared_prefix import lora_model, task_inputs  # noqa: E402  (benchmarks/shared_prefix.py)

G, PROMPTS, NEW_TOKENS = 4, 2, 32
# Operator name → category; the first pattern contained in the name wins.
CATEGORIES = (
    ("matrix products", ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::linear", "mkldnn", "onednn")),
    ("attention", ("scaled_dot_product", "flash_attention")),
    ("casts and copies", ("aten::copy_", "aten::_to_copy", "aten::to", "aten::clone", "aten::contiguous")),
    ("log-softmax over the vocabulary", ("logsumexp", "log_softmax", "aten::gather", "aten::exp", "aten::max")),
    ("cache, concatenation and indexing", ("aten::cat", "aten::index", "repeat_interleave", "aten::slice", "aten::select",
                                           "aten::narrow", "aten::view", "aten::reshape", "aten::expand", "aten::transpose",
                                           "aten::permute", "aten::unsqueeze", "aten::squeeze", "aten::t", "aten::as_strided",
                                           "aten::empty", "aten::zero", "aten::fill", "aten::detach", "aten::alias")),
)


def category(name: str) -> str:
    for label, patterns in CATEGORIES:
        if any(p in name for p in patterns):
            return label
    return "elementwise and norms"  # add, mul, silu, rsqrt, mean, pow, where, masked_fill, their backward


def inputs(tokenizer):
    """Two sms-spam prompts and G completions of ``NEW_TOKENS`` tokens each (the answer format,
    then text, so every completion is full length as at rl_step's cap)."""
    _, _, prompts, completions, _ = task_inputs(tokenizer, "sms-spam", None)
    filler = tokenizer(" the message asks the reader to reply and claim a prize now", add_special_tokens=False)["input_ids"]
    full = [(c + filler * NEW_TOKENS)[:NEW_TOKENS] for c in completions[: PROMPTS * G]]
    return prompts[:PROMPTS], full


def one_pass(model, prompts, completions, pad: int, dtype: torch.dtype) -> None:
    model.zero_grad(set_to_none=True)
    logprobs, mask = completion_logprobs_shared(model, prompts, completions, G, pad_token_id=pad, dtype=dtype)
    (logprobs * mask).sum().backward()


def profile(model, prompts, completions, pad: int, dtype: torch.dtype, runs: int) -> tuple[dict[str, float], float]:
    """Seconds per pass by category, and the median wall seconds per pass."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    one_pass(model, prompts, completions, pad, dtype)  # warm-up
    walls = []
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(runs):
            started = time.perf_counter()
            one_pass(model, prompts, completions, pad, dtype)
            walls.append(time.perf_counter() - started)
    shares: dict[str, float] = defaultdict(float)
    for event in prof.key_averages():
        shares[category(event.key)] += event.self_cpu_time_total / 1e6 / runs
    inside = sum(shares.values())
    shares["outside operators (Python, autograd engine)"] = max(0.0, sum(walls) / runs - inside)
    return dict(shares), statistics.median(walls)


@contextlib.contextmanager
def module_pass():
    """The training pass through the model's modules (``labelrl.rollout.lean_pass`` off)."""
    import labelrl.rollout.logprobs as logprobs

    kept = logprobs.lean_reason
    logprobs.lean_reason = lambda model: "module pass requested"
    try:
        yield
    finally:
        logprobs.lean_reason = kept


@contextlib.contextmanager
def peft_adapter_forward():
    """peft's own LoRA forward (the update's products in bf16 under autocast, its casts and
    scaling product) instead of ``precision._lean_lora_forward``."""
    from labelrl.models import precision

    kept = precision._lora_layers
    precision._lora_layers = lambda model: []
    try:
        with module_pass():
            yield
    finally:
        precision._lora_layers = kept


@contextlib.contextmanager
def casts_per_call():
    """The pass as it ran before the frozen base's bf16 copy was kept: autocast casts every
    frozen weight at every forward call (and peft's adapter forward, as then)."""
    from labelrl.models import precision

    kept = precision.frozen_weights_cast_once
    precision.frozen_weights_cast_once = lambda model, dtype: contextlib.nullcontext()
    try:
        with peft_adapter_forward():
            yield
    finally:
        precision.frozen_weights_cast_once = kept


# Each step keeps the ones before it: the first column is the pass before either change.
VARIANTS = (("before", casts_per_call), ("base cast once", peft_adapter_forward),
            ("+ fp32 adapter update", module_pass), ("+ lean pass (default)", contextlib.nullcontext))


def unprofiled(model, prompts, completions, pad: int, dtype: torch.dtype, runs: int) -> dict[str, float]:
    """Median seconds per pass of each variant without the profiler, variants alternating
    pass by pass so that the machine's noise hits them alike."""
    walls: dict[str, list[float]] = {label: [] for label, _ in VARIANTS}
    for _ in range(runs):
        for label, context in VARIANTS:
            with context():
                started = time.perf_counter()
                one_pass(model, prompts, completions, pad, dtype)
                walls[label].append(time.perf_counter() - started)
    return {label: statistics.median(times) for label, times in walls.items()}


def main() -> None:
    args = timing_args(__doc__.split("\n\n")[0])
    dtype, console = DTYPES[args.precision], Console()
    console.print(cpu_line(), highlight=False)
    model, tokenizer = lora_model()
    prompts, completions = inputs(tokenizer)
    positions = sum(len(p) for p in prompts) + len(completions) * NEW_TOKENS
    flops = 2 * forward_flops(model.get_base_model(), positions, len(completions) * NEW_TOKENS)
    rate = machine_rates()[args.precision]
    results = {}
    for label, context in VARIANTS:
        with context():
            shares, wall = profile(model, prompts, completions, tokenizer.pad_token_id, dtype, args.runs)
        results[label] = {"seconds_per_pass": wall, "by_category": shares}
    for label, wall in unprofiled(model, prompts, completions, tokenizer.pad_token_id, dtype, args.runs).items():
        results[label].update(unprofiled_seconds=wall, model_gflops=flops / wall / 1e9, share_of_matmul_rate=flops / wall / rate)
    table = Table(title=f"RL training pass, {PROMPTS} prompts × G={G} × {NEW_TOKENS} tokens, {args.precision}, "
                        f"{args.runs} profiled passes; ms per pass (share)")
    table.add_column("where")
    for label in results:
        table.add_column(label, justify="right")
    names = sorted({k for r in results.values() for k in r["by_category"]},
                   key=lambda k: -results["before"]["by_category"].get(k, 0.0))
    for name in names:
        cells = []
        for r in results.values():
            seconds, total = r["by_category"].get(name, 0.0), sum(r["by_category"].values())
            cells.append(f"{seconds * 1e3:.0f} ({seconds / total:.1%})")
        table.add_row(name, *cells)
    table.add_row("median pass, profiled (s)", *(f"{r['seconds_per_pass']:.3f}" for r in results.values()))
    table.add_row("median pass, unprofiled, alternating (s)", *(f"{r['unprofiled_seconds']:.3f}" for r in results.values()))
    table.add_row(f"model GFLOP/s unprofiled (share of the 2048² {args.precision} product)",
                  *(f"{r['model_gflops']:.1f} ({r['share_of_matmul_rate']:.1%})" for r in results.values()))
    console.print(table)
    console.print(f"{positions} positions; 2048² {args.precision} product {rate / 1e9:.0f} GFLOP/s; {cpu_line()}; "
                  f"{busy_note()}", highlight=False)
    if args.json:
        atomic_write_json(args.json, {"cpu": cpu_line(), "precision": args.precision, "runs": args.runs,
                                      "positions": positions, "matmul_gflops": rate / 1e9, "results": results})


if __name__ == "__main__":
    main()
