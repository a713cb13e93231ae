"""``labelrl relabel`` through the command line: an endpoint played by a local fake server,
tiny-random as judge and adjudicator, timeouts and retries, the API key never leaving the
environment, and bad input answered with one clear line and exit code 2."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fake_openai_server import FakeOpenAIServer, free_port  # noqa: E402

from labelrl.cli.relabel import register  # noqa: E402

runner = CliRunner(env={"COLUMNS": "200", "HF_HUB_OFFLINE": "1"})
KEY = "sk-test-7fQpRELABELSECRETx93"
SCRIPT = (
    "import typer; from labelrl.cli.relabel import register; "
    "app = typer.Typer(); app.callback()(lambda: None); register(app); app(prog_name='labelrl')"
)


@pytest.fixture(scope="module")
def app():
    app = typer.Typer(add_completion=False)
    app.callback()(lambda: None)  # keep "relabel" a subcommand, as under labelrl.cli.main
    register(app)
    return app


@pytest.fixture
def files(tmp_path):
    data = tmp_path / "sms.csv"
    rows = ["win cash now,spam", "lunch at noon?,ham", "free prize call now,spam", "see you soon,ham", "cheap pills now,ham"]
    data.write_text("text,label\n" + "\n".join(rows) + "\n", encoding="utf-8")
    rubric = tmp_path / "rubric.md"
    rubric.write_text("# Spam\nUnsolicited advertising, prizes and scams are spam; the rest is ham.\n", encoding="utf-8")
    return data, rubric


def keyword_judge(body: dict) -> str:
    text = body["messages"][-1]["content"]
    if "now" in text:
        return "<answer>spam</answer><confidence>0.95</confidence>"
    return "<answer>ham</answer><confidence>0.5</confidence>"


def test_endpoint_judge_end_to_end(app, files, tmp_path):
    data, rubric = files
    out, summary_json = tmp_path / "out.jsonl", tmp_path / "summary.json"
    with FakeOpenAIServer(keyword_judge) as server:
        result = runner.invoke(app, ["relabel", str(data), "--rubric", str(rubric), "--judge", server.url,
                                     "--judge-model", "big-judge", "--out", str(out), "--json", str(summary_json),
                                     "--self-agreement-sample", "2"])
    assert result.exit_code == 0, result.output
    assert "sms: 5 items relabelled by endpoint:" in result.stdout and "Agreement with the original labels" in result.stdout
    # off a terminal, each phase's count goes to stderr as plain lines (no silent minutes)
    assert progress_lines(result.stderr) == result.stderr.strip().splitlines()
    assert "judging: 5/5 items" in result.stderr and "self-agreement: 2/2 items" in result.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["label_final"] for r in rows] == ["spam", "ham", "spam", "ham", "spam"]
    assert [r["adjudicated"] for r in rows] == [False] * 5  # no --adjudicator
    summary = json.loads(summary_json.read_text())
    assert summary == json.loads((tmp_path / "out.summary.json").read_text())
    assert summary["n_changed"] == 1 and summary["n_low_confidence"] == 2
    assert len(server.requests) == 7 and all(r.body["model"] == "big-judge" for r in server.requests)
    assert "Unsolicited advertising" in server.requests[0].system_text


def test_tiny_random_as_judge_and_adjudicator(app, files, tmp_path):
    data, rubric = files
    out = tmp_path / "out.parquet"
    result = runner.invoke(app, ["relabel", str(data), "--rubric", str(rubric), "--judge", "tiny-random",
                                 "--adjudicator", "tiny-random", "--min-confidence", "0.99", "--out", str(out),
                                 "--self-agreement-sample", "3"])
    assert result.exit_code == 0, result.output
    import pyarrow.parquet as pq

    rows = pq.read_table(out).to_pylist()
    assert [r["text"] for r in rows][:2] == ["win cash now", "lunch at noon?"]
    assert all(r["adjudicated"] and r["final_source"] == "adjudicator" for r in rows)
    summary = json.loads((tmp_path / "out.summary.json").read_text())
    assert summary["adjudicator"] == "local:tiny-random" and summary["self_agreement"]["n_sample"] == 3


def test_timeout_then_success_on_retry(app, files, tmp_path):
    data, rubric = files
    with FakeOpenAIServer(keyword_judge, delays={0: 3.0}) as server:
        result = runner.invoke(app, ["relabel", str(data), "--rubric", str(rubric), "--judge", server.url,
                                     "--judge-model", "m", "--out", str(tmp_path / "o.jsonl"), "--timeout", "0.5",
                                     "--retries", "2", "--backoff", "0.01", "--concurrency", "1",
                                     "--self-agreement-sample", "0"])
        asked = [r.user_text for r in server.requests]
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "o.summary.json").read_text())
    assert summary["requests"]["judge"] == {"requests": 6, "retries": 1}
    assert asked[:2] == ["win cash now", "win cash now"]  # the timed-out item was asked again


def test_api_key_is_sent_but_never_logged_or_saved(files, tmp_path):
    data, rubric = files
    env = {"PATH": os.environ.get("PATH", ""), "HF_HUB_OFFLINE": "1", "COLUMNS": "200", "LABELRL_API_KEY": KEY}
    # A careless server that quotes the key back inside one of its answers.
    quoting = lambda body: keyword_judge(body) if "noon" not in body["messages"][-1]["content"] else f"key {KEY}"  # noqa: E731
    with FakeOpenAIServer(quoting) as server:
        proc = subprocess.run(
            [sys.executable, "-c", SCRIPT, "relabel", str(data), "--rubric", str(rubric), "--judge", server.url,
             "--judge-model", "m", "--out", str(tmp_path / "o.jsonl"), "--json", str(tmp_path / "s.json"),
             "--self-agreement-sample", "2"],
            capture_output=True, text=True, timeout=120, env=env,
        )
    assert proc.returncode == 0, proc.stderr
    assert all(r.headers["Authorization"] == f"Bearer {KEY}" for r in server.requests)  # the key was used
    written = sorted(p.name for p in tmp_path.iterdir() if p.is_file())
    assert written == ["o.journal.jsonl", "o.jsonl", "o.summary.json", "rubric.md", "s.json", "sms.csv"]
    for path in tmp_path.iterdir():
        assert KEY.encode() not in path.read_bytes(), path
    assert "key ***" in (tmp_path / "o.journal.jsonl").read_text()  # the quoted key was redacted
    assert KEY not in proc.stdout and KEY not in proc.stderr and "1 judge replies held no valid" in proc.stdout


def test_api_key_echoed_in_an_error_is_redacted(app, files, tmp_path, monkeypatch):
    data, rubric = files
    monkeypatch.setenv("RELABEL_TEST_KEY", KEY)
    echo = lambda headers: json.dumps({"error": "invalid key " + headers.get("Authorization", "")})  # noqa: E731
    with FakeOpenAIServer(fail_after=0, fail_status=401, fail_body=echo) as server:
        result = runner.invoke(app, ["relabel", str(data), "--rubric", str(rubric), "--judge", server.url,
                                     "--judge-model", "m", "--out", str(tmp_path / "o.jsonl"),
                                     "--api-key-env", "RELABEL_TEST_KEY"])
    line = one_line_error(result)
    assert "HTTP 401" in line and "invalid key Bearer ***" in line and "$RELABEL_TEST_KEY" in line
    assert server.requests[0].headers["Authorization"] == f"Bearer {KEY}"
    assert KEY not in result.stdout + result.stderr
    assert all(KEY.encode() not in p.read_bytes() for p in tmp_path.iterdir() if p.is_file())


PROGRESS = re.compile(r"^(judging|adjudicating|self-agreement): \d+/\d+ items, \d+:\d\d:\d\d elapsed")


def progress_lines(stderr: str) -> list[str]:
    return [line for line in stderr.strip().splitlines() if PROGRESS.match(line)]


def one_line_error(result) -> str:
    """The one error line; the progress lines before it aside."""
    lines = [line for line in result.stderr.strip().splitlines() if not PROGRESS.match(line)]
    assert result.exit_code == 2, result.output
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_unreachable_endpoint_exits_2_and_keeps_the_journal(app, files, tmp_path):
    data, rubric = files
    url = f"http://127.0.0.1:{free_port()}/v1"
    result = runner.invoke(app, ["relabel", str(data), "--rubric", str(rubric), "--judge", url, "--judge-model", "m",
                                 "--out", str(tmp_path / "o.jsonl"), "--retries", "1", "--backoff", "0.01"])
    line = one_line_error(result)
    assert "refused the connection (2 attempts); check that the server is running" in line
    assert "Saved so far in" in line and "re-run the same command to resume" in line
    assert (tmp_path / "o.journal.jsonl").is_file() and not (tmp_path / "o.jsonl").exists()


def test_endpoint_timing_out_exits_2(app, files, tmp_path):
    data, rubric = files
    with FakeOpenAIServer(keyword_judge, delays=lambda i, body: 2.0) as server:
        result = runner.invoke(app, ["relabel", str(data), "--rubric", str(rubric), "--judge", server.url,
                                     "--judge-model", "m", "--out", str(tmp_path / "o.jsonl"), "--timeout", "0.3",
                                     "--retries", "0"])
    assert "timed out (no reply within --timeout 0.3 s) (1 attempt); raise --timeout" in one_line_error(result)


@pytest.mark.parametrize(
    "extra, expected",
    [
        (["--text-col", "body"], "--text-col 'body': no such column; available columns: text, label"),
        (["--rubric", "missing.md"], "--rubric missing.md: no such file"),
        (["--out", "{data}"], "would be the input file"),
        (["--judge", "http://127.0.0.1:9/v1"], "needs the name of the model it serves; give --judge-model NAME"),
        (["--min-confidence", "1.5"], "--min-confidence: Value error, a confidence lies in [0, 1]"),
        (["--adjudicator-model", "big"], "there is no --adjudicator"),
        (["--judge", "no-such-model"], "neither a built-in model"),
        (["--out", "x.csv"], "relabel writes .jsonl or .parquet"),
    ],
)
def test_bad_input_exits_2_with_one_clear_line(app, files, tmp_path, extra, expected):
    data, rubric = files
    args = ["relabel", str(data), "--rubric", str(rubric), "--judge", "tiny-random", "--out", str(tmp_path / "o.jsonl")]
    extra = [x.replace("{data}", str(data)) for x in extra]
    # later options win over the defaults above
    result = runner.invoke(app, args + extra)
    assert expected.replace("Value error, ", "") in one_line_error(result)


def test_empty_file_exits_2(app, files, tmp_path):
    _, rubric = files
    empty = tmp_path / "empty.csv"
    empty.write_text("text,label\n")
    result = runner.invoke(app, ["relabel", str(empty), "--rubric", str(rubric), "--judge", "tiny-random"])
    assert "the file has no data rows" in one_line_error(result)
