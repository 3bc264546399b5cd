"""A workflow's timeline: a Gantt chart of a container's children, drawn on the server as SVG.

One bar per child, from its first claim to its end (or now), coloured by state. A bar is split
where the record allows: the earlier attempts (from the first start to the last attempt's
start; failed ones are counted from the job's error records) in a pale shade, then the last
attempt in the state's colour; durable sleeps and waits (the `@sleep`, `@event`, `@wait` and
`@spawn` records) are grey hatches over the bar, from when they were recorded to when the job
woke (the sleep's end, or the next record, or the last attempt's start, whichever is first).

The critical path is marked: from the child that finished last, back through the upstream
job (among the children) that finished last, to a job with none. Past ROWS children, the
critical path, failed and running children keep their rows and the others collapse into one
row per handler key (their span, and how many), linked to their list, as the workflow
picture collapses its sides. It reads the children's times in one query, their durable
records in two and their edges in a fourth: at 2,000 children, a few thousand small rows.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from django.utils import timezone
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from ..engine.durable import EVENT, SLEEP, SPAWN, WAIT
from ..models import Job, JobDependency, JobStep
from .display import STATE_COLOURS, duration, job_url
from .graph import changelist

ROWS = 60  # bars drawn one per job; the rest collapse per handler key
MAX_CHILDREN = 2000  # children read; a larger workflow shows its first 2,000 (by id)
ROW, LABEL, WIDTH = 16, 190, 640
SUSPENSIONS = (SLEEP, EVENT, WAIT, SPAWN)
FAILED = set(Job.FAILED_STATES)
OTHERS = "(other handlers)"


@dataclass
class Bar:
    pk: int
    type: str
    state: str
    start: dt.datetime
    last_start: dt.datetime
    end: dt.datetime
    failed_attempts: int
    finished: bool
    pauses: list[tuple[dt.datetime, dt.datetime, str]] = field(default_factory=list)
    critical: bool = False


def render(container: Job, now: dt.datetime | None = None) -> SafeString | str:
    """The timeline of `container`'s children, or a sentence saying why there is none."""
    now = now or timezone.now()
    bars = _bars(container, now)
    if not bars:
        return "no child has started yet"
    _mark_critical(bars)
    shown, collapsed = _choose(bars)
    return _svg(container, shown, collapsed, now)


def _bars(container: Job, now: dt.datetime) -> dict[int, Bar]:
    rows = (
        Job.objects.filter(parent=container)
        .exclude(first_started_at__isnull=True, started_at__isnull=True)
        .order_by("pk")
        .values_list(
            "pk", "type", "state", "first_started_at", "started_at", "finished_at", "errors"
        )[:MAX_CHILDREN]
    )
    bars: dict[int, Bar] = {}
    for pk, kind, state, first, last, finished, errors in rows:
        start = first or last
        if start is None:
            continue
        last = last or start
        end = finished or now
        bars[pk] = Bar(
            pk, kind, state, start, max(last, start), max(end, start),
            failed_attempts=len(errors or []), finished=finished is not None,
        )  # fmt: skip
    records = (
        JobStep.objects.filter(job_id__in=list(bars), name__in=SUSPENSIONS)
        .order_by("job_id", "created_at")
        .values_list("job_id", "name", "created_at", "result")
    )
    steps: dict[int, list[tuple[str, dt.datetime, Any]]] = defaultdict(list)
    for job_id, name, at, result in records:
        steps[job_id].append((name, at, result))
    later = (
        JobStep.objects.filter(job_id__in=list(steps)).order_by("job_id", "created_at")
    ).values_list("job_id", "created_at")
    recorded: dict[int, list[dt.datetime]] = defaultdict(list)
    for job_id, at in later:
        recorded[job_id].append(at)
    for job_id, calls in steps.items():
        bar = bars[job_id]
        for name, at, result in calls:
            woke = [t for t in recorded[job_id] if t > at] + [bar.end]
            if bar.last_start > at:
                woke.append(bar.last_start)
            if name == SLEEP and isinstance(result, dict):
                woke.append(_sleep_end(at, result))
            bar.pauses.append((at, min(woke), name.lstrip("@")))
    return bars


def _sleep_end(at: dt.datetime, result: dict[str, Any]) -> dt.datetime:
    if "until" in result:
        try:
            return dt.datetime.fromisoformat(str(result["until"]))
        except ValueError:
            return at
    return at + dt.timedelta(seconds=float(result.get("seconds") or 0))


def _mark_critical(bars: dict[int, Bar]) -> None:
    """Mark the chain of last-finishing upstream jobs that ends at the last child to finish."""
    upstream: dict[int, list[int]] = defaultdict(list)
    edges = JobDependency.objects.filter(job_id__in=list(bars), depends_on_id__in=list(bars))
    for job_id, depends_on in edges.values_list("job_id", "depends_on_id"):
        upstream[job_id].append(depends_on)
    current: int | None = max(bars.values(), key=lambda b: (b.end, b.pk)).pk
    seen: set[int] = set()
    while current is not None and current not in seen:
        seen.add(current)
        bars[current].critical = True
        before = [bars[u] for u in upstream.get(current, []) if u in bars]
        current = max(before, key=lambda b: (b.end, b.pk)).pk if before else None


def _choose(bars: dict[int, Bar]) -> tuple[list[Bar], list[tuple[str, list[Bar]]]]:
    """The bars drawn one per job, and the others grouped by handler key."""
    ordered = sorted(bars.values(), key=lambda b: (b.start, b.pk))
    if len(ordered) <= ROWS:
        return ordered, []

    def rank(bar: Bar) -> int:
        if bar.critical:
            return 0
        if bar.state in FAILED or bar.failed_attempts:
            return 1
        return 2 if not bar.finished else 3

    keep = {b.pk for b in sorted(ordered, key=lambda b: (rank(b), b.start, b.pk))[: ROWS - 8]}
    groups: dict[str, list[Bar]] = defaultdict(list)
    for bar in ordered:
        if bar.pk not in keep:
            groups[bar.type].append(bar)
    if len(groups) > 8:  # at most 8 grouped rows: the smallest groups share the last one
        merged = sorted(groups.items(), key=lambda kv: -len(kv[1]))
        rest = [b for _, group in merged[7:] for b in group]
        groups = dict(merged[:7])
        groups[OTHERS] = rest
    return [b for b in ordered if b.pk in keep], sorted(groups.items())


def _svg(
    container: Job, shown: list[Bar], collapsed: list[tuple[str, list[Bar]]], now: dt.datetime
) -> SafeString:
    everything = shown + [b for _, group in collapsed for b in group]
    t0 = min(b.start for b in everything)
    t1 = max(b.end for b in everything)
    span = max((t1 - t0).total_seconds(), 1e-3)

    def x(moment: dt.datetime) -> float:
        return LABEL + (moment - t0).total_seconds() / span * WIDTH

    parts: list[str] = [
        '<defs><pattern id="jq-pause" width="4" height="4" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><rect width="2" height="4" fill="#bdbdbd"/></pattern>'
        "</defs>"
    ]
    y = 4
    for bar in shown:
        parts.append(_bar_row(bar, x, y))
        y += ROW
    for kind, group in collapsed:
        first = min(b.start for b in group)
        last = max(b.end for b in group)
        link = changelist(container=int(container.pk))
        if kind != OTHERS:
            link += "&" + urlencode({"type": kind})
        parts.append(
            f'<a href="{escape(link)}"><text x="{LABEL - 6}" y="{y + 11}" text-anchor="end">'
            f"+{len(group)} more {escape(kind[:24])}</text>"
            f'<rect x="{x(first):.1f}" y="{y + 3}" width="{max(x(last) - x(first), 1):.1f}" '
            f'height="{ROW - 6}" fill="#9e9e9e" opacity="0.6"><title>{len(group)} jobs of '
            f"{escape(kind)}, {_stamp(first)} to {_stamp(last)}</title></rect></a>"
        )
        y += ROW
    # The time axis: start, middle and end.
    axis = y + 14
    for moment, anchor in ((t0, "start"), (t0 + (t1 - t0) / 2, "middle"), (t1, "end")):
        parts.append(
            f'<text x="{x(moment):.1f}" y="{axis}" text-anchor="{anchor}">{_stamp(moment)}</text>'
        )
    parts.append(
        f'<line x1="{LABEL}" y1="{y + 2}" x2="{LABEL + WIDTH}" y2="{y + 2}" stroke="#999"/>'
    )
    height = axis + 6
    width = LABEL + WIDTH + 10
    legend = (
        f"{len(everything)} children started, over {_length(span)}; critical path outlined "
        "in black; earlier attempts pale; sleeps and waits hatched."
    )
    return mark_safe(
        f'<svg class="jq-timeline" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="Timeline of the workflow"><title>Timeline</title>{"".join(parts)}</svg>'
        f'<p class="help">{escape(legend)}</p>'
    )


def _bar_row(bar: Bar, x: Any, y: int) -> str:
    colour = str(STATE_COLOURS.get(bar.state, "#000"))  # type: ignore[call-overload]
    top, height = y + 3, ROW - 6
    title = (
        f"#{bar.pk} {bar.type}: {bar.state}, {_stamp(bar.start)} to "
        f"{_stamp(bar.end) if bar.finished else 'now'}"
        + (f", {bar.failed_attempts} failed attempt(s)" if bar.failed_attempts else "")
    )
    out = [
        f'<a href="{escape(job_url(bar.pk))}"><text x="{LABEL - 6}" y="{y + 11}" '
        f'text-anchor="end"{' font-weight="bold"' if bar.critical else ""}>'
        f"#{bar.pk} {escape(bar.type[:22])}</text>"
    ]
    if bar.last_start > bar.start:  # the earlier attempts
        out.append(
            f'<rect class="jq-earlier" x="{x(bar.start):.1f}" y="{top}" '
            f'width="{max(x(bar.last_start) - x(bar.start), 1):.1f}" height="{height}" '
            f'fill="{colour}" opacity="0.35"/>'
        )
    out.append(
        f'<rect class="jq-attempt" x="{x(bar.last_start):.1f}" y="{top}" '
        f'width="{max(x(bar.end) - x(bar.last_start), 1):.1f}" height="{height}" '
        f'fill="{colour}"/>'
    )
    for start, end, kind in bar.pauses:
        out.append(
            f'<rect class="jq-pause" x="{x(start):.1f}" y="{top}" '
            f'width="{max(x(end) - x(start), 1):.1f}" height="{height}" fill="url(#jq-pause)">'
            f"<title>{escape(kind)} from {_stamp(start)} to {_stamp(end)}</title></rect>"
        )
    if bar.critical:
        out.append(
            f'<rect class="jq-critical" x="{x(bar.start):.1f}" y="{top - 1}" '
            f'width="{max(x(bar.end) - x(bar.start), 1):.1f}" height="{height + 2}" '
            'fill="none" stroke="#000" stroke-width="1.5"/>'
        )
    out.append(f"<title>{escape(title)}</title></a>")
    return "".join(out)


def _stamp(moment: dt.datetime, precise: bool = False) -> str:
    local = timezone.localtime(moment)
    return local.strftime("%H:%M:%S.%f")[:-3] if precise else local.strftime("%H:%M:%S")


def _length(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else duration(seconds)
