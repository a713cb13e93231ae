"""Answer parsing: from a completion's text to one declared label, or a reason why not.

The rules (docs/rewards.md shows examples of each):

* **Tags.** An answer is an ``<answer>…</answer>`` block; tags are matched exactly (lower
  case, no spaces inside the angle brackets). The block's content, trimmed, its runs of
  whitespace folded and case-folded (``labelrl.types.canonical_label``), must equal one of
  the declared labels; the parser returns the label's declared spelling.
* **The answer region.** In direct mode it is the whole completion. In reasoning mode it is
  the text after the LAST ``</think>``: only the closing tag is required, because chat
  templates often put the ``<think>`` opener in the prompt, so the completion starts inside
  the thought. Everything before the last ``</think>`` is thinking, and tags quoted there
  never count.
* **strict** (the default): the answer region must hold exactly one well-formed block and
  nothing but whitespace around it. Text around the block ("The answer is <answer>spam</answer>.")
  fails with ``no_answer`` (``raw`` still shows the tag content): the reward is for the
  format the model was trained to produce, and a grader that fishes answers out of prose
  starts crediting prose.
* **lenient**: the first ``<answer>…</answer>`` block anywhere in the completion (thinking
  included), else the first label that appears as a bare word. It exists only so a user can
  see what a forgiving parser does to the reward (it credits labels quoted while thinking);
  it is never the default.

``parse_answer`` never raises on any completion text; it raises ``ValueError`` only for a
bad ``labels`` or ``mode`` argument.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import Literal, Sequence

from labelrl.types import LabelSpace, canonical_label

ParseMode = Literal["strict", "lenient"]
PARSE_MODES: tuple[str, ...] = ("strict", "lenient")

OPEN_ANSWER = "<answer>"
CLOSE_ANSWER = "</answer>"
CLOSE_THINK = "</think>"
# Non-greedy and DOTALL: a block is an opener and the nearest closer after it, across lines.
_BLOCK = re.compile(re.escape(OPEN_ANSWER) + r"(.*?)" + re.escape(CLOSE_ANSWER), re.DOTALL)


class ParseStatus(str, Enum):
    """Why a completion did or did not yield a label.

    ok               exactly one valid answer (a truncated completion that parses is still ok;
                     the trainer knows it was truncated from its own flag)
    no_answer        no well-formed answer block in the answer region: no tags, unmatched or
                     nested tags, or (strict) other text around the block
    multiple_answers more than one answer block in the answer region (strict)
    unknown_label    one block, but its content is not a declared label
    unclosed_think   reasoning mode and the completion never closes ``</think>``
    truncated        the completion hit the token cap and has no valid answer (replaces any
                     other failure status, since the cap is the likely cause)
    empty            the completion is empty or whitespace only
    """

    OK = "ok"
    NO_ANSWER = "no_answer"
    MULTIPLE_ANSWERS = "multiple_answers"
    UNKNOWN_LABEL = "unknown_label"
    UNCLOSED_THINK = "unclosed_think"
    TRUNCATED = "truncated"
    EMPTY = "empty"


@dataclass(frozen=True)
class ParseResult:
    """The outcome of parsing one completion.

    answer        the declared spelling of the parsed label, or None unless status is ok
    status        a ParseStatus
    think_closed  whether ``</think>`` appears anywhere in the completion
    n_answers     well-formed ``<answer>…</answer>`` blocks in the region searched (the
                  answer region in strict mode, the whole completion in lenient mode)
    raw           the content of the block the answer was read from (untrimmed), or None
                  when no block was used
    """

    answer: str | None
    status: ParseStatus
    think_closed: bool
    n_answers: int
    raw: str | None

    @property
    def ok(self) -> bool:
        return self.status is ParseStatus.OK


def label_lookup(labels: LabelSpace | Sequence[str]) -> dict[str, str]:
    """Map each label's canonical form (trimmed, case-folded) to its declared spelling."""
    if isinstance(labels, LabelSpace):
        names = list(labels.labels)
    elif isinstance(labels, str):
        raise ValueError(
            f"labels={labels!r} is a single string: pass a list such as ['ham', 'spam'] or a LabelSpace"
        )
    else:
        names = [str(x) for x in labels]
    if not names:
        raise ValueError("labels=[]: the parser needs the declared labels; pass at least one")
    lookup: dict[str, str] = {}
    for name in names:
        key = canonical_label(name)
        if not key or key in lookup:
            raise ValueError(
                f"labels={names}: labels must be non-empty and differ after trimming, folding runs of whitespace and case-folding"
            )
        lookup[key] = name
    return lookup


def parse_answer(
    text: str,
    *,
    reasoning: bool,
    mode: ParseMode = "strict",
    labels: LabelSpace | Sequence[str],
    truncated: bool = False,
) -> ParseResult:
    """Parse one completion under the rules in this module's docstring.

    ``reasoning`` selects the answer region (after the last ``</think>``) and makes a missing
    ``</think>`` a failure in strict mode; ``truncated`` says the completion hit the token
    cap, which turns any failure status into ``truncated``.
    """
    if mode not in PARSE_MODES:
        raise ValueError(f"mode={mode!r}: the parser mode is 'strict' or 'lenient'; use 'strict' unless studying the parser")
    lookup = label_lookup(labels)
    text = text if isinstance(text, str) else ""
    think_closed = CLOSE_THINK in text
    if not text.strip():
        result = ParseResult(None, ParseStatus.EMPTY, think_closed, 0, None)
    elif mode == "lenient":
        result = _parse_lenient(text, lookup, think_closed)
    else:
        result = _parse_strict(text, lookup, reasoning=reasoning, think_closed=think_closed)
    if truncated and not result.ok:
        return ParseResult(None, ParseStatus.TRUNCATED, think_closed, result.n_answers, result.raw)
    return result


def _parse_strict(text: str, lookup: dict[str, str], *, reasoning: bool, think_closed: bool) -> ParseResult:
    if reasoning:
        if not think_closed:
            # Any tag in an unclosed thought is still thinking, never an answer.
            return ParseResult(None, ParseStatus.UNCLOSED_THINK, False, 0, None)
        region = text[text.rfind(CLOSE_THINK) + len(CLOSE_THINK):]
    else:
        region = text
    blocks = list(_BLOCK.finditer(region))
    n = len(blocks)
    if n > 1:
        return ParseResult(None, ParseStatus.MULTIPLE_ANSWERS, think_closed, n, None)
    if n == 0 or region.count(OPEN_ANSWER) != 1 or region.count(CLOSE_ANSWER) != 1:
        return ParseResult(None, ParseStatus.NO_ANSWER, think_closed, n, None)
    block = blocks[0]
    raw = block.group(1)
    if region[: block.start()].strip() or region[block.end():].strip():
        return ParseResult(None, ParseStatus.NO_ANSWER, think_closed, n, raw)
    return _judge(raw, lookup, think_closed, n)


def _parse_lenient(text: str, lookup: dict[str, str], think_closed: bool) -> ParseResult:
    blocks = list(_BLOCK.finditer(text))
    if blocks:
        return _judge(blocks[0].group(1), lookup, think_closed, len(blocks))
    word = _first_bare_label(text, lookup)
    if word is None:
        return ParseResult(None, ParseStatus.NO_ANSWER, think_closed, 0, None)
    return ParseResult(word, ParseStatus.OK, think_closed, 0, None)


def _judge(raw: str, lookup: dict[str, str], think_closed: bool, n: int) -> ParseResult:
    answer = lookup.get(canonical_label(raw))
    status = ParseStatus.OK if answer is not None else ParseStatus.UNKNOWN_LABEL
    return ParseResult(answer, status, think_closed, n, raw)


def _first_bare_label(text: str, lookup: dict[str, str]) -> str | None:
    """The label whose whole-word occurrence starts first (the longer label on a tie)."""
    folded = text.casefold()
    best: tuple[int, int, str] | None = None
    for key, name in lookup.items():
        # Lookarounds instead of \b so labels that start or end with symbols ("-1", "+2") match.
        match = re.search(r"(?<!\w)" + re.escape(key) + r"(?!\w)", folded)
        if match is None:
            continue
        rank = (match.start(), -len(key), name)
        if best is None or rank < best:
            best = rank
    return None if best is None else best[2]
