"""An RL arm collapsed to one answer, as the ladder names it (the flag: labelrl.train.collapse).

* **Verdict.** A collapsed arm's verdict line starts "collapsed to L at step S", and a paired
  comparison it loses is worded as the collapse, never "worse": "vs sft: collapsed to ham at
  step 5 (ΔBA -0.325 [-0.410, -0.226] over 128 items: the collapse, not the method)". The
  numbers stay; the words say what they measure. Every verdict entry gets ``collapsed`` (None,
  or the text and each collapsed run's flag) and ``vs_majority`` (its comparison with the
  majority class, labelrl.ladder.majority).
* **on_collapse: stop.** An arm flagged collapsed after training is not evaluated at all (no
  holdout look is spent on a constant answer); its status is ``collapsed``, so the arms that
  start from it are skipped with that reason, and its verdict line says so.

An arm with several seeds is collapsed when any of its runs is: its paired intervals average
over the seeds, the collapsed ones included.
"""

from __future__ import annotations

from typing import Any

from labelrl.train.collapse import collapse_detail, collapse_text

COLLAPSED = "collapsed"  # the status of an arm stopped on collapse


def run_flag(st: dict) -> dict | None:
    """An arm's collapse flag as ``rl_training_summary`` recorded it (None: not collapsed)."""
    return (st.get("train") or {}).get("collapse")


def stops_on_collapse(task, st: dict) -> bool:
    """True when the task stops collapsed arms (``on_collapse: stop``) and this run collapsed."""
    return getattr(task, "on_collapse", "continue") == "stop" and run_flag(st) is not None


def group_collapse(arms: dict[str, dict], runs: list[str]) -> dict | None:
    """``{"text", "runs": {run: flag}}`` of an arm's collapsed runs, or None when none collapsed.
    One run: "collapsed to ham at step 5"; several seeds: "collapsed in 2 of 3 seeds (…)"."""
    flags = {r: run_flag(arms[r]) for r in runs if r in arms and run_flag(arms[r]) is not None}
    if not flags:
        return None
    if len(runs) == 1:
        text = collapse_text(flags[runs[0]])
    else:
        each = ", ".join(f"{r} {collapse_text(f).removeprefix('collapsed ')}" for r, f in flags.items())
        text = f"collapsed in {len(flags)} of {len(runs)} seeds ({each})"
    return {"text": text, "runs": flags}


def comparison_words(c: dict, arms: dict[str, dict]) -> str:
    """A paired comparison's words (``labelrl.evaluate.paired.verdict_words``), unless the side
    that loses it is collapsed: then the collapse, with the same numbers."""
    from labelrl.evaluate.paired import verdict_words

    words = verdict_words(c["result"])
    head, _, numbers = words.partition(" (")
    loser = {"worse": "b", "better": "a"}.get(head)
    collapsed = group_collapse(arms, c.get(f"{loser}_runs") or []) if loser else None
    if collapsed is None:
        return words
    who = "" if loser == "b" else f"{c['a']} "
    return f"{who}{collapsed['text']} ({numbers.removesuffix(')')}: the collapse, not the method)"


def mark_collapsed(comparisons: list[dict], arms: dict[str, dict]) -> None:
    """Give every paired comparison with a collapsed side ``collapsed`` ({side: text}) and its
    ``words`` (``comparison_words``), in place, for paired.json and the report."""
    for c in comparisons:
        sides = {side: group_collapse(arms, c.get(f"{side}_runs") or []) for side in ("a", "b")}
        if any(sides.values()):
            c["collapsed"] = {side: v["text"] for side, v in sides.items() if v}
            c["words"] = comparison_words(c, arms)


def add_collapse_and_majority(out: list[dict], arms: dict[str, dict], tstate: dict, paired: dict) -> None:
    """Complete the task's verdict entries in place: ``collapsed`` and the text's opening words
    for collapsed arms, ``vs_majority`` (appended to the text), and one entry per arm stopped on
    collapse (status ``collapsed``: evaluated on nothing)."""
    majority = {c["b"]: f"vs {c['a']}: {c.get('words') or c['verdict']}"
                for c in (paired or {}).get("comparisons", []) if c["kind"] == "vs_majority"}
    for entry in out:
        g = entry["arm"]
        collapsed = group_collapse(arms, entry["runs"])
        entry["collapsed"] = collapsed
        entry["vs_majority"] = majority.get(g)
        if collapsed is not None:
            entry["text"] = f"{g}: {collapsed['text']}; " + entry["text"].removeprefix(f"{g}: ")
        if entry["vs_majority"]:
            entry["text"] += f"; {entry['vs_majority']}"
    by_arm = {entry["arm"]: entry for entry in out}
    for entry in stopped_entries(tstate):
        if entry["arm"] in by_arm:  # some seeds evaluated, others stopped: one line for the arm
            by_arm[entry["arm"]]["text"] += "; " + entry["text"].removeprefix(f"{entry['arm']}: ")
        else:
            out.append(entry)


def stopped_entries(tstate: dict) -> list[dict[str, Any]]:
    """One verdict entry per arm stopped on collapse (``on_collapse: stop``), replicates grouped."""
    stopped: dict[str, list[str]] = {}
    for name, st in (tstate.get("arms") or {}).items():
        if st.get("status") == COLLAPSED:
            stopped.setdefault(st.get("replicate_of") or name, []).append(name)
    out = []
    for g, runs in stopped.items():
        arms = tstate["arms"]
        details = "; ".join(("" if r == g else f"{r} ") + collapse_detail(run_flag(arms[r])) for r in runs)
        out.append({"arm": g, "runs": runs, "vs_sft": None, "vs_threshold": None, "vs_recall_matched": None,
                    "vs_majority": None, "sweep": None, "failed_positive": None, "collapsed": group_collapse(arms, runs),
                    "text": f"{g}: {details}; on_collapse: stop, so not evaluated (no holdout look)"})
    return out
