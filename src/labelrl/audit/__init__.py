"""Label-noise audit: duplicates and raters tell how noisy the labels are, and so how high
any model's accuracy against them can go (the ceiling).

The public names are imported on first use: the noise estimates need scipy and scikit-learn,
which a command that only reads judges (or ``labelrl --help``) should not pay for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from labelrl.lazy import lazy_exports

if TYPE_CHECKING:
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

_WHERE = {
    "DuplicateGroup": "duplicates", "find_duplicate_groups": "duplicates",
    "disagreement_from_flip_rate": "noise", "duplicate_noise": "noise", "flip_rate_from_disagreement": "noise",
    "homogeneity_test": "noise", "max_disagreement": "noise",
    "VADER_GRADES": "raters", "RatingMap": "raters", "rater_noise": "raters", "rating_map_for": "raters",
    "sign_map": "raters",
    "audit_dataset": "report",
}
__all__ = sorted(_WHERE)

__getattr__, __dir__ = lazy_exports(__name__, _WHERE, globals())
