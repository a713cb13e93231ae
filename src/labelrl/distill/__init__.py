"""Reasoning distillation: rejection-sampled teacher traces (``teacher``; a local teacher held to
the trace format in ``constrained``), their survival statistics (``reject``) and the
matched-data comparison of CoT-SFT with direct SFT (``compare``).

The public names are imported on first use, so that ``labelrl --help`` does not import the
evaluation metrics (scikit-learn) through ``compare``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from labelrl.lazy import lazy_exports

if TYPE_CHECKING:
    from labelrl.distill.compare import compare_models, regressions
    from labelrl.distill.constrained import ConstrainedTeacher
    from labelrl.distill.reject import (
        confidence_band, item_confidence, length_stats, survival_counts, survival_summary,
    )
    from labelrl.distill.teacher import (
        AttemptJournal, DistillPaths, distill_paths, grade_attempt, run_distill, teacher_messages, traces_records,
    )

_WHERE = {
    "compare_models": "compare", "regressions": "compare", "ConstrainedTeacher": "constrained",
    "confidence_band": "reject", "item_confidence": "reject", "length_stats": "reject",
    "survival_counts": "reject", "survival_summary": "reject",
    "AttemptJournal": "teacher", "DistillPaths": "teacher", "distill_paths": "teacher", "grade_attempt": "teacher",
    "run_distill": "teacher", "teacher_messages": "teacher", "traces_records": "teacher",
}
__all__ = sorted(_WHERE)

__getattr__, __dir__ = lazy_exports(__name__, _WHERE, globals())
