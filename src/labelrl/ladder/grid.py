"""The verdict at a glance: one grid per task and one sentence that answers the question.

Rows are the task's RL arms; columns are the comparisons the verdict makes — against the SFT
parent, SFT + the val-chosen threshold and the majority class on the holdout, against the SFT
parent on each out-of-domain set, the ranking (ΔROC-AUC, binary tasks) and the sweep — and the
failed-positive fraction. Every cell is read from the corrected decisions
(``labelrl.evaluate.paired.tested``, Holm within the task's family), never from the raw intervals:

* ``▲ +0.028`` better, ``▼ -0.062`` worse (Δ of balanced accuracy, or of ROC-AUC for the ranking);
* ``= (≥0.054)`` no detectable difference, with the smallest |Δ| it could have detected;
* with several seeds, how many agree: ``▼ -0.095 3/3``, ``= (≥0.137) 2/3`` (of the n seeds'
  paired Δ, the k with the sign of their mean; ``labelrl.evaluate.paired.seed_count``);
* ``collapsed`` / ``not a result`` where the arm's side is named so (``labelrl.ladder.collapse``);
* an arm with a collapsed run is marked in its row's name whatever its cells read: ``grpo
  (collapsed 1/3)``, or ``grpo (collapsed, inherited)`` when its parent had already collapsed to
  that answer. Its intervals average over the seeds, the collapsed one included, so a cell can
  read ``=`` or ``▲`` beside it; the mark keeps the collapse in sight at a glance;
* the sweep's position (``on curve``, ``above``, ``below``, ``uninformative``).

The sentence above the grid is built from the same cells: which arms beat SFT + threshold (the
baseline every RL arm has to beat) and SFT, by how much, and which are worse or not results.
"""

from __future__ import annotations

from labelrl.evaluate.paired import seed_count, tested

GLYPH = {"better": "▲", "worse": "▼"}
HOLDOUT = "holdout"


def legend(grid: dict) -> str:
    """The line under a grid, on the console and in the report; the seed count is explained where
    a cell shows one."""
    text = ("▲/▼ better/worse after the Holm correction over the task's comparisons (Δ of balanced accuracy; of "
            "ROC-AUC for the ranking); = no detectable difference (≥ the smallest it could detect)")
    if any(c.get("seeds") for r in grid.get("rows", []) for c in r.get("cells", {}).values()):
        text += "; k/n: of the n seeds' paired Δ, the k with the sign of their mean"
    return text


def _with_seeds(word: str, text: str, m: dict) -> dict:
    """A decided cell; with two seeds or more (``seed_count``) its ``seeds`` [k, n] and its text
    ending " k/n"."""
    count = seed_count(m)
    if not count or count[1] < 2:
        return {"word": word, "text": text, "delta": m["delta"]}
    return {"word": word, "text": f"{text} {count[0]}/{count[1]}", "delta": m["delta"], "seeds": list(count)}


def cell(c: dict) -> dict:
    """One comparison's cell: ``{"word", "text", "delta"}`` (and ``"seeds"`` with several); word ∈
    better, worse, none, collapsed, not a result (the tested metric's corrected decision, or how the
    ladder named a side)."""
    result = c["result"]
    family = result.get("family") or {}
    metric = family.get("metric", "roc_auc" if c.get("kind") == "curve_vs_sft" else "balanced_accuracy")
    m = result["metrics"][metric]
    if c.get("not_a_result", {}).get("b"):
        return {"word": "not a result", "text": "not a result", "delta": m["delta"]}
    decision = tested(result, metric)
    if decision["reject"]:
        word = "better" if m["delta"] > 0 else "worse"
        if word == "worse" and c.get("collapsed", {}).get("b"):
            return {"word": "collapsed", "text": "collapsed", "delta": m["delta"]}
        return _with_seeds(word, f"{GLYPH[word]} {m['delta']:+.3f}", m)
    mde = decision.get("detectable")
    return _with_seeds("none", "=" + (f" (≥{mde:.3f})" if mde is not None else ""), m)


def collapsed_count(verdict: dict) -> dict | None:
    """``{"k", "n", "inherited"}``: k of the arm's n runs flagged collapsed, ``inherited`` of them
    because their parent already was (the verdict's ``collapsed["runs"]`` flags), or None."""
    flagged = (verdict.get("collapsed") or {}).get("runs") or {}
    if not flagged:
        return None
    return {"k": len(flagged), "n": max(len(verdict.get("runs") or []), len(flagged)),
            "inherited": sum(bool((f or {}).get("inherited")) for f in flagged.values())}


def row_name(row: dict) -> str:
    """The arm as its row shows it: ``grpo``; ``grpo (collapsed)`` (its one run); ``grpo (collapsed
    1/3)``; a collapse the parent already had: ``grpo (collapsed, inherited)``, ``grpo (collapsed
    2/3, 1 inherited)``."""
    c = row.get("collapsed")
    if not c:
        return row["arm"]
    text = "collapsed" if c["n"] == 1 else f"collapsed {c['k']}/{c['n']}"
    if c["inherited"]:
        text += ", inherited" if c["inherited"] == c["k"] else f", {c['inherited']} inherited"
    return f"{row['arm']} ({text})"


def _columns(comparisons: list[dict]) -> list[tuple[str, str, str]]:
    """(header, kind, split) of every column the task's comparisons fill, in the module's order."""
    cols = [("vs SFT", "vs_sft", HOLDOUT), ("vs SFT + threshold", "vs_threshold", HOLDOUT),
            ("vs majority", "vs_majority", HOLDOUT)]
    splits = list(dict.fromkeys(c.get("split", HOLDOUT) for c in comparisons if c.get("split", HOLDOUT) != HOLDOUT))
    cols += [(f"{s.removeprefix('ood-')} vs SFT", "vs_sft", s) for s in splits]
    cols.append(("ranking", "curve_vs_sft", HOLDOUT))
    present = {(c["kind"], c.get("split", HOLDOUT)) for c in comparisons}
    return [col for col in cols if (col[1], col[2]) in present]


def sweep_word(text: str | None) -> str:
    """The sweep's position from a verdict's "operating point …" text: on curve, above, below,
    uninformative, or — (none)."""
    if not text:
        return "—"
    words = (("uninformative", "uninformative"), ("above the curve", "above"), ("below the curve", "below"),
             ("on the curve", "on curve"))
    # the position the text states first (pooled over seeds), before its parenthesis: "on the curve
    # (…; by seed: on the curve in 2, below the curve in 1 of 3 seeds)" is on the curve; a text
    # with the seeds' tally alone ("against a threshold on the SFT model: …") takes the first word of
    # the list it names
    for within in (text.split(" (", 1)[0], text):
        for word, short in words:
            if word in within:
                return short
    return "—"


def task_grid(verdicts: list[dict], comparisons: list[dict]) -> dict:
    """``{"columns", "rows": [{"arm", "cells": {header: cell}, "sweep", "failed_positive"}], "sentence"}``."""
    cols = _columns(comparisons)
    by = {(c["kind"], c.get("split", HOLDOUT), c["b"]): c for c in comparisons}
    rows = []
    for v in verdicts:
        arm = v["arm"]
        cells = {h: cell(by[(k, s, arm)]) for h, k, s in cols if (k, s, arm) in by}
        fp = v.get("failed_positive")
        rows.append({"arm": arm, "cells": cells, "sweep": sweep_word(v.get("sweep")),
                     "failed_positive": fp.split()[2] if fp else None, "collapsed": collapsed_count(v)})
    has_sweep = any(r["sweep"] != "—" for r in rows)
    has_fp = any(r["failed_positive"] for r in rows)
    columns = [h for h, _, _ in cols] + (["sweep"] if has_sweep else []) + (["failed+"] if has_fp else [])
    return {"columns": columns, "rows": rows, "sentence": answer(rows)}


def _names_by(rows: list[dict], header: str, word: str) -> list[tuple[str, float]]:
    return [(r["arm"], r["cells"][header]["delta"]) for r in rows if r["cells"].get(header, {}).get("word") == word]


def _span(found: list[tuple[str, float]]) -> str:
    deltas = sorted(abs(d) for _, d in found)
    return f"{deltas[0]:.3f}" if deltas[0] == deltas[-1] else f"{deltas[0]:.3f}–{deltas[-1]:.3f}"


def _list(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def answer(rows: list[dict]) -> str:
    """One sentence from the grid's cells: against SFT + threshold (else SFT), then SFT, then what is
    not a result. "No RL arm beats SFT + threshold; grpo and corpo beat SFT by 0.022–0.028 BA." """
    if not rows:
        return "No RL arm finished."
    parts = []
    headers = [h for h in ("vs SFT + threshold", "vs SFT") if any(h in r["cells"] for r in rows)]
    for header in headers:
        target = header.removeprefix("vs ")
        better, worse = _names_by(rows, header, "better"), _names_by(rows, header, "worse")
        if better:
            verb = "beats" if len(better) == 1 else "beat"
            parts.append(f"{_list([n for n, _ in better])} {verb} {target} by {_span(better)} BA")
        else:
            parts.append(f"no RL arm beats {target}")
        if worse:
            parts.append(f"{_list([n for n, _ in worse])} {'is' if len(worse) == 1 else 'are'} worse than {target} by "
                         f"{_span(worse)} BA")
    odd = [r["arm"] for r in rows
           if r.get("collapsed") or any(c["word"] in ("collapsed", "not a result") for c in r["cells"].values())]
    if odd:
        parts.append(f"{_list(odd)}: collapsed or not a result (see its line)")
    text = "; ".join(parts)
    return (text[0].upper() + text[1:] if text.startswith("no ") else text) + "."  # an arm's name keeps its case
