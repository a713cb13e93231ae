"""The endpoint client against what vLLM's real OpenAI-compatible server does (reproduced by
tests/fake_openai_server.py; observed with vLLM 0.32, see tests/reliability/test_served_judge_slow.py):
model names it does not serve, error bodies, reply caps beyond its context, a connection
dropped mid-request, split-off reasoning; and OpenAI's refusal of ``max_tokens``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fake_openai_server import FakeOpenAIServer  # noqa: E402

from labelrl.audit.endpoint import error_message, reply_text  # noqa: E402
from labelrl.audit.judges import JudgeError, JudgeSpec, load_judge  # noqa: E402
from labelrl.types import Example, LabelSpace  # noqa: E402

SPAM = LabelSpace(("ham", "spam"), kind="binary", positive="spam")
SURE = "<answer>spam</answer><confidence>0.9</confidence>"
VLLM_404 = ("HTTP 404 (Not Found: The model `judge` does not exist. Valid aliases: <path>)")


def items(n: int) -> list[Example]:
    return [Example(id=str(i), text=f"message number {i}", label="ham") for i in range(n)]


def judge_at(url: str, model: str = "judge", flag: str = "--judge", **kw):
    spec = JudgeSpec(url, model=model, flag=flag, **{"backoff_s": 0.01, "timeout_s": 5.0, "retries": 2, **kw})
    return load_judge(spec, SPAM, None)


# --- model names ---------------------------------------------------------------------------

def test_a_model_the_server_does_not_serve_is_named_with_the_one_it_does():
    # vLLM serves a model by its path unless started with --served-model-name, and its 404
    # hides that path ("Valid aliases: <path>"): the fix must come from GET /v1/models.
    with FakeOpenAIServer(SURE, served_models=["smollm2"]) as server:
        with pytest.raises(JudgeError) as info:
            judge_at(server.url).label(items(1))
    message = str(info.value)
    assert f"--judge endpoint {server.url}/chat/completions answered {VLLM_404}" in message
    assert message.endswith("the server serves 'smollm2', not 'judge'; give --judge-model smollm2")
    assert len(server.requests) == 1 and server.model_lookups == 1  # a 404 is final: never retried
    assert '{"error"' not in message  # the message, not the raw JSON body


def test_several_served_models_are_listed():
    with FakeOpenAIServer(SURE, served_models=["a-7b", "b-13b"]) as server:
        with pytest.raises(JudgeError, match=r"the server serves 'a-7b', 'b-13b', not 'judge'; give one of them as "
                                             r"--teacher-model NAME$"):
            judge_at(server.url, flag="--teacher").generate([{"role": "user", "content": "hi"}])


def test_the_served_name_is_accepted():
    with FakeOpenAIServer(SURE, served_models=["smollm2"]) as server:
        (verdict,) = judge_at(server.url, model="smollm2").label(items(1))
    assert verdict.label == "spam" and server.model_lookups == 0


def test_a_base_url_without_v1_is_named_as_the_likely_cause():
    # vLLM answers a path it has no route for with FastAPI's {"detail": "Not Found"}, and then
    # has no /models beside it either.
    with FakeOpenAIServer(SURE) as server:
        base = server.url.removesuffix("/v1")
        with pytest.raises(JudgeError) as info:
            judge_at(base).label(items(1))
    message = str(info.value)
    assert "answered HTTP 404 (Not Found); check --judge-model 'judge'" in message
    assert "--served-model-name" in message and "the API's base URL (…/v1)" in message
    assert server.requests[0].path == "/chat/completions" and server.model_lookups == 1


# --- error bodies, caps, dropped connections ---------------------------------------------------

@pytest.mark.parametrize("body, expected", [
    # vLLM 0.32 (and OpenAI)
    ('{"error":{"message":"max_tokens must be at least 1, got 0.","type":"BadRequestError","param":"max_tokens",'
     '"code":400}}', "max_tokens must be at least 1, got 0."),
    ('{"error": "bad key"}', "bad key"),
    ('{"object": "error", "message": "older vLLM\\n  shape"}', "older vLLM shape"),
    ('{"detail": "Not Found"}', "Not Found"),  # FastAPI
    ('{"detail": [{"loc": ["body", "model"], "msg": "field required"}]}',
     '[{"loc": ["body", "model"], "msg": "field required"}]'),
    ("<html><body>502 Bad Gateway</body></html>", "<html><body>502 Bad Gateway</body></html>"),
])
def test_error_message_reads_the_common_error_bodies(body, expected):
    assert error_message(body) == expected


def test_error_message_is_one_bounded_line():
    text = error_message(json.dumps({"error": {"message": "word " * 200}}))
    assert "\n" not in text and len(text) == 301 and text.endswith("…")


def test_a_reply_cap_beyond_the_servers_context_names_the_cap():
    with FakeOpenAIServer(SURE, max_model_len=512) as server:
        teacher = judge_at(server.url, flag="--teacher")
        with pytest.raises(JudgeError) as info:
            teacher.generate([{"role": "user", "content": "hi"}], max_new_tokens=1000)
        assert teacher.generate([{"role": "user", "content": "hi"}], max_new_tokens=512) == SURE
    message = str(info.value)
    assert "HTTP 400 (Bad Request: max_tokens=1000 cannot be greater than max_model_len=512." in message
    assert message.endswith("the reply cap max_tokens=1000 plus the prompt must fit the server's context: lower "
                            "--max-new-tokens, or serve the model with a longer context (vLLM: --max-model-len)")
    assert len(server.requests) == 2  # the 400 was not retried


def test_a_connection_dropped_mid_request_is_retried():
    # vLLM killed while generating: the socket closes with no reply (RemoteDisconnected).
    with FakeOpenAIServer(SURE, drop_calls={0}) as server:
        judge = judge_at(server.url)
        (verdict,) = judge.label(items(1))
    assert verdict.label == "spam" and [r.status for r in server.requests] == [0, 200]
    assert judge.stats == {"requests": 2, "retries": 1}


def test_a_connection_dropped_for_good_names_the_endpoint_and_the_resume():
    with FakeOpenAIServer(SURE, drop_calls={0, 1}) as server:
        with pytest.raises(JudgeError) as info:
            judge_at(server.url, retries=1).label(items(1))
    assert str(info.value) == (
        f"--judge endpoint {server.url}/chat/completions dropped the connection (RemoteDisconnected: the server "
        "closed it without a reply) (2 attempts); check the server's logs (did it stop or restart?)")


# --- request fields ----------------------------------------------------------------------------

def test_requests_cap_with_max_tokens_and_never_stream():
    with FakeOpenAIServer(SURE) as server:
        judge_at(server.url, max_tokens=33).label(items(1))
    body = server.requests[0].body
    assert body["max_tokens"] == 33 and "max_completion_tokens" not in body and body["stream"] is False


def test_a_server_that_refuses_max_tokens_gets_max_completion_tokens_from_then_on():
    with FakeOpenAIServer(SURE, refuse_max_tokens=True) as server:
        judge = judge_at(server.url, concurrency=1, max_tokens=40)
        verdicts = judge.label(items(3))
    assert [v.label for v in verdicts] == ["spam"] * 3
    sent = [(r.status, r.body.get("max_tokens"), r.body.get("max_completion_tokens")) for r in server.requests]
    # the first request is refused and sent again with the other field; later ones use it at once
    assert sent == [(400, 40, None), (200, None, 40), (200, None, 40), (200, None, 40)]


def test_a_refusal_of_max_completion_tokens_too_is_reported():
    with FakeOpenAIServer(SURE, refuse_max_tokens=True, max_model_len=10) as server:
        with pytest.raises(JudgeError, match=r"HTTP 400 \(Bad Request: max_tokens=64 cannot be greater than "
                                             r"max_model_len=10\..*lower the judge's reply cap"):
            judge_at(server.url).label(items(1))
    assert len(server.requests) == 2


# --- split-off reasoning -----------------------------------------------------------------------

def test_reasoning_split_off_by_the_server_goes_back_into_a_teacher_reply():
    # vLLM with --reasoning-parser moves the <think> part into message.reasoning.
    replies = iter([{"content": "<answer>spam</answer>", "reasoning": "it offers a prize"},
                    {"content": None, "reasoning": "ran out of tokens while thinking"},
                    {"content": "<think>kept inline</think><answer>ham</answer>", "reasoning": "dup"},
                    {"content": "<answer>ham</answer>", "reasoning_content": "older field name"}])
    with FakeOpenAIServer(lambda body: next(replies)) as server:
        teacher = judge_at(server.url, flag="--teacher")
        texts = [teacher.generate([{"role": "user", "content": "hi"}]) for _ in range(4)]
    assert texts == ["<think>it offers a prize</think><answer>spam</answer>",
                     "<think>ran out of tokens while thinking</think>",
                     "<think>kept inline</think><answer>ham</answer>",
                     "<think>older field name</think><answer>ham</answer>"]


def test_a_judge_verdict_is_read_from_the_answer_without_the_reasoning():
    with FakeOpenAIServer(lambda body: {"content": SURE, "reasoning": "spam, <answer>ham</answer>?"}) as server:
        (verdict,) = judge_at(server.url).label(items(1))
    assert (verdict.label, verdict.confidence, verdict.raw) == ("spam", 0.9, SURE)


def test_reply_text_without_content():
    assert reply_text({"content": None}, with_reasoning=True) == ""
    assert reply_text({"content": None, "reasoning": "  "}, with_reasoning=True) == ""
    assert reply_text({"content": "x", "reasoning": "r"}, with_reasoning=False) == "x"
