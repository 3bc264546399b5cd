"""Schedules stored as rows, and what an operator does to any schedule.

Beside JOBQUEUE["SCHEDULES"] (and @jobqueue.schedule), a schedule may live in the database
(`ScheduleDefinition`): `jobqueue_schedules add` and the admin write it, checked by the same
`schedules.parse()` before anything is written, and every worker's scheduler re-reads the rows
every few seconds. Its name may not be one of the settings' schedules.

Any schedule, of the settings or a row, can be paused (its slots are dropped until it is
resumed, whatever `catch_up` says) and run now (one job at once, outside the slots).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Callable
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import IntegrityError, transaction
from django.utils.module_loading import import_string

from . import conf, schedules
from .dialects import Dialect, get_dialect
from .engine.enqueuing import enqueue
from .exceptions import ScheduleError
from .models import Job, ScheduleDefinition, ScheduleState
from .schedules import Schedule

# The columns of a row, each a key of a SCHEDULES entry; "" or None in a column: not given.
KEYS = (
    "handler", "task", "cron", "every", "timezone", "args", "queue", "group", "priority",
    "catch_up", "grace", "uses", "sequence", "sequence_on_failure",
)  # fmt: skip


def label(name: str) -> str:
    """How messages name stored schedule `name`."""
    return f"Stored schedule {name!r}"


def raw_of(row: ScheduleDefinition | dict[str, Any]) -> dict[str, Any]:
    """The SCHEDULES entry a row (or a dict of its columns) stands for: the keys given."""
    get = row.get if isinstance(row, dict) else lambda key: getattr(row, key, None)
    return {key: get(key) for key in KEYS if get(key) not in (None, "")}


def columns(raw: dict[str, Any]) -> dict[str, Any]:
    """The column values of the SCHEDULES entry `raw` (its keys checked by parse() first)."""
    row = ScheduleDefinition()
    found = {key: getattr(row, key) for key in KEYS}  # the model's defaults: nothing given
    found.update(raw)
    return found


def _length_problem(name: str, raw: dict[str, Any]) -> str:
    """What of `raw` is longer than its column holds ("": nothing)."""
    for key in KEYS:
        size = getattr(ScheduleDefinition._meta.get_field(key), "max_length", None)
        value = raw.get(key)
        if size and isinstance(value, str) and len(value) > size:
            return f"{label(name)}: {key!r} is longer than {size} characters."
    return ""


def settings_names() -> set[str]:
    """The names of the schedules of the settings and of @jobqueue.schedule."""
    return set(schedules._raw(conf.get()))


def check(name: Any, raw: Any) -> Schedule:
    """Return the Schedule of stored schedule `name`, or raise ScheduleError saying why."""
    if isinstance(name, str) and name in settings_names():
        raise ScheduleError(
            f"{label(name)}: the name is taken by a schedule of JOBQUEUE['SCHEDULES'] (or of "
            "@jobqueue.schedule), which is changed in the code only: choose another name."
        )
    try:
        schedule = schedules.parse(name, raw, label=label(name))
    except ImproperlyConfigured as exc:
        raise ScheduleError(str(exc)) from None
    problem = _length_problem(name, raw)
    if problem:
        raise ScheduleError(problem)
    return schedule


def atomically[T](dialect: Dialect, func: Callable[[], T]) -> T:
    """Run `func` in a transaction, or a savepoint of the caller's (an admin view's)."""
    with transaction.atomic(using=dialect.using):
        return func()


def _dialect() -> Dialect:
    return get_dialect(conf.get().database)


def _now(dialect: Dialect) -> dt.datetime:
    return schedules.clock(dialect)()


def add(name: str, raw: dict[str, Any], *, replace: bool = False, paused: bool = False) -> Schedule:
    """Store schedule `name` (the keys of a SCHEDULES entry) as a row; return it.

    ScheduleError, with nothing written, if it is not valid, its name is a settings
    schedule's, or a stored one has it already (unless `replace`: its definition changes, and
    where it stands does not). A new schedule's first slot is the first after now; with
    `paused`, it starts paused.
    """
    schedule = check(name, raw)
    dialect = _dialect()
    now = _now(dialect)
    values = columns(raw)

    def txn() -> None:
        rows = ScheduleDefinition.objects.using(dialect.using)
        if dialect.lock_blocking(rows.filter(name=name)).exists():
            if not replace:
                raise ScheduleError(
                    f"{label(name)} exists already: change it with --replace (or in the "
                    "admin), or remove it first."
                )
            rows.filter(name=name).update(**values, updated_at=now)
            if paused:
                _set_paused(dialect, name, now)
            return
        ScheduleDefinition(name=name, **values).save(using=dialect.using, force_insert=True)
        # Where a schedule of the same name stood before (removed, or a settings one gone
        # from the code) is forgotten: a missed slot of it must not run now.
        _ensure_state(dialect, name, now)
        ScheduleState.objects.using(dialect.using).filter(name=name).update(
            last_slot=now, enqueued_slot=None, job_id=None, run_job_id=None, run_at=None,
            paused=paused, paused_at=now if paused else None,
        )  # fmt: skip

    try:
        atomically(dialect, txn)
    except IntegrityError:  # another add of the same name committed first
        raise ScheduleError(f"{label(name)} exists already.") from None
    return schedule


def remove(name: str) -> None:
    """Delete stored schedule `name` and where it stands; ScheduleError if there is none."""
    if name in settings_names():
        raise ScheduleError(
            f"Schedule {name!r} is one of JOBQUEUE['SCHEDULES'] (or of @jobqueue.schedule): "
            "remove it from the code, or pause it."
        )
    dialect = _dialect()

    def txn() -> int:
        deleted, _ = ScheduleDefinition.objects.using(dialect.using).filter(name=name).delete()
        if deleted:
            ScheduleState.objects.using(dialect.using).filter(name=name).delete()
        return deleted

    if not atomically(dialect, txn):
        raise ScheduleError(f"No stored schedule is named {name!r}.")


def exists(name: str, using: str | None = None) -> bool:
    """Whether a schedule (of the settings or a row) is named `name`."""
    using = using or conf.get().database
    return (
        name in settings_names()
        or ScheduleDefinition.objects.using(using).filter(name=name).exists()
    )


def _ensure_state(dialect: Dialect, name: str, now: dt.datetime) -> None:
    ScheduleState.objects.using(dialect.using).bulk_create(
        [ScheduleState(name=name, last_slot=now)], ignore_conflicts=True
    )


def _set_paused(dialect: Dialect, name: str, now: dt.datetime) -> bool:
    _ensure_state(dialect, name, now)
    return bool(
        ScheduleState.objects.using(dialect.using)
        .filter(name=name, paused=False)
        .update(paused=True, paused_at=now)
    )


def pause(name: str) -> bool:
    """Pause schedule `name`: no worker enqueues its slots until it is resumed.

    Return False if it was paused already; ScheduleError if there is no such schedule. A slot
    a worker is enqueueing as this commits is enqueued; none after.
    """
    dialect = _dialect()
    if not exists(name, dialect.using):
        raise ScheduleError(f"No schedule is named {name!r}.")
    now = _now(dialect)
    return atomically(dialect, lambda: _set_paused(dialect, name, now))


def resume(name: str) -> bool:
    """Resume paused schedule `name`: its next slot after now runs (those it missed do not).

    Return False if it was not paused; ScheduleError if there is no such schedule.
    """
    dialect = _dialect()
    if not exists(name, dialect.using):
        raise ScheduleError(f"No schedule is named {name!r}.")
    now = _now(dialect)

    def txn() -> bool:
        states = ScheduleState.objects.using(dialect.using).filter(name=name, paused=True)
        last = dialect.lock_blocking(states).values_list("last_slot", flat=True).first()
        if last is None:
            return False
        states.update(paused=False, paused_at=None, last_slot=max(last, now))
        return True

    return atomically(dialect, txn)


def find(name: str) -> Schedule:
    """The schedule named `name` (settings first, then rows); ScheduleError if none is, or if
    it is not valid (now)."""
    if name in settings_names():
        try:
            return next(s for s in schedules.configured() if s.name == name)
        except ImproperlyConfigured as exc:
            raise ScheduleError(str(exc)) from None
    row = ScheduleDefinition.objects.using(conf.get().database).filter(name=name).first()
    if row is None:
        raise ScheduleError(f"No schedule is named {name!r}.")
    return check(name, raw_of(row))


def run_now(name: str) -> Job:
    """Enqueue one job of schedule `name` now, paused or not; return it.

    The job has the schedule's handler, arguments and options but no unique key: it takes
    no slot, and the schedule's next slot runs as it would have. ScheduleError if there is no
    such schedule (or it is not valid).
    """
    schedule = find(name)
    dialect = _dialect()
    now = _now(dialect)

    def txn() -> Job:
        job = enqueue_job(schedule, None)
        _ensure_state(dialect, name, now)
        ScheduleState.objects.using(dialect.using).filter(name=name).update(
            run_job_id=job.pk, run_at=now
        )
        return job

    return atomically(dialect, txn)


def enqueue_job(schedule: Schedule, slot: dt.datetime | None) -> Job:
    """Enqueue a job of `schedule`: the job of `slot` (its unique key names the slot), or a
    job outside the slots (None). A task's goes through its backend, so its signals are sent.
    """
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


@dataclasses.dataclass
class Stored:
    """The rows as a worker or a page reads them: the valid ones, and what is wrong with the
    others (by name), a row named like a settings schedule included."""

    schedules: list[Schedule]
    problems: dict[str, str]


class RowCache:
    """Parses each row once while it does not change (a worker reads them every few seconds)."""

    def __init__(self) -> None:
        self._parsed: dict[str, tuple[str, Schedule | str]] = {}

    def read(self, using: str) -> Stored:
        """Read the rows of `using`; parse those that are new or changed."""
        taken = settings_names()
        found, problems, parsed = [], {}, {}
        rows = ScheduleDefinition.objects.using(using).order_by("name").values("name", *KEYS)
        for row in rows:
            name, raw = row["name"], raw_of(row)
            key = json.dumps(raw, sort_keys=True, default=str)
            cached = self._parsed.get(name)
            if cached is not None and cached[0] == key:
                outcome = cached[1]
            else:
                try:
                    outcome = check(name, raw) if name not in taken else _clash(name)
                except ScheduleError as exc:
                    outcome = str(exc)
            parsed[name] = (key, outcome)
            if isinstance(outcome, Schedule):
                found.append(outcome)
            else:
                problems[name] = outcome
        self._parsed = parsed
        return Stored(found, problems)


def _clash(name: str) -> str:
    return (
        f"{label(name)} is ignored: JOBQUEUE['SCHEDULES'] (or @jobqueue.schedule) has a "
        "schedule of that name. Remove the row (jobqueue_schedules remove, or the admin)."
    )


def stored(using: str | None = None) -> Stored:
    """The stored schedules, read now."""
    return RowCache().read(using or conf.get().database)


# -- what operators see of every schedule ---------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Standing:
    """Where one schedule stands, as `jobqueue_schedules` and the admin's Schedules page show
    it: when it runs, its next slots and its last enqueued one (in its time zone)."""

    schedule: Schedule
    when: str  # "every 30s", or "cron '0 3 * * *' (Europe/Paris)"
    next_slots: list[dt.datetime]
    last_enqueued: dt.datetime | None
    last_job_id: int | None
    stored: bool = False  # a row (schedule_rows.py), not the settings' or the decorator's
    paused_at: dt.datetime | None = None  # paused since then (None: not paused)
    run_at: dt.datetime | None = None  # the last "run now", and its job
    run_job_id: int | None = None
    outcome_job_id: int | None = None  # the later of the two jobs, and its state now
    outcome: str | None = None  # a job state, or "deleted" (pruned) ; None: no job yet
    now: dt.datetime | None = None  # the schedules' clock when this was read

    @property
    def paused(self) -> bool:
        return self.paused_at is not None


def standings(dialect: Dialect, count: int = 1) -> list[Standing]:
    """Every schedule, of the settings (ImproperlyConfigured if one is bad) and the valid
    stored ones, with its next `count` slots after the schedules' clock's now, the last slot a
    worker enqueued, and the state of its last job (ScheduleState)."""
    found = schedules.configured()
    names = {s.name for s in found}
    rows = stored(dialect.using).schedules
    found = sorted(found + [s for s in rows if s.name not in names], key=lambda s: s.name)
    stored_names = {s.name for s in rows} - names
    now = schedules.clock(dialect)()
    states = {s.name: s for s in ScheduleState.objects.using(dialect.using)}
    latest = {
        name: max(pk for pk in (s.job_id, s.run_job_id) if pk is not None)
        for name, s in states.items()
        if s.job_id is not None or s.run_job_id is not None
    }
    outcomes = dict(
        Job.objects.using(dialect.using)
        .filter(pk__in=set(latest.values()))
        .values_list("pk", "state")
    )
    result = []
    for schedule in found:
        when = schedule.describe()
        slots, moment = [], now
        for _ in range(count):
            moment = schedule.next_after(moment)
            slots.append(moment.astimezone(schedule.timezone))
        state = states.get(schedule.name)
        pk = latest.get(schedule.name)
        extra: dict[str, Any] = {"stored": schedule.name in stored_names, "now": now}
        if pk is not None:
            extra.update(outcome_job_id=pk, outcome=outcomes.get(pk, "deleted"))
        if state is not None:
            paused_at = (state.paused_at or state.updated_at) if state.paused else None
            extra.update(paused_at=paused_at, run_at=state.run_at, run_job_id=state.run_job_id)
        if state is None or state.enqueued_slot is None:
            result.append(Standing(schedule, when, slots, None, None, **extra))
        else:
            last = state.enqueued_slot.astimezone(schedule.timezone)
            result.append(Standing(schedule, when, slots, last, state.job_id, **extra))
    return result
