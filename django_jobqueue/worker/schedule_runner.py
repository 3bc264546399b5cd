"""The scheduler: enqueues the due slots of JOBQUEUE["SCHEDULES"].

Every worker runs one; there is no beat process and no leader. A tick reads the schedules'
state rows (no write transaction while nothing is due) and takes each due slot with
`take_slot()`, which lets exactly one worker enqueue it: the one whose conditioned UPDATE
moves the schedule's `last_slot` past the slot, in the transaction that enqueues the slot's
job (unique key `schedule:<name>:<slot>`). Between ticks it sleeps until the next slot by
the schedules' clock, at most `interval`.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from django.utils.module_loading import import_string

from .. import conf
from ..dialects import Dialect
from ..enqueuing import enqueue
from ..models import Job, ScheduleState
from ..schedules import Clock, Schedule
from .duty import Duty

# The module's name before it was renamed: users configure their logging by logger name.
logger = logging.getLogger("django_jobqueue.worker.scheduler")


def ensure_states(dialect: Dialect, schedules: list[Schedule], now: dt.datetime) -> None:
    """Create the state rows of `schedules` that have none: their first slot is after `now`."""
    ScheduleState.objects.using(dialect.using).bulk_create(
        [ScheduleState(name=s.name, last_slot=now) for s in schedules], ignore_conflicts=True
    )


def take_slot(dialect: Dialect, schedule: Schedule, now: dt.datetime) -> Job | None:
    """Enqueue the due slot of `schedule`, if any and if no other worker has; return its job.

    One transaction: the state row is read (skipping it if another worker holds it), moved
    past the slot by an UPDATE conditioned on the value read, and the slot's job enqueued.
    """

    def txn() -> Job | None:
        states = ScheduleState.objects.using(dialect.using)
        last = (
            dialect.lock(states.filter(name=schedule.name))
            .values_list("last_slot", flat=True)
            .first()
        )
        if last is None:
            return None  # another worker holds the row (or it is not created yet)
        slot, run = schedule.decide(last, now)
        if slot is None:
            return None
        moved = states.filter(name=schedule.name, last_slot=last)
        if not run:
            moved.update(last_slot=slot)
            logger.warning(
                "Schedule %s: skipped slot(s) up to %s (found %.0fs late; catch_up='skip')",
                schedule.name, slot.isoformat(), (now - slot).total_seconds(),
            )  # fmt: skip
            return None
        job = enqueue_slot(schedule, slot)
        if not moved.update(last_slot=slot, enqueued_slot=slot, job_id=job.pk):
            # Not reachable while the row is locked; rolled back should it ever be.
            raise SlotTaken(f"schedule {schedule.name}: slot {slot} taken concurrently")
        logger.info("Schedule %s: enqueued job %s for slot %s", schedule.name, job.pk, slot)
        return job

    try:
        return dialect.run_in_transaction(txn)
    except SlotTaken:
        return None


def enqueue_slot(schedule: Schedule, slot: dt.datetime) -> Job:
    """Enqueue the job of `slot` (a task through its backend, so its signals are sent)."""
    options = schedule.job_options(slot)
    if schedule.task is None:
        return enqueue(schedule.handler, schedule.args, **options.as_kwargs())
    # Only what the schedule sets: an unset group, queue or uses keeps the task's own.
    changes: dict[str, Any] = {"unique_key": options.unique_key, "priority": options.priority}
    if options.group:
        changes["group"] = options.group
    if options.queue is not None:
        changes["queue_name"] = options.queue
    if options.uses is not None:
        changes["uses"] = options.uses
    result = import_string(schedule.task).using(**changes).enqueue(**schedule.args)
    return Job.objects.using(conf.get().database).get(pk=int(result.id))


class SlotTaken(Exception):
    """Another worker took a schedule's slot first (the transaction is rolled back)."""


def seconds_until_next(schedules: list[Schedule], now: dt.datetime) -> float | None:
    """Seconds from `now` to the next slot of any of `schedules` (None: no schedules)."""
    if not schedules:
        return None
    return min((s.next_after(now) - now).total_seconds() for s in schedules)


class ScheduleRunner(Duty):
    """Enqueues due schedule slots; sleeps until the next one (at most `interval`)."""

    def __init__(
        self,
        dialect: Dialect,
        *,
        schedules: list[Schedule],
        clock: Clock,
        interval: float,
        lock_timeout: float,
    ) -> None:
        super().__init__(dialect, interval=interval, lock_timeout=lock_timeout)
        self.schedules = schedules
        self.clock = clock
        self._ensured = False

    @classmethod
    def duty_name(cls) -> str:
        return "scheduler"

    def tick(self) -> float | None:
        now = self.clock()
        if not self._ensured:
            ensure_states(self.dialect, self.schedules, now)
            self._ensured = True
        last = dict(
            ScheduleState.objects.using(self.dialect.using)
            .filter(name__in=[s.name for s in self.schedules])
            .values_list("name", "last_slot")
        )
        if len(last) < len(self.schedules):
            self._ensured = False  # a row was deleted: create it again at the next tick
        for schedule in self.schedules:
            seen = last.get(schedule.name)
            if seen is not None and schedule.next_after(seen) <= now:
                take_slot(self.dialect, schedule, now)
        until = seconds_until_next(self.schedules, now)
        if until is None:
            return None
        # A little after the slot: the clock was read before the sleep began.
        return min(self.interval, max(0.0, until) + 0.001)
