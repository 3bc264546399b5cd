"""The job page's view of a long job: its progress, its steps, and what it waits for."""

from __future__ import annotations

import datetime as dt
import json

from django.db.models import F
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from ..models import Job, JobDependency, JobMap, JobStep, JobWait
from . import display

SHOWN_STEPS = 200
KINDS = {
    "@sleep": "sleep",
    "@event": "event wait",
    "@spawn": "spawn",
    "@wait": "wait for jobs",
    "@map": "map",
    "@patch": "patched()",
    "@acquire": "acquire",
    "@settle": "settle",
}


def progress(job: Job) -> SafeString | str:
    """`ctx.progress()`'s last value as a bar and a line (a <progress> element: no style)."""
    value = job.progress
    if not value:
        return display.NONE
    current, total = value.get("current"), value.get("total")
    bar = format_html('<progress max="{}" value="{}"></progress> ', total, current) if total else ""
    of = f"{current:g} of {total:g}" if total else f"{current:g}"
    updated = value.get("updated_at")
    ago = display.age(dt.datetime.fromisoformat(updated)) if updated else "?"
    return format_html(
        '{}{}{} <span class="quiet">(updated {} ago)</span>',
        bar,
        of,
        format_html(": {}", value["message"]) if value.get("message") else "",
        ago,
    )


def maps(job: Job) -> SafeString | str:
    """The progress of the job's maps (ctx.map): children done / total, as a bar each."""
    rows = list(JobMap.objects.filter(job_id=job.pk).order_by("seq"))
    if not rows:
        return display.NONE
    return format_html_join(
        "",
        '<p><progress max="{}" value="{}"></progress> {} / {} children of {} final{}</p>',
        (
            (
                row.total,
                row.total - row.unfinished,
                row.total - row.unfinished,
                row.total,
                row.type,
                f" ({row.running} running, at most {row.concurrency} at once)"
                if row.unfinished and row.concurrency
                else (f" ({row.running} running)" if row.unfinished else ""),
            )
            for row in rows
        ),
    )


def steps(job: Job) -> SafeString | str:
    """The durable calls recorded for the job, in the order they were recorded."""
    rows = list(
        JobStep.objects.filter(job_id=job.pk)
        .order_by("pk")
        .values_list("name", "seq", "place", "attempt", "created_at", "duration", "result")[
            : SHOWN_STEPS + 1
        ]
    )
    if not rows:
        return display.NONE
    more = ""
    if len(rows) > SHOWN_STEPS:
        rows = rows[:SHOWN_STEPS]
        more = format_html(
            "<p>and {} more</p>", JobStep.objects.filter(job_id=job.pk).count() - SHOWN_STEPS
        )
    body = format_html_join(
        "",
        "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
        (
            (
                KINDS.get(name, name),
                seq,
                "-" if place is None else place,
                attempt,
                display.moment(created),
                "-" if duration is None else display.duration(duration),
                _size(result),
            )
            for name, seq, place, attempt, created, duration, result in rows
        ),
    )
    return format_html(
        "<table><thead><tr><th>step</th><th>call</th><th>place</th><th>attempt</th>"
        "<th>recorded</th><th>took</th><th>result</th></tr></thead><tbody>{}</tbody></table>{}",
        body,
        more,
    )


def _size(result: object) -> str:
    size = len(json.dumps(result))
    return f"{size} B" if size < 1024 else f"{size / 1024:.1f} KiB"


def waits_for(job: Job) -> SafeString | str:
    """What a suspended job waits for: a time, an event, jobs, or its spawned children."""
    if job.state == Job.State.SCHEDULED:
        if JobStep.objects.filter(job_id=job.pk, name="@sleep").exists():
            return format_html(
                "its run after {} (a sleep of its handler, or a retry's backoff)",
                display.moment(job.run_after),
            )
        return "-"
    if job.state != Job.State.WAITING:
        return "-"
    wait = JobWait.objects.filter(job_id=job.pk).first()
    if wait is not None and wait.count is None:
        limit = format_html(", gives up at {}", display.moment(wait.until)) if wait.until else ""
        return format_html("event {}{}", wait.key, limit)
    edges = JobDependency.objects.filter(job_id=job.pk, awaits=True)
    awaited = list(
        edges.order_by("depends_on_id").values_list("depends_on_id", "depends_on__state")[:20]
    )
    if awaited:
        what = "jobs to be final"
        if wait is not None:  # ctx.wait_for(count=N)
            final = edges.filter(depends_on__state__in=Job.TERMINAL_STATES).count()
            what = f"{wait.count} of {edges.count()} jobs to be final ({final} final)"
        return format_html(
            "{}: {}",
            what,
            format_html_join(" ", "{}", ((display.job_link(pk, state),) for pk, state in awaited)),
        )
    if job.sealed and job.has_children:
        return format_html("its spawned children ({} not final)", job.open_children)
    mapping = JobMap.objects.filter(job_id=job.pk, unfinished__gt=0).order_by("-seq").first()
    if mapping is not None:
        done = mapping.total - mapping.unfinished
        return f"the children of its map ({done} / {mapping.total} final)"
    return "-"


# The retry point before every record: the next run starts over.
START = "start"


def retry_points(job: Job) -> list[tuple[str, str, bool]]:
    """The points a dead or cancelled job can be retried from: (value, label, selected), the
    records after its last spawn (clearing a spawn would spawn its child again), and START
    when it spawned nothing. Selected: the last record, or for a job that a ReplayMismatch
    stopped, the last place where its replay agreed."""
    if not job.has_steps:
        return []
    records = JobStep.objects.filter(job_id=job.pk)
    last_spawn = records.filter(name="@spawn").order_by("-pk").values_list("pk", flat=True)
    spawned = last_spawn.first()
    if spawned is not None:
        records = records.filter(pk__gte=spawned)
    # The latest SHOWN_STEPS in place order (records from before places first), oldest
    # first: the last one keeps every record, so a click without a choice clears nothing.
    order = (F("place").desc(nulls_last=True), "-pk")
    fields = ("pk", "name", "seq", "attempt", "place")
    latest = list(reversed(records.order_by(*order).values_list(*fields)[:SHOWN_STEPS]))
    points = [(START, "nothing: run from the start", False)] if spawned is None else []
    for pk, name, seq, attempt, place in latest:
        at = f"place {place}: " if place is not None else ""
        points.append((str(pk), f"{at}{KINDS.get(name, name)} #{seq} (attempt {attempt})", False))
    if not points:
        return []
    mismatch = (job.last_error or {}).get("place")
    chosen = len(points) - 1
    if isinstance(mismatch, int):  # where the mismatch's replay last agreed
        agreed = [n for n, row in enumerate(latest) if row[4] is not None and row[4] < mismatch]
        if agreed:
            chosen = agreed[-1] + len(points) - len(latest)
        elif spawned is None:
            chosen = 0
    return [(value, label, n == chosen) for n, (value, label, _) in enumerate(points)]
