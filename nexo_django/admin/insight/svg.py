"""Charts drawn on the server as SVG: no script, no inline style, no request to anywhere, so a
page with ``Content-Security-Policy: default-src 'self'`` shows them. Colours and sizes of text
are classes (``nexo_django/insight.css``). Every mark carries its numbers for people (a
``<title>``, shown on hover and read by screen readers) and for tests (``data-series``,
``data-category``, ``data-value``)."""

from __future__ import annotations

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
    parts: list[str] = [
        format_html('<svg xmlns="http://www.w3.org/2000/svg" class="nexo-chart" id="{}" viewBox="0 0 {} {}" '
                    'role="img" aria-labelledby="{}-title" data-max="{}">', chart_id, WIDTH, HEIGHT, chart_id, top),
        format_html('<title id="{}-title">{}</title>', chart_id, title),
    ]
    for i in range(5):
        y = TOP + plot_h - plot_h * i / 4
        parts.append(format_html('<line class="grid" x1="{}" y1="{}" x2="{}" y2="{}"/>', LEFT, _num(y), WIDTH - 8, _num(y)))
        parts.append(format_html('<text class="axis" x="{}" y="{}" text-anchor="end">{}</text>',
                                 LEFT - 4, _num(y + 4), fmt(top * i / 4)))
    if not rows:
        parts.append(format_html('<text class="empty" x="{}" y="{}" text-anchor="middle">nothing in this period</text>',
                                 WIDTH / 2, HEIGHT / 2))
    slot = plot_w / max(len(rows), 1)
    label_every = max(1, len(rows) // 20)
    for i, row in enumerate(rows):
        x0 = LEFT + i * slot + slot * 0.1
        width = slot * 0.8
        base = TOP + plot_h
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
            parts.append(format_html(
                '<rect class="bar {}" x="{}" y="{}" width="{}" height="{}" data-series="{}" data-category="{}" '
                'data-value="{}"><title>{}: {} {}{}</title></rect>',
                s.css, _num(x), _num(y), _num(max(w, 0.5)), _num(h), s.key, row[category], value,
                row[category], s.label, fmt(value), unit))
        if i % label_every == 0:
            cx = LEFT + i * slot + slot / 2
            parts.append(format_html('<text class="label" x="{}" y="{}" text-anchor="end" transform="rotate(-40 {} {})">{}</text>',
                                     _num(cx), HEIGHT - BOTTOM + 14, _num(cx), HEIGHT - BOTTOM + 14,
                                     str(row[category])[:24]))
    x = LEFT
    for s in series:
        parts.append(format_html('<rect class="bar {}" x="{}" y="{}" width="10" height="10"/>', s.css, x, HEIGHT - 14))
        parts.append(format_html('<text class="legend" x="{}" y="{}">{}</text>', x + 14, HEIGHT - 5, s.label))
        x += 14 + 8 * len(s.label) + 16
    parts.append(mark_safe("</svg>"))  # noqa: S308 - a constant
    return mark_safe("".join(parts))  # noqa: S308 - every value above went through format_html


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

