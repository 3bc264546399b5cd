"""What a long job keeps: its steps, log lines, events and waits, maps, and recorded effects."""

from __future__ import annotations

import logging

from django.db import models
from django.utils.translation import gettext_lazy as _

from .fields import KeyField
from .jobs import Job


class Effect(models.Model):
    """An effect a handler committed, by key: what record_effect() checks before doing it again."""

    key = KeyField(_("key"), max_length=255, unique=True)
    created_at = models.DateTimeField(_("recorded"), auto_now_add=True)

    class Meta:
        verbose_name = _("effect")
        verbose_name_plural = _("effects")

    def __str__(self) -> str:
        return str(self.key)


class JobStep(models.Model):
    """What a durable call of a job's handler returned: a step's result, or a sleep, an event
    wait or a spawn (names starting with "@"), kept so that a later run returns it again.

    `seq` numbers the calls of one name within a run (1, 2, ...): a step called in a loop has
    one record per call; `place` numbers all the durable calls of a run. Written in the
    transaction of the step, fenced by the job's lease.
    """

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="steps")
    name = KeyField(_("name"), max_length=200)
    seq = models.IntegerField(_("call"), default=1)
    # The call's place in its run (1: the run's first durable call), which each replay checks;
    # NULL in the records written before places were (matched by name and call only).
    place = models.IntegerField(_("place"), null=True, blank=True)
    result = models.JSONField(_("result"), null=True, blank=True)
    attempt = models.IntegerField(_("attempt"))
    duration = models.FloatField(_("duration (seconds)"), null=True, blank=True)
    created_at = models.DateTimeField(_("recorded"), auto_now_add=True)

    class Meta:
        verbose_name = _("job step")
        verbose_name_plural = _("job steps")
        constraints = [
            models.UniqueConstraint(fields=["job", "name", "seq"], name="jobqueue_step_unique")
        ]

    def __str__(self) -> str:
        return f"{self.name} #{self.seq} of job {self.job_id}"


class JobLogLine(models.Model):
    """A line a handler logged through `ctx.logger`, kept with the attempt that logged it
    (joblogs.py): at most JOBQUEUE["JOB_LOG_MAX_LINES"] an attempt, deleted with the job."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="log_lines")
    # The attempt (Job.attempts when it ran): the runs of one attempt resumed after a sleep or
    # a wait share it.
    attempt = models.IntegerField(_("attempt"))
    level = models.SmallIntegerField(_("level"))  # logging's number: 20 INFO, 30 WARNING, ...
    logged_at = models.DateTimeField(_("logged at"))  # the worker's clock
    message = models.TextField(_("message"))

    class Meta:
        verbose_name = _("job log line")
        verbose_name_plural = _("job log lines")

    def __str__(self) -> str:
        return f"{self.level_name} of job {self.job_id} attempt {self.attempt}: {self.message}"

    @property
    def level_name(self) -> str:
        """The level's name ("INFO"; "Level 25" for a number logging has no name for)."""
        return logging.getLevelName(self.level)


class JobEvent(models.Model):
    """An event by key (`send_event`): the first payload sent wins.

    A row with `sent_at` NULL stands for jobs waiting on a key nothing was sent to yet: the
    sender and a job starting to wait both lock the key's row, so neither misses the other.
    """

    key = KeyField(_("key"), max_length=255, primary_key=True)
    payload = models.JSONField(_("payload"), null=True, blank=True)
    sent_at = models.DateTimeField(_("sent"), null=True, blank=True)
    created_at = models.DateTimeField(_("created"), auto_now_add=True)

    class Meta:
        verbose_name = _("job event")
        verbose_name_plural = _("job events")
        indexes = [models.Index(fields=["sent_at"], name="jobqueue_event_sent")]

    def __str__(self) -> str:
        return str(self.key)


class JobWait(models.Model):
    """A job suspended in `waiting` for an event (ctx.wait_for_event), until `until` at most;
    or, with `count`, for that many of the jobs it awaits to be final (ctx.wait_for(count=N),
    `key` empty)."""

    job = models.OneToOneField(Job, on_delete=models.CASCADE, primary_key=True, related_name="+")
    key = KeyField(_("event key"), max_length=255)
    until = models.DateTimeField(_("until"), null=True, blank=True)
    count = models.IntegerField(_("jobs to be final"), null=True, blank=True)

    class Meta:
        verbose_name = _("job wait")
        verbose_name_plural = _("job waits")
        indexes = [
            models.Index(fields=["key"], name="jobqueue_wait_key"),
            models.Index(fields=["until"], name="jobqueue_wait_until"),
        ]

    def __str__(self) -> str:
        return f"job {self.job_id} waits for {self.key}"


class JobMap(models.Model):
    """The children of one ctx.map() call of a job: their ids (`first_id` to `last_id`, in the
    order of the items), how many are unfinished, and the cap on how many run at once.

    The children after `released_through` wait (`waiting`, held back) until a child of the
    map finishes and leaves room under `concurrency`; `running` counts those let go and not
    final yet. Every write holds the mapping job's row locked (see maps.py).
    """

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="+")
    seq = models.IntegerField(_("call"))  # the call number of its "@map" record
    type = KeyField(_("handler"), max_length=255)
    total = models.IntegerField(_("children"))
    concurrency = models.IntegerField(_("concurrency"), null=True, blank=True)
    first_id = models.BigIntegerField(_("first child"))
    last_id = models.BigIntegerField(_("last child"))
    released_through = models.BigIntegerField(_("released through"))
    running = models.IntegerField(_("running"))
    unfinished = models.IntegerField(_("unfinished"))

    class Meta:
        verbose_name = _("job map")
        verbose_name_plural = _("job maps")
        constraints = [
            models.UniqueConstraint(fields=["job", "seq"], name="jobqueue_map_job_seq"),
        ]

    def __str__(self) -> str:
        return f"map {self.seq} of job {self.job_id}: {self.total - self.unfinished}/{self.total}"
