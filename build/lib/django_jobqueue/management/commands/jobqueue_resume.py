"""manage.py jobqueue_resume: let workers claim the jobs of paused queues again."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from django_jobqueue import pausing

from .jobqueue_pause import check_names


class Command(BaseCommand):
    help = "Resume paused queues: workers claim their jobs again."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("queues", nargs="+", metavar="queue", help="Queue names.")

    def handle(self, *args: Any, **options: Any) -> None:
        check_names(options["queues"])
        for name in options["queues"]:
            if pausing.resume_queue(name):
                self.stdout.write(f"Resumed queue {name!r}.")
            else:
                self.stdout.write(f"Queue {name!r} was not paused.")
