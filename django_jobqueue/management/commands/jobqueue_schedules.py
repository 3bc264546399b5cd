"""manage.py jobqueue_schedules: list the schedules with their next runs."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from django_jobqueue import conf, schedules, validation
from django_jobqueue.dialects import get_dialect
from django_jobqueue.models import ScheduleState


class Command(BaseCommand):
    help = "List JOBQUEUE['SCHEDULES']: when each runs, its next slot and its last enqueued one."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--count", type=int, default=1, help="Next slots to show per schedule (default: 1)."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["count"] < 1:
            raise CommandError("--count must be at least 1.")
        try:
            found = schedules.configured()
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from None
        if not found:
            self.stdout.write("No schedules (JOBQUEUE['SCHEDULES'] is empty).")
            return
        dialect = get_dialect(conf.get().database)
        now = schedules.clock(dialect)()
        states = {s.name: s for s in ScheduleState.objects.using(dialect.using)}
        for schedule in found:
            when = (
                f"every {schedule.every}s"
                if schedule.every is not None
                else f"cron '{schedule.cron}' ({schedule.timezone.key})"
            )
            # Names from settings or the database must not drive the operator's terminal.
            self.stdout.write(validation.printable(
                f"{schedule.name}: {schedule.handler}, {when}, catch_up={schedule.catch_up}"
            ))  # fmt: skip
            moment = now
            for _ in range(options["count"]):
                moment = schedule.next_after(moment)
                local = moment.astimezone(schedule.timezone)
                self.stdout.write(f"  next:          {local.isoformat()}")
            state = states.get(schedule.name)
            if state is None or state.enqueued_slot is None:
                self.stdout.write("  last enqueued: never")
            else:
                local = state.enqueued_slot.astimezone(schedule.timezone)
                self.stdout.write(f"  last enqueued: {local.isoformat()} (job {state.job_id})")
