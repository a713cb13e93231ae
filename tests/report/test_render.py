"""labelrl report: report.html (self-contained) and report.md from a ladder run's files, via the
Python API, the CLI (CliRunner) and a fresh interpreter that must not import torch."""

from __future__ import annotations

import base64
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from labelrl.cli.report import register
from labelrl.report import NOT_RUN, SECTIONS, build_report
from labelrl.report.render import Image, Items, Para, TableBlock, md_escape, to_html, to_markdown

runner = CliRunner(env={"COLUMNS": "200"})
# A tag attribute pointing off the machine (escaped text such as "&lt;img src=http://…" is no tag).
EXTERNAL = re.compile(r"""<[^>]*\s(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", re.IGNORECASE)
# Runs the command in a fresh interpreter and reports whether torch got imported.
SCRIPT = """
import sys, typer
from labelrl.cli.report import register
app = typer.Typer(); app.callback()(lambda: None); register(app)
app(sys.argv[1:], prog_name="labelrl", standalone_mode=False)
print("TORCH_IMPORTED", "torch" in sys.modules)
"""


@pytest.fixture(scope="module")
def full(ladder_run, tmp_path_factory):
    result = build_report(ladder_run, tmp_path_factory.mktemp("report"))
    return result, result.html.read_text(encoding="utf-8"), result.markdown.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def bare(bare_run, tmp_path_factory):
    result = build_report(bare_run, tmp_path_factory.mktemp("bare-report"))
    return result, result.html.read_text(encoding="utf-8"), result.markdown.read_text(encoding="utf-8")


def test_every_section_is_in_both_files(full):
    _, html, md = full
    for anchor, title in SECTIONS:
        assert f'<h2 id="{anchor}">{title}</h2>' in html
        assert f"\n## {title}\n" in md
        assert f"Not run: {NOT_RUN[anchor]}" not in html  # the full run has every input


def test_time_per_phase_is_read_from_ladder_json(full):
    _, _, md = full
    section = md.split("\n## 11. Time per phase\n")[1]
    for row in ("| spam | train | sft (sft) | 2 min 05 s |", "| spam | train | grpo (rl) | 1 min 01 s |",
                "| spam | scoring | every arm's evaluations | 42 s |", "| sum | the phases above | 3 min 48 s |",
                "| all | the last invocation, wall clock (finished arms reused) | 4 min 00 s |"):
        assert row in section, row


def test_html_is_self_contained(full):
    result, html, _ = full
    assert not EXTERNAL.search(html)
    assert "<script" not in html.lower() and "<link" not in html.lower() and "url(" not in html and "@import" not in html
    sources = re.findall(r'<img src="([^"]*)"', html)
    assert len(sources) == len(result.figures) >= 20
    for src in sources:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1]).startswith(b"\x89PNG")


def test_markdown_links_the_written_figures(full):
    result, _, md = full
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert len(links) == len(result.figures)
    for link in links:
        assert link.startswith("figures/") and link.endswith(".png")
        assert (result.markdown.parent / link).is_file()
    assert "http" not in md


def test_failed_and_skipped_arms_show_their_error_and_reason(full):
    _, html, md = full
    # the error text comes from a file: escaped, never live markup
    assert "ValueError: reward &lt;script&gt;alert(1)&lt;/script&gt; broke" in html
    assert "<script>" not in html
    # in Markdown, only a fenced block (shown verbatim by every renderer) may hold it as typed
    assert "<script>" not in re.sub(r"```text\n.*?```", "", md, flags=re.DOTALL)
    assert "reward &lt;script>alert(1)&lt;/script> broke" in md
    assert "File &quot;rl.py&quot;, line 3, in step" in html and 'File "rl.py", line 3, in step' in md
    for text in (html, md):
        assert "which failed" in text and "skipped" in text and "error.txt" in text
    assert re.search(r'<tr class="failed"><td>random</td>', html)
    assert re.search(r'<tr class="skipped"><td>cot_rl</td>', html)


def test_table_marks_repeats_and_shows_the_ceiling_and_ood(full):
    _, html, md = full
    assert re.search(r'<tr class="repeat"><td>corpo</td><td>rl \(corpo\)</td><td>done</td><td>holdout REPEAT</td>', html)
    assert re.search(r"\| corpo \| rl \(corpo\) \| done \| holdout REPEAT \|", md)
    for text in (html, md):
        assert "label ceiling (1 − ε)" in text and "0.960 [0.930, 0.990]" in text
        assert "OOD vader-tweets" in text and "within-one" in text
        assert "ΔTPR at its FPR" in text and "agrees with the matched threshold on" in text  # the sweep verdicts
        assert "ΔTPR [95% CI]" in text  # the sweep table's distance column
        assert "relabelling by judge-x" in text and "original labels: duplicates vs each other" in text
        assert "0.920 [0.890, 0.950]" in text  # the originals' 1 − d with its interval, beside the judge's retest
        assert "Filter effect" in text and "trace survival" in text
        assert "weights identical to grpo" in text and "rater split-half (aggregated label)" in text
        assert "ROC not drawn: ordinal labels: the threshold sweep is for binary tasks." in text
        assert "Decomposition not made: needs finished control and cot_sft arms." in text


def without_images(html: str) -> str:
    return re.sub(r'src="data:[^"]*"', 'src=""', html)


def test_report_builds_without_the_optional_parts(bare):
    result, html, md = bare
    for text in (without_images(html), md):
        assert f"Not run: {NOT_RUN['roc']}" in text and f"Not run: {NOT_RUN['distill']}" in text
        assert "OOD" not in text
        for _, title in SECTIONS:
            assert title in text
    assert f"Not run: {NOT_RUN['curves']}" not in html
    assert len(re.findall(r"<img ", html)) == len(result.figures) > 0


def test_missing_arms_and_damaged_files_become_notes(make_ladder_run, tmp_path):
    run_dir = make_ladder_run(tmp_path, distill=False, ood=False)
    for arm in ("grpo", "corpo"):  # arm directories gone: their rows stay, their figures go
        shutil.rmtree(run_dir / "movies" / arm)
    (run_dir / "spam" / "analysis" / "route-grpo.json").write_text("{broken")
    (run_dir / "spam" / "analysis" / "sweep.json").write_text('{"n": 3, "compared": []}')
    result = build_report(run_dir)
    html = result.html.read_text(encoding="utf-8")
    assert result.html == run_dir / "report" / "report.html"  # the default output directory
    assert "Unreadable files" in html and "route-grpo.json: unreadable" in html and "Routing not run" in html
    assert "figure not drawn, its data is incomplete (KeyError" in html
    assert not any(p.name.startswith("movies-grpo") for p in result.figures)
    assert re.search(r"<td>grpo</td><td>rl \(grpo\)</td><td>done</td><td>OOD|<td>grpo</td><td>rl \(grpo\)</td><td>done</td><td>val", html)


def test_serialisers_escape_values_from_files():
    blocks = [TableBlock(["a|b", "c"], [["x<y", "1\n2"]], "cap & <b>"), Para("<img src=http://x>"),
              Items(["first\n<second>"], pre=True), Image("figures/f.png", b"\x89PNG", 'say "hi" [x]')]
    html, md = to_html("t", blocks), to_markdown("t", blocks)
    assert "x&lt;y" in html and "&lt;img src=http://x&gt;" in html and not EXTERNAL.search(html)
    assert "<caption>cap &amp; &lt;b&gt;</caption>" in html and 'alt="say &quot;hi&quot; [x]"' in html
    assert "| a\\|b | c |" in md and "| x&lt;y | 1 2 |" in md and "&lt;img src=http://x>" in md
    assert "![say \"hi\" (x)](figures/f.png)" in md
    assert md_escape("a\n  b|c") == "a b\\|c"


def test_cli_refuses_a_directory_that_is_not_a_ladder_run(tmp_path):
    app = typer.Typer()
    app.callback()(lambda: None)
    register(app)
    bad = runner.invoke(app, ["report", str(tmp_path / "missing")])
    assert bad.exit_code == 2 and "is not a directory" in bad.output
    empty = runner.invoke(app, ["report", str(tmp_path)])
    assert empty.exit_code == 2 and "ladder.json does not exist" in empty.output


def test_cli_in_a_fresh_interpreter_writes_the_report_without_importing_torch(bare_run, tmp_path):
    out = subprocess.run([sys.executable, "-c", SCRIPT, "report", str(bare_run), "--out", str(tmp_path / "r")],
                         capture_output=True, text=True, timeout=300, cwd=Path(__file__).parent)
    assert out.returncode == 0, out.stderr
    assert "TORCH_IMPORTED False" in out.stdout
    assert "report.html" in out.stdout and "report.md" in out.stdout and "1 failed" in out.stdout
    assert (tmp_path / "r" / "report.html").is_file() and any((tmp_path / "r" / "figures").glob("*.png"))
