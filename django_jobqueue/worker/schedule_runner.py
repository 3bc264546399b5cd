"""The scheduler: enqueues the due slots of JOBQUEUE["SCHEDULES"] and of the stored schedules.

Every worker runs one; there is no beat process and no leader. A tick reads the schedules'
state rows (no write transaction while nothing is due) and takes each due slot with
`take_slot()`, which lets exactly one worker enqueue it: the one whose conditioned UPDATE
moves the schedule's `last_slot` past the slot, in the transaction that enqueues the slot's
job (unique key `schedule:<name>:<slot>`). A paused schedule's slots are not taken. Between
ticks it sleeps until the next slot by the schedules' clock, at most `interval`, and re-reads
the stored schedules (schedule_rows.py) every `refresh` seconds: a row added, changed or
removed is honoured within that.
"""

from __future__ import annotations

import datetime as dt
import logging
import time

from .. import schedule_rows
from ..dialects import Dialect
from ..models import Job, ScheduleState
from ..schedules import Clock, Schedule
from .duty import Duty

# The module's name before it was renamed: users configure their logging by logger name.
logger = logging.getLogger("django_jobqueue.worker.scheduler")

REFRESH = 2.0  # seconds between two reads of the stored schedules


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
        found = (
            dialect.lock(states.filter(name=schedule.name))
            .values_list("last_slot", "paused")
            .first()
        )
        if found is None:
            return None  # another worker holds the row (or it is not created yet)
        last, paused = found
        if paused:
            return None
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
    return schedule_rows.enqueue_job(schedule, slot)


class SlotTaken(Exception):
    """Another worker took a schedule's slot first (the transaction is rolled back)."""


def seconds_until_next(schedules: list[Schedule], now: dt.datetime) -> float | None:
    """Seconds from `now` to the next slot of any of `schedules` (None: no schedules)."""
    if not schedules:
        return None
    return min((s.next_after(now) - now).total_seconds() for s in schedules)


class ScheduleRunner(Duty):
    """Enqueues due schedule slots; sleeps until the next one (at most `interval`), and reads
    the stored schedules every `refresh` seconds."""

    def __init__(
        self,
        dialect: Dialect,
        *,
        schedules: list[Schedule],
        clock: Clock,
        interval: float,
        lock_timeout: float,
        refresh: float = REFRESH,
    ) -> None:
        super().__init__(dialect, interval=interval, lock_timeout=lock_timeout)
        self.configured = list(schedules)  # those of the settings and the decorator
        self.schedules = list(schedules)  # and the valid stored ones
        self.clock = clock
        self.refresh = refresh
        self._ensured = False
        self._rows = schedule_rows.RowCache()
        self._read_at: float | None = None  # monotonic time of the last read of the rows
        self._problems: dict[str, str] = {}

    @classmethod
    def duty_name(cls) -> str:
        return "scheduler"

    def read_rows(self) -> None:
        """Read the stored schedules; log each one that cannot run, once while it stays so."""
        stored = self._rows.read(self.dialect.using)
        self._read_at = time.monotonic()
        for name, problem in stored.problems.items():
            if self._problems.get(name) != problem:
                logger.error("Schedule %s is not run: %s", name, problem)
        self._problems = stored.problems
        names = [s.name for s in self.schedules]
        self.schedules = self.configured + stored.schedules
        if [s.name for s in self.schedules] != names:
            self._ensured = False  # a new schedule gets its state row at this tick

    def tick(self) -> float | None:
        if self._read_at is None or time.monotonic() - self._read_at >= self.refresh:
            self.read_rows()
        now = self.clock()
        if not self._ensured:
            ensure_states(self.dialect, self.schedules, now)
            self._ensured = True
        states = {
            name: (last, paused)
            for name, last, paused in ScheduleState.objects.using(self.dialect.using)
            .filter(name__in=[s.name for s in self.schedules])
            .values_list("name", "last_slot", "paused")
        }
        if len(states) < len(self.schedules):
            # A state row was deleted: create it again at the next tick, after reading the
            # stored schedules again (`remove` deletes a stored schedule's: it is gone).
            self._ensured = False
            self._read_at = None
        for schedule in self.schedules:
            last, paused = states.get(schedule.name, (None, False))
            if last is not None and not paused and schedule.next_after(last) <= now:
                take_slot(self.dialect, schedule, now)
        read_at = self._read_at if self._read_at is not None else -self.refresh
        until_read = self.refresh - (time.monotonic() - read_at)
        until = seconds_until_next(self.schedules, now)
        if until is None:
            return max(0.0, min(self.interval, until_read))
        # A little after the slot: the clock was read before the sleep began.
        return max(0.0, min(self.interval, until_read, max(0.0, until) + 0.001))
