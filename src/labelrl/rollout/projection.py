"""One projection of the fast decode step and of the prefill: ``x·Wᵀ`` with W packed once into
oneDNN's blocked layout (``PackedLinear``), plus, for a LoRA adapter being trained, a separate
low-rank update ``(x·Aᵀ)·Bᵀ`` summed in fp32 (``LowRank``; both together: ``Projection``).

The arithmetic is written once, as functions of a projection's tensors (``ProjectionTensors``,
``project``, ``project_add``): the decode step's layers, compiled by TorchScript
(``fast_decode.decode_layers``), call them, and so do the classes. Which weights are packed,
which adapters are folded in or kept apart, and what is cached between calls is
``labelrl.rollout.fused``'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, NamedTuple, Optional, Union

import torch
import torch.nn.functional as F


def _mkldnn_linear_available(weight: torch.Tensor) -> bool:
    if weight.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if weight.dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return False
    return (weight.dtype in (torch.float32, torch.bfloat16) and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


class PackedLinear:
    """x·Wᵀ for a weight W [out, in] that is applied to the same few rows many times.

    On a CPU with oneDNN the weight is reordered once into oneDNN's blocked layout (the same
    ops torch.compile's CPU backend emits for a frozen linear layer): at 8 rows a decode step
    then runs its matrix products about 1.5–2× faster than ``F.linear``, which repacks the
    weight on every call. Elsewhere it is ``F.linear``. Results agree to float rounding. The
    input must have the weight's dtype (fp32 or bf16); the output has it too.
    """

    def __init__(self, weight: torch.Tensor, rows: int, bias: torch.Tensor | None = None):
        self.packed = None
        self.weight = weight
        self.bias = bias  # [out] in the weight's dtype, or None (Qwen2's q/k/v have one)
        if _mkldnn_linear_available(weight):
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), rows)
            self.weight = None  # the packed copy is all a step needs

    @property
    def tensors(self) -> ProjectionTensors:
        return ProjectionTensors(self.packed, self.weight, self.bias, None, None, None)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return base_product(self.tensors, x)

    def add_to(self, residual: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """residual + x·Wᵀ (+ bias), in one op where the backend fuses it (same dtypes), else two."""
        return base_product_add(self.tensors, residual, x)


@dataclass
class LowRank:
    """The LoRA update of one (fused) projection: Δy = (x·Aᵀ)·Bᵀ.

    ``a`` [R, in] stacks the A factors of every adapted sub-projection and adapter. Bᵀ is held
    in one of two forms:

    * ``blocks`` [k, r, w]: when the k sub-projections have equal widths w and equal ranks r
      (gate and up), member i's scale·Bᵀ; one batched product then runs member i's r columns of
      x·Aᵀ against its own block only;
    * ``b_t`` [R, out] otherwise: block-diagonal, each sub-projection's scale·B in its own rows
      and columns, zero elsewhere, so one product serves q, k and v (at the sampler's row counts
      this beats the batched form once q's width differs from k's: see ``block_layout``).

    Both are fp32 whatever the compute dtype, and base output + update is an fp32 sum, as in
    the training pass (``labelrl.models.precision.fp32_adapter_sum``): at a few rows a bf16
    product this small costs several times an fp32 one on CPU (oneDNN's bf16 setup outweighs
    the arithmetic).
    """

    a: torch.Tensor
    b_t: torch.Tensor | None = None
    blocks: torch.Tensor | None = None

    def add(self, y: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
        """y + down·Bᵀ for a fresh fp32 ``y`` [N, out] (written in place) and
        ``down`` = x·Aᵀ [N, R]."""
        return low_rank_add(y, down, self.b_t, self.blocks)

    def dense_t(self) -> torch.Tensor:
        """Bᵀ [R, out], block-diagonal whichever form is held."""
        return self.b_t if self.blocks is None else torch.block_diag(*self.blocks)


def block_layout(outs: list[int], ranks: list[int]) -> tuple[int, list[int]] | None:
    """How a fused group's B factors split into equal blocks for one batched product: the block
    width w (the gcd of the members' output widths) and, per block, the member whose r columns
    of x·Aᵀ it reads (q/k/v on SmolLM2: widths 576, 192, 192 give w = 192 and members
    [0, 0, 0, 1, 2]). None for a single member, or for members of different ranks (the
    block-diagonal product then).

    The block-diagonal product multiplies its zero blocks too: 2× the work for gate/up, 3× for
    SmolLM2's q/k/v, in the forward product and in both products of its backward. In the
    training pass (402 positions, fp32, forward and backward; AMD EPYC, 2 cores) the blocks
    took 2.2 against 4.5 ms per layer for gate/up and 0.81 against 1.56 ms for q/k/v. With no
    backward, at the sampler's 8 rows, gate/up took 23 against 60 µs, but q/k/v 22 against 15
    (its batched form repeats q's columns, an extra copy that a few rows do not pay back), so
    the sampler blocks only groups whose members each fill one block."""
    if len(outs) < 2 or len(set(ranks)) > 1:
        return None
    width = math.gcd(*outs)
    return width, [member for member, out in enumerate(outs) for _ in range(out // width)]


class Projection:
    """A packed frozen base plus an optional low-rank update."""

    def __init__(self, base: PackedLinear, low_rank: LowRank | None):
        self.base, self.low_rank = base, low_rank

    @property
    def tensors(self) -> ProjectionTensors:
        update = self.low_rank
        if update is None:
            return self.base.tensors
        return ProjectionTensors(self.base.packed, self.base.weight, self.base.bias, update.a, update.b_t, update.blocks)

    def __call__(self, x: torch.Tensor, exact: torch.Tensor | None = None) -> torch.Tensor:
        """x·Wᵀ in the weight's dtype; with a low-rank update, x·Wᵀ + Δy in fp32. ``exact``: the
        fp32 input x was rounded from, which the update reads, as the training pass's does
        (``fp32_adapter_sum``, ``labelrl.rollout.lean_pass``); None: x itself."""
        return project(self.tensors, x, exact)

    def add_to(self, residual: torch.Tensor, x: torch.Tensor, exact: torch.Tensor | None = None) -> torch.Tensor:
        return project_add(self.tensors, residual, x, exact)


# --- a projection as functions of its tensors ---------------------------------------------------
# The decode step runs its layers as one TorchScript function (``fast_decode.decode_layers``),
# which can call these but not the classes above; the classes call them too, so the arithmetic
# is written once. Annotations are typing's, which TorchScript reads. The NamedTuples (this one
# and ``fused.LayerTensors``) use the functional form, whose field types are objects: postponed
# annotations would leave strings that TorchScript cannot resolve inside List[LayerTensors].
ProjectionTensors = NamedTuple("ProjectionTensors", [
    ("packed", Optional[torch.Tensor]), ("weight", Optional[torch.Tensor]), ("bias", Optional[torch.Tensor]),
    ("a", Optional[torch.Tensor]), ("b_t", Optional[torch.Tensor]), ("blocks", Optional[torch.Tensor]),
])
ProjectionTensors.__doc__ = """A projection's tensors: the oneDNN-packed base, or the plain weight where there is no
packing; the bias; the low-rank update's stacked A factors and its Bᵀ in one of ``LowRank``'s
two forms (``a`` None: no update)."""


def base_product(t: ProjectionTensors, x: torch.Tensor) -> torch.Tensor:
    """x·Wᵀ (+ bias) in the weight's dtype (``PackedLinear``)."""
    packed = t.packed
    if packed is not None:
        no_scalars: List[Optional[Union[int, float, complex]]] = []  # the op's Scalar?[]: none for "none"
        return torch.ops.mkldnn._linear_pointwise(x, packed, t.bias, "none", no_scalars, "")
    weight = t.weight
    assert weight is not None
    return F.linear(x, weight, t.bias)


def base_product_add(t: ProjectionTensors, residual: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """residual + x·Wᵀ (+ bias), in one op where the backend fuses it (same dtypes), else two."""
    if residual.dtype != x.dtype:
        return residual + base_product(t, x)
    packed = t.packed
    if packed is not None:
        return torch.ops.mkldnn._linear_pointwise(x, residual, packed, t.bias, "add")  # the op's binary form
    weight = t.weight
    assert weight is not None
    out = torch.addmm(residual, x, weight.t())
    bias = t.bias
    return out if bias is None else out + bias


def low_rank_add(y: torch.Tensor, down: torch.Tensor, b_t: Optional[torch.Tensor],
                 blocks: Optional[torch.Tensor]) -> torch.Tensor:
    """y + down·Bᵀ for a fresh fp32 ``y``, written into it (``LowRank.add``): one product against
    the block-diagonal ``b_t``, or one batched product of each block against its member's rank
    columns."""
    if blocks is None:
        assert b_t is not None
        # in place: TorchScript rewrites an out-of-place addmm as y + down·Bᵀ, two roundings
        return y.addmm_(down, b_t)
    k, r, width = blocks.shape[0], blocks.shape[1], blocks.shape[2]
    y.view(-1, k, width).transpose(0, 1).baddbmm_(down.view(-1, k, r).transpose(0, 1), blocks)
    return y


def _update(t: ProjectionTensors, y: torch.Tensor, x: torch.Tensor, exact: Optional[torch.Tensor]) -> torch.Tensor:
    """y + (x·Aᵀ)·Bᵀ in fp32, the update reading ``exact`` (the fp32 input x was rounded from)
    where given; y unchanged without an update."""
    a = t.a
    if a is None:
        return y
    source = x.float() if exact is None else exact
    return low_rank_add(y.float(), source @ a.t(), t.b_t, t.blocks)


def project(t: ProjectionTensors, x: torch.Tensor, exact: Optional[torch.Tensor]) -> torch.Tensor:
    """``Projection.__call__``: x·Wᵀ, plus the low-rank update in fp32 where there is one."""
    return _update(t, base_product(t, x), x, exact)


def project_add(t: ProjectionTensors, residual: torch.Tensor, x: torch.Tensor,
                exact: Optional[torch.Tensor]) -> torch.Tensor:
    """``Projection.add_to``: residual + x·Wᵀ, plus the low-rank update in fp32."""
    return _update(t, base_product_add(t, residual, x), x, exact)
