"""Changelist filters whose choices cost no scan of the jobs table (no SELECT DISTINCT)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _

from .. import conf, registry, validation
from ..dialects import get_dialect
from ..models import Job, Worker
from ..models.functions import DbNow

# The queue's own handlers (the admin's bulk actions) are named so; no filter offers them.
INTERNAL_PREFIX = "jobqueue."
# The queue and group choices also come from this many of the newest jobs: a bounded look.
RECENT = 1000


def parse_id(text: str | None) -> int | None:
    """The job id that `text` spells in ASCII digits, or None (no such job can exist).

    str.isdigit() is true of "²", which int() refuses, and int() reads "٣" as 3: only ASCII
    digits name an id, and only in the range a row can hold (a larger number overflows the
    driver or the column).
    """
    if not text or not (text.isascii() and text.isdigit()):
        return None
    number = int(text)
    return number if 1 <= number <= validation.ID_MAX else None


def searchable(value: str) -> bool:
    """Whether `value` can equal a stored name: no NUL, which PostgreSQL refuses in any text
    parameter and enqueue() in any name."""
    return "\x00" not in value


def _recent(request: HttpRequest, model_admin: Any, field: str) -> set[str]:
    """The values of `field` among the newest RECENT jobs (an index range, then a small sort)."""
    jobs = model_admin.model._default_manager.order_by("-pk")[:RECENT]
    return {value for value in jobs.values_list(field, flat=True) if value}


class _ValueFilter(admin.SimpleListFilter):
    """Filter on the exact value of one column; subclasses say where the choices come from."""

    field = ""

    def values(self, request: HttpRequest, model_admin: Any) -> set[str]:
        raise NotImplementedError

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        values = self.values(request, model_admin)
        if self.value():
            values.add(str(self.value()))
        return [(value, value) for value in sorted(values)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value is None:
            return queryset
        if not searchable(value):
            return queryset.none()
        return queryset.filter(**{self.field: value})


class QueueFilter(_ValueFilter):
    """Queues named in settings, served by live workers, or used by recent jobs."""

    title = _("queue")
    parameter_name = "queue"
    field = "queue"

    def values(self, request: HttpRequest, model_admin: Any) -> set[str]:
        settings = conf.get()
        names = {settings.default_queue, *settings.queue_limits}
        workers = Worker.objects.using(settings.database).live()
        for queues in workers.values_list("queues", flat=True):
            names.update(str(queue) for queue in queues or [])
        return names | _recent(request, model_admin, "queue")


class GroupFilter(_ValueFilter):
    """Groups named in GROUP_LIMITS or used by recent jobs."""

    title = _("group")
    parameter_name = "group"
    field = "group_key"

    def values(self, request: HttpRequest, model_admin: Any) -> set[str]:
        return set(conf.get().group_limits) | _recent(request, model_admin, "group_key")


class TypeFilter(_ValueFilter):
    """The handler keys registered in this process, but the queue's own ("jobqueue.*")."""

    title = _("handler key")
    parameter_name = "type"
    field = "type"

    def values(self, request: HttpRequest, model_admin: Any) -> set[str]:
        registered = registry.keys()
        return {key for key in registered if not key.startswith(INTERNAL_PREFIX)}


class VersionFilter(_ValueFilter):
    """The handler versions registered in this process, or used by recent jobs; "-": none."""

    title = _("handler version")
    parameter_name = "version"
    field = "handler_version"
    NONE = "-"  # not a version (a version starts with a letter, a digit or "_")

    def values(self, request: HttpRequest, model_admin: Any) -> set[str]:
        found = {v for _, versions in registry.served() for v in versions}
        return {self.NONE, *found, *_recent(request, model_admin, "handler_version")} - {""}

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        choices = super().lookups(request, model_admin)
        return [(value, "(none)" if value == self.NONE else label) for value, label in choices]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == self.NONE:
            return queryset.filter(handler_version="")
        return super().queryset(request, queryset)


class HasErrorFilter(admin.SimpleListFilter):
    """Whether a job has failed at least once (has a last error)."""

    title = _("has error")
    parameter_name = "has_error"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [("yes", _("Yes")), ("no", _("No"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() in ("yes", "no"):
            return queryset.filter(last_error__isnull=self.value() == "no")
        return queryset


class StateFilter(admin.SimpleListFilter):
    """The job states, from Job.State, and "failed": dead or cancelled (FAILED_STATES)."""

    title = _("state")
    parameter_name = "state"
    FAILED = "failed"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [*Job.State.choices, (self.FAILED, _("failed (dead or cancelled)"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if not value:
            return queryset
        if value == self.FAILED:
            return queryset.filter(state__in=Job.FAILED_STATES)
        return queryset.filter(state=value) if searchable(value) else queryset.none()


class _RelationFilter(admin.SimpleListFilter):
    """Jobs related to one job (given by id in the URL): shown only while it is set."""

    lookup = ""
    label = ""

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        value, pk = self.value(), parse_id(self.value())
        return [(value, f"{self.label} #{pk}")] if value and pk else []

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() is None:
            return queryset
        pk = parse_id(self.value())
        return queryset.none() if pk is None else queryset.filter(**{self.lookup: pk})


class UpstreamOfFilter(_RelationFilter):
    """The jobs that one job depends on."""

    title = _("upstream of")
    parameter_name = "upstream_of"
    lookup = "downstream_edges__job_id"
    label = "upstream of"


class DownstreamOfFilter(_RelationFilter):
    """The jobs that depend on one job."""

    title = _("downstream of")
    parameter_name = "downstream_of"
    lookup = "upstream_edges__depends_on_id"
    label = "downstream of"


class ContainerFilter(_RelationFilter):
    """The children of one container."""

    title = _("container")
    parameter_name = "container"
    lookup = "parent_id"
    label = "children of"


class WorkerFilter(admin.SimpleListFilter):
    """The jobs one worker holds (by worker id)."""

    title = _("worker")
    parameter_name = "worker"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(self.value(), self.value())] if self.value() else []  # type: ignore[list-item]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if not value:
            return queryset
        return queryset.filter(lease_owner=value) if searchable(value) else queryset.none()


class WorkerStatusFilter(admin.SimpleListFilter):
    """Workers live (not known to be gone) or gone (stopped or found dead, kept an hour)."""

    title = _("status")
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [("live", _("Live")), ("gone", _("Gone"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == "live":
            return queryset.filter(gone_at__isnull=True)
        if self.value() == "gone":
            return queryset.filter(gone_at__isnull=False)
        return queryset


# The windows of the date filters: URL value -> (label, length).
WINDOWS = {
    "1h": (_("Last hour"), dt.timedelta(hours=1)),
    "24h": (_("Last 24 hours"), dt.timedelta(days=1)),
    "7d": (_("Last 7 days"), dt.timedelta(days=7)),
    "30d": (_("Last 30 days"), dt.timedelta(days=30)),
}
OLDER = "older"


class _WindowFilter(admin.SimpleListFilter):
    """Jobs whose time falls within a window ending now (database clock), or before 30 days."""

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [(key, label) for key, (label, _) in WINDOWS.items()] + [
            (OLDER, _("Older than 30 days"))
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value in WINDOWS:
            return self.since(queryset, WINDOWS[value][1], newer=True)
        if value == OLDER:
            return self.since(queryset, WINDOWS["30d"][1], newer=False)
        return queryset

    def since(self, queryset: QuerySet[Any], length: dt.timedelta, newer: bool) -> QuerySet[Any]:
        raise NotImplementedError


class FinishedFilter(_WindowFilter):
    """When the job reached its final state, through the (state, finished_at) index."""

    title = _("finished")
    parameter_name = "finished"

    def since(self, queryset: QuerySet[Any], length: dt.timedelta, newer: bool) -> QuerySet[Any]:
        final = queryset.filter(state__in=Job.TERMINAL_STATES, finished_at__isnull=False)
        bound = DbNow() - length
        return (
            final.filter(finished_at__gte=bound) if newer else final.filter(finished_at__lt=bound)
        )


class CreatedFilter(_WindowFilter):
    """When the job was enqueued. created_at has no index: ids grow with time, so the window
    becomes an id bound, found by a binary search of point reads (about 20 at a million rows)."""

    title = _("created")
    parameter_name = "created"

    def since(self, queryset: QuerySet[Any], length: dt.timedelta, newer: bool) -> QuerySet[Any]:
        jobs = queryset.model._default_manager.using(queryset.db)
        first = first_id_since(jobs, get_dialect(queryset.db).now() - length)
        if first is None:  # nothing that recent
            return queryset.none() if newer else queryset
        return queryset.filter(pk__gte=first) if newer else queryset.filter(pk__lt=first)


def first_id_since(jobs: QuerySet[Any], moment: dt.datetime) -> int | None:
    """The lowest id created at or after `moment`, taking created_at to grow with the id."""
    ids = jobs.order_by("pk").values_list("pk", flat=True)
    low, high = ids.first(), ids.last()
    if low is None or high is None:
        return None

    def created(at_least: int) -> tuple[int, dt.datetime]:
        rows = jobs.filter(pk__gte=at_least).order_by("pk").values_list("pk", "created_at")[:1]
        pk, at = rows[0]
        return int(pk), at

    if created(high)[1] < moment:
        return None
    while low < high:  # invariant: the answer is in [low, high]
        middle = (low + high) // 2
        pk, at = created(middle)
        if at >= moment:
            high = pk
        else:
            low = pk + 1
    return low
