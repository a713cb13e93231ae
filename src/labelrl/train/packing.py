"""Batch layouts for SFT: each item padded to the longest (``padded``), or items packed into
a few rows (``packed``) with attention kept within each item.

A padded batch of B items costs B × (longest item) token positions; with long-tailed texts
(a few long reviews among many short ones) most of them are padding. Packing places the
items, longest first, into rows as wide as the longest item (first-fit decreasing), so a
batch costs about its real tokens. Each item's position ids restart at 0, which is how
transformers (``masking_utils.find_packed_sequence_indices``, with no attention mask) knows
where an item ends: every token attends only to earlier tokens of its own item, so the
loss equals the padded layout's up to float rounding (tested). The same items form each
step's batch either way; only their layout changes.

A batch whose items all start with the same tokens (one template, one system message) can
also run that prefix once (``prefix_layout``), each item's remainder in its own row.

Every layout returns ``BatchLayout``: token ids [R, W], position ids [R, W], the attention
mask [R, W] (None when packed), the target of each position [R, W] (−100 where there is no
loss: prompts, padding, and each item's last token) and the share of padding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

IGNORE = -100  # cross_entropy's ignore_index


@dataclass
class BatchLayout:
    input_ids: torch.Tensor  # [R, W]
    position_ids: torch.Tensor  # [R, W]
    attention_mask: torch.Tensor | None  # [R, W]; None when packed (items are told apart by their positions)
    labels: torch.Tensor  # [R, W]: token the position predicts, or IGNORE
    real_tokens: int  # token positions computed that hold an item's token (not padding)
    # Tokens every item starts with, run once before the rows (``prefix_layout``); the mask
    # then covers them too: [R, len(prefix) + W].
    prefix: list[int] | None = None

    @property
    def slots(self) -> int:
        return self.input_ids.numel() + len(self.prefix or ())

    @property
    def padding_share(self) -> float:
        return 1.0 - self.real_tokens / max(self.slots, 1)


def first_fit_decreasing(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Indices of ``lengths`` grouped into rows of at most ``capacity`` tokens: longest first,
    each into the first row with room (first-fit decreasing; within 11/9 of the fewest rows
    possible, Johnson 1973). Ties keep the input order, so the layout is deterministic."""
    if any(n > capacity for n in lengths):
        raise ValueError(f"an item of {max(lengths)} tokens does not fit rows of {capacity}; make the rows at least "
                         "as wide as the longest item")
    rows: list[list[int]] = []
    room: list[int] = []
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        row = next((r for r, free in enumerate(room) if free >= lengths[index]), None)
        if row is None:
            rows.append([])
            room.append(capacity)
            row = len(rows) - 1
        rows[row].append(index)
        room[row] -= lengths[index]
    return rows


def padded_layout(sequences: Sequence[Sequence[int]], n_prompt: Sequence[int], pad: int) -> BatchLayout:
    """One row per item, left-padded to the longest (targets at the end of every row)."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    labels = torch.full((len(sequences), width), IGNORE, dtype=torch.long)
    for i, (seq, prompt) in enumerate(zip(sequences, n_prompt)):
        start = width - len(seq)
        ids[i, start:] = torch.tensor(list(seq))
        mask[i, start:] = 1
        labels[i, start + prompt - 1 : width - 1] = ids[i, start + prompt :]  # position t predicts token t+1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return BatchLayout(ids, positions, mask, labels, sum(len(s) for s in sequences))


def packed_layout(sequences: Sequence[Sequence[int]], n_prompt: Sequence[int], pad: int) -> BatchLayout:
    """Items packed into rows as wide as the longest item; the unused tail of a row is padding
    with positions 0, 1, … (a segment of its own, attended by nothing else)."""
    width = max(len(s) for s in sequences)
    rows = first_fit_decreasing([len(s) for s in sequences], width)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    positions = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE, dtype=torch.long)
    for r, members in enumerate(rows):
        start = 0
        for index in members:
            seq, prompt = sequences[index], n_prompt[index]
            end = start + len(seq)
            ids[r, start:end] = torch.tensor(list(seq))
            positions[r, start:end] = torch.arange(len(seq))
            labels[r, start + prompt - 1 : end - 1] = ids[r, start + prompt : end]
            start = end
        positions[r, start:] = torch.arange(width - start)
    return BatchLayout(ids, positions, None, labels, sum(len(s) for s in sequences))


def prefix_layout(sequences: Sequence[Sequence[int]], n_prompt: Sequence[int], pad: int, shared: int) -> BatchLayout:
    """The first ``shared`` tokens, which every item starts with (a template's header and
    system message), as a prefix run once; each item's remainder in a row of its own,
    left-padded, its positions continuing from ``shared`` (``labelrl.rollout.prefix``).
    ``shared`` must leave every item's last prompt token in its row: it predicts the first
    target."""
    if any(shared > n - 1 for n in n_prompt) or any(list(s[:shared]) != list(sequences[0][:shared]) for s in sequences):
        raise ValueError(f"a shared prefix of {shared} tokens: every item must start with it and keep at least its "
                         "last prompt token after it; take the length from labelrl.rollout.prefix.shared_prefix_length")
    rest = padded_layout([list(s)[shared:] for s in sequences], [n - shared for n in n_prompt], pad)
    mask = torch.cat([torch.ones((len(sequences), shared), dtype=torch.long), rest.attention_mask], dim=1)
    positions = torch.where(rest.attention_mask.bool(), rest.position_ids + shared, rest.position_ids)
    return BatchLayout(rest.input_ids, positions, mask, rest.labels, shared + rest.real_tokens,
                       prefix=list(sequences[0][:shared]))


def kept_positions(labels: torch.Tensor) -> torch.Tensor:
    """Sorted column indices [K] where any row has a target: the only positions whose logits
    the loss needs (``logits_to_keep`` takes them as a 1-D index)."""
    return (labels != IGNORE).any(dim=0).nonzero().flatten()
