"""Every relative link in the README and docs/ resolves to a file (or a heading's anchor-free path)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def relative_links(page: Path) -> list[str]:
    """The page's Markdown link targets that are neither URLs nor pure anchors, outside code blocks."""
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+://|mailto:|#", t)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page):
    missing = [t for t in relative_links(page) if not (page.parent / t.split("#")[0]).exists()]
    assert not missing, f"{page.relative_to(ROOT)}: links to nothing: {missing}"


def test_the_check_sees_a_broken_link(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("[ok](p.md) [gone](nowhere.md) [web](https://example.org) `[code](x.md)`\n```\n[in](y.md)\n```\n")
    assert relative_links(page) == ["p.md", "nowhere.md", "x.md"]
