"""The endpoint judge: an OpenAI-compatible chat-completions API applying the rubric.

``JudgeSpec.spec`` is ``http(s)://HOST:PORT/v1`` and ``JudgeSpec.model`` names the served model.
The judge is asked for ``<answer>LABEL</answer>`` followed by ``<confidence>P</confidence>``
(P in [0, 1]; ``endpoint_messages``), and the reply is parsed strictly (``parse_judgement``): an
unparseable reply is recorded with label None, never guessed. Calls have a timeout, bounded
retries with exponential backoff and jitter, and run on a thread pool of ``concurrency``
workers. The API key is read from the environment variable named by ``api_key_env`` and is
never logged, saved or shown in an error.

What real servers do, and what the client makes of it (observed against vLLM 0.32's server):

- a refused connection, a dropped connection (a server killed mid-request), a timeout, HTTP 429
  and HTTP 5xx are retried with backoff; when the server stays down the error names the
  endpoint, what happened, the number of attempts and the fix;
- an error body ``{"error": {"message": …}}`` (OpenAI, vLLM), ``{"error": "…"}``,
  ``{"message": …}`` or FastAPI's ``{"detail": …}`` is shown by its message, not as raw JSON;
- HTTP 404 for a model name the server does not serve (vLLM names a model by its path unless
  started with ``--served-model-name``, and hides that path in its error): the client asks
  ``GET …/models`` and names the models the server does serve;
- HTTP 400 for a reply cap or prompt beyond the server's context: the hint names the cap;
- a server that refuses ``max_tokens`` and asks for ``max_completion_tokens`` (OpenAI's
  reasoning models) is asked again with that field, once, and keeps it for later requests;
- requests say ``"stream": false``; the server's chat template renders the messages;
- a reply whose reasoning a server's reasoning parser split off into ``message.reasoning``
  (vLLM; ``reasoning_content`` elsewhere) comes back from ``generate`` with it put back as
  ``<think>…</think>`` before the answer, as the model wrote it.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import random
import re
import threading
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Sequence

from labelrl.audit.judge_types import JudgeError, JudgeSpec, OnResult, Verdict
from labelrl.data.prompts import ANSWER_PREFIX, ANSWER_SUFFIX, DEFAULT_INSTRUCTION
from labelrl.rewards.parse import parse_answer
from labelrl.types import Example, LabelSpace

CONFIDENCE_OPEN = "<confidence>"
CONFIDENCE_CLOSE = "</confidence>"
_CONFIDENCE = re.compile(re.escape(CONFIDENCE_OPEN) + r"(.*?)" + re.escape(CONFIDENCE_CLOSE), re.S)


def endpoint_messages(example: Example, labels: LabelSpace, rubric: str | None) -> list[dict[str, str]]:
    """Chat messages asking an endpoint for a label and a stated confidence.

    System: the annotator instruction, the labels (ordered grades for ordinal tasks), the
    reply format, then the rubric (when given) under "Labelling rules:". User: the item text.
    """
    names = ", ".join(labels.labels)
    label_line = (
        f"The labels are ordered grades, from lowest to highest: {names}."
        if labels.kind == "ordinal" else f"The possible labels are: {names}."
    )
    example_reply = f"{ANSWER_PREFIX}{labels.labels[0]}{ANSWER_SUFFIX}{CONFIDENCE_OPEN}0.8{CONFIDENCE_CLOSE}"
    format_line = (
        "Reply with the label inside answer tags, then the probability (a number from 0 to 1) that "
        f"your label is correct inside confidence tags, for example: {example_reply}. Write nothing else."
    )
    parts = [DEFAULT_INSTRUCTION, label_line, format_line]
    if rubric and rubric.strip():
        parts.append("Labelling rules:\n" + rubric.strip())
    system = "\n\n".join(parts)
    return [{"role": "system", "content": system}, {"role": "user", "content": example.text}]


def parse_judgement(text: str, labels: LabelSpace) -> Verdict:
    """A reply ``<answer>LABEL</answer><confidence>P</confidence>`` → Verdict, strictly.

    The confidence block is taken out first and the rest must pass ``parse_answer`` in strict
    direct mode (one answer block, nothing but whitespace around it), else label None. The
    confidence must be exactly one block holding a plain number in [0, 1] ("0.8"; not "80%"),
    else confidence None: a label without a usable confidence is kept but counts as not
    confident. ``raw`` is the reply as given.
    """
    text = text if isinstance(text, str) else ""
    blocks = _CONFIDENCE.findall(text)
    parsed = parse_answer(_CONFIDENCE.sub("", text), reasoning=False, mode="strict", labels=labels)
    if not parsed.ok:
        return Verdict(None, None, text)
    confidence = None
    if len(blocks) == 1:
        try:
            value = float(blocks[0].strip())
        except ValueError:
            value = math.nan
        if 0.0 <= value <= 1.0:
            confidence = value
    return Verdict(parsed.answer, confidence, text)


class _Stopped(Exception):
    """A worker gave up an item because another request had already failed for good."""


class _Refused(Exception):
    """The server answered a non-retryable HTTP error: ``status`` and its ``message``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class _Retryable(Exception):
    """A failed request worth repeating: ``reason`` says what happened, ``fix`` what to do."""

    def __init__(self, reason: str, fix: str) -> None:
        super().__init__(reason)
        self.reason, self.fix = reason, fix


def chat_url(spec: str, flag: str = "--judge") -> str:
    """The chat-completions URL for an endpoint SPEC (``…/v1`` gets ``/chat/completions``)."""
    parts = urllib.parse.urlsplit(spec)
    if parts.username or parts.password:
        # The URL is not echoed: it holds a credential.
        raise ValueError(
            f"{flag}: the URL holds credentials (user:password@host); remove them and put the API key "
            "in the environment variable named by --api-key-env"
        )
    if not parts.hostname:
        raise ValueError(f"{flag} {spec}: not a URL with a host; give http://HOST:PORT/v1")
    path = parts.path.rstrip("/")
    if not path.endswith("/chat/completions"):
        path += "/chat/completions"
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


class EndpointJudge:
    """An OpenAI-compatible chat-completions endpoint as judge (see the module docstring)."""

    kind = "endpoint"

    def __init__(self, spec: JudgeSpec, labels: LabelSpace, rubric: str | None) -> None:
        self.spec = spec
        self.labels = labels
        self.rubric = rubric
        self.url = chat_url(spec.spec, spec.flag)
        # Shown in names and messages without its query string, which some services use for keys.
        self.shown_url = self.url.split("?", 1)[0]
        self.name = f"endpoint:{self.shown_url} model={spec.model}"
        self._api_key = os.environ.get(spec.api_key_env, "").strip() or None
        self._lock = threading.Lock()
        self.stats = {"requests": 0, "retries": 0}
        # The request field that caps the reply: "max_completion_tokens" once a server refused
        # "max_tokens" (see _chat).
        self._cap_field = "max_tokens"

    def __repr__(self) -> str:
        return f"EndpointJudge({self.name!r})"

    def label(
        self, items: Sequence[Example], *, sample_seed: int | None = None, on_result: OnResult | None = None
    ) -> list[Verdict]:
        """Ask for every item on a pool of ``concurrency`` threads.

        The first request that fails for good stops the run: queued items are cancelled,
        retries in flight give up, answers already received are still passed to ``on_result``,
        then the JudgeError is raised.
        """
        verdicts: list[Verdict | None] = [None] * len(items)
        if not items:
            return []
        stop = threading.Event()
        pool = ThreadPoolExecutor(max_workers=min(self.spec.concurrency, len(items)), thread_name_prefix="judge")
        futures = {pool.submit(self._judge_one, ex, sample_seed, stop): i for i, ex in enumerate(items)}
        error: JudgeError | None = None
        try:
            for future in as_completed(futures):
                if future.cancelled():
                    continue
                try:
                    verdict = future.result()
                except _Stopped:
                    continue
                except JudgeError as exc:
                    error = error or exc
                    stop.set()
                    for other in futures:
                        other.cancel()
                    continue
                verdicts[futures[future]] = verdict
                if on_result is not None:
                    on_result(futures[future], verdict)
        except BaseException:
            stop.set()
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown(wait=True)
        if error is not None:
            raise error
        return verdicts  # type: ignore[return-value]

    def generate(
        self, messages: list[dict[str, str]], *, max_new_tokens: int = 256, temperature: float = 0.0,
        seed: int | None = None,
    ) -> str:
        """The endpoint's reply to ``messages`` (``seed`` is sent when given); reasoning a server
        split off (``message.reasoning``) is put back in front as ``<think>…</think>``."""
        message = self._chat(messages, temperature, max_new_tokens, seed, threading.Event())
        return self._redact(reply_text(message, with_reasoning=True))

    def _judge_one(self, example: Example, sample_seed: int | None, stop: threading.Event) -> Verdict:
        messages = endpoint_messages(example, self.labels, self.rubric)
        temperature = self.spec.temperature if sample_seed is None else self.spec.sample_temperature
        try:
            message = self._chat(messages, temperature, self.spec.max_tokens, sample_seed, stop)
        except JudgeError:
            stop.set()  # here, not in the caller: this worker must not start its next item first
            raise
        # The verdict is read from the answer alone; split-off reasoning is not part of it.
        return parse_judgement(self._redact(reply_text(message, with_reasoning=False)), self.labels)

    def _chat(self, messages: list[dict[str, str]], temperature: float, max_tokens: int,
              seed: int | None, stop: threading.Event) -> dict:
        """``choices[0].message`` of the server's reply (a dict), after retries."""
        body: dict = {"model": self.spec.model, "messages": messages, "temperature": temperature, "stream": False}
        if seed is not None:
            body["seed"] = seed
        field = self._cap_field
        try:
            reply = self._post_with_retries({**body, field: max_tokens}, stop)
        except _Refused as exc:
            if not (field == "max_tokens" and exc.status == 400 and "max_completion_tokens" in exc.message):
                raise self._refusal_error(exc, max_tokens) from None
            # OpenAI's reasoning models refuse "max_tokens" and name its successor; older servers
            # ignore "max_completion_tokens", so it is sent only to a server that asked for it.
            self._cap_field = "max_completion_tokens"
            try:
                reply = self._post_with_retries({**body, "max_completion_tokens": max_tokens}, stop)
            except _Refused as again:
                raise self._refusal_error(again, max_tokens) from None
        try:
            message = reply["choices"][0]["message"]
            if not isinstance(message, dict):
                raise TypeError
        except (KeyError, IndexError, TypeError):
            raise JudgeError(
                f"{self.spec.flag} endpoint {self.shown_url} replied without choices[0].message; "
                "give the base URL of an OpenAI-compatible chat-completions API (…/v1)"
            ) from None
        return message

    def _post_with_retries(self, body: dict, stop: threading.Event) -> dict:
        attempts, failure = self.spec.retries + 1, None
        for attempt in range(attempts):
            if attempt:
                # Exponential backoff with "equal jitter" (half fixed, half random), so that
                # workers that failed together do not retry in lockstep.
                delay = min(self.spec.backoff_cap_s, self.spec.backoff_s * 2 ** (attempt - 1))
                stop.wait(delay * random.uniform(0.5, 1.0))
            if stop.is_set():
                raise _Stopped()
            if attempt:
                with self._lock:
                    self.stats["retries"] += 1
            try:
                return self._post(body)
            except _Retryable as exc:
                failure = exc
        tries = f"{attempts} attempt{'' if attempts == 1 else 's'}"
        raise JudgeError(f"{self.spec.flag} endpoint {self.shown_url} {failure.reason} ({tries}); {failure.fix}")

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return headers

    def _post(self, body: dict) -> dict:
        request = urllib.request.Request(self.url, data=json.dumps(body).encode("utf-8"), headers=self._headers(),
                                         method="POST")
        with self._lock:
            self.stats["requests"] += 1
        timeout = (f"timed out (no reply within --timeout {self.spec.timeout_s:g} s)",
                   "raise --timeout or --retries, or check that the server is not overloaded")
        try:
            with urllib.request.urlopen(request, timeout=self.spec.timeout_s) as response:
                payload = response.read()
        except urllib.error.HTTPError as exc:
            message = self._redact(_error_body(exc))
            if exc.code == 429 or exc.code >= 500:
                raise _Retryable(f"answered HTTP {exc.code} ({message})", "the server is failing or overloaded; "
                                 "retry later or lower --concurrency") from None
            raise _Refused(exc.code, message) from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, ConnectionRefusedError):
                raise _Retryable("refused the connection", "check that the server is running and that the "
                                 "URL's host and port are right") from None
            if isinstance(exc.reason, TimeoutError):
                raise _Retryable(*timeout) from None
            raise _Retryable(f"could not be reached ({self._redact(str(exc.reason))})",
                             "check the URL and the network") from None
        except TimeoutError:
            raise _Retryable(*timeout) from None
        except (ConnectionError, http.client.HTTPException) as exc:
            raise _Retryable(f"dropped the connection ({type(exc).__name__}: the server closed it without a reply)",
                             "check the server's logs (did it stop or restart?)") from None
        try:
            return json.loads(payload)
        except ValueError:
            raise JudgeError(f"{self.spec.flag} endpoint {self.shown_url} replied with something that is not JSON "
                             f"({self._redact(payload[:120].decode('utf-8', 'replace'))!r}); "
                             "give the base URL of an OpenAI-compatible API (…/v1)") from None

    def _refusal_error(self, exc: _Refused, max_tokens: int) -> JudgeError:
        """A JudgeError for a final HTTP error: the status, the server's message and the fix."""
        flag, model = self.spec.flag, self.spec.model
        if exc.status in (401, 403):
            key = (f"the API key in ${self.spec.api_key_env}" if self._api_key
                   else f"the API key (${self.spec.api_key_env} is not set)")
            fix = f"check {key}, or give --api-key-env NAME of the variable that holds it"
        elif exc.status == 404:
            fix = self._not_found_fix()
        elif exc.status in (400, 413, 422) and _is_context_error(exc.message):
            cap = "--max-new-tokens" if flag == "--teacher" else "the judge's reply cap"
            fix = (f"the reply cap max_tokens={max_tokens} plus the prompt must fit the server's context: lower "
                   f"{cap}, or serve the model with a longer context (vLLM: --max-model-len)")
        else:
            fix = f"the server refused the request as sent; check {flag}-model {model!r} and the option its message names"
        return JudgeError(f"{flag} endpoint {self.shown_url} answered HTTP {exc.status} ({exc.message}); {fix}")

    def _not_found_fix(self) -> str:
        """The fix for HTTP 404: the models the server lists (``GET …/models``) when the one asked
        for is not among them, else a hint that the URL is not the API's base."""
        flag, model = self.spec.flag, self.spec.model
        served = self.served_models()
        if served and model not in served:
            names = ", ".join(repr(m) for m in served[:10]) + (f" and {len(served) - 10} more" if len(served) > 10 else "")
            one = "give" if len(served) == 1 else "give one of them as"
            return f"the server serves {names}, not {model!r}; {one} {flag}-model {served[0] if len(served) == 1 else 'NAME'}"
        if served:
            return f"the server serves {model!r} but has no chat-completions route here; give {flag} the API's base URL (…/v1)"
        return (f"check {flag}-model {model!r} (the name the server serves: vLLM uses the model path unless started "
                f"with --served-model-name) and that {flag} is the API's base URL (…/v1)")

    def served_models(self) -> list[str] | None:
        """The model ids ``GET {base}/models`` lists, or None when that fails (not every
        OpenAI-compatible server has it)."""
        url = self.url.split("?", 1)[0].removesuffix("/chat/completions") + "/models"
        request = urllib.request.Request(url, headers=self._headers(), method="GET")
        try:
            with urllib.request.urlopen(request, timeout=min(self.spec.timeout_s, 10.0)) as response:
                data = json.loads(response.read())["data"]
            return [self._redact(str(m["id"])) for m in data]
        except (OSError, ValueError, KeyError, TypeError, http.client.HTTPException):
            return None

    def _redact(self, text: str) -> str:
        """``text`` with the API key (should a server echo it) replaced by ``***``."""
        return text.replace(self._api_key, "***") if self._api_key else text


def reply_text(message: dict, *, with_reasoning: bool) -> str:
    """The text of a chat reply's ``message``: ``content`` (None → ""), and, when
    ``with_reasoning``, the reasoning a server's reasoning parser split off (vLLM:
    ``reasoning``; others: ``reasoning_content``) put back in front as ``<think>…</think>``
    unless the content already holds a ``<think>`` block."""
    content = message.get("content")
    content = content if isinstance(content, str) else ""
    if not with_reasoning:
        return content
    reasoning = message.get("reasoning") or message.get("reasoning_content")
    if not isinstance(reasoning, str) or not reasoning.strip() or "<think>" in content:
        return content
    return f"<think>{reasoning}</think>{content}"


def _is_context_error(message: str) -> bool:
    text = message.lower()
    return "context length" in text or "max_model_len" in text or "max_tokens" in text


def error_message(raw: str) -> str:
    """The reason in an error body, on one line: ``error.message`` (OpenAI, vLLM), ``error``
    as a string, ``message``, or FastAPI's ``detail``; the body itself when it is none of these."""
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    found = None
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict):
            found = error.get("message")
        elif isinstance(error, str):
            found = error
        if found is None:
            found = data.get("message", data.get("detail"))
    if found is None:
        found = raw
    elif not isinstance(found, str):
        found = json.dumps(found)  # FastAPI validation errors: a list of objects
    text = " ".join(found.split())
    return text[:300] + ("…" if len(text) > 300 else "")


def _error_body(exc: urllib.error.HTTPError) -> str:
    """The HTTP reason and the server's message from the error body (``error_message``)."""
    try:
        text = exc.read(4000).decode("utf-8", "replace")
    except Exception:  # the body is a courtesy: a broken one must not hide the status
        text = ""
    message = error_message(text) if text.strip() else ""
    return f"{exc.reason}: {message}" if message and message != exc.reason else str(exc.reason)
