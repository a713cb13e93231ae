import json
import subprocess
import sys

import pytest
import typer
from typer.testing import CliRunner

from labelrl.cli.audit import register

runner = CliRunner(env={"COLUMNS": "200"})  # wide: no wrapped lines to match against


@pytest.fixture(scope="module")
def app():
    app = typer.Typer(add_completion=False)
    app.callback()(lambda: None)  # keep "audit" as a subcommand, as under labelrl.cli.main
    register(app)
    return app


def write_csv(path, rows, header="id,text,label"):
    path.write_text(header + "\n" + "".join(",".join(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def noisy_csv(tmp_path):
    rows = [("1", "win a prize", "spam"), ("2", "Win a prize!", "ham"), ("3", "WIN A PRIZE", "spam"),
            ("4", "see you", "ham"), ("5", "see you", "ham"), ("6", "lunch?", "ham"), ("7", "free cash", "spam")]
    return write_csv(tmp_path / "noisy.csv", rows)


def test_audit_prints_tables_and_writes_json(app, noisy_csv, tmp_path):
    out = tmp_path / "audit.json"
    result = runner.invoke(app, ["audit", str(noisy_csv), "--n-boot", "50", "--json", str(out)])
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert "noisy: 7 rows, binary labels ham (4), spam (3);" in text
    assert "Duplicates: estimate (95% CI)" in text and "Conflicting duplicate groups (top 1 of 1)" in text
    assert "win a prize" in text and "Notes" in text
    report = json.loads(out.read_text())
    # "win a prize" ×3 (spam, ham, spam) → 3 pairs, 2 disagree; "see you" ×2 → 1 agreeing pair.
    assert report["n_pairs"] == 4 and report["n_disagreeing_pairs"] == 2
    assert report["disagreement_rate"] == pytest.approx(0.5)
    assert report["conflicting_groups"][0]["ids"] == ["1", "2", "3"]


def test_audit_per_split_from_splits_file(app, noisy_csv, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    splits = {"train": ["1", "2", "4", "5", "6"], "val": ["3"], "holdout": ["7"]}
    (run_dir / "splits.json").write_text(json.dumps({"splits": splits, "seed": 0}))
    out = tmp_path / "audit.json"
    result = runner.invoke(app, ["audit", str(noisy_csv), "--splits", str(run_dir), "--n-boot", "20", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "train" in result.stdout and "holdout" in result.stdout
    report = json.loads(out.read_text())
    assert report["per_split"]["train"]["n_pairs"] == 2 and report["per_split"]["train"]["n_disagreeing_pairs"] == 1
    assert report["cross_split"]["by_splits"] == {"train+val": 1}


def test_no_duplicates_says_so_and_still_prints_counts(app, tmp_path):
    path = write_csv(tmp_path / "clean.csv", [("1", "a", "x"), ("2", "b", "y"), ("3", "c", "y")])
    result = runner.invoke(app, ["audit", str(path), "--key", "text", "--exact"])
    assert result.exit_code == 0, result.output
    assert "clean: 3 rows, binary labels x (1), y (2);" in result.stdout
    assert "No duplicates found" in result.stdout
    assert "ε cannot be estimated from duplicates" in result.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["missing.csv"], "no such file"),
        (["{csv}", "--label-col", "nope"], "no such column"),
        (["{empty}"], "no data rows"),
        (["{csv}", "--key", "driver"], "key column 'driver'"),
        (["{csv}", "--splits", "{tmp}/nowhere.json"], "no such file"),
        (["{csv}", "--splits", "{bad_splits}"], "expected"),
        (["{csv}", "--top", "-1"], "--top: must be 0 or more"),
    ],
)
def test_bad_input_exits_2_with_one_message(app, noisy_csv, tmp_path, args, message):
    empty = tmp_path / "empty.csv"
    empty.write_text("id,text,label\n")
    bad_splits = tmp_path / "bad.json"
    bad_splits.write_text(json.dumps({"train": ["1"]}))
    values = {"csv": noisy_csv, "empty": empty, "tmp": tmp_path, "bad_splits": bad_splits}
    result = runner.invoke(app, ["audit", *[a.format(**values) for a in args]])
    assert result.exit_code == 2
    assert message in result.stderr
    assert "Traceback" not in result.output and result.stdout == ""


def test_subprocess_reports_unknown_column(tmp_path, noisy_csv):
    script = (
        "import typer; from labelrl.cli.audit import register; "
        "app = typer.Typer(); app.callback()(lambda: None); register(app); app(prog_name='labelrl')"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, "audit", str(noisy_csv), "--text-col", "body"],
        capture_output=True, text=True, timeout=120, env={"HF_HUB_OFFLINE": "1", "PATH": "", "COLUMNS": "200"},
    )
    assert proc.returncode == 2
    assert "--text-col 'body': no such column" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
