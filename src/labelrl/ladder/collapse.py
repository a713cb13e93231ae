"""RL arms whose numbers are not a method result, as the ladder names them: collapsed to one
answer (the flag: labelrl.train.collapse), no learning signal, and did not move its parent.

* **Collapsed.** A collapsed arm's verdict line starts "collapsed to L at step S" (or, when its
  parent was already collapsed to L, "collapsed to L (inherited from sft)", naming the arm's
  ``from``), and a paired comparison it loses is worded as the collapse, never "worse": "vs sft:
  collapsed to ham at step 5 (ΔBA -0.325 [-0.410, -0.226] over 128 items: the collapse, not the
  method)". The numbers stay; the words say what they measure.
* **No learning signal.** A step is uniform when every one of its groups had G equal rewards
  (``groups/uniform_frac`` = 1 in the run's metrics.jsonl): no completion was preferred to
  another within its group. A run with more than half of its steps uniform reads "no learning
  signal (k of n steps uniform)": what it scores is its parent's model plus noise, not the method.
* **Did not move its parent.** An RL arm whose holdout answers equal its parent's (the arm's
  ``from``) on at least 99% of the items both were scored on reads "did not move its parent
  (answers identical on 99.6% of items)".

The last two are *not a method result*: a paired comparison with such a side gets
``not_a_result`` ({side: text}) and words that say so in front of the numbers: "did not move
its parent (answers identical on 99.6% of items): not a result (ΔBA +0.000 …)". Every verdict
entry gets ``collapsed`` (None, or the text and each collapsed run's flag), ``no_signal`` and
``unmoved`` (None or the text), and ``vs_majority`` (its comparison with the majority class,
labelrl.ladder.majority); its text starts with the words that apply.

**on_collapse: stop.** An arm flagged collapsed after training is not evaluated (no holdout
look is spent on a constant answer); its status is ``collapsed``, so the arms that start from it
are skipped with that reason, and its verdict line says so. An RL run whose path on val ends at
its own val scores (``--val-path-end``) is scored on val first: its flag is made with that point.

An arm with several seeds is named when any of its runs is: its paired intervals average over
the seeds, the named ones included.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from labelrl import metrics_keys as K
from labelrl.fileio import read_jsonl
from labelrl.ladder.kinds import RL_TYPES
from labelrl.train.collapse import collapse_detail, collapse_text

COLLAPSED = "collapsed"  # the status of an arm stopped on collapse
NO_SIGNAL_SHARE = 0.5  # more than this share of the steps uniform: no learning signal
UNMOVED_SHARE = 0.99  # answers identical to the parent's on at least this share of the items: did not move it


def run_flag(st: dict) -> dict | None:
    """An arm's collapse flag as ``rl_training_summary`` recorded it (None: not collapsed)."""
    return (st.get("train") or {}).get("collapse")


def stops_on_collapse(task, st: dict) -> bool:
    """True when the task stops collapsed arms (``on_collapse: stop``) and this run collapsed."""
    return getattr(task, "on_collapse", "continue") == "stop" and run_flag(st) is not None


def _per_run(runs: list[str], texts: dict[str, str], head: str, strip: str) -> str | None:
    """One run: its text; several seeds: "HEAD in 2 of 3 seeds (run1 …, run2 …)"; None when none."""
    if not texts:
        return None
    if len(runs) == 1:
        return texts[runs[0]]
    each = ", ".join(f"{r} {t.removeprefix(strip)}" for r, t in texts.items())
    return f"{head} in {len(texts)} of {len(runs)} seeds ({each})"


def group_collapse(arms: dict[str, dict], runs: list[str]) -> dict | None:
    """``{"text", "runs": {run: flag}}`` of an arm's collapsed runs, or None when none collapsed.
    One run: "collapsed to ham at step 5" (inherited: "collapsed to ham (inherited from sft)", the
    run's ``from``); several seeds: "collapsed in 2 of 3 seeds (…)"."""
    flags = {r: run_flag(arms[r]) for r in runs if r in arms and run_flag(arms[r]) is not None}
    texts = {r: collapse_text(f, arms[r].get("from")) for r, f in flags.items()}
    text = _per_run(runs, texts, "collapsed", "collapsed ")
    return None if text is None else {"text": text, "runs": flags}


# ---------------------------------------------------------------- no learning signal


def no_signal_text(uniform_fracs: Sequence[float | None]) -> str | None:
    """"no learning signal (k of n steps uniform)" when more than half of the n steps with a
    ``groups/uniform_frac`` had it at 1 (every group uniform), else None (None values: not logged)."""
    logged = [float(v) for v in uniform_fracs if isinstance(v, (int, float))]
    uniform = sum(v >= 1.0 for v in logged)
    if not logged or uniform <= NO_SIGNAL_SHARE * len(logged):
        return None
    return f"no learning signal ({uniform} of {len(logged)} steps uniform)"


def run_no_signal(task_dir: Path, arms: dict[str, dict], run: str) -> str | None:
    """``no_signal_text`` of an RL run from ``task_dir / run / "metrics.jsonl"`` (None: not RL)."""
    if run not in arms or arms[run].get("type") not in RL_TYPES:
        return None
    return no_signal_text([r.get(K.UNIFORM_FRAC) for r in read_jsonl(Path(task_dir) / run / "metrics.jsonl")])


def group_no_signal(arms: dict[str, dict], runs: list[str], task_dir: Path | None) -> str | None:
    """An arm's "no learning signal (…)" over its runs ("no learning signal in 1 of 3 seeds (…)"),
    or None (also without a task directory to read)."""
    if task_dir is None:
        return None
    texts = {r: t for r in runs if (t := run_no_signal(task_dir, arms, r))}
    return _per_run(runs, texts, "no learning signal", "no learning signal ")


# ---------------------------------------------------------------- did not move its parent


def identical_share(ids: Sequence[str], answers: Sequence[str | None], parent_ids: Sequence[str],
                    parent_answers: Sequence[str | None]) -> float | None:
    """The share of the items both were scored on (by id) whose answers are equal (two unparsed
    answers are equal); None when they share no item."""
    parent = dict(zip(parent_ids, parent_answers))
    shared = [(a, parent[i]) for i, a in zip(ids, answers) if i in parent]
    return sum(a == b for a, b in shared) / len(shared) if shared else None


def unmoved_text(share: float | None) -> str | None:
    """"did not move its parent (answers identical on 99.6% of items)" at ``share`` ≥ 0.99, else None."""
    if share is None or share < UNMOVED_SHARE:
        return None
    return f"did not move its parent (answers identical on {100 * share:.1f}% of items)"


def run_unmoved(task_dir: Path, arms: dict[str, dict], run: str) -> str | None:
    """``unmoved_text`` of an RL run against its parent (``from``) on the holdout, from their
    prediction files; None when not RL or either file is missing."""
    from labelrl.evaluate.io import read_predictions
    from labelrl.ladder.layout import eval_paths

    st = arms.get(run) or {}
    if st.get("type") not in RL_TYPES or not st.get("from"):
        return None
    mine, parent = (eval_paths(Path(task_dir), name, "holdout")[0] for name in (run, st["from"]))
    if not (mine.is_file() and parent.is_file()):
        return None
    a, b = read_predictions(mine), read_predictions(parent)
    return unmoved_text(identical_share(a.ids, a.y_pred, b.ids, b.y_pred))


def group_unmoved(arms: dict[str, dict], runs: list[str], task_dir: Path | None) -> str | None:
    """An arm's "did not move its parent (…)" over its runs, or None (also without a task directory)."""
    if task_dir is None:
        return None
    texts = {r: t for r in runs if (t := run_unmoved(task_dir, arms, r))}
    return _per_run(runs, texts, "did not move its parent", "did not move its parent ")


def not_a_result(arms: dict[str, dict], runs: list[str], task_dir: Path | None) -> str | None:
    """Why an arm's numbers are not a method result ("no learning signal (…); did not move its
    parent (…)"), or None."""
    found = [group_no_signal(arms, runs, task_dir), group_unmoved(arms, runs, task_dir)]
    return "; ".join(t for t in found if t) or None


# ---------------------------------------------------------------- paired comparisons and verdicts


def comparison_words(c: dict, arms: dict[str, dict]) -> str:
    """A paired comparison's words (``labelrl.evaluate.paired.verdict_words``), unless a side is
    not a method result (``c["not_a_result"]``): then that, "not a result" and the numbers; or
    unless the side that loses it is collapsed: then the collapse, with the same numbers."""
    from labelrl.evaluate.paired import verdict_words

    words = verdict_words(c["result"])
    head, _, numbers = words.partition(" (")
    numbers = numbers.removesuffix(")")
    if c.get("not_a_result"):
        # the short names ("no learning signal in 3 of 3 seeds"): the arm's own line gives the details.
        # B is the arm whose line this is, so it goes unnamed, unless A is named beside it (an
        # ablation of two arms that both learned nothing: "grpo …; dr_grpo …").
        odd = c["not_a_result"]
        why = "; ".join(("" if side == "b" and len(odd) == 1 else f"{c[side]} ")
                        + " and ".join(t.split(" (")[0] for t in text.split("; ")) for side, text in odd.items())
        return f"{why}: not a result ({numbers})"
    loser = {"worse": "b", "better": "a"}.get(head)
    collapsed = group_collapse(arms, c.get(f"{loser}_runs") or []) if loser else None
    if collapsed is None:
        return words
    who = "" if loser == "b" else f"{c['a']} "
    return f"{who}{collapsed['text']} ({numbers}: the collapse, not the method)"


def mark_collapsed(comparisons: list[dict], arms: dict[str, dict], task_dir: Path | None = None) -> None:
    """Give every paired comparison with a collapsed side ``collapsed`` ({side: text}), with a side
    that is not a method result ``not_a_result`` ({side: text}; needs ``task_dir`` to read the
    runs' files, else not judged), and either one its ``words`` (``comparison_words``), in place,
    for paired.json and the report."""
    for c in comparisons:
        runs = {side: c.get(f"{side}_runs") or [] for side in ("a", "b")}
        collapsed = {side: v["text"] for side, r in runs.items() if (v := group_collapse(arms, r))}
        odd = {side: t for side, r in runs.items() if (t := not_a_result(arms, r, task_dir))}
        if collapsed:
            c["collapsed"] = collapsed
        if odd:
            c["not_a_result"] = odd
        if collapsed or odd:
            c["words"] = comparison_words(c, arms)


def _task_dir_of(paired: dict | None) -> Path | None:
    """The task directory ``analysis/paired.json`` was written in (``paired["file"]``), if any."""
    file = (paired or {}).get("file")
    return Path(file).parent.parent if file else None


def _name_first(entry: dict, words: Sequence[str | None]) -> None:
    """Start the entry's text with the ``words`` that apply: "grpo: WORDS; rest"."""
    g, found = entry["arm"], [w for w in words if w]
    if found:
        entry["text"] = f"{g}: " + "; ".join(found) + "; " + entry["text"].removeprefix(f"{g}: ")


def add_collapse_and_majority(out: list[dict], arms: dict[str, dict], tstate: dict, paired: dict,
                              task_dir: Path | None = None) -> None:
    """Complete the task's verdict entries in place: ``collapsed``, ``no_signal`` and ``unmoved``
    and the text's opening words where they apply, ``vs_majority`` (appended to the text), and
    one entry per arm stopped on collapse (status ``collapsed``: evaluated on nothing).
    ``task_dir``: where the runs' files are (default: the one ``paired["file"]`` is in; without
    either, ``no_signal`` and ``unmoved`` are None)."""
    task_dir = task_dir if task_dir is not None else _task_dir_of(paired)
    majority = {c["b"]: f"vs {c['a']}: {c.get('words') or c['verdict']}"
                for c in (paired or {}).get("comparisons", []) if c["kind"] == "vs_majority"}
    for entry in out:
        g = entry["arm"]
        entry["collapsed"] = group_collapse(arms, entry["runs"])
        entry["no_signal"] = group_no_signal(arms, entry["runs"], task_dir)
        entry["unmoved"] = group_unmoved(arms, entry["runs"], task_dir)
        entry["vs_majority"] = majority.get(g)
        _name_first(entry, [entry["no_signal"], entry["unmoved"], (entry["collapsed"] or {}).get("text")])
        if entry["vs_majority"]:
            entry["text"] += f"; {entry['vs_majority']}"
    by_arm = {entry["arm"]: entry for entry in out}
    for entry in stopped_entries(tstate):
        if entry["arm"] in by_arm:  # some seeds evaluated, others stopped: one line for the arm
            by_arm[entry["arm"]]["text"] += "; " + entry["text"].removeprefix(f"{entry['arm']}: ")
        else:
            entry["no_signal"] = group_no_signal(tstate["arms"], entry["runs"], task_dir)
            _name_first(entry, [entry["no_signal"]])
            out.append(entry)


def stopped_entries(tstate: dict) -> list[dict[str, Any]]:
    """One verdict entry per arm stopped on collapse (``on_collapse: stop``), replicates grouped."""
    stopped: dict[str, list[str]] = {}
    for name, st in (tstate.get("arms") or {}).items():
        if st.get("status") == COLLAPSED:
            stopped.setdefault(st.get("replicate_of") or name, []).append(name)
    out = []
    arms = tstate.get("arms") or {}
    for g, runs in stopped.items():
        details = "; ".join(("" if r == g else f"{r} ") + collapse_detail(run_flag(arms[r]), arms[r].get("from"))
                            for r in runs)
        out.append({"arm": g, "runs": runs, "vs_sft": None, "vs_threshold": None, "vs_recall_matched": None,
                    "vs_majority": None, "sweep": None, "failed_positive": None, "collapsed": group_collapse(arms, runs),
                    "no_signal": None, "unmoved": None,
                    "text": f"{g}: {details}; on_collapse: stop, so not evaluated (no holdout look)"})
    return out
