"""``labelrl report RUN_DIR``: one document from a ladder run's files (no model, no torch).

``build_report(run_dir, out)`` (``build``) reads the run (``collect``), draws the figures
(``figures``), assembles the sections below as blocks and writes them as ``out/report.html``
(self-contained) and ``out/report.md`` (figures under ``out/figures/``); ``render`` holds the
block types and both serialisers. A section whose inputs are absent says so in one line; a
failed or skipped arm appears in the table with its error or reason. This module only
re-exports; each section is built in the module named after it in brackets.

0. the verdict per task: each RL arm against SFT, SFT + threshold and the recall-matched
   threshold, paired over items and seeds ("no detectable difference" when the interval covers 0),
   on the holdout and on each OOD set; a direct RL arm's greedy-generation operating point; with
   2+ seeds the stability figures and CoRPO against GRPO by seed (``conclusions``, ``verdict_tables``);
1. comparison table per task: every arm's val / holdout / OOD metrics with 95% intervals, the
   audit's ceiling, the majority-class constant predictor, RL arms collapsed to one answer,
   repeat-holdout marks, failed and skipped arms, replicate means over seeds,
   the threshold arms; the samples every arm used; the paired comparisons with the config keys
   an ablation changes; the values each tuned arm tried on val, with the one chosen (``comparison``);
2. reward, rollout accuracy and balanced accuracy per RL step; SFT val metrics per eval (2–5: ``step_curves``);
3. completion length, truncation and think closure per step; the truncation tax by length;
4. skip-rule drift: uniform-group fraction, label share among informative groups vs data;
5. failed-positive fraction per step for every RL arm, CoRPO's regime shares;
6. the SFT model's ROC with each RL arm's operating point and verdict, each RL arm's path on val per
   checkpoint (binary: on the SFT parent's val ROC); the routing summary (``roc_routing``, ``op_path``);
7. the distillation decomposition (filter and objective effects) and trace survival (``distillation``);
8. holdout balanced accuracy against injected training-label noise, per arm (``conclusions``);
9. the lenient parser's reward inflation on the logged rollouts, and pass@k (``analyses``);
10. the audit per split (``analyses``);
11. time per phase of the last ``labelrl ladder`` (training per arm, scoring, analyses; ``timing``).
"""

from labelrl.report.build import NOT_RUN, SECTIONS, ReportResult, build_report, report_blocks
from labelrl.report.collect import collect_run

__all__ = ["NOT_RUN", "SECTIONS", "ReportResult", "build_report", "collect_run", "report_blocks"]
