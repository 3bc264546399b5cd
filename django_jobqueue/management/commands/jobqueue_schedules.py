"""manage.py jobqueue_schedules: list the schedules with their next runs."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from django_jobqueue import conf, schedules, validation
from django_jobqueue.dialects import get_dialect


class Command(BaseCommand):
    help = "List JOBQUEUE['SCHEDULES']: when each runs, its next slot and its last enqueued one."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--count", type=int, default=1, help="Next slots to show per schedule (default: 1)."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["count"] < 1:
            raise CommandError("--count must be at least 1.")
        dialect = get_dialect(conf.get().database)
        try:
            found = schedules.standings(dialect, options["count"])
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from None
        if not found:
            self.stdout.write("No schedules (JOBQUEUE['SCHEDULES'] is empty).")
            return
        for standing in found:
            schedule = standing.schedule
            # Names from settings or the database must not drive the operator's terminal.
            self.stdout.write(validation.printable(
                f"{schedule.name}: {schedule.handler}, {standing.when}, "
                f"catch_up={schedule.catch_up}"
            ))  # fmt: skip
            for slot in standing.next_slots:
                self.stdout.write(f"  next:          {slot.isoformat()}")
            if standing.last_enqueued is None:
                self.stdout.write("  last enqueued: never")
            else:
                self.stdout.write(
                    f"  last enqueued: {standing.last_enqueued.isoformat()} "
                    f"(job {standing.last_job_id})"
                )
