"""Datasets: loading and validation, built-ins, group-aware splits and prompts."""

from labelrl.data.builtin import BUILTIN_DATASETS, GRADE_CUTS, mean_to_grade, mean_to_polarity
from labelrl.data.load import load_dataset, write_skipped_rows

__all__ = [
    "BUILTIN_DATASETS",
    "GRADE_CUTS",
    "load_dataset",
    "mean_to_grade",
    "mean_to_polarity",
    "write_skipped_rows",
]
