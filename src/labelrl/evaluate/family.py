"""One correction for the many comparisons a ladder reports, and the smallest difference each could detect.

A task's verdict makes many paired comparisons at once (every RL arm against its parent, the
threshold, the majority class, each other and on each out-of-domain set; the ranking for binary
tasks). Tested one by one at 5%, about one in twenty would read "better" or "worse" with nothing
there. So they form one family and **Holm's step-down procedure** controls the family-wise error
rate at α = 0.05 (Holm 1979): with the m p-values sorted p_(1) ≤ … ≤ p_(m), comparison (j) is
rejected when p_(i) ≤ α / (m − i + 1) for every i ≤ j. The adjusted p-value is
p̃_(j) = max_{i ≤ j} min(1, (m − i + 1) · p_(i)), rejected ⟺ p̃ ≤ α.

Why Holm and not Benjamini–Hochberg: each verdict word is read alone ("GRPO is better than SFT"),
so the claim to control is that *no* word in the grid is a false "better" or "worse" (FWER), not
the share of false ones among those made (FDR). Holm does so under any dependence between the
comparisons (they share arms and items), is uniformly more powerful than Bonferroni, and, unlike
BH, gives each comparison a level at which its interval can be drawn.

**The test of one comparison.** Δ and its standard error ``se`` come from the paired two-level
bootstrap of ``labelrl.evaluate.paired`` (items and seeds resampled; ``se`` is the standard
deviation of the bootstrap Δ). The p-value is the normal approximation p = 2 Φ(−|Δ| / se) (the
bootstrap-t with the bootstrap's own standard error; Efron & Tibshirani 1993, §12.5 and §16.4):
smooth at the small levels Holm asks for, where a percentile interval from a few hundred
resamples has too few replicates in its tails.

**The adjusted interval** is Δ ± z_{1−λ/2} · se at the comparison's level λ: for a rejected
comparison of rank j, Holm's level there, α / (m − j + 1); for every comparison not rejected, the
level of the first step that failed, α / (m − j₀ + 1). So the adjusted interval excludes 0 exactly
when the comparison is rejected (a rejected one has p_(j) ≤ α/(m − j + 1); every one not rejected
has p ≥ p_(j₀) > α/(m − j₀ + 1); at equality an end of the interval touches 0).

**The smallest detectable difference** of a comparison not rejected is the |Δ| it would have
detected with 80% power at that level, from its own spread: (z_{1−λ/2} + z_{0.80}) · se (the
normal-approximation sample-size relation, e.g. Chow, Shao & Wang 2008, §3.1). "No detectable
difference" then says how large a difference would have been seen.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from scipy.stats import norm

ALPHA = 0.05
POWER = 0.80
METHOD = "holm"


def normal_p(delta: float | None, se: float | None) -> float:
    """Two-sided p = 2 Φ(−|Δ|/se); Δ undefined → 1; se = 0 → 0 unless Δ = 0 (then 1)."""
    if delta is None or se is None or not math.isfinite(delta) or not math.isfinite(se):
        return 1.0
    if se == 0:
        return 1.0 if delta == 0 else 0.0
    return float(2 * norm.sf(abs(delta) / se))


def holm(p_values: Sequence[float], alpha: float = ALPHA) -> dict:
    """Holm's step-down procedure (module docstring) on ``p_values``: ``{"p_adjusted", "reject",
    "level"}``, each in the input order; ``level`` is the level of each comparison's adjusted
    interval (its own step's when rejected, the first failing step's otherwise)."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha={alpha}: a family-wise error rate must be in (0, 1); use e.g. 0.05")
    p = np.asarray(p_values, dtype=np.float64)
    if p.ndim != 1 or ((p < 0) | (p > 1) | ~np.isfinite(p)).any():
        raise ValueError(f"p-values {list(p_values)}: each must be a number in [0, 1]")
    m = len(p)
    order = np.argsort(p, kind="stable")
    steps = alpha / (m - np.arange(m))  # α/(m − j + 1) for ranks j = 1..m
    below = p[order] <= steps
    first_fail = int(np.argmin(below)) if not below.all() else m  # j₀ − 1 (0-based); m: none failed
    adjusted_sorted = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    p_adjusted, reject, level = np.empty(m), np.zeros(m, dtype=bool), np.empty(m)
    p_adjusted[order] = adjusted_sorted
    reject[order[:first_fail]] = True
    fail_level = steps[first_fail] if first_fail < m else steps[-1]
    level[order] = np.where(np.arange(m) < first_fail, steps, fail_level)
    return {"p_adjusted": p_adjusted.tolist(), "reject": reject.tolist(), "level": level.tolist()}


def detectable(se: float | None, level: float, power: float = POWER) -> float | None:
    """(z_{1−level/2} + z_{power}) · se: the |Δ| detected with that power at that level (module docstring)."""
    if se is None or not math.isfinite(se):
        return None
    return float((norm.ppf(1 - level / 2) + norm.ppf(power)) * se)


def family_entry(delta: float | None, se: float | None, p_adjusted: float, reject: bool, level: float, size: int,
                 p_value: float) -> dict:
    """What one comparison records of its family: the method, size, raw and adjusted p, the decision,
    the adjusted interval at ``level`` and, when not rejected, the smallest detectable |Δ|."""
    finite = delta is not None and se is not None and math.isfinite(delta) and math.isfinite(se)
    half = float(norm.ppf(1 - level / 2) * se) if finite else None
    return {"method": METHOD, "alpha": ALPHA, "size": size, "p_value": p_value, "p_adjusted": p_adjusted,
            "reject": bool(reject), "level": level,
            "ci_adjusted": [delta - half, delta + half] if finite else None,
            "detectable": None if reject else detectable(se, level)}


def correct(tests: Sequence[tuple[float | None, float | None]], alpha: float = ALPHA) -> list[dict]:
    """One family of (Δ, se) tests: each test's ``family_entry`` (module docstring)."""
    p = [normal_p(d, s) for d, s in tests]
    if not p:
        return []
    h = holm(p, alpha)
    return [family_entry(d, s, h["p_adjusted"][i], h["reject"][i], h["level"][i], len(p), p[i])
            for i, (d, s) in enumerate(tests)]
