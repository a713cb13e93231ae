"""The generated reference pages are current, and the site's nav holds every page of docs/.

docs/config.md is checked in tests/test_metrics_keys.py; docs/cli.md here. `make docs` rewrites both
and builds the site with `mkdocs build --strict`, which CI runs; these tests say which file is stale
without building anything."""

from __future__ import annotations

from pathlib import Path

import yaml

from labelrl.cli.docs import command_tree, render_cli

ROOT = Path(__file__).resolve().parents[2]


def test_cli_reference_is_generated_from_the_commands():
    generated = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert generated == render_cli(), "docs/cli.md is stale: run `make docs`"


def test_cli_reference_has_every_command_with_its_options():
    page = render_cli()
    tree = list(command_tree())
    assert len(tree) > 15
    for path, command, _ in tree:
        name = " ".join(["labelrl", *path])
        assert f"## `{name}`\n" in page
        section = page.split(f"## `{name}`\n", 1)[1].split("\n## ", 1)[0]
        assert f"Usage: {name} " in section
        for param in command.params:
            assert all(opt in section for opt in param.opts if opt.startswith("--")), (name, param.opts)


def nav_pages(entry) -> list[str]:
    """The Markdown files a mkdocs nav (or a part of it) names."""
    if isinstance(entry, str):
        return [entry]
    if isinstance(entry, dict):
        return [page for value in entry.values() for page in nav_pages(value)]
    return [page for item in entry for page in nav_pages(item)]


def test_every_docs_page_is_in_the_nav():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert config["docs_dir"] == "docs"
    listed = nav_pages(config["nav"])
    excluded = [line.strip() for line in (config.get("not_in_nav") or "").splitlines() if line.strip()]
    pages = sorted(p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md"))
    assert sorted(set(listed) | set(excluded)) == pages
    assert len(listed) == len(set(listed)), "a page is in the nav twice"


def test_nav_pages_reads_nested_sections():
    nav = [{"A": "a.md"}, {"B": [{"B1": "b1.md"}, "b2.md"]}]
    assert nav_pages(nav) == ["a.md", "b1.md", "b2.md"]
