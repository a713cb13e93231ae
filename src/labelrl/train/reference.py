"""The KL reference of an RL run: the model the run started from, frozen.

The k3 penalty β·KL(π_θ ‖ π_ref) (Schulman 2020, "Approximating KL divergence"; GRPO,
Shao et al. 2024, Eq. 4) keeps the policy near π_ref, which must be the starting model of
this RL run. Switching the LoRA adapter off would give the model *before* SFT when RL
continues an SFT adapter, so the penalty would pull the policy back past SFT. Instead the
adapter's starting weights are kept (a few MB for LoRA) and put in place for the reference
pass only, then the trained weights are put back. The swap writes through ``.data`` under
``no_grad``; the reference pass runs before the policy's own forward, so no tensor saved for
backward ever sees the starting weights.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch


class ReferenceWeights:
    """A frozen copy of the trainable (adapter) parameters of the starting model."""

    def __init__(self, model: torch.nn.Module) -> None:
        if not hasattr(model, "peft_config"):
            raise ValueError("--beta > 0 needs a reference model; it is available with --lora (the adapter's starting "
                             "weights are kept): add --lora, or set --beta 0")
        self.start = {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}
        if not self.start:
            raise ValueError("--beta > 0: the model has no trainable parameters to hold a reference of")

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.start.values())

    @contextlib.contextmanager
    def active(self, model: torch.nn.Module) -> Iterator[torch.nn.Module]:
        """``model`` with its trainable parameters at their starting values, restored on exit."""
        params = dict(model.named_parameters())
        missing = sorted(set(self.start) - set(params))
        assert not missing, f"reference parameters not in the model: {missing[:3]}"
        trained = {name: params[name].detach().clone() for name in self.start}
        try:
            for name, value in self.start.items():
                params[name].data.copy_(value)
            yield model
        finally:
            for name, value in trained.items():
                params[name].data.copy_(value)
