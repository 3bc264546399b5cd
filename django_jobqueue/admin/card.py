"""A job page's summary card: what an operator triages by, above the fold, and the actions
that fit the job's state beside it (template admin/django_jobqueue/job/card.html).

The card reads the job's own row and, for a ready job, the limits it names: a few small
queries. Every moment is drawn by `display.moment` (one date format on the whole page).
"""

from __future__ import annotations

from typing import Any

from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from .. import conf, limits, pausing
from ..dialects import get_dialect
from ..engine import control, occupancy
from ..limits import window
from ..models import Job, Limit, Worker
from . import display, durable

SHOWN = 10  # upstream jobs named on the card


def rows(job: Job) -> list[tuple[str, SafeString | str]]:
    """The card's lines: (label, value), in the order an operator reads them."""
    lines: list[tuple[str, SafeString | str]] = [
        ("state", state(job)),
        ("handler", handler(job)),
        ("attempts", attempts(job)),
    ]
    label, why = waiting(job)
    if why:
        lines.append((label, why))
    lines.append(
        ("progress" if job.state == Job.State.RUNNING else "last progress", _progress(job))
    )
    lines.append(("last error", last_error(job)))
    lines.append(("worker", worker(job)))
    lines.append(("times", times(job)))
    return lines


def state(job: Job) -> SafeString:
    note = ""
    if job.cancel_requested and job.state in Job.LEASED_STATES:
        note = "cancel requested: its handler is asked to stop"
    elif job.state == Job.State.WAITING and job.is_container and not job.sealed:
        note = "open container"
    shown = display.badge(job.state)
    if note:
        shown = format_html('{} <span class="jq-sub-inline">{}</span>', shown, note)
    paused = pausing.reasons([job], job._state.db).get(int(job.pk)) if job.pk else None
    return format_html("{}{}", shown, display.paused_note(paused)) if paused else shown


def handler(job: Job) -> SafeString:
    version = job.handler_version or ("-" if job.first_started_at else "- (not started yet)")
    return format_html("<code>{}</code> version {}, queue {}", job.type, version, job.queue)


def attempts(job: Job) -> str:
    text = f"{job.attempts} of {job.max_attempts}"
    if job.state in Job.FAILED_STATES and job.attempts >= job.max_attempts:
        text += " (used up)"
    return text


def waiting(job: Job) -> tuple[str, SafeString | str]:
    """What the job waits for, or what holds a ready job back: (label, value), or ("", "")."""
    if job.state == Job.State.WAITING:
        why = durable.waits_for(job)
        return "waits for", upstream(job) if why == "-" else why
    if job.state == Job.State.SCHEDULED:
        why = durable.waits_for(job)
        if why == "-":
            why = format_html("its run after, {} ({})", display.moment(job.run_after),
                              display.age(job.run_after))  # fmt: skip
        return "waits for", why
    if job.state == Job.State.READY:
        return "held back by", held_back(job)
    return "", ""


def upstream(job: Job) -> SafeString | str:
    """What a waiting job that suspended nothing waits for: its upstream jobs to be done, the
    job before it in its sequence, or (a container) its children."""
    pending = (
        Job.objects.filter(downstream_edges__job_id=job.pk)
        .exclude(state=Job.State.DONE)
        .order_by("pk")
        .values_list("pk", "state")
    )
    rows = list(pending[: SHOWN + 1])
    if rows:
        more = f" and {pending.count() - SHOWN} more" if len(rows) > SHOWN else ""
        links = format_html_join(
            " ", "{}", ((display.job_link(pk, st),) for pk, st in rows[:SHOWN])
        )
        return format_html("upstream jobs to be done: {}{}", links, more)
    if job.is_container:
        return (
            "its children to be final"
            if job.sealed
            else "its producer to seal it, then its children"
        )
    if job.sequence:
        return format_html("the jobs before it in sequence {} to be final", job.sequence)
    return display.NONE


def held_back(job: Job) -> SafeString | str:
    """What keeps a ready job from starting: a paused queue, a limit that is full or closed;
    or nothing (it starts when a worker of its queue has a free slot)."""
    using = conf.get().database
    reasons: list[SafeString] = []
    if job.queue in pausing.paused_queues(using):
        reasons.append(format_html("its queue {} is paused", job.queue))
    dialect = get_dialect(using)
    specs = occupancy.current(dialect)
    names = list(job.uses or {})
    for name in (limits.group_resource(job.group_key), limits.queue_resource(job.queue)):
        if name in specs:
            names.append(name)
    now = dialect.now()
    closed = dict(
        Limit.objects.using(using).filter(name__in=names).values_list("name", "closed_until")
    )
    for name in names:
        found = limits.find(name, specs)
        if found is None:
            continue
        entry, spec = found
        units = (job.uses or {}).get(name, 1)
        if spec.concurrency:
            used = _in_flight(using, name)
            if used + units > spec.concurrency:
                reasons.append(
                    format_html(
                        "limit {}: {} of {} units in flight (it needs {})",
                        _limit_link(name, entry), used, spec.concurrency, units,
                    )
                )  # fmt: skip
        if spec.rate:
            count, period = spec.rate
            started = window.by_kind(dialect, {name: period}).get(name, {}).get("net", 0)
            if started + units > count:
                reasons.append(
                    format_html(
                        "limit {}: rate {}, {} started in its window",
                        _limit_link(name, entry), spec.describe()["rate"], started,
                    )
                )  # fmt: skip
        until = closed.get(name)
        if until is not None and until > now:
            reasons.append(
                format_html(
                    "limit {} closed until {}", _limit_link(name, entry), display.moment(until)
                )
            )
    if not reasons:
        return "nothing: it starts when a worker of its queue has a free slot"
    return format_html_join(mark_safe("<br>"), "{}", ((r,) for r in reasons))


def _in_flight(using: str, name: str) -> int:
    """The units of resource `name` the jobs in flight hold now."""
    if name.startswith(limits.GROUP):
        return (
            Job.objects.using(using).in_flight().filter(group_key=name[len(limits.GROUP) :]).count()
        )
    if name.startswith(limits.QUEUE):
        return Job.objects.using(using).in_flight().filter(queue=name[len(limits.QUEUE) :]).count()
    held = (
        Job.objects.using(using)
        .in_flight()
        .filter(uses__isnull=False)
        .values_list("uses", flat=True)
    )
    return sum(int((uses or {}).get(name, 0)) for uses in held)


def _limit_link(name: str, entry: str) -> SafeString:
    shown = name if name == entry else f"{name} ({entry})"
    return format_html(
        '<a href="{}">{}</a>', reverse("admin:django_jobqueue_limit_changelist"), shown
    )


def _progress(job: Job) -> SafeString | str:
    return durable.progress(job)


def last_error(job: Job) -> SafeString | str:
    line = display.first_line(job.last_error)
    if not line:
        return display.NONE
    attempt = (job.last_error or {}).get("attempt")
    at = f" (attempt {attempt})" if attempt else ""
    if job.state == Job.State.DONE:
        return format_html('<span class="jq-earlier">earlier attempt{}: {}</span>', at, line)
    return format_html('<span class="jq-card-error">{}</span>{}', line, at)


def worker(job: Job) -> SafeString | str:
    if job.lease_owner:
        row = Worker.objects.filter(pk=job.lease_owner).values_list("pk", "host", "pid").first()
        alive = control.owner_alive(job.lease_owner)
        status = "alive" if alive else display.warn("gone: no heartbeat for a lease TTL")
        if row is None:
            return format_html("{} ({})", job.lease_owner, display.warn("worker gone"))
        url = reverse("admin:django_jobqueue_worker_change", args=[row[0]])
        left = display.age(job.lease_expires)
        lease = (
            f"its lease expires {left}"
            if left.startswith("in ")
            else f"its lease expired {left} ago"
        )
        return format_html(
            '<a href="{}">{}</a> (host {}, pid {}; {}); {}',
            url, row[0], row[1], row[2], status, lease,
        )  # fmt: skip
    starts = job.worker_ids or []
    if starts:
        return format_html("none now; its last run was on {}", starts[-1])
    return display.NONE


def times(job: Job) -> SafeString:
    parts: list[tuple[str, SafeString | str]] = [("created", display.moment(job.created_at))]
    if job.state == Job.State.SCHEDULED and job.run_after:
        parts.append(("runs after", display.moment(job.run_after)))
    if job.started_at:
        parts.append(("started", display.moment(job.started_at)))
    if job.finished_at:
        parts.append(("finished", display.moment(job.finished_at)))
    if job.state == Job.State.RUNNING and job.started_at:
        parts.append(
            ("running for", display.duration((timezone.now() - job.started_at).total_seconds()))
        )
    elif job.finished_at and job.started_at:
        took = max((job.finished_at - job.started_at).total_seconds(), 0.0)
        parts.append(("its last run took", display.duration(took)))
    return format_html_join(mark_safe("<br>"), '<span class="jq-card-time">{}</span> {}', parts)


def retry_note(job: Job) -> str:
    """What Retry does to the attempts of `job`."""
    return (
        f"Attempts are never reset: it keeps its {job.attempts} and may run as many more "
        f"times as the extra attempts (with 1: {job.attempts} of {job.attempts + 1}). The jobs "
        "its failure cancelled run again too."
    )


def context(job: Job | None, offered: list[tuple[str, str]]) -> dict[str, Any]:
    """The card's context: its lines, and a note for each action the page offers."""
    if job is None:
        return {}
    notes = {
        "retry_jobs": retry_note(job),
        "release_leases": (
            "Its worker is gone (no heartbeat for a lease TTL). The job goes back to ready, as "
            "the reclaim of an expired lease puts it: the attempt stays counted and it gets "
            "room for one more. Should its handler still run somewhere, that run can no "
            "longer finish the job (the lease is not its own), but what it did outside the "
            "database may happen again."
        ),
        "seal_containers": "The children enqueued so far are the whole container.",
    }
    running = job.state in Job.LEASED_STATES
    cancel = (
        "It is running: its handler is asked to stop (ctx.cancel_requested); it ends "
        "cancelled, and what it returns is discarded."
        if running
        else "It becomes cancelled now, with the jobs downstream of it."
    )
    notes["cancel_jobs"] = cancel
    return {
        "card_rows": rows(job),
        "card_actions": [
            {
                "action": a,
                "label": label,
                "note": notes.get(a, ""),
                "confirm": a == "cancel_jobs" and running,
            }
            for a, label in offered
        ],
    }
