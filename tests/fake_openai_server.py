"""A small OpenAI-compatible chat-completions server for tests, on 127.0.0.1 and a free port.

    with FakeOpenAIServer(answer=lambda body: "<answer>spam</answer><confidence>0.9</confidence>") as server:
        server.url            # "http://127.0.0.1:PORT/v1"
        ...
        server.requests       # every request, in arrival order (RequestLog)

Behaviour is set per call index (0-based, in arrival order): ``delays`` (seconds to wait
before answering: a mapping index → seconds, or a function of the index and the request body), ``fail_calls`` (answer ``fail_status``), ``fail_after`` (every call from
that index on fails: a server that dies mid-run), ``drop_calls`` (close the connection without
any reply, status 0 in the log: what a client sees when the server is killed mid-request),
``reply_body`` (send these bytes instead of a completion). A failing call still counts and is logged. The attributes may be changed
while the server runs (e.g. ``server.fail_after = None`` brings a dead server back).

What vLLM 0.32's OpenAI server does (observed; see tests/reliability/test_served_judge_slow.py),
reproduced here:

- only ``POST …/v1/chat/completions`` and ``GET …/v1/models`` exist; any other path answers
  404 ``{"detail": "Not Found"}`` (FastAPI's body: a base URL without ``/v1``);
- ``served_models`` (a list) makes it serve only those names: a request for another model
  answers 404 ``{"error": {"message": "The model `X` does not exist. Valid aliases: <path>",
  "type": "NotFoundError", "param": "model", "code": 404}}``, and ``GET /v1/models`` lists them
  (without it, every name is served and the list holds the one name "served-model");
- ``max_model_len`` refuses a reply cap above it with vLLM's HTTP 400 message;
- replies carry vLLM's message fields (``reasoning`` null unless ``answer`` returns a dict,
  which is the message: e.g. ``{"content": None, "reasoning": "…"}`` as a reasoning parser
  gives), ``finish_reason`` and ``usage``.

And one thing vLLM does not do but OpenAI's reasoning models do: ``refuse_max_tokens`` answers
a request carrying ``max_tokens`` with HTTP 400 "Unsupported parameter … Use
'max_completion_tokens' instead."
"""

from __future__ import annotations

import dataclasses
import json
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Mapping


@dataclass(frozen=True)
class RequestLog:
    index: int
    path: str
    headers: dict[str, str]
    body: dict
    time: float  # arrival, time.monotonic()
    status: int  # what the server answered; -1 while being served, 0 when the client hung up first

    @property
    def user_text(self) -> str:
        return next(m["content"] for m in self.body["messages"] if m["role"] == "user")

    @property
    def system_text(self) -> str:
        return next(m["content"] for m in self.body["messages"] if m["role"] == "system")


Answer = Callable[[dict], "str | dict"]
CHAT_PATH = "/v1/chat/completions"
MODELS_PATH = "/v1/models"


def free_port() -> int:
    """A port nothing listens on (bound, then released): connecting to it is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class FakeOpenAIServer:
    def __init__(
        self,
        answer: str | Answer = "<answer>ham</answer><confidence>0.9</confidence>",
        *,
        delays: Mapping[int, float] | Callable[[int, dict], float] | None = None,
        fail_calls: set[int] | frozenset[int] = frozenset(),
        fail_after: int | None = None,
        fail_status: int = 503,
        fail_body: str | Callable[[dict[str, str]], str] = '{"error": {"message": "unavailable"}}',
        reply_body: bytes | None = None,
        served_models: list[str] | None = None,
        max_model_len: int | None = None,
        refuse_max_tokens: bool = False,
        drop_calls: set[int] | frozenset[int] = frozenset(),
    ) -> None:
        self.answer = answer
        self.delays = delays
        self.fail_calls = frozenset(fail_calls)
        self.fail_after = fail_after
        self.fail_status = fail_status
        self.fail_body = fail_body
        self.reply_body = reply_body
        self.served_models = served_models
        self.max_model_len = max_model_len
        self.refuse_max_tokens = refuse_max_tokens
        self.drop_calls = frozenset(drop_calls)
        self.requests: list[RequestLog] = []
        self._lock = threading.Lock()
        self._calls = 0
        self._in_flight = 0
        self.max_in_flight = 0  # the most requests the server held at once
        self.model_lookups = 0  # GET requests (e.g. /v1/models), not in ``requests``
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def start(self) -> "FakeOpenAIServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> "FakeOpenAIServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def settle(self, quiet_s: float = 0.3, timeout_s: float = 30.0) -> int:
        """Wait until nothing is in flight and no request has arrived for ``quiet_s``; return
        the number of requests logged.

        A client killed mid-request may have sent bytes the server has not read yet: its
        request is logged a few milliseconds after the kill. A test that splits the log into
        "before the kill" and "the re-run" takes the split point from here.
        """
        deadline, last, quiet_since = time.monotonic() + timeout_s, -1, time.monotonic()
        while time.monotonic() < deadline:
            with self._lock:
                calls, in_flight = self._calls, self._in_flight
            now = time.monotonic()
            if calls != last or in_flight:
                last, quiet_since = calls, now
            elif now - quiet_since >= quiet_s:
                return calls
            time.sleep(0.01)
        raise AssertionError(f"the fake server did not settle within {timeout_s} s ({self._in_flight} in flight)")

    def answered(self) -> list[RequestLog]:
        """Requests that got a 200 completion."""
        with self._lock:
            return [r for r in self.requests if r.status == 200]

    def user_texts(self) -> list[str]:
        with self._lock:
            return [r.user_text for r in self.requests]

    def _delay(self, index: int, body: dict) -> float:
        if self.delays is None:
            return 0.0
        if callable(self.delays):
            return float(self.delays(index, body))
        return float(self.delays.get(index, 0.0))

    def _respond(self, index: int, path: str, headers: dict[str, str], body: dict) -> tuple[int, bytes]:
        failing = index in self.fail_calls or (self.fail_after is not None and index >= self.fail_after)
        if failing:
            text = self.fail_body(headers) if callable(self.fail_body) else self.fail_body
            return self.fail_status, text.encode("utf-8")
        if path != CHAT_PATH:
            return 404, b'{"detail":"Not Found"}'
        refusal = self._refusal(body)
        if refusal is not None:
            return refusal
        if self.reply_body is not None:
            return 200, self.reply_body
        content = self.answer(body) if callable(self.answer) else self.answer
        message = {"role": "assistant", "content": content, "refusal": None, "reasoning": None}
        if isinstance(content, dict):
            message.update(content)
        completion = {
            "id": f"chatcmpl-{index}",
            "object": "chat.completion",
            "model": body.get("model"),
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": "stop", "stop_reason": None}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        }
        return 200, json.dumps(completion).encode("utf-8")

    def _refusal(self, body: dict) -> tuple[int, bytes] | None:
        """vLLM's (and OpenAI's) HTTP 400/404 for a request it will not serve, else None."""
        model = body.get("model")
        if self.served_models is not None and model not in self.served_models:
            return 404, _error(f"The model `{model}` does not exist. Valid aliases: <path>", "NotFoundError", "model", 404)
        if self.refuse_max_tokens and "max_tokens" in body:
            return 400, _error("Unsupported parameter: 'max_tokens' is not supported with this model. Use "
                               "'max_completion_tokens' instead.", "invalid_request_error", "max_tokens",
                               "unsupported_parameter")
        cap = body.get("max_completion_tokens", body.get("max_tokens"))
        if self.max_model_len is not None and isinstance(cap, int) and cap > self.max_model_len:
            return 400, _error(f"max_tokens={cap} cannot be greater than max_model_len={self.max_model_len}. Please "
                               f"request fewer output tokens. (parameter=max_tokens, value={cap})", "BadRequestError",
                               "max_tokens", 400)
        return None

    def _models(self) -> bytes:
        names = self.served_models if self.served_models is not None else ["served-model"]
        data = [{"id": name, "object": "model", "owned_by": "vllm", "root": f"/models/{name}", "parent": None,
                 "max_model_len": self.max_model_len or 8192} for name in names]
        return json.dumps({"object": "list", "data": data}).encode("utf-8")

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                headers = dict(self.headers.items())
                with fake._lock:
                    index = fake._calls
                    fake._calls += 1
                    # Logged on arrival (status -1 until answered), so a request still being
                    # served when the test looks is already in the log.
                    fake.requests.append(RequestLog(index, self.path, headers, body, time.monotonic(), -1))
                    fake._in_flight += 1
                    fake.max_in_flight = max(fake.max_in_flight, fake._in_flight)
                delay = fake._delay(index, body)
                if delay:
                    time.sleep(delay)
                if index in fake.drop_calls:
                    # As vLLM's server killed mid-request: the socket closes with no reply at all.
                    with fake._lock:
                        fake._in_flight -= 1
                        fake.requests[index] = dataclasses.replace(fake.requests[index], status=0)
                    self.close_connection = True
                    return
                status, payload = fake._respond(index, self.path.split("?", 1)[0], headers, body)
                with fake._lock:
                    fake._in_flight -= 1
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    status = 0  # the client timed out and left
                with fake._lock:
                    fake.requests[index] = dataclasses.replace(fake.requests[index], status=status)

            def do_GET(self) -> None:  # noqa: N802
                # Not logged as a request: GET /v1/models is the client looking up served names.
                if self.path.split("?", 1)[0] == MODELS_PATH:
                    status, payload = 200, fake._models()
                else:
                    status, payload = 404, b'{"detail":"Not Found"}'
                with fake._lock:
                    fake.model_lookups += 1
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args) -> None:  # keep test output clean
                pass

        return Handler


def _error(message: str, kind: str, param: str | None, code: int | str) -> bytes:
    """An error body as vLLM and OpenAI write it."""
    return json.dumps({"error": {"message": message, "type": kind, "param": param, "code": code}}).encode("utf-8")
