"""What a task's finished arms add up to, rebuilt from the evaluation files at the end of a task.

* **sweep** (binary tasks): each RL run's val operating point against its parent SFT model's
  threshold curve (``labelrl.evaluate.sweep``): is it just a threshold on the SFT model? A direct
  RL run's greedy generations (``-generate`` evaluations) are swept too, as "RUN (greedy generation)".
* **route**: routing between each RL run and its parent (``labelrl.evaluate.route``).
* **compare**: the distillation decomposition (sft / control / cot_sft), when those arms ran.
* **paired**: every RL arm against its SFT parent, against the SFT + val-chosen threshold arm,
  against the threshold matching its own val recall (binary), and against the other RL arms
  from the same parent (ablations, with the config keys that differ), paired on the holdout
  items over items and seeds (``labelrl.evaluate.paired``), and the same on every OOD set's
  holdout (``labelrl.ladder.paired_arms``; each entry of ``paired.json`` names its ``split``).
* **family** (after ``curve_point``): every comparison of ``paired.json`` — paired, the curve and
  the majority class — as one family, Holm-corrected: the words "better" and "worse" are the
  corrected decisions, and "no detectable difference" states the smallest difference it could
  have detected (``labelrl.ladder.correction``).
* **curve_point** (binary tasks): every RL arm against its SFT parent as a curve (ΔROC-AUC of the
  label-token scores) and a point (recall and precision of its own answers), on the holdout, added
  to ``paired.json`` as kind ``curve_vs_sft`` (``labelrl.ladder.curve_vs_sft``).
* **majority**: the majority-class constant predictor's val and holdout metrics, and every trained
  arm against it (kind ``vs_majority`` in ``paired.json``; ``labelrl.ladder.majority``).
* **generation**: each direct RL arm's greedy-generation operating point on the holdout, recall
  and precision per label (``labelrl.ladder.generation_point``).
* **stability** (arms with ≥ 2 seeds): the spread of holdout balanced accuracy over seeds, the
  median step-to-step change of the mean reward and of val balanced accuracy, and CoRPO against
  GRPO from the same parent, paired by seed (``labelrl.ladder.stability``).
* **verdict**: one line per RL arm in plain words, built from the above; an arm collapsed to one
  answer is named so, never "worse" (``labelrl.ladder.collapse``).

Replicate runs (``ARM@sSEED``) are grouped under their arm. Each analysis that cannot be made
says why in the returned dict instead of failing the task.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from labelrl.fileio import atomic_write_json
from labelrl.ladder.collapse import add_collapse_and_majority, mark_collapsed
from labelrl.ladder.correction import CURVE_KIND, correct_task
from labelrl.ladder.curve_vs_sft import add_curve_point, curve_point_comparisons
from labelrl.ladder.generation_point import (add_generation_points, generated_name, generation_points, is_direct_rl,
                                            sweep_tally)
from labelrl.ladder.kinds import RL_TYPES, groups
from labelrl.ladder.layout import eval_paths
from labelrl.ladder.majority import majority_baseline, majority_comparisons
from labelrl.ladder.paired_arms import (UNCOMPARED_KEYS, add_ood_verdicts, comparison_line, config_diff, ood_names,
                                        rl_comparisons)
from labelrl.ladder.stability import add_stability, stability_analysis

__all__ = ["SFT_TYPES", "UNCOMPARED_KEYS", "analyse_task", "config_diff", "paired_comparisons", "task_verdict"]
SFT_TYPES = ("sft", "control")


def analyse_task(task, task_dir: Path, tstate: dict) -> dict:
    order = tstate.get("arm_order") or list(tstate["arms"])
    arms = {n: tstate["arms"][n] for n in order if tstate["arms"].get(n, {}).get("status") == "done"}
    if not any(st["type"] == "sft" for st in arms.values()):
        return {"note": "no finished direct SFT arm: nothing to compare against"}
    (task_dir / "analysis").mkdir(parents=True, exist_ok=True)
    steps: dict[str, Callable[[], Any]] = {
        "route": lambda: _routes(task_dir, arms),
        "sweep": lambda: _sweeps(task_dir, arms, tstate, max(task.n_boot, 1)),
        "compare": lambda: _compare(task_dir, arms, task.n_boot),
        "paired": lambda: paired_comparisons(task_dir, arms, task.n_boot, ood=list(tstate.get("ood") or [])),
        "curve_point": lambda: curve_point_comparisons(task_dir, arms, tstate, task.n_boot),  # into paired.json
        "family": lambda: correct_task(task_dir, arms),  # every comparison above as one Holm family
        "rescore": lambda: _rescores(task_dir, arms),
        "majority": lambda: majority_baseline(task_dir, arms, task.n_boot),  # the constant predictor's row
        "generation": lambda: generation_points(task_dir, arms, groups(arms)),  # direct RL arms' greedy answers
        "stability": lambda: stability_analysis(task_dir, arms, groups(arms)),  # over seeds and steps
    }
    out: dict[str, Any] = {}
    for name, make in steps.items():
        try:
            out[name] = make()
        except Exception as exc:  # an analysis that cannot be made is reported, not fatal
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
    _refresh_corrected(task_dir, out)
    out["verdict"] = task_verdict(arms, out, tstate)
    atomic_write_json(task_dir / "analysis" / "verdict.json", out["verdict"])
    try:  # the verdict at a glance: a grid and one sentence (labelrl.ladder.grid)
        out["grid"] = _grid(task_dir, out["verdict"])
    except Exception as exc:
        out["grid"] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def _rl_runs_by_parent(arms: dict[str, dict]) -> dict[str, list[str]]:
    """RL runs (and the CoT-SFT and control runs) by the direct SFT run their answers are set
    against: an RL run's parent when it is a direct SFT run (sft or control), else (CoT-RL from a
    CoT-SFT model, CoT-SFT and control themselves) the task's direct SFT run of the same seed, or
    its first one."""
    direct = [n for n, st in arms.items() if st["type"] == "sft"]
    by_parent: dict[str, list[str]] = {}
    for name, st in arms.items():
        if st["type"] not in (*RL_TYPES, "cot_sft", "control"):
            continue
        parent = st.get("from")
        if st["type"] not in RL_TYPES or parent not in arms or arms[parent]["type"] not in SFT_TYPES:
            same_seed = [n for n in direct if arms[n].get("seed") == st.get("seed")]
            parent = (same_seed or direct)[0]
        by_parent.setdefault(parent, []).append(name)
    return by_parent


def _sweeps(task_dir: Path, arms: dict[str, dict], tstate: dict, n_boot: int = 1000) -> dict:
    from labelrl.evaluate.io import read_predictions
    from labelrl.evaluate.plots import plot_roc
    from labelrl.evaluate.sweep import sweep

    if tstate["kind"] != "binary":
        return {"note": f"{tstate['kind']} labels: the threshold sweep is for binary tasks"}
    positive, verdicts, files = tstate["positive_label"], {}, {}
    for parent, children in _rl_runs_by_parent(arms).items():
        scored = read_predictions(eval_paths(task_dir, parent, "val")[0], positive_label=positive)
        if scored.scores() is None:
            continue
        others = [read_predictions(eval_paths(task_dir, n, "val")[0], positive_label=positive) for n in children]
        routed = _routed(scored, dict(zip(children, others)), task_dir)  # each cascade's operating point too
        generated = _generated(task_dir, arms, children, positive)  # what a user without logits gets
        result = sweep(scored, positive_label=positive, compare=others + list(routed.values()) + list(generated.values()),
                       n_boot=n_boot)
        result["arms"] = {"base": parent, "compared": children + list(routed) + list(generated)}
        path = task_dir / "analysis" / ("sweep.json" if not files else f"sweep-{parent}.json")
        result["plot"] = str(plot_roc(result, path.with_suffix(".roc.png")))
        atomic_write_json(path, result)
        files[parent] = str(path)
        verdicts |= {n: {"verdict": c["verdict"], "reproduced": c["reproduced"], "rests_on": c["verdict_rests_on"],
                         "item_agreement": c["item_agreement"], "item_agreement_ci": c["item_agreement_ci"],
                         "base": parent} for n, c in zip(result["arms"]["compared"], result["compared"])}
    if not files:
        return {"note": "no RL arm started from a scored (direct) SFT model"}
    pooled = _pooled_sweeps(task_dir, arms, positive, n_boot)
    if pooled:
        atomic_write_json(task_dir / "analysis" / "sweep-pooled.json", pooled)
    return {"files": files, "file": next(iter(files.values())), "verdicts": verdicts, "pooled": pooled}


def _pooled_sweeps(task_dir: Path, arms: dict[str, dict], positive: str, n_boot: int) -> dict:
    """Each replicated RL arm's ΔTPR from its parents' curves pooled over its seeds
    (``labelrl.evaluate.sweep.distance_over_seeds``: each run against its own seed's parent), by arm."""
    from labelrl.evaluate.io import read_predictions
    from labelrl.evaluate.sweep import distance_over_seeds

    out = {}
    for g, runs in groups(arms).items():
        if len(runs) < 2 or arms[runs[0]]["type"] not in RL_TYPES:
            continue
        parents = [arms[r].get("from") for r in runs]
        if any(p not in arms or arms[p]["type"] != "sft" for p in parents):
            continue
        pairs = [(read_predictions(eval_paths(task_dir, p, "val")[0], positive_label=positive),
                  read_predictions(eval_paths(task_dir, r, "val")[0], positive_label=positive)) for p, r in zip(parents, runs)]
        if any(p.scores() is None for p, _ in pairs):
            continue
        result = distance_over_seeds(pairs, positive_label=positive, n_boot=n_boot)
        out[g] = {k: result[k] for k in ("delta_tpr", "ci", "n_pairs", "n", "position", "words", "fpr", "tpr", "curve_tpr")
                  if k in result}
    return out


def _generated(task_dir: Path, arms: dict[str, dict], children: list[str], positive: str) -> dict:
    """Each direct RL child's greedy generations on val (``-generate``), by ``generated_name``."""
    from labelrl.evaluate.io import read_predictions

    paths = {n: eval_paths(task_dir, n, "val-generate")[0] for n in children if is_direct_rl(arms[n])}
    return {generated_name(n): read_predictions(p, positive_label=positive) for n, p in paths.items() if p.is_file()}


def _routed(scored, children: dict, task_dir: Path) -> dict:
    """The best cascade SFT → child (from its route file) as hard predictions, per child."""
    import json

    from labelrl.evaluate.route import routed_predictions

    out = {}
    for name, pred in children.items():
        path = task_dir / "analysis" / f"route-{name}.json"
        if path.is_file():
            best = json.loads(path.read_text(encoding="utf-8"))["cascade"]["best"]
            out[f"route → {name}"] = routed_predictions(scored, pred, best["lo"], best["hi"], name=f"route → {name}")
    return out


def _routes(task_dir: Path, arms: dict[str, dict]) -> dict:
    from labelrl.evaluate.io import read_predictions
    from labelrl.evaluate.route import route

    audit = task_dir / "audit.json"
    files = {}
    for parent, children in _rl_runs_by_parent(arms).items():
        scored = read_predictions(eval_paths(task_dir, parent, "val")[0])
        if scored.scores() is None:
            continue
        for name in children:
            result = route(scored, read_predictions(eval_paths(task_dir, name, "val")[0]), audit=audit if audit.is_file() else None)
            result["arms"] = {"a": parent, "b": name}
            path = task_dir / "analysis" / f"route-{name}.json"
            atomic_write_json(path, result)
            files[name] = str(path)
    return {"files": files}


def _rescores(task_dir: Path, arms: dict[str, dict]) -> dict:
    """Each RL run's logged rollouts re-graded by the lenient parser (labelrl.train.rescore)."""
    from labelrl.train.rescore import rescore_run

    files = {}
    for name, st in arms.items():
        if st["type"] in RL_TYPES:
            result = rescore_run(task_dir / name, "lenient", write=False)
            path = task_dir / "analysis" / f"rescore-{name}.json"
            atomic_write_json(path, result)
            files[name] = {"file": str(path), "inflation": result["overall"]["inflation"]}
    return {"files": files}


def _compare(task_dir: Path, arms: dict[str, dict], n_boot: int) -> dict:
    from labelrl.distill.compare import compare_models
    from labelrl.evaluate.io import read_predictions

    base = next(n for n, st in arms.items() if st["type"] == "sft")
    control = next((n for n, st in arms.items() if st["type"] == "control"), None)
    cot = next((n for n, st in arms.items() if st["type"] == "cot_sft"), None)
    if control is None or cot is None:
        return {"note": "needs finished control and cot_sft arms"}
    preds = [read_predictions(eval_paths(task_dir, n, "holdout")[0]) for n in (base, control, cot)]
    result = compare_models(*preds, names=[base, control, cot], n_boot=n_boot)
    result["split"] = "holdout"
    path = task_dir / "analysis" / "compare.json"
    atomic_write_json(path, result)
    return {"file": str(path), "filter_effect": result["filter_effect"], "objective_effect": result["objective_effect"]}


def _grid(task_dir: Path, verdicts: list[dict]) -> dict:
    """The task's grid from its verdict entries and ``paired.json``, saved as ``analysis/grid.json``."""
    import json

    from labelrl.ladder.grid import task_grid

    path = task_dir / "analysis" / "paired.json"
    comparisons = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else []
    grid = task_grid([v for v in verdicts if v.get("runs")], comparisons)
    atomic_write_json(task_dir / "analysis" / "grid.json", grid)
    return grid


def _refresh_corrected(task_dir: Path, out: dict) -> None:
    """The ``paired`` and ``curve_point`` summaries re-read from ``paired.json`` once the family
    correction rewrote its words (``labelrl.ladder.correction``)."""
    import json

    path = task_dir / "analysis" / "paired.json"
    family = out.get("family") or {}
    if "error" in family or not path.is_file():
        return
    comparisons = json.loads(path.read_text(encoding="utf-8"))
    if isinstance(out.get("paired"), dict) and "comparisons" in out["paired"]:
        out["paired"]["comparisons"] = paired_summary([c for c in comparisons if c.get("kind") != CURVE_KIND])
    if isinstance(out.get("curve_point"), dict) and "comparisons" in out["curve_point"]:
        out["curve_point"]["comparisons"] = [{"kind": CURVE_KIND, "a": c["a"], "b": c["b"], "curve": c["result"]["curve"],
                                              "point": c["result"]["point"]}
                                             for c in comparisons if c.get("kind") == CURVE_KIND]


# ---------------------------------------------------------------- paired comparisons


def paired_summary(comparisons: list[dict]) -> list[dict]:
    """The verdict's view of ``paired.json`` entries: kind, split, sides, verdict and words."""
    from labelrl.evaluate.paired import verdict_words

    return [{k: c[k] for k in ("kind", "split", "a", "b")}
            | {"verdict": c["result"]["verdict"], "words": c.get("words") or verdict_words(c["result"])}
            for c in comparisons]


def paired_comparisons(task_dir: Path, arms: dict[str, dict], n_boot: int, ood: list[str] | None = None) -> dict:
    """Every paired comparison the module docstring lists, on the holdout and on each OOD set
    (``ood``; default: every set an arm was scored on), saved as ``analysis/paired.json``."""
    grouped = groups(arms)
    rl_groups = [g for g, runs in grouped.items() if arms[runs[0]]["type"] in RL_TYPES]
    left_out: dict[str, str] = {}
    comparisons = rl_comparisons(task_dir, arms, grouped, rl_groups, "holdout", n_boot, left_out)
    comparisons += [c | {"split": "holdout"} for c in majority_comparisons(task_dir, arms, grouped, n_boot)]
    for name in ood_names(arms) if ood is None else ood:  # the same comparisons out of domain
        comparisons += rl_comparisons(task_dir, arms, grouped, rl_groups, f"ood-{name}", n_boot, left_out)
    mark_collapsed(comparisons, arms, task_dir)  # a collapsed, unmoved or signal-less side is named as such
    path = task_dir / "analysis" / "paired.json"
    atomic_write_json(path, comparisons)
    return {"file": str(path), "left_out": left_out, "comparisons": paired_summary(comparisons)}


# ---------------------------------------------------------------- the verdict


def _sweep_summary(runs: list[str], sweeps: dict, pooled: dict | None = None) -> str | None:
    """"operating point on the curve (…)": one run's sweep verdict; several seeds: the ΔTPR pooled
    over them (its position and interval) with the per-seed tally beside it."""
    found = [sweeps[r] for r in runs if r in sweeps]
    if not found:
        return None
    if len(found) == 1:
        return f"operating point {found[0]['verdict']}"
    tally = sweep_tally(found)
    if pooled and not any(f["verdict"].startswith("uninformative") for f in found):
        return f"operating point {pooled['position']} ({pooled['words']}; by seed: {tally})"
    return f"operating point against a threshold on the SFT model: {tally}"


def task_verdict(arms: dict[str, dict], analysis: dict, tstate: dict) -> list[dict]:
    """One entry per RL arm: its paired verdicts against SFT, SFT + threshold and the
    recall-matched threshold (holdout), its ablations against RL arms from the same parent
    (``ablation``, under both arms), the sweep's verdict and its failed-positive fraction, the
    curve and the point, the same comparisons on each OOD set (``ood``), a direct arm's greedy
    generation point (``generation``), the figures over seeds (``stability``), and the sentence
    that says them (``text``)."""
    grouped = groups(arms)
    paired = analysis.get("paired") or {}
    shown = {"vs_sft": "vs {a}", "vs_threshold": "vs {a} (SFT + threshold chosen on val)",
             "vs_recall_matched": "vs SFT at its own val recall"}
    by_pair = {(c["kind"], c["b"]): f"{shown[c['kind']].format(a=c['a'])}: {c.get('words') or c['verdict']}"
               for c in paired.get("comparisons", []) if c["kind"] in shown and c.get("split", "holdout") == "holdout"}
    ablations: dict[str, list[str]] = {}  # B − A of two RL arms from one parent, stated under both arms
    for c in paired.get("comparisons", []):
        if c["kind"] == "ablation" and c.get("split", "holdout") == "holdout":
            for arm in (c["b"], c["a"]):
                ablations.setdefault(arm, []).append(comparison_line(c))
    sweeps = (analysis.get("sweep") or {}).get("verdicts") or {}
    pooled = (analysis.get("sweep") or {}).get("pooled") or {}
    threshold_text = tstate.get("success_threshold")
    out = []
    for g, runs in grouped.items():
        if arms[runs[0]]["type"] not in RL_TYPES:
            continue
        parts = [by_pair.get((kind, g)) for kind in ("vs_sft", "vs_threshold", "vs_recall_matched")]
        fp = [arms[r].get("train", {}).get("failed_positive_frac") for r in runs]
        fp = [v for v in fp if v is not None]
        failed = (f"failed-positive fraction {sum(fp) / len(fp):.3f} (failed: reward below "
                  f"{threshold_text if threshold_text is not None else 'full credit'})") if fp else None
        sweep = _sweep_summary(runs, sweeps, pooled.get(g))
        lines = [p for p in parts if p] + ablations.get(g, []) + [x for x in (sweep, failed) if x]
        note = "" if paired.get("comparisons") else f"; paired comparisons not made: {paired.get('error') or paired.get('note')}"
        out.append({"arm": g, "runs": runs, "vs_sft": parts[0], "vs_threshold": parts[1], "vs_recall_matched": parts[2],
                    "ablation": ablations.get(g) or None, "sweep": sweep, "failed_positive": failed, "text": f"{g}: " + "; ".join(lines) + note})
    add_curve_point(out, analysis.get("curve_point"))  # binary tasks: the curve (ranking) and the point (answers)
    add_ood_verdicts(out, paired)  # the same comparisons on each OOD set
    add_generation_points(out, analysis.get("generation"), sweeps)  # direct RL: the answers without logits
    add_stability(out, analysis.get("stability"))  # ≥ 2 seeds: spread and step changes; CoRPO vs GRPO
    add_collapse_and_majority(out, arms, tstate, paired)  # collapsed, no signal, unmoved: named first; vs the majority class
    return out
