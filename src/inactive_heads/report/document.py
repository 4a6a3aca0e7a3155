"""A small document model (headings, paragraphs, tables, images) rendered to Markdown and to self-contained HTML,
and the one table renderer, also used for tables printed to the terminal."""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ..errors import InactiveHeadsError

__all__ = ["Document", "linked_images", "render_table"]

_TableFormat = Literal["markdown", "text", "html"]

_STYLE = (
    "body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
    "table{border-collapse:collapse;margin:1em 0;font-size:14px}"
    "th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f3f3f3}"
    "td:first-child,td:nth-child(2){text-align:left}img{max-width:100%}"
)


def render_table(
    header: Sequence[str], rows: Sequence[Sequence[str]], fmt: _TableFormat = "markdown", align: str | None = None
) -> str:
    """A table of strings as Markdown (pipes, HTML escaped), text or an HTML ``<table>`` (escaped); no final newline.

    ``align`` (text only): one ``l`` or ``r`` per column, padding each column to its widest cell; default all ``l``.
    """
    if fmt == "markdown":
        # Markdown renders raw HTML: a model named "<img ...>" must stay text, as in the HTML report.
        esc = [[html.escape(c, quote=False).replace("|", "\\|") for c in r] for r in [header, *rows]]
        lines = ["| " + " | ".join(r) + " |" for r in esc]
        lines.insert(1, "|" + "|".join("---" for _ in header) + "|")
        return "\n".join(lines)
    if fmt == "html":
        e = html.escape
        head = "".join(f"<th>{e(c)}</th>" for c in header)
        trs = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in rows)
        return f"<table><thead><tr>{head}</tr></thead><tbody>{trs}</tbody></table>"
    if fmt == "text":
        align = align or "l" * len(header)
        if len(align) != len(header) or set(align) - {"l", "r"}:
            raise InactiveHeadsError(f"align needs one 'l' or 'r' per column ({len(header)}), got {align!r}")
        table = [list(header), *(list(r) for r in rows)]
        widths = [max(len(r[i]) for r in table) for i in range(len(header))]
        pad = [str.ljust if a == "l" else str.rjust for a in align]
        return "\n".join("  ".join(p(c, w) for p, c, w in zip(pad, r, widths, strict=True)).rstrip() for r in table)
    raise InactiveHeadsError(f"unknown table format {fmt!r}; expected markdown, text or html")


@dataclass
class Document:
    """Blocks in order, rendered by :meth:`markdown` (images as files beside it) or :meth:`html` (images inline)."""

    blocks: list[tuple[str, Any]] = field(default_factory=list)
    images: dict[str, bytes] = field(default_factory=dict)

    def h(self, level: int, text: str) -> None:
        self.blocks.append(("h", (level, text)))

    def p(self, text: str) -> None:
        self.blocks.append(("p", text))

    def table(self, header: list[str], rows: list[list[str]]) -> None:
        self.blocks.append(("table", (header, rows)))

    def img(self, png: bytes, filename: str, alt: str) -> None:
        """A PNG image; Markdown links it as ``filename``, which the caller writes from :attr:`images`."""
        self.images[filename] = png
        self.blocks.append(("img", (filename, alt)))

    def markdown(self) -> str:
        out = []
        for kind, val in self.blocks:
            if kind == "h":
                out.append("#" * val[0] + " " + html.escape(val[1], quote=False))
            elif kind == "p":
                out.append(html.escape(val, quote=False))
            elif kind == "table":
                out.append(render_table(val[0], val[1], fmt="markdown"))
            else:
                out.append(f"![{val[1]}]({val[0]})")
        return "\n\n".join(out) + "\n"

    def html(self, title: str) -> str:
        e = html.escape
        body = []
        for kind, val in self.blocks:
            if kind == "h":
                body.append(f"<h{val[0]}>{e(val[1])}</h{val[0]}>")
            elif kind == "p":
                body.append(f"<p>{e(val)}</p>")
            elif kind == "table":
                body.append(render_table(val[0], val[1], fmt="html"))
            else:
                data = base64.b64encode(self.images[val[0]]).decode("ascii")
                body.append(f'<figure><img alt="{e(val[1])}" src="data:image/png;base64,{data}"></figure>')
        return (
            f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{e(title)}</title>'
            f"<style>{_STYLE}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
        )


def linked_images(markdown: str) -> set[str]:
    """The image files a :meth:`Document.markdown` text links (plain file names beside it)."""
    return set(re.findall(r"\]\(([^()/\\]+\.png)\)", markdown))
