"""Precision resolution and the fp32 vocabulary projection under bf16 autocast."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from labelrl.models import precision as P

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from numerics import assert_values_within, gamma, product_bound  # noqa: E402


def tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=512, max_position_embeddings=128, initializer_range=0.2,
                         tie_word_embeddings=False)
    return LlamaForCausalLM(config).eval()


def test_explicit_precisions_resolve_the_same_everywhere():
    assert P.resolve_dtype("fp32") == torch.float32
    assert P.resolve_dtype("bf16") == torch.bfloat16
    assert P.resolve_dtype("fp32", "cuda") == torch.float32


@pytest.mark.parametrize("native, expected", [(True, torch.bfloat16), (False, torch.float32)])
def test_auto_is_bf16_only_on_a_cpu_with_native_bf16(monkeypatch, native, expected):
    monkeypatch.setattr(P, "cpu_has_native_bf16", lambda: native)
    assert P.resolve_dtype("auto", "cpu") == expected


def test_unknown_precision_names_the_choices():
    with pytest.raises(ValueError, match="precision='fp16'.*auto, fp32, bf16"):
        P.resolve_dtype("fp16")
    with pytest.raises(ValueError, match="torch.float16.*float32 and torch.bfloat16"):
        P.check_compute_dtype(torch.float16)


def test_cpuinfo_fallback_reads_the_bf16_flags(monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", None, raising=False)
    monkeypatch.setattr(P, "_cpuinfo_flags", lambda: {"avx512f", "avx512_bf16"})
    assert P.cpu_has_native_bf16() is True
    monkeypatch.setattr(P, "_cpuinfo_flags", lambda: {"avx512f", "avx512_vnni"})  # AVX-512 without BF16: emulated
    assert P.cpu_has_native_bf16() is False


def _final_hidden(model):
    """The final norm's output (the vocabulary projection's input), captured by a hook."""
    seen = {}
    handle = model.model.norm.register_forward_hook(lambda m, i, out: seen.setdefault("h", out))
    return seen, handle


@pytest.mark.numerics
def test_compute_bf16_projects_the_vocabulary_in_fp32_from_fp32_hidden_states():
    model = tiny_llama()
    ids = torch.randint(3, 512, (2, 9), generator=torch.Generator().manual_seed(0))
    seen, handle = _final_hidden(model)
    with torch.no_grad(), P.compute(model, torch.bfloat16):
        logits = model(input_ids=ids).logits
    handle.remove()
    hidden = seen["h"]
    assert hidden.dtype == torch.float32  # the residual stream and the norm stay fp32 under autocast
    assert logits.dtype == torch.float32
    # the fp32 product of those hidden states, to two fp32 kernels' rounding (2·γ_d·|h|·|W|ᵀ);
    # a bf16 head cast to fp32 would miss by ~1e-2
    assert_values_within(logits, hidden @ model.lm_head.weight.t(), product_bound(hidden, model.lm_head.weight.t()))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        plain = model(input_ids=ids).logits  # plain autocast: a bf16 head
    assert plain.dtype == torch.bfloat16 and not torch.allclose(plain.float(), logits, atol=1e-4)
    assert "forward" not in model.lm_head.__dict__  # restored


def test_compute_bf16_changes_the_layers_and_fp32_changes_nothing():
    model = tiny_llama()
    ids = torch.randint(3, 512, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        reference = model(input_ids=ids).logits
        with P.compute(model, torch.float32):
            same = model(input_ids=ids).logits
        with P.compute(model, torch.bfloat16):
            low = model(input_ids=ids).logits
    assert torch.equal(same, reference)
    difference = (low - reference).abs().max().item()
    assert 1e-4 < difference < 0.2  # bf16 matrix products ran (rounding shows), and stayed close


def test_nested_compute_blocks_restore_the_head_once():
    model = tiny_llama()
    with P.compute(model, torch.bfloat16):
        with P.compute(model, torch.bfloat16):
            assert "forward" in model.lm_head.__dict__
        assert "forward" in model.lm_head.__dict__  # the outer block still holds it
    assert "forward" not in model.lm_head.__dict__


def test_precision_name_of_dtypes():
    assert P.precision_name(torch.float32) == "fp32" and P.precision_name(torch.bfloat16) == "bf16"


# --- the same patches on the other built-in families ----------------------------------------

@pytest.mark.numerics
@pytest.mark.parametrize("name", ["tiny-qwen2", "tiny-qwen3", "tiny-gemma3"])
def test_bf16_patches_reach_every_family(name, monkeypatch):
    """precision.py patches nothing Llama-specific: attention goes through transformers'
    attention registry (every family's ``ALL_ATTENTION_FUNCTIONS``), the head is the model's
    output embedding, LoRA sums are found by module attributes. Checked per family: every
    layer's attention gets fp32 q/k/v (the sliding window still passed through), the logits
    are the fp32 head of the fp32 final hidden states (then Gemma 3's soft-cap), and a LoRA
    projection's base output is fp32."""
    import transformers.integrations.sdpa_attention as sdpa
    from peft import LoraConfig, get_peft_model

    from labelrl.models import load_model

    model = load_model(name)[0]
    calls = []
    real = sdpa.sdpa_attention_forward

    def recording(module, query, key, value, attention_mask, **kwargs):
        calls.append((query.dtype, key.dtype, value.dtype, kwargs.get("sliding_window")))
        return real(module, query, key, value, attention_mask, **kwargs)

    monkeypatch.setattr(sdpa, "sdpa_attention_forward", recording)  # precision.fp32_attention calls it by name
    ids = torch.randint(3, 40000, (2, 9), generator=torch.Generator().manual_seed(0))
    seen, handle = _final_hidden(model)
    with torch.no_grad(), P.compute(model, torch.bfloat16):
        logits = model(input_ids=ids).logits
    handle.remove()
    assert [c[:3] for c in calls] == [(torch.float32,) * 3] * model.config.num_hidden_layers
    windows = [getattr(layer.self_attn, "sliding_window", None) for layer in model.model.layers]
    assert [c[3] for c in calls] == windows and (name != "tiny-gemma3" or windows == [4, None])
    hidden = seen["h"]
    assert hidden.dtype == torch.float32 and logits.dtype == torch.float32
    expected = hidden @ model.lm_head.weight.t()
    bound = product_bound(hidden, model.lm_head.weight.t())  # two fp32 kernels: 2·γ_d·|h|·|W|ᵀ
    if model.config.get_text_config().to_dict().get("final_logit_softcapping"):
        cap = model.config.final_logit_softcapping
        # |tanh'| ≤ 1 passes the product's error on no larger; z/cap, tanh and ·cap round on
        # values up to |z| and cap: 2·γ_3·(|z| + cap) more for two routes
        bound = bound + 2 * gamma(3, torch.float32) * (expected.abs() + cap)
        expected = torch.tanh(expected / cap) * cap
    assert_values_within(logits, expected, bound)

    lora = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    outputs = []
    lora.base_model.model.model.layers[0].self_attn.v_proj.register_forward_hook(
        lambda m, i, out: outputs.append(out.dtype))  # base(x) + B(A(x))·s, as peft returns it
    with torch.no_grad():
        with P.compute(lora, torch.bfloat16):
            lora(input_ids=ids)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            lora(input_ids=ids)
    assert outputs == [torch.float32, torch.bfloat16]  # the sum in fp32 under compute; plain autocast rounds it


def lora_llama():
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=300, max_position_embeddings=128)
    model = get_peft_model(LlamaForCausalLM(config), LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                                                target_modules="all-linear", task_type="CAUSAL_LM"))
    for name, param in model.named_parameters():  # non-zero adapters, so their products count
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.02)
    return model.train()


def test_frozen_weights_cast_once_gives_autocasts_logits_and_gradients_exactly():
    # The kept copy is the rounding autocast makes anew at every call (fp32 → bf16, nearest even),
    # so the forward and the backward are the same operations on the same bf16 numbers: equal bits.
    ids = torch.randint(1, 300, (2, 12))
    runs = []
    for keep in (False, True):
        model = lora_llama()
        patch = P.frozen_weights_cast_once if keep else (lambda m, d: __import__("contextlib").nullcontext())
        with P.autocast(torch.bfloat16), P.fp32_adapter_sum(model, torch.bfloat16), patch(model, torch.bfloat16):
            logits = model(input_ids=ids).logits.float()
        logits.square().mean().backward()
        grads = [p.grad.clone() for p in model.parameters() if p.requires_grad]
        runs.append((logits.detach(), grads))
    assert torch.equal(runs[0][0], runs[1][0])
    assert all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1]))


def test_the_copy_is_kept_between_passes_and_made_again_when_the_weight_changes():
    model = lora_llama()
    ids = torch.randint(1, 300, (1, 8))
    base = model.base_model.model.model.layers[0].mlp.up_proj.base_layer
    assert P.cast_weights_to_keep(model, torch.bfloat16) > 0
    with torch.no_grad(), P.compute(model, torch.bfloat16):
        model(input_ids=ids)
    first = P.kept_casts(model)
    assert first and P.cast_weights_to_keep(model, torch.bfloat16) == 0
    assert "forward" not in base.__dict__  # the patch is scoped to the block
    with torch.no_grad(), P.compute(model, torch.bfloat16):
        model(input_ids=ids)
    assert all(a is b for a, b in zip(first, P.kept_casts(model)))  # reused, not cast again
    with torch.no_grad():
        base.weight.mul_(2.0)  # e.g. a checkpoint loaded into the weight
    assert P.cast_weights_to_keep(model, torch.bfloat16) == base.weight.numel() * 2
    with torch.no_grad(), P.compute(model, torch.bfloat16):
        model(input_ids=ids)
    kept = base.__dict__[P._CAST_KEY][1]
    assert torch.equal(kept, base.weight.detach().to(torch.bfloat16))


def test_a_fused_group_keeps_one_joined_copy_whose_rows_are_the_members_copies():
    model = lora_llama()
    attn = model.base_model.model.model.layers[0].self_attn
    members = [attn.q_proj.base_layer, attn.k_proj.base_layer, attn.v_proj.base_layer]
    alone = P.low_precision_weight(members[1], torch.bfloat16)  # one member already kept apart
    joined = P.low_precision_group(members, torch.bfloat16)
    assert torch.equal(joined, torch.cat([m.weight.detach() for m in members]).to(torch.bfloat16))
    assert torch.equal(joined[64:96], alone)  # the rounding kept before, now a row slice
    views = [P.low_precision_weight(m, torch.bfloat16) for m in members]
    assert all(v.untyped_storage().data_ptr() == joined.untyped_storage().data_ptr() for v in views)  # no second copy
    assert P.low_precision_group(members, torch.bfloat16) is joined  # kept between passes
    with torch.no_grad():
        members[2].weight.mul_(2.0)  # a member's weight changes
    again = P.low_precision_group(members, torch.bfloat16)
    assert again is not joined and torch.equal(again[96:], members[2].weight.detach().to(torch.bfloat16))
    P.low_precision_weight(members[0], torch.bfloat16)  # still its view: the group stays
    assert P.low_precision_group(members, torch.bfloat16) is again
    with torch.no_grad():
        members[0].weight.add_(1.0)
    P.low_precision_weight(members[0], torch.bfloat16)  # the module pass re-cast one member on its own
    rebuilt = P.low_precision_group(members, torch.bfloat16)
    assert rebuilt is not again and torch.equal(rebuilt[:64], members[0].weight.detach().to(torch.bfloat16))


def test_fp32_and_trainable_weights_keep_no_copy():
    model = lora_llama()
    with torch.no_grad(), P.compute(model, torch.float32):
        model(input_ids=torch.randint(1, 300, (1, 8)))
    assert P.kept_casts(model) == []
    for param in model.parameters():  # full fine-tuning: every weight trains
        param.requires_grad = True
    assert P.cast_weights_to_keep(model, torch.bfloat16) == 0


@pytest.mark.numerics
def test_the_adapter_update_is_an_fp32_sum_with_fp32_gradients():
    # Under compute(bf16) the base product stays bf16 and the update s·B(A(x)) is two fp32
    # products joined in an fp32 add. Against float64: the update's error is at most γ_K·M with
    # K = in + r + 2 roundings (the products, B's bias, the sum) and M the same sum over absolute
    # values; the gradients of A and B are two more fp32 products each (over out and the rows,
    # or over the rows and r), so γ_K with K = in + r + out + rows + 2 bounds them, per tensor
    # in the Frobenius norm.
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    n_in, n_out, rank, rows = 64, 48, 4, 16
    net = get_peft_model(torch.nn.Sequential(torch.nn.Linear(n_in, n_out)),
                         LoraConfig(r=rank, lora_alpha=6, target_modules=["0"], lora_bias=True))
    lora = net.base_model.model[0]
    a, b, bias = lora.lora_A["default"].weight, lora.lora_B["default"].weight, lora.lora_B["default"].bias
    torch.nn.init.normal_(b, std=0.5)
    torch.nn.init.normal_(bias, std=0.5)  # peft's lora_bias: B carries a bias, scaled with the update
    s = lora.scaling["default"]
    x, g = torch.randn(rows, n_in), torch.randn(rows, n_out)
    with P.compute(net, torch.bfloat16):
        out = lora(x)
        base = lora.base_layer(x).detach()  # the bf16 product, cast up by the hook
    (out * g).sum().backward()  # outside autocast, as the trainers call it
    assert out.dtype == torch.float32 and s == 1.5

    def exact(x, a, b, bias, g, base):  # float64 values and gradients; with |·| inputs, the magnitudes
        a, b = a.double().requires_grad_(), b.double().requires_grad_()
        value = base.double() + s * ((x.double() @ a.t()) @ b.t() + bias.double())
        (value * g.double()).sum().backward()
        return value.detach(), a.grad, b.grad

    value, grad_a, grad_b = exact(x, a.detach(), b.detach(), bias.detach(), g, base)
    size, size_a, size_b = exact(x.abs(), a.detach().abs(), b.detach().abs(), bias.detach().abs(), g.abs(), base.abs())
    assert_values_within(out.detach(), value.float(), gamma(n_in + rank + 2, torch.float32) * size.float())
    k = n_in + rank + n_out + rows + 2
    for got, want, magnitude in ((a.grad, grad_a, size_a), (b.grad, grad_b, size_b)):
        assert (got.double() - want).norm() <= gamma(k, torch.float32) * magnitude.norm()
    # peft's own forward runs the update's products in bf16: far outside the fp32 bound
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        bf16_update = type(lora).forward(lora, x).float() - lora.base_layer(x).float()
    assert ((bf16_update + base - value.float()).abs() > gamma(n_in + rank + 2, torch.float32) * size.float()).any()


def test_the_lean_sum_leaves_disabled_adapters_and_active_dropout_to_peft(monkeypatch):
    from peft import LoraConfig, get_peft_model
    from peft.tuners.lora.layer import Linear

    model = get_peft_model(tiny_llama(), LoraConfig(r=4, lora_alpha=8, lora_dropout=0.5, target_modules="all-linear"))
    for name, param in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.02)
    ids = torch.randint(1, 300, (1, 8), generator=torch.Generator().manual_seed(2))
    peft_forward, calls = Linear.forward, []
    monkeypatch.setattr(Linear, "forward", lambda self, *a, **k: calls.append(1) or peft_forward(self, *a, **k))

    def peft_calls(train: bool, disabled: bool) -> int:
        calls.clear()
        with torch.no_grad(), P.compute(model, torch.bfloat16):
            model.train(train)
            with model.disable_adapter() if disabled else contextlib.nullcontext():
                model(input_ids=ids)
        return len(calls)

    adapted = sum(isinstance(m, Linear) for m in model.modules())
    assert peft_calls(train=False, disabled=False) == 0  # eval: dropout is off, the lean sum runs
    assert peft_calls(train=True, disabled=False) == adapted  # an active dropout: peft's own forward
    assert peft_calls(train=False, disabled=True) == adapted  # a disabled adapter: peft's own forward
    calls.clear()
    with torch.no_grad():
        model(input_ids=ids)  # outside the block
    assert len(calls) == adapted and not any("forward" in m.__dict__ for m in model.modules() if isinstance(m, Linear))
