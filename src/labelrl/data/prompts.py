"""Prompts and answer targets for the two answer modes.

- ``direct``: the model answers ``<answer>LABEL</answer>`` at once.
- ``reasoning``: the model writes ``<think>…</think>`` first, then ``<answer>LABEL</answer>``.

The system message states the labels, the answer format of the mode and, when given, the
labelling rubric; the user message holds the item text. The answer tag is what
``labelrl.rewards.parse_answer`` reads and what label-token scoring conditions on.
"""

from __future__ import annotations

import re
from typing import Sequence

from labelrl.types import AnswerMode, Example, LabelSpace, canonical_label

ANSWER_PREFIX = "<answer>"
ANSWER_SUFFIX = "</answer>"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
ANSWER_MODES: tuple[str, str] = ("direct", "reasoning")
DEFAULT_INSTRUCTION = "You are a careful annotator. Read the item and assign it exactly one label."

# A reasoning trace: optional whitespace, one think block, then exactly one answer tag.
_TRACE = re.compile(r"\s*<think>(?P<think>.*?)</think>\s*<answer>(?P<answer>[^<>]*)</answer>\s*", re.S)


def check_mode(mode: str) -> AnswerMode:
    if mode not in ANSWER_MODES:
        raise ValueError(f"mode={mode!r}: not an answer mode; choose 'direct' or 'reasoning'")
    return mode  # type: ignore[return-value]


def check_labels_expressible(labels: LabelSpace | Sequence[str]) -> None:
    """Every label must fit inside ``<answer>…</answer>``: non-empty after trimming, with no
    ``<``, ``>`` or line break. Raises ValueError naming the first label that does not."""
    names = labels.labels if isinstance(labels, LabelSpace) else tuple(labels)
    for label in names:
        if not str(label).strip() or any(ch in str(label) for ch in "<>\n\r"):
            raise ValueError(
                f"label {label!r}: labels are written inside <answer>...</answer>, so a label cannot be "
                "empty or contain '<', '>' or a line break; rename it in the data or declare other "
                "spellings with --labels"
            )


def _label_line(labels: LabelSpace) -> str:
    names = ", ".join(labels.labels)
    if labels.kind == "ordinal":
        return f"The labels are ordered grades, from lowest to highest: {names}."
    return f"The possible labels are: {names}."


def _format_line(labels: LabelSpace, mode: AnswerMode) -> str:
    example = f"{ANSWER_PREFIX}{labels.labels[0]}{ANSWER_SUFFIX}"
    if mode == "direct":
        return (
            f"Reply with the label only, inside answer tags, for example: {example}. "
            "Write nothing else."
        )
    return (
        f"First think step by step inside {THINK_OPEN}...{THINK_CLOSE}, then give the label inside "
        f"answer tags, for example: {THINK_OPEN}your reasoning{THINK_CLOSE} {example}. "
        "Write nothing after the answer."
    )


def render_messages(
    example: Example,
    *,
    labels: LabelSpace,
    mode: str,
    rubric: str | None = None,
    instruction: str | None = None,
) -> list[dict[str, str]]:
    """Chat messages for one item: ``[{"role": "system", ...}, {"role": "user", ...}]``.

    System message: ``instruction`` (default ``DEFAULT_INSTRUCTION``), the label line
    (ordered grades for ordinal tasks), the answer format of ``mode``, then the rubric
    under a "Labelling rules:" heading when given. User message: ``example.text``.
    """
    mode = check_mode(mode)
    check_labels_expressible(labels)
    parts = [(instruction or DEFAULT_INSTRUCTION).strip(), _label_line(labels), _format_line(labels, mode)]
    if rubric and rubric.strip():
        parts.append("Labelling rules:\n" + rubric.strip())
    return [
        {"role": "system", "content": "\n\n".join(parts)},
        {"role": "user", "content": example.text},
    ]


def render_prompt(tokenizer, messages: list[dict[str, str]]) -> str:
    """The prompt text the model continues (generation prompt included).

    With a chat template: ``tokenizer.apply_chat_template(messages, tokenize=False,
    add_generation_prompt=True)``. Without one (``tokenizer.chat_template`` unset), a plain
    fallback: each message as ``"<Role>:\\n<content>\\n\\n"`` (role capitalised), then
    ``"Assistant:\\n"``, so the answer starts on a fresh line.
    """
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    body = "".join(f"{m['role'].capitalize()}:\n{m['content']}\n\n" for m in messages)
    return body + "Assistant:\n"


def answer_target(label: str, mode: str, trace: str | None = None) -> str:
    """The assistant text SFT trains on.

    direct: ``<answer>LABEL</answer>`` (a trace is an error: direct targets hold no reasoning).
    reasoning: ``trace`` with its surrounding whitespace trimmed; it must be one
    ``<think>…</think>`` block (with no further think or answer tag inside) followed by one
    ``<answer>…</answer>`` whose content matches ``label`` (trimmed, case-folded), else ValueError.
    """
    mode = check_mode(mode)
    check_labels_expressible([label])
    if mode == "direct":
        if trace is not None:
            raise ValueError("a trace was given in direct mode: direct targets are the answer tag only; use mode 'reasoning' to train on traces")
        return f"{ANSWER_PREFIX}{label}{ANSWER_SUFFIX}"
    if trace is None:
        raise ValueError(
            f"label {label!r}: reasoning mode trains on a trace per item and this item has none; "
            "make traces with `labelrl distill`, or use mode 'direct'"
        )
    match = _TRACE.fullmatch(trace)
    if match is None or any(tag in match["think"] for tag in (THINK_OPEN, THINK_CLOSE, ANSWER_PREFIX)):
        raise ValueError(
            f"trace {trace[:60]!r}...: a reasoning trace must be <think>...</think> followed by one "
            "<answer>LABEL</answer> and nothing else; fix or drop this trace"
        )
    if canonical_label(match["answer"]) != canonical_label(label):
        raise ValueError(
            f"trace answers {match['answer']!r} but the label is {label!r}: training on it would teach "
            "the wrong label; keep only traces whose answer matches (labelrl distill rejects them)"
        )
    return trace.strip()


def longest_answer(tokenizer, labels: LabelSpace | Sequence[str]) -> tuple[int, str]:
    """The longest ``<answer>LABEL</answer>`` in ``tokenizer``'s tokens: (its token count, the tag).
    A completion needs this many tokens, and one more for the end-of-text token that ends it
    within the cap rather than at it."""
    names = labels.labels if isinstance(labels, LabelSpace) else tuple(labels)
    tags = [f"{ANSWER_PREFIX}{x}{ANSWER_SUFFIX}" for x in names]
    return max((len(tokenizer(tag, add_special_tokens=False)["input_ids"]), tag) for tag in tags)


def check_answer_fits(tokenizer, labels: LabelSpace | Sequence[str], max_new_tokens: int) -> None:
    """ValueError when ``max_new_tokens`` cannot hold the longest answer tag and the end-of-text
    token after it: every completion giving that label would hit the cap and count as truncated.
    RL would then learn never to give it (a truncated completion earns the failure reward, or is
    left out of the loss), and a generated evaluation would score every such answer as a failure."""
    tokens, tag = longest_answer(tokenizer, labels)
    if max_new_tokens < tokens + 1:
        raise ValueError(
            f"--max-new-tokens {max_new_tokens}: the answer {tag} takes {tokens} tokens and the end-of-text token one "
            f"more, so every completion giving it would be cut off and count as truncated; raise --max-new-tokens to "
            f"at least {tokens + 1}, or use shorter label names"
        )
