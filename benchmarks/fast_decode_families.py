"""Fast decode vs the Hugging Face forward, per built-in model family: median wall time of one
``sample_groups`` call (B prompts × G samples, greedy, no stop token, so every call decodes the
same number of tokens), the two paths interleaved run by run so that load from other processes
hits both alike. Prints figures; asserts nothing.

    OMP_NUM_THREADS=1 python benchmarks/fast_decode_families.py [--runs 9] [--new-tokens 32]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from labelrl.models import load_model
from common import cpu_line  # noqa: E402  (benchmarks/common.py)
from labelrl.rollout import sample_groups

MODELS = ["tiny-random", "tiny-qwen2", "tiny-qwen3", "tiny-gemma3"]


def one_call(model, prompts, group_size: int, new_tokens: int, fast: bool, dtype) -> tuple[float, float]:
    started = time.perf_counter()
    batch = sample_groups(model, prompts, group_size=group_size, max_new_tokens=new_tokens, eos_token_ids=None,
                          pad_token_id=2, temperature=0.0, fast=fast, dtype=dtype)
    assert batch.timings["fast_decode"] == float(fast)
    return time.perf_counter() - started, batch.timings["decode_s"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--bf16", action="store_true")
    args = parser.parse_args()
    print(cpu_line(), flush=True)  # the kind of CPU every figure below belongs to
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    print(f"torch threads {torch.get_num_threads()}, B={args.prompts} × G={args.group_size}, {args.new_tokens} new "
          f"tokens, {'bf16' if args.bf16 else 'fp32'}, median of {args.runs} runs (call / decode only)")
    for name in MODELS:
        model, tokenizer = load_model(name)
        model.requires_grad_(False)  # as an evaluated model: the packed weights are kept across calls
        text = "Is this message spam? WINNER!! Claim your free prize now, reply YES"
        ids = tokenizer(text)["input_ids"]
        prompts = [ids[: len(ids) - 3 * i] for i in range(args.prompts)]  # different lengths: left padding
        times: dict[bool, list] = {True: [], False: []}
        for fast in (True, False):  # warm-up (the first fast call packs the weights)
            one_call(model, prompts, args.group_size, args.new_tokens, fast, dtype)
        for _ in range(args.runs):
            for fast in (True, False):
                times[fast].append(one_call(model, prompts, args.group_size, args.new_tokens, fast, dtype))
        med = {fast: [statistics.median(t[i] for t in times[fast]) * 1000 for i in (0, 1)] for fast in times}
        print(f"{name:12s} HF {med[False][0]:7.1f} / {med[False][1]:7.1f} ms   fast {med[True][0]:7.1f} / "
              f"{med[True][1]:7.1f} ms   speed-up {med[False][0] / med[True][0]:4.2f}× / {med[False][1] / med[True][1]:4.2f}×")


if __name__ == "__main__":
    main()
