"""Scale-out: ``labelrl rl`` and ``labelrl sft`` under ``accelerate launch`` with 2 CPU processes
(gloo) make the update one process makes on the same global batch.

The launched runs go through the real CLI. ``accelerate launch --cpu --num_processes 2``
starts a single process (accelerate 1.15 hands ``--cpu`` to its simple launcher), so the
tests use ``--multi_gpu``: it goes through torchrun, and on a machine without CUDA (forced
here with CUDA_VISIBLE_DEVICES="") accelerate runs DDP on CPU with gloo. A wrapper script
records each process's RANK/WORLD_SIZE, so a test fails if two processes did not run.

Tolerance: weights after the runs agree to 1e-5 (measured: ≤ 3e-6). The loss terms are the
same, summed in another order across processes, so they differ in the last bits; Adam's
first steps (≈ lr·sign(g)) pass such differences on, scaled by at most lr.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from labelrl import metrics_keys as K
from labelrl.fileio import read_jsonl
from labelrl.rollout import generate_groups, sample_groups
from labelrl.rollout.log import read_rollouts
from labelrl.train import rl_parts as parts
from labelrl.train.distributed import process_share

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from run_files import saved_weights as _weights  # noqa: E402

# fp32 throughout (precision="fp32" in every config): each process computes half the batch, and
# bf16 matrix products of different shapes round differently, so only fp32 can agree to 1e-5.
WEIGHT_TOLERANCE = 1e-5
# Keys that depend on wall time or on the process's memory, not on the computation.
TIMING_KEYS = {K.STEP_SECONDS, K.TOKENS_PER_S, K.TRAIN_TOKENS_PER_S, K.PEAK_MEMORY_MB, K.SAMPLE_SECONDS, K.UPDATE_SECONDS,
               K.VAL_SECONDS,
               # the padding of the packed rows each process builds from its half of the batch: a
               # layout figure, not part of what is computed (packed and padded losses are equal)
               K.PADDING_SHARE}
# Sums over processes are reassociated: equal to float rounding, not bit for bit.
ROUNDED_KEYS = {K.LOSS, K.GRAD_NORM, K.KL}
# The training pass runs another layout on several processes (no shared prefix, padded widths): its
# entropy rounds otherwise, and in fp32 its gap to the sampler is that rounding (< 1e-4 nats).
MEASURED_KEYS = {K.ENTROPY_MEAN, K.ENTROPY_P10, K.MISMATCH_KL, K.MISMATCH_LOGP_DIFF_MEAN, K.MISMATCH_LOGP_DIFF_MAX}

WRAPPER = """\
import os, sys
from pathlib import Path
marks = Path(sys.argv.pop(1))
marks.mkdir(parents=True, exist_ok=True)
(marks / f"rank{os.environ.get('RANK', '-')}_of_{os.environ.get('WORLD_SIZE', '-')}").touch()
from labelrl.cli.main import app
app(prog_name="labelrl")
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch_two(tmp_path: Path, command: str, config: dict, out: Path, *extra: str, wrapper_text: str = WRAPPER) -> Path:
    """``accelerate launch`` 2 processes of ``labelrl COMMAND --config … --out OUT``; both must
    start. Returns the directory where each process left its marks."""
    config_file = tmp_path / f"{out.name}_{command}.yaml"
    config_file.write_text(yaml.safe_dump(config))
    wrapper = tmp_path / f"labelrl_wrapper_{out.name}.py"
    wrapper.write_text(wrapper_text)
    marks = tmp_path / f"marks_{out.name}_{len(list(tmp_path.glob('marks_*')))}"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "--main_process_port", str(_free_port()), str(wrapper), str(marks),
           command, "--config", str(config_file), "--out", str(out), *extra]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    assert sorted(p.name for p in marks.iterdir() if p.name.startswith("rank")) == ["rank0_of_2", "rank1_of_2"]
    return marks


def assert_same_weights(one: Path, two: Path) -> None:
    a, b = _weights(one), _weights(two)
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=0, atol=WEIGHT_TOLERANCE, msg=name)


def assert_same_records(one: list[dict], two: list[dict]) -> None:
    assert [r[K.STEP] for r in two] == [r[K.STEP] for r in one]  # one line per step, no duplicates
    for a, b in zip(one, two):
        assert a.keys() == b.keys()
        for key in a.keys() - TIMING_KEYS:
            if key in ROUNDED_KEYS:
                assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key
            elif key in MEASURED_KEYS:
                assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-4), key
            else:
                assert b[key] == a[key], key


# --- the pieces, without launching -------------------------------------------------------


def _accelerator(rank: int, n: int):
    return SimpleNamespace(num_processes=n, process_index=rank)


def test_each_process_takes_a_contiguous_equal_share_and_uneven_steps_are_refused():
    items = list(range(8))
    shares = [items[process_share(8, _accelerator(r, 4), "prompts_per_step")] for r in range(4)]
    assert shares == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert items[process_share(8, _accelerator(0, 1), "batch_size")] == items
    with pytest.raises(ValueError, match=r"prompts_per_step=6 does not split evenly over 4 processes: .*"
                                         r"set --prompts-per-step to a multiple of 4"):
        process_share(6, _accelerator(0, 4), "prompts_per_step")


def test_batch_scale_under_several_processes_is_refused_before_any_work(tmp_path):
    # each process computes its own prompts' advantages, so a batch std would change with the
    # process count; the run stops before it writes or loads anything
    from labelrl.train.config import RLConfig
    from labelrl.train.rl import start_run

    cfg = RLConfig(data="sms-spam", out=tmp_path / "run", scale="batch", prompts_per_step=2)
    with pytest.raises(ValueError, match="scale='batch' under 2 processes: .*use --scale group or none"):
        start_run(cfg, _accelerator(0, 2))
    assert not (tmp_path / "run").exists()


def test_kept_groups_are_split_evenly_for_training_whoever_sampled_them():
    keep = [0, 3, 4, 7, 9]
    shares = [parts.training_share(keep, _accelerator(r, 2)) for r in range(2)]
    assert shares == [[0, 3], [4, 7, 9]]  # ⌊5·r/2⌋ … ⌊5·(r+1)/2⌋
    assert parts.training_share([5], _accelerator(0, 2)) == [] and parts.training_share([5], _accelerator(1, 2)) == [5]


@pytest.fixture(scope="module")
def tiny():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=64, max_position_embeddings=128, initializer_range=0.3)
    return LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("sampler", [sample_groups, generate_groups], ids=["labelrl", "hf"])
def test_with_prompt_seeds_a_prompts_samples_do_not_depend_on_its_batch(tiny, sampler):
    prompts, seeds = [[1, 5, 6, 7], [1, 9], [1, 12, 13]], [101, 202, 303]
    options = dict(group_size=3, max_new_tokens=6, eos_token_ids=[2], pad_token_id=0, temperature=1.0)
    together = sampler(tiny, prompts, prompt_seeds=seeds, **options)
    first = sampler(tiny, prompts[:1], prompt_seeds=seeds[:1], **options)
    rest = sampler(tiny, prompts[1:], prompt_seeds=seeds[1:], **options)
    assert together.completion_ids == first.completion_ids + rest.completion_ids
    assert together.prompt_index == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    other = sampler(tiny, prompts, prompt_seeds=[101, 202, 304], **options)
    assert other.completion_ids[:6] == together.completion_ids[:6] and other.completion_ids[6:] != together.completion_ids[6:]
    with pytest.raises(ValueError, match="prompt_seeds was given with seed or generator"):
        sampler(tiny, prompts, prompt_seeds=seeds, seed=1, **options)
    with pytest.raises(ValueError, match="2 prompt_seeds for 3 prompts"):
        sampler(tiny, prompts, prompt_seeds=seeds[:2], **options)


def test_sampling_seed_is_a_function_of_the_prompt_position_not_of_the_process():
    seeds = {parts.prompt_seed(0, step, r, p) for step in range(20) for r in range(3) for p in range(16)}
    assert len(seeds) == 20 * 3 * 16
    # Pinned by hand: nothing of the process (rank, hash seed, RNG state) enters it.
    # step_seed(7, 3, 1) = 7·1 000 003 + 3·1 009 + 1 = 7 003 049;
    # 7 003 049·1 000 033 + 5 = 7 003 280 100 622 = 3261·(2³¹ − 1) + 335 927 755
    assert parts.prompt_seed(7, 3, 1, 5) == 335_927_755
    assert parts.prompt_seed(0, 0, 0, 3) == 3  # step_seed(0, 0, 0) = 0, then + position


def test_random_control_rewards_are_drawn_per_round_and_read_per_process():
    scale = SimpleNamespace(correct=1.0, incorrect=0.0)
    run = SimpleNamespace(cfg=SimpleNamespace(seed=3, group_size=2, prompts_per_step=4), step=5,
                          algo=SimpleNamespace(reward=SimpleNamespace(scale=lambda: scale)))
    whole = parts._random_rewards(run, [0, 1, 2, 3], round_index=0)
    assert len(whole) == 8 and set(whole) == {0.0, 1.0}
    assert parts._random_rewards(run, [0, 1], 0) + parts._random_rewards(run, [2, 3], 0) == whole


# --- launched: 2 processes against 1 -----------------------------------------------------


TEARDOWN = """
import os, sys
import torch, torch.distributed as dist
from labelrl.train.distributed import end_training
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
dist.init_process_group("gloo", rank=0, world_size=1)
ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
ddp(torch.ones(3, 4)).sum().backward()
dist.barrier()
assert ddp.reducer is not None and ddp.logger is not None
seen = {}

class Accelerator:  # accelerate's end_training destroys the group; this one records what DDP held then
    _models = [ddp.module]  # as accelerate keeps them: unwrapped
    def end_training(self):
        seen["reducer"] = hasattr(ddp, "reducer") or hasattr(ddp, "logger")  # the logger owns it too
        dist.destroy_process_group()

end_training(Accelerator(), ddp)
print("reducer held when the group was destroyed:", seen["reducer"])
"""


def test_the_reducer_is_released_before_the_process_group_is_destroyed(tmp_path):
    # Destroyed after the group, DDP's reducer is its last owner and frees it holding the GIL,
    # which can deadlock with gloo's worker thread: a two-process run hung after its summary.
    done = subprocess.run([sys.executable, "-c", TEARDOWN, str(_free_port())], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "reducer held when the group was destroyed: False" in done.stdout, done.stdout


def _rl_config(data: Path, **overrides) -> dict:
    base = dict(model="tiny-random", data=str(data), lora=False, group_size=2, prompts_per_step=2, max_new_tokens=9,
                steps=4, learning_rate=1e-3, random_reward=True, checkpoint_every=1, quiet=True, precision="fp32")
    base.update(overrides)
    return base


@pytest.mark.slow
@pytest.mark.parametrize("options", [
    # G=2 with random rewards: about half the groups are uniform and skipped, so some steps
    # keep one group of two and leave one process nothing to train (it joins the gradient
    # reduction with a zero loss)
    dict(preset="grpo"),
    # dynamic sampling gathers several rounds; LoRA; token_mean with the clipped surrogate
    dict(preset="dapo", lora=True, steps=2, learning_rate=2e-3),
], ids=["grpo-full", "dapo-lora"])
def test_rl_on_two_processes_equals_one_process(options, toy_data, tmp_path, weights_changed, adapter_trained):
    from labelrl.train.config import RLConfig
    from labelrl.train.rl import run_rl

    config = _rl_config(toy_data, **options)
    run_rl(RLConfig(out=tmp_path / "one", **config))
    two = tmp_path / "two"
    # the two-process run is stopped after step 1 and resumed, so resuming is covered too
    launch_two(tmp_path, "rl", config, two, "--stop-after", "1")
    assert [r[K.STEP] for r in read_jsonl(two / "metrics.jsonl")] == [1]
    launch_two(tmp_path, "rl", config, two, "--resume")

    # the runs trained (else equal weights would prove nothing), and agree
    adapter_trained(two) if config["lora"] else weights_changed("tiny-random", two)
    assert_same_weights(tmp_path / "one", two)
    assert_same_records(read_jsonl(tmp_path / "one" / "metrics.jsonl"), read_jsonl(two / "metrics.jsonl"))
    single, double = read_rollouts(tmp_path / "one"), read_rollouts(two)
    # the same samples, grades and advantages, in the same order; the sampler's log-probs of them
    # come from batches of other sizes (each process decodes its share), equal to rounding
    logged = "sampler_logprobs"
    assert double.drop_columns([logged]).equals(single.drop_columns([logged]))
    for a, b in zip(single.column(logged).to_pylist(), double.column(logged).to_pylist()):
        assert len(a) == len(b) and b == pytest.approx(a, abs=1e-4)
    rows = double.to_pylist()
    keys = [(r["step"], r["prompt_id"], r["sample_index"]) for r in rows]
    assert len(keys) == len(set(keys))  # every rollout of every group once
    if options["preset"] == "grpo":
        assert len(rows) == config["steps"] * config["prompts_per_step"] * config["group_size"]
        assert any(r[K.SKIPPED] == 1 for r in read_jsonl(two / "metrics.jsonl"))
    # the val path (step 0, every checkpoint, the end) is scored once per step, as on one process
    from labelrl.evaluate.val_path import read_val_path
    untimed = [[{k: v for k, v in r.items() if k != "seconds"} for r in read_val_path(d)] for d in (tmp_path / "one", two)]
    assert_same_records(*untimed)
    assert [r[K.STEP] for r in read_val_path(two)] == list(range(config["steps"] + 1))
    assert sorted(p.name for p in two.iterdir() if not p.name.startswith(".")) == [
        "checkpoints", "long_items_rl.json", "metrics.jsonl", "model", "rl_config.yaml", "rl_summary.json", "rollouts",
        "splits.json", "val_path.jsonl"]


@pytest.mark.slow
def test_sft_on_two_processes_equals_one_process(toy_data, tmp_path, weights_changed):
    from labelrl.train.config import SFTConfig
    from labelrl.train.sft import run_sft

    config = dict(model="tiny-random", data=str(toy_data), lora=False, batch_size=4, max_steps=2, eval_every=2,
                  eval_limit=8, learning_rate=3e-3, quiet=True, precision="fp32")
    run_sft(SFTConfig(out=tmp_path / "one", **config))
    launch_two(tmp_path, "sft", config, tmp_path / "two")
    weights_changed("tiny-random", tmp_path / "two")  # it trained: equal weights are not the start's
    assert_same_weights(tmp_path / "one", tmp_path / "two")
    one = read_jsonl(tmp_path / "one" / "sft_metrics.jsonl")
    two = read_jsonl(tmp_path / "two" / "sft_metrics.jsonl")
    assert_same_records(one, two)
    assert K.EVAL_BALANCED_ACCURACY in two[-1]  # evaluated once, by the main process


# --- the teardown at its real call sites ---------------------------------------------------

# The launched processes' end_training, spied on: what each process hands it (its type: under
# two processes the DDP wrapper, which one process cannot tell from the bare model) and whether
# the wrapper still holds its reducer when the call returns.
SPY_WRAPPER = WRAPPER.replace("from labelrl.cli.main import app", """import json
import labelrl.train.rl as rl_module
import labelrl.train.sft as sft_module
real = rl_module.end_training
def spy(accelerator, model=None):
    seen = {"type": type(model).__name__, "held_before": hasattr(model, "reducer")}
    real(accelerator, model)
    seen["held_after"] = hasattr(model, "reducer") or hasattr(model, "logger")
    (marks / f"end_training_{os.environ.get('RANK')}.json").write_text(json.dumps(seen))
rl_module.end_training = sft_module.end_training = spy
from labelrl.cli.main import app""")


@pytest.mark.slow
@pytest.mark.parametrize("command", ["rl", "sft"])
def test_two_processes_end_through_end_training_with_the_ddp_wrapper(command, toy_data, tmp_path):
    # The hang the release guards against happened only with two processes: there each trainer
    # must hand end_training the DDP wrapper, holding its reducer, and get it back without one.
    config = _rl_config(toy_data, steps=1) if command == "rl" else dict(
        model="tiny-random", data=str(toy_data), lora=False, batch_size=4, max_steps=1, eval_every=1, eval_limit=8,
        learning_rate=3e-3, quiet=True, precision="fp32")
    marks = launch_two(tmp_path, command, config, tmp_path / command, wrapper_text=SPY_WRAPPER)
    import json

    seen = {p.name: json.loads(p.read_text()) for p in sorted(marks.glob("end_training_*.json"))}
    expected = {"type": "DistributedDataParallel", "held_before": True, "held_after": False}
    assert seen == {"end_training_0.json": expected, "end_training_1.json": expected}


def test_sft_and_rl_end_through_end_training_with_the_model_they_trained(monkeypatch, toy_data, tmp_path):
    # The reducer release above only helps if both trainers end through end_training and hand it
    # the prepared model (under several processes, the DDP wrapper holding the reducer), after
    # their files are written. A trainer calling accelerator.end_training() itself, or passing
    # no model, would bring back the hang; so would a failed run that skipped the teardown.
    import labelrl.train.rl as rl_module
    import labelrl.train.sft as sft_module
    from labelrl.train.config import RLConfig, SFTConfig

    calls = []

    def spy(accelerator, model=None):
        calls.append({"prepared": model is not None and any(model is m for m in accelerator._models),
                      "summaries": sorted(p.parent.name for p in tmp_path.glob("*/*_summary.json"))})
        return real(accelerator, model)

    real = rl_module.end_training
    monkeypatch.setattr(rl_module, "end_training", spy)
    monkeypatch.setattr(sft_module, "end_training", spy)
    sft_module.run_sft(SFTConfig(model="tiny-random", data=str(toy_data), out=tmp_path / "sft", max_steps=1,
                                 batch_size=2, eval_every=1, quiet=True, lora=False))
    rl_module.run_rl(RLConfig(**_rl_config(toy_data, steps=1), out=tmp_path / "rl"))
    assert [c["prepared"] for c in calls] == [True, True]
    assert [c["summaries"] for c in calls] == [["sft"], ["rl", "sft"]]  # each after its summary was written
    # a run that fails after its model is prepared still ends through it, with the model
    monkeypatch.setattr(sft_module, "_sft_loop", lambda run: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(RuntimeError, match="boom"):
        sft_module.run_sft(SFTConfig(model="tiny-random", data=str(toy_data), out=tmp_path / "failed", max_steps=1,
                                     batch_size=2, quiet=True, lora=False))
    assert len(calls) == 3 and calls[2]["prepared"]
