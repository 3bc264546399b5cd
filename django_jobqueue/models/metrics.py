"""The per-minute figures behind the admin's charts."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from .fields import KeyField


class MinuteCount(models.Model):
    """What one worker did in one minute (its clock): claims, outcomes, and the enqueue-to-start
    latency of its first attempts as counts per bucket of `metrics.LATENCY_BUCKETS`. Written
    by the worker's recorder every few seconds (the minute's totals so far); read by the
    admin's charts; kept two days."""

    minute = models.DateTimeField(_("minute"))
    worker = KeyField(_("worker"), max_length=255)
    started = models.IntegerField(_("started"), default=0)
    finished = models.IntegerField(_("finished"), default=0)
    failed = models.IntegerField(_("failed"), default=0)
    latency = models.JSONField(_("latency buckets"), default=list)

    class Meta:
        verbose_name = _("minute count")
        verbose_name_plural = _("minute counts")
        constraints = [
            models.UniqueConstraint(fields=["minute", "worker"], name="jobqueue_count_minute")
        ]

    def __str__(self) -> str:
        return f"{self.worker} @ {self.minute}"


class MinuteHandlerCount(models.Model):
    """What one worker did with one handler key's jobs in one minute (its clock): attempts
    started (claims), jobs its attempts ended `done` or `dead`, and attempts that failed
    (whether a retry followed or not). Written by the worker's recorder with its
    `MinuteCount` rows; read by the admin overview's per-handler table; kept two days."""

    minute = models.DateTimeField(_("minute"))
    worker = KeyField(_("worker"), max_length=255)
    handler = KeyField(_("handler"), max_length=200)
    started = models.IntegerField(_("started"), default=0)
    done = models.IntegerField(_("done"), default=0)
    failed = models.IntegerField(_("failed"), default=0)
    dead = models.IntegerField(_("dead"), default=0)

    class Meta:
        verbose_name = _("minute handler count")
        verbose_name_plural = _("minute handler counts")
        constraints = [
            models.UniqueConstraint(
                fields=["minute", "worker", "handler"], name="jobqueue_handler_minute"
            )
        ]

    def __str__(self) -> str:
        return f"{self.handler} on {self.worker} @ {self.minute}"


class MinuteSpend(models.Model):
    """The units of one resource that one handler's jobs spent in one minute (database clock):
    started by claims, granted by `ctx.acquire()`, corrected by `ctx.settle()`. Written in the
    transaction of each (an upsert); read by the admin's Limits page; kept two days."""

    minute = models.DateTimeField(_("minute"))
    resource = KeyField(_("resource"), max_length=255)
    handler = KeyField(_("handler"), max_length=200)
    units = models.BigIntegerField(_("units"), default=0)

    class Meta:
        verbose_name = _("minute spend")
        verbose_name_plural = _("minute spends")
        constraints = [
            models.UniqueConstraint(
                fields=["minute", "resource", "handler"], name="jobqueue_spend_minute"
            )
        ]

    def __str__(self) -> str:
        return f"{self.handler} on {self.resource} @ {self.minute}: {self.units}"


class MinuteSample(models.Model):
    """The ready backlog of one queue at one minute, and its oldest ready job's age: sampled
    once a minute by one worker (the first to write the minute's rows); kept two days."""

    minute = models.DateTimeField(_("minute"))
    queue = KeyField(_("queue"), max_length=100)
    ready = models.IntegerField(_("ready"))
    oldest_ready = models.FloatField(_("oldest ready (seconds)"), null=True)

    class Meta:
        verbose_name = _("minute sample")
        verbose_name_plural = _("minute samples")
        constraints = [
            models.UniqueConstraint(fields=["minute", "queue"], name="jobqueue_sample_minute")
        ]

    def __str__(self) -> str:
        return f"{self.queue} @ {self.minute}: {self.ready} ready"
