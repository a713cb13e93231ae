"""The memory preflight: the probe's line predicts what a longer batch saves, checkpointing is
planned from the budget (or forced), cuts what is saved, and leaves the training unchanged."""

from __future__ import annotations

import gc
import json
import weakref

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from labelrl.train import memory as M


def tiny_llama():
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=1000, max_position_embeddings=1024)
    return LlamaForCausalLM(config)


def saved_bytes_of_training_forward(model, length: int) -> int:
    """What a real training forward of 1 × ``length`` tokens saves for backward."""
    model.train()
    return M._saved_bytes(model, length, torch.float32, torch.device("cpu"))


def test_probe_line_predicts_the_saved_activations_of_a_longer_batch():
    model = tiny_llama()
    cost = M.probe_activations(model, torch.float32)
    assert cost.per_token_bytes > 0
    measured = saved_bytes_of_training_forward(model, 400)  # 6× the longer probe
    predicted = M.activation_bytes(cost, 400, model, checkpointing=False)
    assert predicted == pytest.approx(measured, rel=0.05)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_probe_keeps_no_weight_alive(dtype):
    # A ladder probes every arm's model in one process: a graph left behind by the probe kept a
    # whole model's weights per arm (about 1 GB per SmolLM2 arm).
    model = tiny_llama()
    M.probe_activations(model, dtype)
    weight = weakref.ref(model.model.layers[0].mlp.up_proj.weight)
    del model
    gc.collect()
    assert weight() is None


def test_checkpointing_cuts_the_saved_activations():
    model = tiny_llama()
    plain = saved_bytes_of_training_forward(model, 300)
    M.set_checkpointing(model, True)
    checkpointed = saved_bytes_of_training_forward(model, 300)
    M.set_checkpointing(model, False)
    assert checkpointed < plain / 3
    assert saved_bytes_of_training_forward(model, 300) == plain  # and off again


def test_a_probe_is_measured_once_per_model_structure_and_inputs(monkeypatch):
    # A ladder's worker trains run after run on the same model and shapes: the probe's forward
    # passes run once, and a model that differs in structure, mode or inputs is measured anew.
    monkeypatch.setattr(M, "_MEASURED", {})
    calls = []

    def probe(model, key=("plain", 48)):
        ids = torch.arange(3, 3 + key[1])[None]

        def forward():
            calls.append(key)
            model(input_ids=ids, logits_to_keep=1)

        model.train()
        return M.saved_bytes_of(model, forward, key=key)

    first = tiny_llama()
    measured = probe(first)
    assert measured > 0 and len(calls) == 1
    assert probe(first) == measured and len(calls) == 1
    torch.manual_seed(1)
    other_weights = LlamaForCausalLM(first.config)  # the same structure, other values
    assert probe(other_weights) == measured and len(calls) == 1
    model_alone = M.saved_bytes_of(other_weights, lambda: other_weights(input_ids=torch.arange(3, 51)[None], logits_to_keep=1))
    assert model_alone == measured  # what the memo returned is what measuring this model gives
    assert probe(first, key=("plain", 96)) > measured and len(calls) == 2  # other inputs
    M.set_checkpointing(first, True)
    assert probe(first) < measured and len(calls) == 3  # checkpointing saves less: measured, not reused
    M.set_checkpointing(first, False)
    wider = LlamaForCausalLM(LlamaConfig(**{**first.config.to_dict(), "intermediate_size": 256}))
    assert probe(wider) > measured and len(calls) == 4  # another structure
    first.requires_grad_(False)
    first.lm_head.weight.requires_grad_(True)
    probe(first)
    assert len(calls) == 5  # other parameters train


@pytest.mark.parametrize("budget_gib, requested, expected", [
    (1e-4, None, False),  # 100 KiB: nothing fits, checkpointed or not → off, and the knobs named
    ("between", None, True),  # only the checkpointed prediction fits → on
    (1e4, None, False),  # 10 TiB: everything fits → off
    (1e4, True, True),  # forced on
    (1e-4, False, False),  # forced off, and reported as not fitting
])
def test_plan_follows_the_budget_unless_forced(budget_gib, requested, expected):
    model = tiny_llama()
    if budget_gib == "between":
        free = M.plan_memory(model, torch.float32, tokens=2000, logit_positions=64, requested=None, budget_gib=1e4)
        budget_gib = (free.predicted_peak_mb + free.predicted_peak_checkpointed_mb) / 2 / 1024
    plan = M.plan_memory(model, torch.float32, tokens=2000, logit_positions=64, requested=requested,
                         budget_gib=budget_gib)
    assert plan.gradient_checkpointing is expected
    assert plan.predicted_peak_checkpointed_mb < plan.predicted_peak_mb
    assert plan.fits is (budget_gib > 1e-3)
    if requested is None and budget_gib < 1e-3:
        assert "stays off" in plan.reason and plan.knobs == "--batch-size or --max-length"


def test_checkpointing_stays_off_when_it_is_predicted_to_cost_more():
    # RL's checkpointed pass forwards each prompt G times: with G·(P + T) positions against
    # P + G·T it can need more than the plain pass, and then it cannot help a tight budget.
    plan = M.plan_memory(tiny_llama(), torch.float32, tokens=2000, tokens_checkpointed=40_000, logit_positions=64,
                         requested=None, budget_gib=1e-4)
    assert plan.predicted_peak_checkpointed_mb > plan.predicted_peak_mb
    assert plan.gradient_checkpointing is False and plan.fits is False
    assert "checkpointing would need" in plan.reason and "stays off" in plan.reason
    # at a budget the checkpointed pass of an equal batch would meet, it is on
    cheaper = M.plan_memory(tiny_llama(), torch.float32, tokens=2000, tokens_checkpointed=2000, logit_positions=64,
                            requested=None, budget_gib=1e4)
    budget = (cheaper.predicted_peak_mb + cheaper.predicted_peak_checkpointed_mb) / 2 / 1024
    assert M.plan_memory(tiny_llama(), torch.float32, tokens=2000, tokens_checkpointed=2000, logit_positions=64,
                         requested=None, budget_gib=budget).gradient_checkpointing is True
    assert M.plan_memory(tiny_llama(), torch.float32, tokens=2000, tokens_checkpointed=40_000, logit_positions=64,
                         requested=None, budget_gib=budget).gradient_checkpointing is False


def test_default_budget_is_half_the_machine():
    total = M.total_memory_bytes(torch.device("cpu"))
    assert M.memory_budget_bytes(None, torch.device("cpu")) == int(total * 0.5)
    assert M.memory_budget_bytes(2.0, torch.device("cpu")) == 2 * 2**30


# bf16 with LoRA: the recomputation in the backward pass must enter the fp32 attention and fp32
# adapter sums again, or torch refuses the dtype mismatch (and if it did not, the gradients would
# differ from the forward pass's). The same ops in the same precision recompute the same values.
@pytest.mark.parametrize("precision,lora", [("fp32", False), ("bf16", True)])
def test_sft_with_checkpointing_trains_the_same_weights(tmp_path, precision, lora, monkeypatch):
    import labelrl.rollout.prefix as prefix_module
    from labelrl.train.config import SFTConfig
    from labelrl.train.sft import run_sft

    import labelrl.train.sft as sft_module

    # Without checkpointing a batch may run its shared prompt prefix once (prefix_layout), whose
    # bf16 products have other shapes, or the lean pass (sft_loss_lean), whose products are fused;
    # both runs keep the module pass in the packed layout, so only checkpointing differs.
    monkeypatch.setattr(prefix_module, "MIN_SHARED", 10**9)
    monkeypatch.setattr(sft_module, "sft_lean_reason", lambda model: "the test compares module passes")

    def run(name, **options):
        cfg = SFTConfig(model="tiny-random", data="sms-spam", limit=120, out=tmp_path / name, max_steps=3, batch_size=4,
                        eval_every=3, quiet=True, lora=lora, precision=precision, **options)
        summary = run_sft(cfg)
        losses = [json.loads(line)["train/loss"] for line in (tmp_path / name / "sft_metrics.jsonl").open()]
        return summary, losses

    tight, tight_losses = run("tight", gradient_checkpointing=True)
    plain, plain_losses = run("plain", gradient_checkpointing=False)
    assert tight["memory"]["gradient_checkpointing"] is True and tight["memory"]["reason"] == "--gradient-checkpointing"
    assert plain["memory"]["gradient_checkpointing"] is False
    # recomputing activations changes nothing but memory and time
    assert tight_losses == pytest.approx(plain_losses, abs=1e-6)


# tolerances: (loss abs, grad norm rel). Checkpointing runs the plain (unshared) training pass,
# whose bf16 products have other shapes than the shared pass's, so bf16 agrees to its rounding.
@pytest.mark.parametrize("precision,lora,tolerance", [("fp32", False, (1e-5, 1e-4)), ("bf16", True, (2e-2, 5e-2))])
def test_rl_with_checkpointing_makes_the_same_update(toy_data, rl_config, tmp_path, precision, lora, tolerance):
    from labelrl import metrics_keys as K
    from labelrl.fileio import read_jsonl
    from labelrl.train.rl import run_rl

    records = {}
    for flag in (True, False):
        out = tmp_path / str(flag)
        summary = run_rl(rl_config("tiny-random", toy_data, out, steps=2, prompts_per_step=2, group_size=2, lora=lora,
                                   precision=precision, skip_uninformative=False, gradient_checkpointing=flag))
        assert summary["memory"]["gradient_checkpointing"] is flag
        records[flag] = read_jsonl(out / "metrics.jsonl")
    # the same numbers up to float rounding
    for a, b in zip(records[True], records[False]):
        assert a[K.LOSS] == pytest.approx(b[K.LOSS], abs=tolerance[0])
        assert a[K.GRAD_NORM] == pytest.approx(b[K.GRAD_NORM], rel=tolerance[1])


def test_cpu_prediction_adds_the_heaps_growth_and_a_gpu_counts_the_tensors():
    # Counting the tensors alone, the preflight said 3.2 GB for a CPU run that peaked at 5.8 GB
    # (docs/performance.md): on a CPU the saved bytes grow by the heap's measured factor. The
    # factors' values are checked against real peaks, on workloads they were not fitted on, by
    # tests/train/test_memory_prediction_slow.py.
    model = tiny_llama()
    cost = M.probe_activations(model, torch.float32)
    plain = M.activation_bytes(cost, 400, model, checkpointing=False)
    checkpointed = M.activation_bytes(cost, 400, model, checkpointing=True)
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert M.activation_growth_bytes(cost, 400, model, False, cpu) > plain
    assert checkpointed <= M.activation_growth_bytes(cost, 400, model, True, cpu) < M.activation_growth_bytes(
        cost, 400, model, False, cpu)
    assert M.activation_growth_bytes(cost, 400, model, False, gpu) == plain
    assert M.activation_growth_bytes(cost, 400, model, True, gpu) == checkpointed


PARENT = """
import resource, subprocess, sys
held = bytearray(b"\\x01") * (1536 * 2**20)  # 1.5 GiB, every page written
del held
child = "from labelrl.train.setup import peak_memory_mb; print(peak_memory_mb())"
reported = float(subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True).stdout)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, reported)
"""


def test_a_run_started_from_a_large_process_reports_its_own_peak():
    # getrusage's ru_maxrss starts at the peak of the process a run was launched from (exec keeps
    # it): a run started from a pytest worker that had held 5.5 GB reported 5.5 GB.
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", PARENT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    parent_peak, child_peak = map(float, done.stdout.split())
    assert parent_peak >= 1536
    assert 0 < child_peak < 1024, (parent_peak, child_peak)  # the child imports torch: a few hundred MB


HOLES = """
import json, torch
from transformers import LlamaConfig, LlamaForCausalLM
from labelrl.train import memory as M
torch.manual_seed(0)
model = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, vocab_size=1000, max_position_embeddings=256))
cpu = torch.device("cpu")
held = lambda: M.plan_memory(model, torch.float32, tokens=64, logit_positions=8, requested=None, budget_gib=100).held_mb
before = held()
resident = M.current_bytes(cpu)
spare = torch.empty(30 * 2**20, dtype=torch.uint8)
del spare  # freeing a 30 MB mapping raises glibc's mmap threshold: the 8 MB blocks below come from the heap
blocks, kept = [], []
for _ in range(100):
    blocks.append(torch.ones(2 * 2**20))  # 8 MB, every page written
    kept.append(torch.ones(16 * 1024))  # 64 KB that outlives it: each freed block is a hole, not the heap's top
del blocks
freed_but_resident = (M.current_bytes(cpu) - resident) / 2**20
print(json.dumps({"before": before, "after": held(), "freed_but_resident": freed_but_resident}))
"""


@pytest.mark.skipif(M._malloc_trim() is None, reason="glibc's malloc_trim is what hands the holes back")
def test_an_earlier_runs_freed_heap_is_not_counted_as_held():
    # glibc keeps a finished run's freed heap resident, and the preflight read it as held: the
    # second run of the demo's SFT grid was predicted at 7.1 GiB against the first's 4.2.
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", HOLES], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["freed_but_resident"] > 600, got  # the 800 MB of holes stay resident once freed
    assert got["after"] - got["before"] < 100, got  # and the preflight does not count them as held
