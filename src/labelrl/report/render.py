"""The report as a list of blocks, written out as self-contained HTML and as Markdown.

``labelrl.report`` turns the collected run into ``Heading``, ``Para``, ``Items``,
``TableBlock`` and ``Image`` blocks, one group per section; ``to_html`` and ``to_markdown``
serialise the same blocks, so the two files always hold the same sections.

HTML: inline CSS, every figure a ``data:image/png;base64`` URI, no script and no external
resource, every value from the run's files passed through ``html.escape``. Markdown: figures
are linked by their path relative to the report (``figures/NAME.png``); values are escaped
(``<`` as ``&lt;``, so no tag can open; ``|`` as ``\\|``; line breaks as spaces) so a file's
content cannot inject markup into the document.
"""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Union


@dataclass
class Heading:
    text: str
    level: int = 2
    anchor: str | None = None


@dataclass
class Para:
    """A paragraph; ``style`` is ``p``, ``note`` (e.g. "not run") or ``error``."""

    text: str
    style: str = "p"


@dataclass
class Items:
    """A bulleted list; ``pre`` keeps the line breaks of multi-line items (tracebacks)."""

    items: list[str]
    pre: bool = False


@dataclass
class TableBlock:
    """A table; ``row_classes`` (one per row, may be empty) style rows in HTML: ``ceiling``,
    ``failed``, ``skipped``, ``repeat``."""

    columns: list[str]
    rows: list[list[str]]
    caption: str = ""
    row_classes: list[str] = field(default_factory=list)


@dataclass
class Image:
    """A PNG figure: ``rel`` is its path relative to the report files."""

    rel: str
    data: bytes
    caption: str


Block = Union[Heading, Para, Items, TableBlock, Image]


def fmt(value, digits: int = 3, sign: bool = False) -> str:
    """A number with ``digits`` decimals (``+`` shown with ``sign``), ``—`` for None, text as is."""
    if value is None:
        return "—"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    return f"{value:{'+' if sign else ''}.{digits}f}"


def fmt_ci(value, ci, sign: bool = False) -> str:
    """``0.912 [0.880, 0.940]``: a value with its 95% interval when there is one."""
    if value is None:
        return "—"
    if isinstance(ci, (list, tuple)) and len(ci) == 2 and all(isinstance(v, (int, float)) for v in ci):
        return f"{fmt(value, sign=sign)} [{fmt(ci[0], sign=sign)}, {fmt(ci[1], sign=sign)}]"
    return fmt(value, sign=sign)


def minutes(seconds: float) -> str:
    """``1 min 05 s`` / ``42 s``."""
    whole = int(round(seconds))
    return f"{whole // 60} min {whole % 60:02d} s" if whole >= 60 else f"{whole} s"


def slug(text: str) -> str:
    """A file- and anchor-safe name: ``spam/grpo reward`` → ``spam-grpo-reward``."""
    return re.sub(r"[^A-Za-z0-9_.]+", "-", text).strip("-.") or "x"


@dataclass
class FigureSink:
    """Draws figures into ``out_dir/figures/`` and turns them into ``Image`` blocks."""

    out_dir: Path
    written: list[Path] = field(default_factory=list)

    def image(self, name: str, caption: str, draw: Callable[[Path], bytes]) -> Block:
        """``draw(path)`` writes the PNG at ``path`` and returns its bytes; a figure whose data
        is malformed becomes a note instead of stopping the report."""
        rel = f"figures/{slug(name)}.png"
        path = self.out_dir / rel
        try:
            data = draw(path)
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            return Para(f"{caption}: figure not drawn, its data is incomplete ({type(exc).__name__}: {exc}).", "note")
        self.written.append(path)
        return Image(rel, data, caption)


CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto; max-width: 72rem;
       padding: 0 1rem; color: #1d1d1f; line-height: 1.45; }
h1 { border-bottom: 2px solid #444; padding-bottom: .3rem; }
h2 { border-bottom: 1px solid #bbb; margin-top: 2.5rem; }
table { border-collapse: collapse; margin: .8rem 0; font-size: .85rem; }
caption { text-align: left; font-weight: 600; padding: .3rem 0; }
th, td { border: 1px solid #ccc; padding: .25rem .5rem; text-align: right; vertical-align: top; }
th:first-child, td:first-child, td:last-child { text-align: left; }
th { background: #f0f0f0; }
tr.ceiling td { background: #fff6d6; }
tr.failed td { background: #fde8e8; }
tr.skipped td { background: #eeeeee; color: #555; }
tr.repeat td { color: #9a5b00; font-weight: 600; }
p.note { color: #555; font-style: italic; }
p.error, li.error { color: #a40000; }
pre { white-space: pre-wrap; background: #f7f7f7; padding: .4rem; margin: .2rem 0; font-size: .8rem; }
figure { margin: 1rem 0; }
figure img { max-width: 100%; border: 1px solid #ddd; }
figcaption { font-size: .85rem; color: #444; }
"""

ROW_CLASSES = {"ceiling", "failed", "skipped", "repeat"}


def _e(text) -> str:
    return html.escape(str(text), quote=True)


def _html_table(block: TableBlock) -> str:
    head = "".join(f"<th>{_e(c)}</th>" for c in block.columns)
    rows = []
    for i, row in enumerate(block.rows):
        cls = block.row_classes[i] if i < len(block.row_classes) else ""
        attr = f' class="{cls}"' if cls in ROW_CLASSES else ""
        rows.append(f"<tr{attr}>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>")
    caption = f"<caption>{_e(block.caption)}</caption>" if block.caption else ""
    return f"<table>{caption}<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _html_block(block: Block) -> str:
    if isinstance(block, Heading):
        anchor = f' id="{_e(block.anchor)}"' if block.anchor else ""
        return f"<h{block.level}{anchor}>{_e(block.text)}</h{block.level}>"
    if isinstance(block, Para):
        return f'<p class="{_e(block.style)}">{_e(block.text)}</p>'
    if isinstance(block, Items):
        inner = "".join(f"<li><pre>{_e(i)}</pre></li>" if block.pre else f"<li>{_e(i)}</li>" for i in block.items)
        return f"<ul>{inner}</ul>"
    if isinstance(block, TableBlock):
        return _html_table(block)
    if isinstance(block, Image):
        uri = "data:image/png;base64," + base64.b64encode(block.data).decode("ascii")
        return f'<figure><img src="{uri}" alt="{_e(block.caption)}"><figcaption>{_e(block.caption)}</figcaption></figure>'
    raise AssertionError(f"unknown block {block!r}")


def to_html(title: str, blocks: list[Block]) -> str:
    """One self-contained HTML document (see the module docstring)."""
    body = "\n".join(_html_block(b) for b in blocks)
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n<title>{_e(title)}</title>\n'
            f"<style>{CSS}</style>\n</head>\n<body>\n<h1>{_e(title)}</h1>\n{body}\n</body>\n</html>\n")


def md_escape(text) -> str:
    """Text safe inside a Markdown paragraph or table cell."""
    escaped = str(text).replace("<", "&lt;").replace("|", "\\|")
    return re.sub(r"\s*\n\s*", " ", escaped)


def _md_table(block: TableBlock) -> str:
    lines = [f"**{md_escape(block.caption)}**", ""] if block.caption else []
    lines.append("| " + " | ".join(md_escape(c) for c in block.columns) + " |")
    lines.append("|" + "|".join(" --- " for _ in block.columns) + "|")
    lines += ["| " + " | ".join(md_escape(c) or " " for c in row) + " |" for row in block.rows]
    return "\n".join(lines)


def _md_block(block: Block) -> str:
    if isinstance(block, Heading):
        return "#" * block.level + " " + md_escape(block.text)
    if isinstance(block, Para):
        text = md_escape(block.text)
        return f"*{text}*" if block.style == "note" else (f"**{text}**" if block.style == "error" else text)
    if isinstance(block, Items):
        if block.pre:
            return "\n".join("- " + md_escape(i.splitlines()[0] if i.strip() else i) + _md_pre(i) for i in block.items)
        return "\n".join(f"- {md_escape(i)}" for i in block.items)
    if isinstance(block, TableBlock):
        return _md_table(block)
    if isinstance(block, Image):
        alt = md_escape(block.caption).replace("[", "(").replace("]", ")")
        return f"![{alt}]({block.rel})\n\n{md_escape(block.caption)}"
    raise AssertionError(f"unknown block {block!r}")


def _md_pre(text: str) -> str:
    """The rest of a multi-line item as an indented fenced block (no markup is interpreted there)."""
    rest = text.splitlines()[1:]
    if not rest:
        return ""
    body = "\n".join("  " + line.replace("```", "'''") for line in rest)
    return f"\n\n  ```text\n{body}\n  ```"


def to_markdown(title: str, blocks: list[Block]) -> str:
    """The Markdown document (see the module docstring)."""
    return f"# {md_escape(title)}\n\n" + "\n\n".join(_md_block(b) for b in blocks) + "\n"

