"""Reasoning distillation: rejection-sampled teacher traces (``teacher``), their survival
statistics (``reject``) and the matched-data comparison of CoT-SFT with direct SFT (``compare``)."""

from labelrl.distill.compare import compare_models, regressions
from labelrl.distill.reject import confidence_band, item_confidence, length_stats, survival_counts, survival_summary
from labelrl.distill.teacher import (
    AttemptJournal, DistillPaths, distill_paths, grade_attempt, run_distill, teacher_messages, traces_records,
)

__all__ = [
    "AttemptJournal", "DistillPaths", "compare_models", "confidence_band", "distill_paths", "grade_attempt",
    "item_confidence", "length_stats", "regressions", "run_distill", "survival_counts", "survival_summary",
    "teacher_messages", "traces_records",
]
