"""The paired comparisons of the RL arms, on the holdout and on every out-of-domain holdout.

For each evaluation set (``holdout``, and ``ood-NAME`` for each of the task's ``ood`` sets) every
RL arm is compared, paired on that set's items over items and seeds
(``labelrl.evaluate.paired``), with

* its SFT parent (kind ``vs_sft``);
* the SFT + threshold arm from that parent, its rule chosen on val (``vs_threshold``);
* binary tasks: the threshold matching its own val recall (``vs_recall_matched``);
* every other RL arm from the same parent arm (``ablation``, with the config keys that differ).

With replicate seeds, run k of both sides descends from the same SFT run (seed k's) in every one
of these, so the bootstrap resamples seeds together (``seeds_paired``): the parent's training
noise, shared by both sides, cancels from Δ.

Every entry carries ``split``. On an OOD set the threshold arms have no evaluation of their own:
their side is the parent's OOD predictions (its one OOD look) under the same val-chosen rule
(``labelrl.evaluate.decision.apply_rule``), so no rule is chosen on, and nothing new looked at,
out of domain. A comparison whose OOD predictions are missing (or unscored for a rule) is left
out with the reason (``left_out``), never made on fewer items.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from labelrl.ladder.layout import eval_paths
from labelrl.ladder.derived import matched_name

# Config keys that say where a run lives or how it is logged, not what it does.
UNCOMPARED_KEYS = {"out", "quiet", "report_to", "resume", "stop_after", "checkpoint_every", "seed",
                   "collapse_share", "collapse_steps", "collapse_max_lift",  # the collapse detector only reads
                   "val_path", "eval_limit", "val_path_within", "val_path_start", "val_path_end"}  # an RL run's path on val: scored, never trained on
HOLDOUT = "holdout"
KIND_WORDS = {"vs_sft": "vs {a}", "vs_threshold": "vs {a} (SFT + threshold chosen on val)",
              "vs_recall_matched": "vs SFT at its own val recall", "ablation": "ablation {b} vs {a} (same parent)"}


def config_diff(a: dict, b: dict) -> dict[str, list]:
    """Resolved config keys (and resolved algorithm knobs) whose values differ: {key: [a, b]}."""
    def flat(st: dict) -> dict:
        out = {k: v for k, v in (st.get("config") or {}).items() if k not in UNCOMPARED_KEYS}
        out.update({f"algorithm.{k}": v for k, v in (st.get("algorithm") or {}).items()})
        return out

    fa, fb = flat(a), flat(b)
    return {k: [fa.get(k), fb.get(k)] for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k) and k != "model"}


def ood_names(arms: dict[str, dict]) -> list[str]:
    """The OOD sets any finished arm was scored on, in the order first met."""
    return list(dict.fromkeys(name for st in arms.values() for name in (st.get("ood") or {})))


def derived_rules(arms: dict[str, dict]) -> dict[str, tuple[str, dict]]:
    """Threshold runs and their recall-matched evaluations: name → (parent run, val-chosen rule)."""
    out: dict[str, tuple[str, dict]] = {}
    for t, st in arms.items():
        if st["type"] == "threshold" and st.get("rule"):
            out[t] = (st["from"], st["rule"])
            for rl, m in (st.get("matched") or {}).items():
                if m.get("rule"):
                    out[matched_name(t, rl)] = (st["from"], m["rule"])
    return out


def predictions_on(task_dir: Path, tag: str, rules: dict[str, tuple[str, dict]]) -> Callable[[str], object]:
    """name → its Predictions on ``tag``: the evaluation file, or on an OOD set a threshold's
    parent's predictions under its rule (module docstring)."""
    from labelrl.evaluate.decision import apply_rule
    from labelrl.evaluate.io import read_predictions

    def load(name: str):
        if tag != HOLDOUT and name in rules:
            parent, rule = rules[name]
            return apply_rule(read_predictions(eval_paths(task_dir, parent, tag)[0]), rule, source=f"{name} ({tag})")
        return read_predictions(eval_paths(task_dir, name, tag)[0])

    return load


def root_run(arms: dict[str, dict], name: str, rules: dict[str, tuple[str, dict]] | None = None) -> str:
    """The SFT-family run a run descends from (its own name for one): follows ``from``, and a derived
    threshold evaluation's parent (``rules``)."""
    seen = set()
    while name not in seen:
        seen.add(name)
        if rules and name in rules:
            name = rules[name][0]
            continue
        st = arms.get(name) or {}
        if st.get("type") in ("sft", "control") or not st.get("from"):
            return name
        name = st["from"]
    return name


def seeds_paired(arms: dict[str, dict], a_runs: list[str], b_runs: list[str],
                 rules: dict[str, tuple[str, dict]] | None = None) -> bool:
    """True when both arms hold several runs and run k of each descends from the same SFT run (seed k's):
    the paired bootstrap then resamples seeds together (``labelrl.evaluate.paired``)."""
    return (len(a_runs) == len(b_runs) > 1
            and [root_run(arms, r, rules) for r in a_runs] == [root_run(arms, r, rules) for r in b_runs])


def _threshold_runs(arms: dict[str, dict], parent_runs: list[str]) -> list[str]:
    return [n for n, st in arms.items() if st["type"] == "threshold" and st.get("from") in parent_runs]


def _has(task_dir: Path, tag: str, rules: dict, name: str) -> bool:
    return name in rules if tag != HOLDOUT else eval_paths(task_dir, name, tag)[0].is_file()


def rl_comparisons(task_dir: Path, arms: dict[str, dict], grouped: dict[str, list[str]], rl_groups: list[str],
                   tag: str, n_boot: int, left_out: dict[str, str]) -> list[dict]:
    """The comparisons of the module docstring on evaluation set ``tag``; on an OOD set a comparison
    that cannot be made goes to ``left_out`` ("KIND B vs A on TAG" → why)."""
    from labelrl.evaluate.paired import paired_comparison

    rules = derived_rules(arms)
    load = predictions_on(task_dir, tag, rules)
    out: list[dict] = []

    def add(kind: str, a: str, b: str, a_runs: list[str], b_runs: list[str], **extra) -> None:
        try:
            result = paired_comparison([load(r) for r in a_runs], [load(r) for r in b_runs], names=(a, b),
                                       n_boot=max(n_boot, 1), seeds_paired=seeds_paired(arms, a_runs, b_runs, rules))
        except (FileNotFoundError, ValueError) as exc:
            if tag == HOLDOUT:
                raise
            left_out[f"{kind} {b} vs {a} on {tag}"] = f"{type(exc).__name__}: {exc}"
            return
        out.append({"kind": kind, "split": tag, "a": a, "b": b, "a_runs": a_runs, "b_runs": b_runs, **extra,
                    "result": result})

    for g in rl_groups:
        runs = grouped[g]
        parent_runs = list(dict.fromkeys(arms[r]["from"] for r in runs))
        add("vs_sft", arms[parent_runs[0]].get("replicate_of") or parent_runs[0], g, parent_runs, runs)
        thresholds = _threshold_runs(arms, parent_runs)
        if thresholds:
            t_group = arms[thresholds[0]].get("replicate_of") or thresholds[0]
            add("vs_threshold", t_group, g, thresholds, runs)
            matched = [(t, r) for r in runs for t in thresholds if arms[t]["from"] == arms[r]["from"]
                       and _has(task_dir, tag, rules, matched_name(t, r))]
            if len(matched) == len(runs):
                add("vs_recall_matched", f"{t_group} at {g}'s val recall", g, [matched_name(t, r) for t, r in matched], runs)
    for i, g in enumerate(rl_groups):  # ablations: RL arms from the same parent arm
        for h in rl_groups[i + 1:]:
            if {arms[r]["from"] for r in grouped[g]} == {arms[r]["from"] for r in grouped[h]}:
                add("ablation", g, h, grouped[g], grouped[h], config_diff=config_diff(arms[grouped[g][0]], arms[grouped[h][0]]))
    return out


def comparison_line(c: dict) -> str:
    """"vs sft: worse (ΔBA …)" for a verdict summary entry of ``paired_comparisons`` (an ablation:
    "ablation corpo vs grpo (same parent): …", the difference B − A)."""
    return f"{KIND_WORDS[c['kind']].format(a=c['a'], b=c['b'])}: {c.get('words') or c['verdict']}"


def add_ood_verdicts(verdicts: list[dict], paired: dict | None) -> None:
    """Give each RL arm's verdict ``ood`` ({set: [lines]}: its comparisons on each OOD set, an
    ablation under both of its arms) and append "on OOD NAME: …" to its ``text``."""
    by_arm: dict[str, dict[str, list[str]]] = {}
    for c in (paired or {}).get("comparisons", []):
        split = c.get("split", HOLDOUT)
        if split == HOLDOUT or c["kind"] not in KIND_WORDS:
            continue
        for arm in (c["b"], c["a"]) if c["kind"] == "ablation" else (c["b"],):
            by_arm.setdefault(arm, {}).setdefault(split.removeprefix("ood-"), []).append(comparison_line(c))
    for v in verdicts:
        v["ood"] = by_arm.get(v["arm"]) or None
        for name, lines in (v["ood"] or {}).items():
            v["text"] += f"; on OOD {name}: " + "; ".join(lines)
