"""The live-leases and dead-jobs pages: jobs lists narrowed to what an operator acts on."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.helpers import ActionForm
from django.db.models import OuterRef, QuerySet, Subquery
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from .. import conf
from ..models import DeadJob, Job, LiveLease, Worker
from ..models.functions import DbNow
from . import display, filters
from .actions import cancel_jobs, delete_finished_jobs, release_leases, retry_jobs
from .base import JobPagesAdmin


class _JobListAdmin(JobPagesAdmin):
    """A proxy's list of jobs; its rows open the job's own page."""

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: Any = None
    ) -> HttpResponse:
        return redirect(reverse("admin:django_jobqueue_job_change", args=[object_id]))


def _worker(field: str) -> Subquery:
    return Subquery(Worker.objects.filter(pk=OuterRef("lease_owner")).values(field)[:1])


@admin.register(LiveLease)
class LiveLeaseAdmin(_JobListAdmin):
    """Every leased or running job, soonest lease expiry first; trouble in red."""

    list_display = [
        "job",
        "type",
        "state_badge",
        "queue",
        "worker",
        "running_for",
        "progress_bar",
        "expires",
        "heartbeat",
    ]
    list_filter = [filters.QueueFilter, filters.TypeFilter, filters.WorkerFilter]
    ordering = ["lease_expires", "id"]
    actions = [cancel_jobs, release_leases]
    action_form = ActionForm  # type: ignore[assignment]  # no retry here: no attempts box

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        return super().changelist_view(request, {"live_every": 5, **(extra_context or {})})

    def get_queryset(self, request: HttpRequest) -> QuerySet[Job]:
        # lease_expires is set exactly while a job is leased or running (a check constraint
        # says so), and its partial index serves this list and its order.
        queryset = super().get_queryset(request).filter(lease_expires__isnull=False)
        return self.list_queryset(queryset).annotate(
            worker_host=_worker("host"),
            worker_pid=_worker("pid"),
            worker_expires=_worker("expires_at"),
            now=DbNow(),
        )

    @admin.display(description="worker")
    def worker(self, job: Any) -> SafeString:
        if job.worker_host is None:
            return format_html("{} {}", job.lease_owner, display.warn("(gone)"))
        url = reverse("admin:django_jobqueue_worker_change", args=[job.lease_owner])
        stale = job.worker_expires is None or job.worker_expires < job.now
        mark = format_html(" {}", display.warn("(stale)")) if stale else ""
        return format_html(
            '<a href="{}">{} pid {}</a>{}', url, job.worker_host, job.worker_pid, mark
        )

    @admin.display(description="lease expires")
    def expires(self, job: Any) -> SafeString:
        left = display.age(job.lease_expires, job.now)
        if job.lease_expires > job.now:
            return format_html("{}", left)
        return display.warn(f"EXPIRED {left} ago")

    @admin.display(description="heartbeat age")
    def heartbeat(self, job: Any) -> SafeString:
        if job.heartbeat_at is None:
            return format_html("{}", "-")
        seconds = (job.now - job.heartbeat_at).total_seconds()
        text = display.duration(max(seconds, 0.0))
        if seconds > 2 * conf.get().heartbeat_interval:
            return display.warn(f"{text} (late)")
        return format_html("{}", text)


class DeadStateFilter(filters.StateFilter):
    """Dead or cancelled."""

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [(s, s) for s in Job.FAILED_STATES]


@admin.register(DeadJob)
class DeadJobAdmin(_JobListAdmin):
    """Jobs that ended `dead` or `cancelled`, latest first, with why."""

    list_display = ["job", "type", "state_badge", "queue", "attempts_of", "finished", "why"]
    list_filter = [
        DeadStateFilter,
        filters.QueueFilter,
        filters.TypeFilter,
        filters.FinishedFilter,
        filters.CreatedFilter,
    ]
    ordering = ["-finished_at", "-id"]
    actions = [retry_jobs, delete_finished_jobs]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Job]:
        queryset = (
            super()
            .get_queryset(request)
            .filter(state__in=Job.FAILED_STATES, finished_at__isnull=False)
        )
        return self.list_queryset(queryset)

    @admin.display(description="why")
    def why(self, job: Any) -> SafeString | str:
        if job.cancelled_by_id is not None:
            return format_html(
                "cancelled because job {} ended badly", display.job_link(job.cancelled_by_id)
            )
        if job.state == Job.State.CANCELLED:
            return "cancelled by an operator or by code"
        return self.last_error_line(job)
