"""``labelrl export RUN_DIR --merged OUT``: the output loads with plain transformers (labelrl
blocked from import in a subprocess) and gives the trained model's logits; full-weight runs
are copied file for file; bad input gets one clear line and exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import typer
from typer.testing import CliRunner

from labelrl.cli.export import register
from labelrl.models import load_model
from labelrl.train.checkpoint import save_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from numerics import assert_values_within, logit_bound  # noqa: E402

runner = CliRunner(env={"COLUMNS": "200", "HF_HUB_OFFLINE": "1"})
IDS = [[1, 42, 300, 7, 99, 5]]
SCRIPT = (
    "import typer; from labelrl.cli.export import register; "
    "app = typer.Typer(); app.callback()(lambda: None); register(app); app(prog_name='labelrl')"
)

# Runs in a fresh interpreter where importing labelrl or peft fails, as on a machine without them.
LOAD_WITHOUT_LABELRL = """
import json, sys
sys.modules['labelrl'] = sys.modules['peft'] = None  # `import labelrl` / `import peft` now raise ImportError
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
out = sys.argv[1]
model = AutoModelForCausalLM.from_pretrained(out).eval()
tokenizer = AutoTokenizer.from_pretrained(out)
with torch.no_grad():
    logits = model(torch.tensor(json.loads(sys.argv[2]))).logits
print(json.dumps({'logits': logits.tolist(), 'vocab': len(tokenizer), 'class': type(model).__name__}))
"""


@pytest.fixture(scope="module")
def app():
    app = typer.Typer(add_completion=False)
    app.callback()(lambda: None)  # keep "export" a subcommand, as under labelrl.cli.main
    register(app)
    return app


def _logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor(IDS)).logits


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """A run directory whose model is a LoRA adapter on tiny-random with non-zero B (a real update)."""
    from peft import LoraConfig, get_peft_model

    base, tokenizer = load_model("tiny-random")
    base_logits = _logits(base)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    torch.manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:  # peft starts B at 0, which would make merging a no-op
                param.normal_(std=0.5)
    run = tmp_path_factory.mktemp("lora") / "run"
    save_model(run, model, tokenizer)
    return run, _logits(model.eval()), base_logits


def _load_in_subprocess(out):
    done = subprocess.run(
        [sys.executable, "-c", LOAD_WITHOUT_LABELRL, str(out), json.dumps(IDS)],
        capture_output=True, text=True, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.numerics
def test_lora_run_exports_a_merged_model_that_loads_without_labelrl(app, lora_run, tmp_path):
    run, trained, base = lora_run
    assert (run / "model" / "adapter_config.json").is_file()
    out = tmp_path / "merged"
    result = runner.invoke(app, ["export", str(run), "--merged", str(out)])
    assert result.exit_code == 0, result.output
    assert "LoRA merged" in result.output
    assert not (out / "adapter_config.json").exists() and (out / "model.safetensors").is_file()
    loaded = _load_in_subprocess(out)
    assert loaded["class"] == "LlamaForCausalLM" and loaded["vocab"] == 49152
    logits = torch.tensor(loaded["logits"])
    # the trained model, merged: W + s·B·A rounds once more, inside the adapter chain's logit bound
    assert_values_within(logits, trained, logit_bound(load_model(run / "model")[0], len(IDS[0])), "logits")
    assert (logits - base).abs().max() > 1e-2  # and not the base model: the adapter really was folded in


def test_full_weight_run_is_copied_file_for_file(app, tmp_path):
    model, tokenizer = load_model("tiny-random")
    run = tmp_path / "run"
    save_model(run, model, tokenizer)
    out = tmp_path / "export"
    # Through the command line in a fresh interpreter, as a user runs it.
    done = subprocess.run([sys.executable, "-c", SCRIPT, "export", str(run), "--merged", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "full weights copied" in done.stdout
    source = sorted(p.name for p in (run / "model").iterdir())
    assert sorted(p.name for p in out.iterdir()) == source
    for name in source:
        assert (out / name).read_bytes() == (run / "model" / name).read_bytes()


def test_existing_output_is_kept_unless_forced(app, lora_run, tmp_path):
    run, trained, _ = lora_run
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    result = runner.invoke(app, ["export", str(run), "--merged", str(out)])
    assert result.exit_code == 2
    assert "already exists" in result.output and "--force" in result.output
    assert (out / "keep.txt").read_text() == "mine"
    assert runner.invoke(app, ["export", str(run), "--merged", str(out), "--force"]).exit_code == 0
    assert not (out / "keep.txt").exists() and (out / "config.json").is_file()


@pytest.mark.parametrize("make, message", [
    (lambda root: root / "missing", "is not a directory"),
    (lambda root: root, "holds no saved model"),
])
def test_a_run_without_a_model_is_refused_with_the_fix(app, tmp_path, make, message):
    result = runner.invoke(app, ["export", str(make(tmp_path)), "--merged", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()
