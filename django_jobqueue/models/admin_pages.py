"""Proxy models of Job that give the admin pages of their own (leases, dead jobs, the overview)."""

from __future__ import annotations

from django.utils.translation import gettext_lazy as _

from .jobs import Job


class LiveLease(Job):
    """Jobs a worker holds (leased or running): the admin's live-leases page."""

    class Meta:
        proxy = True
        default_permissions = ()  # Job's permissions guard these pages
        verbose_name = _("live lease")
        verbose_name_plural = _("live leases")


class DeadJob(Job):
    """Jobs that ended `dead` or `cancelled`: the admin's dead-jobs page."""

    class Meta:
        proxy = True
        default_permissions = ()  # Job's permissions guard these pages
        verbose_name = _("dead job")
        verbose_name_plural = _("dead jobs")


class QueueOverview(Job):
    """The queue at a glance: the admin's overview page (no rows of its own)."""

    class Meta:
        proxy = True
        default_permissions = ()  # Job's permissions guard these pages
        verbose_name = _("overview")
        verbose_name_plural = _("overview")
