"""The workers' rows: Worker, each live worker's heartbeat and figures."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from .fields import KeyField
from .functions import DbNow


class WorkerQuerySet(models.QuerySet["Worker"]):
    """Querysets whose methods name a worker's states."""

    def live(self) -> WorkerQuerySet:
        """Rows of workers not known to be gone (their heartbeat may still have lapsed)."""
        return self.filter(gone_at__isnull=True)

    def alive(self) -> WorkerQuerySet:
        """Rows of workers not gone whose heartbeat is current (database clock)."""
        return self.live().filter(expires_at__gt=DbNow())

    def gone(self) -> WorkerQuerySet:
        """Rows kept for the Workers page of workers that stopped or were found dead."""
        return self.filter(gone_at__isnull=False)


class Worker(models.Model):
    """A worker process, kept fresh by its heartbeat; kept a while as gone once it ends.

    The row is the worker's liveness: its heartbeat pushes `expires_at` forward and lists the
    jobs it holds in `job_ids`. A lease is reclaimed only from a worker whose row has expired
    (or that no longer lists the job), never because a job row could not be renewed. A worker
    that stops, or is found dead, gets `gone_at` (and an expired, empty row): every reader of
    liveness ignores such rows, which only the Workers page shows until they are swept.
    """

    id = KeyField(_("worker id"), max_length=255, primary_key=True)
    host = models.CharField(_("host"), max_length=255)
    pid = models.IntegerField(_("pid"))
    # Who its process is on its host (worker/processes.py): a worker of the same host proves
    # it gone by it. "" where it cannot be told, and in the rows of older releases (which
    # register rows without it: db_default, for rolling deploys).
    process_key = models.CharField(
        _("process"), max_length=255, blank=True, default="", db_default=""
    )
    queues = models.JSONField(_("queues"), default=list)
    concurrency = models.IntegerField(_("concurrency"))
    started_at = models.DateTimeField(_("started"))
    heartbeat_at = models.DateTimeField(_("last heartbeat"))
    lease_ttl = models.FloatField(_("lease TTL (seconds)"), default=30.0)
    expires_at = models.DateTimeField(_("expires"), null=True, blank=True)  # heartbeat + TTL
    job_ids = models.JSONField(_("jobs held"), default=list, blank=True)
    handlers = models.JSONField(_("handlers"), default=list, blank=True)  # the types it claims
    # The versions of each handler it has, for the keys with other than "" (versions.py);
    # NULL in the rows of the workers of a release before versions (they have "" only).
    handler_versions = models.JSONField(_("handler versions"), null=True, default=dict, blank=True)
    # When it stopped or was found dead (NULL while live), and how many of its jobs were taken
    # back by a reclaimer (a clean stop leaves none).
    gone_at = models.DateTimeField(_("gone at"), null=True, blank=True)
    # db_default: the workers of the release before register rows without it (rolling deploys).
    jobs_reclaimed = models.IntegerField(_("jobs reclaimed"), default=0, db_default=0)
    # Whether it records OpenTelemetry metrics: the queue gauges are read by one of these
    # (worker/gauges.py). db_default: a worker of the release before registers without it.
    metrics = models.BooleanField(_("records metrics"), default=False, db_default=False)

    objects = WorkerQuerySet.as_manager()

    class Meta:
        verbose_name = _("worker")
        verbose_name_plural = _("workers")

    def __str__(self) -> str:
        return str(self.id)
