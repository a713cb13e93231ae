"""Section 6 of the report, per task: each SFT parent's val ROC with the operating point and sweep
verdict of every RL arm trained from it, each RL arm's path on val per checkpoint
(``labelrl.report.op_path``), and routing between the SFT model and each arm (the summary table
and the confidence cascade). A part that was not made says why, from the task's analysis notes.
"""

from __future__ import annotations

from labelrl.report import figures as F
from labelrl.report import op_path as P
from labelrl.report.render import Block, FigureSink, Para, TableBlock, fmt, fmt_ci
from labelrl.report.run_data import TaskData


def _sweep_blocks(task: TaskData, s: dict, key: str, sink: FigureSink) -> list[Block]:
    """One SFT parent's ROC (figure ``key``) and the verdict of each arm trained from it."""
    base = (s.get("arms") or {}).get("base") or F.source_arm(s.get("source"))
    text = (f"SFT model ({base}): ROC-AUC {fmt(s.get('roc_auc'))} on {fmt(s.get('n'), 0)} val "
            f"items ({fmt(s.get('n_positive'), 0)} with the positive label {s.get('positive_label')!r}).")
    blocks: list[Block] = [Para(text), sink.image(key, f"{task.name}: ROC of the SFT model {base} with the operating "
                                                  f"point of each RL arm trained from it (hollow: above or below the curve, "
                                                  f"its ΔTPR interval excluding 0)",
                                                  lambda path: F.roc_png(s, path))]
    rows = []
    for c, arm in zip(s.get("compared") or [], F.compared_arms(s)):
        d = c.get("distance") or {}  # a sweep file written before the distance has none: "—"
        rows.append([arm, str(c.get("verdict", "?")), str(c.get("verdict_rests_on", "—")),
                     fmt(d.get("tpr", (c.get("compared_metrics") or {}).get("recall"))),
                     fmt(d.get("fpr", (c.get("compared_metrics") or {}).get("fpr"))), fmt(d.get("curve_tpr")),
                     fmt_ci(d.get("delta_tpr"), d.get("ci"), sign=True), fmt(c.get("recall_matched_threshold"), 4),
                     fmt_ci(c.get("item_agreement"), c.get("item_agreement_ci")), fmt(c.get("chance_agreement"))])
    if rows:
        blocks.append(TableBlock(["arm", "sweep verdict", "rests on", "arm TPR (recall)", "arm FPR (unparsed: not rejected)",
                                  "SFT curve's TPR at that FPR", "ΔTPR [95% CI]", "SFT threshold at the arm's recall",
                                  "items answered as at that threshold [95% CI]", "chance agreement"], rows,
                                 f"{task.name}: is each arm's (and each cascade's) val operating point a threshold on "
                                 f"the SFT model {base}? On the curve when the ΔTPR interval covers 0"))
    return blocks


def _route_row(arm: str, r: dict) -> list[str]:
    best = (r.get("cascade") or {}).get("best") or {}
    d = r.get("disagreement") or {}

    def pair(key: str) -> str:
        return f"{fmt((r.get(key) or {}).get('accuracy'))} / {fmt((r.get(key) or {}).get('balanced_accuracy'))}"

    band = f"[{fmt(best.get('lo'), 2)}, {fmt(best.get('hi'), 2)})" if best else "—"
    return [arm, pair("a"), pair("b"), pair("oracle"), band, fmt(best.get("share_routed")),
            fmt(best.get("delta_balanced_accuracy"), sign=True), f"{fmt(d.get('n_disagree'), 0)} of {fmt(d.get('n'), 0)}",
            fmt(d.get("b_gain"), 0)]


def _why_not(task: TaskData, name: str, default: str) -> str:
    return task.analysis_notes.get(name) or default


def roc(task: TaskData, sink: FigureSink) -> list[Block]:
    """Section 6: each SFT parent's ROC (one per analysis/sweep*.json) with the operating points and
    verdicts of the RL arms trained from it, the parent named; routing per arm."""
    notes = task.analysis_notes
    path = P.path_blocks(task, sink)  # the RL checkpoints' path on val (binary: on the SFT ROC)
    if task.sweep is None and not task.routes and not ("sweep" in notes or "route" in notes):
        return path
    blocks: list[Block] = path
    if task.sweep is not None:
        for i, (parent, sweep) in enumerate(task.sweeps.items() or [("", task.sweep)]):
            blocks += _sweep_blocks(task, sweep, f"{task.name}-roc" + (f"-{parent}" if i else ""), sink)
    else:
        default = "the task is not binary" if task.kind not in (None, "binary") else "no analysis/sweep.json"
        blocks.append(Para(f"ROC not drawn: {_why_not(task, 'sweep', default)}.", "note"))
    if task.routes:
        rows = [_route_row(arm, r) for arm, r in task.routes.items()]
        blocks.append(TableBlock(["B arm", "A = SFT acc / BA", "B acc / BA", "oracle acc / BA", "best cascade band",
                                  "share routed", "Δ balanced accuracy", "disagreements", "B right where A wrong"],
                                 rows, f"{task.name}: routing between the SFT model (A) and each arm (B), val"))
        blocks += [sink.image(f"{task.name}-route-{arm}", f"{task.name}: confidence cascade SFT → {arm}",
                              lambda path, r=r: F.cascade_png(r, path)) for arm, r in task.routes.items()]
    else:
        blocks.append(Para(f"Routing not run: {_why_not(task, 'route', 'no analysis/route-*.json')}.", "note"))
    return blocks
