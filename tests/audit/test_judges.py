"""Tests for labelrl.audit.judges: strict reply parsing, judge specs, the endpoint client
(timeouts, retries with backoff, bounded concurrency, the API key) and the local judge."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fake_openai_server import FakeOpenAIServer, free_port  # noqa: E402

from labelrl.audit.judges import (  # noqa: E402
    EndpointJudge,
    JudgeError,
    JudgeSpec,
    Verdict,
    chat_url,
    draw_label,
    endpoint_messages,
    item_uniform,
    load_judge,
    parse_judgement,
)
from labelrl.types import Example, LabelSpace  # noqa: E402

SPAM = LabelSpace(("ham", "spam"), kind="binary", positive="spam")
RUBRIC = "Spam: unsolicited advertising or scams. Everything else is ham."
KEY = "sk-test-Zq8RELABELSECRET41"


def items(n: int) -> list[Example]:
    return [Example(id=str(i), text=f"message number {i}", label="ham") for i in range(n)]


def endpoint(url: str, **kw) -> EndpointJudge:
    spec = JudgeSpec(url, model="judge-1", **{"backoff_s": 0.01, "timeout_s": 5.0, **kw})
    return load_judge(spec, SPAM, RUBRIC)


def by_text(body: dict) -> str:
    """Fake judge: 'spam' for even message numbers, with confidence 0.9."""
    text = next(m["content"] for m in body["messages"] if m["role"] == "user")
    label = "spam" if int(text.split()[-1]) % 2 == 0 else "ham"
    return f"<answer>{label}</answer>\n<confidence>0.9</confidence>"


# --- parsing -----------------------------------------------------------------------------

@pytest.mark.parametrize(
    "reply, expected",
    [
        ("<answer>spam</answer><confidence>0.8</confidence>", ("spam", 0.8, "ok")),
        ("  <confidence>0.25</confidence>\n<answer> Ham </answer>\n", ("ham", 0.25, "ok")),
        ("<answer>spam</answer>", ("spam", None, "no_confidence")),
        ("<answer>spam</answer><confidence>80%</confidence>", ("spam", None, "no_confidence")),
        ("<answer>spam</answer><confidence>1.5</confidence>", ("spam", None, "no_confidence")),
        ("<answer>spam</answer><confidence>nan</confidence>", ("spam", None, "no_confidence")),
        ("<answer>spam</answer><confidence>0.8</confidence><confidence>0.9</confidence>", ("spam", None, "no_confidence")),
        ("The answer is <answer>spam</answer><confidence>0.8</confidence>", (None, None, "unparseable")),
        ("<answer>eggs</answer><confidence>0.8</confidence>", (None, None, "unparseable")),
        ("<answer>spam</answer><answer>ham</answer><confidence>0.8</confidence>", (None, None, "unparseable")),
        ("spam, 0.8", (None, None, "unparseable")),
        ("", (None, None, "unparseable")),
    ],
)
def test_parse_judgement_is_strict(reply, expected):
    verdict = parse_judgement(reply, SPAM)
    assert (verdict.label, verdict.confidence, verdict.status) == expected
    assert verdict.raw == reply  # what the judge said is kept verbatim


def test_verdict_is_a_label_confidence_raw_triple():
    label, confidence, raw = Verdict("spam", 0.7, "x")
    assert (label, confidence, raw) == ("spam", 0.7, "x")


def test_endpoint_messages_state_labels_format_and_rubric():
    messages = endpoint_messages(Example(id="1", text="WIN NOW", label="ham"), SPAM, RUBRIC)
    system, user = messages
    assert system["role"] == "system" and user == {"role": "user", "content": "WIN NOW"}
    assert "The possible labels are: ham, spam." in system["content"]
    assert "<answer>ham</answer><confidence>0.8</confidence>" in system["content"]
    assert system["content"].endswith("Labelling rules:\n" + RUBRIC)


def test_endpoint_messages_without_rubric_have_no_rules_section():
    (system, _) = endpoint_messages(Example(id="1", text="hi", label="ham"), SPAM, None)
    assert "Labelling rules" not in system["content"] and system["content"].endswith("Write nothing else.")


# --- specs and URLs ----------------------------------------------------------------------

def test_chat_url_appends_the_chat_completions_path():
    assert chat_url("http://127.0.0.1:8000/v1") == "http://127.0.0.1:8000/v1/chat/completions"
    assert chat_url("http://h:1/v1/") == "http://h:1/v1/chat/completions"
    assert chat_url("https://h/v1/chat/completions") == "https://h/v1/chat/completions"


def test_chat_url_refuses_credentials_without_echoing_them():
    with pytest.raises(ValueError) as info:
        chat_url("http://user:hunter2@host:8000/v1")
    assert "--api-key-env" in str(info.value) and "hunter2" not in str(info.value)


@pytest.mark.parametrize(
    "spec, message",
    [
        (JudgeSpec("http://h:1/v1"), "needs the name of the model it serves; give --judge-model NAME"),
        (JudgeSpec("tiny-random", model="x"), "only endpoint judges take a model name"),
        (JudgeSpec("http://h:1/v1", model="m", concurrency=0), "--concurrency 0: must be 1 or more"),
        (JudgeSpec("http://h:1/v1", model="m", timeout_s=0), "--timeout 0"),
        (JudgeSpec("http://h:1/v1", model="m", retries=-1), "--retries -1"),
        (JudgeSpec("http://h:1/v1", flag="--adjudicator"), "give --adjudicator-model NAME"),
    ],
)
def test_spec_check_names_option_rule_and_fix(spec, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        spec.check()


def test_unknown_local_spec_is_a_value_error():
    with pytest.raises(ValueError, match="neither a built-in model"):
        load_judge(JudgeSpec("no-such-model-xyz"), SPAM, RUBRIC)


# --- sampling ----------------------------------------------------------------------------

def test_draw_label_inverts_the_cdf():
    # cumulative: 0.2, 1.0 → u < 0.2 picks 0, else 1
    assert [draw_label([0.2, 0.8], u) for u in (0.0, 0.19, 0.2, 0.99)] == [0, 0, 1, 1]
    assert draw_label([0.5, 0.4999999], 0.9999999999) == 1  # rounding short of 1 still picks a label


def test_item_uniform_depends_on_seed_and_id_only(fresh_process):
    # a second run, in another interpreter with another hash seed, draws the same number
    assert fresh_process(item_uniform, 3, "item-17") == item_uniform(3, "item-17")
    assert item_uniform(3, "a") != item_uniform(4, "a") and item_uniform(3, "a") != item_uniform(3, "b")
    draws = [draw_label([0.3, 0.7], item_uniform(0, str(i))) for i in range(4000)]
    assert abs(sum(draws) / len(draws) - 0.7) < 0.03  # 3 sd of a binomial share at n=4000 is 0.022


# --- endpoint judge ----------------------------------------------------------------------

def test_endpoint_labels_in_item_order_with_bounded_concurrency():
    # Item 0 is slow: one worker holds it while the other answers items 1-5, so completion
    # order differs from item order and two requests are in flight most of the time.
    slow_first = lambda i, body: 1.5 if body["messages"][-1]["content"].endswith(" 0") else 0.02  # noqa: E731
    with FakeOpenAIServer(by_text, delays=slow_first) as server:
        judge = endpoint(server.url, concurrency=2)
        seen = []
        verdicts = judge.label(items(6), on_result=lambda i, v: seen.append(i))
    assert [v.label for v in verdicts] == ["spam", "ham"] * 3
    assert all(v.confidence == 0.9 for v in verdicts)
    assert seen == [1, 2, 3, 4, 5, 0]
    assert server.max_in_flight == 2
    body = server.requests[0].body
    assert body["model"] == "judge-1" and body["temperature"] == 0.0 and "seed" not in body
    assert server.requests[0].path == "/v1/chat/completions"
    assert judge.stats == {"requests": 6, "retries": 0}


def test_sampled_pass_sends_seed_and_sampling_temperature():
    with FakeOpenAIServer(by_text) as server:
        endpoint(server.url).label(items(1), sample_seed=7)
    assert server.requests[0].body["seed"] == 7 and server.requests[0].body["temperature"] == 1.0


def test_timeout_then_success_on_retry():
    # Call 0 sleeps past the 0.5 s timeout; the retry (call 1) answers at once.
    with FakeOpenAIServer(by_text, delays={0: 2.0}) as server:
        judge = endpoint(server.url, timeout_s=0.5, retries=2)
        start = time.monotonic()
        (verdict,) = judge.label(items(1))
        elapsed = time.monotonic() - start
    assert verdict.label == "spam"
    assert judge.stats == {"requests": 2, "retries": 1}
    assert 0.5 <= elapsed < 2.0  # waited for the timeout, not for the slow reply
    assert [r.user_text for r in server.requests] == ["message number 0"] * 2


def test_timeouts_exhaust_the_retries():
    with FakeOpenAIServer(by_text, delays=lambda i, body: 1.0) as server:
        judge = endpoint(server.url, timeout_s=0.2, retries=1)
        with pytest.raises(JudgeError, match=r"timed out \(no reply within --timeout 0.2 s\) \(2 attempts\); raise --timeout"):
            judge.label(items(1))


def test_connection_refused_is_retried_then_reported():
    judge = endpoint(f"http://127.0.0.1:{free_port()}/v1", retries=2)
    with pytest.raises(JudgeError, match=r"--judge endpoint http://127.0.0.1:\d+/v1/chat/completions refused the connection \(3 attempts\)"):
        judge.label(items(1))
    assert judge.stats == {"requests": 3, "retries": 2}


def test_server_errors_back_off_exponentially_then_succeed():
    with FakeOpenAIServer(by_text, fail_calls={0, 1, 2}, fail_status=503) as server:
        judge = endpoint(server.url, retries=3, backoff_s=0.1)
        (verdict,) = judge.label(items(1))
        times = [r.time for r in server.requests]
    assert verdict.label == "spam" and len(times) == 4
    gaps = [b - a for a, b in zip(times, times[1:])]
    # delay before retry a (1-based) is 0.1·2^(a−1) times a factor in [0.5, 1]: ≥ 0.05, 0.1, 0.2
    for gap, least in zip(gaps, (0.05, 0.1, 0.2)):
        assert gap >= least - 0.01


def test_client_errors_are_not_retried_and_the_key_is_redacted(monkeypatch):
    monkeypatch.setenv("LABELRL_API_KEY", KEY)
    # A hostile or careless server that echoes the Authorization header in its error body.
    echo = lambda headers: json.dumps({"error": f"bad key {headers.get('Authorization')}"})  # noqa: E731
    with FakeOpenAIServer(by_text, fail_calls={0}, fail_status=401, fail_body=echo) as server:
        judge = endpoint(server.url, retries=3)
        with pytest.raises(JudgeError) as info:
            judge.label(items(1))
    assert len(server.requests) == 1  # 401 is final: no retry
    assert server.requests[0].headers["Authorization"] == f"Bearer {KEY}"
    message = str(info.value)
    assert "HTTP 401" in message and "bad key Bearer ***" in message and "$LABELRL_API_KEY" in message
    assert KEY not in message and KEY not in repr(judge) and KEY not in judge.name


def test_no_authorization_header_without_a_key(monkeypatch):
    monkeypatch.delenv("LABELRL_API_KEY", raising=False)
    with FakeOpenAIServer(by_text) as server:
        endpoint(server.url).label(items(1))
    assert "Authorization" not in server.requests[0].headers


def test_a_reply_that_is_not_json_is_an_error():
    with FakeOpenAIServer(reply_body=b"<html>proxy login</html>") as server:
        with pytest.raises(JudgeError, match="not JSON"):
            endpoint(server.url).label(items(1))


def test_a_dead_server_stops_the_batch_but_keeps_answers_already_given():
    with FakeOpenAIServer(by_text, fail_after=3) as server:
        judge = endpoint(server.url, concurrency=1, retries=0)
        saved = {}
        with pytest.raises(JudgeError, match="HTTP 503"):
            judge.label(items(8), on_result=lambda i, v: saved.setdefault(i, v))
    assert sorted(saved) == [0, 1, 2]
    assert len(server.requests) == 4  # the 4th failed; the other 4 were cancelled, never sent


def test_endpoint_generate_returns_the_reply_text():
    with FakeOpenAIServer("hello there") as server:
        text = endpoint(server.url).generate([{"role": "user", "content": "hi"}], max_new_tokens=9, seed=1)
    assert text == "hello there"
    assert server.requests[0].body["max_tokens"] == 9 and server.requests[0].body["seed"] == 1


# --- local judge (tiny-random) -----------------------------------------------------------

@pytest.fixture(scope="module")
def local_judge():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return load_judge(JudgeSpec("tiny-random", batch_size=3), SPAM, RUBRIC)


def test_local_judge_gives_most_probable_label_and_its_probability(local_judge):
    verdicts = local_judge.label(items(5))
    assert len(verdicts) == 5 and local_judge.kind == "local" and local_judge.name == "local:tiny-random"
    for v in verdicts:
        probs = json.loads(v.raw)
        assert set(probs) == {"ham", "spam"} and sum(probs.values()) == pytest.approx(1.0, abs=1e-5)
        assert v.label == max(probs, key=probs.get)
        assert v.confidence == pytest.approx(probs[v.label], abs=1e-6) and v.confidence >= 0.5


def test_local_judge_prompt_holds_the_rubric(local_judge):
    (ids,) = local_judge.prompt_ids(items(1))
    text = local_judge.tokenizer.decode(ids)
    assert "Labelling rules:\n" + RUBRIC in text and "message number 0" in text


def test_local_sampled_pass_is_seeded_per_item(local_judge):
    batch = items(7)
    first = local_judge.label(batch, sample_seed=11)
    again = local_judge.label(batch[3:], sample_seed=11)  # other batch boundaries, same items
    assert [v.label for v in first[3:]] == [v.label for v in again]
    for v in first:
        assert v.confidence == pytest.approx(json.loads(v.raw)[v.label], abs=1e-6)
    # Draws follow the item's own uniform number through the inverse CDF.
    for ex, v in zip(batch, first):
        probs = json.loads(v.raw)
        assert v.label == ("ham", "spam")[draw_label([probs["ham"], probs["spam"]], item_uniform(11, ex.id))]


def test_local_generate_is_greedy_at_temperature_zero(local_judge):
    import torch

    from labelrl.data.prompts import render_prompt

    messages = [{"role": "user", "content": "hi"}]
    text = local_judge.generate(messages, max_new_tokens=4)
    # greedy by hand: the most probable next token, four times (or until the end token)
    tokenizer, model = local_judge.tokenizer, local_judge.model
    ids = tokenizer(render_prompt(tokenizer, messages), add_special_tokens=False, return_tensors="pt")["input_ids"]
    start = ids.shape[1]
    with torch.no_grad():
        for _ in range(4):
            token = model(input_ids=ids).logits[0, -1].argmax()
            ids = torch.cat([ids, token.view(1, 1)], dim=1)
            if int(token) == tokenizer.eos_token_id:
                break
    assert isinstance(text, str)
    assert text == tokenizer.decode(ids[0, start:], skip_special_tokens=True)
