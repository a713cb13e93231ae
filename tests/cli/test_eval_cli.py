import json
import os
import subprocess
import sys

import numpy as np
import pytest
import typer
import yaml
from typer.testing import CliRunner

from labelrl.cli.evaluate import register
from labelrl.evaluate.io import Predictions, predictions_table, read_predictions, write_predictions
from labelrl.types import LabelSpace

runner = CliRunner(env={"COLUMNS": "200"})
SPACE = LabelSpace(("ham", "spam"), kind="binary")


@pytest.fixture(scope="module")
def app():
    app = typer.Typer(add_completion=False)
    app.callback()(lambda: None)
    register(app)
    return app


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A run directory as `labelrl sft` leaves it: model/ (tiny-random), sft_config.yaml, data."""
    from labelrl.models import load_model

    root = tmp_path_factory.mktemp("evalrun")
    rows = [{"text": (f"WIN a free prize {i} now" if i % 3 == 0 else f"lunch at {i} ok?"),
             "label": "spam" if i % 3 == 0 else "ham"} for i in range(80)]
    data = root / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    run = root / "run"
    model, tokenizer = load_model("tiny-random")
    model.save_pretrained(run / "model")
    tokenizer.save_pretrained(run / "model")
    (run / "sft_config.yaml").write_text(yaml.safe_dump({"data": str(data), "mode": "direct", "split_seed": 0}))
    return run


def test_eval_twice_on_holdout_refuses_then_records_a_marked_repeat(app, run_dir, tmp_path):
    out = tmp_path / "holdout.json"
    first = runner.invoke(app, ["eval", str(run_dir), "--split", "holdout", "--n-boot", "50", "--json", str(out)])
    assert first.exit_code == 0, first.output
    assert "balanced accuracy" in first.stdout and "95% CI" in first.stdout and "Confusion matrix" in first.stdout
    report = json.loads(out.read_text())
    assert report["ledger"]["repeat"] is False and report["metrics"]["n"] == 8
    assert (tmp_path / "holdout.reliability.png").is_file()
    predictions = read_predictions(report["files"]["predictions"])
    assert predictions.n == 8 and predictions.info["split"] == "holdout"

    second = runner.invoke(app, ["eval", str(run_dir), "--split", "holdout", "--n-boot", "50"])
    assert second.exit_code == 2
    assert "touched twice stops being a holdout" in second.output and "--allow-repeat-holdout" in second.output

    third = runner.invoke(app, ["eval", str(run_dir), "--split", "holdout", "--n-boot", "50", "--allow-repeat-holdout"])
    assert third.exit_code == 0, third.output
    assert "REPEAT holdout evaluation" in third.stdout
    ledger = [json.loads(line) for line in (run_dir / "ledger.jsonl").read_text().splitlines()]
    assert [(r["split"], r["repeat"]) for r in ledger] == [("holdout", False), ("holdout", True)]

    val = runner.invoke(app, ["eval", str(run_dir), "--split", "val", "--n-boot", "0", "--out", str(tmp_path / "val.csv")])
    assert val.exit_code == 0, val.output
    listing = runner.invoke(app, ["ledger", str(run_dir), "--json", str(tmp_path / "ledger.json")])
    assert listing.exit_code == 0, listing.output
    assert "REPEAT" in listing.stdout and "Val → holdout" in listing.stdout
    drops = json.loads((tmp_path / "ledger.json").read_text())["drops"]
    assert len(drops) == 1 and drops[0]["val_source"] == "ledger"



def test_a_generation_cap_that_cannot_hold_an_answer_is_refused_before_a_holdout_look(app, run_dir, tmp_path):
    # <answer>spam</answer> is 8 tokens: at a cap of 8 every "spam" answer would end at the cap,
    # count as truncated and be scored wrong, and the model's one holdout look would be spent.
    import shutil

    run = tmp_path / "run"
    shutil.copytree(run_dir, run, ignore=shutil.ignore_patterns("ledger.jsonl", "eval"))
    short = runner.invoke(app, ["eval", str(run), "--split", "holdout", "--method", "generate", "--max-new-tokens", "8"])
    flat = " ".join(short.output.split())
    assert short.exit_code == 2 and "--max-new-tokens 8: the answer <answer>spam</answer> takes 8 tokens" in flat
    assert "at least 9" in flat
    assert not (run / "ledger.jsonl").exists() or not (run / "ledger.jsonl").read_text().strip()  # no look recorded
    assert runner.invoke(app, ["eval", str(run), "--split", "holdout", "--method", "generate", "--max-new-tokens", "9",
                               "--n-boot", "0"]).exit_code == 0


def test_scores_then_generations_are_one_look_listed_as_one_row(app, run_dir, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(run_dir, run, ignore=shutil.ignore_patterns("ledger.jsonl", "eval"))  # this test's own ledger
    base = ["eval", str(run), "--split", "holdout", "--n-boot", "0"]
    assert runner.invoke(app, base).exit_code == 0
    second = runner.invoke(app, [*base, "--method", "generate", "--max-new-tokens", "9"])
    assert second.exit_code == 0, second.output
    flat = " ".join(second.stdout.split())  # the console wraps at its width, wherever the tmp path ends
    assert "second reading of this model's holdout look" in flat and "REPEAT" not in flat
    again = runner.invoke(app, [*base, "--method", "generate", "--max-new-tokens", "9"])
    assert again.exit_code == 2 and "read by generate" in again.output  # each reading once
    listing = runner.invoke(app, ["ledger", str(run), "--json", str(tmp_path / "ledger.json")])
    assert listing.exit_code == 0, listing.output
    assert "1 holdout looks" in listing.stdout and "scores + generate" in listing.stdout
    listed = json.loads((tmp_path / "ledger.json").read_text())
    assert len(listed["records"]) == 2 and [sorted(r["readings"]) for r in listed["rows"]] == [["generate", "scores"]]

def test_an_out_file_that_cannot_be_written_is_refused_before_the_holdout_is_looked_at(app, run_dir, tmp_path):
    """--out without .parquet or .csv: refused as the options are read, so no scoring runs and the
    ledger records no look whose predictions file would never exist; with a suffix the same model's
    holdout evaluation is then its first look, not a repeat."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(run_dir, run, ignore=shutil.ignore_patterns("ledger.jsonl", "eval"))
    bad = runner.invoke(app, ["eval", str(run), "--split", "holdout", "--n-boot", "0", "--out", str(tmp_path / "preds")])
    assert bad.exit_code != 0
    flat = " ".join(bad.output.split())
    assert "predictions are written as .parquet or .csv" in flat and "preds.parquet" in flat
    assert not (run / "ledger.jsonl").exists() and not (tmp_path / "preds").exists()
    good = runner.invoke(app, ["eval", str(run), "--split", "holdout", "--n-boot", "0", "--out", str(tmp_path / "preds.parquet"),
                               "--json", str(tmp_path / "report.json")])
    assert good.exit_code == 0, good.output
    assert json.loads((tmp_path / "report.json").read_text())["ledger"]["repeat"] is False


def test_eval_subprocess_smoke(run_dir, tmp_path):
    out = tmp_path / "val.parquet"
    env = dict(os.environ, HF_HUB_OFFLINE="1", COLUMNS="200")
    result = subprocess.run([sys.executable, "-m", "labelrl.cli.main", "eval", str(run_dir), "--split", "val", "--limit", "4",
                             "--n-boot", "20", "--out", str(out)], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "val: 4 examples" in result.stdout
    assert read_predictions(out).n == 4


def test_eval_errors_are_one_line(app, tmp_path):
    result = runner.invoke(app, ["eval", "tiny-random", "--split", "val"])
    assert result.exit_code == 2 and "--splits DIR" in result.output
    result = runner.invoke(app, ["eval", "tiny-random", "--labels", "a,b"])
    assert result.exit_code == 2 and "only apply with --data" in result.output


def write_pair(tmp_path, n=400):
    rng = np.random.default_rng(0)
    y = rng.random(n) < 0.35
    score = 1 / (1 + np.exp(-(2.0 * y - 1 + rng.normal(0, 1, n))))
    ids = [f"x{i}" for i in range(n)]
    labels = ["spam" if v else "ham" for v in y]
    scored = predictions_table(ids, labels, ["spam" if s >= 0.5 else "ham" for s in score], ["ok"] * n, SPACE,
                               np.stack([1 - score, score], axis=1))
    t = np.quantile(score, 0.55)
    hard = predictions_table(ids, labels, ["spam" if s >= t else "ham" for s in score], ["ok"] * n, SPACE)
    a = write_predictions(Predictions(scored, SPACE), tmp_path / "sft.parquet")
    b = write_predictions(Predictions(hard, SPACE), tmp_path / "rl.csv")
    return a, b, t


def test_sweep_command_writes_json_and_roc_plot(app, tmp_path):
    a, b, t = write_pair(tmp_path)
    out = tmp_path / "sweep.json"
    result = runner.invoke(app, ["sweep", str(a), "--target-recall", "0.8", "--compare", str(b), "--json", str(out)])
    assert result.exit_code == 0, result.output
    # rl.csv is the scored model thresholded: a vertex of its curve, ΔTPR 0 in every resample
    assert "rl.csv: on the curve (ΔTPR at its FPR +0.000 [+0.000, +0.000]; agrees with the matched threshold on 1.000" in result.stdout
    assert "95% paired bootstrap over items, 1000 of 1000 resamples, seed 0" in result.stdout
    report = json.loads(out.read_text())
    for key in ("roc_auc", "threshold_at_target_recall", "metrics_at_target_recall",
                "best_balanced_accuracy_threshold", "best_balanced_accuracy"):
        assert report[key] is not None, key
    assert report["metrics_at_target_recall"]["recall"] >= 0.8
    assert report["compared"][0]["reproduced"] is True and report["compared"][0]["max_metric_difference"] < 1e-9
    assert report["compared"][0]["distance"]["delta_tpr"] == 0.0 and report["compared"][0]["distance"]["ci"] == [0.0, 0.0]
    assert (tmp_path / "sweep.roc.png").is_file()


def test_route_command_with_audit(app, tmp_path):
    a, _, _ = write_pair(tmp_path)
    scored = read_predictions(a)
    # B is right on most of the items A is unsure about (confidence < 0.7), and wrong elsewhere.
    unsure = scored.scores().max(axis=1) < 0.7
    flip = {"ham": "spam", "spam": "ham"}
    preds = [t if u == (i % 5 != 0) else flip[t] for i, (t, u) in enumerate(zip(scored.y_true, unsure))]
    table = predictions_table(scored.ids, scored.y_true, preds, ["ok"] * scored.n, SPACE)
    b = write_predictions(Predictions(table, SPACE), tmp_path / "b.parquet")
    audit = tmp_path / "audit.json"
    audit.write_text(json.dumps({"conflicting_groups": [{"ids": ["x1", "x2", "x3"]}]}))
    out, plot = tmp_path / "route.json", tmp_path / "cascade.png"
    result = runner.invoke(app, ["route", str(a), str(b), "--audit", str(audit), "--json", str(out), "--plot", str(plot)])
    assert result.exit_code == 0, result.output
    assert "oracle" in result.stdout and "Cascade frontier" in result.stdout and "ambiguous" in result.stdout
    report = json.loads(out.read_text())
    assert report["oracle"]["balanced_accuracy"] >= max(report["a"]["balanced_accuracy"], report["b"]["balanced_accuracy"])
    assert report["cascade"]["best"]["delta_balanced_accuracy"] > 0  # routing the unsure band to B pays
    assert report["disagreement"]["by_ambiguity"][0]["n"] == 3
    assert plot.is_file()


def test_sweep_and_route_report_bad_files(app, tmp_path):
    missing = tmp_path / "nope.parquet"
    result = runner.invoke(app, ["sweep", str(missing)])
    assert result.exit_code == 2 and "no such predictions file" in result.output
    _, b, _ = write_pair(tmp_path)
    result = runner.invoke(app, ["route", str(b), str(b)])
    assert result.exit_code == 2 and "A must be a scored model" in result.output


def test_eval_precision_is_applied_and_recorded(app, run_dir, tmp_path):
    scores = {}
    for precision in ("fp32", "bf16"):
        out = tmp_path / f"{precision}.json"
        result = runner.invoke(app, ["eval", str(run_dir), "--split", "val", "--n-boot", "0", "--limit", "6",
                                     "--precision", precision, "--json", str(out), "--out", str(tmp_path / f"{precision}.csv")])
        assert result.exit_code == 0, result.output
        report = json.loads(out.read_text())
        assert report["info"]["precision"] == precision
        scores[precision] = read_predictions(report["files"]["predictions"]).scores()
    difference = np.abs(scores["fp32"] - scores["bf16"]).max()
    assert 0 < difference < 0.05  # bf16 ran, and its label probabilities stay close to fp32's
