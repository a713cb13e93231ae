"""The types every judge shares: the spec that names a judge, its verdicts, its errors, and the
protocol the relabel pipeline calls (see :mod:`labelrl.audit.judges`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple, Protocol, Sequence

from labelrl.types import Example

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
    precision: str = "fp32"  # a local judge's compute precision (labelrl.models.precision)

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
