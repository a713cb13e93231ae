"""Pieces every benchmark script shares (imported as ``common`` when a script runs from benchmarks/)."""

from __future__ import annotations

import statistics
import time

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def matmul_flops(size: int = 2048, repeats: int = 5, dtype: torch.dtype = torch.float32) -> float:
    """FLOP/s of a ``size``×``size`` matrix product (2·n³ FLOPs) in ``dtype``, median of ``repeats``."""
    a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)
    a @ b  # warm-up
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - started)
    return 2 * size**3 / statistics.median(times)


def machine_rates() -> dict[str, float]:
    """Measured 2048×2048 matrix-product FLOP/s in fp32 and bf16: what the machine can do at
    best in each precision, printed next to every model FLOP/s figure."""
    return {name: matmul_flops(dtype=dtype) for name, dtype in DTYPES.items()}


def read_bandwidth(megabytes: int = 512, repeats: int = 5) -> float:
    """Bytes/s the CPU reads from memory: BLAS's dot product of a ``megabytes`` fp32 vector
    (far larger than any cache) with itself, which reads each element once and streams as fast
    as any kernel tried here (sums and maxima were slower or no faster), median of ``repeats``,
    with torch's threads. Decoding a small model at a few rows reads every weight once per
    step and does little arithmetic on it, so this rate bounds its tokens/s."""
    data = torch.ones(megabytes * 2**20 // 4)
    torch.dot(data, data)  # warm-up: pages touched
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        torch.dot(data, data)
        times.append(time.perf_counter() - started)
    return data.numel() * 4 / statistics.median(times)


def rates_line(rates: dict[str, float]) -> str:
    return ("2048×2048 matmul: " + ", ".join(f"{name} {value / 1e9:.1f} GFLOP/s" for name, value in rates.items())
            + f" (bf16/fp32 {rates['bf16'] / rates['fp32']:.2f}×)")


def forward_flops(model, tokens: int, projected: int) -> float:
    """FLOPs of forward passes over ``tokens`` token positions, ``projected`` of which go
    through the output (vocabulary) projection: 2 FLOPs (multiply, add) per weight per token
    for the weights of the layers, 2 × vocabulary × hidden per projected position. Embedding
    lookups cost nothing; attention over the context is left out (small at these lengths)."""
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    total = sum(p.numel() for p in model.parameters())  # a tied head is counted once
    layers = total - embed.numel() - (0 if head is embed else head.numel())
    return 2.0 * layers * tokens + 2.0 * head.numel() * projected


def busy_note() -> str:
    """The load average next to the core count: these machines are shared."""
    import os

    try:
        load = os.getloadavg()
    except OSError:
        return "load average unknown"
    return f"load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (1/5/15 min) on {os.cpu_count()} cores"


def cpu_line() -> str:
    """``lscpu``'s model name and the flags that decide bf16 speed (AVX-512 BF16, AMX), so a
    figure is read next to the kind of CPU that produced it."""
    from pathlib import Path

    model, flags = "unknown CPU", set()
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model == "unknown CPU":
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
    shown = ", ".join(f for f in wanted if f in flags) or "none of " + "/".join(wanted)
    native = "native bf16" if {"avx512_bf16", "amx_bf16"} & flags else "bf16 emulated"
    return f"CPU: {model} ({shown}; {native}); torch threads {torch.get_num_threads()}"


def timing_args(description: str, runs: int = 5, extra=None):
    """The options the per-workload timing scripts share (``--json``, ``--runs``, ``--precision``,
    ``--threads``), parsed, with the thread count applied; ``extra(parser)`` adds a script's own."""
    import argparse
    from pathlib import Path

    parser = argparse.ArgumentParser(description=description)
    if extra is not None:
        extra(parser)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--runs", type=int, default=runs)
    parser.add_argument("--precision", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    return args
