"""Charts drawn on the server as SVG: no script, no inline style, no request to anywhere, so a
page with ``Content-Security-Policy: default-src 'self'`` shows them. Colours and sizes of text
are classes (``nexo_django/insight.css``). Every mark carries its numbers for people (a
``<title>``, shown on hover and read by screen readers) and for tests (``data-series``,
``data-category``, ``data-value``)."""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

WIDTH, HEIGHT, LEFT, BOTTOM, TOP = 760, 260, 56, 70, 16


@dataclass(frozen=True)
class Series:
    key: str
    label: str
    css: str


def _num(value: float) -> str:
    return f"{value:.1f}"


def _nice_max(value: float) -> float:
    if value <= 0:
        return 1.0
    step = 10 ** len(str(int(value))) / 10
    for m in (1, 2, 2.5, 5, 10):
        if value <= m * step:
            return m * step
    return value


def _e(value: Any) -> str:
    """``value`` as text safe inside an attribute or an element: what ``format_html`` does to
    each argument, for the hundreds of marks of a chart at a fraction of its cost."""
    return html.escape(str(value), quote=True)


def bars(
    chart_id: str, title: str, rows: Sequence[dict[str, Any]], category: str, series: Sequence[Series], *,
    stacked: bool = True, unit: str = "", fmt: Any = None,
) -> SafeString:
    """Vertical bars, one group per row (``row[category]`` names it), a bar or a stacked part per
    series (``row[series.key]``, a number or None)."""
    fmt = fmt or (lambda v: f"{v:g}")
    plot_w, plot_h = WIDTH - LEFT - 8, HEIGHT - TOP - BOTTOM
    totals = [sum((r.get(s.key) or 0) for s in series) if stacked else max([r.get(s.key) or 0 for s in series] or [0])
              for r in rows]
    top = _nice_max(max(totals, default=0))
    cid = _e(chart_id)
    parts: list[str] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="nexo-chart" id="{cid}" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'role="img" aria-labelledby="{cid}-title" data-max="{_e(top)}">',
        f'<title id="{cid}-title">{_e(title)}</title>',
    ]
    for i in range(5):
        y = TOP + plot_h - plot_h * i / 4
        parts.append(f'<line class="grid" x1="{LEFT}" y1="{_num(y)}" x2="{WIDTH - 8}" y2="{_num(y)}"/>')
        parts.append(f'<text class="axis" x="{LEFT - 4}" y="{_num(y + 4)}" text-anchor="end">{_e(fmt(top * i / 4))}</text>')
    if not rows:
        parts.append(f'<text class="empty" x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle">nothing in this period</text>')
    slot = plot_w / max(len(rows), 1)
    label_every = max(1, len(rows) // 20)
    keys = [(_e(s.css), _e(s.key), _e(s.label)) for s in series]
    for i, row in enumerate(rows):
        x0 = LEFT + i * slot + slot * 0.1
        width = slot * 0.8
        base = TOP + plot_h
        name = _e(row[category])
        for j, s in enumerate(series):
            value = row.get(s.key)
            if value is None:
                continue
            h = plot_h * value / top
            if stacked:
                x, w, y = x0, width, base - h
                base -= h
            else:
                w = width / len(series)
                x, y = x0 + j * w, TOP + plot_h - h
            css, key, label = keys[j]
            parts.append(
                f'<rect class="bar {css}" x="{_num(x)}" y="{_num(y)}" width="{_num(max(w, 0.5))}" height="{_num(h)}" '
                f'data-series="{key}" data-category="{name}" data-value="{_e(value)}"><title>{name}: {label} '
                f'{_e(fmt(value))}{_e(unit)}</title></rect>')
        if i % label_every == 0:
            cx, ly = _num(LEFT + i * slot + slot / 2), HEIGHT - BOTTOM + 14
            parts.append(f'<text class="label" x="{cx}" y="{ly}" text-anchor="end" transform="rotate(-40 {cx} {ly})">'
                         f'{_e(str(row[category])[:24])}</text>')
    x = LEFT
    for (css, _, label), s in zip(keys, series, strict=True):
        parts.append(f'<rect class="bar {css}" x="{x}" y="{HEIGHT - 14}" width="10" height="10"/>')
        parts.append(f'<text class="legend" x="{x + 14}" y="{HEIGHT - 5}">{label}</text>')
        x += 14 + 8 * len(s.label) + 16
    parts.append("</svg>")
    return mark_safe("".join(parts))  # noqa: S308 - every value above went through _e (html.escape) or is a number


@dataclass(frozen=True)
class Span:
    """One thing on a timeline: ``start`` and ``end`` in seconds from the first."""

    lane: str
    label: str
    start: float
    end: float
    css: str
    detail: str = ""


def timeline(chart_id: str, title: str, spans: Sequence[Span]) -> SafeString:
    """Lanes of spans on one time axis (a run's turns, calls and waits for people)."""
    lanes: list[str] = []
    for s in spans:
        if s.lane not in lanes:
            lanes.append(s.lane)
    lane_h, left = 26, 130
    height = TOP + lane_h * max(len(lanes), 1) + 30
    end = max((s.end for s in spans), default=0.0) or 1.0
    plot_w = WIDTH - left - 8
    parts = [
        format_html('<svg xmlns="http://www.w3.org/2000/svg" class="nexo-chart nexo-timeline" id="{}" viewBox="0 0 {} {}" '
                    'role="img" aria-labelledby="{}-title" data-spans="{}">', chart_id, WIDTH, height, chart_id, len(spans)),
        format_html('<title id="{}-title">{}</title>', chart_id, title),
    ]
    for i, lane in enumerate(lanes):
        y = TOP + i * lane_h
        parts.append(format_html('<text class="axis" x="{}" y="{}" text-anchor="end">{}</text>', left - 6, y + 17, lane[:18]))
        parts.append(format_html('<line class="grid" x1="{}" y1="{}" x2="{}" y2="{}"/>', left, y + lane_h, WIDTH - 8, y + lane_h))
    for s in spans:
        y = TOP + lanes.index(s.lane) * lane_h + 4
        x = left + plot_w * s.start / end
        w = max(plot_w * (s.end - s.start) / end, 2.0)
        parts.append(format_html(
            '<rect class="span {}" x="{}" y="{}" width="{}" height="{}" data-lane="{}" data-label="{}" data-seconds="{}">'
            '<title>{}: {} ({} s){}</title></rect>',
            s.css, _num(x), y, _num(w), lane_h - 8, s.lane, s.label, f"{s.end - s.start:.3f}",
            s.lane, s.label, f"{s.end - s.start:.1f}", format_html(" — {}", s.detail) if s.detail else ""))
    parts.append(format_html('<text class="axis" x="{}" y="{}">0 s</text>', left, height - 8))
    parts.append(format_html('<text class="axis" x="{}" y="{}" text-anchor="end">{} s</text>', WIDTH - 8, height - 8,
                             f"{end:.1f}"))
    parts.append(mark_safe("</svg>"))  # noqa: S308 - a constant
    return mark_safe("".join(parts))  # noqa: S308 - every value above went through format_html

