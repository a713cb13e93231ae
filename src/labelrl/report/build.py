"""The report's assembly: the sections in order (``SECTIONS``), what each says when it has nothing
to show (``NOT_RUN``), the function that builds each (``BUILDERS`` per task, ``RUN_BUILDERS``
across tasks), and ``build_report``, which reads the run, assembles the blocks and writes
``report.html`` and ``report.md``. The package docstring (``labelrl.report``) lists the sections.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from labelrl.fileio import atomic_write_text
from labelrl.report import analyses as A
from labelrl.report import conclusions as C
from labelrl.report.collect import collect_run
from labelrl.report.comparison import comparison
from labelrl.report.distillation import distillation
from labelrl.report.render import Block, FigureSink, Heading, Items, Para, to_html, to_markdown
from labelrl.report.roc_routing import roc
from labelrl.report.run_data import RunData
from labelrl.report.step_curves import advantages, curves, drift, lengths
from labelrl.report.timing import time_per_phase

SECTIONS = (
    ("verdict", "Verdict"),
    ("comparison", "1. Comparison table"),
    ("curves", "2. Reward and accuracy per step"),
    ("length", "3. Completion length, truncation and think closure"),
    ("drift", "4. Skip-rule drift: uniform groups and label shares"),
    ("advantages", "5. Failed-positive advantages and CoRPO regimes"),
    ("roc", "6. ROC, operating points and routing"),
    ("distill", "7. Distillation decomposition"),
    ("noise", "8. Label noise"),
    ("parser", "9. Parser and sampling: strict vs lenient, pass@k"),
    ("labels", "10. The labels: audit per split, relabelling"),
    ("time", "11. Time per phase"),
)
NOT_RUN = {
    "verdict": "no task has a finished RL arm and an SFT arm to compare it with (analysis/verdict.json).",
    "noise": "no two tasks on the same data differ in label_noise.",
    "parser": "no RL arm's rollouts were rescored (analysis/rescore-ARM.json) and no arm has pass@k (task key pass_at_k).",
    "labels": "no audit.json with a per-split breakdown.",
    "time": "ladder.json records no phase times (the ladder writes them at the end of each invocation).",
    "comparison": "the ladder lists no task.",
    "curves": "no arm logged per-step metrics (metrics.jsonl or sft_metrics.jsonl).",
    "length": "no RL arm logged per-step metrics or rollouts.",
    "drift": "no RL arm logged groups/uniform_frac.",
    "advantages": "no RL arm logged adv/failed_positive_frac.",
    "roc": "no analysis/sweep.json, analysis/route-*.json or RL val_path.jsonl in any task.",
    "distill": "no analysis/compare.json and no distill arm summary (traces.summary.json) in any task.",
}


@dataclass(frozen=True)
class ReportResult:
    """What ``build_report`` wrote."""

    html: Path
    markdown: Path
    figures: list[Path]
    run: RunData


BUILDERS = {"verdict": C.verdict, "comparison": comparison, "curves": curves, "length": lengths, "drift": drift,
            "advantages": advantages, "roc": roc, "distill": distillation, "parser": A.parser_and_sampling,
            "labels": A.labels}
RUN_BUILDERS = {"noise": C.noise, "time": time_per_phase}  # sections drawn across tasks


def report_blocks(run: RunData, sink: FigureSink) -> list[Block]:
    """The report's blocks: a header, the ``SECTIONS`` (each "not run" when empty), and
    the unreadable files, if any."""
    arms = [a for t in run.tasks for a in t.arms]
    counts = ", ".join(f"{sum(a.status == s for a in arms)} {s}" for s in ("done", "failed", "skipped", "pending", "running")
                       if any(a.status == s for a in arms))
    blocks: list[Block] = [Para(f"Run directory {run.run_dir}; recipe {run.recipe or '?'}; {len(run.tasks)} task(s), "
                                f"{len(arms)} arm(s){': ' + counts if counts else ''}. Built from the run's files only.")]
    for anchor, title in SECTIONS:
        blocks.append(Heading(title, 2, anchor))
        body: list[Block] = []
        if anchor in RUN_BUILDERS:
            body = RUN_BUILDERS[anchor](run, sink)
        for task in run.tasks if anchor in BUILDERS else ():
            part = BUILDERS[anchor](task, sink)
            if part:
                body += [Heading(f"Task {task.name}", 3)] + part
        blocks += body or [Para(f"Not run: {NOT_RUN[anchor]}", "note")]
    if run.problems:
        blocks += [Heading("Unreadable files", 2, "problems"), Items(run.problems)]
    return blocks


def build_report(run_dir: str | Path, out: str | Path | None = None) -> ReportResult:
    """Write ``report.html`` and ``report.md`` (and ``figures/*.png``) for the ladder run in
    ``run_dir`` into ``out`` (default ``RUN_DIR/report``). ValueError when it is not a ladder run."""
    run = collect_run(run_dir)
    out = Path(out) if out is not None else Path(run_dir) / "report"
    sink = FigureSink(out)
    blocks = report_blocks(run, sink)
    title = f"labelrl report: {run.recipe or Path(run_dir).name}"
    html_path, md_path = out / "report.html", out / "report.md"
    atomic_write_text(html_path, to_html(title, blocks))
    atomic_write_text(md_path, to_markdown(title, blocks))
    return ReportResult(html_path, md_path, list(sink.written), run)
