"""The overview's per-handler table: what each handler's jobs did in the charts' window.

Read from the jobs that finished in the window (the (state, finished_at) index), those in
flight now (the lease index), those waiting for a retry (the scheduled index) and the units
spent (MinuteSpend): never a scan of the jobs table. Run times and waits are measured on the
newest SAMPLE jobs of each final state in the window.
"""

from __future__ import annotations

import datetime as dt
from typing import Any
from urllib.parse import urlencode

from django.db.models import Count, Q, Sum
from django.urls import reverse

from ..models import Job, MinuteSpend
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

    finished = jobs.filter(state__in=Job.TERMINAL_STATES, finished_at__gte=since)
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
    for state in Job.TERMINAL_STATES:
        newest = finished.filter(state=state).order_by("-finished_at")[:SAMPLE]
        for key, started, first, created, after, ended in newest.values_list(
            "type", "started_at", "first_started_at", "created_at", "run_after", "finished_at"
        ):
            entry = row(key)
            if started is not None and ended is not None:
                entry["runs"].append((ended - started).total_seconds())
            if first is not None and first >= since:
                entry["waits"].append(_wait(created, after, first))
    in_flight = jobs.filter(lease_expires__isnull=False, started_at__gte=since)
    for key, n in in_flight.order_by().values_list("type").annotate(n=Count("pk")):
        row(key)["started"] += n
    # Attempts that failed and wait for their retry (the reclaimer's too).
    retrying = jobs.filter(state=Job.State.SCHEDULED, updated_at__gte=since, attempts__gt=0)
    retrying = retrying.filter(last_error__isnull=False)
    for key, n in retrying.order_by().values_list("type").annotate(n=Count("pk")):
        row(key)["failed"] += n
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
