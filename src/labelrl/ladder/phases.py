"""Where a ladder's time went: training per arm, scoring, analyses, from ``ladder.json``.

Each arm records ``seconds_train`` (its training, with every tuning candidate and the
candidates' val scoring) and ``seconds_eval`` (its val, holdout, out-of-domain and other
evaluations); an arm with neither (a threshold arm: a rule on its parent's scores) counts its
``seconds`` as scoring. Each task records ``seconds_analysis`` (sweeps, routing, paired
comparisons). Arms finished in an earlier invocation keep the times they took then.
"""

from __future__ import annotations

from labelrl.ladder.kinds import FAMILY

PHASES = ("train", "scoring", "analysis")


def phase_times(state: dict) -> list[dict]:
    """Rows ``{task, phase, what, seconds}`` in run order: one per trained arm, then the task's
    scoring (every arm's evaluations together) and analyses. Arms not run have no row."""
    rows: list[dict] = []
    for task_name in state.get("task_order") or list(state.get("tasks", {})):
        task = state["tasks"][task_name]
        scoring = 0.0
        for arm_name in task.get("arm_order") or list(task.get("arms", {})):
            arm = task.get("arms", {}).get(arm_name) or {}
            if "seconds_train" in arm:
                family = FAMILY.get(arm.get("type", ""), arm.get("type", "?"))
                rows.append({"task": task_name, "phase": "train", "what": f"{arm_name} ({family})",
                             "seconds": float(arm["seconds_train"])})
                scoring += float(arm.get("seconds_eval", 0.0))
            elif arm.get("seconds") is not None:
                scoring += float(arm["seconds"])
        rows.append({"task": task_name, "phase": "scoring", "what": "every arm's evaluations", "seconds": scoring})
        if task.get("seconds_analysis") is not None:
            rows.append({"task": task_name, "phase": "analysis", "what": "sweeps, routing, paired comparisons",
                         "seconds": float(task["seconds_analysis"])})
    return rows

