"""Schedules: each one's state (its last slot) and the schedules stored as rows."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from .fields import KeyField


class ScheduleState(models.Model):
    """Where one schedule of JOBQUEUE["SCHEDULES"] stands: the last slot a worker dealt with.

    A worker takes a slot by moving `last_slot` forward with an UPDATE conditioned on the value
    it read, in the transaction that enqueues the slot's job: of workers racing for one slot,
    exactly one changes the row, so each slot is enqueued once however many workers run.
    """

    name = KeyField(_("schedule"), max_length=200, primary_key=True)
    last_slot = models.DateTimeField(_("last slot"))  # enqueued or skipped
    enqueued_slot = models.DateTimeField(_("last enqueued slot"), null=True, blank=True)
    job_id = models.BigIntegerField(_("last job"), null=True, blank=True)
    updated_at = models.DateTimeField(_("updated"), auto_now=True)
    # While paused, no worker enqueues its slots (a schedule of the settings or a row alike).
    # Defaults in the database too: the workers of the release before insert rows without it.
    paused = models.BooleanField(_("paused"), default=False, db_default=False)
    paused_at = models.DateTimeField(_("paused at"), null=True, blank=True)
    # The last job "run now" enqueued (outside the slots) and when.
    run_job_id = models.BigIntegerField(_("last run-now job"), null=True, blank=True)
    run_at = models.DateTimeField(_("last run now"), null=True, blank=True)

    class Meta:
        verbose_name = _("schedule")  # the admin's Schedules page lists the schedules
        verbose_name_plural = _("schedules")
        # The Schedules page's own actions, on any schedule (settings or row).
        permissions = [
            ("pause_schedule", _("Can pause and resume a schedule")),
            ("run_schedule", _("Can run a schedule now")),
        ]

    def __str__(self) -> str:
        return str(self.name)


class ScheduleDefinition(models.Model):
    """A schedule stored as a row (`jobqueue_schedules add`, the admin), beside those of
    JOBQUEUE["SCHEDULES"]: the same keys, checked by the same `schedules.parse()` before it is
    written. An empty or null column is a key not given. Workers re-read the rows every few
    seconds (worker/schedule_runner.py); where it stands is its ScheduleState row.
    """

    name = KeyField(_("name"), max_length=200, primary_key=True)
    handler = KeyField(_("handler"), max_length=200, blank=True, default="")
    task = models.CharField(_("task"), max_length=255, blank=True, default="")
    cron = models.CharField(_("cron"), max_length=200, blank=True, default="")
    every = models.PositiveIntegerField(_("every (seconds)"), null=True, blank=True)
    timezone = models.CharField(_("time zone"), max_length=100, blank=True, default="")
    args = models.JSONField(_("arguments"), default=dict, blank=True)
    queue = KeyField(_("queue"), max_length=100, null=True, blank=True)
    group = KeyField(_("group"), max_length=200, blank=True, default="")
    priority = models.IntegerField(_("priority"), default=0)
    catch_up = models.CharField(
        _("catch up"),
        max_length=10,
        default="once",
        choices=[("once", _("once: the latest missed slot")), ("skip", _("skip missed slots"))],
    )
    grace = models.FloatField(_("grace (seconds)"), default=60.0)
    uses = models.JSONField(_("uses"), null=True, blank=True)
    sequence = KeyField(_("sequence"), max_length=255, null=True, blank=True)
    sequence_on_failure = models.CharField(
        _("sequence on failure"), max_length=10, blank=True, default=""
    )
    created_at = models.DateTimeField(_("created"), auto_now_add=True)
    updated_at = models.DateTimeField(_("updated"), auto_now=True)

    class Meta:
        verbose_name = _("stored schedule")
        verbose_name_plural = _("stored schedules")

    def __str__(self) -> str:
        return str(self.name)
