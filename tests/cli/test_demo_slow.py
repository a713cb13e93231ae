"""The full demo (what `make demo` runs) on SmolLM2: the report's table shows the ceiling, SFT,
GRPO and CoRPO with holdout metrics, and the report needs no network."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_demo_produces_the_report_with_ceiling_sft_grpo_and_corpo_on_the_holdout(tmp_path):
    result = subprocess.run([sys.executable, "-m", "labelrl.cli.main", "demo", "--out", str(tmp_path / "demo")],
                            env={**os.environ, "COLUMNS": "160"}, capture_output=True, text=True, timeout=3600)
    assert result.returncode == 0, result.stderr[-3000:]
    state = json.loads((tmp_path / "demo" / "ladder.json").read_text())
    movies = state["tasks"]["movies"]["arms"]
    assert {n: a["status"] for n, a in movies.items()} == {"sft": "done", "grpo": "done", "corpo": "done"}
    for arm in movies.values():
        assert arm["holdout"]["n"] > 0 and arm["ood"]["vader-tweets"]["n"] > 0
    md = (tmp_path / "demo" / "report" / "report.md").read_text()
    table = md[md.index("### Task movies"):md.index("## 2.")]
    assert re.search(r"\| label ceiling \(1 − ε\) \|.*\| 0\.\d{3} \[", table)
    for arm in ("sft", "grpo", "corpo"):
        assert re.search(rf"\| {arm} \| [^|]+ \| done \| holdout \| \d+ \| 0\.\d{{3}} \[", table), arm
    html = (tmp_path / "demo" / "report" / "report.html").read_text()
    assert not re.search(r"""(src|href)=["']https?://""", html)
    assert "report.html" in result.stdout
