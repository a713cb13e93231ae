"""One change to the RL step, measured with both arms in one process, alternating step by step.

    .venv/bin/python benchmarks/rl_step_ab.py --compare adapter-update|training-pass|prefill|padding|vocabulary|
        draw|optimizer|kept-groups|small|shared-prompt|blocks|script|fan-out|all
        [--prompts 2] [--json OUT] [--runs 6] [--precision bf16|fp32] [--threads N]

The step is ``benchmarks/rl_step.py``'s at G = 4 without the skip rule (every group trains):
SmolLM2-135M-Instruct + LoRA r=16 on all linear layers, ``--prompts`` sms-spam prompts × 4
completions of at most 32 tokens, sampling and the training pass. Separate invocations on a
shared machine differ by more than most changes do, so each arm puts back what ran before one
change and the other runs the default:

- ``adapter-update``: the adapter's update in bf16, in the sampler (its factors bf16, summed in
  bf16) and in the training pass (peft's own LoRA forward, ``profile_step.peft_adapter_forward``),
  against fp32 (``precision._lean_lora_forward``; the sampler's fp32 low-rank update);
- ``training-pass``: the pass through the model's modules against ``labelrl.rollout.lean_pass``;
- ``prefill``: every prompt prefilled whole against the prefix they share prefilled once;
- ``padding``: the lean pass over every completion slot up to the group's longest completion
  against its real tokens only;
- ``vocabulary``: each token's log-prob from the [M, V] logits as logit − logsumexp(logits)
  against the vocabulary read in cache-sized slices without them (``rollout.token_logprobs``);
- ``draw``: the sampler's draw as one float64 running sum over the whole vocabulary and a
  second pass for each token's log-prob, against the two-level draw (``sampler.inverse_cdf``);
- ``optimizer``: AdamW as per-tensor operations against torch's fused kernel;
- ``kept-groups``: the lean pass's fused base concatenated per pass against kept joined
  (``precision.low_precision_group``);
- ``small``: the last three undone together against the default;
- ``blocks``: each adapter group's B factors as one block-diagonal product (its zero blocks
  multiplied too) against equal blocks in one batched product (``projection.block_layout``), in the
  sampler and the training pass;
- ``script``: the decode step's layers as Python functions, each of their tensor operations a
  Python call, against the same functions compiled by TorchScript as one call
  (``fast_decode.decode_layers``);
- ``shared-prompt``: the decoder's cache with the prompt's keys and values copied to each of its
  G rows against one copy per prompt read once for them (``fast_decode.FastLlamaDecoder``);
- ``fan-out``: the lean pass's rows after their parent's keys and values by ``index_select``
  (its backward a scatter-add) against an expanded view copied once (``lean_pass._after``: its
  backward a sum over the rows of each parent);
- ``all``: the module pass with prompts prefilled whole against the default (``training-pass``
  and ``prefill`` together).

One warm-up step of each arm, then ``--runs`` steps of each, alternating so the machine's noise
hits both alike; medians of the step and of its sampling and training parts, and their ratios.
The two arms train the same run, so their rewards are not comparable; their times are.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from common import busy_note, cpu_line, timing_args  # noqa: E402  (benchmarks/common.py)
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

import labelrl.rollout.fused as fused  # noqa: E402
import labelrl.rollout.projection as projection  # noqa: E402
from labelrl import metrics_keys as K  # noqa: E402
from labelrl.fileio import atomic_write_json  # noqa: E402
from profile_step import module_pass, peft_adapter_forward  # noqa: E402  (benchmarks/profile_step.py)
from rl_step import rl_config  # noqa: E402  (benchmarks/rl_step.py)

GROUP_SIZE = 4


def _bf16_project(t: projection.ProjectionTensors, x: torch.Tensor,
                  exact: torch.Tensor | None = None) -> torch.Tensor:
    y = projection.base_product(t, x)
    return y if t.a is None else torch.addmm(y, x @ t.a.t(), t.b_t)


def _bf16_project_add(t: projection.ProjectionTensors, residual: torch.Tensor, x: torch.Tensor,
                      exact: torch.Tensor | None = None) -> torch.Tensor:
    out = projection.base_product_add(t, residual, x)
    return out if t.a is None else out + (x @ t.a.t()) @ t.b_t


@contextlib.contextmanager
def bf16_update():
    """The adapter's update in bf16, in the sampler (its decode layers run as Python, where the
    functions replaced here are looked up) and in the training pass."""
    import labelrl.rollout.fast_decode as fast_decode
    import labelrl.rollout.llama_layer as llama_layer

    kept = (projection.project, projection.project_add, llama_layer.project, llama_layer.project_add, fast_decode.project,
            fused.low_rank, fast_decode.SCRIPT_DECODE_LAYERS)

    def bf16_low_rank(modules):
        update = kept[5](modules)
        return None if update is None else projection.LowRank(a=update.a.bfloat16(), b_t=update.dense_t().bfloat16())

    projection.project = llama_layer.project = fast_decode.project = _bf16_project
    projection.project_add = llama_layer.project_add = _bf16_project_add
    fused.low_rank, fast_decode.SCRIPT_DECODE_LAYERS = bf16_low_rank, False
    try:
        with peft_adapter_forward():  # the module pass, where peft's forward runs
            yield
    finally:
        (projection.project, projection.project_add, llama_layer.project, llama_layer.project_add, fast_decode.project,
         fused.low_rank, fast_decode.SCRIPT_DECODE_LAYERS) = kept


@contextlib.contextmanager
def prompts_prefilled_whole():
    """The sampler prefills every prompt whole (the training pass keeps its own prefix)."""
    import labelrl.rollout.prefix as prefix

    kept = prefix.shared_prefix_length
    prefix.shared_prefix_length = lambda *args, **kwargs: 0  # the sampler looks it up at each call
    try:
        yield
    finally:
        prefix.shared_prefix_length = kept


@contextlib.contextmanager
def completions_padded():
    """The lean pass over every completion slot up to the longest, padding included: with every
    slot marked real it computes them all (a pad slot follows its completion's real tokens, which
    causal attention keeps from seeing it), and the log-probs are read at the real ones."""
    import labelrl.rollout.logprobs as logprobs

    kept = logprobs.lean_logprobs

    def padded(model, prompt_ids, targets, mask, *args):
        return kept(model, prompt_ids, targets, torch.ones_like(mask), *args)

    logprobs.lean_logprobs = padded
    try:
        yield
    finally:
        logprobs.lean_logprobs = kept


@contextlib.contextmanager
def logit_minus_logsumexp():
    """The lean pass's log-probs from its [M, V] logits: logit − logsumexp over the vocabulary."""
    import labelrl.rollout.lean_pass as lean_pass

    kept = lean_pass.token_logprobs

    def from_logits(hidden, weight, bias, targets):
        logits = torch.nn.functional.linear(hidden, weight, bias)
        return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)

    lean_pass.token_logprobs = from_logits
    try:
        yield
    finally:
        lean_pass.token_logprobs = kept


@contextlib.contextmanager
def whole_row_draw():
    """The sampler's draw as a float64 running sum over the whole vocabulary, and each token's
    log-prob as logit − logsumexp in a second pass (before ``sampler.inverse_cdf``)."""
    import labelrl.rollout.sampler as sampler

    kept = sampler.draw_tokens

    def draw(logits, *, temperature, top_k, top_p, generator=None, uniforms=None):
        if temperature == 0:
            tokens = logits.argmax(dim=-1)
        else:
            scores = sampler.warp_logits(logits, temperature=temperature, top_k=top_k, top_p=top_p)
            if uniforms is None:
                uniforms = torch.rand(scores.shape[0], dtype=torch.float64, generator=generator)
            cdf = torch.softmax(scores, dim=-1).double().cumsum(dim=-1)
            threshold = (uniforms * cdf[:, -1]).unsqueeze(-1)
            tokens = torch.searchsorted(cdf, threshold, right=True).squeeze(-1).clamp(max=scores.shape[-1] - 1)
        return tokens, sampler.logprobs_of_tokens(logits, tokens)

    sampler.draw_tokens = draw
    try:
        yield
    finally:
        sampler.draw_tokens = kept


def per_tensor_adamw(run):
    """AdamW as a loop of per-tensor operations (torch's default on CPU) instead of its fused kernel."""
    @contextlib.contextmanager
    def context():
        groups = run.optimizer.param_groups
        kept = [(group["fused"], group["foreach"]) for group in groups]
        for group in groups:
            group["fused"], group["foreach"] = False, False
        try:
            yield
        finally:
            for group, (fused_flag, foreach) in zip(groups, kept):
                group["fused"], group["foreach"] = fused_flag, foreach

    return context()


@contextlib.contextmanager
def groups_concatenated_per_pass():
    """The lean pass's q/k/v and gate/up bf16 base concatenated from the kept per-module copies
    at every pass (before ``precision.low_precision_group`` kept it joined)."""
    import labelrl.rollout.lean_pass as lean_pass
    from labelrl.models.precision import low_precision_weight

    kept = lean_pass.low_precision_group
    lean_pass.low_precision_group = lambda modules, dtype: torch.cat([low_precision_weight(m, dtype) for m in modules])
    try:
        yield
    finally:
        lean_pass.low_precision_group = kept


def before_small(run):
    """The three changes above undone together."""
    stack = contextlib.ExitStack()
    for context in (whole_row_draw(), per_tensor_adamw(run), groups_concatenated_per_pass()):
        stack.enter_context(context)
    return stack


def _no_run(factory):
    """A comparison arm that does not need the run."""
    return lambda run: factory()


@contextlib.contextmanager
def prompt_copied_per_row():
    """The decoder's cache with a copy of the prompt's keys and values per row (as before
    ``fast_decode.SHARE_PROMPT_UP_TO``), not one per prompt."""
    import labelrl.rollout.fast_decode as fast_decode

    kept = fast_decode.SHARE_PROMPT_UP_TO
    fast_decode.SHARE_PROMPT_UP_TO = 0
    try:
        yield
    finally:
        fast_decode.SHARE_PROMPT_UP_TO = kept


@contextlib.contextmanager
def block_diagonal_updates():
    """Every adapter group's B factors as one block-diagonal product, zero blocks included, in the
    sampler and in the training pass (before ``projection.block_layout``)."""
    import labelrl.rollout.lean_pass as lean_pass

    kept = fused.block_layout, lean_pass.block_layout
    fused.block_layout = lean_pass.block_layout = lambda outs, ranks: None
    try:
        yield
    finally:
        fused.block_layout, lean_pass.block_layout = kept


@contextlib.contextmanager
def python_decode_layers():
    """The decode step's layers run as the Python functions, each tensor operation a Python call
    (before ``fast_decode.decode_layers``)."""
    import labelrl.rollout.fast_decode as fast_decode

    kept = fast_decode.SCRIPT_DECODE_LAYERS
    fast_decode.SCRIPT_DECODE_LAYERS = False
    try:
        yield
    finally:
        fast_decode.SCRIPT_DECODE_LAYERS = kept


@contextlib.contextmanager
def parents_selected():
    """Each row of a lean-pass segment after its parent's keys and values by ``index_select``
    (before ``lean_pass._after``)."""
    import labelrl.rollout.lean_pass as lean_pass

    kept = lean_pass._after

    def selected(seen, own, fan_out):
        parent = torch.arange(seen.shape[0], device=seen.device).repeat_interleave(fan_out)
        return torch.cat([seen.index_select(0, parent), own], dim=2)

    lean_pass._after = selected
    try:
        yield
    finally:
        lean_pass._after = kept


@contextlib.contextmanager
def before_both():
    with module_pass(), prompts_prefilled_whole():
        yield


COMPARISONS = {
    "adapter-update": (("bf16 update", _no_run(bf16_update)), ("fp32 update", _no_run(module_pass))),
    "training-pass": (("module pass", _no_run(module_pass)), ("lean pass (default)", _no_run(contextlib.nullcontext))),
    "prefill": (("prompts prefilled whole", _no_run(prompts_prefilled_whole)),
                ("shared prefix once (default)", _no_run(contextlib.nullcontext))),
    "padding": (("completions padded", _no_run(completions_padded)),
                ("real tokens only (default)", _no_run(contextlib.nullcontext))),
    "vocabulary": (("logits, logit − logsumexp", _no_run(logit_minus_logsumexp)),
                   ("sliced (default)", _no_run(contextlib.nullcontext))),
    "draw": (("whole-row running sum", _no_run(whole_row_draw)), ("two-level (default)", _no_run(contextlib.nullcontext))),
    "optimizer": (("per-tensor AdamW", per_tensor_adamw), ("fused AdamW (default)", _no_run(contextlib.nullcontext))),
    "kept-groups": (("concatenated per pass", _no_run(groups_concatenated_per_pass)),
                    ("kept joined (default)", _no_run(contextlib.nullcontext))),
    "shared-prompt": (("prompt copied per row", _no_run(prompt_copied_per_row)),
                      ("one copy per prompt (default)", _no_run(contextlib.nullcontext))),
    "blocks": (("block-diagonal B", _no_run(block_diagonal_updates)),
               ("B in equal blocks (default)", _no_run(contextlib.nullcontext))),
    "script": (("decode layers in Python", _no_run(python_decode_layers)),
               ("scripted (default)", _no_run(contextlib.nullcontext))),
    "fan-out": (("index_select by parent", _no_run(parents_selected)),
                ("expanded, copied once (default)", _no_run(contextlib.nullcontext))),
    "small": (("draw, AdamW, groups as before", before_small), ("default", _no_run(contextlib.nullcontext))),
    "all": (("module pass, prompts whole", _no_run(before_both)), ("default", _no_run(contextlib.nullcontext))),
}


def arguments() -> argparse.Namespace:
    def own(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--compare", choices=sorted(COMPARISONS), required=True)
        parser.add_argument("--prompts", type=int, default=2, help="prompts per step (rl_step.py: 2)")

    return timing_args(__doc__.split("\n\n")[0], runs=6, extra=own)


def main() -> None:
    from labelrl.train.rl import rl_step, start_run

    args = arguments()
    arms = COMPARISONS[args.compare]
    console = Console()
    console.print(cpu_line(), highlight=False)
    machine = busy_note()
    figures: dict[str, dict[str, list[float]]] = {label: {"step": [], "sample": [], "train": []} for label, _ in arms}
    with tempfile.TemporaryDirectory(prefix="rl_step_ab_") as tmp:
        # one step more than it takes: the run's last step would score val, which is not timed here
        config = rl_config(GROUP_SIZE, 2 * (args.runs + 1) + 1, Path(tmp) / "run", skip=False, precision=args.precision,
                           prompts_per_step=args.prompts)
        run = start_run(config)
        for index in range(args.runs + 1):
            for label, context in arms:
                with context(run):
                    started = time.perf_counter()
                    record = rl_step(run)
                    elapsed = time.perf_counter() - started
                if index == 0:
                    continue  # warm-up
                figures[label]["step"].append(elapsed)
                figures[label]["sample"].append(record[K.SAMPLE_SECONDS])
                figures[label]["train"].append(record[K.UPDATE_SECONDS])
    medians = {label: {part: statistics.median(values) for part, values in parts.items()} for label, parts in figures.items()}
    table = Table(title=f"RL step, SmolLM2-135M + LoRA r=16, {args.prompts} prompts × G={GROUP_SIZE}, ≤32 new tokens, "
                        f"{args.precision}, median of {args.runs} alternating steps")
    for column in ("arm", "s/step", "sampling s", "training s"):
        table.add_column(column, justify="right")
    for label, row in medians.items():
        table.add_row(label, *(f"{row[part]:.2f}" for part in ("step", "sample", "train")))
    before, after = medians[arms[0][0]], medians[arms[1][0]]
    table.add_row("ratio first / second", *(f"{before[part] / after[part]:.2f}×" for part in ("step", "sample", "train")))
    console.print(table)
    console.print(f"{cpu_line()}; start: {machine}; end: {busy_note()}", highlight=False)
    if args.json:
        atomic_write_json(args.json, {"cpu": cpu_line(), "compare": args.compare, "prompts": args.prompts,
                                      "precision": args.precision, "runs": args.runs, "medians": medians,
                                      "steps": figures})


if __name__ == "__main__":
    main()
