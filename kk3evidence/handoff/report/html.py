"""HTML rendering of the hand-off document: one self-contained file.

Inline CSS, an inline SVG stage timeline, no scripts, no fonts, images or styles fetched from
anywhere (a Content-Security-Policy meta tag forbids it), so the file opens the same offline,
attached to a ticket, or in a browser without network.
"""

from __future__ import annotations

import html
import re
from typing import TYPE_CHECKING

from kk3evidence.model import STAGES

if TYPE_CHECKING:
    from kk3evidence.handoff.report.markdown import Block, Doc, Timeline

_CSS = """
:root { color-scheme: light; }
body { font-family: system-ui, -apple-system, "Segoe UI", "Noto Sans", "Noto Sans CJK KR",
       "Apple SD Gothic Neo", "Malgun Gothic", sans-serif; margin: 2rem auto; max-width: 72rem;
       padding: 0 1.5rem; color: #1f2328; line-height: 1.5; }
h1 { font-size: 1.6rem; border-bottom: 2px solid #d0d7de; padding-bottom: .4rem; }
h2 { font-size: 1.25rem; margin-top: 2rem; border-bottom: 1px solid #d8dee4;
     padding-bottom: .2rem; }
h3, h4 { font-size: 1.05rem; margin-top: 1.4rem; }
table { border-collapse: collapse; width: 100%; margin: .6rem 0 1rem; font-size: .92rem; }
th, td { border: 1px solid #d0d7de; padding: .35rem .55rem; text-align: left;
         vertical-align: top; word-break: break-word; }
th { background: #f6f8fa; white-space: nowrap; }
code { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: .88em;
       background: #f6f8fa; padding: .05rem .3rem; border-radius: 4px; }
pre { background: #f6f8fa; border: 1px solid #d0d7de; border-radius: 6px; padding: .8rem;
      overflow-x: auto; font-size: .85rem; line-height: 1.4; white-space: pre-wrap;
      overflow-wrap: anywhere; }
pre code { background: none; padding: 0; }
.log .ln { display: block; white-space: pre-wrap; overflow-wrap: anywhere;
           padding-left: 8ch; text-indent: -8ch; }
.log .mark { background: #ffebe9; color: #82071e; font-weight: 600; }
.log .no { color: #6e7781; user-select: none; }
.st { font-weight: 600; padding: .05rem .45rem; border-radius: 999px; white-space: nowrap; }
.st-pass, .st-completed, .st-통과 { background: #dafbe1; color: #116329; }
.st-fail, .st-failed, .st-미흡 { background: #ffebe9; color: #a40e26; }
.st-unknown, .st-started, .st-판단 { background: #fff8c5; color: #7d4e00; }
details { margin: .6rem 0; }
summary { cursor: pointer; font-weight: 600; }
.timeline { margin: .6rem 0 1rem; border: 1px solid #d0d7de; border-radius: 6px;
            background: #fff; }
footer { margin-top: 2.5rem; color: #6e7781; font-size: .85rem; }
"""

_STATUS_COLOUR = {"completed": "#2da44e", "failed": "#cf222e", "started": "#d4a72c"}


def _inline(s: str) -> str:
    """Escape, then the few inline marks the report uses: **bold**, `code`, [text](https URL)."""
    out: list[str] = []
    for i, part in enumerate(re.split(r"(`[^`]*`)", s)):
        if i % 2 == 1:
            out.append(f"<code>{html.escape(part[1:-1])}</code>")
            continue
        esc = html.escape(part)
        esc = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", esc)
        esc = re.sub(r"\[([^\]]+)\]\((https://[^)\s]+)\)", r'<a href="\2">\1</a>', esc)
        out.append(esc)
    return "".join(out)


def _status_cell(value: str) -> str:
    key = value.split(maxsplit=1)[0] if value else ""
    return f'<span class="st st-{html.escape(key)}">{html.escape(value)}</span>'


def _ticks(t_max: float, *, integer: bool) -> list[float]:
    """About six round tick values from 0 to ``t_max``."""
    raw = t_max / 6
    step = 1.0
    for mult in (0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000):
        step = float(mult)
        if step >= raw:
            break
    if integer:
        step = max(step, 1.0)
    n = int(t_max / step)
    return [i * step for i in range(n + 1)]


def timeline_svg(tl: Timeline) -> str:
    """The stages as horizontal bars on a time (or log-line) axis, first failure marked."""
    # rows in time order of first appearance (ties: the seed's diagnostic order)
    first: dict[str, float] = {}
    for st, _, start, _ in tl.spans:
        first[st] = min(start, first.get(st, start))
    rows = sorted(first, key=lambda st: (first[st],
                                         STAGES.index(st) if st in STAGES else len(STAGES)))
    left, right, top, row_h = 150, 30, 30, 28
    width = 900
    height = top + row_h * len(rows) + 50
    t_max = max([s[3] for s in tl.spans] + [tl.failure_at or 0.0, tl.ready_at or 0.0, 1.0])
    span = width - left - right

    def x(t: float) -> float:
        return left + span * (t / t_max)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="timeline" role="img" '
             f'viewBox="0 0 {width} {height}" width="100%" '
             f'aria-label="stage timeline">',
             '<style>text{font:12px system-ui,sans-serif;fill:#1f2328}'
             '.ax{fill:#6e7781}</style>']
    # grid and axis
    for t in _ticks(t_max, integer=tl.unit == "line"):
        xx = x(t)
        parts.append(f'<line x1="{xx:.1f}" y1="{top - 8}" x2="{xx:.1f}" '
                     f'y2="{top + row_h * len(rows)}" stroke="#eaeef2"/>')
        label = f"{t:.0f}" if float(t).is_integer() else f"{t:.1f}"
        parts.append(f'<text class="ax" x="{xx:.1f}" y="{top + row_h * len(rows) + 16}" '
                     f'text-anchor="middle">{label}</text>')
    axis = html.escape(str(tl.labels.get("axis", "")))
    parts.append(f'<text class="ax" x="{left + span / 2:.1f}" '
                 f'y="{top + row_h * len(rows) + 34}" text-anchor="middle">{axis}</text>')
    for i, stage in enumerate(rows):
        y = top + i * row_h
        parts.append(f'<text x="{left - 10}" y="{y + row_h / 2 + 4:.1f}" '
                     f'text-anchor="end">{html.escape(stage)}</text>')
        for st, status, start, end in tl.spans:
            if st != stage:
                continue
            x0, x1 = x(start), x(end)
            w = max(x1 - x0, 4.0)
            colour = _STATUS_COLOUR.get(status, "#8c959f")
            parts.append(f'<rect x="{x0:.1f}" y="{y + 5}" width="{w:.1f}" height="{row_h - 10}" '
                         f'rx="3" fill="{colour}"><title>{html.escape(stage)}: '
                         f'{html.escape(status)} ({start:.1f}–{end:.1f})</title></rect>')
    for at, colour, key in ((tl.ready_at, "#0969da", "ready"),
                            (tl.failure_at, "#cf222e", "failure")):
        if at is None:
            continue
        xx = x(at)
        parts.append(f'<line x1="{xx:.1f}" y1="{top - 12}" x2="{xx:.1f}" '
                     f'y2="{top + row_h * len(rows)}" stroke="{colour}" stroke-width="2" '
                     f'stroke-dasharray="4 3"/>')
        anchor = "end" if xx > width - 120 else "start"
        dx = -4 if anchor == "end" else 4
        parts.append(f'<text x="{xx + dx:.1f}" y="{top - 14}" text-anchor="{anchor}" '
                     f'style="fill:{colour};font-weight:600">'
                     f'{html.escape(str(tl.labels.get(key, key)))}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _block(block: Block) -> str:
    from kk3evidence.handoff.report.markdown import (
        Bullets,
        Code,
        Details,
        Heading,
        Lines,
        Para,
        Table,
        Timeline,
    )

    if isinstance(block, Heading):
        return f"<h{block.level}>{_inline(block.text)}</h{block.level}>"
    if isinstance(block, Para):
        return f"<p>{_inline(block.text)}</p>"
    if isinstance(block, Bullets):
        return "<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in block.items) + "</ul>"
    if isinstance(block, Table):
        head = "".join(f"<th>{html.escape(h)}</th>" for h in block.headers)
        body = []
        for row in block.rows:
            cells = []
            for j, c in enumerate(row):
                cells.append(f"<td>{_status_cell(c)}</td>" if j == block.status_col
                             else f"<td>{_inline(c)}</td>")
            body.append("<tr>" + "".join(cells) + "</tr>")
        return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
    if isinstance(block, Code):
        return f"<pre><code>{html.escape(block.text)}</code></pre>"
    if isinstance(block, Lines):
        rows = []
        for ln in block.lines:
            cls = "ln mark" if ln.line_no == block.mark else "ln"
            rows.append(f'<span class="{cls}"><span class="no">{ln.line_no:>6}  </span>'
                        f"{html.escape(ln.text) or ' '}</span>")
        return '<pre class="log"><code>' + "".join(rows) + "</code></pre>"
    if isinstance(block, Details):
        inner = "".join(_block(b) for b in block.blocks)
        return f"<details><summary>{block.summary}</summary>{inner}</details>"
    if isinstance(block, Timeline):
        return timeline_svg(block)
    raise TypeError(f"unknown block {type(block).__name__}")


def render_html(doc: Doc) -> str:
    body = "\n".join(_block(b) for b in doc.blocks[:-1])
    footer = _inline(doc.blocks[-1].text) if hasattr(doc.blocks[-1], "text") else ""
    return (
        "<!DOCTYPE html>\n"
        f'<html lang="{doc.lang}">\n<head>\n<meta charset="utf-8">\n'
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'; img-src data:\">\n"
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{html.escape(doc.title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
        f"<h1>{html.escape(doc.title)}</h1>\n{body}\n<footer>{footer}</footer>\n"
        "</body>\n</html>\n"
    )
