"""Judges: models that apply a written rubric to items and say which label each gets, and how sure.

A judge is named by a SPEC string (``JudgeSpec.spec``):

- **local**: anything ``labelrl.models.load_model`` takes (``tiny-random``, a model directory,
  ...). The rubric goes into the system prompt (``labelrl.data.prompts.render_messages``, direct
  mode) and the label's probability comes from the label tokens after ``<answer>``
  (``labelrl.evaluate.score.score_labels``): the label is the most probable one and the
  confidence is its probability. No text is generated, so nothing can fail to parse.
- **endpoint** (:mod:`labelrl.audit.endpoint`): ``http(s)://HOST:PORT/v1`` with
  ``JudgeSpec.model`` naming the served model: an OpenAI-compatible chat-completions API. The judge is asked for ``<answer>LABEL</answer>``
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

The shared types (``JudgeSpec``, ``Verdict``, ``Judge``, ``JudgeError``) live in
:mod:`labelrl.audit.judge_types`; every public name is importable from here.
"""

from __future__ import annotations

import json
import zlib
from typing import Sequence

import numpy as np

from labelrl.audit.endpoint import (
    CONFIDENCE_CLOSE,
    CONFIDENCE_OPEN,
    EndpointJudge,
    chat_url,
    endpoint_messages,
    parse_judgement,
)
from labelrl.audit.judge_types import (
    DEFAULT_API_KEY_ENV,
    Judge,
    JudgeError,
    JudgeSpec,
    OnResult,
    Verdict,
)
from labelrl.data.prompts import check_labels_expressible, render_messages, render_prompt
from labelrl.types import Example, LabelSpace

__all__ = [
    "CONFIDENCE_CLOSE",
    "CONFIDENCE_OPEN",
    "DEFAULT_API_KEY_ENV",
    "EndpointJudge",
    "Judge",
    "JudgeError",
    "JudgeSpec",
    "LocalJudge",
    "OnResult",
    "Verdict",
    "chat_url",
    "draw_label",
    "endpoint_messages",
    "item_uniform",
    "load_judge",
    "parse_judgement",
]


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
        from labelrl.models.precision import resolve_dtype

        self.name = f"local:{spec.spec}"
        self.model, self.tokenizer = load_model(spec.spec)
        self.model.requires_grad_(False)  # a judge never trains; frozen weights keep their packed copy
        self.dtype = resolve_dtype(spec.precision, next(self.model.parameters()).device)

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
            probs = score_labels(self.model, self.tokenizer, self.prompt_ids(chunk), self.labels, batch_size=step,
                                 dtype=self.dtype)
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

        from labelrl.models.precision import compute

        text = render_prompt(self.tokenizer, messages)
        ids = self.tokenizer(text, add_special_tokens=False, return_tensors="pt")
        sampling = {"do_sample": True, "temperature": temperature} if temperature > 0 else {"do_sample": False}
        with torch.random.fork_rng(devices=[]), torch.inference_mode(), compute(self.model, self.dtype):
            if seed is not None:
                torch.manual_seed(seed)
            out = self.model.generate(
                **ids, max_new_tokens=max_new_tokens, pad_token_id=self.tokenizer.pad_token_id, **sampling
            )
        return self.tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
