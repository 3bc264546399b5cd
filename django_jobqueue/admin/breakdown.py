"""The overview's per-handler table: what each handler's jobs did in the charts' window.

The counts come from the workers' per-minute figures (`MinuteHandlerCount`, written by each
worker's recorder as the charts' `MinuteCount`), from the window's first minute: a day of
them is a few thousand rows, however many jobs finished. Cancelled jobs (no worker's
outcome) are counted from the jobs table through the (state, finished_at) index. Where the
window began before any worker recorded a figure of it (jobs run by `testing.run_jobs()`
only, or before the workers recorded these figures), that part is counted from the jobs as
before: the jobs that finished in it (the (state, finished_at) index), those in flight (the
lease index) and those waiting for a retry (the scheduled index). Run times and waits are
measured on the newest SAMPLE jobs of each final state in the window; the units spent come
from MinuteSpend. Never a scan of the jobs table.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

from django.db.models import Count, Min, Q, QuerySet, Sum
from django.urls import reverse

from .. import metrics
from ..models import Job, MinuteHandlerCount, MinuteSpend
from . import display

SAMPLE = 2000  # finished jobs per state whose times are read


def handler_table(using: str, now: dt.datetime, since: dt.datetime) -> list[dict[str, Any]]:
    """One row per handler key with work in [since, now], busiest first."""
    jobs = Job.objects.using(using)
    rows: dict[str, dict[str, Any]] = {}

    def row(key: str) -> dict[str, Any]:
        return rows.setdefault(
            key,
            {"type": key, "started": 0, "done": 0, "failed": 0, "dead": 0, "cancelled": 0,
             "runs": [], "waits": [], "units": {}},
        )  # fmt: skip

    # The workers' figures from the window's first minute (as the charts read them), and the
    # first minute that has any: the jobs table counts only what came before it.
    recorded = MinuteHandlerCount.objects.using(using).filter(minute__gte=metrics.minute_of(since))
    first: dt.datetime | None = None
    for key, *figures, earliest in (
        recorded.order_by()
        .values_list("handler")
        .annotate(Sum("started"), Sum("done"), Sum("failed"), Sum("dead"), Min("minute"))
    ):
        entry = row(key)
        for name, value in zip(metrics.HANDLER_COUNTS, figures, strict=True):
            entry[name] += value or 0
        first = earliest if first is None else min(first, earliest)
    if first is not None:
        cancelled = jobs.filter(state=Job.State.CANCELLED, finished_at__gte=first)
        for key, n in cancelled.order_by().values_list("type").annotate(n=Count("pk")):
            row(key)["cancelled"] += n
    if first is None or first > since:
        _count_jobs(jobs, since, first, row)
    finished = jobs.filter(state__in=Job.TERMINAL_STATES, finished_at__gte=since)
    for state in Job.TERMINAL_STATES:
        newest = finished.filter(state=state).order_by("-finished_at")[:SAMPLE]
        for key, started, first_start, created, after, ended in newest.values_list(
            "type", "started_at", "first_started_at", "created_at", "run_after", "finished_at"
        ):
            entry = row(key)
            if started is not None and ended is not None:
                entry["runs"].append((ended - started).total_seconds())
            if first_start is not None and first_start >= since:
                entry["waits"].append(_wait(created, after, first_start))
    spent = MinuteSpend.objects.using(using).filter(minute__gte=since)
    for key, resource, units in (
        spent.order_by().values_list("handler", "resource").annotate(u=Sum("units"))
    ):
        row(key)["units"][resource] = int(units or 0)
    out = []
    for entry in rows.values():
        runs, waits = sorted(entry.pop("runs")), sorted(entry.pop("waits"))
        entry["p50_run"] = _duration(_quantile(runs, 0.5))
        entry["p95_run"] = _duration(_quantile(runs, 0.95))
        entry["p95_wait"] = _duration(_quantile(waits, 0.95))
        entry["units"] = sorted(entry["units"].items())
        entry["url"] = (
            reverse("admin:django_jobqueue_job_changelist")
            + "?"
            + urlencode({"type": entry["type"]})
        )
        out.append(entry)
    return sorted(out, key=lambda e: (-(e["done"] + e["dead"] + e["started"]), e["type"]))


def _count_jobs(
    jobs: QuerySet[Job],
    since: dt.datetime,
    until: dt.datetime | None,
    row: Callable[[str], dict[str, Any]],
) -> None:
    """Count [since, until) (None: up to now) from the jobs: those that finished in it, those
    in flight that started in it, and those waiting for a retry after an error in it."""
    bound = {} if until is None else {"finished_at__lt": until}
    finished = jobs.filter(state__in=Job.TERMINAL_STATES, finished_at__gte=since, **bound)
    counts: Any = finished.order_by().values_list("type", "state")
    counts = counts.annotate(
        n=Count("pk"), a=Sum("attempts"), s=Count("pk", filter=Q(started_at__gte=since))
    )
    for key, state, n, attempts, started_here in counts:
        entry = row(key)
        entry[state] += n
        entry["started"] += started_here
        # Every attempt of a dead job failed; a done job's attempts before its last did.
        if state == Job.State.DEAD:
            entry["failed"] += attempts or 0
        elif state == Job.State.DONE:
            entry["failed"] += max(0, (attempts or 0) - n)
    bound = {} if until is None else {"started_at__lt": until}
    in_flight = jobs.filter(lease_expires__isnull=False, started_at__gte=since, **bound)
    for key, n in in_flight.order_by().values_list("type").annotate(n=Count("pk")):
        row(key)["started"] += n
    # Attempts that failed and wait for their retry (the reclaimer's too).
    bound = {} if until is None else {"updated_at__lt": until}
    retrying = jobs.filter(
        state=Job.State.SCHEDULED, updated_at__gte=since, attempts__gt=0, **bound
    )
    retrying = retrying.filter(last_error__isnull=False)
    for key, n in retrying.order_by().values_list("type").annotate(n=Count("pk")):
        row(key)["failed"] += n


def _wait(created: dt.datetime, run_after: dt.datetime | None, first: dt.datetime) -> float:
    """How long a job waited before its first start: from its enqueue, or from its run_after
    when it was due later (a job scheduled ahead did not wait for the queue before then)."""
    since = run_after if run_after is not None and created < run_after <= first else created
    return max(0.0, (first - since).total_seconds())


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return values[min(len(values) - 1, max(0, round(q * len(values)) - 1))]


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return display.duration(seconds) if seconds >= 1 else f"{seconds * 1000:.0f} ms"
