"""Run one claimed job: call its handler, then record the result or the error."""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import json
import logging
import threading
import time
import traceback
from typing import Any

from django.db import DatabaseError, InterfaceError, connections

from . import leases, registry
from .conf import JobQueueSettings
from .context import JobContext
from .dialects import Dialect
from .exceptions import Fail, JobTimeout, Retry, UnknownHandlerError
from .models import Job

logger = logging.getLogger(__name__)


@dataclasses.dataclass(eq=False)
class InFlight:
    """A dispatched attempt, shared by the executor thread and the worker loop."""

    job: Job
    lease: leases.Lease
    started: float  # time.monotonic() at dispatch
    deadline: float | None  # monotonic time after which the attempt is timed out
    thread_id: int | None = None
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    settled: bool = False  # an outcome was recorded (by the thread or by the timeout)
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    # The timeout raises JobTimeout into the thread only while the handler runs: raised once
    # the thread is back in the executor loop, it would kill the thread holding the next job.
    in_handler: bool = False  # the thread is inside the handler call
    abandoned: bool = False  # JobTimeout was raised into the thread; it retires afterwards
    lease_ttl: float | None = None  # the worker's lease TTL, for JobContext.renew_lease()

    def settle(self) -> bool:
        """Claim the right to record this attempt's outcome; False if already taken."""
        with self.lock:
            if self.settled:
                return False
            self.settled = True
            return True

    def enter_handler(self) -> bool:
        """Mark the handler as running; False if the attempt was settled (timed out) already."""
        with self.lock:
            if self.settled:
                return False
            self.in_handler = True
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


def _set_async_exc(thread_id: int, exc: type[BaseException] | None) -> None:
    """Raise `exc` asynchronously in thread `thread_id`; None clears a pending one."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), None if exc is None else ctypes.py_object(exc)
    )


def error_info(exc: BaseException, attempt: int, *, with_traceback: bool = True) -> dict[str, Any]:
    """Describe `exc` for Job.last_error: class path, message, traceback, attempt."""
    cls = type(exc)
    return {
        "type": f"{cls.__module__}.{cls.__qualname__}",
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(exc)) if with_traceback else "",
        "attempt": attempt,
    }


def record_failure(
    dialect: Dialect, conf: JobQueueSettings, flight: InFlight, exc: BaseException
) -> None:
    """Fail the attempt: retry later (backoff, or as `Retry` asked) or mark it dead."""
    job, lease = flight.job, flight.lease
    error = error_info(exc, lease.attempt)
    duration = time.monotonic() - flight.started
    where: dict[str, Any] = {"parent_id": job.parent_id, "previous_errors": job.errors}
    if isinstance(exc, Fail | UnknownHandlerError) or lease.attempt >= job.max_attempts:
        state = leases.fail(dialect, lease, error, dead=True, **where)
        when = ""
    elif isinstance(exc, Retry):
        state = leases.fail(dialect, lease, error, retry_in=exc.delay, retry_at=exc.at, **where)
        when = f" (retry asked for: delay={exc.delay} at={exc.at})"
    else:
        delay = leases.backoff_seconds(lease.attempt, conf.retry_backoff, conf.retry_backoff_max)
        state = leases.fail(dialect, lease, error, retry_in=delay, **where)
        when = f", retry in {delay:.1f}s"
    if state is None:
        _log_lost(flight)
        return
    verb = {"ready": "failed", "dead": "died", "cancelled": "was cancelled"}.get(state, state)
    level = logging.ERROR if state == "dead" else logging.WARNING
    logger.log(
        level,
        "Job id=%s type=%s attempt=%s %s after %.3fs%s: %s: %s",
        job.pk, job.type, lease.attempt, verb, duration, when if state == "ready" else "",
        error["type"], exc,
    )  # fmt: skip


def _log_lost(flight: InFlight) -> None:
    logger.warning(
        "Lost the lease on job id=%s type=%s attempt=%s; its outcome was discarded",
        flight.job.pk,
        flight.job.type,
        flight.lease.attempt,
    )


def execute(dialect: Dialect, conf: JobQueueSettings, flight: InFlight) -> None:
    """Run `flight`'s handler in this thread and record its outcome under the lease."""
    flight.thread_id = threading.get_ident()
    job, lease = flight.job, flight.lease
    try:
        # Retried like the other lease writes: this thread's connection may have been idle
        # since its last job and dropped by the server meanwhile; without a retry the job
        # would sit leased until its lease expired. start() is fenced, so a repeat is safe.
        job.worker_ids = [*job.worker_ids, lease.owner]
        if not _with_retries(lambda: leases.start(dialect, lease, job.worker_ids), flight):
            flight.settle()
            _log_lost(flight)
            return
        logger.info("Job id=%s type=%s attempt=%s started", job.pk, job.type, lease.attempt)
        try:
            if not flight.enter_handler():
                return  # timed out before the handler started
            try:
                result = _call(dialect, conf, flight)
            finally:
                flight.leave_handler()
            json.dumps(result, allow_nan=False)
        except JobTimeout as exc:
            # Raised into this thread by the worker loop, which already recorded the timeout.
            if flight.settle():
                record_failure(dialect, conf, flight, exc)
            return
        except BaseException as exc:  # one bad job never kills the worker, SystemExit included
            error = exc
            if flight.settle():
                _with_retries(lambda: record_failure(dialect, conf, flight, error), flight)
            return
        if not flight.settle():
            return  # timed out meanwhile: the late result is fenced off
        state = _with_retries(
            lambda: leases.finish(dialect, lease, result, parent_id=job.parent_id), flight
        )
        if state is None:
            _log_lost(flight)
        else:
            logger.info(
                "Job id=%s type=%s attempt=%s %s in %.3fs",
                job.pk, job.type, lease.attempt, state, time.monotonic() - flight.started,
            )  # fmt: skip
    except (DatabaseError, InterfaceError):
        logger.exception("Could not record the outcome of job id=%s; its lease will expire", job.pk)
    finally:
        _tidy_connection(dialect.using)
        flight.done.set()


# An async handler times itself out (asyncio.wait_for, in its own thread) and records the
# failure cleanly; the worker loop steps in only this much later, for a coroutine that blocks its
# event loop. Raising JobTimeout into asyncio.run() can leave its event loop half-closed.
ASYNC_TIMEOUT_GRACE = 1.0


def attempt_deadline(job: Job, started: float) -> float | None:
    """Return the monotonic time after which the worker loop times out this attempt, or None."""
    if not job.timeout:
        return None
    try:
        is_async = registry.get(job.type).is_async
    except UnknownHandlerError:
        is_async = False
    return started + job.timeout + (ASYNC_TIMEOUT_GRACE if is_async else 0.0)


def _call(dialect: Dialect, conf: JobQueueSettings, flight: InFlight) -> Any:
    job = flight.job
    handler = registry.get(job.type)
    args: tuple[Any, ...] = ()
    if handler.takes_context:
        ttl = flight.lease_ttl or conf.lease_ttl
        args = (JobContext(job, flight.lease.attempt, flight.lease.owner, ttl, dialect),)
    if not handler.is_async:
        return handler.func(*args, **job.args)
    timeout = job.timeout
    coro = handler.func(*args, **job.args)
    try:
        return asyncio.run(asyncio.wait_for(coro, timeout) if timeout else coro)
    except TimeoutError:
        raise JobTimeout(f"job ran longer than its timeout of {timeout}s") from None


def _with_retries(func: Any, flight: InFlight, tries: int = 5) -> Any:
    """Run a lease write, retrying through a lost connection (the lease fence keeps it safe)."""
    delay = 0.2
    for attempt in range(1, tries + 1):
        try:
            return func()
        except (DatabaseError, InterfaceError) as exc:
            if attempt == tries:
                raise
            logger.warning("Recording job id=%s failed (%s); retrying", flight.job.pk, exc)
            _tidy_connection(flight.job._state.db or "default", force=True)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)
    return None


def _tidy_connection(using: str, *, force: bool = False) -> None:
    """Drop this thread's connection if a handler or the server broke it."""
    conn = connections[using]
    if force or conn.errors_occurred:
        if conn.in_atomic_block:
            return
        if force or not conn.is_usable():
            conn.close()
        conn.errors_occurred = False
