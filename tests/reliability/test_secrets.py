"""Secrets and untrusted files.

A recognisable API key is put in the environment variable the judge reads; ``labelrl
relabel`` and ``labelrl distill`` run against a local endpoint (which must receive the key),
then a tiny ``labelrl rl`` run (with a TensorBoard tracker) and ``labelrl eval`` of it. Every
file written under the output directory (text and binary; Parquet also decoded) and the
console output must be free of the key. Saved weights are safetensors only.

The source is checked too: no shell (``shell=True``, ``os.system``, ``os.popen``,
``subprocess.getoutput``), ``trust_remote_code`` off by default everywhere, and no config
field that would take a key on the command line.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import re
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pydantic import BaseModel
from safetensors import safe_open
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fake_openai_server import FakeOpenAIServer  # noqa: E402

import labelrl  # noqa: E402
from labelrl.audit.judges import DEFAULT_API_KEY_ENV  # noqa: E402

KEY = "sk-labelrl-CANARY-7d1f3a9e5b2c4e80"
SRC = Path(labelrl.__file__).resolve().parent
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")


def honest_or_quoting(body: dict) -> str:
    """A judge/teacher reply; the judge quotes the key back once (a careless server)."""
    text = body["messages"][-1]["content"]
    label = "spam" if text.startswith("win") else "ham"
    if body["model"] == "t":  # the distill teacher
        return f"<think>about it</think><answer>{label}</answer>"
    if text.endswith(" 3"):
        return f"key {KEY}"
    return f"<answer>{label}</answer><confidence>0.9</confidence>"


def invoke(runner: CliRunner, args: list[str]) -> str:
    from labelrl.cli.main import app

    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(scope="module")
def produced(tmp_path_factory):
    """(output root, console text, endpoint requests) after relabel, distill, rl and eval."""
    root = tmp_path_factory.mktemp("secrets")
    data = root / "items.jsonl"
    rows = [{"id": f"i{k}", "text": f"{'win prize' if k % 2 else 'lunch plan'} {k}", "label": "spam" if k % 2 else "ham"}
            for k in range(24)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    rubric = root / "rubric.md"
    rubric.write_text("Prizes are spam.\n", encoding="utf-8")
    out = root / "out"
    runner = CliRunner(env={DEFAULT_API_KEY_ENV: KEY, "HF_HUB_OFFLINE": "1", "COLUMNS": "200"})
    console = []
    with FakeOpenAIServer(honest_or_quoting) as server:
        console.append(invoke(runner, ["relabel", str(data), "--rubric", str(rubric), "--judge", server.url,
                                       "--judge-model", "j", "--out", str(out / "relabelled.parquet"),
                                       "--self-agreement-sample", "4", "--json", str(out / "relabel.json")]))
        console.append(invoke(runner, ["distill", str(data), "--teacher", server.url, "--teacher-model", "t",
                                       "--out", str(out / "traces.jsonl"), "--attempts", "2", "--limit", "6",
                                       "--json", str(out / "distill.json")]))
        requests = list(server.requests)
    run = out / "rl_run"
    console.append(invoke(runner, ["rl", "--model", "tiny-random", "--data", str(data), "--out", str(run),
                                   "--steps", "2", "--group-size", "2", "--prompts-per-step", "2",
                                   "--max-new-tokens", "9", "--checkpoint-every", "1", "--quiet",
                                   "--report-to", "tensorboard"]))
    console.append(invoke(runner, ["eval", str(run), "--split", "val", "--limit", "4", "--n-boot", "0",
                                   "--json", str(out / "eval.json")]))
    return out, "\n".join(console), requests


def strings_in_parquet(path: Path) -> str:
    """Every value and the metadata of a Parquet file, as text (its pages may be compressed)."""
    table = pq.read_table(path)
    metadata = {k.decode("utf-8", "replace"): v.decode("utf-8", "replace") for k, v in (table.schema.metadata or {}).items()}
    return json.dumps([table.to_pylist(), metadata], default=repr)


def test_the_endpoint_received_the_key(produced):
    _, _, requests = produced
    assert requests and all(r.headers.get("Authorization") == f"Bearer {KEY}" for r in requests)


def test_the_key_is_in_no_written_file_and_no_console_output(produced):
    out, console, _ = produced
    files = [p for p in out.rglob("*") if p.is_file()]
    kinds = {p.suffix for p in files}
    # the walk covers every kind of artifact the commands write
    assert {".jsonl", ".json", ".parquet", ".safetensors", ".yaml", ".png"} <= kinds, kinds
    assert any(p.name.startswith("events.out.tfevents") for p in files)  # tracker logs
    for path in files:
        assert KEY.encode() not in path.read_bytes(), path
        if path.suffix == ".parquet":
            assert KEY not in strings_in_parquet(path), path
    assert KEY not in console
    assert "key ***" in (out / "relabelled.journal.jsonl").read_text()  # the quoted key was redacted


def test_weights_are_safetensors_only(produced):
    out, _, _ = produced
    files = [p for p in out.rglob("*") if p.is_file()]
    assert not [p for p in files if p.suffix in PICKLE_SUFFIXES]
    weights = [p for p in files if p.suffix == ".safetensors"]
    assert any("checkpoints" in p.parts for p in weights) and any("model" in p.parts for p in weights)
    for path in weights:
        with safe_open(str(path), framework="pt") as handle:  # parses as safetensors
            assert list(handle.keys())


def test_a_teacher_that_echoes_the_key_does_not_get_it_saved(tmp_path):
    data = tmp_path / "items.jsonl"
    data.write_text("".join(json.dumps({"id": f"i{k}", "text": f"win {k}", "label": "spam"}) + "\n" for k in range(3))
                    + json.dumps({"id": "h", "text": "lunch", "label": "ham"}) + "\n", encoding="utf-8")
    runner = CliRunner(env={DEFAULT_API_KEY_ENV: KEY, "HF_HUB_OFFLINE": "1"})
    with FakeOpenAIServer(f"<think>my key is {KEY}</think><answer>spam</answer>") as server:
        invoke(runner, ["distill", str(data), "--teacher", server.url, "--teacher-model", "t",
                        "--out", str(tmp_path / "traces.jsonl"), "--attempts", "1"])
    for path in tmp_path.iterdir():
        assert KEY.encode() not in path.read_bytes(), path


# ------------------------------------------------------------------------------ the source

SHELL_CALLS = {("os", "system"), ("os", "popen"), ("subprocess", "getoutput"), ("subprocess", "getstatusoutput")}


def shell_uses(source: str, name: str = "<src>") -> list[str]:
    """Places in ``source`` that run a command through a shell."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg == "shell" and not (isinstance(kw.value, ast.Constant) and kw.value.value is False):
                    found.append(f"{name}:{node.lineno} shell=")
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and (node.value.id, node.attr) in SHELL_CALLS:
            found.append(f"{name}:{node.lineno} {node.value.id}.{node.attr}")
        if isinstance(node, ast.ImportFrom) and any((node.module, a.name) in SHELL_CALLS for a in node.names):
            found.append(f"{name}:{node.lineno} from {node.module} import")
    return found


def source_files() -> list[Path]:
    files = sorted(SRC.rglob("*.py"))
    assert len(files) > 20
    return files


def test_the_shell_check_finds_each_pattern():
    bad = ("import os, subprocess\nsubprocess.run('ls', shell=True)\nos.system('ls')\nos.popen('ls')\n"
           "subprocess.getoutput('ls')\nfrom os import system\nsubprocess.run(['ls'], shell=False)\n")
    assert len(shell_uses(bad)) == 5


def test_no_source_file_runs_a_shell():
    found = [hit for path in source_files() for hit in shell_uses(path.read_text(encoding="utf-8"), str(path))]
    assert not found, found


def config_models() -> list[type[BaseModel]]:
    """Every pydantic model defined in labelrl (modules that mention BaseModel are imported)."""
    models = []
    for path in source_files():
        if "BaseModel" not in path.read_text(encoding="utf-8") or path.name == "__main__.py":
            continue
        module = importlib.import_module("labelrl." + ".".join(path.relative_to(SRC).with_suffix("").parts))
        models += [obj for _, obj in inspect.getmembers(module, inspect.isclass)
                   if issubclass(obj, BaseModel) and obj.__module__ == module.__name__]
    return models


def test_trust_remote_code_is_off_by_default_everywhere():
    models = config_models()
    with_field = {m.__name__ for m in models if "trust_remote_code" in m.model_fields}
    assert {"SFTConfig", "RLConfig"} <= with_field
    for model in models:
        if "trust_remote_code" in model.model_fields:
            assert model.model_fields["trust_remote_code"].default is False, model.__name__
    from labelrl.models import load as model_load

    for function in (model_load.load_model, model_load.load_tokenizer):
        assert inspect.signature(function).parameters["trust_remote_code"].default is False
    literal_true = [f"{path}:{node.lineno}" for path in source_files()
                    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                    if isinstance(node, ast.keyword) and node.arg == "trust_remote_code"
                    and isinstance(node.value, ast.Constant) and node.value.value is True]
    assert not literal_true, literal_true


# A field that would hold a credential; ``*_env`` fields name an environment variable instead.
SECRET_FIELD = re.compile(r"api_?key|access_?key|secret|passw(or)?d|credential|bearer|(^|_)token$")


def test_no_config_field_takes_a_secret_on_the_command_line():
    assert SECRET_FIELD.search("api_key") and not SECRET_FIELD.search("max_new_tokens")
    fields = {f"{m.__name__}.{name}" for m in config_models() for name in m.model_fields
              if SECRET_FIELD.search(name) and not name.endswith("_env")}
    assert not fields, f"keys belong in environment variables (see --api-key-env), not options: {fields}"
