"""What the queue looks like now, and whether it is healthy: for jobqueue_stats and probes.

Times are measured by the database clock, as the workers measure them. The queries are
GROUP BY counts and aggregates over indexed columns: the ready and scheduled rows (partial
indexes), the leases (lease_expires index), recent finishes ((state, finished_at) index);
only the count by state reads every row (an index on MySQL, the table elsewhere).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import defaultdict
from typing import Any

from django.db.models import Count, Min, Q, QuerySet
from django.db.models.functions import TruncMinute

from . import containers, registry, versions
from .dialects import Dialect
from .dialects.base import seconds
from .engine import sequences
from .models import Job, JobSequence, Limit, Worker

DEFAULT_MINUTES = 5  # throughput window
DEFAULT_MAX_AGE = 600.0  # seconds the oldest ready job may wait before --check fails
DEFAULT_MAX_EXPIRED = 0  # leases left expired past a lease TTL before --check fails
DEFAULT_MAX_OPEN_IDLE = 600.0  # seconds an open container may be idle before --check fails
SHOWN_IDS = 10  # ids of idle open containers listed
SHOWN_RUNNING = 50  # running jobs listed with their progress


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """When the queue counts as unhealthy."""

    max_age: float = DEFAULT_MAX_AGE
    max_expired: int = DEFAULT_MAX_EXPIRED
    max_open_idle: float = DEFAULT_MAX_OPEN_IDLE


def collect(
    dialect: Dialect,
    *,
    lease_ttl: float,
    minutes: int = DEFAULT_MINUTES,
    thresholds: Thresholds | None = None,
) -> dict[str, Any]:
    """Return the queue's figures as one JSON-ready dict, with the health problems found.

    It is what ``manage.py jobqueue_stats --json`` prints; its keys are described in the
    stats command's reference. The key ``problems`` lists what ``--check`` fails on.

    Args:
        dialect: The queue database's dialect:
            ``django_jobqueue.dialects.get_dialect(django_jobqueue.conf.get().database)``.
        lease_ttl: Leases expired for longer than this many seconds count as not reclaimed
            (the command passes ``JOBQUEUE["LEASE_TTL"]``).
        minutes: The throughput window, in minutes.
        thresholds: When the queue counts as unhealthy; the defaults of ``--max-age``
            (600 s) and ``--max-expired`` (0) when ``None``.
    """
    using = dialect.using
    jobs = Job.objects.using(using)
    now = dialect.now()

    states = dict.fromkeys(Job.State.values, 0)
    for state, count in jobs.order_by().values_list("state").annotate(n=Count("pk")):
        states[state] = count

    unfinished = jobs.filter(state__in=Job.UNFINISHED_STATES).order_by()
    queues: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(Job.UNFINISHED_STATES, 0))
    for queue, state, count in unfinished.values_list("queue", "state").annotate(n=Count("pk")):
        queues[queue][state] = count
    groups: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(Job.UNFINISHED_STATES, 0))
    for group, state, count in unfinished.values_list("group_key", "state").annotate(n=Count("pk")):
        groups[group][state] = count

    oldest = oldest_ready(jobs, now)

    leased = jobs.filter(lease_expires__isnull=False)
    # Running jobs that report progress (ctx.progress), newest first: through the leases'
    # index, never a scan of the table.
    running = [
        {"id": pk, "type": type, "queue": queue, "worker": owner, "progress": progress}
        for pk, type, queue, owner, progress in leased.filter(
            state=Job.State.RUNNING, progress__isnull=False
        )
        .order_by("-pk")
        .values_list("pk", "type", "queue", "lease_owner", "progress")[:SHOWN_RUNNING]
    ]
    leases = leased.aggregate(
        in_flight=Count("pk"),
        expired=Count("pk", filter=Q(lease_expires__lt=now)),
        expired_stale=Count("pk", filter=Q(lease_expires__lt=now - seconds(lease_ttl))),
    )

    limits = thresholds or Thresholds()
    opened = containers.open_containers(jobs).aggregate(n=Count("pk"), oldest=Min("created_at"))
    idle_ids: list[int] = []
    if opened["n"]:  # open containers are few: the idle ones need no count of their own
        idle = containers.stale(jobs, limits.max_open_idle).order_by("pk")
        idle_ids = list(idle.values_list("pk", flat=True)[:SHOWN_IDS])
    open_containers = {
        "open": opened["n"],
        "oldest_age": (
            max(0.0, (now - opened["oldest"]).total_seconds()) if opened["oldest"] else None
        ),
        "idle": idle.count() if len(idle_ids) == SHOWN_IDS else len(idle_ids),
        "idle_ids": idle_ids,
    }

    blocked = list(sequences.blocked(using)[: SHOWN_IDS + 1])
    sequence_figures = {
        "active": JobSequence.objects.using(using).filter(head__isnull=False).count(),
        "blocked": len(blocked) if len(blocked) <= SHOWN_IDS else sequences.blocked(using).count(),
        "blocked_heads": dict(blocked[:SHOWN_IDS]),
    }

    workers = list(
        Worker.objects.using(using)
        .live()
        .values_list("queues", "expires_at", "handlers", "handler_versions")
    )
    gone = Worker.objects.using(using).gone().count()
    alive = [(qs, hs, vs) for qs, expires, hs, vs in workers if expires and expires > now]
    live = [qs for qs, _, _ in alive]
    live_handlers = [hs for _, hs, _ in alive]
    serves_all = any(not qs for qs in live)
    served = {q for qs in live for q in qs}
    ready_by_queue = {q: counts[Job.State.READY] for q, counts in queues.items()}
    unserved = {
        q: n for q, n in sorted(ready_by_queue.items()) if n and not serves_all and q not in served
    }
    unknown = unhandled(jobs, live_handlers if live else None)
    have = versions.live_versions((hs, vs) for _, hs, vs in alive) if live else None
    unserved_versions = versions.unserved(jobs, have)

    start = now - dt.timedelta(minutes=minutes)
    per_minute: dict[str, dict[str, int]] = {}
    recent = (
        jobs.filter(state__in=Job.TERMINAL_STATES, finished_at__gte=start)
        .annotate(minute=TruncMinute("finished_at", tzinfo=dt.UTC))
        .order_by()
        .values_list("minute", "state")
        .annotate(n=Count("pk"))
    )
    for minute, state, count in recent:
        key = minute.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%MZ")
        per_minute.setdefault(key, dict.fromkeys(Job.TERMINAL_STATES, 0))[state] = count
    finished = sum(sum(row.values()) for row in per_minute.values())

    stats: dict[str, Any] = {
        "time": now.astimezone(dt.UTC).isoformat(),
        "states": states,
        "queues": {q: queues[q] for q in sorted(queues)},
        "groups": {g: groups[g] for g in sorted(groups)},
        "oldest_ready_age": oldest[1] if oldest is not None else None,
        "leases": leases,
        "running": running,
        # Resources of LIMITS that a RateLimited closed, until when (database clock).
        "closed_resources": {
            name: until.astimezone(dt.UTC).isoformat()
            for name, until in Limit.objects.using(using)
            .filter(closed_until__gt=now)
            .order_by("name")
            .values_list("name", "closed_until")
            if until is not None
        },
        # live: beating; stale: not beating, not yet judged; gone: stopped or found dead (kept
        # an hour for the admin's Workers page).
        "workers": {"live": len(live), "stale": len(workers) - len(live), "gone": gone},
        "unserved_queues": unserved,
        "open_containers": open_containers,
        # Sequences with a job released; the blocked ones, by key with the id of their head.
        "sequences": sequence_figures,
        "unknown_handlers": unknown,
        # {type: {version: n}}: started jobs of known types whose version no live worker has.
        "unserved_versions": unserved_versions,
        "throughput": {
            "minutes": minutes,
            "finished_per_minute": round(finished / minutes, 2),
            "per_minute": dict(sorted(per_minute.items())),
        },
    }
    stats["problems"] = problems(stats, limits)
    return stats


def oldest_ready(jobs: QuerySet[Job], now: dt.datetime) -> tuple[int, float] | None:
    """Return (id, seconds waited by the clock `now`) of the longest-waiting ready job, or None.

    `now` is the database clock (`Dialect.now()`), by which the workers measure time too.
    """
    # A ready row is written when it becomes ready (inserted, promoted, released, retried)
    # and not again until claimed: its updated_at is when it began to wait.
    row = (
        jobs.filter(state=Job.State.READY)
        .order_by("updated_at", "pk")
        .values_list("pk", "updated_at")
        .first()
    )
    if row is None:
        return None
    return row[0], max(0.0, (now - row[1]).total_seconds())


def unhandled(jobs: QuerySet[Job], live_handlers: list[list[str]] | None) -> dict[str, int]:
    """Count the ready and scheduled jobs, by type, that no live worker has a handler for.

    They wait (a worker claims only the types it has handlers for, so that a rolling deploy
    never kills a job the newer release defines); `live_handlers` holds each live worker's
    list. With no worker live (None), this process's registry says which types no code here
    knows.
    """
    if live_handlers is None:
        known = set(registry.keys())
    else:
        known = {h for hs in live_handlers for h in hs or []}
    # One count per state, each through the state's index (a million rows, 15,000 runnable:
    # 12 ms), and the known types left out here: one `state IN (...) AND type NOT IN (...)`
    # made PostgreSQL scan the whole table (110 ms).
    counts: dict[str, int] = {}
    for state in Job.RUNNABLE_STATES:
        per_type = jobs.filter(state=state).order_by().values_list("type").annotate(n=Count("pk"))
        for kind, n in per_type:
            if kind not in known:
                counts[kind] = counts.get(kind, 0) + n
    return dict(sorted(counts.items()))


def problems(stats: dict[str, Any], thresholds: Thresholds) -> list[str]:
    """What makes the queue unhealthy, one sentence each (empty: healthy)."""
    found = [
        f"queue {queue!r} has {n} ready job(s) and no live worker serves it"
        for queue, n in stats["unserved_queues"].items()
    ]
    age = stats["oldest_ready_age"]
    if age is not None and age > thresholds.max_age:
        found.append(
            f"the oldest ready job has waited {age:.0f}s (more than {thresholds.max_age:g}s)"
        )
    stale = stats["leases"]["expired_stale"]
    if stale > thresholds.max_expired:
        found.append(
            f"{stale} lease(s) expired over a lease TTL ago and were not reclaimed "
            f"(more than {thresholds.max_expired})"
        )
    idle = stats["open_containers"]["idle"]
    if idle:
        ids = ", ".join(str(pk) for pk in stats["open_containers"]["idle_ids"])
        found.append(
            f"{idle} open container(s) not sealed and idle for more than "
            f"{thresholds.max_open_idle:g}s (a producer may have died inside container()): {ids}"
        )
    blocked = stats["sequences"]["blocked"]
    if blocked:
        heads = ", ".join(
            f"{key} (job {pk})" for key, pk in stats["sequences"]["blocked_heads"].items()
        )
        found.append(
            f"{blocked} sequence(s) blocked by a dead job at their head (retry or cancel it): "
            f"{heads}"
        )
    return found
