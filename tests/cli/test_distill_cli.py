"""``labelrl distill`` and ``labelrl compare`` through the command line (teacher played by a
local fake endpoint), and ``labelrl sft`` on the traces: CoT-SFT on kept traces and the
matched direct control (``--only-ids-from``) on exactly the surviving ids."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fake_openai_server import FakeOpenAIServer  # noqa: E402

from labelrl.cli.distill import register  # noqa: E402
from labelrl.evaluate.io import Predictions, predictions_table, write_predictions  # noqa: E402
from labelrl.fileio import read_jsonl  # noqa: E402
from labelrl.train.config import RLConfig, SFTConfig  # noqa: E402
from labelrl.train.rl import run_rl  # noqa: E402
from labelrl.train.sft import run_sft  # noqa: E402
from labelrl.types import LabelSpace  # noqa: E402

runner = CliRunner(env={"COLUMNS": "200", "HF_HUB_OFFLINE": "1"})
SPACE = LabelSpace(("ham", "spam"), kind="binary", positive="spam")


@pytest.fixture(scope="module")
def app():
    app = typer.Typer(add_completion=False)
    app.callback()(lambda: None)  # keep the commands subcommands, as under labelrl.cli.main
    register(app)
    return app


@pytest.fixture
def data(tmp_path):
    """24 items; spam ones say "win"; ids are the row's own id column."""
    rows = [{"id": f"s{k}", "text": f"win a prize number {k}", "label": "spam"} for k in range(12)]
    rows += [{"id": f"h{k}", "text": f"meet for lunch at {k}", "label": "ham"} for k in range(12)]
    path = tmp_path / "items.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def spam_teacher(body: dict) -> str:
    """Right (and well formed) on spam items; ham items get an unparseable reply."""
    if "win" in body["messages"][-1]["content"]:
        return "<think>It offers a prize.</think><answer>spam</answer>"
    return "no idea"


def test_distill_cli_exact_summary(app, data, tmp_path):
    out, summary = tmp_path / "traces.jsonl", tmp_path / "summary.json"
    with FakeOpenAIServer(spam_teacher) as server:
        args = ["distill", str(data), "--teacher", server.url, "--teacher-model", "t", "--out", str(out),
                "--attempts", "2", "--limit", "6", "--json", str(summary), "--retries", "0"]
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
        # --limit 6 is a random sample stratified by label: 3 of the 12 spam items and 3 of the 12
        # ham ones (not the first 6 rows, all spam). Spam: 1 attempt each (right at once) → 3
        # requests; ham: both attempts unparseable → 6 requests.
        assert len(server.requests) == 9
        s = json.loads(summary.read_text())
        assert s["overall"]["n_items"] == 6 and s["overall"]["n_kept_traces"] == 3
        assert {k: v["n_items"] for k, v in s["per_label"].items()} == {"ham": 3, "spam": 3}
        assert s["overall"]["survival_rate"] == 0.5
        assert "Trace survival" in result.output
        # a re-run asks nothing; with the direct model's predictions it also bands survival by confidence
        items = [json.loads(line) for line in out.read_text().splitlines()]  # one line per item: kept or not
        ids, labels = [r["id"] for r in items], [r["label"] for r in items]
        probs = np.array([[0.05, 0.95] if y == "spam" else [0.35, 0.65] for y in labels])  # confidence 0.95 / 0.65
        table = predictions_table(ids, labels, ["spam"] * len(ids), ["ok"] * len(ids), SPACE, probs)
        difficulty = write_predictions(Predictions(table, SPACE), tmp_path / "direct.parquet")
        result = runner.invoke(app, [*args, "--difficulty", str(difficulty)])
        assert result.exit_code == 0, result.output
        assert len(server.requests) == 9
    banded = json.loads(summary.read_text())["by_confidence"]
    assert {k: v["n_items"] for k, v in banded.items()} == {"[0.60, 0.70)": 3, "[0.90, 1.00]": 3}
    assert json.loads((tmp_path / "traces.summary.json").read_text())["overall"] == s["overall"]


def test_distill_cli_bad_input_one_line(app, data, tmp_path):
    result = runner.invoke(app, ["distill", str(data), "--teacher", "http://127.0.0.1:9/v1", "--out", str(tmp_path / "t.jsonl")])
    assert result.exit_code == 2 and "--teacher-model" in result.output
    result = runner.invoke(app, ["distill", str(data), "--teacher", "tiny-random", "--out", str(tmp_path / "t.jsonl"),
                                 "--attempts", "0"])
    assert result.exit_code == 2 and "--attempts" in result.output


def _labelrl(*args, cwd):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "labelrl.cli.main", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_traces_drive_cot_sft_and_the_matched_control(app, data, tmp_path):
    traces = tmp_path / "traces.jsonl"
    with FakeOpenAIServer(spam_teacher) as server:
        result = runner.invoke(app, ["distill", str(data), "--teacher", server.url, "--teacher-model", "t",
                                     "--out", str(traces), "--attempts", "2", "--run-dir", str(tmp_path / "split_run"),
                                     "--json", str(tmp_path / "s.json")])
        assert result.exit_code == 0, result.output
    train_ids = json.loads((tmp_path / "split_run" / "splits.json").read_text())["splits"]["train"]
    survivors = sorted(r["id"] for r in read_jsonl(traces) if r["kept"])
    assert {r["id"] for r in read_jsonl(traces)} == set(train_ids)  # only the train split was distilled
    assert survivors == sorted(i for i in train_ids if i.startswith("s")) and 0 < len(survivors) < len(train_ids)
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["per_label"]["ham"]["survival_rate"] == 0.0 and summary["per_label"]["spam"]["survival_rate"] == 1.0
    assert summary["per_label"]["ham"]["mean_attempts_used"] == 2.0  # bounded by --attempts

    # CoT-SFT through the CLI; the matched control and RL in process (same code, less start-up)
    common = dict(model="tiny-random", data=str(data), max_steps=2, batch_size=2, eval_every=2, eval_limit=2,
                  max_length=256, quiet=True)
    run = _labelrl("sft", "--model", "tiny-random", "--data", str(data), "--max-steps", "2", "--batch-size", "2",
                   "--eval-every", "2", "--eval-limit", "2", "--max-length", "256", "--quiet", "--out", "cot",
                   "--mode", "reasoning", "--traces", str(traces), cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert json.loads((tmp_path / "cot" / "sft_summary.json").read_text())["train_items"] == len(survivors)
    run_sft(SFTConfig(**common, out=tmp_path / "direct_surv", only_ids_from=traces))
    assert json.loads((tmp_path / "direct_surv" / "sft_summary.json").read_text())["train_items"] == len(survivors)
    # RL from the CoT-SFT model in reasoning mode, with think-closure and truncation logged
    run_rl(RLConfig(model=str(tmp_path / "cot"), data=str(data), mode="reasoning", out=tmp_path / "rl", steps=1,
                    group_size=2, prompts_per_step=1, max_new_tokens=9, quiet=True))
    (record,) = read_jsonl(tmp_path / "rl" / "metrics.jsonl")
    assert 0.0 <= record["rollout/think_closed_frac"] <= 1.0 and 0.0 <= record["rollout/truncated_frac"] <= 1.0
    bad = tmp_path / "none.jsonl"
    bad.write_text(json.dumps({"id": "nope", "trace": None, "kept": False}) + "\n")
    with pytest.raises(ValueError, match="--only-ids-from"):
        run_sft(SFTConfig(**common, out=tmp_path / "x", only_ids_from=bad))


def test_compare_cli_from_predictions_files(app, tmp_path):
    ids, true = ["a", "b", "c", "d"], ["ham", "ham", "spam", "spam"]
    files = []
    # BA: all right 1.0; survivors: spam 1/2 → 0.75; cot: ham 1/2, spam 1/2 → 0.5
    for name, pred in (("all", true), ("surv", ["ham", "ham", "spam", "ham"]), ("cot", ["spam", "ham", "spam", "ham"])):
        probs = np.array([[0.9, 0.1], [0.7, 0.3], [0.2, 0.8], [0.6, 0.4]]) if name == "surv" else None
        table = predictions_table(ids, true, pred, ["ok"] * 4, SPACE, probs)
        files.append(str(write_predictions(Predictions(table, SPACE), tmp_path / f"{name}.parquet")))
    out = tmp_path / "cmp.json"
    result = runner.invoke(app, ["compare", *files, "--names", "A,B,C", "--n-boot", "100", "--json", str(out)])
    assert result.exit_code == 0, result.output
    r = json.loads(out.read_text())
    assert r["filter_effect"] == pytest.approx(0.25) and r["objective_effect"] == pytest.approx(0.25)
    assert r["models"]["direct_survivors"]["name"] == "B"
    assert r["regressions"]["ids"] == ["a"]  # B right at 0.9 confidence, C wrong
    assert "filter effect" in result.output
    result = runner.invoke(app, ["compare", *files[:2]])
    assert result.exit_code == 2 and "compare takes three" in result.output
    result = runner.invoke(app, ["compare", str(tmp_path), *files[:2]])
    assert result.exit_code == 2 and "labelrl eval" in result.output
