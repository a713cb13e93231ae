"""The endpoint judge: an OpenAI-compatible chat-completions API applying the rubric.

``JudgeSpec.spec`` is ``http(s)://HOST:PORT/v1`` and ``JudgeSpec.model`` names the served model.
The judge is asked for ``<answer>LABEL</answer>`` followed by ``<confidence>P</confidence>``
(P in [0, 1]; ``endpoint_messages``), and the reply is parsed strictly (``parse_judgement``): an
unparseable reply is recorded with label None, never guessed. Calls have a timeout, bounded
retries with exponential backoff and jitter, and run on a thread pool of ``concurrency``
workers. The API key is read from the environment variable named by ``api_key_env`` and is
never logged, saved or shown in an error.
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
        """The endpoint's reply to ``messages`` (``seed`` is sent when given)."""
        return self._redact(self._chat(messages, temperature, max_new_tokens, seed, threading.Event()))

    def _judge_one(self, example: Example, sample_seed: int | None, stop: threading.Event) -> Verdict:
        messages = endpoint_messages(example, self.labels, self.rubric)
        temperature = self.spec.temperature if sample_seed is None else self.spec.sample_temperature
        try:
            reply = self._chat(messages, temperature, self.spec.max_tokens, sample_seed, stop)
        except JudgeError:
            stop.set()  # here, not in the caller: this worker must not start its next item first
            raise
        return parse_judgement(self._redact(reply), self.labels)  # the raw reply is saved

    def _chat(self, messages: list[dict[str, str]], temperature: float, max_tokens: int,
              seed: int | None, stop: threading.Event) -> str:
        body = {"model": self.spec.model, "messages": messages, "temperature": temperature, "max_tokens": max_tokens}
        if seed is not None:
            body["seed"] = seed
        reply = self._post_with_retries(body, stop)
        try:
            content = reply["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise JudgeError(
                f"{self.spec.flag} endpoint {self.shown_url} replied without choices[0].message.content; "
                "give the base URL of an OpenAI-compatible chat-completions API (…/v1)"
            ) from None
        return content if isinstance(content, str) else ""

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

    def _post(self, body: dict) -> dict:
        headers = {"Content-Type": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        request = urllib.request.Request(self.url, data=json.dumps(body).encode("utf-8"), headers=headers, method="POST")
        with self._lock:
            self.stats["requests"] += 1
        timeout = (f"timed out (no reply within --timeout {self.spec.timeout_s:g} s)",
                   "raise --timeout or --retries, or check that the server is not overloaded")
        try:
            with urllib.request.urlopen(request, timeout=self.spec.timeout_s) as response:
                payload = response.read()
        except urllib.error.HTTPError as exc:
            detail = self._redact(_error_body(exc))
            if exc.code == 429 or exc.code >= 500:
                raise _Retryable(f"answered HTTP {exc.code} ({detail})", "the server is failing or overloaded; "
                                 "retry later or lower --concurrency") from None
            key_hint = (f"the API key in ${self.spec.api_key_env}" if self._api_key
                        else f"the API key (${self.spec.api_key_env} is not set)")
            raise JudgeError(f"{self.spec.flag} endpoint {self.shown_url} answered HTTP {exc.code} ({detail}); "
                             f"check {self.spec.flag}-model {self.spec.model!r} and {key_hint}") from None
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
            raise _Retryable(f"dropped the connection ({type(exc).__name__})", "check the server's logs") from None
        try:
            return json.loads(payload)
        except ValueError:
            raise JudgeError(f"{self.spec.flag} endpoint {self.shown_url} replied with something that is not JSON "
                             f"({self._redact(payload[:120].decode('utf-8', 'replace'))!r}); "
                             "give the base URL of an OpenAI-compatible API (…/v1)") from None

    def _redact(self, text: str) -> str:
        """``text`` with the API key (should a server echo it) replaced by ``***``."""
        return text.replace(self._api_key, "***") if self._api_key else text


def _error_body(exc: urllib.error.HTTPError) -> str:
    """The start of an HTTP error's body (servers put the reason there), on one line."""
    try:
        text = exc.read(300).decode("utf-8", "replace")
    except Exception:  # the body is a courtesy: a broken one must not hide the status
        text = ""
    text = " ".join(text.split())
    return f"{exc.reason}: {text}" if text else str(exc.reason)
