"""Schedules (JOBQUEUE["SCHEDULES"]): periodic jobs that the workers enqueue themselves.

A schedule names a handler (or a django.tasks task) and either a cron expression in a time
zone or `every` N seconds; its *slots* are the instants it is due. This module defines and
checks schedules; the workers' scheduler duty (worker/schedule_runner.py) enqueues their slots.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import zoneinfo
from collections.abc import Callable
from typing import Any, TypeVar

from cronsim import CronSim, CronSimError
from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from . import conf, registry, validation
from .dialects import Dialect
from .exceptions import HandlerRegistrationError, InvalidJobError, JobQueueError
from .options import JobOptions

CATCH_UP = ("once", "skip")
DEFAULT_CATCH_UP = "once"
DEFAULT_GRACE = 60.0  # seconds: how late a slot may be found and still run under "skip"
KEYS = {"handler", "task", "cron", "every", "timezone", "args", "queue", "group", "priority"} | {
    "catch_up",
    "grace",
    "uses",
    "sequence",
    "sequence_on_failure",
}
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
MAX_EVERY = 366 * 86_400  # seconds: slots further apart are cron's job
UTC_ZONE = zoneinfo.ZoneInfo("UTC")

Clock = Callable[[], dt.datetime]
F = TypeVar("F", bound=Callable[..., Any])

# Schedules declared with @jobqueue.schedule next to their handler (or task), by name.
_declared: dict[str, dict[str, Any]] = {}


@dataclasses.dataclass(frozen=True)
class Schedule:
    """One validated entry of JOBQUEUE["SCHEDULES"]."""

    name: str
    handler: str  # the handler key of the jobs (for a task, the task's key)
    task: str | None = None  # the dotted path of a django.tasks task, or None
    cron: str | None = None
    every: int | None = None  # seconds; slots fall on whole multiples since the Unix epoch
    timezone: zoneinfo.ZoneInfo = UTC_ZONE
    args: dict[str, Any] = dataclasses.field(default_factory=dict)
    queue: str | None = None
    group: str = ""
    priority: int = 0
    catch_up: str = DEFAULT_CATCH_UP
    grace: float = DEFAULT_GRACE
    uses: dict[str, int] | None = None  # the resources of JOBQUEUE["LIMITS"] its jobs use
    sequence: str | None = None  # the sequence its jobs join (one slot's job at a time)
    sequence_on_failure: str | None = None

    def next_after(self, moment: dt.datetime) -> dt.datetime:
        """Return the first slot strictly after `moment` (UTC)."""
        if self.every is not None:
            elapsed = (moment - EPOCH) // dt.timedelta(seconds=self.every)
            return EPOCH + dt.timedelta(seconds=self.every * (elapsed + 1))
        assert self.cron is not None
        found = next(CronSim(self.cron, moment.astimezone(self.timezone)))
        return found.astimezone(dt.UTC)

    def latest_until(
        self, moment: dt.datetime, after: dt.datetime | None = None
    ) -> dt.datetime | None:
        """Return the last slot at or before `moment` and after `after` (UTC), or None."""
        if self.every is not None:
            elapsed = (moment - EPOCH) // dt.timedelta(seconds=self.every)
            found = EPOCH + dt.timedelta(seconds=self.every * elapsed)
            return found if after is None or found > after else None
        # Forward from ever earlier starts (cronsim's reverse iteration skips the repeated
        # hour of an autumn daylight-saving change): a few slots are walked at most.
        span = dt.timedelta(minutes=1)
        while span < dt.timedelta(days=366 * 30):
            start = moment - span
            if after is not None and start <= after:
                start = after
            latest = None
            slot = self.next_after(start)
            while slot <= moment:
                latest, slot = slot, self.next_after(slot)
            if latest is not None or start == after:
                return latest
            span *= 8
        return None

    def describe(self) -> str:
        """When it runs: "every 30s", or "cron '0 3 * * *' (Europe/Paris)"."""
        if self.every is not None:
            return f"every {self.every}s"
        return f"cron '{self.cron}' ({self.timezone.key})"

    def unique_key(self, slot: dt.datetime) -> str:
        """The unique key of the job of `slot`."""
        return f"schedule:{self.name}:{slot.astimezone(dt.UTC).isoformat()}"

    def job_options(self, slot: dt.datetime | None) -> JobOptions:
        """The options of the job of `slot` (None: of a job outside the slots, "run now")."""
        return JobOptions(
            queue=self.queue,
            group=self.group,
            priority=self.priority,
            unique_key=None if slot is None else self.unique_key(slot),
            uses=self.uses,
            sequence=self.sequence,
            sequence_on_failure=self.sequence_on_failure,
        )

    def decide(self, last: dt.datetime, now: dt.datetime) -> tuple[dt.datetime | None, bool]:
        """Return (the latest slot due after `last`, whether to enqueue it); (None, False): none.

        Only the latest due slot can run: earlier ones were missed (no worker ran when they
        were due). It runs under "once", and under "skip" if it is at most `grace` late.
        """
        latest = self.latest_until(now, after=last)
        if latest is None:
            return None, False
        if self.catch_up == "skip" and (now - latest).total_seconds() > self.grace:
            return latest, False
        return latest, True


def parse(
    name: Any, raw: Any, settings: conf.JobQueueSettings | None = None, *, label: str = ""
) -> Schedule:
    """Return the Schedule of one SCHEDULES entry, or raise ImproperlyConfigured saying why.

    Its arguments, queue and `uses` are checked against `settings` (default: the settings).
    The message begins with `label` (default: "JOBQUEUE['SCHEDULES'][<name>]").
    """
    settings = conf.get() if settings is None else settings
    where = label or f"JOBQUEUE['SCHEDULES'][{name!r}]"

    def bad(problem: str) -> ImproperlyConfigured:
        return ImproperlyConfigured(f"{where}: {problem}")

    problem = validation.name_problem(name, 200)
    if problem:
        raise bad(f"a schedule name (1 to 200 characters, no control characters) {problem}.")
    if not isinstance(raw, dict):
        raise bad("must be a dict.")
    unknown = sorted(set(raw) - KEYS)
    if unknown:
        raise bad(f"unknown key(s) {', '.join(map(repr, unknown))}; known: {sorted(KEYS)}.")
    handler, task = raw.get("handler"), raw.get("task")
    if task is not None and "handler" in raw:
        raise bad("give one of 'handler' and 'task', not both.")
    if task is not None:
        handler = _task_key(task, bad)
    if not isinstance(handler, str):
        raise bad(
            "'handler' (the key of a registered handler) or 'task' (the dotted path of a "
            "django.tasks task) is required."
        )
    try:
        registry.get(handler)
    except JobQueueError as exc:
        raise bad(str(exc)) from None
    cron, every = raw.get("cron"), raw.get("every")
    if (cron is None) == (every is None):
        raise bad("give exactly one of 'cron' (a cron expression) and 'every' (seconds).")
    if every is not None and (
        isinstance(every, bool) or not isinstance(every, int) or not 1 <= every <= MAX_EVERY
    ):
        raise bad(
            f"'every' must be a whole number of seconds from 1 to {MAX_EVERY:,} (366 days; "
            f"use 'cron' for rarer slots), not {every!r}."
        )
    tz_name = raw.get("timezone", django_settings.TIME_ZONE or "UTC")
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
    if not validation.finite(grace) or grace <= 0:
        raise bad(f"'grace' must be a positive number of seconds, not {grace!r}.")
    try:
        args = validation.check_args(handler, raw.get("args", {}), settings.max_args_bytes)
        queue, group, priority = raw.get("queue"), raw.get("group", ""), raw.get("priority", 0)
        uses = raw.get("uses")
        sequence, on_failure = raw.get("sequence"), raw.get("sequence_on_failure")
        JobOptions(
            queue=queue, group=group, priority=priority, uses=uses, sequence=sequence,
            sequence_on_failure=on_failure,
        ).job_fields(settings)  # fmt: skip
    except InvalidJobError as exc:
        raise bad(str(exc)) from None
    return Schedule(
        name=name, handler=handler, task=task, cron=cron, every=every, timezone=tz, args=args,
        queue=queue, group=group, priority=priority, catch_up=catch_up, grace=float(grace),
        uses=None if uses is None else dict(uses),  # {}: none, as for enqueue()
        sequence=sequence, sequence_on_failure=on_failure,
    )  # fmt: skip


def _task_key(path: Any, bad: Callable[[str], ImproperlyConfigured]) -> str:
    """Return the handler key of the django.tasks task at dotted `path`."""
    from . import backends

    if not backends.HAS_TASKS:
        raise bad("'task' needs django.tasks (Django 6.0 or newer).")
    try:
        found = import_string(path) if isinstance(path, str) else None
    except ImportError as exc:
        raise bad(f"'task' {path!r} cannot be imported: {exc}") from None
    if not isinstance(found, backends.JobQueueTask):
        raise bad(
            f"'task' {path!r} is not a task of django_jobqueue.backends.JobQueueBackend "
            "(a function decorated with @task, with that backend in TASKS)."
        )
    return backends.task_key(found.backend, found.module_path)


def _raw(settings: conf.JobQueueSettings) -> dict[str, dict[str, Any]]:
    """The definitions of JOBQUEUE["SCHEDULES"] and of @jobqueue.schedule, by name."""
    return {**_declared, **settings.schedules}


def problems(settings: conf.JobQueueSettings | None = None) -> list[str]:
    """Return what is wrong with the schedules, one message per schedule.

    Each is checked against `settings` (default: the settings); the system check (E010)
    passes those of `conf.examine()`, which leave out the bad values E001 reports.
    """
    settings = conf.get() if settings is None else settings
    found = [
        f"JOBQUEUE['SCHEDULES'][{name!r}]: also declared with @jobqueue.schedule; "
        "name one of them differently."
        for name in sorted(set(_declared) & set(settings.schedules))
    ]
    for name, raw in _raw(settings).items():
        try:
            parse(name, raw, settings)
        except ImproperlyConfigured as exc:
            found.append(str(exc))
    return found


def configured() -> list[Schedule]:
    """Return every schedule, raising ImproperlyConfigured if one is bad."""
    found = problems()
    if found:
        raise ImproperlyConfigured(found[0])
    return [parse(name, raw) for name, raw in sorted(_raw(conf.get()).items())]


def schedule(
    name: str,
    *,
    cron: str | None = None,
    every: int | None = None,
    timezone: str | None = None,
    args: dict[str, Any] | None = None,
    queue: str | None = None,
    group: str | None = None,
    priority: int | None = None,
    catch_up: str | None = None,
    grace: float | None = None,
    uses: dict[str, int] | None = None,
    sequence: str | None = None,
    sequence_on_failure: str | None = None,
) -> Callable[[F], F]:
    """Run the decorated handler (or django.tasks task) on a schedule named `name`.

    Put it above ``@jobqueue.handler(...)`` (or ``@task``). The keywords are those of a
    JOBQUEUE["SCHEDULES"] entry, checked with them by the system checks (E010).
    """
    from . import backends

    options = {
        "cron": cron, "every": every, "timezone": timezone, "args": args, "queue": queue,
        "group": group, "priority": priority, "catch_up": catch_up, "grace": grace,
        "uses": uses, "sequence": sequence, "sequence_on_failure": sequence_on_failure,
    }  # fmt: skip

    def decorator(func: F) -> F:
        raw = {k: v for k, v in options.items() if v is not None}
        if backends.HAS_TASKS and isinstance(func, backends.JobQueueTask):
            raw["task"] = func.module_path
        else:
            key = registry.key_of(func)
            if key is None:
                raise HandlerRegistrationError(
                    f"@jobqueue.schedule({name!r}) must decorate a registered handler: put it "
                    "above @jobqueue.handler(...)."
                )
            raw["handler"] = key
        if _declared.get(name, raw) != raw:
            raise HandlerRegistrationError(f"Schedule {name!r} is declared twice.")
        _declared[name] = raw
        return func

    return decorator


def clock(dialect: Dialect) -> Clock:
    """Return the schedules' clock: JOBQUEUE["SCHEDULE_CLOCK"], else the database's."""
    hook = conf.get().schedule_clock
    if hook is None:
        return dialect.now
    func: Clock = import_string(hook) if isinstance(hook, str) else hook
    return func
