"""A small structured document (headings, paragraphs, lists, tables, images, code lines) written out as Markdown
and as self-contained HTML.

The evidence report quotes model cards, which strangers write. Building both files from structure, never by
rendering Markdown, means card text is only ever text: each renderer escapes every piece for its own format
(`scanner.text_safety`), and the only images are the `Image` blocks hubtrace put there, files it drew itself.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path

from scanner.text_safety import html_text, markdown_code, markdown_text, visible

Span = tuple[str, str]
"""(style, text): style "" (plain), "b" (bold) or "code"."""


def plain(text: object) -> Span:
    return ("", str(text))


def bold(text: object) -> Span:
    return ("b", str(text))


def code(text: object) -> Span:
    return ("code", str(text))


@dataclass(frozen=True)
class Heading:
    level: int
    spans: tuple[Span, ...]


@dataclass(frozen=True)
class Paragraph:
    spans: tuple[Span, ...]


@dataclass(frozen=True)
class Items:
    items: tuple[tuple[Span, ...], ...]


@dataclass(frozen=True)
class Table:
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class Image:
    """A PNG that hubtrace drew into the report's folder; the HTML inlines it, the Markdown links it by name."""

    path: Path
    alt: str


@dataclass(frozen=True)
class CodeLine:
    text: str


Block = Heading | Paragraph | Items | Table | Image | CodeLine


def _md_spans(spans: tuple[Span, ...]) -> str:
    out = []
    for style, text in spans:
        if style == "b":
            out.append(f"**{markdown_text(text)}**")
        elif style == "code":
            out.append(markdown_code(text))
        else:
            out.append(markdown_text(text))
    return "".join(out)


def _html_spans(spans: tuple[Span, ...]) -> str:
    tags = {"b": "b", "code": "code"}
    return "".join(f"<{tags[s]}>{html_text(t)}</{tags[s]}>" if s in tags else html_text(t) for s, t in spans)


def to_markdown(blocks: list[Block]) -> str:
    """Markdown in which every piece of text renders as exactly its characters."""
    lines: list[str] = []
    for block in blocks:
        if isinstance(block, Heading):
            lines += ["#" * block.level + " " + _md_spans(block.spans), ""]
        elif isinstance(block, Paragraph):
            lines += [_md_spans(block.spans), ""]
        elif isinstance(block, Items):
            lines += [f"- {_md_spans(item)}" for item in block.items] + [""]
        elif isinstance(block, Table):
            lines.append("| " + " | ".join(markdown_text(c) for c in block.header) + " |")
            lines.append("|" + "---|" * len(block.header))
            lines += ["| " + " | ".join(markdown_text(c) for c in row) + " |" for row in block.rows]
            lines.append("")
        elif isinstance(block, Image):
            lines += [f"![{markdown_text(block.alt)}]({block.path.name})", ""]
        else:
            lines += [f"    {visible(block.text)}", ""]
    return "\n".join(lines)


_STYLE = ("body{font:15px system-ui,sans-serif;max-width:980px;margin:2em auto}td,th{border:1px solid #ddd;"
          "padding:2px 6px;text-align:left}table{border-collapse:collapse}pre{background:#f4f4f4;padding:6px;"
          "white-space:pre-wrap}img{max-width:100%}")


_CSP = ("<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; img-src data:; "
        "style-src 'unsafe-inline'\">")
"""Belt and braces: even a markup bug could not make the page run a script or fetch anything."""


def to_html(blocks: list[Block], title: str) -> str:
    """One self-contained page: hubtrace's own images inlined as data URIs, nothing fetched, no script."""
    body = []
    for block in blocks:
        if isinstance(block, Heading):
            body.append(f"<h{block.level}>{_html_spans(block.spans)}</h{block.level}>")
        elif isinstance(block, Paragraph):
            body.append(f"<p>{_html_spans(block.spans)}</p>")
        elif isinstance(block, Items):
            body.append("<ul>" + "".join(f"<li>{_html_spans(item)}</li>" for item in block.items) + "</ul>")
        elif isinstance(block, Table):
            head = "".join(f"<th>{html_text(c)}</th>" for c in block.header)
            rows = "".join("<tr>" + "".join(f"<td>{html_text(c)}</td>" for c in row) + "</tr>" for row in block.rows)
            body.append(f"<table><tr>{head}</tr>{rows}</table>")
        elif isinstance(block, Image):
            data = base64.b64encode(block.path.read_bytes()).decode("ascii")
            body.append(f'<p><img alt="{html_text(block.alt)}" src="data:image/png;base64,{data}"></p>')
        else:
            body.append(f"<pre>{html_text(block.text)}</pre>")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'>{_CSP}<title>{html_text(title)}</title>"
            f"<style>{_STYLE}</style></head><body>{''.join(body)}</body></html>\n")
