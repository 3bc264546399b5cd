"""The workers page: who is alive, what each holds, how fresh its heartbeat is, and who is gone.

A worker that stopped or was found dead stays listed for an hour (reclaimer.GONE_KEPT), under
the live ones: when it went, how many of its jobs were taken back, what it did while it ran.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib import admin
from django.db.models import F, IntegerField, OuterRef, QuerySet, Subquery, Sum
from django.db.models.functions import Coalesce
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from ..models import MinuteCount, Worker
from ..models.functions import DbNow
from . import display, filters
from .base import OwnFiltersAdmin

SHOWN = 5
LIVE_EVERY = 5  # seconds between two refreshes of the list


def _tally(field: str) -> Coalesce:
    """A worker's `field` summed over its per-minute figures (kept two days)."""
    rows = MinuteCount.objects.filter(worker=OuterRef("pk")).order_by().values("worker")
    summed = rows.annotate(n=Sum(field)).values("n")[:1]
    return Coalesce(Subquery(summed, output_field=IntegerField()), 0)


@admin.register(Worker)
class WorkerAdmin(OwnFiltersAdmin):
    """Worker rows, read-only: each row is kept by its own process's heartbeat."""

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        context = {"title": "Workers", "live_every": LIVE_EVERY, **(extra_context or {})}
        return super().changelist_view(request, context)

    list_display = [
        "id",
        "host",
        "pid",
        "queue_list",
        "concurrency",
        "started",
        "jobs_done",
        "in_flight",
        "heartbeat_age",
        "status",
    ]
    # The live first, then the gone, the latest gone first.
    ordering = [F("gone_at").desc(nulls_first=True), "host", "pid"]
    list_filter = [filters.WorkerStatusFilter]
    readonly_fields = ["queue_list", "in_flight_all", "heartbeat_age", "status", "jobs_done"]
    fields = [
        "id",
        "host",
        "pid",
        "queue_list",
        "concurrency",
        "started_at",
        "jobs_done",
        "heartbeat_at",
        "heartbeat_age",
        "expires_at",
        "lease_ttl",
        "status",
        "gone_at",
        "jobs_reclaimed",
        "in_flight_all",
    ]

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_queryset(self, request: HttpRequest) -> QuerySet[Worker]:
        queryset: QuerySet[Worker] = super().get_queryset(request)
        return queryset.annotate(now=DbNow(), done=_tally("finished"), failed=_tally("failed"))

    @admin.display(description="queues")
    def queue_list(self, worker: Worker) -> str:
        return ", ".join(str(queue) for queue in worker.queues or []) or "all"

    @admin.display(description="jobs in flight")
    def in_flight(self, worker: Worker) -> SafeString:
        return self._jobs(worker, SHOWN)

    @admin.display(description="jobs in flight")
    def in_flight_all(self, worker: Worker) -> SafeString:
        return self._jobs(worker, 100)

    def _jobs(self, worker: Worker, shown: int) -> SafeString:
        ids = [int(pk) for pk in worker.job_ids or []]
        if not ids:
            return mark_safe("0")
        links = format_html_join(" ", "{}", ((display.job_link(pk),) for pk in ids[:shown]))
        url = reverse("admin:django_jobqueue_livelease_changelist")
        url += "?" + urlencode({"worker": worker.pk})
        return format_html('{}: {} <a href="{}">(leases)</a>', len(ids), links, url)

    @admin.display(description="started")
    def started(self, worker: Any) -> SafeString:
        end = worker.gone_at or getattr(worker, "now", None)
        up = display.age(worker.started_at, end)
        return format_html(
            '{}<span class="jq-sub">{} {}</span>',
            display.moment(worker.started_at),
            "ran" if worker.gone_at else "up",
            up,
        )

    @admin.display(description="jobs done / failed")
    def jobs_done(self, worker: Any) -> SafeString:
        failed = getattr(worker, "failed", 0)
        shown = display.warn(f"{failed:,} failed") if failed else f"{failed:,} failed"
        return format_html("{} done, {}", f"{getattr(worker, 'done', 0):,}", shown)

    @admin.display(description="heartbeat age")
    def heartbeat_age(self, worker: Any) -> str:
        return display.age(worker.heartbeat_at, getattr(worker, "now", None))

    @admin.display(description="status")
    def status(self, worker: Any) -> SafeString:
        if worker.gone_at is not None:
            n = worker.jobs_reclaimed
            reclaimed = f"{n} job{'' if n == 1 else 's'} reclaimed"
            return format_html(
                "gone at {}, {}",
                display.moment(worker.gone_at),
                display.warn(reclaimed) if n else reclaimed,
            )
        now = getattr(worker, "now", None)
        if worker.expires_at is not None and now is not None and worker.expires_at > now:
            return format_html("{}", "alive")
        return display.warn("STALE: no heartbeat for a whole lease TTL")
