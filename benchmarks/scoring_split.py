"""Label-token scoring of a split on the packed weights: the shared prefix run per batch with every
token through the last layer (before), against the prefix run once per split and the last layer at
each prompt's last token only (``labelrl.evaluate.score.split_prefix``, ``fast_decode.last_logits``).

    .venv/bin/python benchmarks/scoring_split.py [--items 512] [--runs 5] [--threads 1] [--precision bf16]

The prompts are the demo's: ``--items`` vader-movies val items with the sentiment rubric (a
130-token prefix every prompt shares, about 30 tokens each after it), SmolLM2-135M-Instruct, in
batches of ``FAST_SCORE_ROWS`` (``labelrl.evaluate.predict``) in order of length, as
``score_counted`` takes them. ``--threads 1`` is what a side-by-side worker of the demo uses.

Both arms run in this process, alternating run by run after one warm-up each; each figure is
the median of ``--runs``. The largest difference of a label probability between the arms is
printed: float rounding only (bf16 products of another shape).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from labelrl.data.options import DataOptions  # noqa: E402
from labelrl.evaluate.predict import FAST_SCORE_ROWS, fit_to_context  # noqa: E402
from labelrl.evaluate.score import label_token_ids, scoring_weights, split_prefix  # noqa: E402
from labelrl.evaluate.setup import prepare  # noqa: E402
from labelrl.data.prompts import ANSWER_PREFIX  # noqa: E402
from labelrl.rollout import fast_decode  # noqa: E402
from labelrl.rollout.prefix import prefill_inputs, remainder_inputs  # noqa: E402
from labelrl.rollout.sampler import pad_id  # noqa: E402
from common import busy_note, cpu_line  # noqa: E402  (benchmarks/common.py)

RUBRIC = Path(__file__).resolve().parents[1] / "recipes" / "rubrics" / "sentiment5.md"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=512)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(cpu_line())
    print(busy_note())

    with tempfile.TemporaryDirectory() as splits:
        options = DataOptions(data="vader-movies", rubric=RUBRIC)
        setup = prepare("smollm2-135m-instruct", options, "val", splits_dir=splits, limit=args.items,
                        precision=args.precision)
    prompts = fit_to_context(setup, "scores", None)[1]
    answer = setup.tokenizer(ANSWER_PREFIX, add_special_tokens=False)["input_ids"]
    seqs = [list(p) + answer for p in prompts]
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    batches = [[seqs[i] for i in order[s : s + FAST_SCORE_ROWS]] for s in range(0, len(order), FAST_SCORE_ROWS)]
    first = [ids[0] for ids in label_token_ids(setup.tokenizer, setup.data.labels)]
    fast = scoring_weights(setup.model, setup.dtype)
    pad = pad_id(setup.tokenizer)

    @torch.inference_mode()
    def per_batch() -> torch.Tensor:
        out = []
        for batch in batches:
            *inputs, prefix = prefill_inputs(batch, pad, "cpu")
            out.append(fast_decode._prefill_last(fast, *inputs, prefix)[0][:, first].log_softmax(-1))
        return torch.cat(out)

    @torch.inference_mode()
    def per_split() -> torch.Tensor:
        past = split_prefix(setup.model, prompts, fast)
        return torch.cat([fast_decode.last_logits(fast, *remainder_inputs(batch, past.length, pad, "cpu"),
                                                  past=past.layer_kv)[:, first].log_softmax(-1) for batch in batches])

    arms = {"per batch": per_batch, "per split": per_split}
    results = {name: arm() for name, arm in arms.items()}  # warm-up
    times: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(args.runs):
        for name, arm in arms.items():
            started = time.perf_counter()
            arm()
            times[name].append(time.perf_counter() - started)
    shared = split_prefix(setup.model, prompts, fast).length
    print(f"{len(seqs)} prompts, {shared} prefix tokens shared, median {statistics.median(map(len, seqs))} tokens; "
          f"batches of {FAST_SCORE_ROWS}; {args.precision}, {args.threads} thread(s); median of {args.runs}")
    for name, runs in times.items():
        print(f"  {name:>9}: {statistics.median(runs):.3f} s  (runs: {', '.join(f'{t:.2f}' for t in runs)})")
    diff = (results["per batch"].exp() - results["per split"].exp()).abs().max().item()
    print(f"largest label-probability difference: {diff:.2e}")
    ratio = statistics.median(times["per batch"]) / statistics.median(times["per split"])
    print(f"per split vs per batch: {ratio:.2f}×")


if __name__ == "__main__":
    main()
