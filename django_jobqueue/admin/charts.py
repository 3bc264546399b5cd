"""The overview's charts: line charts of the per-minute figures (metrics.py), drawn on the
server as inline SVG, as the workflow picture is: nothing is loaded from anywhere, and a strict
Content-Security-Policy allows them.

A gap in a line is a minute with no figure (no worker recorded, or no sample was taken).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from typing import Any

from django.utils import timezone
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from .. import metrics
from . import display

W, H = 560, 150  # the plot area
LEFT, RIGHT, TOP, BOTTOM = 56, 12, 24, 22  # the legend sits above the plot
PALETTE = ("#1565c0", "#2e7d32", "#b71c1c", "#ef6c00", "#6a1b9a", "#00838f", "#5d4037", "#455a64")
RANGES = {"hour": (dt.timedelta(hours=1), 1), "day": (dt.timedelta(days=1), 10)}
MAX_QUEUES = 8  # backlog lines drawn; the rest are summed into "other queues"


def overview_charts(using: str, now: dt.datetime, span: str) -> list[dict[str, Any]]:
    """The overview's four charts over `span` ("hour" or "day"), each {"title", "svg", "note"}."""
    length, step = RANGES.get(span, RANGES["hour"])
    data = metrics.series(using, now - length, now, step)
    minutes = data["minutes"]
    per = "per minute" if step == 1 else f"per {step} minutes"
    backlog = _top_queues(data["ready"])
    return [
        _chart(
            f"Jobs {per}",
            minutes,
            [
                ("finished", PALETTE[1], data["finished"]),
                ("failed", PALETTE[2], data["failed"]),
                ("started", PALETTE[0], data["started"]),
            ],
        ),
        _chart("Ready backlog by queue", minutes, backlog),
        _chart(
            "Oldest ready job",
            minutes,
            [("age", PALETTE[3], data["oldest_ready"])],
            seconds=True,
        ),
        _chart(
            "Enqueue-to-start latency (first attempts)",
            minutes,
            [("p50", PALETTE[0], data["p50"]), ("p95", PALETTE[4], data["p95"])],
            seconds=True,
            log=True,
        ),
    ]


def _top_queues(ready: dict[str, list[int | None]]) -> list[tuple[str, str, Sequence[Any]]]:
    ranked = sorted(ready, key=lambda q: -max((v or 0) for v in ready[q]))
    lines: list[tuple[str, str, Sequence[Any]]] = [
        (queue or "(none)", PALETTE[i % len(PALETTE)], ready[queue])
        for i, queue in enumerate(ranked[:MAX_QUEUES])
    ]
    rest = ranked[MAX_QUEUES:]
    if rest:
        width = len(ready[rest[0]])
        summed = [
            sum(ready[q][i] or 0 for q in rest) if any(ready[q][i] is not None for q in rest)
            else None
            for i in range(width)
        ]  # fmt: skip
        lines.append((f"{len(rest)} other queues", "#9e9e9e", summed))
    return lines


def _chart(
    title: str,
    minutes: list[dt.datetime],
    lines: list[tuple[str, str, Sequence[Any]]],
    *,
    seconds: bool = False,
    log: bool = False,
) -> dict[str, Any]:
    values = [v for _, _, series in lines for v in series if v is not None]
    last = [(name, next((v for v in reversed(s) if v is not None), None)) for name, _, s in lines]
    note = ", ".join(f"{name} {_label(v, seconds)}" for name, v in last if v is not None)
    if not values:
        return {"title": title, "svg": _empty(title), "note": "no figures recorded yet"}
    top = max(values) or 1
    low = min(v for v in values if v > 0) if log and any(v > 0 for v in values) else 0

    def y(value: float) -> float:
        if log:
            floor = max(low / 2, 1e-3)
            span = math.log10(top) - math.log10(floor) or 1
            return TOP + H - (math.log10(max(value, floor)) - math.log10(floor)) / span * H
        return TOP + H - value / top * H

    count = len(minutes)

    def x(index: int) -> float:
        return LEFT + (index / max(count - 1, 1)) * W

    paths = []
    for _name, colour, series in lines:
        for run in _runs(series):
            points = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in run)
            if len(run) == 1:
                i, v = run[0]
                paths.append(f'<circle cx="{x(i):.1f}" cy="{y(v):.1f}" r="2" fill="{colour}"/>')
            else:
                paths.append(
                    f'<polyline points="{points}" fill="none" stroke="{colour}" '
                    'stroke-width="1.5"/>'
                )
    axes = [
        f'<line x1="{LEFT}" y1="{TOP + H}" x2="{LEFT + W}" y2="{TOP + H}" stroke="#999"/>',
        f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + H}" stroke="#999"/>',
        f'<text x="{LEFT - 4}" y="{TOP + 8}" text-anchor="end">{escape(_label(top, seconds))}'
        "</text>",
        f'<text x="{LEFT - 4}" y="{TOP + H}" text-anchor="end">'
        f"{escape(_label(low / 2 if log and low else 0, seconds))}</text>",
    ]
    for index in (0, count // 2, count - 1):
        stamp = timezone.localtime(minutes[index]).strftime("%H:%M")
        anchor = "start" if index == 0 else ("end" if index == count - 1 else "middle")
        axes.append(
            f'<text x="{x(index):.1f}" y="{TOP + H + 16}" text-anchor="{anchor}">{stamp}</text>'
        )
    legend = []
    for n, (name, colour, _) in enumerate(lines):
        lx = LEFT + 8 + n * 110
        legend.append(
            f'<rect x="{lx}" y="2" width="10" height="10" fill="{colour}"/>'
            f'<text x="{lx + 14}" y="11">{escape(name[:16])}</text>'
        )
    width, height = LEFT + W + RIGHT, TOP + H + BOTTOM
    svg = (
        f'<svg class="jq-chart" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{escape(title)}"><title>{escape(title)}</title>'
        + "".join(axes)
        + "".join(paths)
        + "".join(legend)
        + "</svg>"
    )
    return {"title": title, "svg": mark_safe(svg), "note": f"latest: {note}" if note else ""}


def _runs(series: Sequence[Any]) -> list[list[tuple[int, float]]]:
    """The stretches of `series` without a gap, as (index, value) points."""
    runs: list[list[tuple[int, float]]] = []
    current: list[tuple[int, float]] = []
    for index, value in enumerate(series):
        if value is None:
            if current:
                runs.append(current)
            current = []
        else:
            current.append((index, float(value)))
    if current:
        runs.append(current)
    return runs


def _label(value: float, seconds: bool) -> str:
    if seconds:
        return display.duration(value) if value >= 1 or value == 0 else f"{value * 1000:.0f} ms"
    return f"{value:,.0f}"


def _empty(title: str) -> SafeString:
    width, height = LEFT + W + RIGHT, TOP + H + BOTTOM
    return mark_safe(
        f'<svg class="jq-chart" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{escape(title)}: no data"><text x="{LEFT}" y="{TOP + H // 2}">'
        "No figures recorded in this range yet.</text></svg>"
    )
