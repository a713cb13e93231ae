"""Will the largest batch fit? A memory preflight, and activation checkpointing when it won't.

Training memory is the model and what the process already holds (measured: resident memory
now, once the heap's free pages are handed back to the system, or CUDA's allocation), the
optimizer state (a gradient and AdamW's two moments per trainable parameter, fp32: 12 bytes
each), the activations the forward pass saves for the backward pass, and the logits of the
positions the loss reads. The activations are measured, not guessed: ``probe_activations``
runs two short forward passes (1 × 32 and 1 × 64 tokens) with
``torch.autograd.graph.saved_tensors_hooks`` and sums the storages saved for backward
(parameters excluded); a straight line through the two gives a fixed part (under bf16
autocast, the bf16 copies of frozen weights) and a per-token part, which scales to the
largest batch. The attention here never saves an L×L matrix (SDPA's flash kernel on CPU keeps
one row block at a time), so saved memory grows linearly with the tokens of a batch.

With activation checkpointing (Chen et al. 2016, "Training Deep Nets with Sublinear Memory
Cost") each decoder layer keeps only its input and recomputes the rest during the backward
pass: per token, the layer inputs ((L + 1) × hidden fp32 values) plus one layer's share of the
saved activations, for about a third more compute.

On a CPU the process's resident memory grows by more than the tensors alive at the peak:
glibc's heap keeps the holes left between long-lived tensors (saved activations, the layer
inputs checkpointing keeps) and the temporaries freed around them, and fills a hole only with
what fits in it. Measured with ``benchmarks/long_inputs.py`` (SmolLM2-135M + LoRA r=16, fp32,
long-tailed SFT batches of 1,880–2,760 token positions; live bytes from glibc's ``mallinfo2``):
after a plain forward pass 2.3 GB were in use in a 4.1 GB heap, after a checkpointed one 0.3 GB
in a 1.4 GB heap; from the preflight to the run's peak (the optimizer, the first step's
one-time buffers and the final validation included) memory grew by 2.15–2.24× the plain pass's
saved activations without checkpointing and by 1.08× of them with it (the holes of 30
recomputed layers, not the one layer's share the tensors alone would need). The CPU
prediction scales by these factors, rounded up (``HEAP_GROWTH``); the saved activations
themselves stay measured, not guessed.

What glibc keeps resident after an earlier run in the same process (a learning-rate grid
trains several runs in one) is not held: the freed chunks stay in the heap, and the next run
reuses them. Read as held, they had the second SFT run of the demo's sms-spam grid predicted at
7.1 GiB against the first's 4.2 for the same batches. So before reading resident memory the
preflight collects garbage and calls glibc's ``malloc_trim``, which returns the heap's whole free
pages (``release_free_heap``; elsewhere only the garbage collection runs): the two runs were then
predicted at 4,155 and 4,372 MB, and the process peaked at 4,179 MB, in the first run (0.6%
above that run's prediction).

``--gradient-checkpointing`` forces it on or off; unset, it is turned on when the predicted
peak of the largest batch exceeds ``--memory-budget`` (GiB; default half the machine's
memory, or of the GPU's) and the checkpointed prediction is below both the budget and the
plain one; when neither fits, the plan names the options that shrink the batch.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import os
from dataclasses import asdict, dataclass
from typing import Callable

import torch

from labelrl.models.precision import cast_weights_to_keep, kept_casts

GIB = 2**30
DEFAULT_BUDGET_SHARE = 0.5
OPTIMIZER_BYTES_PER_TRAINABLE = 12  # fp32 gradient + AdamW's two fp32 moments
LOGIT_COPIES = 3  # logits, their fp32 log-softmax workspace, their gradient
PROBE_LENGTHS = (32, 64)
# CPU resident growth per byte the plain pass saves (module doc): without checkpointing, and
# with it (then of the plain pass's saved bytes; the checkpointed tensors alone are the floor).
HEAP_GROWTH = {"plain": 2.4, "checkpointed": 1.2}


@dataclass
class ActivationCost:
    fixed_bytes: float  # saved for backward whatever the batch
    per_token_bytes: float  # saved per token position forwarded


@dataclass
class MemoryPlan:
    gradient_checkpointing: bool
    reason: str
    budget_mb: float
    predicted_peak_mb: float  # without checkpointing
    predicted_peak_checkpointed_mb: float | None
    tokens: int  # token positions of the largest batch
    fits: bool
    knobs: str = "--batch-size or --max-length"  # what to lower when nothing fits
    held_mb: float = 0.0  # of the prediction: what the process holds whatever the batch (model, kept weights, optimizer)

    def as_dict(self) -> dict:
        return asdict(self)


def total_memory_bytes(device: torch.device) -> int | None:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def memory_budget_bytes(gib: float | None, device: torch.device) -> int | None:
    """``gib`` GiB, or by default half of the device's memory (None when unknown)."""
    if gib is not None:
        return int(gib * GIB)
    total = total_memory_bytes(device)
    return None if total is None else int(DEFAULT_BUDGET_SHARE * total)


def current_bytes(device: torch.device) -> int:
    """Memory the process holds now: CUDA's allocation, else resident memory (Linux
    /proc/self/statm; elsewhere the peak so far, an over-estimate)."""
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device)
    try:
        with open("/proc/self/statm", encoding="ascii") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return peak_resident_bytes()


@functools.cache
def _malloc_trim():
    """glibc's ``malloc_trim(size_t pad)``, or None where the C library has none (musl, macOS,
    Windows)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def release_free_heap() -> None:
    """Collect garbage, then hand the C heap's whole free pages back to the system (glibc's
    ``malloc_trim(0)``, every arena), so that resident memory counts what the process holds
    rather than what an earlier run in it freed (module doc)."""
    gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def peak_resident_bytes() -> int:
    """This process's own peak resident memory: Linux's ``VmHWM`` (/proc/self/status).

    Not ``getrusage``'s ``ru_maxrss``: on Linux exec keeps the high-water mark of the memory the
    process was started from, so a run launched from a process that once held 5 GB reports at
    least 5 GB (measured: a child of a parent that had touched 3 GB read 3,087 MB there, 14 MB
    in VmHWM). Elsewhere ``ru_maxrss`` is all there is (bytes on macOS, KiB on other systems)."""
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


# What a probe measured, by the model's structure and the probe's inputs (``saved_bytes_of``'s
# ``key``): a ladder's worker trains one run after another on the same model and shapes.
_MEASURED: dict[tuple, int] = {}


def structure_key(model) -> str:
    """What the bytes a pass saves depend on besides its inputs' shapes: the model's class and
    config, its adapters' settings, every parameter's name, shape, dtype, device and whether it
    trains, training mode and activation checkpointing. Not the weights' values: a tensor's size
    never depends on them."""
    import hashlib

    config = getattr(model, "config", None)
    parts = [type(model).__qualname__, config.to_json_string() if hasattr(config, "to_json_string") else repr(config),
             repr(getattr(model, "peft_config", None)), bool(getattr(model, "is_gradient_checkpointing", False)),
             model.training]
    parts += [(name, tuple(p.shape), str(p.dtype), p.device.type, p.requires_grad) for name, p in model.named_parameters()]
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def saved_bytes_of(model, forward, key: tuple | None = None) -> int:
    """Bytes of the storages ``forward()`` saves for backward (gradients on), parameters and the
    weight copies kept between passes (``frozen_weights_cast_once``) excluded. With ``key`` (what
    fixes the shapes of ``forward``'s inputs: a probe's kind, lengths and dtype) the count is
    measured once per process for each model structure (``structure_key``) and key: the sizes of
    the tensors a pass saves follow from its shapes, not from the weights' values, and a probe
    costs a forward pass (about 3 s of an RL run's start at one thread)."""
    if key is not None:
        memo = (structure_key(model), key)
        if memo not in _MEASURED:
            _MEASURED[memo] = saved_bytes_of(model, forward)
        return _MEASURED[memo]
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        # The storage is kept (as the forward pass would keep it, so no address is reused and
        # counted twice), through a detached view: returning the tensor itself closes a cycle
        # (tensor → its grad_fn → the saved tensor) that Python's collector cannot see, and the
        # graph, with every weight it saved, outlived the model.
        return tensor.detach()

    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        forward()
    # the weight copies a pass keeps between passes are held memory (plan_memory), not activations
    for kept in kept_casts(model):
        seen.pop(kept.untyped_storage().data_ptr(), None)
    return sum(seen.values())


def _saved_bytes(model, length: int, dtype: torch.dtype, device: torch.device) -> int:
    from labelrl.models.precision import compute

    ids = torch.arange(3, 3 + length, device=device)[None] % model.config.vocab_size

    def forward() -> None:
        with compute(model, dtype):
            model(input_ids=ids, logits_to_keep=1)

    return saved_bytes_of(model, forward, key=("plain", length, dtype, device.type))


def probe_activations(model, dtype: torch.dtype) -> ActivationCost:
    """Bytes saved for backward, measured at two lengths and fitted by a line (see module doc)."""
    device = next(model.parameters()).device
    was_training = model.training
    model.train()
    try:
        short, long = (_saved_bytes(model, n, dtype, device) for n in PROBE_LENGTHS)
    finally:
        model.train(was_training)
    per_token = max(0.0, (long - short) / (PROBE_LENGTHS[1] - PROBE_LENGTHS[0]))
    return ActivationCost(fixed_bytes=max(0.0, short - per_token * PROBE_LENGTHS[0]), per_token_bytes=per_token)


def activation_bytes(cost: ActivationCost, tokens: int, model, checkpointing: bool) -> float:
    """Saved activations of a batch of ``tokens`` positions, with or without checkpointing."""
    if not checkpointing:
        return cost.fixed_bytes + cost.per_token_bytes * tokens
    config = model.config
    layers = max(1, getattr(config, "num_hidden_layers", 1))
    kept_inputs = (layers + 1) * config.hidden_size * 4  # each layer's fp32 input, plus the final norm's
    return cost.fixed_bytes / layers + tokens * (cost.per_token_bytes / layers + kept_inputs)


def activation_growth_bytes(cost: ActivationCost, tokens: int, model, checkpointing: bool,
                            device: torch.device) -> float:
    """What the activations of a ``tokens``-position batch add to the process's peak: the saved
    bytes on a GPU (its caching allocator reuses blocks by size), on a CPU scaled by the heap's
    measured growth (module doc)."""
    saved = activation_bytes(cost, tokens, model, checkpointing)
    if device.type != "cpu":
        return saved
    plain = activation_bytes(cost, tokens, model, False)
    if not checkpointing:
        return HEAP_GROWTH["plain"] * plain
    return max(saved, HEAP_GROWTH["checkpointed"] * plain)


def plan_memory(model, dtype: torch.dtype, *, tokens: int, tokens_checkpointed: int | None = None,
                logit_positions: int, requested: bool | None, budget_gib: float | None,
                held_bytes: int = 0, knobs: str = "--batch-size or --max-length",
                pass_growth_bytes: Callable[[torch.device], float] | None = None,
                pass_holds_logits: bool = True) -> MemoryPlan:
    """Predict the peak of a batch of ``tokens`` positions (``tokens_checkpointed`` when the
    checkpointed pass forwards more, as RL's plain pass does) whose loss reads
    ``logit_positions`` logits, and decide on checkpointing (``requested`` wins when set).
    ``held_bytes``: what the run will hold through its training passes that it does not hold
    yet (RL: the sampler's packed weights). ``pass_growth_bytes(device)``: what the
    uncheckpointed pass adds to the peak, measured on its own shape (RL's shared pass,
    ``labelrl.train.memory_rl``, its logits included once); else the plain probe's line prices
    ``tokens``. ``pass_holds_logits`` False: that pass never holds vocabulary-wide logits (the
    lean pass reads the vocabulary in slices, ``labelrl.rollout.token_logprobs``), so none of
    their copies is added to it. Probes run after the process's memory is read (its free heap
    pages handed back first, ``release_free_heap``): the heap they leave behind is reused by the
    run, not added to it. Unforced, checkpointing is on only when the plain prediction is above
    the budget and the checkpointed one below both: RL's checkpointed pass forwards each prompt
    G times and can cost more. When neither fits, the plan names ``knobs``, the options that
    shrink the batch."""
    device = next(model.parameters()).device
    budget = memory_budget_bytes(budget_gib, device)
    if device.type == "cpu":
        release_free_heap()  # an earlier run's freed heap is not held (module doc)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    logit_bytes = logit_positions * model.config.vocab_size * 4
    base = (current_bytes(device) + held_bytes + cast_weights_to_keep(model, dtype)
            + trainable * OPTIMIZER_BYTES_PER_TRAINABLE)
    cost = probe_activations(model, dtype)
    if pass_growth_bytes is None:
        plain = base + LOGIT_COPIES * logit_bytes + activation_growth_bytes(cost, tokens, model, False, device)
    else:  # the measured pass saved its logits once; their gradient and the softmax's workspace remain
        plain = base + (LOGIT_COPIES - 1 if pass_holds_logits else 0) * logit_bytes + pass_growth_bytes(device)
    checkpointed = (base + LOGIT_COPIES * logit_bytes
                    + activation_growth_bytes(cost, tokens_checkpointed or tokens, model, True, device))
    if requested is not None:
        use, reason = requested, "--gradient-checkpointing" if requested else "--no-gradient-checkpointing"
    elif budget is None:
        use, reason = False, "machine memory unknown: give --memory-budget to plan"
    elif plain <= budget:
        use, reason = False, f"predicted {plain / GIB:.1f} GiB ≤ budget {budget / GIB:.1f} GiB"
    elif checkpointed <= budget and checkpointed < plain:
        use, reason = True, f"predicted {plain / GIB:.1f} GiB > budget {budget / GIB:.1f} GiB"
    else:
        use, reason = False, (f"predicted {plain / GIB:.1f} GiB > budget {budget / GIB:.1f} GiB, and checkpointing "
                              f"would need {checkpointed / GIB:.1f} GiB, so it stays off")
    peak = checkpointed if use else plain
    return MemoryPlan(gradient_checkpointing=use, reason=reason, budget_mb=(budget or 0) / 2**20,
                      predicted_peak_mb=plain / 2**20, predicted_peak_checkpointed_mb=checkpointed / 2**20,
                      tokens=tokens, fits=budget is None or peak <= budget, knobs=knobs, held_mb=base / 2**20)


def set_checkpointing(model, on: bool, dtype: torch.dtype | None = None) -> None:
    """Turn activation checkpointing on (non-reentrant, so frozen inputs need no grad) or off.

    The backward pass recomputes each layer outside the trainer's ``compute`` block. torch
    restores autocast there itself, but not labelrl's fp32 attention and fp32 adapter sums,
    so for a ``dtype`` other than fp32 the recomputation enters them again (``context_fn``):
    else it computes those tensors in bf16 where the forward pass saved fp32, and torch
    refuses the mismatch."""
    import contextlib

    from labelrl.models.precision import recompute_patches

    name = "activation_checkpointing" if hasattr(model, "activation_checkpointing_enable") else "gradient_checkpointing"
    if on:
        options: dict = {"use_reentrant": False}
        if dtype is not None and dtype != torch.float32:
            options["context_fn"] = lambda: (contextlib.nullcontext(), recompute_patches(model, dtype))
        getattr(model, f"{name}_enable")(**({f"{name}_kwargs": options}))
    elif hasattr(model, f"{name}_disable"):
        getattr(model, f"{name}_disable")()


def report_memory_plan(plan: MemoryPlan, quiet: bool) -> None:
    """One line on stderr: the prediction, the budget and the decision (a warning when even
    the chosen setting is predicted not to fit)."""
    import sys

    if quiet and plan.fits:
        return
    state = "on" if plan.gradient_checkpointing else "off"
    line = (f"memory: largest batch {plan.tokens} token positions, predicted peak {plan.predicted_peak_mb / 1024:.1f} GiB "
            f"({(plan.predicted_peak_checkpointed_mb or 0) / 1024:.1f} GiB with checkpointing); activation "
            f"checkpointing {state} ({plan.reason})")
    if not plan.fits:
        line += (f"; WARNING: predicted above the budget of {plan.budget_mb / 1024:.1f} GiB even so: lower "
                 f"{plan.knobs}, or raise --memory-budget")
    print(line, file=sys.stderr, flush=True)
