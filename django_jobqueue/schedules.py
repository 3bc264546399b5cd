"""Schedules (JOBQUEUE["SCHEDULES"]): periodic jobs that the workers enqueue themselves.

A schedule names a handler and either a cron expression in a time zone or `every` N seconds.
Its *slots* are the instants it is due. Every worker looks for due slots; a slot is taken by
the worker whose conditioned UPDATE moves the schedule's `last_slot` past it, in the same
transaction that enqueues the slot's job (with the unique key `schedule:<name>:<slot>`), so
each slot is enqueued once across every worker and host, with no beat process or leader.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import math
import zoneinfo
from collections.abc import Callable
from typing import Any

from cronsim import CronSim, CronSimError
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from . import conf, registry, validation
from .dialects import Dialect
from .exceptions import InvalidJobError, JobQueueError
from .models import Job, ScheduleState

logger = logging.getLogger(__name__)

CATCH_UP = ("once", "skip")
DEFAULT_CATCH_UP = "once"
DEFAULT_GRACE = 60.0  # seconds: how late a slot may be found and still run under "skip"
KEYS = {"handler", "cron", "every", "timezone", "args", "queue", "group", "priority"} | {
    "catch_up",
    "grace",
}
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
UTC_ZONE = zoneinfo.ZoneInfo("UTC")

Clock = Callable[[], dt.datetime]


@dataclasses.dataclass(frozen=True)
class Schedule:
    """One validated entry of JOBQUEUE["SCHEDULES"]."""

    name: str
    handler: str
    cron: str | None = None
    every: int | None = None  # seconds; slots fall on whole multiples since the Unix epoch
    timezone: zoneinfo.ZoneInfo = UTC_ZONE
    args: dict[str, Any] = dataclasses.field(default_factory=dict)
    queue: str | None = None
    group: str = ""
    priority: int = 0
    catch_up: str = DEFAULT_CATCH_UP
    grace: float = DEFAULT_GRACE

    def next_after(self, moment: dt.datetime) -> dt.datetime:
        """Return the first slot strictly after `moment` (UTC)."""
        if self.every is not None:
            elapsed = (moment - EPOCH) // dt.timedelta(seconds=self.every)
            return EPOCH + dt.timedelta(seconds=self.every * (elapsed + 1))
        assert self.cron is not None
        found = next(CronSim(self.cron, moment.astimezone(self.timezone)))
        return found.astimezone(dt.UTC)

    def latest_until(self, moment: dt.datetime) -> dt.datetime:
        """Return the last slot at or before `moment` (UTC)."""
        if self.every is not None:
            elapsed = (moment - EPOCH) // dt.timedelta(seconds=self.every)
            return EPOCH + dt.timedelta(seconds=self.every * elapsed)
        assert self.cron is not None
        after = moment.astimezone(self.timezone) + dt.timedelta(microseconds=1)
        return next(CronSim(self.cron, after, reverse=True)).astimezone(dt.UTC)

    def unique_key(self, slot: dt.datetime) -> str:
        """The unique key of the job of `slot`."""
        return f"schedule:{self.name}:{slot.astimezone(dt.UTC).isoformat()}"

    def decide(self, last: dt.datetime, now: dt.datetime) -> tuple[dt.datetime | None, bool]:
        """Return (the latest slot due after `last`, whether to enqueue it); (None, False): none.

        Only the latest due slot can run: earlier ones were missed (no worker ran when they
        were due). It runs under "once", and under "skip" if it is at most `grace` late.
        """
        if self.next_after(last) > now:
            return None, False
        latest = self.latest_until(now)
        if self.catch_up == "skip" and (now - latest).total_seconds() > self.grace:
            return latest, False
        return latest, True


def parse(name: Any, raw: Any, *, check_handler: bool = True) -> Schedule:
    """Return the Schedule of one SCHEDULES entry, or raise ImproperlyConfigured saying why."""

    def bad(problem: str) -> ImproperlyConfigured:
        return ImproperlyConfigured(f"JOBQUEUE['SCHEDULES'][{name!r}]: {problem}")

    if not isinstance(name, str) or not 1 <= len(name) <= 200:
        raise bad("a schedule name must be a string of 1 to 200 characters.")
    if not isinstance(raw, dict):
        raise bad("must be a dict.")
    unknown = sorted(set(raw) - KEYS)
    if unknown:
        raise bad(f"unknown key(s) {', '.join(map(repr, unknown))}; known: {sorted(KEYS)}.")
    handler = raw.get("handler")
    if not isinstance(handler, str):
        raise bad("'handler' (the key of a registered handler) is required.")
    if check_handler:
        try:
            registry.get(handler)
        except JobQueueError as exc:
            raise bad(str(exc)) from None
    cron, every = raw.get("cron"), raw.get("every")
    if (cron is None) == (every is None):
        raise bad("give exactly one of 'cron' (a cron expression) and 'every' (seconds).")
    if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
        raise bad(f"'every' must be a whole number of seconds >= 1, not {every!r}.")
    tz_name = raw.get("timezone", settings.TIME_ZONE or "UTC")
    if every is not None and "timezone" in raw:
        raise bad("'timezone' applies to 'cron' only ('every' counts seconds).")
    try:
        tz = zoneinfo.ZoneInfo(tz_name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, TypeError):
        raise bad(f"'timezone' {tz_name!r} is not a known time zone (IANA name).") from None
    if cron is not None:
        if not isinstance(cron, str):
            raise bad(f"'cron' must be a string, not {cron!r}.")
        try:
            CronSim(cron, dt.datetime.now(tz))
        except CronSimError as exc:
            raise bad(f"'cron' {cron!r} is not a valid cron expression: {exc}.") from None
    catch_up = raw.get("catch_up", DEFAULT_CATCH_UP)
    if catch_up not in CATCH_UP:
        raise bad(f"'catch_up' must be 'once' or 'skip', not {catch_up!r}.")
    grace = raw.get("grace", DEFAULT_GRACE)
    if (
        isinstance(grace, bool)
        or not isinstance(grace, int | float)
        or not math.isfinite(grace)
        or grace <= 0
    ):
        raise bad(f"'grace' must be a positive number of seconds, not {grace!r}.")
    try:
        args = validation.check_args(handler, raw.get("args", {}))
        queue = raw.get("queue")
        if queue is not None:
            validation.check_label("queue", queue, 100)
        group = validation.check_label("group", raw.get("group", ""), 200, allow_empty=True)
        priority = validation.check_int("priority", raw.get("priority", 0))
    except InvalidJobError as exc:
        raise bad(str(exc)) from None
    return Schedule(
        name=name, handler=handler, cron=cron, every=every, timezone=tz, args=args,
        queue=queue, group=group, priority=priority, catch_up=catch_up, grace=float(grace),
    )  # fmt: skip


def problems() -> list[str]:
    """Return what is wrong with JOBQUEUE["SCHEDULES"], one message per schedule."""
    found = []
    for name, raw in conf.get().schedules.items():
        try:
            parse(name, raw)
        except ImproperlyConfigured as exc:
            found.append(str(exc))
    return found


def configured() -> list[Schedule]:
    """Return the schedules of JOBQUEUE["SCHEDULES"], raising ImproperlyConfigured if one is bad."""
    return [parse(name, raw) for name, raw in sorted(conf.get().schedules.items())]


def clock(dialect: Dialect) -> Clock:
    """Return the schedules' clock: JOBQUEUE["SCHEDULE_CLOCK"], else the database's."""
    hook = conf.get().schedule_clock
    if hook is None:
        return dialect.now
    func: Clock = import_string(hook) if isinstance(hook, str) else hook
    return func


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
    from .enqueuing import enqueue

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
        job = enqueue(
            schedule.handler,
            schedule.args,
            queue=schedule.queue,
            group=schedule.group,
            priority=schedule.priority,
            unique_key=schedule.unique_key(slot),
        )
        if not moved.update(last_slot=slot, enqueued_slot=slot, job_id=job.pk):
            # Not reachable while the row is locked; rolled back should it ever be.
            raise ScheduleRace(f"schedule {schedule.name}: slot {slot} taken concurrently")
        logger.info("Schedule %s: enqueued job %s for slot %s", schedule.name, job.pk, slot)
        return job

    try:
        return dialect.run_in_transaction(txn)
    except ScheduleRace:
        return None


class ScheduleRace(JobQueueError):
    """Another worker took a schedule's slot first (the transaction was rolled back)."""


def seconds_until_next(schedules: list[Schedule], now: dt.datetime) -> float | None:
    """Seconds from `now` to the next slot of any of `schedules` (None: no schedules)."""
    if not schedules:
        return None
    return min((s.next_after(now) - now).total_seconds() for s in schedules)
