"""Pieces every benchmark script shares (imported as ``common`` when a script runs from benchmarks/)."""

from __future__ import annotations

import statistics
import time

import torch


def matmul_flops(size: int = 2048, repeats: int = 5) -> float:
    """FLOP/s of an fp32 ``size``×``size`` matrix product (2·n³ FLOPs), median of ``repeats``."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b  # warm-up
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - started)
    return 2 * size**3 / statistics.median(times)
