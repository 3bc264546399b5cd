"""manage.py jobqueue_pause: stop workers from claiming the jobs of queues."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from django_jobqueue import pausing, validation
from django_jobqueue.exceptions import InvalidJobError


def check_names(names: list[str]) -> None:
    """Raise CommandError unless every name is a valid queue name (before any write)."""
    for name in names:
        try:
            validation.check_label("queue", name, 100)
        except InvalidJobError as exc:
            raise CommandError(str(exc)) from None


class Command(BaseCommand):
    help = (
        "Pause queues: workers claim none of their jobs (within FAIR_SHARE_REFRESH seconds) "
        "until jobqueue_resume; running jobs finish."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("queues", nargs="+", metavar="queue", help="Queue names.")

    def handle(self, *args: Any, **options: Any) -> None:
        check_names(options["queues"])
        for name in options["queues"]:
            if pausing.pause_queue(name):
                self.stdout.write(f"Paused queue {name!r}.")
            else:
                self.stdout.write(f"Queue {name!r} was paused already.")
