"""What operators pause: queues, resources and workflows."""

from __future__ import annotations

from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from .fields import KeyField
from .jobs import Job


class QueueState(models.Model):
    """A queue's operator state: while `paused`, workers claim none of its jobs."""

    name = KeyField(_("queue"), max_length=100, primary_key=True)
    paused = models.BooleanField(_("paused"), default=False)
    paused_at = models.DateTimeField(_("paused at"), null=True, blank=True)

    class Meta:
        verbose_name = _("queue state")
        verbose_name_plural = _("queue states")

    def __str__(self) -> str:
        return f"{self.name} ({'paused' if self.paused else 'active'})"


class PausedResource(models.Model):
    """A paused resource ("tenant:42") or family of resources ("tenant:*"): workers start no
    job that uses one of them until it is resumed (`pausing.pause_resource`)."""

    name = KeyField(_("resource"), max_length=255, primary_key=True)
    paused_at = models.DateTimeField(_("paused at"), default=timezone.now)

    class Meta:
        verbose_name = _("paused resource")
        verbose_name_plural = _("paused resources")

    def __str__(self) -> str:
        return str(self.name)


class PausedWorkflow(models.Model):
    """A paused job and everything under it (a container's or a spawner's children, at any
    depth): workers start none of them until it is resumed (`pausing.pause_workflow`)."""

    job = models.OneToOneField(
        Job, on_delete=models.CASCADE, primary_key=True, related_name="+", verbose_name=_("job")
    )
    paused_at = models.DateTimeField(_("paused at"), default=timezone.now)

    class Meta:
        verbose_name = _("paused workflow")
        verbose_name_plural = _("paused workflows")

    def __str__(self) -> str:
        return f"workflow #{self.job_id}"
