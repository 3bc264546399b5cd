"""The overview page: the queue at a glance, linked from the admin index."""

from __future__ import annotations

import datetime as dt
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import Count, QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import reverse

from .. import pausing, versions
from ..dialects import get_dialect
from ..models import Job, QueueOverview, Worker
from ..models.functions import DbNow
from ..stats import oldest_ready, unhandled
from . import breakdown, charts, display
from .base import JobPagesAdmin

HOUR = dt.timedelta(hours=1)
LIVE_EVERY = 5  # seconds between two refreshes of a live page
COUNT_CAP = 100_000


def stats() -> dict[str, Any]:
    """Counts by state and queue, the oldest ready job's age, recent deaths, worker health.

    Unfinished jobs are counted exactly (grouped by state and queue); finished ones only
    per state and over the last hour and day, through the (state, finished_at) index, so
    the page costs the same with a million finished rows as with none.
    """
    jobs = Job.objects.all()
    now = get_dialect(jobs.db).now()
    queues: dict[str, dict[str, int]] = {}
    for queue, state, count in unfinished(jobs):
        queues.setdefault(queue, {})[state] = count
    live_states = Job.UNFINISHED_STATES
    finished = []
    for state in Job.TERMINAL_STATES:
        recent = jobs.filter(state=state, finished_at__isnull=False)
        finished.append(
            {
                "state": state,
                "hour": capped_count(recent.filter(finished_at__gte=now - HOUR)),
                "day": capped_count(recent.filter(finished_at__gte=now - 24 * HOUR)),
                "url": _list(state=state),
                "hour_url": _list(state=state, finished="1h"),
                "day_url": _list(state=state, finished="24h"),
            }
        )
    oldest = oldest_ready(jobs, now)
    workers = (
        Worker.objects.live()
        .annotate(now=DbNow())
        .values_list("expires_at", "now", "handlers", "handler_versions")
    )
    alive = [(hs, vs) for expires, at, hs, vs in workers if expires and expires > at]
    live_handlers = [hs for hs, _ in alive]
    waiting = unhandled(jobs, live_handlers if live_handlers else None)
    unserved = versions.unserved(jobs, versions.live_versions(alive) if alive else None)
    return {
        "now": now,
        "states": live_states,
        "rows": [
            {
                "queue": queue,
                "counts": [counts.get(s, 0) for s in live_states],
                "url": _list(queue=queue),
            }
            for queue, counts in sorted(queues.items())
        ],
        "totals": [sum(counts.get(s, 0) for counts in queues.values()) for s in live_states],
        "finished": finished,
        "oldest_ready": display.duration(oldest[1]) if oldest else None,
        "oldest_ready_url": reverse("admin:django_jobqueue_job_change", args=[oldest[0]])
        if oldest
        else None,
        "dead_last_hour": finished[1]["hour"],  # TERMINAL_STATES: done, dead, cancelled
        "dead_last_hour_url": finished[1]["hour_url"],
        "paused": pausing.paused_queues(jobs.db),
        "paused_resources": pausing.paused_resources(jobs.db),
        "paused_workflows": [
            {"id": pk, "url": reverse("admin:django_jobqueue_job_change", args=[pk])}
            for pk in pausing.paused_workflows(jobs.db)
        ],
        "expired_leases": jobs.expired().count(),
        "workers_alive": len(live_handlers),
        "workers_stale": len(workers) - len(live_handlers),
        # Types no live worker handles wait in ready/scheduled (rolling deploys): name them.
        "unhandled": [
            {"type": t, "count": n, "url": _list(type=t, state=Job.State.READY)}
            for t, n in waiting.items()
        ],
        "unhandled_total": sum(waiting.values()),
        "unhandled_whom": "no live worker has" if live_handlers else "no code here registers",
        # Started jobs of a version no live worker has wait too (a version dropped too soon).
        "unserved_versions": [
            {
                "type": t,
                "version": v or "(none)",
                "count": n,
                "url": _list(type=t, version=v or "-"),
            }
            for t, by_version in unserved.items()
            for v, n in by_version.items()
        ],
    }


def capped_count(jobs: QuerySet[Job]) -> str:
    """Count `jobs` up to COUNT_CAP: a busy day's finished jobs cost a bounded index range."""
    found = jobs.values("pk")[: COUNT_CAP + 1].count()
    return f"{COUNT_CAP:,}+" if found > COUNT_CAP else f"{found:,}"


def unfinished(jobs: QuerySet[Job]) -> list[tuple[str, str, int]]:
    """(queue, state, count) of the unfinished jobs, each state counted through its index.

    One GROUP BY over the table would read every finished row too; these read the waiting,
    scheduled and ready indexes and the lease index (leased and running jobs), each as large
    as its state.
    """
    rows: list[tuple[str, str, int]] = []
    for state in Job.PENDING_STATES:
        counts = jobs.filter(state=state).values_list("queue").annotate(n=Count("pk"))
        rows.extend((queue, str(state), n) for queue, n in counts.order_by())
    leased = jobs.filter(lease_expires__isnull=False).values_list("queue", "state")
    rows.extend(leased.annotate(n=Count("pk")).order_by())
    return rows


def _list(**lookup: str) -> str:
    return reverse("admin:django_jobqueue_job_changelist") + "?" + urlencode(lookup)


@admin.register(QueueOverview)
class QueueOverviewAdmin(JobPagesAdmin):
    """One page of figures instead of a list (the proxy model puts it on the admin index)."""

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> TemplateResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        figures = stats()
        using = Job.objects.db
        window = charts.pick_window(using, figures["now"], request.GET.get("range"))
        ready = Job.State.READY
        current = {
            "ready": {row["queue"]: row["counts"][figures["states"].index(ready)]
                      for row in figures["rows"]},
            "oldest_ready": figures["oldest_ready"],
        }  # fmt: skip
        since = figures["now"] - window.length
        context = {
            **self.admin_site.each_context(request),
            "title": "Job queue overview",
            "opts": self.model._meta,
            "stats": figures,
            "charts": charts.overview_charts(using, figures["now"], window, current),
            "window": window,
            "windows": charts.WINDOWS.values(),
            "handlers": breakdown.handler_table(using, figures["now"], since),
            "live_every": LIVE_EVERY,
            "links": {
                "jobs": reverse("admin:django_jobqueue_job_changelist"),
                "leases": reverse("admin:django_jobqueue_livelease_changelist"),
                "dead": reverse("admin:django_jobqueue_deadjob_changelist"),
                "workers": reverse("admin:django_jobqueue_worker_changelist"),
                "limits": reverse("admin:django_jobqueue_limit_changelist")
                if request.user.has_perm("django_jobqueue.view_limit")
                else None,
            },
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/django_jobqueue/overview.html", context)


def overview_first(site: admin.AdminSite) -> None:
    """Make the Overview lead the Job queue section of `site`'s index and navigation (the
    admin sorts a section's pages by name; the rest keep that order)."""
    listed = site.get_app_list

    def get_app_list(request: HttpRequest, app_label: str | None = None) -> list[Any]:
        apps = listed(request, app_label)
        for app in apps:
            if app.get("app_label") == QueueOverview._meta.app_label:
                app["models"].sort(key=lambda m: m.get("object_name") != QueueOverview.__name__)
        return apps

    site.get_app_list = get_app_list  # type: ignore[method-assign]


overview_first(admin.site)
