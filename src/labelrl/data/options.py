"""``DataOptions``: which data, which columns, which labels and which split a command uses.

Shared by every command that reads a dataset (``sft``, ``rl``, ``eval``, the ladder); each
field's description is the single source for ``--help`` and docs/config.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field


class DataOptions(BaseModel):
    """Which data, which columns, which labels, which split."""

    model_config = ConfigDict(extra="forbid")

    data: str = Field(description="Built-in dataset name (sms-spam, vader-tweets, vader-movies) or a JSONL/CSV/Parquet file or a `datasets` directory.")
    text_col: Optional[list[str]] = Field(None, description="Column(s) that fill the prompt (repeatable). Built-in datasets need none.")
    label_col: Optional[str] = Field(None, description="Column holding the label. Built-in datasets need none.")
    labels: Optional[str] = Field(None, description="Declared label set, comma-separated, in grade order for ordinal labels (e.g. 'ham,spam'). Inferred when omitted.")
    kind: Optional[Literal["binary", "categorical", "ordinal"]] = Field(None, description="Label kind; inferred when omitted.")
    on_bad_row: Literal["error", "skip"] = Field("error", description="What to do with a malformed row: stop with an error naming it, or skip it and save the list of skipped rows.")
    limit: Optional[int] = Field(None, ge=1, description="Use only the first N training items (after splitting).")
    split_seed: int = Field(0, description="Seed of the group-aware train/val/holdout split (shared by every run in a run directory).")
    mode: Literal["direct", "reasoning"] = Field("direct", description="Answer mode: 'direct' answers <answer>LABEL</answer> at once; 'reasoning' thinks in <think>…</think> first.")
    rubric: Optional[Path] = Field(None, description="Markdown file with the written labelling rules, included in the prompt.")

    def label_list(self) -> list[str] | None:
        return [x.strip() for x in self.labels.split(",")] if self.labels else None
