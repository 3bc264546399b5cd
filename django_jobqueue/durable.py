"""Durable calls of a running job: steps kept across runs, sleeps and waits that suspend the
job, children spawned at run time, progress.

A handler that takes a context runs again from the top on each run of its job: a retry, a
reclaim after a crash, a resume after a suspension. Each durable call is known by its name
and by how many times this run called that name before (`seq`: 1, 2, ...); what it returned
is kept in a JobStep row, written in the transaction of the call and fenced by the job's
lease, so that a later run gets it back without doing the work again. Whatever a handler does
outside durable calls runs again on every run.

A sleep or a wait that has to wait raises `Suspend`. The handler stops there; the worker
records the suspension (`leases.suspend`): the job goes back to `scheduled` or `waiting`,
holds no lease and no place under any limit, and has not used an attempt. It runs again when
it is due, when its event is sent, or when the jobs it waits for are final.

Internal records have names that start with "@" (a user's step name cannot).
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, InterfaceError

from . import events, validation
from .dialects.base import read_json
from .exceptions import (
    InvalidJobError,
    LeaseLost,
    ResultNotStored,
    Suspend,
    UpstreamFailed,
    WaitTimeout,
)
from .models import Job, JobStep

if TYPE_CHECKING:
    from .context import JobContext
    from .dialects import Dialect
    from .leases import Lease
    from .records import ClaimedJob

logger = logging.getLogger(__name__)

SLEEP, EVENT, SPAWN, WAIT = "@sleep", "@event", "@spawn", "@wait"
# Records read with a claim, per resumed job on average (see `preload`).
PRELOAD_ROWS = 20
# Seconds between two writes of one job's progress: the latest value in between is kept and
# written by the next call after that, or when the run ends.
PROGRESS_EVERY = 1.0
MISSING: Any = object()


class Stored:
    """A record's result as the claim's read returned it, decoded at first use (a resumed
    sleep only asks whether its record is there)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


class Calls:
    """The durable calls of one run: what earlier runs recorded, and the count of each name."""

    def __init__(
        self,
        dialect: Dialect,
        job_id: int,
        has_steps: bool = True,
        recorded: dict[tuple[str, int], Any] | None = None,
    ) -> None:
        self.dialect = dialect
        self.job_id = job_id
        self.has_steps = has_steps  # the job's row says so already (no need to mark it)
        # None: read at the run's first durable call; {} when the claim said there is none;
        # `recorded` when the worker read them with the claim (`preload`).
        if recorded is None and not has_steps:
            recorded = {}
        self._recorded = recorded
        self._counts: Counter[str] = Counter()

    def next(self, name: str, *, decode: bool = True) -> tuple[int, Any]:
        """Number this run's next call of `name`; return (seq, its record or MISSING).

        With `decode=False` a record read with the claim may come back as `Stored` (the
        caller only asks whether there is one).
        """
        if self._recorded is None:  # read once, at a run's first durable call
            rows = JobStep.objects.using(self.dialect.using).filter(job_id=self.job_id)
            self._recorded = {(n, s): r for n, s, r in rows.values_list("name", "seq", "result")}
        self._counts[name] += 1
        seq = self._counts[name]
        found = self._recorded.get((name, seq), MISSING)
        if decode and type(found) is Stored:
            found = self._recorded[(name, seq)] = read_json(found.value)
        return seq, found

    def recorded(self) -> dict[tuple[str, int], Any]:
        """Every record of the job, decoded (read at the first call that needs them)."""
        if self._recorded is None:
            rows = JobStep.objects.using(self.dialect.using).filter(job_id=self.job_id)
            self._recorded = {(n, s): r for n, s, r in rows.values_list("name", "seq", "result")}
        for key, value in self._recorded.items():
            if type(value) is Stored:
                self._recorded[key] = read_json(value.value)
        return self._recorded

    def remember(self, name: str, seq: int, result: Any) -> None:
        """Keep the result just recorded (its transaction committed)."""
        assert self._recorded is not None
        self._recorded[(name, seq)] = result
        self.has_steps = True


def preload(dialect: Dialect, jobs: Sequence[ClaimedJob]) -> None:
    """Read the records of the claimed `jobs` that have some, in one query: set each one's
    `records`, which its run then uses instead of a read of its own.

    A resumed job's run (after a sleep, say) otherwise begins with a round trip of its own:
    with short resumes that read was most of their cost. At most PRELOAD_ROWS rows a job on
    average are read; a job whose rows may not all have come is left to read its own. A read
    that fails leaves them all to do so (their leases are held: nothing may be lost here).
    """
    ids = sorted(job.id for job in jobs if job.has_steps)
    if not ids:
        return
    cap = PRELOAD_ROWS * len(ids)
    try:
        rows = dialect.read_records(ids, cap + 1)
    except (DatabaseError, InterfaceError) as exc:
        logger.debug("Could not read the records of %s claimed job(s): %s", len(ids), exc)
        return
    # Read in job order: when the cap cut the read short, the last job's rows (and those of
    # the jobs after it) may be missing.
    complete_below = rows[-1][0] if len(rows) > cap else None
    found: dict[int, dict[tuple[str, int], Any]] = {pk: {} for pk in ids}
    for job_id, name, seq, result in rows:
        found[job_id][(name, seq)] = Stored(result)
    for job in jobs:
        if job.has_steps and (complete_below is None or job.id < complete_below):
            job.records = found[job.id]


def fence(dialect: Dialect, lease: Lease) -> None:
    """Lock the job's row while `lease` is current (in the caller's transaction); else LeaseLost."""
    found = dialect.lock_blocking(Job.objects.using(dialect.using).filter(lease.q()))
    if not found.values_list("pk", flat=True).first():
        raise _lease_lost(lease)


def _lease_lost(lease: Lease) -> LeaseLost:
    return LeaseLost(
        f"job {lease.job_id} attempt {lease.attempt} of {lease.owner} no longer holds "
        "its lease: nothing was recorded"
    )


def write(ctx: JobContext, name: str, seq: int, result: Any, duration: float | None) -> None:
    """Insert the record of a call, fenced by the lease (the job's row stays locked until the
    caller's transaction ends); else LeaseLost."""
    dialect, lease = ctx._dialect, ctx._lease
    recorded = dialect.record_call(
        job_id=lease.job_id,
        owner=lease.owner,
        attempt=lease.attempt,
        name=name,
        seq=seq,
        result=result,
        duration=duration,
    )
    if not recorded:
        raise _lease_lost(lease)
    if not ctx._calls.has_steps:  # the job's first record: say so on its row (for the claim)
        Job.objects.using(dialect.using).filter(pk=lease.job_id).update(has_steps=True)


def _record(ctx: JobContext, name: str, seq: int, result: Any, pending: Any = MISSING) -> None:
    """Write one record in a transaction of its own, fenced by the lease; `pending`: the
    record a suspension wrote for this call, which this one replaces."""
    dialect, lease = ctx._dialect, ctx._lease
    with dialect.step_transaction():
        if pending is MISSING:
            write(ctx, name, seq, result, None)
        else:
            fence(dialect, lease)
            rows = JobStep.objects.using(dialect.using)
            rows.filter(job_id=lease.job_id, name=name, seq=seq).update(result=result)
    ctx._calls.remember(name, seq, result)


def step(ctx: JobContext, name: str, fn: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    """ctx.step(): `fn`'s result, from the record of an earlier run or by calling it."""
    validation.check_label("step name", name, 200)
    if name.startswith("@"):
        raise InvalidJobError(f"step names starting with '@' are reserved, not {name!r}")
    seq, found = ctx._calls.next(name)
    if found is not MISSING:
        return copy.deepcopy(found)
    dialect, lease = ctx._dialect, ctx._lease
    started = time.monotonic()
    with dialect.step_transaction():
        result = fn(*args, **kwargs)
        problem = validation.json_problem(result, "the result", ctx._max_result_bytes)
        if problem:
            raise ResultNotStored(
                f"step {name!r} (call {seq}) of job {lease.job_id} cannot store its result: "
                f"{problem}"
            )
        # What a later run will read back: the result as JSON gives it (tuples as lists,
        # keys as strings), returned now too, so that the first run sees what replays see.
        value = None if result is None else json.loads(json.dumps(result))
        write(ctx, name, seq, value, time.monotonic() - started)
    ctx._calls.remember(name, seq, value)
    return copy.deepcopy(value)


def sleep_until(
    ctx: JobContext, until: dt.datetime | None, seconds: float | dt.timedelta | None
) -> None:
    """ctx.sleep() and ctx.sleep_until(): return once the time has come, else suspend."""
    if seconds is not None:
        seconds = validation.check_seconds("sleep", seconds)
    elif until is not None:
        until = validation.check_datetime("sleep_until", until)
    seq, found = ctx._calls.next(SLEEP, decode=False)
    # Recorded: the record was written with the suspension, and this run is the resume that
    # the promoter made once the time had come (by the database clock). No clock is read.
    if ctx._ignore_delays or found is not MISSING:
        return
    if seconds is not None:  # the suspension sets run_after from the database's now
        raise Suspend("sleep", delay=seconds, records=[(SLEEP, seq, {"seconds": seconds})])
    assert until is not None
    raise Suspend("sleep", until=until, records=[(SLEEP, seq, {"until": until.isoformat()})])


def wait_for_event(ctx: JobContext, key: str, timeout: float | dt.timedelta | None) -> Any:
    """ctx.wait_for_event(): the event's payload, WaitTimeout, or suspend until either."""
    validation.check_label("event key", key, 255)
    if timeout is not None:
        timeout = validation.check_seconds("timeout", timeout)
    seq, found = ctx._calls.next(EVENT)
    if found is not MISSING and "payload" in found:
        return copy.deepcopy(found["payload"])
    if found is not MISSING and found.get("timed_out"):
        raise WaitTimeout(f"no event {key!r} within {found.get('timeout')}s")
    sent, payload = events.sent_payload(ctx._dialect, key)
    if sent:
        _record(ctx, EVENT, seq, {"key": key, "payload": payload}, found)
        return copy.deepcopy(payload)
    now = ctx._dialect.now()
    if found is not MISSING:
        until = dt.datetime.fromisoformat(found["until"]) if found.get("until") else None
    else:
        until = None if timeout is None else now + dt.timedelta(seconds=timeout)
    if until is not None and now >= until:
        if found is not MISSING:
            timeout = found.get("timeout")
        _record(ctx, EVENT, seq, {"key": key, "timed_out": True, "timeout": timeout}, found)
        raise WaitTimeout(f"no event {key!r} within {timeout}s")
    records = []
    if found is MISSING:
        pending = {"key": key, "until": None if until is None else until.isoformat()}
        records = [(EVENT, seq, {**pending, "timeout": timeout})]
    raise Suspend("event", key=key, until=until, records=records)


def job_ids(jobs: Iterable[Any]) -> list[int]:
    """The ids of `jobs` (Job instances or ids), checked."""
    ids = []
    for job in jobs:
        pk = job.pk if isinstance(job, Job) else job
        if not isinstance(pk, int) or isinstance(pk, bool) or not 1 <= pk <= validation.ID_MAX:
            raise InvalidJobError(f"wait_for takes jobs or job ids, not {job!r}")
        ids.append(pk)
    return sorted(set(ids))


def wait_for(ctx: JobContext, jobs: Iterable[Any]) -> dict[int, Any]:
    """ctx.wait_for(): {job id: result} once every job is final, or suspend until then."""
    ids = job_ids(jobs)
    if ctx.job_id in ids:
        raise InvalidJobError("a job cannot wait for itself")
    seq, found = ctx._calls.next(WAIT)
    if found is MISSING or found.get("ids") != ids:
        rows = Job.objects.using(ctx._dialect.using).filter(pk__in=ids)
        states = dict(rows.values_list("pk", "state"))
        missing = sorted(set(ids) - states.keys())
        if missing:
            raise InvalidJobError(f"wait_for: job(s) {missing} do not exist")
        if any(state not in Job.TERMINAL_STATES for state in states.values()):
            _check_no_deadlock(ctx, ids)
            raise Suspend("jobs", job_ids=ids)
        found = {"ids": ids, "states": {str(pk): state for pk, state in sorted(states.items())}}
        _record(ctx, WAIT, seq, found)
    failed = [(int(pk), s) for pk, s in found["states"].items() if s != Job.State.DONE]
    if failed:
        pk, state = failed[0]
        raise UpstreamFailed(f"job {pk} ended {state}")
    results = Job.objects.using(ctx._dialect.using).filter(pk__in=ids)
    return dict(results.values_list("pk", "result"))


def spawn(ctx: JobContext, key: str | None, args: Any, options: dict[str, Any]) -> Job:
    """ctx.spawn(): the child this call enqueued, in this run or an earlier one."""
    from .enqueuing import spawn_child

    if "type" in options:  # enqueue()'s name for the key
        if key is not None:
            raise InvalidJobError("spawn() takes the handler key once: as `key` or as `type`")
        key = options.pop("type")
    if key is None:
        raise InvalidJobError("spawn() needs the child's handler key")
    type = key

    seq, found = ctx._calls.next(SPAWN)
    if found is not MISSING:
        return Job.objects.using(ctx._dialect.using).get(pk=found["job_id"])
    dialect, lease = ctx._dialect, ctx._lease
    with dialect.step_transaction():
        fence(dialect, lease)
        child = spawn_child(lease.job_id, type, args, options)
        write(ctx, SPAWN, seq, {"job_id": child.pk, "type": type}, None)
    ctx._calls.remember(SPAWN, seq, {"job_id": child.pk, "type": type})
    return child


class Progress:
    """A run's progress: written at most every PROGRESS_EVERY seconds, and when it ends."""

    def __init__(self) -> None:
        self.pending: dict[str, Any] | None = None
        self.written_at = -PROGRESS_EVERY

    def set(self, ctx: JobContext, current: float, total: float | None, message: str) -> None:
        self.pending = {
            "current": validation.check_number("progress current", current),
            "total": None if total is None else validation.check_number("progress total", total),
            "message": validation.check_label("progress message", message, 1000, allow_empty=True),
        }
        if time.monotonic() - self.written_at >= PROGRESS_EVERY:
            self.flush(ctx)

    def flush(self, ctx: JobContext) -> None:
        """Write the pending progress (one UPDATE, fenced by the lease; lost lease: nothing)."""
        if self.pending is None:
            return
        value = {**self.pending, "updated_at": ctx._dialect.now().isoformat()}
        self.pending, self.written_at = None, time.monotonic()
        jobs = Job.objects.using(ctx._dialect.using)
        jobs.filter(ctx._lease.q()).update(progress=value)


def _check_no_deadlock(ctx: JobContext, ids: list[int]) -> None:
    """Refuse to wait for a job that cannot finish before this one (it would wait forever)."""
    from .enqueuing import waits_for

    after = set().union(*waits_for(ctx._dialect.using, [ctx.job_id]))
    stuck = sorted(after.intersection(ids))
    if stuck:
        raise InvalidJobError(
            f"job {ctx.job_id} cannot wait for job(s) {stuck}: they wait for it to finish"
        )
