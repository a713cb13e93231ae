"""``labelrl data show`` through Typer's runner, and once as a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import typer
from typer.testing import CliRunner

from labelrl.cli.data import register

runner = CliRunner()


def make_app() -> typer.Typer:
    app = typer.Typer()
    register(app)
    return app


def write_items(tmp_path):
    rows = [
        {"text": "Win cash now", "label": "spam"},
        {"text": "win cash now!", "label": "ham"},
        {"text": "See you at noon", "label": "ham"},
        {"text": "", "label": "ham"},
        {"text": "Lunch?", "label": "ham"},
    ]
    path = tmp_path / "items.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_show_prints_table_and_writes_json(tmp_path):
    path = write_items(tmp_path)
    out = tmp_path / "summary.json"
    result = runner.invoke(make_app(), ["data", "show", str(path), "--on-bad-row", "skip", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "label ham" in result.output and "75.0%" in result.output  # 3 of 4 kept rows
    assert "empty text" in result.output  # the skipped-rows table
    summary = json.loads(out.read_text())
    assert summary["n_rows"] == 4
    assert summary["label_counts"] == {"ham": 3, "spam": 1}
    assert summary["conflicting_groups"] == 1 and summary["normalised_duplicate_groups"] == 1
    assert summary["skipped_rows"] == [{"row": 4, "column": "text", "value": "", "reason": "empty text"}]


def test_show_bad_row_is_one_red_line_and_exit_2(tmp_path):
    path = write_items(tmp_path)
    result = runner.invoke(make_app(), ["data", "show", str(path)])
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    text = " ".join(result.output.split())  # rich may wrap the line
    assert "error:" in text and "row 4, column 'text': empty text" in text
    assert "pass --on-bad-row skip" in text


def test_show_unknown_column_and_missing_file(tmp_path):
    path = write_items(tmp_path)
    result = runner.invoke(make_app(), ["data", "show", str(path), "--text-col", "body"])
    assert result.exit_code == 2 and "available columns: text, label" in " ".join(result.output.split())
    result = runner.invoke(make_app(), ["data", "show", str(tmp_path / "none.csv")])
    assert result.exit_code == 2 and "no such file or built-in dataset" in " ".join(result.output.split())


def test_show_options_reach_the_loader(tmp_path):
    path = tmp_path / "multi.csv"
    path.write_text("q,a,y\nwhat,that,1\nwho,him,0\nwhy,because,1\n", encoding="utf-8")
    out = tmp_path / "s.json"
    args = ["data", "show", str(path), "--text-col", "q", "--text-col", "a", "--label-col", "y",
            "--labels", "0,1,2", "--kind", "ordinal", "--json", str(out)]
    result = runner.invoke(make_app(), args)
    assert result.exit_code == 0, result.output
    summary = json.loads(out.read_text())
    assert summary["kind"] == "ordinal" and summary["label_counts"] == {"0": 1, "1": 2, "2": 0}
    # two text columns are joined as "col: value" lines
    assert summary["text_length_chars"]["max"] == len("q: why\na: because")


def test_help_documents_every_option():
    result = runner.invoke(make_app(), ["data", "show", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for option in ["--text-col", "--label-col", "--labels", "--kind", "--positive", "--id-col", "--on-bad-row", "--json"]:
        line = next(line for line in result.output.splitlines() if option + " " in line)
        assert len(line.split(option, 1)[1].strip()) > 20, line  # a help text follows the option


def test_subprocess_sms_spam_json(tmp_path):
    out = tmp_path / "sms.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "labelrl.cli.main", "data", "show", "sms-spam", "--json", str(out)],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(out.read_text())
    # 5,574, not the CSV's 4,837 records: 8 records hold 737 more messages (see data/builtin.py).
    assert summary["n_rows"] == 5574
    assert summary["label_counts"] == {"ham": 4827, "spam": 747}
    assert "5574" in proc.stdout


def test_show_says_which_labels_are_too_rare_or_missing_from_the_scale(tmp_path):
    # the notes `ladder --data` prints before training, where a user looks before training
    path = tmp_path / "grades.jsonl"
    rows = [{"text": f"review {g}-{i}", "label": g} for g, n in ((1, 30), (2, 4), (3, 30), (5, 30)) for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    result = runner.invoke(make_app(), ["data", "show", str(path)])
    said = " ".join(result.output.split())
    assert result.exit_code == 0, result.output
    assert "No item is graded 4: grades count as steps of the list above, so declare the whole scale if it has " \
           "them (--labels 1,2,3,4,5)" in said
    assert "Fewer than 10 items of 2: val and holdout hold a few at most, and one such item moves balanced " \
           "accuracy by up to 1/4 = 0.250" in said
    declared = runner.invoke(make_app(), ["data", "show", str(path), "--labels", "1,2,3,4,5"])
    said = " ".join(declared.output.split())
    assert "No item is labelled 4: balanced accuracy averages the other 4 labels' recalls" in said
    assert "No item is graded" not in said and "1/5 = 0.200" in said
