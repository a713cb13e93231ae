"""The verdict grid of a task (``analysis/grid.json``, written by ``labelrl.ladder.grid``) as rows of text."""

from __future__ import annotations

from labelrl.ladder.grid import row_name


def grid_lines(grid: dict) -> list[list[str]]:
    """The grid as rows of strings, the header first: arm (marked when a run collapsed:
    ``labelrl.ladder.grid.row_name``), every column's cell text."""
    out = [["arm", *grid["columns"]]]
    for r in grid["rows"]:
        extra = {"sweep": r["sweep"], "failed+": r["failed_positive"] or "—"}
        out.append([row_name(r), *[r["cells"][h]["text"] if h in r["cells"] else extra.get(h, "—") for h in grid["columns"]]])
    return out
