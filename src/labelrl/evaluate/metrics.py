"""Classification metrics, defined by scikit-learn so ours cannot drift from the standard."""

from __future__ import annotations

from typing import Sequence

import numpy as np
from sklearn.metrics import accuracy_score, balanced_accuracy_score


def basic_metrics(y_true: Sequence[str], y_pred: Sequence[str | None]) -> dict[str, float]:
    """Accuracy and balanced accuracy; an unparseable prediction (None) counts as wrong."""
    if len(y_true) == 0:
        raise ValueError("no examples to evaluate: the split is empty; check --limit and the split ratios")
    pred = np.array(["\x00unparsed" if p is None else p for p in y_pred], dtype=object)
    true = np.array(list(y_true), dtype=object)
    return {
        "accuracy": float(accuracy_score(true, pred)),
        "balanced_accuracy": float(balanced_accuracy_score(true, pred)),
    }
