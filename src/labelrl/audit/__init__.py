"""Label-noise audit: duplicates and raters tell how noisy the labels are, and so how high
any model's accuracy against them can go (the ceiling)."""

from labelrl.audit.duplicates import DuplicateGroup, find_duplicate_groups
from labelrl.audit.noise import (
    disagreement_from_flip_rate,
    duplicate_noise,
    flip_rate_from_disagreement,
    homogeneity_test,
    max_disagreement,
)
from labelrl.audit.raters import VADER_GRADES, RatingMap, rater_noise, rating_map_for, sign_map
from labelrl.audit.report import audit_dataset

__all__ = [
    "DuplicateGroup",
    "RatingMap",
    "VADER_GRADES",
    "audit_dataset",
    "disagreement_from_flip_rate",
    "duplicate_noise",
    "find_duplicate_groups",
    "flip_rate_from_disagreement",
    "homogeneity_test",
    "max_disagreement",
    "rater_noise",
    "rating_map_for",
    "sign_map",
]
