"""Tolerances for comparing two floating-point computations of one exact quantity, derived
from the arithmetic instead of measured on one CPU.

Two routes to the same number (another padding width, packed or plain rows, a batch or a
loop, one process or two) run other kernels: oneDNN, MKL and ATen pick blocking, vector
width and thread split by shape and by CPU (AVX2, AVX-512, AMX), so they add the same terms
in another order. The rule, written once here: a value computed by any order of summation
differs from the exact one by at most γ_K·M (Higham, *Accuracy and Stability of Numerical
Algorithms*, 2nd ed., Lemma 3.1; §3.1 for dot products, §3.5 for matrix products), where

* u is the unit roundoff of the dtype (fp32: 2⁻²⁴ ≈ 6.0e-8; bf16: 2⁻⁸; fp64: 2⁻⁵³),
* γ_K = K·u / (1 − K·u),
* K is the length of the longest chain of roundings the value went through: a dot product
  or sum of n terms contributes n, and a model's reductions chain layer after layer
  (``logit_chain_length``, ``gradient_chain_length``),
* M is the magnitude: the same computation with every term replaced by its absolute value
  (for a dot product Σ aᵢbᵢ it is Σ |aᵢ|·|bᵢ|), taken from the actual tensors.

Two routes therefore differ by at most γ_K·(M₁ + M₂): no kernel, order or CPU can exceed it.
A real bug (a group lost, a prompt counted G times, a factor 2, a leak across padding) moves
values by O(|value|); where a model is near-random enough for that to come close to the
bound, the test says so and checks that the bug would still show. Bounds are first order in
u (terms in u² dropped, as in the cited analysis). Where a layer's cancellation can leave one
entry of a factor near 0 while its rounding is not (a sum of ± advantages, onehot − softmax),
the entrywise magnitude of the last reduction undercounts that entry, so gradients are
compared per tensor in the Frobenius norm, ‖Ĉ − C‖_F ≤ γ_K·‖ |A|·|B| ‖_F (the entrywise bound,
normed), where such entries weigh what they are.

Where that worst case cannot tell a real bug (a 30-layer model's chain K is ~1.8·10⁵ roundings,
so γ_K·L allows logits to move by units), ``probabilistic=True`` replaces γ_K by γ̃_K(λ) ≈ λ·√K·u
(``gamma_probabilistic``): errors that accumulate like a random walk, not in step. That is a
model, not a guarantee; each test that uses it says what it would miss and what it catches.
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterator

import torch


def unit_roundoff(dtype: torch.dtype) -> float:
    """u = half the distance from 1 to the next number: 2⁻²⁴ for fp32, 2⁻⁸ for bf16, 2⁻⁵³ for fp64."""
    return torch.finfo(dtype).eps / 2


def gamma(chain_length: int, dtype: torch.dtype) -> float:
    """γ_K = K·u/(1 − K·u): the relative error bound of K chained roundings (Higham, Lemma 3.1)."""
    ku = chain_length * unit_roundoff(dtype)
    if ku >= 1:
        raise ValueError(f"chain_length={chain_length}: K·u = {ku:.3g} ≥ 1 in {dtype}, so γ_K bounds nothing; "
                         "compare in a wider dtype")
    return ku / (1 - ku)


# λ of the probabilistic rounding model. Higham & Mary, "A new approach to probabilistic rounding
# error analysis", SIAM J. Sci. Comput. 41(5), 2019, Theorem 2.4: if the K roundings δ_k of a chain
# are independent random variables of mean zero with |δ_k| ≤ u, then |Π_k (1 + δ_k) − 1| ≤ γ̃_K(λ) =
# exp(λ·√K·u + K·u²/(1 − u)) − 1 (≈ λ·√K·u) with probability at least 1 − 2·exp(−λ²(1 − u)²/2).
# λ = 7: 4.6e-11 per chain, so below 1e-4 over the ~10⁶ values one test compares (union bound).
# Where the model's assumption fails (roundings that are alike: many equal terms, or values that
# stagnate in a low precision) the errors can add in step; the worst case γ_K still holds then.
ROUNDING_LAMBDA = 7.0


def gamma_probabilistic(chain_length: int, dtype: torch.dtype, lam: float = ROUNDING_LAMBDA) -> float:
    """min(γ_K, γ̃_K(λ)): the relative error of K chained roundings under the probabilistic model
    (``ROUNDING_LAMBDA``: Higham & Mary 2019, Theorem 2.4); never above the worst case γ_K, which
    it undercuts once K > λ² (49 roundings)."""
    u = unit_roundoff(dtype)
    tilde = math.expm1(lam * math.sqrt(chain_length) * u + chain_length * u * u / (1 - u))
    return tilde if chain_length * u >= 1 else min(tilde, gamma(chain_length, dtype))


def _gamma(chain_length: int, dtype: torch.dtype, probabilistic: bool) -> float:
    return gamma_probabilistic(chain_length, dtype) if probabilistic else gamma(chain_length, dtype)


def _head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _adapter_rank(model: torch.nn.Module) -> int:
    """The largest LoRA rank in ``model`` (0 without an adapter): an adapted projection adds
    x·A (over d) then ·B (over r) to its output, r + 1 more roundings on the path."""
    ranks = [r for module in model.modules() for r in (getattr(module, "r", None) or {}).values()
             if hasattr(module, "lora_A")]
    return max(ranks, default=0)


def _base(model: torch.nn.Module) -> torch.nn.Module:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def logit_chain_length(model: torch.nn.Module, sequence_length: int) -> int:
    """K of one logit of a decoder-only transformer (Llama, Qwen2/3, Gemma 3) over a sequence
    of ``sequence_length`` tokens: the reductions on the longest path from the embedding to the
    vocabulary projection, summed.

    Per layer: the RMSNorms (up to four, Gemma 3's; counted as four for all) reduce over the
    hidden size d, as do the q/k/v and gate/up projections; the q/k norms (Qwen3, Gemma 3)
    and the attention scores reduce over head_dim; softmax's sum and the weighted sum of
    values over the keys (≤ sequence_length); o_proj over heads × head_dim; down_proj over
    the intermediate size; RoPE and the two residual adds add 3; a LoRA adapter adds r + 1 to
    each of the four projections on the path. Then the final norm and the projection (d each).
    """
    config = _base(model).config
    d, head = config.hidden_size, _head_dim(config)
    per_layer = (4 * d + 2 * d + 2 * head + 2 * sequence_length + config.num_attention_heads * head
                 + config.intermediate_size + 3 + 4 * (_adapter_rank(model) + 1))
    return config.num_hidden_layers * per_layer + 2 * d


def gradient_chain_length(model: torch.nn.Module, sequence_length: int, rows: int) -> int:
    """K of a parameter gradient: the forward chain to the logits and the logsumexp over the
    vocabulary V, the backward chain (every reduction of the forward pass runs transposed, so
    the same lengths appear in another order: V in Wᵀ·∂logits, d_ff in gate/upᵀ, …), then the
    weight gradient's own sum over the ``rows`` token positions forwarded (all calls of the
    pass together)."""
    vocab = _base(model).config.vocab_size
    return 2 * (logit_chain_length(model, sequence_length) + vocab) + rows


def logit_magnitude(model: torch.nn.Module) -> float:
    """L, a magnitude of every logit of ``model``, from its weights alone.

    The final RMSNorm's output is h = s ⊙ x̂ with ‖x̂‖₂ ≤ √d (it divides by the root mean
    square) and s its scale (Gemma's norm scales by 1 + w), so each logit's magnitude is
    Σᵢ |hᵢ|·|W_vi| ≤ max|s|·√d·max_v ‖W_v‖₂ (Cauchy–Schwarz), and an error of relative size ε
    anywhere upstream of x̂ moves each logit by at most ε times that.
    """
    inner = _base(model)
    head = inner.get_output_embeddings().weight.detach().double()
    norm = inner.model.norm
    scale = norm.weight.detach().double()
    if type(norm).__name__.startswith("Gemma"):  # Gemma's RMSNorm multiplies by (1 + w)
        scale = 1 + scale
    return float(scale.abs().max()) * math.sqrt(head.shape[1]) * float(head.norm(dim=1).max())


def logit_error(model: torch.nn.Module, sequence_length: int, dtype: torch.dtype = torch.float32,
                probabilistic: bool = False) -> float:
    """The largest error of one computed logit: γ_K·L (``logit_chain_length``,
    ``logit_magnitude``). A soft cap (Gemma: cap·tanh(z/cap)) passes that on no larger
    (|tanh'| ≤ 1) and adds its own three roundings, of values up to the cap: 3u·cap.
    ``probabilistic``: γ̃_K(λ) in place of γ_K (``gamma_probabilistic``)."""
    cap = getattr(_base(model).config, "final_logit_softcapping", None) or 0.0
    return (_gamma(logit_chain_length(model, sequence_length), dtype, probabilistic) * logit_magnitude(model)
            + 3 * unit_roundoff(dtype) * cap)


def logit_bound(model: torch.nn.Module, sequence_length: int, dtype: torch.dtype = torch.float32,
                probabilistic: bool = False) -> float:
    """The largest difference two routes' logits can have: twice ``logit_error``."""
    return 2 * logit_error(model, sequence_length, dtype, probabilistic)


def logprob_error(model: torch.nn.Module, sequence_length: int, dtype: torch.dtype = torch.float32,
                  probabilistic: bool = False) -> float:
    """The largest error of one computed log-prob ``z_t − logsumexp(z)``, first order in u.

    Each logit is within ε = ``logit_error`` of its exact value, which moves z_t and
    logsumexp (by Σ_v p_v δz_v) by ε each. logsumexp's own rounding, computed as
    m + log Σ_v exp(z_v − m): each z_v − m (|·| ≤ 2L, L = ``logit_magnitude``) rounds by
    2uL, passed on relatively by exp, which rounds by u; the sum of V positive terms by γ_V
    relative; log adds u·log V (the sum lies in [1, V]) and the final add u·|lse| with
    |lse| ≤ L + log V: γ_V + u·(3L + 2·log V) in all. The subtraction rounds by u·|logp| ≤
    u·(2L + log V). Total: 2ε + γ_V + u·(5L + 3·log V). ``probabilistic``: γ̃ in place of γ
    (``gamma_probabilistic``) in ε and for the sum.
    """
    L, vocab, u = logit_magnitude(model), _base(model).config.vocab_size, unit_roundoff(dtype)
    return (2 * logit_error(model, sequence_length, dtype, probabilistic) + _gamma(vocab, dtype, probabilistic)
            + u * (5 * L + 3 * math.log(vocab)))


def logprob_bound(model: torch.nn.Module, sequence_length: int, dtype: torch.dtype = torch.float32,
                  probabilistic: bool = False) -> float:
    """The largest difference two routes' log-probs of one token can have: twice ``logprob_error``."""
    return 2 * logprob_error(model, sequence_length, dtype, probabilistic)


def bf16_rounding_logprob_bound(model: torch.nn.Module, sequence_length: int) -> float:
    """The largest difference two bf16 routes' log-probs can have when both round the same
    values to bf16 (``labelrl.models.precision``: each projection's input and its output; the
    rest, accumulations included, fp32) but sum in another order: ``logprob_bound`` in fp32,
    plus the bf16 roundings. Two nearly equal fp32 values rounded to bf16 differ by at most their
    difference plus one rounding, u_bf16 relative, so each rounding site adds u_bf16 per route;
    a layer has eight (four projections, input and output), chaining to γ_(8·layers) in bf16
    relative upstream of the final norm, which moves each logit by at most that times
    ``logit_magnitude`` L and each log-prob by twice that (its logit and the logsumexp): 2·2·γ·L
    for two routes."""
    layers = _base(model).config.num_hidden_layers
    return logprob_bound(model, sequence_length) + 4 * gamma(8 * layers, torch.bfloat16) * logit_magnitude(model)


def mean_logprob_bound(model: torch.nn.Module, sequence_length: int, n_tokens: int, value: float,
                       dtype: torch.dtype = torch.float32) -> float:
    """The largest difference two routes' mean of ``n_tokens`` log-probs (a cross-entropy loss
    ``value``) can have: each log-prob within ``logprob_error``, and the sum of n terms of one
    sign within γ_n of its magnitude n·|value|, the division adding u: twice
    (``logprob_error`` + γ_(n+1)·|value|). A token-weighted mean of per-item means is within
    the same bound (a weighted mean of their errors)."""
    return 2 * (logprob_error(model, sequence_length, dtype) + gamma(n_tokens + 1, dtype) * abs(value))


def label_probability_bound(model: torch.nn.Module, sequence_length: int, probs: torch.Tensor, tokens: int = 1,
                            dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Entrywise, the largest difference two routes' label probabilities [N, k] can have: a
    softmax over the k labels' log-probs s_j.

    One token per label (distinct first tokens): s_j = z_j − lse shares the logsumexp, which
    a softmax ignores (a shared shift), so only each logit's error (``logit_error``) and each
    subtraction's (u·|s_j| ≤ u·(2L + log V)) remain. Labels scored as whole sequences of up to
    ``tokens`` tokens: s_j sums log-probs at other positions, whose logsumexps differ, so
    tokens × ``logprob_error``. A softmax moves p_k by at most p_k·2·max_j |δs_j|, and its own
    exps, sum of k and division add γ_(k+3)·p_k. Two routes: twice that.
    """
    L, vocab, u = logit_magnitude(model), _base(model).config.vocab_size, unit_roundoff(dtype)
    if tokens == 1:
        per_input = logit_error(model, sequence_length, dtype) + u * (2 * L + math.log(vocab))
    else:
        per_input = tokens * logprob_error(model, sequence_length, dtype)
    return 2 * probs.detach().double().abs() * (2 * per_input + gamma(probs.shape[-1] + 3, dtype))


def product_bound(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Entrywise, the largest difference two kernels' ``a @ b`` can have: 2·γ_k·(|a|·|b|), k
    the inner dimension."""
    magnitude = a.detach().double().abs() @ b.detach().double().abs()
    return 2 * gamma(a.shape[-1], dtype) * magnitude


def assert_values_within(actual: torch.Tensor, expected: torch.Tensor, bound: float | torch.Tensor,
                         what: str = "values") -> None:
    """Every entry within ``bound`` (a derived rounding bound: one number, or one per entry) of
    the other; the message names how many entries missed and by how much."""
    actual, expected = torch.as_tensor(actual), torch.as_tensor(expected)
    assert actual.shape == expected.shape, f"{what}: shapes {tuple(actual.shape)} and {tuple(expected.shape)}"
    diff = (actual.double() - expected.double()).abs()
    bound = torch.as_tensor(bound, dtype=torch.float64).expand_as(diff)
    over = ~(diff <= bound)  # NaN counts as over
    worst = int((diff - bound).argmax()) if diff.numel() else 0
    assert not bool(over.any()), (
        f"{what}: {int(over.sum())} of {diff.numel()} entries differ by more than the rounding bound "
        f"(worst: {float(diff.flatten()[worst]):.3g} where {float(bound.flatten()[worst]):.3g} is allowed)")


@contextlib.contextmanager
def gradient_magnitudes(model: torch.nn.Module) -> Iterator[dict[str, torch.Tensor]]:
    """Within the block, every backward pass through ``model`` adds to the yielded dict, for
    each parameter name (``named_parameters``; a tied weight once), the magnitude M of the
    last reduction that forms its gradient, in float64:

    * ``nn.Linear`` y = x·Wᵀ + b: ∂W = Σ_rows ∂yᵀ·x, so M_W = |∂y|ᵀ·|x| and M_b = Σ_rows |∂y|;
    * ``nn.Embedding`` (Gemma's scaled one: × embed_scale): M = scale·Σ_{rows of token v} |∂y|;
    * RMSNorm y = s ⊙ x̂ (s = w, or 1 + w in Gemma): ∂w = Σ_rows ∂y ⊙ x̂, so M = Σ_rows |∂y|·|x̂|.

    A tied weight (embedding and output head) sums the magnitudes of its uses, as its
    gradient sums their gradients. The factors are the computed ones, which is exact to
    first order in u. A parameter that receives a gradient through any other module has no
    magnitude here; ``gradient_bounds`` then refuses it by name.
    """
    names = {id(p): n for n, p in model.named_parameters()}
    found: dict[str, torch.Tensor] = {}
    handles = []

    def add(param: torch.Tensor | None, magnitude: torch.Tensor) -> None:
        if param is None or not param.requires_grad:
            return
        name = names[id(param)]
        found[name] = found[name] + magnitude if name in found else magnitude

    def rows(t: torch.Tensor) -> torch.Tensor:
        return t.detach().double().abs().reshape(-1, t.shape[-1])

    def on_linear(module, inputs, output):
        x = rows(inputs[0])

        def backward(grad):
            g = rows(grad)
            add(module.weight, g.T @ x)
            add(module.bias, g.sum(0))
        return backward

    def on_embedding(module, inputs, output):
        ids = inputs[0].reshape(-1)
        scale = float(getattr(module, "embed_scale", 1.0))

        def backward(grad):
            per_token = torch.zeros(module.weight.shape, dtype=torch.float64).index_add_(0, ids, rows(grad))
            add(module.weight, abs(scale) * per_token)
        return backward

    def on_rms_norm(module, inputs, output):
        x = inputs[0].detach().double()
        eps = getattr(module, "variance_epsilon", None) or module.eps
        x_hat = rows(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

        def backward(grad):
            add(module.weight, (rows(grad) * x_hat).sum(0))
        return backward

    def hook(make):
        def forward_hook(module, inputs, output):
            if isinstance(output, torch.Tensor) and output.requires_grad:
                output.register_hook(make(module, inputs, output))
        return forward_hook

    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            handles.append(module.register_forward_hook(hook(on_linear)))
        elif isinstance(module, torch.nn.Embedding):
            handles.append(module.register_forward_hook(hook(on_embedding)))
        elif type(module).__name__.endswith("RMSNorm"):
            handles.append(module.register_forward_hook(hook(on_rms_norm)))
    try:
        yield found
    finally:
        for handle in handles:
            handle.remove()


def gradient_bounds(magnitudes: list[dict[str, torch.Tensor]], names, chain_length: int,
                    dtype: torch.dtype = torch.float32) -> dict[str, float]:
    """Per parameter, the largest Frobenius distance between the gradients of two routes:
    γ_K·(‖M₁‖_F + ‖M₂‖_F), one magnitude dict per route (``gradient_magnitudes``)."""
    g = gamma(chain_length, dtype)
    bounds = {}
    for name in names:
        missing = [i for i, m in enumerate(magnitudes) if name not in m]
        assert not missing, (f"{name}: no magnitude recorded (route {missing}); "
                             "gradient_magnitudes knows Linear, Embedding and RMSNorm")
        bounds[name] = g * sum(float(m[name].norm()) for m in magnitudes)
    return bounds


def assert_gradients_within(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], bounds: dict[str, float]) -> None:
    """Same parameters, each gradient within its bound (Frobenius norm) of the other's."""
    assert a.keys() == b.keys() and a, f"different or no parameters: {sorted(a.keys() ^ b.keys())[:5]}"
    for name in a:
        diff = float((a[name].double() - b[name].double()).norm())
        assert diff <= bounds[name], (f"{name}: gradients differ by {diff:.3g} (Frobenius) > the rounding bound "
                                      f"{bounds[name]:.3g}; ‖gradient‖ = {float(b[name].double().norm()):.3g}")

