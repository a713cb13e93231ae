"""How many holdout items and seeds a chosen difference would need, from a finished run's paired spreads.

A paired comparison's bootstrap (``labelrl.evaluate.paired``) measures two spreads of Δ: ``se``
with items and seeds redrawn, and ``se_items`` with only the items redrawn. Their difference is
the seeds' part. With n items and S seeds (pairs of runs) now, the variance at n' items and S'
seeds is taken as

    Var(Δ; n', S') = se_items² · n / n' + max(0, se² − se_items²) · S / S'

(items and training runs as independent sources of noise, each averaged down by its own count;
a two-stage sampling variance, Cochran 1977, §10.2). A difference d is detected with power
1 − β at level λ when (z_{1−λ/2} + z_{1−β}) · √Var ≤ d (the normal-approximation relation of
``labelrl.evaluate.family``), so the items needed at S' seeds are

    n' = se_items² · n / (V* − v_seed · S / S'),   V* = (d / (z_{1−λ/2} + z_{1−β}))²,

and none suffice when the seeds' share alone exceeds V* ("more seeds"). With one seed the seeds'
part cannot be measured: it is taken as 0 and the answer is a lower bound, said so. λ is the
comparison's own Holm level in its task's family when the ladder corrected it (the level its
"no detectable difference" was judged at), else 0.05.
"""

from __future__ import annotations

import math

from scipy.stats import norm

from labelrl.evaluate.family import ALPHA, POWER


def spread_parts(m: dict, n_pairs: int) -> dict:
    """``{"v_items", "v_seeds", "seeds_measured"}`` of one metric's paired summary (``se``, ``se_items``)."""
    se, se_items = m.get("se"), m.get("se_items")
    if se is None or se_items is None:
        raise ValueError("this comparison has no bootstrap spreads (se, se_items): it was made before they were "
                         "recorded; re-run the ladder's analysis (labelrl ladder RECIPE --out RUN_DIR) to rebuild it")
    return {"v_items": se_items ** 2, "v_seeds": max(0.0, se ** 2 - se_items ** 2), "seeds_measured": n_pairs > 1}


def items_needed(target: float, v_items: float, v_seeds: float, n: int, seeds_now: int, seeds: int,
                 level: float = ALPHA, power: float = POWER) -> int | None:
    """Items n' for |Δ| = ``target`` at ``seeds`` seeds (module docstring); None when no number of
    items suffices (the seeds' part alone is too large)."""
    if target <= 0:
        raise ValueError(f"target={target}: the difference to detect must be positive, e.g. 0.03 (3 points of BA)")
    if seeds < 1 or seeds_now < 1 or n < 1:
        raise ValueError(f"seeds={seeds}, seeds_now={seeds_now}, n={n}: counts must be at least 1")
    budget = (target / (norm.ppf(1 - level / 2) + norm.ppf(power))) ** 2
    room = budget - v_seeds * seeds_now / seeds
    if room <= 0:
        return None
    return max(1, math.ceil(v_items * n / room))


def plan_comparison(c: dict, target: float, seed_options: tuple[int, ...] = (1, 3, 5, 10)) -> dict:
    """One paired.json comparison's plan on its tested metric: the detectable |Δ| now, and the
    items needed for ``target`` at each number of seeds in ``seed_options``."""
    from labelrl.evaluate.family import detectable

    result = c["result"]
    family = result.get("family") or {}
    metric = family.get("metric", "balanced_accuracy")
    m = result["metrics"][metric]
    pairs = len(m.get("pair_deltas") or [1])
    parts = spread_parts(m, pairs)
    level = family.get("level", ALPHA)
    return {"kind": c.get("kind"), "split": c.get("split", "holdout"), "a": c.get("a"), "b": c.get("b"), "metric": metric,
            "n": result["n"], "seeds": pairs, "level": level, "delta": m["delta"], "detectable_now": detectable(m["se"], level),
            "seeds_measured": parts["seeds_measured"], "target": target,
            "items_needed": {s: items_needed(target, parts["v_items"], parts["v_seeds"], result["n"], pairs, s, level)
                             for s in seed_options}}
