"""Durable calls of a running job: steps kept across runs, sleeps and waits that suspend the
job, children spawned at run time, progress.

A handler that takes a context runs again from the top on each run of its job: a retry, a
reclaim after a crash, a resume after a suspension. Each durable call is known by its name
and by how many times this run called that name before (`seq`: 1, 2, ...), and takes the
run's next place, which its replays check (`replay`); what it returned is kept in a JobStep
row, written in the transaction of the call and fenced by the job's lease, so that a later
run gets it back without doing the work again. Whatever a handler does outside durable calls
runs again on every run.

A sleep or a wait that has to wait raises `Suspend`. The handler stops there; the worker
records the suspension (`leases.suspend`): the job goes back to `scheduled` or `waiting`,
holds no lease and no place under any limit, and has not used an attempt. It runs again when
it is due, when its event is sent, or when the jobs it waits for are final.

Each call is written once, as a plan (a generator) that decides and yields the parts that
touch the database: `run()` calls those in the handler's thread (a sync handler), `arun()`
awaits them through asgiref's `sync_to_async`, on the job's sync-call thread (an async
handler), so that both kinds of handler write the same records and nothing blocks the loop.

Internal records have names that start with "@" (a user's step name cannot).
"""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import functools
import json
import time
import weakref
from collections.abc import Callable, Generator, Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

from asgiref.sync import iscoroutinefunction, sync_to_async
from django.db import DatabaseError

from .. import telemetry, validation
from ..exceptions import InvalidJobError, ResultNotStored, Suspend, UpstreamFailed, WaitTimeout
from ..models import Job, JobStep
from . import events, fanout

# The records a run replays, and their check (re-exported: their home before `replay`).
from .replay import EVENT as EVENT
from .replay import MISSING as MISSING
from .replay import PATCH as PATCH
from .replay import PRELOAD_ROWS as PRELOAD_ROWS
from .replay import SLEEP as SLEEP
from .replay import SPAWN as SPAWN
from .replay import WAIT as WAIT
from .replay import Calls as Calls
from .replay import Stored as Stored
from .replay import fence as fence
from .replay import lease_lost as lease_lost
from .replay import preload as preload
from .replay import write as write

if TYPE_CHECKING:
    from ..dialects import Dialect
    from .context import JobContext

# A call's plan: it yields its database parts (each a function of no argument, or a step's
# Work) and is sent back what each returned; it returns the call's result.
type Plan[T] = Generator[Callable[[], Any] | Work, Any, T]

# Seconds between two writes of one job's progress: the latest value in between is kept and
# written by the next call after that, or when the run ends.
PROGRESS_EVERY = 1.0
FLUSH_TRIES = 3  # transactions of deferred records tried, on lock contention


def _record(
    ctx: JobContext,
    name: str,
    seq: int,
    result: Any,
    pending: Any = MISSING,
    duration: float | None = None,
) -> None:
    """Write one record in a transaction of its own, fenced by the lease; `pending`: the
    record a suspension wrote for this call, which this one replaces."""
    dialect, lease = ctx._dialect, ctx._lease
    if pending is MISSING:
        with dialect.record_transaction():
            write(ctx, name, seq, result, duration)
    else:
        with dialect.step_transaction():
            fence(dialect, lease)
            rows = JobStep.objects.using(dialect.using)
            rows.filter(job_id=lease.job_id, name=name, seq=seq).update(result=result)
    ctx._calls.remember(name, seq, result)


# -- records deferred to the job's next round trip -----------------------------------------------


class Deferred(NamedTuple):
    """The record of a call that need not be written at once (a settlement that gives units
    back, or none), with its rows: it goes at the head of the job's next write (its next
    grant's transaction), before its next durable call, or when its run ends (`flush`),
    whichever comes first. `written` runs once it is committed."""

    statements: list[tuple[str, list[Any]]]  # the record first (fenced by the lease), its rows
    written: Callable[[], None]


def deferred(ctx: JobContext) -> tuple[list[Deferred], list[tuple[str, list[Any]]]]:
    """The deferred records of `ctx` and their statements, in order, to write with others;
    none inside a transaction the handler opened (`atomic()`), whose fate they must not share:
    they wait for the job's next write outside it, or the end of its run."""
    if in_handlers_transaction(ctx):
        return [], []
    taken = list(ctx._deferred)
    return taken, [statement for item in taken for statement in item.statements]


def in_handlers_transaction(ctx: JobContext) -> bool:
    """Whether the handler has a transaction of its own open (`atomic()`) on the job's database."""
    return bool(ctx._dialect.connection.in_atomic_block)


def check_deferred(ctx: JobContext, taken: list[Deferred], counts: list[Any]) -> None:
    """LeaseLost (nothing of them was written: all are fenced) unless each record of `taken`
    was written (`counts`: the row counts of their statements, in order)."""
    at = 0
    for item in taken:
        if not counts[at]:
            raise lease_lost(ctx._lease)
        at += len(item.statements)


def deferred_written(ctx: JobContext, taken: list[Deferred]) -> None:
    """Forget `taken` (their transaction committed) and run what follows each."""
    del ctx._deferred[: len(taken)]
    for item in taken:
        item.written()


def flush(ctx: JobContext) -> None:
    """Write the deferred records of `ctx`, in a transaction of their own; LeaseLost, writing
    nothing, if the lease is gone. Not inside a transaction the handler opened (`deferred`).

    Where the database must not take them in one transaction (`can_defer_into_grant` off:
    MySQL's AUTO-INC and row locks of two spend upserts in one transaction deadlock with
    another job's), each goes in its own. A transaction that fails on lock contention is
    retried whole (it wrote nothing), a few times."""
    taken, _ = deferred(ctx)
    if not taken:
        return
    dialect = ctx._dialect
    groups = [taken] if dialect.can_defer_into_grant else [[item] for item in taken]
    for group in groups:
        statements = [statement for item in group for statement in item.statements]
        for attempt in range(1, FLUSH_TRIES + 1):
            try:
                counts = dialect.write_alone(statements)
                break
            except DatabaseError as exc:
                if attempt == FLUSH_TRIES or not dialect.is_transient(exc):
                    raise
                time.sleep(dialect.transient_backoff * attempt)
        check_deferred(ctx, group, counts)
        deferred_written(ctx, group)


# -- running a plan ------------------------------------------------------------------------------


def run[T](plan: Plan[T]) -> T:
    """Carry out `plan` in this thread (a sync handler's): call each database part here."""
    try:
        part = next(plan)
        while True:
            part = plan.send(part())
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def _call_part[T](part: Callable[[], T]) -> T:
    return part()


# Thread-sensitive: in a worker, on the job's sync-call thread (worker/sync_calls.py), where
# its ORM calls run too; under async_to_sync (run_jobs, a Django task), on the calling thread.
_in_thread = in_thread = sync_to_async(_call_part, thread_sensitive=True)


async def arun[T](plan: Plan[T]) -> T:
    """Carry out `plan` in an async handler: await each database part off the event loop."""
    try:
        part = next(plan)
        while True:
            if isinstance(part, Work):
                part = plan.send(await part.awaited())
            else:
                part = plan.send(await _in_thread(part))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


# -- the records of async functions' steps, written together -------------------------------------

# (context, name, seq, result, duration) of a record to write.
type Record = tuple[JobContext, str, int, Any, float | None]


class Batch:
    """The records of async functions' steps waiting to be written, on one event loop.

    Async jobs share a few sync-call threads (worker/sync_calls.py): one round trip a record
    would queue behind the other jobs' records. The first step to wait writes every record
    waiting by then (`write_records`: one statement where the dialect can), on its own
    sync-call thread; the steps that came meanwhile wait, and one of them writes the next.
    """

    def __init__(self) -> None:
        self.waiting: list[tuple[Record, asyncio.Future[None]]] = []
        self.writing: asyncio.Future[None] | None = None  # done when the batch being written is

    @classmethod
    def of(cls, dialect: Dialect) -> Batch:
        """The batch of `dialect`'s records on the running loop."""
        batches = _batches.setdefault(asyncio.get_running_loop(), {})
        return batches.setdefault(dialect.using, cls())

    async def record(self, record: Record) -> None:
        """Write `record` (with the others waiting); LeaseLost if its lease is gone."""
        recorded = asyncio.get_running_loop().create_future()
        self.waiting.append((record, recorded))
        try:
            while not recorded.done():
                if self.writing is None:
                    await self._write()
                else:  # not cancelled with a waiter: it is the batch's
                    await asyncio.wait([self.writing])
        except asyncio.CancelledError:
            self.waiting = [item for item in self.waiting if item[1] is not recorded]
            raise
        recorded.result()

    async def _write(self) -> None:
        batch, self.waiting = self.waiting, []
        writing = self.writing = asyncio.get_running_loop().create_future()
        outcomes: list[BaseException | None] = []  # filled by the thread once it committed
        try:
            await _in_thread(functools.partial(write_records, [r for r, _ in batch], outcomes))
        except Exception as exc:
            outcomes = outcomes or [exc] * len(batch)
        except BaseException:  # cancelled before the thread ended: it may not have begun
            if not outcomes:
                self.waiting[:0] = [item for item in batch if not item[1].cancelled()]
            raise
        finally:
            for (_, recorded), outcome in zip(batch, outcomes, strict=False):
                if recorded.done():
                    continue
                if outcome is None:
                    recorded.set_result(None)
                else:
                    recorded.set_exception(outcome)
            self.writing = None
            writing.set_result(None)


_batches: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, Batch]] = (
    weakref.WeakKeyDictionary()
)


def write_records(records: list[Record], outcomes: list[BaseException | None]) -> None:
    """Write `records` together, each fenced by its job's lease; append to `outcomes`, for
    each, None or its error (LeaseLost, ...).

    When the batch fails, each record is written alone: one that cannot be stored fails only
    its own step.
    """
    if len(records) == 1:  # its own statement is the cheaper
        outcomes.append(_alone(*records[0]))
        return
    dialect = records[0][0]._dialect
    results: list[BaseException | None] = []
    try:
        with dialect.record_transaction():
            written = dialect.record_calls(
                [
                    (
                        ctx.job_id,
                        ctx.worker_id,
                        ctx.attempt,
                        name,
                        seq,
                        ctx._calls.place_of(name, seq),
                        result,
                        duration,
                        not ctx._calls.has_steps,
                    )  # the lease, the record, the first one's mark
                    for ctx, name, seq, result, duration in records
                ]
            )
        for ctx, name, seq, result, _ in records:
            if ctx.job_id in written:
                ctx._calls.remember(name, seq, result)
                results.append(None)
            else:
                results.append(lease_lost(ctx._lease))
    except Exception:
        results = [_alone(*record) for record in records]
    outcomes.extend(results)


def _alone(
    ctx: JobContext, name: str, seq: int, result: Any, duration: float | None
) -> Exception | None:
    try:
        _record(ctx, name, seq, result, duration=duration)
    except Exception as exc:
        return exc
    return None


# -- the calls -----------------------------------------------------------------------------------


def _next(ctx: JobContext, name: str, *, decode: bool = True) -> Plan[tuple[int, Any]]:
    """Number this run's next call of `name`, reading the job's records first if needed (and
    writing the deferred ones before, so that a record never goes in ahead of an earlier one)."""
    if ctx._deferred:
        yield functools.partial(flush, ctx)
    if not ctx._calls.read:
        yield ctx._calls.load
    return ctx._calls.next(name, decode=decode)


class Work:
    """A step not recorded yet: its function, then its record.

    Called (in a thread), the function runs in the step's transaction, so that its writes and
    the record commit together. Awaited (`awaited`, in an async handler), a coroutine function
    is awaited on the loop and its record then written (`Batch`); a plain function is called
    as above, on the job's sync-call thread.
    """

    __slots__ = ("args", "ctx", "fn", "kwargs", "name", "seq")

    def __init__(
        self, ctx: JobContext, name: str, seq: int, fn: Callable[..., Any], args: Any, kwargs: Any
    ) -> None:
        self.ctx, self.name, self.seq = ctx, name, seq
        self.fn, self.args, self.kwargs = fn, args, kwargs

    def __call__(self) -> Any:
        hooks = telemetry.active
        if hooks is None:
            return self._call()
        with hooks.step(self.name, self.seq):
            return self._call()

    def _call(self) -> Any:
        ctx = self.ctx
        started = time.monotonic()
        with ctx._dialect.step_transaction():
            value = self._stored(self.fn(*self.args, **self.kwargs))
            write(ctx, self.name, self.seq, value, time.monotonic() - started)
        ctx._calls.remember(self.name, self.seq, value)
        if ctx._lines.pending:  # a step boundary: the lines so far survive a crash after it
            ctx._lines.flush()
        return value

    async def awaited(self) -> Any:
        if not iscoroutinefunction(self.fn):
            return await _in_thread(self)  # its span is made there, in __call__
        hooks = telemetry.active
        if hooks is None:
            return await self._awaited()
        with hooks.step(self.name, self.seq):
            return await self._awaited()

    async def _awaited(self) -> Any:
        started = time.monotonic()
        value = self._stored(await self.fn(*self.args, **self.kwargs))
        record = (self.ctx, self.name, self.seq, value, time.monotonic() - started)
        await Batch.of(self.ctx._dialect).record(record)
        if self.ctx._lines.pending:  # a step boundary, as in _call
            await _in_thread(self.ctx._lines.flush)
        return value

    def _stored(self, result: Any) -> Any:
        """`result` as a later run will read it back; ResultNotStored if it cannot be."""
        problem = validation.json_problem(result, "the result", self.ctx._max_result_bytes)
        if problem:
            raise ResultNotStored(
                f"step {self.name!r} (call {self.seq}) of job {self.ctx.job_id} cannot store "
                f"its result: {problem}"
            )
        # What a later run will read back: the result as JSON gives it (tuples as lists,
        # keys as strings), returned now too, so that the first run sees what replays see.
        return None if result is None else json.loads(json.dumps(result))


def step_plan(
    ctx: JobContext, name: str, fn: Callable[..., Any], args: Any, kwargs: Any
) -> Plan[Any]:
    """ctx.step(): `fn`'s result, from the record of an earlier run or by calling it."""
    validation.check_label("step name", name, 200)
    if name.startswith("@"):
        raise InvalidJobError(f"step names starting with '@' are reserved, not {name!r}")
    seq, found = yield from _next(ctx, name)
    if found is MISSING:
        found = yield Work(ctx, name, seq, fn, args, kwargs)
    return copy.deepcopy(found)


def sleep_plan(
    ctx: JobContext, until: dt.datetime | None, seconds: float | dt.timedelta | None
) -> Plan[None]:
    """ctx.sleep() and ctx.sleep_until(): return once the time has come, else suspend."""
    if seconds is not None:
        seconds = validation.check_seconds("sleep", seconds)
    elif until is not None:
        until = validation.check_datetime("sleep_until", until)
    seq, found = yield from _next(ctx, SLEEP, decode=False)
    # Recorded: the record was written with the suspension, and this run is the resume that
    # the promoter made once the time had come (by the database clock). No clock is read.
    if ctx._ignore_delays or found is not MISSING:
        return
    place = ctx._calls.place_of(SLEEP, seq)
    if seconds is not None:  # the suspension sets run_after from the database's now
        raise Suspend("sleep", delay=seconds, records=[(SLEEP, seq, {"seconds": seconds}, place)])
    assert until is not None
    record = (SLEEP, seq, {"until": until.isoformat()}, place)
    raise Suspend("sleep", until=until, records=[record])


def event_plan(ctx: JobContext, key: str, timeout: float | dt.timedelta | None) -> Plan[Any]:
    """ctx.wait_for_event(): the event's payload, WaitTimeout, or suspend until either."""
    validation.check_label("event key", key, 255)
    if timeout is not None:
        timeout = validation.check_seconds("timeout", timeout)
    seq, found = yield from _next(ctx, EVENT)
    if found is not MISSING and "payload" in found:
        return copy.deepcopy(found["payload"])
    if found is not MISSING and found.get("timed_out"):
        raise WaitTimeout(f"no event {key!r} within {found.get('timeout')}s")
    sent, payload = yield functools.partial(events.sent_payload, ctx._dialect, key)
    if sent:
        yield functools.partial(_record, ctx, EVENT, seq, {"key": key, "payload": payload}, found)
        return copy.deepcopy(payload)
    now = yield ctx._dialect.now
    if found is not MISSING:
        until = dt.datetime.fromisoformat(found["until"]) if found.get("until") else None
    else:
        until = None if timeout is None else now + dt.timedelta(seconds=timeout)
    if until is not None and now >= until:
        if found is not MISSING:
            timeout = found.get("timeout")
        timed_out = {"key": key, "timed_out": True, "timeout": timeout}
        yield functools.partial(_record, ctx, EVENT, seq, timed_out, found)
        raise WaitTimeout(f"no event {key!r} within {timeout}s")
    records = []
    if found is MISSING:
        pending = {"key": key, "until": None if until is None else until.isoformat()}
        records = [(EVENT, seq, {**pending, "timeout": timeout}, ctx._calls.place_of(EVENT, seq))]
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


def wait_plan(
    ctx: JobContext, jobs: Iterable[Any], count: int | None = None, cancel_rest: bool = False
) -> Plan[dict[int, Any]]:
    """ctx.wait_for(): {job id: result} of the jobs final once every job (or `count` of them)
    is final, or suspend until then (see fanout.py)."""
    ids = job_ids(jobs)
    if ctx.job_id in ids:
        raise InvalidJobError("a job cannot wait for itself")
    count = fanout.check_count(count, ids)
    seq, found = yield from _next(ctx, WAIT)
    if found is MISSING or found.get("ids") != ids or found.get("count") != count:
        states = yield functools.partial(_states, ctx, ids)
        missing = sorted(set(ids) - states.keys())
        if missing:
            raise InvalidJobError(f"wait_for: job(s) {missing} do not exist")
        final = fanout.final_states(states)
        if len(final) < (len(ids) if count is None else count):
            yield functools.partial(_check_no_deadlock, ctx, ids)
            raise Suspend("jobs", job_ids=ids, count=count)
        if count is None:
            found = {"ids": ids, "states": {str(pk): state for pk, state in sorted(final.items())}}
            yield functools.partial(_record, ctx, WAIT, seq, found)
        else:
            found = yield functools.partial(
                fanout.end_wait, ctx, WAIT, seq, ids, count, final, cancel_rest
            )
    failed = [(int(pk), s) for pk, s in found["states"].items() if s != Job.State.DONE]
    if failed:
        pk, state = failed[0]
        raise UpstreamFailed(f"job {pk} ended {state}")
    results: dict[int, Any] = yield functools.partial(
        _results, ctx, sorted(int(pk) for pk in found["states"])
    )
    return results


def _states(ctx: JobContext, ids: list[int]) -> dict[int, str]:
    rows = Job.objects.using(ctx._dialect.using).filter(pk__in=ids)
    return dict(rows.values_list("pk", "state"))


def _results(ctx: JobContext, ids: list[int]) -> dict[int, Any]:
    rows = Job.objects.using(ctx._dialect.using).filter(pk__in=ids)
    return dict(rows.values_list("pk", "result"))


def spawn_plan(ctx: JobContext, key: str | None, args: Any, options: dict[str, Any]) -> Plan[Job]:
    """ctx.spawn(): the child this call enqueued, in this run or an earlier one."""
    if "type" in options:  # enqueue()'s name for the key
        if key is not None:
            raise InvalidJobError("spawn() takes the handler key once: as `key` or as `type`")
        key = options.pop("type")
    if key is None:
        raise InvalidJobError("spawn() needs the child's handler key")
    seq, found = yield from _next(ctx, SPAWN)
    child: Job
    if found is not MISSING:
        child = yield functools.partial(_spawned, ctx, found["job_id"])
    else:
        child = yield functools.partial(_spawn, ctx, seq, key, args, options)
    return child


def _spawned(ctx: JobContext, pk: int) -> Job:
    return Job.objects.using(ctx._dialect.using).get(pk=pk)


def _spawn(ctx: JobContext, seq: int, type: str, args: Any, options: dict[str, Any]) -> Job:
    """Enqueue the child and record the call, in one transaction fenced by the lease."""
    from .enqueuing import spawn_child

    dialect, lease = ctx._dialect, ctx._lease
    with dialect.step_transaction():
        fence(dialect, lease)
        child = spawn_child(lease.job_id, type, args, options)
        write(ctx, SPAWN, seq, {"job_id": child.pk, "type": type}, None)
    ctx._calls.remember(SPAWN, seq, {"job_id": child.pk, "type": type})
    return child


def patch_plan(ctx: JobContext, patch_id: str) -> Plan[bool]:
    """ctx.patched(): whether this job takes the path of the code deployed with the patch."""
    validation.check_label("patch id", patch_id, 200)
    if not ctx._calls.read:
        yield ctx._calls.load
    answer, place = ctx._calls.patch(patch_id)
    if place is not None and ctx._deferred:
        yield functools.partial(flush, ctx)
    if place is not None:  # the first run to reach it: its answer, recorded at its place
        yield functools.partial(_record, ctx, PATCH, place, {"patch": patch_id})
    return answer


def progress_plan(ctx: JobContext, current: float, total: float | None, message: str) -> Plan[None]:
    """ctx.progress(): keep the new progress, and write it if the last write is old enough."""
    if ctx._progress.set(current, total, message):
        yield functools.partial(ctx._progress.flush, ctx)


class Progress:
    """A run's progress: written at most every PROGRESS_EVERY seconds, and when it ends."""

    def __init__(self) -> None:
        self.pending: dict[str, Any] | None = None
        self.written_at = -PROGRESS_EVERY

    def set(self, current: float, total: float | None, message: str) -> bool:
        """Keep the new progress; return whether it is time to write it (`flush`)."""
        self.pending = {
            "current": validation.check_number("progress current", current),
            "total": None if total is None else validation.check_number("progress total", total),
            "message": validation.check_label("progress message", message, 1000, allow_empty=True),
        }
        return time.monotonic() - self.written_at >= PROGRESS_EVERY

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
    from .dag import waits_for

    after = set().union(*waits_for(ctx._dialect.using, [ctx.job_id]))
    stuck = sorted(after.intersection(ids))
    if stuck:
        raise InvalidJobError(
            f"job {ctx.job_id} cannot wait for job(s) {stuck}: they wait for it to finish"
        )
