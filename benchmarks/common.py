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
