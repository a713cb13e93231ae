"""Each position's log-prob of its target token straight from the last hidden states, without
the [M, V] logits.

log π(t | h) = h·w_t + b_t − logsumexp_v(h·w_v + b_v) for the vocabulary projection (W, b),
frozen. Through logits this writes, then reads, several vocabulary-wide fp32 tensors (the logits,
their log-softmax, its gradient, the logits' gradient: 43 MB each at 218 positions of a 49k
vocabulary), more than a CPU's cache holds, and saves the log-softmax for backward. Here the
vocabulary is read in slices that fit in cache, once:

* the normaliser is accumulated slice by slice with a running maximum, as the online softmax
  does (Milakov & Gimelshein 2018, "Online normalizer calculation for softmax", Alg. 3);
* alongside it, the expected projection row Σ_v p_v·w_v (p the softmax), with the same
  rescaling, so the gradient is ready when the forward ends: ∂ log π(t | h)/∂h = w_t − Σ_v p_v·w_v
  (the softmax's Jacobian against the one-hot), and the backward multiplies it by each
  position's incoming gradient. Only that [M, hidden] vector is saved.

The same sums give each position's entropy for free: H = logsumexp(z) − Σ_v p_v·z_v, and
Σ_v p_v·z_v = h·(Σ_v p_v·w_v) + Σ_v p_v·b_v, the expected row above dotted with h (plus the
bias's expectation, one more slice-wise product when there is a bias). It is returned beside
the log-probs, detached (no gradient flows through it).

The products are fp32, as the logits' are in every precision labelrl trains in; the target's
logit is read from the product that computes it, so the log-prob is that logit minus the
normaliser exactly as a full-logits pass computes it, up to the summation order of the
normaliser. W and b get no gradient (callers ensure they need none).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# A slice of the vocabulary is about this many bytes of fp32 logits, within a core's L2 cache:
# 1–2 MB measured fastest at 218 and 400 rows (of 256 KB to 16 MB) on a 2-core AMD EPYC.
SLICE_BYTES = 2**20
MIN_SLICE = 1024


def _slice_width(rows: int, vocab: int) -> int:
    return min(vocab, max(MIN_SLICE, SLICE_BYTES // (4 * max(rows, 1))))


class _TokenLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                targets: torch.Tensor) -> torch.Tensor:
        rows, vocab = hidden.shape[0], weight.shape[0]
        running_max = hidden.new_full((rows,), -torch.inf)
        total = hidden.new_zeros(rows)  # Σ exp(logit − running_max)
        expected = hidden.new_zeros(rows, hidden.shape[1])  # Σ exp(logit − running_max)·w
        picked = hidden.new_zeros(rows)
        expected_bias = hidden.new_zeros(rows)  # Σ exp(logit − running_max)·b
        width = _slice_width(rows, vocab)
        for start in range(0, vocab, width):
            part = weight[start : start + width]
            logits = F.linear(hidden, part, None if bias is None else bias[start : start + width])
            here = (targets >= start) & (targets < start + part.shape[0])
            index = (targets - start).clamp(0, part.shape[0] - 1).unsqueeze(1)
            picked = torch.where(here, logits.gather(1, index).squeeze(1), picked)
            new_max = torch.maximum(running_max, logits.amax(dim=1))
            rescale = torch.exp(running_max - new_max)  # 0 on the first slice (exp(−inf))
            probs = logits.sub_(new_max.unsqueeze(1)).exp_()  # unnormalised, ≤ 1
            total = torch.addcmul(probs.sum(dim=1), total, rescale)
            expected = torch.addmm(expected * rescale.unsqueeze(1), probs, part)
            if bias is not None:
                expected_bias = torch.addmv(expected_bias * rescale, probs, bias[start : start + width])
            running_max = new_max
        mean_row = expected / total.unsqueeze(1)  # Σ_v p_v·w_v
        ctx.save_for_backward(weight.index_select(0, targets) - mean_row)
        # H = logsumexp_v z_v − Σ_v p_v·z_v, with Σ_v p_v·z_v = h·(Σ_v p_v·w_v) + Σ_v p_v·b_v
        entropy = running_max + total.log() - (hidden * mean_row).sum(dim=1) - expected_bias / total
        ctx.mark_non_differentiable(entropy)
        return picked - running_max - total.log(), entropy

    @staticmethod
    def backward(ctx, grad: torch.Tensor, _entropy_grad: torch.Tensor):
        (direction,) = ctx.saved_tensors
        return grad.unsqueeze(1) * direction, None, None, None


def token_logprobs(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   targets: torch.Tensor, with_entropy: bool = False):
    """log softmax(hidden·Wᵀ + b)[target] per row, fp32 [M], from ``hidden`` [M, H] (fp32),
    the frozen projection ``weight`` [V, H] and ``bias`` [V] (or None) and ``targets`` [M].
    ``with_entropy``: also each row's entropy −Σ_v p_v log p_v [M] (nats, detached), as a pair."""
    if weight.requires_grad or (bias is not None and bias.requires_grad):
        raise ValueError("token_logprobs gives the vocabulary projection no gradient, and it requires one here: "
                         "compute the logits and their log-softmax instead (the module pass does)")
    logprobs, entropy = _TokenLogprobs.apply(hidden, weight, bias, targets)
    return (logprobs, entropy) if with_entropy else logprobs
