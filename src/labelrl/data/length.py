"""Items whose prompt does not fit a stage's token budget, and what ``--on-long-item`` does with them.

The budget is how many prompt tokens an item may take, so that its answer still fits:

* ``sft``: ``--max-length`` minus the item's target (its answer, or trace, and end of turn);
* ``rl``: the model's context minus ``--max-new-tokens``;
* ``eval``: the model's context minus the answer (``<answer>`` and the longest label when
  scoring, the token cap when generating).

``truncate`` (the default) cuts the end of the item's text (never the instructions, the rubric
or the answer) and marks the cut with "…"; ``skip`` leaves the item out; ``error`` stops before
any training, naming the count. Whatever the choice, the count and the ids are printed before
the work starts and saved (``LongItems.record``), so no item is cut or dropped silently.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from labelrl.types import Example

ON_LONG_ITEM = ("truncate", "skip", "error")
CUT_MARK = "…"
SHOWN_IDS = 5  # ids named in a printed line; the saved record lists every one
_FIT_ROUNDS = 6  # re-tokenising a cut text can merge tokens at the cut; a few rounds settle it
_SAID: set[str] = set()  # the lines ``announce`` printed in this process


@dataclass
class LongItems:
    """What ``fit_prompts`` found and did: ``ids`` of the items over budget, their prompt
    lengths before any cut and their budgets (tokens)."""

    stage: str  # "sft train items", "rl train items", "eval val items"
    policy: str
    limit: str  # the rule, e.g. "--max-length 512 with their answer"
    n_items: int
    fix: str = "raise the limit"  # how else to make them fit, e.g. "raise --max-length"
    ids: list[str] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)
    budgets: list[int] = field(default_factory=list)

    def record(self) -> dict:
        return dataclasses.asdict(self)

    def _listed(self) -> str:
        shown = ", ".join(self.ids[:SHOWN_IDS]) + (", …" if len(self.ids) > SHOWN_IDS else "")
        return f"{len(self.ids)} of {self.n_items} {self.stage} do not fit {self.limit} (longest prompt " \
               f"{max(self.prompt_tokens)} tokens; ids {shown})"

    def message(self) -> str:
        """The line printed before the work starts: what was found, what was done, the other choices."""
        done = {"truncate": "their text is cut to fit (--on-long-item skip would leave them out, error would stop)",
                "skip": "they are left out (--on-long-item truncate would cut their text to fit, error would stop)"}
        return f"{self._listed()}: {done[self.policy]}"

    def error(self) -> str:
        return (f"{self._listed()}; pass --on-long-item truncate (cut their text to fit) or --on-long-item skip "
                f"(leave them out), or {self.fix}")


def cut_to_fit(tokenizer, example: Example, render: Callable[[Example], list[int]], budget: int,
               prompt: list[int]) -> tuple[Example, list[int]] | None:
    """``example`` with the end of its text cut (and marked "…") so that ``render`` of it takes at
    most ``budget`` tokens; None when even an empty text would not fit (the instructions and
    rubric alone take the budget)."""
    text_ids = tokenizer(example.text, add_special_tokens=False)["input_ids"]
    keep = len(text_ids) - (len(prompt) - budget) - 1  # one token for the mark
    for _ in range(_FIT_ROUNDS):
        if keep < 1:
            return None
        # a cut inside a multi-byte character decodes to U+FFFD: drop it
        text = tokenizer.decode(text_ids[:keep]).rstrip("\ufffd").rstrip() + CUT_MARK
        cut = dataclasses.replace(example, text=text)
        ids = render(cut)
        if len(ids) <= budget:
            return cut, ids
        keep -= len(ids) - budget
    return None


def fit_prompts(
    tokenizer, examples: Sequence[Example], render: Callable[[Example], list[int]], budgets: Sequence[int] | int,
    *, policy: str, stage: str, limit: str, fix: str = "raise the limit",
) -> tuple[list[int], list[Example], list[list[int]], LongItems]:
    """Fit every example's prompt into its budget under ``policy`` (``ON_LONG_ITEM``).

    Returns (positions of the examples kept, the kept examples, cut where cut, their prompt ids,
    the ``LongItems`` report). ``error`` raises ValueError naming the count and the choices;
    an item that cannot be cut to fit raises whatever the policy.
    """
    if policy not in ON_LONG_ITEM:
        raise ValueError(f"--on-long-item {policy!r}: choose truncate (cut the text to fit), skip or error")
    budgets = [budgets] * len(examples) if isinstance(budgets, int) else list(budgets)
    report = LongItems(stage, policy, limit, len(examples), fix=fix)
    kept, out, prompts = [], [], []
    for position, (example, budget) in enumerate(zip(examples, budgets)):
        ids = render(example)
        if budget < 1:
            raise ValueError(f"item {example.id}: its answer alone takes all of {limit}; {fix}")
        if len(ids) > budget:
            report.ids.append(example.id)
            report.prompt_tokens.append(len(ids))
            report.budgets.append(budget)
            if policy == "skip":
                continue
            if policy == "truncate":
                fitted = cut_to_fit(tokenizer, example, render, budget, ids)
                if fitted is None:
                    raise ValueError(
                        f"item {example.id}: the prompt without the item's text already takes {budget} tokens or more "
                        f"of {limit}, so no cut of the text fits; shorten the rubric or {fix}"
                    )
                example, ids = fitted
        kept.append(position)
        out.append(example)
        prompts.append(ids)
    if report.ids and policy == "error":
        raise ValueError(report.error())
    if policy == "skip" and not kept:
        raise ValueError(f"{report._listed()}: --on-long-item skip left none; use --on-long-item truncate or {fix}")
    return kept, out, prompts, report


def announce(report: LongItems, path: str | Path | None) -> None:
    """Print what was cut or left out (stderr; once per process for the same line) and save the
    full record to ``path`` (JSON); a record with no ids is saved too, so "none" can be told
    from "not checked"."""
    if path is not None:
        from labelrl.fileio import atomic_write_text

        atomic_write_text(Path(path), json.dumps(report.record(), indent=2, ensure_ascii=False) + "\n")
    if report.ids:
        where = f"; the list is in {path}" if path is not None else ""
        line = f"{report.message()}{where}"
        if line not in _SAID:  # a ladder scores the same split once per model: said the first time
            _SAID.add(line)
            print(line, file=sys.stderr, flush=True)
