"""Compute precision: fp32, or bf16 where the processor computes it natively.

``--precision`` of ``sft``, ``rl``, ``eval``, ``distill`` and the ladder takes ``auto`` (the
default), ``fp32`` or ``bf16``; ``resolve_dtype`` turns it into the dtype matrix products run
in. ``auto`` is bf16 on a CUDA GPU that supports it and on a CPU with native bf16 arithmetic
(AVX-512 BF16 or AMX), fp32 elsewhere: a CPU without them runs bf16 through slower emulation.

What bf16 means here (mixed precision, as in Micikevicius et al. 2018, "Mixed Precision
Training", with bf16 instead of fp16 so no loss scaling is needed):

* weights, trainable parameters and optimizer state stay fp32; ``autocast`` runs the matrix
  products (linear layers, attention) in bf16 with fp32 accumulation, and the residual
  stream, the norms and everything autocast leaves alone stay fp32;
* ``fp32_output_head`` computes the vocabulary projection in fp32, so every logit, log-prob,
  loss and label score is an fp32 number from fp32 hidden states: rounding logits of size
  ~20 to bf16's 8 significant bits would move each log-prob by up to ~0.06 nats;
* on CPU, ``fp32_attention`` runs the attention itself (SDPA) in fp32: torch 2.13's CPU flash
  kernel is slower in bf16 than in fp32 at these sizes (measured, forward + backward, 8 × 9
  heads × 30 queries over 130 keys: 9.9 ms bf16, 6.2 ms fp32; at 400 × 400 they are equal),
  and its backward is where a bf16 training pass lost most of its gain. The projections
  around it stay bf16.
"""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Literal

if TYPE_CHECKING:  # the config models import this module for its help text, without torch
    import torch

Precision = Literal["auto", "fp32", "bf16"]
PRECISIONS: tuple[str, ...] = ("auto", "fp32", "bf16")
PRECISION_HELP = ("Compute precision: bf16 (matrix products in bfloat16 under autocast; weights, optimizer "
                  "state, log-probs and losses in fp32), fp32, or auto = bf16 where the processor computes "
                  "it natively (AVX-512 BF16 or AMX CPUs, bf16-capable GPUs), else fp32.")
_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def _names() -> dict:
    import torch

    return {torch.float32: "fp32", torch.bfloat16: "bf16"}


def _cpuinfo_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return set()
    return {flag for line in text.splitlines() if line.startswith("flags") for flag in line.split(":", 1)[1].split()}


def cpu_has_native_bf16() -> bool:
    """True when this CPU multiplies bf16 matrices in hardware (AVX-512 BF16 or AMX) and
    torch's oneDNN backend can use it. torch's own probes are private, so /proc/cpuinfo is
    the fallback; oneDNN also runs bf16 on plain AVX-512 by emulation, slower than fp32,
    which is why ``torch.ops.mkldnn._is_mkldnn_bf16_supported`` alone is not the test."""
    import torch

    if not torch.backends.mkldnn.is_available():
        return False
    probes = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    if all(callable(p) for p in probes):
        return any(p() for p in probes)
    return bool(_cpuinfo_flags() & set(_CPU_FLAGS))


def resolve_dtype(precision: str, device: torch.device | str = "cpu") -> torch.dtype:
    """The compute dtype of ``precision`` ("auto", "fp32", "bf16") on ``device``."""
    import torch

    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r}: not a known precision; use one of {', '.join(PRECISIONS)}")
    if precision == "fp32":
        return torch.float32
    if precision == "bf16":
        return torch.bfloat16
    device = torch.device(device)
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    if device.type == "cpu":
        return torch.bfloat16 if cpu_has_native_bf16() else torch.float32
    return torch.float32


def precision_name(dtype: torch.dtype) -> str:
    """"fp32" or "bf16" (what the metrics and benchmark JSON record)."""
    return _names().get(dtype, str(dtype).removeprefix("torch."))


def check_compute_dtype(dtype: torch.dtype) -> None:
    if dtype not in _names():
        raise ValueError(f"compute dtype {dtype}: only torch.float32 and torch.bfloat16 are supported; "
                         "pass one of them (or precision 'fp32' / 'bf16')")


@contextlib.contextmanager
def autocast(dtype: torch.dtype, device: torch.device | str = "cpu") -> Iterator[None]:
    """Matrix products in ``dtype`` (bf16) on ``device``'s type; nothing changes for fp32."""
    import torch

    check_compute_dtype(dtype)
    if dtype == torch.float32:
        yield
        return
    with torch.autocast(device_type=torch.device(device).type, dtype=dtype):
        yield


def _output_head(model: torch.nn.Module) -> torch.nn.Module | None:
    import torch

    inner = getattr(model, "module", model)  # DistributedDataParallel-style wrapper
    getter = getattr(inner, "get_output_embeddings", None)
    head = getter() if callable(getter) else None
    return head if type(head) is torch.nn.Linear else None


@contextlib.contextmanager
def fp32_output_head(model: torch.nn.Module, dtype: torch.dtype) -> Iterator[None]:
    """Within the block, the model's vocabulary projection runs in fp32 even under bf16
    autocast (its input, the final norm's output, is already fp32 there). It costs little:
    callers project only the positions they need (``logits_to_keep``). A head that is not a
    plain ``nn.Linear`` (e.g. a LoRA-wrapped one) is left as it is. No-op for fp32."""
    import torch
    import torch.nn.functional as F

    head = _output_head(model) if dtype != torch.float32 else None
    if head is None or "forward" in head.__dict__:  # fp32, no plain head, or already inside such a block
        yield
        return

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=hidden.device.type, enabled=False):
            bias = None if head.bias is None else head.bias.float()
            return F.linear(hidden.float(), head.weight.float(), bias)

    head.forward = forward  # an instance attribute shadows the class's forward
    try:
        yield
    finally:
        del head.forward


@contextlib.contextmanager
def fp32_attention(device: torch.device, dtype: torch.dtype) -> Iterator[None]:
    """Within the block, transformers' "sdpa" attention runs in fp32 on CPU when ``dtype`` is
    bf16 (autocast off around it, query/key/value cast up; the output goes on to the bf16
    output projection). Scoped: the registration is undone on exit (nested blocks keep it)."""
    import torch
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    local = ALL_ATTENTION_FUNCTIONS._local_mapping
    if dtype == torch.float32 or torch.device(device).type != "cpu" or getattr(local.get("sdpa"), "labelrl_fp32", False):
        yield
        return

    def attention(module, query, key, value, attention_mask, **kwargs):
        with torch.autocast(device_type="cpu", enabled=False):
            return sdpa_attention_forward(module, query.float(), key.float(), value.float(), attention_mask, **kwargs)

    attention.labelrl_fp32 = True
    missing = object()
    previous = local.get("sdpa", missing)
    local["sdpa"] = attention
    try:
        yield
    finally:
        if previous is missing:
            del local["sdpa"]
        else:
            local["sdpa"] = previous


def _adapted_base_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The frozen base projections of a peft LoRA model (modules with ``lora_A`` and ``base_layer``),
    listed once per model."""
    inner = getattr(model, "module", model)
    cached = inner.__dict__.get("_labelrl_adapted_bases")
    if cached is None:
        cached = [m.base_layer for m in inner.modules() if hasattr(m, "lora_A") and hasattr(m, "base_layer")]
        inner.__dict__["_labelrl_adapted_bases"] = cached
    return cached


@contextlib.contextmanager
def fp32_adapter_sum(model: torch.nn.Module, dtype: torch.dtype) -> Iterator[None]:
    """Within the block, a LoRA projection adds its low-rank update to the base output in fp32.

    peft computes ``base(x) + B(A(x))·s`` and keeps the base output's dtype. Under bf16 autocast
    that sum is bf16 (8 significant bits), so an update smaller than about 1/256 of the base
    output (every update early in training: B starts at zero) is rounded away in the forward
    pass, and the loss does not see what the adapter learned. Measured on SmolLM2 + LoRA r=16,
    sms-spam, 40 SFT steps: training loss 1.26 vs 1.00 at step 4 and val balanced accuracy 0.50
    vs 0.90 at step 40 against fp32. The base output is cast up (a forward hook), the base's
    matrix products stay bf16. No-op for fp32 and for models without adapters.

    Within the block a plain LoRA layer runs ``_lean_lora_forward`` instead of peft's forward:
    the same sum, with the update's two small products in the adapter's own dtype (fp32)
    rather than bf16. On CPU a bf16 product of these shapes (rank 16, a few hundred rows) is no
    faster than fp32 and often slower (oneDNN's bf16 setup outweighs the arithmetic), and it
    drops peft's casts of the input to fp32 and back, its separate scaling product and three
    submodule calls, forward and backward: on SmolLM2 + LoRA r=16 the RL training pass ran
    1.10× faster (docs/performance.md). The update is then exact to fp32 rounding, as the
    sampler's low-rank update is (``labelrl.rollout.projection``)."""
    import torch

    bases = _adapted_base_layers(model) if dtype != torch.float32 else []
    handles = [base.register_forward_hook(lambda _m, _i, out: out.float()) for base in bases]
    layers = _lora_layers(model) if bases else []
    for layer in layers:
        layer.forward = functools.partial(_lean_lora_forward, layer)
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        for layer in layers:
            del layer.forward


def _lora_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """peft's LoRA ``Linear`` layers of the model (no other layer type, no subclass)."""
    from peft.tuners.lora.layer import Linear

    inner = getattr(model, "module", model)
    return [m for m in inner.modules() if type(m) is Linear and "forward" not in m.__dict__]


def _lean_lora_forward(layer: torch.nn.Module, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """base(x) (made fp32 by ``fp32_adapter_sum``'s hook) + Σ scale·B(A(x)) over the active
    adapters, the update computed in the factors' dtype outside autocast: peft's vanilla-LoRA
    sum (``lora/layer.py``, ``Linear.forward``; Hu et al. 2021, LoRA, eq. 3). Anything else
    (merged or disabled adapters, mixed-batch ``adapter_names``, LoRA variants such as DoRA, a
    dropout that is active) goes to peft's own forward."""
    import torch
    import torch.nn.functional as F

    active = [name for name in layer.active_adapters if name in layer.lora_A]
    if (args or kwargs or layer.disable_adapters or layer.merged
            or any(name in layer.lora_variant for name in active)
            or any(layer.training and not isinstance(layer.lora_dropout[name], torch.nn.Identity) for name in active)):
        return type(layer).forward(layer, x, *args, **kwargs)
    result = layer.base_layer(x)
    with torch.autocast(device_type=x.device.type, enabled=False):
        for name in active:
            a, b = layer.lora_A[name].weight, layer.lora_B[name]  # B may carry a bias (peft's lora_bias)
            update = F.linear(F.linear(x.to(a.dtype), a), b.weight, b.bias)
            result = torch.add(result, update, alpha=layer.scaling[name])
    return result


_CAST_KEY = "_labelrl_low_precision_weight"
_GROUP_KEY = "_labelrl_low_precision_group"  # on a group's first module: (joined copy, member row views)


def _frozen_linears(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Plain ``nn.Linear`` modules whose weight does not train (a LoRA model's base layers),
    the output head excepted: it runs in fp32 (``fp32_output_head``)."""
    import torch

    inner = getattr(model, "module", model)
    head = _output_head(model)
    return [m for m in inner.modules() if type(m) is torch.nn.Linear and not m.weight.requires_grad and m is not head]


def _kept_cast(module: torch.nn.Module, dtype: torch.dtype) -> torch.Tensor | None:
    """The ``dtype`` copy of ``module.weight`` kept on the module while still valid (the weight's
    storage and version counter unchanged: no in-place write, no loaded checkpoint), else None."""
    weight = module.weight
    kept = module.__dict__.get(_CAST_KEY)
    return kept[1] if kept is not None and kept[0] == (weight.untyped_storage().data_ptr(), weight._version, dtype) else None


def _keep_cast(module: torch.nn.Module, dtype: torch.dtype, copy: torch.Tensor) -> None:
    weight = module.weight
    module.__dict__[_CAST_KEY] = ((weight.untyped_storage().data_ptr(), weight._version, dtype), copy)


def low_precision_weight(module: torch.nn.Module, dtype: torch.dtype) -> torch.Tensor:
    """``module.weight`` in ``dtype``, cast once and kept on the module until the weight changes
    (its storage or its version counter: an in-place write, a loaded checkpoint)."""
    kept = _kept_cast(module, dtype)
    if kept is None:
        kept = module.weight.detach().to(dtype)
        _keep_cast(module, dtype, kept)
    return kept


def low_precision_group(modules: list[torch.nn.Module], dtype: torch.dtype) -> torch.Tensor:
    """The concatenation along output rows of the ``modules``' ``low_precision_weight``, kept: each
    module's kept copy becomes its rows of one tensor, so a pass that runs the group as one
    product (``labelrl.rollout.lean_pass``: q/k/v, gate/up) neither concatenates 212 MB of
    SmolLM2 weights per pass nor keeps a second copy. Made again when any member's kept copy is
    no longer its rows (its weight changed, or it was cast apart by ``low_precision_weight``)."""
    import torch

    group = modules[0].__dict__.get(_GROUP_KEY)
    if group is not None and all(_kept_cast(m, dtype) is part for m, part in zip(modules, group[1])):
        return group[0]
    joined = torch.empty((sum(m.weight.shape[0] for m in modules), modules[0].weight.shape[1]), dtype=dtype,
                         device=modules[0].weight.device)
    parts, start = [], 0
    for module in modules:
        part = joined[start : start + module.weight.shape[0]]
        kept = _kept_cast(module, dtype)
        part.copy_(module.weight.detach() if kept is None else kept)  # the rounding low_precision_weight makes
        _keep_cast(module, dtype, part)
        parts.append(part)
        start += module.weight.shape[0]
    modules[0].__dict__[_GROUP_KEY] = (joined, parts)
    return joined


def cast_weights_to_keep(model: torch.nn.Module, dtype: torch.dtype) -> int:
    """Bytes ``frozen_weights_cast_once`` will keep that it does not keep yet (0 for fp32)."""
    import torch

    if dtype == torch.float32:
        return 0
    size = torch.empty((), dtype=dtype).element_size()
    total = 0
    for module in _frozen_linears(model):
        if _kept_cast(module, dtype) is None:
            total += module.weight.numel() * size
    return total


def kept_casts(model: torch.nn.Module) -> list[torch.Tensor]:
    """The low-precision weight copies ``frozen_weights_cast_once`` keeps on ``model``."""
    return [m.__dict__[_CAST_KEY][1] for m in _frozen_linears(model) if _CAST_KEY in m.__dict__]


@contextlib.contextmanager
def frozen_weights_cast_once(model: torch.nn.Module, dtype: torch.dtype) -> Iterator[None]:
    """Within the block, a frozen ``nn.Linear`` multiplies by a ``dtype`` copy of its weight kept
    between passes (``low_precision_weight``) instead of the fp32 weight autocast casts anew.

    torch's autocast caches the casts of trainable leaves only, so a LoRA model's frozen base
    was cast at every forward call (the RL training pass makes three: prefix, prompts,
    completions) and each call saved its own bf16 copy for backward: 3 × 212 MB for SmolLM2.
    The copy is the same rounding autocast makes (round to nearest even), so every product is
    unchanged. Layers whose weight trains, an output head already patched (``fp32_output_head``)
    and fp32 are left alone."""
    import torch
    import torch.nn.functional as F

    patched = []
    if dtype != torch.float32:
        for module in _frozen_linears(model):
            if "forward" in module.__dict__:  # inside another such block
                continue

            def forward(x: torch.Tensor, module=module) -> torch.Tensor:
                bias = None if module.bias is None else module.bias
                return F.linear(x.to(dtype), low_precision_weight(module, dtype), bias)

            module.forward = forward
            patched.append(module)
    try:
        yield
    finally:
        for module in patched:
            del module.forward


@contextlib.contextmanager
def recompute_patches(model: torch.nn.Module, dtype: torch.dtype) -> Iterator[None]:
    """``fp32_attention`` and ``fp32_adapter_sum`` without autocast: what activation
    checkpointing must enter again when it recomputes a layer in the backward pass (torch
    restores the autocast state itself)."""
    device = next(getattr(model, "module", model).parameters()).device
    with fp32_attention(device, dtype), fp32_adapter_sum(model, dtype):
        yield


@contextlib.contextmanager
def compute(model: torch.nn.Module, dtype: torch.dtype) -> Iterator[None]:
    """``autocast`` on the model's device, ``fp32_output_head``, ``fp32_attention``,
    ``fp32_adapter_sum`` and ``frozen_weights_cast_once``: how every forward pass of a trainer,
    sampler or scorer runs at ``dtype``."""
    device = next(getattr(model, "module", model).parameters()).device
    with (autocast(dtype, device), fp32_output_head(model, dtype), fp32_attention(device, dtype),
          fp32_adapter_sum(model, dtype), frozen_weights_cast_once(model, dtype)):
        yield
