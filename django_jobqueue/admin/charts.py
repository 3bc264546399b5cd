"""The overview's charts of the per-minute figures (metrics.py), drawn on the server as inline
SVG, as the workflow picture is: nothing is loaded from anywhere, and a strict
Content-Security-Policy allows them.

Counts are bars (a minute without a figure is a zero: nothing was claimed, finished or ready
then); the oldest ready job's age is a line; the start latency is drawn only at the minutes
that started a job (a minute without a start has no latency, not a zero one).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from collections.abc import Callable, Sequence
from typing import Any

from django.utils import timezone
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from .. import metrics
from . import display

W, H = 560, 150  # the plot area
LEFT, RIGHT, TOP, BOTTOM = 60, 12, 24, 22  # the legend sits above the plot
PALETTE = ("#1565c0", "#2e7d32", "#b71c1c", "#ef6c00", "#6a1b9a", "#00838f", "#5d4037", "#455a64")
GRID = "#e0e0e0"
MAX_QUEUES = 8  # backlog bars stacked by queue; the rest are summed into "other queues"


@dataclasses.dataclass(frozen=True)
class Window:
    """A range of the charts: its length, minutes per bar, x ticks every `tick` minutes."""

    key: str
    label: str
    length: dt.timedelta
    step: int
    tick: int


WINDOWS = {
    w.key: w
    for w in (
        Window("15m", "15 minutes", dt.timedelta(minutes=15), 1, 5),
        Window("1h", "hour", dt.timedelta(hours=1), 1, 15),
        Window("24h", "24 hours", dt.timedelta(hours=24), 10, 240),
    )
}
ALIASES = {"hour": "1h", "day": "24h"}  # the ?range= values of earlier releases


def pick_window(using: str, now: dt.datetime, asked: str | None) -> Window:
    """The window `asked` for, or the shortest that holds the figures of the last 24 hours."""
    key = ALIASES.get(asked or "", asked or "")
    if key in WINDOWS:
        return WINDOWS[key]
    first = metrics.earliest(using, now - WINDOWS["24h"].length)
    for window in WINDOWS.values():
        # A window's first bar starts on its first minute, a little before now - length.
        if first is None or first >= metrics.minute_of(now - window.length):
            return window
    return WINDOWS["24h"]


def overview_charts(
    using: str, now: dt.datetime, window: Window, current: dict[str, Any]
) -> list[dict[str, Any]]:
    """The overview's four charts over `window`, each {"title", "svg", "note"}; `current` holds
    the figures of now (ready jobs per queue, the oldest ready job's age) for the captions."""
    data = metrics.series(using, now - window.length, now, window.step)
    minutes = data["minutes"]
    per = "per minute" if window.step == 1 else f"per {window.step} minutes"
    last = f"last {window.label}"

    def zero(series: Sequence[Any]) -> list[Any]:
        return [v or 0 for v in series]

    started, finished, failed = (zero(data[k]) for k in ("started", "finished", "failed"))
    ready_now = current.get("ready", {})
    ready_note = ", ".join(f"{q or '(none)'} {n:,}" for q, n in sorted(ready_now.items()) if n)
    oldest = current.get("oldest_ready")
    p50, p95 = (metrics.quantile(data["latency"], q) for q in (0.5, 0.95))
    return [
        _chart(
            f"Jobs {per}",
            minutes,
            window,
            bars=[
                [("started", PALETTE[0], started)],
                [("finished", PALETTE[1], finished), ("failed", PALETTE[2], failed)],
            ],
            note=f"{last}: {sum(started):,} started, {sum(finished):,} finished, "
            f"{sum(failed):,} failed",
        ),
        _chart(
            "Ready backlog by queue",
            minutes,
            window,
            bars=[[(q, colour, zero(line)) for q, colour, line in _top_queues(data["ready"])]],
            note=f"now: {sum(ready_now.values()):,} ready"
            + (f" ({ready_note})" if ready_note else ""),
        ),
        _chart(
            "Oldest ready job",
            minutes,
            window,
            lines=[("age", PALETTE[3], zero(data["oldest_ready"]))],
            seconds=True,
            note=f"now: waiting {oldest}" if oldest else "now: no job is ready",
        ),
        _chart(
            "Enqueue-to-start latency (first attempts)",
            minutes,
            window,
            lines=[("p50", PALETTE[0], data["p50"]), ("p95", PALETTE[4], data["p95"])],
            seconds=True,
            log=True,
            note=f"{last}: p50 up to {_label(p50, True)}, p95 up to {_label(p95, True)}"
            if p50 is not None and p95 is not None
            else f"{last}: no job started",
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
        summed = [sum(ready[q][i] or 0 for q in rest) for i in range(width)]
        lines.append((f"{len(rest)} other queues", "#9e9e9e", summed))
    return lines


Series = tuple[str, str, Sequence[Any]]


def _chart(
    title: str,
    minutes: list[dt.datetime],
    window: Window,
    *,
    bars: list[list[Series]] | None = None,
    lines: list[Series] | None = None,
    seconds: bool = False,
    log: bool = False,
    note: str = "",
) -> dict[str, Any]:
    """A chart: side by side groups of stacked `bars` per slot, or `lines` (None: no point)."""
    bars, lines = bars or [], lines or []
    count = len(minutes)
    stacks = [[sum(s[2][i] for s in group) for i in range(count)] for group in bars]
    values = [v for stack in stacks for v in stack]
    values += [v for _, _, series in lines for v in series if v is not None]
    if not any(values):  # nothing but zeros: no axes to fit
        return {"title": title, "svg": _empty(title), "note": note}
    slot = W / max(count, 1)
    ticks, scale = _y_axis(values, seconds=seconds, log=log)
    parts = [_y_grid(ticks, scale, seconds), *_x_axis(minutes, window, slot)]
    width = slot * 0.8 / max(len(bars), 1)
    stamps = [escape(_stamp(minute)) for minute in minutes]  # once a slot, not once a mark
    for g, group in enumerate(bars):
        for i in range(count):
            base = 0.0
            x = LEFT + i * slot + slot * 0.1 + g * width
            for name, colour, series in group:
                value = series[i]
                if value:
                    top, bottom = scale(base + value), scale(base)
                    parts.append(
                        f'<rect x="{x:.1f}" y="{top:.1f}" width="{max(width - 0.5, 0.8):.1f}" '
                        f'height="{bottom - top:.1f}" fill="{colour}"><title>'
                        f"{stamps[i]} {escape(name)}: {value:,}</title></rect>"
                    )
                base += value or 0
    for name, colour, series in lines:
        for run in _runs(series):
            if len(run) == 1:
                i, v = run[0]
                parts.append(
                    f'<circle cx="{LEFT + (i + 0.5) * slot:.1f}" cy="{scale(v):.1f}" r="2" '
                    f'fill="{colour}"><title>{stamps[i]} {escape(name)}: '
                    f"{escape(_label(v, seconds))}</title></circle>"
                )
                continue
            points = " ".join(f"{LEFT + (i + 0.5) * slot:.1f},{scale(v):.1f}" for i, v in run)
            parts.append(
                f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="1.5"/>'
            )
    legend = []
    named = [(n, c) for group in bars for n, c, _ in group] + [(n, c) for n, c, _ in lines]
    for n, (name, colour) in enumerate(named):
        lx = LEFT + n * 100
        legend.append(
            f'<rect x="{lx}" y="2" width="10" height="10" fill="{colour}"/>'
            f'<text x="{lx + 14}" y="11">{escape(name[:14])}</text>'
        )
    full_w, full_h = LEFT + W + RIGHT, TOP + H + BOTTOM
    svg = (
        f'<svg class="jq-chart" xmlns="http://www.w3.org/2000/svg" width="{full_w}" '
        f'height="{full_h}" viewBox="0 0 {full_w} {full_h}" role="img" '
        f'aria-label="{escape(title)}"><title>{escape(title)}</title>'
        + "".join(parts)
        + "".join(legend)
        + "</svg>"
    )
    return {"title": title, "svg": mark_safe(svg), "note": note}


def _y_axis(
    values: list[float], *, seconds: bool, log: bool
) -> tuple[list[float], Callable[[float], float]]:
    """Round ticks from zero (or a power of ten, on a log scale) past the largest value, and
    the value-to-y function they imply."""
    top = max(values, default=0) or 1
    if log:
        low = min((v for v in values if v > 0), default=top)
        first = 10 ** math.floor(math.log10(low))
        last = 10 ** math.ceil(math.log10(top))
        if last <= first:
            last = first * 10
        ticks = [first * 10**k for k in range(round(math.log10(last / first)) + 1)]
        span = math.log10(last) - math.log10(first)

        def log_y(value: float) -> float:
            at = math.log10(max(value, first)) - math.log10(first)
            return TOP + H - at / span * H

        return ticks, log_y
    step = _nice_step(top / 4, seconds)
    ticks = [step * k for k in range(math.ceil(top / step - 1e-9) + 1)]
    ceiling = ticks[-1] or 1

    def linear_y(value: float) -> float:
        return TOP + H - value / ceiling * H

    return ticks, linear_y


def _nice_step(rough: float, seconds: bool) -> float:
    """The smallest round step (1, 2, 5 times a power of ten; whole minutes or hours for
    seconds past a minute) at least `rough`."""
    if seconds and rough > 30:
        for step in (60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 21600, 43200, 86400):
            if step >= rough:
                return float(step)
        return 86400.0 * math.ceil(rough / 86400)
    if rough <= 1 and not seconds:
        return 1.0
    power = 10 ** math.floor(math.log10(rough))
    for factor in (1, 2, 5, 10):
        if factor * power >= rough:
            return float(factor * power)
    return float(10 * power)


def _y_grid(ticks: list[float], scale: Callable[[float], float], seconds: bool) -> str:
    out = [f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + H}" stroke="#999"/>']
    for value in ticks:
        y = scale(value)
        colour = "#999" if value == ticks[0] else GRID
        out.append(
            f'<line x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + W}" y2="{y:.1f}" stroke="{colour}"/>'
            f'<text x="{LEFT - 4}" y="{y + 4:.1f}" text-anchor="end">'
            f"{escape(_label(value, seconds))}</text>"
        )
    return "".join(out)


def _x_axis(minutes: list[dt.datetime], window: Window, slot: float) -> list[str]:
    """A tick at each slot that starts on a round local time (every `window.tick` minutes)."""
    out = []
    for i, minute in enumerate(minutes):
        local = timezone.localtime(minute)
        if (local.hour * 60 + local.minute) % window.tick:
            continue
        x = LEFT + i * slot
        out.append(
            f'<line x1="{x:.1f}" y1="{TOP + H}" x2="{x:.1f}" y2="{TOP + H + 4}" stroke="#999"/>'
            f'<text x="{x:.1f}" y="{TOP + H + 16}" text-anchor="middle">'
            f"{local.strftime('%H:%M')}</text>"
        )
    end = LEFT + W
    out.append(f'<text x="{end}" y="{TOP + H + 16}" text-anchor="end">now</text>')
    return out


def _stamp(minute: dt.datetime) -> str:
    return timezone.localtime(minute).strftime("%H:%M")


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


def _label(value: float | None, seconds: bool) -> str:
    if value is None:
        return "-"
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
