"""The report's time per phase: training per arm, each task's scoring and analyses, and the
wall clock of the last ``labelrl ladder`` (from ``ladder.json``'s ``phases``, which the ladder
writes at the end of every invocation; arms finished earlier keep the times they took then)."""

from __future__ import annotations

from labelrl.report.render import Block, FigureSink, TableBlock, minutes
from labelrl.report.run_data import RunData


def time_per_phase(run: RunData, sink: FigureSink) -> list[Block]:
    if not run.phases:
        return []
    rows = [[p.get("task", ""), p.get("phase", ""), p.get("what", ""), minutes(p["seconds"])] for p in run.phases]
    total = sum(p["seconds"] for p in run.phases)
    rows.append(["", "sum", "the phases above", minutes(total)])
    if run.seconds_last_invocation is not None:
        rows.append(["", "all", "the last invocation, wall clock (finished arms reused)",
                     minutes(run.seconds_last_invocation)])
    return [TableBlock(["task", "phase", "what", "time"], rows,
                       "Where the ladder's time went: each trained arm with its tuning candidates, each task's "
                       "evaluations and analyses (the report's own time is not included)")]
