"""Run one claimed job: call its handler and say what should be recorded.

The handler runs in an executor thread; its outcome (a result, or an error) is handed to the
completer, which writes outcomes in batches on its own connection (see `outcomes`). Nothing
here waits for the database after the handler returns.
"""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import datetime as dt
import functools
import json
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

from asgiref.sync import async_to_sync, sync_to_async

from .. import limits, registry, signals, telemetry, validation
from ..conf import JobQueueSettings
from ..dialects import Dialect
from ..exceptions import (
    Fail,
    JobTimeout,
    RateLimited,
    ReplayMismatch,
    ResultNotStored,
    Retry,
    UnknownHandlerError,
)
from ..lease_results import ClaimedJob
from ..limits.resources import close as close_resource
from . import durable, joblogs, leases, wake
from .context import AsyncJobContext, JobContext

# The module's name before it was renamed: users configure their logging by logger name.
logger = logging.getLogger("django_jobqueue.execution")


@dataclasses.dataclass(eq=False)
class InFlight:
    """A claimed attempt, shared by the executor thread, the dispatcher and the completer."""

    job: ClaimedJob
    lease: leases.Lease
    claimed: float  # time.monotonic() at the claim
    started: float | None = None  # time.monotonic() when the handler started
    deadline: float | None = None  # monotonic time after which the attempt is timed out
    # Counted against a rate at its claim: its handler may start only until then (monotonic),
    # or it is handed back uncharged (see Executor._handed_back_late). None: no rate.
    start_by: float | None = None
    # The rated units its claim counted ({resource: units}) and the database's time of that
    # count: a hand-back gives them back to their windows (limits.window.give_back).
    rated_units: dict[str, int] | None = None
    counted_at: dt.datetime | None = None
    apply_limits: bool = True  # False in testing.run_jobs(), which applies no limit
    thread_id: int | None = None
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    settled: bool = False  # an outcome was decided (by the thread or by the timeout)
    recorded: bool = False  # the completer wrote the outcome (or found the lease lost)
    # The timeout raises JobTimeout into the thread only while the handler runs: raised once
    # the thread is back in the executor loop, it would kill the thread holding the next job.
    in_handler: bool = False  # the thread is inside the handler call
    abandoned: bool = False  # JobTimeout was raised into the thread; it retires afterwards
    lease_ttl: float | None = None  # the worker's lease TTL, for JobContext
    # Makes JobContext.renew_lease() for a lease: the heartbeat's, which owns renewal.
    renewer: Callable[[leases.Lease], Callable[[], bool]] | None = None
    context: JobContext | None = None  # the handler's, if it takes one
    ignore_delays: bool = False  # durable sleeps return at once (testing.run_jobs)

    def settle(self) -> bool:
        """Claim the right to decide this attempt's outcome; False if already taken."""
        with self.lock:
            if self.settled:
                return False
            self.settled = True
            return True

    def enter_handler(self, timeout: float | None) -> bool:
        """Mark the handler as running; False if the attempt was settled (released) already."""
        with self.lock:
            if self.settled:
                return False
            self.in_handler = True
            self.started = time.monotonic()
            if timeout:
                self.deadline = self.started + timeout
            return True

    def leave_handler(self) -> None:
        """Mark the handler as returned, withdrawing a JobTimeout raised but not yet delivered."""
        with self.lock:
            self.in_handler = False
            if self.abandoned:
                _set_async_exc(threading.get_ident(), None)

    def interrupt(self) -> bool:
        """Raise JobTimeout in the thread if it is still in the handler; return whether it was.

        The exception fires at the thread's next Python bytecode: a thread blocked in C (a
        socket read, say) only sees it when the call returns, which may be never.
        """
        with self.lock:
            if not self.in_handler or self.thread_id is None:
                return False
            self.abandoned = True
            _set_async_exc(self.thread_id, JobTimeout)
            return True

    def duration(self) -> float:
        """Seconds since the handler started (or since the claim, if it has not)."""
        return time.monotonic() - (self.started or self.claimed)


def _set_async_exc(thread_id: int, exc: type[BaseException] | None) -> None:
    """Raise `exc` asynchronously in thread `thread_id`; None clears a pending one."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), None if exc is None else ctypes.py_object(exc)
    )


@dataclasses.dataclass(eq=False)
class Outcome:
    """What to record for one attempt: a result (`error` None) or a failure."""

    flight: InFlight
    result: Any = None
    error: BaseException | None = None
    duration: float = 0.0
    text: str | None = None  # the result as JSON text (None: SQL NULL, as the ORM stores None)

    @property
    def succeeded(self) -> bool:
        return self.error is None


def run(dialect: Dialect, conf: JobQueueSettings, flight: InFlight) -> Outcome | None:
    """Run `flight`'s handler in this thread; return its outcome, or None if it was settled.

    The result is checked here (in the executor thread, not the completer) to be JSON that
    can be stored: a result that is not is deterministic, so the attempt fails for good
    rather than running the handler again. An async handler runs here on an event loop of its
    own (asgiref's `async_to_sync`); a worker runs it on its event loop instead (`start_async`).
    """
    if not _begin(flight, threading.get_ident()):
        return None  # released (shutdown) before it started
    hooks = telemetry.active
    if hooks is None:
        return _run(dialect, conf, flight)
    begun = hooks.begin(flight)  # its span is current while the handler runs, in this thread
    try:
        outcome = _run(dialect, conf, flight)
        hooks.ended(begun, flight, outcome)
    finally:
        hooks.end(begun)
    return outcome


def _run(dialect: Dialect, conf: JobQueueSettings, flight: InFlight) -> Outcome | None:
    try:
        try:
            result = _call(dialect, conf, flight)
        finally:
            flight.leave_handler()
            _flush_progress(flight)
            _end_lines(flight)
            if flight.context is not None and flight.context._deferred:
                durable.flush(flight.context)  # an error fails the attempt: its replay settles
    except BaseException as exc:  # one bad job never kills the worker, SystemExit included
        mismatch = _mismatch(flight)
        if mismatch is not None:
            return _failed(flight, mismatch)
        if isinstance(exc, RateLimited):
            _close_now(dialect, conf, exc)
        return _failed(flight, exc)
    return _succeeded(flight, result, conf)


def _mismatch(flight: InFlight) -> ReplayMismatch | None:
    """The ReplayMismatch the run met, if it did: the attempt's error whatever the handler
    did with it (caught it, raised another error, returned)."""
    context = flight.context
    return None if context is None else context._calls.mismatch


def _close_now(dialect: Dialect, conf: JobQueueSettings, limited: RateLimited) -> None:
    """Close the resource at once, from the handler's thread: other claims see it before the
    completer records the outcome (which closes it again, with the job's suspension)."""
    if limits.find(limited.resource, limits.every_limit(conf)) is None:
        logger.warning(
            "RateLimited(%r): no entry of JOBQUEUE['LIMITS'] governs this resource, so only "
            "the raising job waits (%gs); no other job is held back",
            limited.resource, limited.retry_after,
        )  # fmt: skip
    try:
        close_resource(dialect, limited.resource, limited.retry_after)
    except Exception:  # the completer's write closes it all the same
        logger.warning("Could not close resource %r yet", limited.resource)


def _flush_progress(flight: InFlight) -> None:
    """Write the progress the handler set last, if the throttle held it back."""
    context = flight.context
    if context is not None and context._progress.pending is not None:
        try:
            context._progress.flush(context)
        except Exception:  # progress is for display: it never fails an attempt
            logger.warning("Could not record the progress of job id=%s", flight.job.pk)


def _end_lines(flight: InFlight) -> None:
    """Keep no more log lines of the run: the worker's writer writes the ones it kept with
    its outcome (joblogs.write_ended)."""
    if flight.context is not None:
        flight.context._lines.end()


def is_async(job: ClaimedJob) -> bool:
    """Whether `job`'s handler is a coroutine function (False for an unknown handler)."""
    try:
        return registry.get(job.type, job.handler_version).is_async
    except UnknownHandlerError:
        return False


def start_async(
    dialect: Dialect, conf: JobQueueSettings, flight: InFlight
) -> Coroutine[Any, Any, Outcome | None] | None:
    """Begin `flight`'s async attempt in this thread; return what the event loop awaits.

    The attempt's start (and `job_started`) happens here, in an executor thread, where
    receivers may use the ORM; the handler's coroutine then runs on the worker's event loop
    and its timeout goes through asyncio. None: settled (released) before it started.
    """
    if not _begin(flight, None):  # no thread to raise JobTimeout into: it is a task
        return None
    return _attempt(dialect, conf, flight)


async def _attempt(dialect: Dialect, conf: JobQueueSettings, flight: InFlight) -> Outcome | None:
    hooks = telemetry.active
    if hooks is None:
        return await _run_async(dialect, conf, flight)
    begun = hooks.begin(flight)  # current in this task (its own context)
    try:
        outcome = await _run_async(dialect, conf, flight)
        hooks.ended(begun, flight, outcome)
    finally:
        hooks.end(begun)
    return outcome


async def _run_async(dialect: Dialect, conf: JobQueueSettings, flight: InFlight) -> Outcome | None:
    timeout = flight.job.timeout
    try:
        try:
            coro = _call_async(dialect, conf, flight)
            result = await (asyncio.wait_for(coro, timeout) if timeout else coro)
        except TimeoutError:
            raise JobTimeout(f"job ran longer than its timeout of {timeout}s") from None
        finally:
            flight.leave_handler()
            _end_lines(flight)
            if flight.context is not None and flight.context._progress.pending is not None:
                await sync_to_async(_flush_progress)(flight)  # off the loop, as its calls
            if flight.context is not None and flight.context._deferred:
                await durable.in_thread(functools.partial(durable.flush, flight.context))
    except BaseException as exc:  # cancelled too: by the dispatcher, which settled it first
        return _failed(flight, _mismatch(flight) or exc)
    return _succeeded(flight, result, conf)


def _result_text(flight: InFlight, result: Any, conf: JobQueueSettings) -> str | None:
    """The result as JSON text (None for None); ResultNotStored if it cannot be stored."""
    if result is None:
        return None
    # The checks enqueue() makes of args: a result no database would take (or none could take
    # back equal) is the same on every run, so it is never retried.
    problem = validation.json_problem(result, "the result", conf.max_result_bytes)
    if problem:
        raise ResultNotStored(f"job {flight.job.pk} cannot store its result: {problem}")
    return json.dumps(result)


def _begin(flight: InFlight, thread_id: int | None) -> bool:
    """Mark the attempt started (False: it was settled first); log and signal its start."""
    flight.thread_id = thread_id
    job, lease = flight.job, flight.lease
    if not flight.enter_handler(_effective_timeout(job) if job.timeout else None):
        return False
    if flight.deadline is not None:
        wake.wake_up()  # the dispatcher times it out: it must know the deadline now
    if logger.isEnabledFor(logging.DEBUG):  # per-job lines only at -v 2: they cost throughput
        logger.debug(
            "Job id=%s type=%s attempt=%s started", job.pk, job.type, lease.attempt,
            extra=log_extra(flight),
        )  # fmt: skip
    if signals.job_started.receivers:  # nothing to build when no one listens
        signals.send(signals.job_started, **about(flight))
    return True


def _failed(flight: InFlight, exc: BaseException) -> Outcome | None:
    # A JobTimeout was raised into this thread by the dispatcher, which settled the attempt
    # already; or by an async handler timing itself out, in which case this records it.
    if not flight.settle():
        return None
    return Outcome(flight, error=exc, duration=flight.duration())


def _succeeded(flight: InFlight, result: Any, conf: JobQueueSettings) -> Outcome | None:
    mismatch = _mismatch(flight)
    if mismatch is not None:  # the handler caught it and returned: it ran on wrong records
        return _failed(flight, mismatch)
    try:
        text = _result_text(flight, result, conf)
    except BaseException as exc:  # a result that cannot even be checked fails the attempt
        return _failed(flight, exc)
    if not flight.settle():
        return None  # timed out meanwhile: the late result is fenced off
    return Outcome(flight, result=result, duration=flight.duration(), text=text)


def failure_plan(outcome: Outcome, conf: JobQueueSettings) -> dict[str, Any]:
    """Return the keyword arguments of leases.fail() for a failed attempt."""
    exc = outcome.error
    assert exc is not None
    job, lease = outcome.flight.job, outcome.flight.lease
    # A mismatch is met again by every retry: the job waits for an operator (see retry()).
    if isinstance(exc, Fail | UnknownHandlerError | ResultNotStored | ReplayMismatch):
        return {"parent_id": job.parent_id, "dead": True}
    if isinstance(exc, Retry) and lease.attempt < job.max_attempts:
        return {"parent_id": job.parent_id, "retry_in": exc.delay, "retry_at": exc.at}
    return plain_failure_plan(outcome.flight, conf)


def plain_failure_plan(flight: InFlight, conf: JobQueueSettings) -> dict[str, Any]:
    """Return leases.fail()'s arguments for an ordinary failure: backoff, or `dead` at the last."""
    job, lease = flight.job, flight.lease
    if lease.attempt >= job.max_attempts:
        return {"parent_id": job.parent_id, "dead": True}
    delay = leases.backoff_seconds(lease.attempt, conf.retry_backoff, conf.retry_backoff_max)
    return {"parent_id": job.parent_id, "retry_in": delay}


def about(flight: InFlight, duration: float | None = None) -> dict[str, Any]:
    """The keyword arguments every attempt signal passes (see `signals`)."""
    job = flight.job
    return {
        "job_id": job.id,
        "job_type": job.type,
        "queue": job.queue,
        "group": job.group_key,
        "attempt": flight.lease.attempt,
        "worker_id": flight.lease.owner,
        "duration": duration,
    }


def log_extra(
    flight: InFlight, duration: float | None = None, state: str | None = None
) -> dict[str, Any]:
    """Fields for a log record about an attempt, for JSON formatters (`extra=`)."""
    job = flight.job
    return {
        "job_id": job.id,
        "job_type": job.type,
        "attempt": flight.lease.attempt,
        "queue": job.queue,
        "group": job.group_key,
        "duration": duration,
        "job_state": state,
    }


# An async handler times itself out (asyncio.wait_for, on the worker's event loop) and records
# the failure cleanly; the dispatcher steps in only this much later, for a coroutine that blocks
# the loop: it fails the attempt and cancels the task. (Raising JobTimeout into a thread that
# runs an event loop could leave the loop half-closed.)
ASYNC_TIMEOUT_GRACE = 1.0


def _effective_timeout(job: ClaimedJob) -> float | None:
    """Seconds after the handler's start at which the dispatcher times the attempt out."""
    if not job.timeout:
        return None
    return job.timeout + (ASYNC_TIMEOUT_GRACE if is_async(job) else 0.0)


def _call(dialect: Dialect, conf: JobQueueSettings, flight: InFlight) -> Any:
    handler = registry.get(flight.job.type, flight.job.handler_version)
    if not handler.is_async:
        return handler.func(*_context(dialect, conf, flight, handler), **flight.job.args)
    timeout = flight.job.timeout
    coro = _call_async(dialect, conf, flight)

    async def main() -> Any:
        return await (asyncio.wait_for(coro, timeout) if timeout else coro)

    try:
        # On a loop of its own, whose thread-sensitive calls (the ORM's, the durable calls')
        # come back to this thread and its connection: in run_jobs(), the test's.
        return async_to_sync(main)()
    except TimeoutError:
        raise JobTimeout(f"job ran longer than its timeout of {timeout}s") from None


def _call_async(dialect: Dialect, conf: JobQueueSettings, flight: InFlight) -> Any:
    """The handler's coroutine, made (not started) with the job's arguments."""
    handler = registry.get(flight.job.type, flight.job.handler_version)
    return handler.func(*_context(dialect, conf, flight, handler), **flight.job.args)


def _context(
    dialect: Dialect, conf: JobQueueSettings, flight: InFlight, handler: registry.Handler
) -> tuple[Any, ...]:
    """The handler's positional arguments: its JobContext, if it takes one."""
    if not handler.takes_context:
        return ()
    context = (AsyncJobContext if handler.is_async else JobContext)(
        flight.job,
        flight.lease.attempt,
        flight.lease.owner,
        flight.lease_ttl or conf.lease_ttl,
        dialect,
        _renew=flight.renewer(flight.lease) if flight.renewer else None,
        _max_result_bytes=conf.max_result_bytes,
        _ignore_delays=flight.ignore_delays,
        _recorded=flight.job.records,
        _places=flight.job.places,
        _apply_limits=flight.apply_limits,
        _counted_at=flight.counted_at if flight.rated_units else None,
        _log_limits=joblogs.Limits.of(conf),
    )
    flight.context = context
    return (context,)
