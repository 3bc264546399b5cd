"""manage.py jobqueue_schedules: list the schedules with their next runs; add, pause, resume,
remove or run one (`add|pause|resume|remove|run NAME`)."""

from __future__ import annotations

import json
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from django_jobqueue import conf, schedule_rows, validation
from django_jobqueue.dialects import get_dialect
from django_jobqueue.exceptions import ScheduleError

# The options of `add`, each a key of a JOBQUEUE["SCHEDULES"] entry: (option, key, type).
ADD_OPTIONS: list[tuple[str, str, Any]] = [
    ("--handler", "handler", str),
    ("--task", "task", str),
    ("--cron", "cron", str),
    ("--every", "every", int),
    ("--timezone", "timezone", str),
    ("--args", "args", str),
    ("--queue", "queue", str),
    ("--group", "group", str),
    ("--priority", "priority", int),
    ("--catch-up", "catch_up", str),
    ("--grace", "grace", float),
    ("--uses", "uses", str),
    ("--sequence", "sequence", str),
    ("--sequence-on-failure", "sequence_on_failure", str),
]
JSON_KEYS = ("args", "uses")
# pause and resume: what does it, and what is said when it changed something or nothing.
TOGGLES = {
    "pause": (
        schedule_rows.pause,
        "Paused schedule {}: no worker enqueues its slots until it is resumed.",
        "Schedule {} was paused already.",
    ),
    "resume": (
        schedule_rows.resume,
        "Resumed schedule {}: its next slot runs (the missed ones do not).",
        "Schedule {} was not paused.",
    ),
}


class Command(BaseCommand):
    help = (
        "List the schedules (JOBQUEUE['SCHEDULES'] and those stored in the database): when "
        "each runs, its next slot and its last enqueued one. With add, pause, resume, remove "
        "or run NAME: act on one."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--count", type=int, default=1, help="Next slots to show per schedule (default: 1)."
        )
        actions = parser.add_subparsers(dest="action", metavar="{add,pause,resume,remove,run}")
        add = actions.add_parser(
            "add",
            help="Store a schedule in the database (the keys of a JOBQUEUE['SCHEDULES'] entry).",
        )
        add.add_argument("name")
        for option, key, kind in ADD_OPTIONS:
            what = "a JSON object" if key in JSON_KEYS else kind.__name__
            # Not dest=key: Django takes an option named "args" for the positional arguments.
            add.add_argument(
                option,
                dest=f"key_{key}",
                metavar=key.upper(),
                type=kind,
                help=f"The {key!r} key ({what}).",
            )
        add.add_argument(
            "--replace", action="store_true", help="Change the stored schedule of that name."
        )
        add.add_argument("--paused", action="store_true", help="Start it paused.")
        for action, text in [
            ("pause", "Pause a schedule: its slots are not enqueued until it is resumed."),
            ("resume", "Resume a paused schedule: its next slot runs, the missed ones do not."),
            ("remove", "Delete a schedule stored in the database."),
            ("run", "Enqueue one job of a schedule now, outside its slots."),
        ]:
            actions.add_parser(action, help=text).add_argument("name")

    def handle(self, *args: Any, **options: Any) -> None:
        action = options.get("action")
        if action is None:
            self.list(options["count"])
            return
        name = options["name"]
        shown = validation.printable(repr(name))
        try:
            if action == "add":
                self.add(name, options)
            elif action in TOGGLES:
                toggle, done, unchanged = TOGGLES[action]
                self.stdout.write((done if toggle(name) else unchanged).format(shown))
            elif action == "remove":
                schedule_rows.remove(name)
                self.stdout.write(f"Removed schedule {shown}.")
            else:
                job = schedule_rows.run_now(name)
                self.stdout.write(
                    f"Enqueued job {job.pk} of schedule {shown} (outside its slots: the next "
                    "slot runs as planned)."
                )
        except ScheduleError as exc:
            raise CommandError(validation.printable(str(exc))) from None

    def add(self, name: str, options: dict[str, Any]) -> None:
        raw: dict[str, Any] = {}
        for option, key, _ in ADD_OPTIONS:
            value = options.get(f"key_{key}")
            if value is None:
                continue
            if key in JSON_KEYS:
                try:
                    value = json.loads(value)
                except ValueError as exc:
                    raise CommandError(f"{option} is not JSON: {exc}.") from None
            raw[key] = value
        schedule = schedule_rows.add(
            name, raw, replace=options["replace"], paused=options["paused"]
        )
        state = " (paused)" if options["paused"] else ""
        self.stdout.write(validation.printable(
            f"Stored schedule {name!r}{state}: {schedule.handler}, {schedule.describe()}. "
            "Workers run it within seconds."
        ))  # fmt: skip

    def list(self, count: int) -> None:
        if count < 1:
            raise CommandError("--count must be at least 1.")
        dialect = get_dialect(conf.get().database)
        try:
            found = schedule_rows.standings(dialect, count)
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from None
        broken = schedule_rows.stored(dialect.using).problems
        if not found and not broken:
            self.stdout.write("No schedules (JOBQUEUE['SCHEDULES'] is empty).")
            return
        for standing in found:
            schedule = standing.schedule
            # Names from settings or the database must not drive the operator's terminal.
            self.stdout.write(validation.printable(
                f"{schedule.name}: {schedule.handler}, {standing.when}, "
                f"catch_up={schedule.catch_up}"
            ))  # fmt: skip
            if standing.stored:
                self.stdout.write("  stored:        in the database")
            if standing.paused_at is not None:
                self.stdout.write(f"  paused since:  {standing.paused_at.isoformat()}")
            for slot in standing.next_slots:
                self.stdout.write(f"  next:          {slot.isoformat()}")
            if standing.last_enqueued is None:
                self.stdout.write("  last enqueued: never")
            else:
                self.stdout.write(
                    f"  last enqueued: {standing.last_enqueued.isoformat()} "
                    f"(job {standing.last_job_id})"
                )
            if standing.run_at is not None:
                self.stdout.write(
                    f"  run now:       {standing.run_at.isoformat()} (job {standing.run_job_id})"
                )
            if standing.outcome is not None:
                self.stdout.write(
                    f"  last outcome:  {standing.outcome} (job {standing.outcome_job_id})"
                )
        for name, problem in broken.items():
            self.stdout.write(validation.printable(f"{name}: not run: {problem}"))
