"""The state of the limits engine: live limit rows, live settings, and the starts of rated
resources."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from .fields import KeyField


class Limit(models.Model):
    """One resource of the limits engine ("openai", "tenant:42", and the derived "group:<name>"
    and "queue:<name>"): the row claims of jobs that use it lock, made on first use, and when
    it reopens after a `RateLimited`."""

    name = KeyField(_("resource"), max_length=255, primary_key=True)
    closed_until = models.DateTimeField(_("closed until"), null=True, blank=True)
    created_at = models.DateTimeField(_("first used"), auto_now_add=True)

    class Meta:
        verbose_name = _("limit")
        verbose_name_plural = _("limits")

    def __str__(self) -> str:
        return str(self.name)


class LimitSetting(models.Model):
    """A limit changed while workers run (`jobqueue_limits set`): it replaces the settings'
    entry of the same name (a resource, or a pattern ending in "*") until it is reset."""

    name = KeyField(_("limit"), max_length=255, primary_key=True)
    concurrency = models.IntegerField(_("concurrency"), null=True, blank=True)
    rate = models.CharField(_("rate"), max_length=40, blank=True, default="")
    updated_at = models.DateTimeField(_("changed"), auto_now=True)

    class Meta:
        verbose_name = _("limit setting")
        verbose_name_plural = _("limit settings")

    def __str__(self) -> str:
        return str(self.name)


class ResourceStart(models.Model):
    """`units` of a rate-limited resource started by one claim at `started_at` (database clock);
    rows older than the resource's window are deleted by later claims. The one window of every
    rate (limits/window.py): LIMITS' and RATE_LIMITS' ("group:<name>")."""

    class Kind(models.TextChoices):
        # At a claim's time, counted in windows MARGIN longer than the period (the handler
        # starts a little after its claim counted it):
        START = "start", _("started by a claim")  # the units of a job's `uses`
        BACK = "back", _("given back")  # a job handed back unstarted: its units, negative
        USETTLE = "usettle", _("uses settled")  # ctx.settle(resource): used minus counted
        # At a running job's time, counted in windows of the period:
        GRANT = "grant", _("granted")  # ctx.acquire()
        SETTLE = "settle", _("settled")  # ctx.settle(grant): used minus granted

    resource = KeyField(_("resource"), max_length=255)
    started_at = models.DateTimeField(_("started"))
    units = models.IntegerField(_("units"))
    kind = models.CharField(_("kind"), max_length=8, choices=Kind.choices, default=Kind.START)
    # A settlement's units used (its `units` are what it changed: used minus granted).
    used = models.IntegerField(_("used"), null=True, blank=True)

    class Meta:
        verbose_name = _("resource start")
        verbose_name_plural = _("resource starts")
        indexes = [
            models.Index(fields=["resource", "started_at"], name="jobqueue_resource_started")
        ]

    def __str__(self) -> str:
        return f"{self.resource} x{self.units} @ {self.started_at}"
