"""Analyses of an RL arm's rollout log for the report (pyarrow and numpy only; no model).

* ``recall_per_step``: per step and reference label, the share of its rollouts answered with
  that label (an unparsed answer is wrong). A label whose recall sinks while another's rises
  is the recall drift that looks like a reward bug and is the skip rule's label mix at work.
* ``think_length_tax``: the truncation tax, measured where it shows: among *finished* rollouts
  (not cut by the token cap), by the length of their reasoning (the text before ``</think>``, in
  characters), in an early window of steps and in a late one: mean reward and think-closure
  rate per length bucket, and the think-closure rate of the rollouts the cap cut. Pooling
  truncated and finished rollouts over all steps hides the inversion (reward rising with
  reasoning length until the cap starts cutting it).
* ``residue_drift``: per step, the share of informative groups (the ones trained on) whose item
  is ambiguous — in a group of conflicting duplicates, in the SFT model's lowest-confidence
  quarter, or relabelled differently — against that share in the training sample. When
  uniform groups are skipped, training concentrates on what the model cannot yet answer; if
  that is the label-ambiguous residue, RL is fitting label noise.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa

from labelrl.types import canonical_label

CLOSE_THINK = "</think>"
TAX_BUCKETS = 6
TAX_WINDOW = 0.25  # share of the steps in each window


def graded_rollouts(table: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per rollout: its step, its item's canonical label, and whether its answer is that label."""
    steps = np.asarray(table.column("step").to_pylist(), dtype=np.int64)
    truth = np.array([canonical_label(v) for v in table.column("label").to_pylist()], dtype=object)
    answers = table.column("answer").to_pylist()
    return steps, truth, np.array([a is not None and canonical_label(a) == t for a, t in zip(answers, truth)])


def recall_per_step(table: pa.Table, labels: list[str]) -> list[dict]:
    """``[{"step", "recall": {label: share or None}}]`` (module docstring)."""
    steps, truth, right = graded_rollouts(table)
    out = []
    for step in np.unique(steps):
        at = steps == step
        recall = {}
        for label in labels:
            mask = at & (truth == canonical_label(label))
            recall[label] = float(right[mask].mean()) if mask.any() else None
        out.append({"step": int(step), "recall": recall})
    return out


def _think_chars(text: str | None) -> int:
    text = text or ""
    end = text.find(CLOSE_THINK)
    return len(text if end < 0 else text[:end])


def think_length_tax(table: pa.Table, n_buckets: int = TAX_BUCKETS, window: float = TAX_WINDOW) -> dict | None:
    """Finished-only reward and closure by think length in the first and last ``window`` of the
    steps, plus the closure rate of capped rollouts (module docstring); None without rollouts."""
    if table.num_rows == 0:
        return None
    steps = np.asarray(table.column("step").to_pylist(), dtype=np.int64)
    think = np.array([_think_chars(t) for t in table.column("completion").to_pylist()])
    truncated = np.asarray(table.column("truncated").to_pylist(), dtype=bool)
    closed = np.asarray(table.column("think_closed").to_pylist(), dtype=bool)
    reward = np.asarray(table.column("reward").to_pylist(), dtype=np.float64)
    unique = np.unique(steps)
    width = max(1, math.ceil(window * len(unique)))
    windows = {"early": unique[:width], "late": unique[-width:]}
    finished = ~truncated
    lengths = think[finished]
    edges = np.unique(np.quantile(lengths, np.linspace(0, 1, n_buckets + 1))) if len(lengths) else np.array([0.0, 1.0])
    if len(edges) < 2:
        edges = np.array([edges[0], edges[0] + 1.0])
    out = {"unit": "characters of reasoning before </think>", "edges": [float(e) for e in edges], "windows": {}}
    for name, chosen in windows.items():
        in_window = np.isin(steps, chosen)
        which = np.clip(np.searchsorted(edges, think, side="right") - 1, 0, len(edges) - 2)
        buckets = []
        for b in range(len(edges) - 1):
            mask = in_window & finished & (which == b)
            n = int(mask.sum())
            buckets.append({"lo": float(edges[b]), "hi": float(edges[b + 1]), "n": n,
                            "mean_reward": float(reward[mask].mean()) if n else None,
                            "think_closed_rate": float(closed[mask].mean()) if n else None})
        capped = in_window & truncated
        out["windows"][name] = {"steps": [int(chosen[0]), int(chosen[-1])], "buckets": buckets,
                                "n_finished": int((in_window & finished).sum()), "n_capped": int(capped.sum()),
                                "capped_think_closed_rate": float(closed[capped].mean()) if capped.any() else None}
    return out


def residue_drift(table: pa.Table, ambiguous: dict[str, set[str]], train_ids: list[str]) -> dict | None:
    """Per step and kind of ambiguity, its share among the informative groups, and its share in
    the training sample ``train_ids`` (module docstring); None without ambiguity sets."""
    kinds = {k: v for k, v in ambiguous.items() if v}
    if not kinds or table.num_rows == 0:
        return None
    first = np.asarray(table.column("sample_index").to_pylist()) == 0  # one row per group
    steps = np.asarray(table.column("step").to_pylist(), dtype=np.int64)[first]
    items = np.array(table.column("prompt_id").to_pylist(), dtype=object)[first]
    trained = ~np.asarray(table.column("skipped").to_pylist(), dtype=bool)[first]
    train = set(train_ids)
    out = {"kinds": {}, "steps": [int(s) for s in np.unique(steps)]}
    for kind, ids in kinds.items():
        hit = np.array([i in ids for i in items])
        per_step = []
        for s in np.unique(steps):
            mask = (steps == s) & trained
            per_step.append(float(hit[mask].mean()) if mask.any() else None)
        data_share = len(train & ids) / len(train) if train else None
        out["kinds"][kind] = {"per_step": per_step, "data_share": data_share, "n_ids": len(ids)}
    return out
