"""Kill and resume through the real command line (slow), and two kills simulated in process.

``run_until_killed`` starts a ``labelrl`` command as a subprocess and sends it a signal at a
seeded random point. Each test then resumes the command and compares what is on disk with an
uninterrupted run of the same command:

* ``labelrl rl`` (SIGKILL, twice per seed: once in the first run, once in the resumed one):
  the final safetensors weights and metrics.jsonl (minus timing keys) equal the uninterrupted
  run's, and at most the step in flight was lost at each kill;
* ``labelrl rl`` with SIGTERM or SIGINT: the run finishes its step, saves a checkpoint and
  exits 0, and ``--resume`` then finishes it to the same result;
* ``labelrl relabel`` and ``labelrl distill`` against a local OpenAI-compatible server (which
  logs every request): after a SIGKILL and a re-run, the output holds every item exactly once
  and equals the uninterrupted output, and nothing whose answer was in the journal at the kill
  is requested again.

Two kill points are pinned in process (fast): between a step's log line and its checkpoint
before any checkpoint exists, and inside the metrics rewrite a resumed run starts with.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from fake_openai_server import FakeOpenAIServer  # noqa: E402
from reliability_support import assert_same_weights, cli_env, deterministic, labelrl_argv, saved_weights  # noqa: E402

from labelrl.fileio import read_jsonl  # noqa: E402
from labelrl.rollout.log import read_rollouts  # noqa: E402
from labelrl.train import rl  # noqa: E402
from labelrl.train.checkpoint import latest_checkpoint  # noqa: E402


@dataclass(frozen=True)
class RunResult:
    returncode: int  # −signal when the signal ended the process
    signalled: bool  # the signal was sent (the process had not ended by itself)
    seconds: float
    stdout: str
    stderr: str


def run_until_killed(
    argv: list[str], env: dict[str, str], *, kill_after_s: float | None = None,
    kill_when: Callable[[], bool] | None = None, sig: int = signal.SIGKILL, timeout_s: float = 300.0,
) -> RunResult:
    """Run ``argv`` (a list, never through a shell) and send ``sig`` once ``kill_after_s``
    seconds have passed or ``kill_when()`` (polled every 10 ms) is true; then wait for it to end.

    Output goes to temporary files, so a chatty process cannot block on a full pipe. A process
    that ends before the trigger is returned with ``signalled`` False; the caller decides
    whether that defeats its test.
    """
    if (kill_after_s is None) == (kill_when is None):
        raise ValueError("run_until_killed: pass exactly one of kill_after_s (seconds) or kill_when (a callable)")
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.monotonic()
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=err)

        def trigger() -> bool:
            return kill_when() if kill_when is not None else time.monotonic() - started >= kill_after_s

        signalled = False
        try:
            while proc.poll() is None:
                if time.monotonic() - started > timeout_s:
                    raise AssertionError(f"{argv[:3]} still running after {timeout_s} s")
                if trigger():
                    proc.send_signal(sig)
                    signalled = True
                    break
                time.sleep(0.01)
            returncode = proc.wait(timeout=timeout_s)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        out.seek(0)
        err.seek(0)
        return RunResult(returncode, signalled, time.monotonic() - started,
                         out.read().decode("utf-8", "replace"), err.read().decode("utf-8", "replace"))


def after_random_delay(condition: Callable[[], bool], rng: random.Random, max_delay_s: float) -> Callable[[], bool]:
    """A trigger that fires a seeded random delay (0 … ``max_delay_s``) after ``condition`` first
    holds, so kills land anywhere inside a step, a checkpoint write or a request."""
    delay, since = rng.uniform(0.0, max_delay_s), []

    def fire() -> bool:
        if not since and condition():
            since.append(time.monotonic())
        return bool(since) and time.monotonic() - since[0] >= delay

    return fire


def complete_lines(path: Path) -> int:
    """Newline-terminated lines in ``path`` (0 when absent): records whose write finished."""
    try:
        return Path(path).read_bytes().count(b"\n")
    except FileNotFoundError:  # not written yet, or being rewritten by a resume
        return 0


def run_to_end(argv: list[str]) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, env=cli_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def test_the_harness_signals_on_time_and_reports_a_process_that_ended_first():
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    timed = run_until_killed(sleeper, cli_env(), kill_after_s=0.3)
    assert timed.signalled and timed.returncode == -signal.SIGKILL and timed.seconds < 30
    flag = []
    polled = run_until_killed(sleeper, cli_env(), kill_when=lambda: flag.append(1) or len(flag) > 5, sig=signal.SIGTERM)
    assert polled.signalled and polled.returncode == -signal.SIGTERM and len(flag) == 6
    quick = run_until_killed([sys.executable, "-c", "print('done')"], cli_env(), kill_after_s=60)
    assert not quick.signalled and quick.returncode == 0 and quick.stdout == "done\n"
    with pytest.raises(ValueError, match="exactly one of kill_after_s"):
        run_until_killed(sleeper, cli_env())


# ---------------------------------------------------------------------------------------- rl

RL_STEPS = 12


def rl_argv(model: Path, data: Path, out: Path, seed: int, *extra: str) -> list[str]:
    return labelrl_argv(
        "rl", "--model", str(model), "--data", str(data), "--out", str(out), "--no-lora", "--group-size", "4",
        "--prompts-per-step", "2", "--max-new-tokens", "9", "--steps", str(RL_STEPS), "--learning-rate", "1e-3",
        "--checkpoint-every", "1", "--seed", str(seed), "--quiet", *extra,
    )


def max_logged_step(run_dir: Path) -> int:
    try:
        return max((r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")), default=0)
    except FileNotFoundError:  # a resume is rewriting it
        return 0


def checkpoint_step(run_dir: Path) -> int:
    ckpt = latest_checkpoint(run_dir)
    return json.loads((ckpt / "state.json").read_text())["step"] if ckpt else 0


@pytest.fixture(scope="module")
def straight_rl(warm_model, toy_data, tmp_path_factory):
    """``straight_rl(seed)``: the run directory of an uninterrupted run (made once per seed)."""
    runs: dict[int, Path] = {}

    def get(seed: int) -> Path:
        if seed not in runs:
            out = tmp_path_factory.mktemp("straight") / f"seed{seed}"
            run_to_end(rl_argv(warm_model, toy_data, out, seed))
            runs[seed] = out
        return runs[seed]

    return get


def assert_same_run(straight: Path, resumed: Path, start_model: Path) -> None:
    final = saved_weights(resumed / "model")
    assert_same_weights(saved_weights(straight / "model"), final)
    start = saved_weights(start_model / "model")
    assert any(not torch.equal(start[n], final[n]) for n in final), "RL changed no weight: the comparison proves nothing"
    records = deterministic(read_jsonl(resumed / "metrics.jsonl"))
    assert [r["step"] for r in records] == list(range(1, RL_STEPS + 1))
    assert records == deterministic(read_jsonl(straight / "metrics.jsonl"))
    assert read_rollouts(resumed).equals(read_rollouts(straight))


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rl_killed_twice_resumes_to_the_uninterrupted_result(seed, warm_model, toy_data, straight_rl, tmp_path):
    straight = straight_rl(seed)
    out, rng = tmp_path / "killed", random.Random(seed)
    argv = rl_argv(warm_model, toy_data, out, seed)
    first_k = rng.randint(1, RL_STEPS - 6)
    # Armed once the first checkpoint exists: a kill before it is the case of
    # test_rl_killed_before_its_first_checkpoint_can_be_resumed.
    first = run_until_killed(argv, cli_env(), kill_when=after_random_delay(
        lambda: complete_lines(out / "metrics.jsonl") >= first_k, rng, 0.3))
    assert first.signalled and first.returncode == -signal.SIGKILL, first.stderr[-2000:]
    logged, saved = max_logged_step(out), checkpoint_step(out)
    assert 1 <= logged < RL_STEPS and saved >= logged - 1  # at most the step in flight is lost

    # The resumed run is killed too, once it has logged a step beyond what the first run had.
    second_k = rng.randint(logged + 1, RL_STEPS - 1)
    second = run_until_killed([*argv, "--resume"], cli_env(), kill_when=after_random_delay(
        lambda: max_logged_step(out) >= second_k, rng, 0.3))
    assert second.signalled and second.returncode == -signal.SIGKILL, second.stderr[-2000:]
    assert checkpoint_step(out) >= max_logged_step(out) - 1

    run_to_end([*argv, "--resume"])
    assert_same_run(straight, out, warm_model)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_rl_stops_cleanly_on_a_signal_with_a_checkpoint(sig, warm_model, toy_data, straight_rl, tmp_path):
    out = tmp_path / "stopped"
    argv = rl_argv(warm_model, toy_data, out, 0)
    result = run_until_killed(argv, cli_env(), kill_when=lambda: complete_lines(out / "metrics.jsonl") >= 2, sig=sig)
    assert result.signalled and result.returncode == 0, result.stderr[-2000:]
    assert "stopped early (checkpoint saved; --resume continues)" in result.stdout
    summary = json.loads((out / "rl_summary.json").read_text())
    done = summary["steps_done"]
    assert summary["stopped_early"] and 2 <= done < RL_STEPS
    assert checkpoint_step(out) == done == max_logged_step(out)  # the step in flight was finished and saved
    assert not (out / "model").exists()
    run_to_end([*argv, "--resume"])
    assert_same_run(straight_rl(0), out, warm_model)


# ------------------------------------------------------------------------- relabel, distill

def write_items(path: Path, n: int) -> dict[str, str]:
    """Items ``i00 …``: odd ones spam ("win …"), even ones ham; returns text → id."""
    rows = [{"id": f"i{k:02d}", "text": (f"win prize number {k}" if k % 2 else f"lunch plan number {k}"),
             "label": "spam" if k % 2 else "ham"} for k in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return {r["text"]: r["id"] for r in rows}


def judge_reply(body: dict) -> str:
    """Judge: keyword rule, unsure (0.5) on every 4th item; adjudicator and retests sure."""
    text = body["messages"][-1]["content"]
    label = "spam" if text.startswith("win") else "ham"
    number = int(text.rsplit(" ", 1)[1])
    unsure = body["model"] == "judge" and "seed" not in body and number % 4 == 0
    return f"<answer>{label}</answer><confidence>{0.5 if unsure else 0.95}</confidence>"


def relabel_key(body: dict, ids: dict[str, str]) -> tuple[str, str]:
    """The journal key a request answers: (kind, item id)."""
    kind = "adjudicate" if body["model"] == "adjudicator" else "retest" if "seed" in body else "judge"
    return kind, ids[body["messages"][-1]["content"]]


def relabel_argv(data: Path, rubric: Path, url: str, out: Path) -> list[str]:
    return labelrl_argv("relabel", str(data), "--rubric", str(rubric), "--judge", url, "--judge-model", "judge",
                        "--adjudicator", url, "--adjudicator-model", "adjudicator", "--out", str(out),
                        "--concurrency", "2", "--self-agreement-sample", "8", "--seed", "0")


def check_journal_resume(server, start: int, journaled: set, straight_keys: list, key) -> None:
    """Nothing journaled at the kill is asked again; nothing is asked twice; nothing is lost."""
    resumed = [key(r.body) for r in server.requests[start:]]
    assert resumed, "the re-run asked nothing: the kill came after the last answer"
    assert not journaled & set(resumed), f"asked again after their answers were saved: {sorted(journaled & set(resumed))}"
    assert len(resumed) == len(set(resumed)), "an item was asked twice by the re-run"
    assert journaled | set(resumed) == set(straight_keys) and len(straight_keys) == len(set(straight_keys))


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_relabel_killed_resumes_without_asking_twice(seed, tmp_path):
    ids = write_items(tmp_path / "items.jsonl", 20)
    rubric = tmp_path / "rubric.md"
    rubric.write_text("Prizes are spam; plans are ham.\n", encoding="utf-8")
    rng = random.Random(seed)
    with FakeOpenAIServer(judge_reply, delays=lambda i, body: 0.08) as server:
        run_to_end(relabel_argv(tmp_path / "items.jsonl", rubric, server.url, tmp_path / "straight.jsonl"))
        straight_keys = [relabel_key(r.body, ids) for r in server.requests]
        journal = tmp_path / "killed.journal.jsonl"
        k = rng.randint(1, len(straight_keys) - 6)  # answer lines (the header is line 1)
        argv = relabel_argv(tmp_path / "items.jsonl", rubric, server.url, tmp_path / "killed.jsonl")
        killed = run_until_killed(argv, cli_env(), kill_when=after_random_delay(
            lambda: complete_lines(journal) >= k + 1, rng, 0.15))
        assert killed.signalled and killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
        journaled = {(r["kind"], r["id"]) for r in read_jsonl(journal)[1:]}
        start = server.settle()  # the killed run's last request may be logged after the kill
        run_to_end(argv)
        check_journal_resume(server, start, journaled, straight_keys, lambda body: relabel_key(body, ids))
    rows = read_jsonl(tmp_path / "killed.jsonl")
    assert sorted(r["id"] for r in rows) == sorted(ids.values())
    assert rows == read_jsonl(tmp_path / "straight.jsonl")
    lines = [(r["kind"], r["id"]) for r in read_jsonl(journal)[1:]]
    assert len(lines) == len(set(lines)) == len(straight_keys)


def teacher_reply(body: dict) -> str:
    """Teacher: item k is right at the attempt a (seed) with (k + a) % 3 == 2, so items need
    1, 2 or 3 attempts; other attempts do not parse."""
    text = body["messages"][-1]["content"]
    number = int(text.rsplit(" ", 1)[1])
    label = "spam" if text.startswith("win") else "ham"
    return f"<think>about item {number}</think><answer>{label}</answer>" if (number + body["seed"]) % 3 == 2 else "hmm"


def distill_argv(data: Path, url: str, out: Path) -> list[str]:
    return labelrl_argv("distill", str(data), "--teacher", url, "--teacher-model", "teacher", "--out", str(out),
                        "--attempts", "3", "--keep", "first", "--concurrency", "2", "--seed", "0")


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_distill_killed_resumes_without_asking_twice(seed, tmp_path):
    ids = write_items(tmp_path / "items.jsonl", 16)
    rng = random.Random(seed)

    def key(body: dict) -> tuple[str, int]:
        return ids[body["messages"][-1]["content"]], body["seed"]  # (id, attempt) with --seed 0

    with FakeOpenAIServer(teacher_reply, delays=lambda i, body: 0.08) as server:
        run_to_end(distill_argv(tmp_path / "items.jsonl", server.url, tmp_path / "straight.jsonl"))
        straight_keys = [key(r.body) for r in server.requests]
        journal = tmp_path / "killed.attempts.jsonl"
        k = rng.randint(1, len(straight_keys) - 6)
        argv = distill_argv(tmp_path / "items.jsonl", server.url, tmp_path / "killed.jsonl")
        killed = run_until_killed(argv, cli_env(), kill_when=after_random_delay(
            lambda: complete_lines(journal) >= k + 1, rng, 0.15))
        assert killed.signalled and killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
        journaled = {(r["id"], r["attempt"]) for r in read_jsonl(journal)[1:]}
        start = server.settle()  # the killed run's last request may be logged after the kill
        run_to_end(argv)
        check_journal_resume(server, start, journaled, straight_keys, key)
    traces = read_jsonl(tmp_path / "killed.jsonl")
    assert sorted(r["id"] for r in traces) == sorted(ids.values()) and all(r["kept"] for r in traces)
    assert traces == read_jsonl(tmp_path / "straight.jsonl")
    attempts = [(r["id"], r["attempt"]) for r in read_jsonl(journal)[1:]]
    assert len(attempts) == len(set(attempts)) == len(straight_keys)


# ------------------------------------------------------------- kills pinned in process (fast)

class SimulatedKill(BaseException):
    """Raised where a SIGKILL would land: nothing after it runs (no checkpoint, no summary)."""


SMALL_RL = dict(prompts_per_step=1, group_size=2, max_new_tokens=9, checkpoint_every=1)


def test_rl_killed_before_its_first_checkpoint_can_be_resumed(warm_model, toy_data, rl_config, tmp_path, monkeypatch,
                                                              weights_changed):
    # Random rewards over groups of 4: the warm start often answers a prompt the same way G
    # times, so with real rewards both steps' groups can be uniform and train nothing, and
    # equal weights below would prove nothing.
    options = {**SMALL_RL, "group_size": 4, "random_reward": True}
    rl.run_rl(rl_config(warm_model, toy_data, tmp_path / "straight", steps=2, **options))
    weights_changed(warm_model, tmp_path / "straight")
    out = tmp_path / "killed"

    def killed(*args, **kwargs):
        raise SimulatedKill

    monkeypatch.setattr(rl, "save_checkpoint", killed)
    with pytest.raises(SimulatedKill):
        rl.run_rl(rl_config(warm_model, toy_data, out, steps=2, **options))
    monkeypatch.undo()
    assert complete_lines(out / "metrics.jsonl") == 1 and latest_checkpoint(out) is None
    rl.run_rl(rl_config(warm_model, toy_data, out, steps=2, resume=True, **options))
    assert deterministic(read_jsonl(out / "metrics.jsonl")) == deterministic(read_jsonl(tmp_path / "straight" / "metrics.jsonl"))
    assert_same_weights(saved_weights(tmp_path / "straight" / "model"), saved_weights(out / "model"))


def test_rl_killed_while_resume_rewrites_its_metrics_keeps_every_step(warm_model, toy_data, rl_config, tmp_path, monkeypatch):
    rl.run_rl(rl_config(warm_model, toy_data, tmp_path / "straight", steps=4, **SMALL_RL))
    out = tmp_path / "killed"
    rl.run_rl(rl_config(warm_model, toy_data, out, steps=4, stop_after=2, **SMALL_RL))
    # The resumed run is killed at its second append to metrics.jsonl: as the code stands that
    # lands inside the rewrite of the kept lines; without such a rewrite, in step 4's log.
    real, calls = rl.append_jsonl, []

    def dies_on_the_second_line(path, record):
        calls.append(record)
        if len(calls) == 2:
            raise SimulatedKill
        real(path, record)

    monkeypatch.setattr(rl, "append_jsonl", dies_on_the_second_line)
    with pytest.raises(SimulatedKill):
        rl.run_rl(rl_config(warm_model, toy_data, out, steps=4, resume=True, **SMALL_RL))
    monkeypatch.undo()
    rl.run_rl(rl_config(warm_model, toy_data, out, steps=4, resume=True, **SMALL_RL))
    records = deterministic(read_jsonl(out / "metrics.jsonl"))
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert records == deterministic(read_jsonl(tmp_path / "straight" / "metrics.jsonl"))
