"""manage.py jobqueue_resume: let workers start the jobs of paused queues, resources and
workflows again."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from .jobqueue_pause import act, add_targets, checked_targets


class Command(BaseCommand):
    help = (
        "Resume paused queues, resources (--resource) or workflows (--workflow): workers "
        "start their jobs again."
    )

    def add_arguments(self, parser: Any) -> None:
        add_targets(parser, "Resume")

    def handle(self, *args: Any, **options: Any) -> None:
        act(self.stdout.write, checked_targets(options), pause=False)
