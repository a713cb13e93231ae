"""Judges: models that apply a written rubric to items and say which label each gets, and how sure.

A judge is named by a SPEC string (``JudgeSpec.spec``):

- **local**: anything ``labelrl.models.load_model`` takes (``tiny-random``, a model directory,
  ...). The rubric goes into the system prompt (``labelrl.data.prompts.render_messages``, direct
  mode) and the label's probability comes from the label tokens after ``<answer>``
  (``labelrl.evaluate.score.score_labels``): the label is the most probable one and the
  confidence is its probability. No text is generated, so nothing can fail to parse.
- **endpoint**: ``http(s)://HOST:PORT/v1`` with ``JudgeSpec.model`` naming the served model: an
  OpenAI-compatible chat-completions API. The judge is asked for ``<answer>LABEL</answer>``
  followed by ``<confidence>P</confidence>`` (P in [0, 1]), and the reply is parsed strictly
  (``parse_judgement``): an unparseable reply is recorded with label None, never guessed.
  Calls have a timeout, bounded retries with exponential backoff and jitter, and run on a
  thread pool of ``concurrency`` workers. The API key is read from the environment variable
  named by ``api_key_env`` and is never logged, saved or shown in an error.

``Judge.label(items, sample_seed=None)`` gives each item the judge's standard answer (local:
the most probable label; endpoint: one request at ``temperature``). With an integer
``sample_seed`` it gives an independent, seeded *sample* instead (local: a label drawn from the
judge's label distribution at temperature 1; endpoint: a request at ``sample_temperature`` with
``seed``), which the relabel pipeline uses to measure the judge's self-agreement.
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
import zlib
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Callable, NamedTuple, Protocol, Sequence

import numpy as np

from labelrl.data.prompts import (
    ANSWER_PREFIX,
    ANSWER_SUFFIX,
    DEFAULT_INSTRUCTION,
    check_labels_expressible,
    render_messages,
    render_prompt,
)
from labelrl.rewards.parse import parse_answer
from labelrl.types import Example, LabelSpace

CONFIDENCE_OPEN = "<confidence>"
CONFIDENCE_CLOSE = "</confidence>"
_CONFIDENCE = re.compile(re.escape(CONFIDENCE_OPEN) + r"(.*?)" + re.escape(CONFIDENCE_CLOSE), re.S)
DEFAULT_API_KEY_ENV = "LABELRL_API_KEY"


class Verdict(NamedTuple):
    """One judgement: ``(label, confidence, raw)``.

    label       the declared spelling of the label, or None when the reply did not parse
    confidence  in [0, 1], or None when the reply gave no valid confidence
    raw         what the judge said: the reply text (endpoint) or the label probabilities
                as JSON (local)
    """

    label: str | None
    confidence: float | None
    raw: str

    @property
    def status(self) -> str:
        """``ok``, ``unparseable`` (no valid label) or ``no_confidence`` (label, no valid confidence)."""
        if self.label is None:
            return "unparseable"
        return "ok" if self.confidence is not None else "no_confidence"


OnResult = Callable[[int, Verdict], None]


class Judge(Protocol):
    """What the relabel pipeline (and ``labelrl distill``'s teacher) needs from a judge.

    ``name`` identifies the judge in provenance records (never holds a secret); ``kind`` is
    ``"local"`` or ``"endpoint"``. ``label`` returns one Verdict per item, in item order, and
    calls ``on_result(index, verdict)`` as each one is known (in the caller's thread), so the
    caller can save progress before the whole batch is done. ``generate`` answers a chat.
    """

    name: str
    kind: str

    def label(
        self, items: Sequence[Example], *, sample_seed: int | None = None, on_result: OnResult | None = None
    ) -> list[Verdict]: ...

    def generate(
        self, messages: list[dict[str, str]], *, max_new_tokens: int = 256, temperature: float = 0.0,
        seed: int | None = None,
    ) -> str: ...


class JudgeError(RuntimeError):
    """A judge could not answer (endpoint refused, timed out, or replied with an error)."""


@dataclass(frozen=True)
class JudgeSpec:
    """How to build a judge; ``flag`` names the command-line option in error messages.

    ``timeout_s`` bounds each socket operation of one request; ``retries`` is the number of
    further attempts after a failed one; ``backoff_s`` the delay before the first retry
    (doubled for each later one, capped at ``backoff_cap_s``, times a random factor in
    [0.5, 1]). ``max_tokens`` caps an endpoint's reply to a labelling request; ``batch_size``
    is the local model's forward batch.
    """

    spec: str
    model: str | None = None
    api_key_env: str = DEFAULT_API_KEY_ENV
    timeout_s: float = 30.0
    retries: int = 3
    concurrency: int = 4
    backoff_s: float = 0.5
    backoff_cap_s: float = 8.0
    temperature: float = 0.0
    sample_temperature: float = 1.0
    max_tokens: int = 64
    batch_size: int = 16
    flag: str = "--judge"

    @property
    def is_endpoint(self) -> bool:
        return self.spec.startswith(("http://", "https://"))

    def check(self) -> None:
        """ValueError naming the option, the rule and the fix for any unusable setting."""
        if not self.spec.strip():
            raise ValueError(f"{self.flag} '': give a local model (e.g. tiny-random) or an endpoint URL http://HOST:PORT/v1")
        if self.is_endpoint and not self.model:
            raise ValueError(
                f"{self.flag} {self.spec}: an endpoint judge needs the name of the model it serves; "
                f"give {self.flag}-model NAME"
            )
        if not self.is_endpoint and self.model:
            raise ValueError(
                f"{self.flag}-model {self.model}: only endpoint judges take a model name; a local judge's "
                f"model is {self.flag} itself ({self.spec!r}), so drop {self.flag}-model"
            )
        if not self.timeout_s > 0:
            raise ValueError(f"--timeout {self.timeout_s}: must be more than 0 seconds")
        if not self.backoff_s >= 0:
            raise ValueError(f"--backoff {self.backoff_s}: must be 0 seconds or more")
        if self.retries < 0:
            raise ValueError(f"--retries {self.retries}: must be 0 or more (0 = no retry)")
        if self.concurrency < 1:
            raise ValueError(f"--concurrency {self.concurrency}: must be 1 or more requests at a time")
        if self.temperature < 0 or self.sample_temperature <= 0:
            raise ValueError(
                f"temperature={self.temperature}, sample_temperature={self.sample_temperature}: the first "
                "must be 0 or more and the sampling one more than 0"
            )


def load_judge(spec: JudgeSpec, labels: LabelSpace, rubric: str | None) -> Judge:
    """Build the judge ``spec`` names, for the task ``labels`` under ``rubric`` (None: no rubric).

    Loads the model for a local spec (ValueError from ``load_model`` for an unknown one); an
    endpoint is not contacted until the first request.
    """
    spec.check()
    check_labels_expressible(labels)
    if spec.is_endpoint:
        return EndpointJudge(spec, labels, rubric)
    return LocalJudge(spec, labels, rubric)


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


def item_uniform(seed: int, item_id: str) -> float:
    """A uniform number in [0, 1) fixed by (seed, item id): the same item draws the same
    sample in every run, whatever else is in the batch (so a resumed run repeats it)."""
    return float(np.random.default_rng([seed & 0xFFFFFFFF, zlib.crc32(item_id.encode("utf-8"))]).random())


def draw_label(probs: Sequence[float], u: float) -> int:
    """Inverse-CDF draw: the first index whose cumulative probability exceeds ``u``."""
    total = 0.0
    for k, p in enumerate(probs):
        total += p
        if u < total:
            return k
    return len(probs) - 1  # rounding left the sum a hair below 1


class LocalJudge:
    """A local causal LM judging by label-token probabilities (see the module docstring)."""

    kind = "local"

    def __init__(self, spec: JudgeSpec, labels: LabelSpace, rubric: str | None) -> None:
        from labelrl.models import load_model

        self.spec = spec
        self.labels = labels
        self.rubric = rubric
        self.name = f"local:{spec.spec}"
        self.model, self.tokenizer = load_model(spec.spec)

    def prompt_ids(self, items: Sequence[Example]) -> list[list[int]]:
        out = []
        for example in items:
            messages = render_messages(example, labels=self.labels, mode="direct", rubric=self.rubric)
            text = render_prompt(self.tokenizer, messages)
            out.append(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        return out

    def label(
        self, items: Sequence[Example], *, sample_seed: int | None = None, on_result: OnResult | None = None
    ) -> list[Verdict]:
        """Most probable label and its probability; with ``sample_seed``, a seeded draw from the
        label distribution (temperature 1) and the drawn label's probability."""
        from labelrl.evaluate.score import score_labels

        verdicts: list[Verdict] = []
        step = self.spec.batch_size
        for start in range(0, len(items), step):
            chunk = items[start : start + step]
            probs = score_labels(self.model, self.tokenizer, self.prompt_ids(chunk), self.labels, batch_size=step)
            for offset, (example, row) in enumerate(zip(chunk, probs.tolist())):
                if sample_seed is None:
                    k = max(range(len(row)), key=row.__getitem__)
                else:
                    k = draw_label(row, item_uniform(sample_seed, example.id))
                raw = json.dumps({name: round(p, 6) for name, p in zip(self.labels.labels, row)})
                verdict = Verdict(self.labels.labels[k], float(row[k]), raw)
                verdicts.append(verdict)
                if on_result is not None:
                    on_result(start + offset, verdict)
        return verdicts

    def generate(
        self, messages: list[dict[str, str]], *, max_new_tokens: int = 256, temperature: float = 0.0,
        seed: int | None = None,
    ) -> str:
        """The model's reply to ``messages`` (greedy at temperature 0, else sampled; ``seed`` fixes it)."""
        import torch

        text = render_prompt(self.tokenizer, messages)
        ids = self.tokenizer(text, add_special_tokens=False, return_tensors="pt")
        sampling = {"do_sample": True, "temperature": temperature} if temperature > 0 else {"do_sample": False}
        with torch.random.fork_rng(devices=[]), torch.inference_mode():
            if seed is not None:
                torch.manual_seed(seed)
            out = self.model.generate(
                **ids, max_new_tokens=max_new_tokens, pad_token_id=self.tokenizer.pad_token_id, **sampling
            )
        return self.tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)


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
        return self._chat(messages, temperature, max_new_tokens, seed, threading.Event())

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
