"""Rejection sampling against a scripted fake endpoint (exact kept/survival numbers), resume,
bounded attempts, the label never reaching the teacher, and tiny-random as a local teacher."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fake_openai_server import FakeOpenAIServer  # noqa: E402

from labelrl.audit.judges import JudgeError, JudgeSpec, load_judge  # noqa: E402
from labelrl.distill.teacher import (  # noqa: E402
    distill_paths, grade_attempt, run_distill, teacher_messages,
)
from labelrl.fileio import read_jsonl  # noqa: E402
from labelrl.types import Example, LabelSpace  # noqa: E402

SPACE = LabelSpace(("ham", "spam"), kind="binary", positive="spam")
ITEMS = [Example("1", "win cash now", "spam"), Example("2", "lunch at noon?", "ham"),
         Example("3", "free prize call", "spam"), Example("4", "see you soon", "ham")]


def right(label: str) -> str:
    return f"<think>reasoning about it</think><answer>{label}</answer>"


def scripted(body: dict) -> str:
    """Per item text and seed (= attempt, with seed 0): which reply the teacher gives."""
    text, seed = body["messages"][-1]["content"], body["seed"]
    if text == "win cash now":
        return right("spam") if seed >= 1 else right("ham")  # wrong first, then right
    if text == "lunch at noon?":
        return right("ham")
    if text == "free prize call":
        return "I think this is spam."  # never parses
    # seed 0 parses (only </think> is required) but lacks the <think> opener: not a trace
    return right("ham") if seed >= 1 else "thinking</think><answer>ham</answer>"


def teacher(server, **kw):
    spec = JudgeSpec(server.url, model="teacher-x", retries=kw.pop("retries", 0), backoff_s=0.0, flag="--teacher")
    return load_judge(spec, SPACE, None)


def test_grade_attempt():
    assert grade_attempt(right("spam"), "spam", SPACE) == {"status": "ok", "answer": "spam", "matched": True}
    assert grade_attempt(right("ham"), "spam", SPACE)["matched"] is False
    assert grade_attempt("no tags", "spam", SPACE)["status"] == "unclosed_think"
    opener_missing = grade_attempt("x</think><answer>spam</answer>", "spam", SPACE)
    assert opener_missing["status"] == "ok" and opener_missing["matched"] is False


def test_keep_first_exact_numbers_and_resume(tmp_path):
    paths = distill_paths(tmp_path / "traces.jsonl")
    with FakeOpenAIServer(scripted) as server:
        records = run_distill(ITEMS, SPACE, None, teacher(server), paths, attempts=3, keep="first",
                              max_new_tokens=64, temperature=0.7, concurrency=2)
        # attempts: item 1 → 2 (wrong, right); 2 → 1; 3 → 3 (all unparseable); 4 → 2 → 8 requests
        assert len(server.answered()) == 8
        by_id = {r["id"]: r for r in records}
        assert [by_id[i]["kept"] for i in "1234"] == [True, True, False, True]
        assert [by_id[i]["attempts_used"] for i in "1234"] == [2, 1, 3, 2]
        assert by_id["1"]["trace"] == right("spam") and by_id["3"]["trace"] is None
        journal = [r for r in read_jsonl(paths.journal) if r["kind"] == "attempt"]
        assert len(journal) == 8
        assert sorted((r["id"], r["attempt"], r["matched"]) for r in journal) == [
            ("1", 0, False), ("1", 1, True), ("2", 0, True), ("3", 0, False), ("3", 1, False), ("3", 2, False),
            ("4", 0, False), ("4", 1, True)]
        assert {r["status"] for r in journal if r["id"] == "3"} == {"unclosed_think"}
        # a re-run asks nothing and writes the same traces file
        before = paths.out.read_text()
        run_distill(ITEMS, SPACE, None, teacher(server), paths, attempts=3, keep="first",
                    max_new_tokens=64, temperature=0.7)
        assert len(server.requests) == 8 and paths.out.read_text() == before
        # more attempts later: only item 3 (never matched) is asked again, once
        run_distill(ITEMS, SPACE, None, teacher(server), paths, attempts=4, keep="first",
                    max_new_tokens=64, temperature=0.7)
        assert len(server.requests) == 9 and server.requests[-1].user_text == "free prize call"
        assert server.requests[-1].body["seed"] == 3


def test_keep_all(tmp_path):
    paths = distill_paths(tmp_path / "all.jsonl")
    with FakeOpenAIServer(scripted) as server:
        records = run_distill(ITEMS, SPACE, None, teacher(server), paths, attempts=3, keep="all",
                              max_new_tokens=64, temperature=0.7)
        assert len(server.requests) == 12  # every item gets all 3 attempts
    kept = [(r["id"], r["attempt"]) for r in records if r["kept"]]
    assert kept == [("1", 1), ("1", 2), ("2", 0), ("2", 1), ("2", 2), ("4", 1), ("4", 2)]
    assert [r["id"] for r in records if not r["kept"]] == ["3"]


def test_label_never_reaches_the_teacher(tmp_path):
    """Swapping every item's label must not change a byte of what the teacher is sent."""
    flipped = [Example(ex.id, ex.text, "ham" if ex.label == "spam" else "spam") for ex in ITEMS]
    sent = []
    for n, items in enumerate((ITEMS, flipped)):
        with FakeOpenAIServer(right("spam")) as server:
            run_distill(items, SPACE, "Prizes are spam.", teacher(server), distill_paths(tmp_path / f"t{n}.jsonl"),
                        attempts=1, keep="first", max_new_tokens=64, temperature=0.7)
            sent.append(sorted(json.dumps(r.body, sort_keys=True) for r in server.requests))
            assert all(set(r.body) == {"model", "messages", "temperature", "max_tokens", "seed", "stream"} for r in server.requests)
            assert all(len(r.body["messages"]) == 2 for r in server.requests)
    assert sent[0] == sent[1]
    # the item's own text is the whole user turn; the system prompt names the label set only
    messages = teacher_messages("win cash now", SPACE, None)
    assert messages[1] == {"role": "user", "content": "win cash now"}
    assert "The possible labels are: ham, spam." in messages[0]["content"]


def test_endpoint_failure_keeps_attempts_and_resumes(tmp_path):
    paths = distill_paths(tmp_path / "traces.jsonl")
    with FakeOpenAIServer(scripted, fail_after=3) as server:
        with pytest.raises(JudgeError, match="re-run the same command to resume"):
            run_distill(ITEMS, SPACE, None, teacher(server), paths, attempts=3, max_new_tokens=64, temperature=0.7)
        server.fail_after = None
        run_distill(ITEMS, SPACE, None, teacher(server), paths, attempts=3, max_new_tokens=64, temperature=0.7)
        asked = [(r.user_text, r.body["seed"]) for r in server.answered()]
    assert len(asked) == len(set(asked)) == 8  # nothing answered was asked again


def test_a_wrong_model_name_leaves_no_journal_in_the_way_of_the_corrected_run(tmp_path):
    paths = distill_paths(tmp_path / "traces.jsonl")
    with FakeOpenAIServer(scripted, served_models=["teacher-x"]) as server:
        wrong = load_judge(JudgeSpec(server.url, model="teacher", retries=0, flag="--teacher"), SPACE, None)
        with pytest.raises(JudgeError, match="the server serves 'teacher-x', not 'teacher'; give --teacher-model "
                                             "teacher-x. Saved so far in .*: 0 attempts"):
            run_distill(ITEMS, SPACE, None, wrong, paths, attempts=3, max_new_tokens=64, temperature=0.7)
        records = run_distill(ITEMS, SPACE, None, teacher(server), paths, attempts=3, max_new_tokens=64,
                              temperature=0.7)
    assert [r["kept"] for r in records] == [True, True, False, True]
    assert read_jsonl(paths.journal)[0]["teacher"].endswith("model=teacher-x")
    with pytest.raises(ValueError, match="written for a different teacher"):
        run_distill(ITEMS, SPACE, None, wrong, paths, attempts=3, max_new_tokens=64, temperature=0.7)


def test_reasoning_split_off_by_a_reasoning_parser_still_makes_a_trace(tmp_path):
    # vLLM --reasoning-parser returns the <think> part as message.reasoning; without putting it
    # back, no reply would be a well-formed trace and every item would be rejected.
    def split(body: dict) -> dict:
        label = "spam" if body["messages"][-1]["content"] in ("win cash now", "free prize call") else "ham"
        return {"content": f"<answer>{label}</answer>", "reasoning": "weighing the words"}

    with FakeOpenAIServer(split) as server:
        records = run_distill(ITEMS, SPACE, None, teacher(server), distill_paths(tmp_path / "t.jsonl"), attempts=1,
                              max_new_tokens=64, temperature=0.7)
    assert [r["trace"] for r in records] == [f"<think>weighing the words</think><answer>{ex.label}</answer>"
                                             for ex in ITEMS]


def test_bad_settings_are_refused(tmp_path):
    with pytest.raises(ValueError, match="--attempts 0"):
        run_distill(ITEMS, SPACE, None, object(), distill_paths(tmp_path / "x.jsonl"), attempts=0)
    with pytest.raises(ValueError, match="ending in .jsonl"):
        distill_paths(tmp_path / "x.csv")


class Spy:
    """Wraps a judge and records every chat it is asked."""

    def __init__(self, inner):
        self.inner, self.name, self.kind, self.calls = inner, inner.name, inner.kind, []

    def generate(self, messages, **kw):
        self.calls.append(messages)
        return self.inner.generate(messages, **kw)


def test_tiny_random_teacher_bookkeeping(tmp_path):
    items = ITEMS[:3]
    spy = Spy(load_judge(JudgeSpec("tiny-random", flag="--teacher"), SPACE, None))
    paths = distill_paths(tmp_path / "tiny.jsonl")
    records = run_distill(items, SPACE, None, spy, paths, attempts=2, max_new_tokens=8, temperature=1.0)
    journal = [r for r in read_jsonl(paths.journal) if r["kind"] == "attempt"]
    # one journal line per teacher call; attempts stop at the first match and never exceed 2
    assert len(spy.calls) == len(journal) == sum(r["attempts_used"] for r in records)
    assert all(1 <= r["attempts_used"] <= 2 for r in records) and len(journal) <= 6
    assert all(r["attempts_used"] == 2 for r in records if not r["kept"])
    label = {ex.id: ex.label for ex in items}
    assert all(r["matched"] == (grade_attempt(r["text"], label[r["id"]], SPACE)["matched"]) for r in journal)
    assert all(not r["matched"] or r["status"] == "ok" for r in journal)
    assert {m[1]["content"] for m in spy.calls} <= {ex.text for ex in items}
    spy.calls.clear()
    run_distill(items, SPACE, None, spy, paths, attempts=2, max_new_tokens=8, temperature=1.0)
    assert spy.calls == []  # resume asks nothing
