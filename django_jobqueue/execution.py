"""Run one claimed job: call its handler and say what should be recorded.

The handler runs in an executor thread; its outcome (a result, or an error) is handed to the
completer, which writes outcomes in batches on its own connection (see `outcomes`). Nothing
here waits for the database after the handler returns.
"""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from . import leases, registry, signals, validation, wake
from .claimed import ClaimedJob
from .conf import JobQueueSettings
from .context import JobContext
from .dialects import Dialect
from .exceptions import Fail, JobTimeout, ResultNotStored, Retry, UnknownHandlerError

logger = logging.getLogger(__name__)


@dataclasses.dataclass(eq=False)
class InFlight:
    """A claimed attempt, shared by the executor thread, the dispatcher and the completer."""

    job: ClaimedJob
    lease: leases.Lease
    claimed: float  # time.monotonic() at the claim
    started: float | None = None  # time.monotonic() when the handler started
    deadline: float | None = None  # monotonic time after which the attempt is timed out
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
    rather than running the handler again.
    """
    flight.thread_id = threading.get_ident()
    job, lease = flight.job, flight.lease
    if not flight.enter_handler(_effective_timeout(job) if job.timeout else None):
        return None  # released (shutdown) before it started
    if flight.deadline is not None:
        wake.wake_up()  # the dispatcher times it out: it must know the deadline now
    if logger.isEnabledFor(logging.DEBUG):  # per-job lines only at -v 2: they cost throughput
        logger.debug(
            "Job id=%s type=%s attempt=%s started", job.pk, job.type, lease.attempt,
            extra=log_extra(flight),
        )  # fmt: skip
    if signals.job_started.receivers:  # nothing to build when no one listens
        signals.send(signals.job_started, **about(flight))
    try:
        try:
            result = _call(dialect, conf, flight)
        finally:
            flight.leave_handler()
        text = None
        if result is not None:
            # The checks enqueue() makes of args: a result no database would take (or none
            # could take back equal) is the same on every run, so it is never retried.
            problem = validation.json_problem(result, "the result", conf.max_result_bytes)
            if problem:
                raise ResultNotStored(f"job {job.pk} cannot store its result: {problem}")
            text = json.dumps(result)
    except BaseException as exc:  # one bad job never kills the worker, SystemExit included
        # A JobTimeout was raised into this thread by the dispatcher, which settled the attempt
        # already; or by an async handler timing itself out, in which case this records it.
        if not flight.settle():
            return None
        return Outcome(flight, error=exc, duration=flight.duration())
    if not flight.settle():
        return None  # timed out meanwhile: the late result is fenced off
    return Outcome(flight, result=result, duration=flight.duration(), text=text)


def failure_plan(outcome: Outcome, conf: JobQueueSettings) -> dict[str, Any]:
    """Return the keyword arguments of leases.fail() for a failed attempt."""
    exc = outcome.error
    assert exc is not None
    job, lease = outcome.flight.job, outcome.flight.lease
    if isinstance(exc, Fail | UnknownHandlerError | ResultNotStored):
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


# An async handler times itself out (asyncio.wait_for, in its own thread) and records the
# failure cleanly; the dispatcher steps in only this much later, for a coroutine that blocks its
# event loop. Raising JobTimeout into asyncio.run() can leave its event loop half-closed.
ASYNC_TIMEOUT_GRACE = 1.0


def _effective_timeout(job: ClaimedJob) -> float | None:
    """Seconds after the handler's start at which the dispatcher times the attempt out."""
    if not job.timeout:
        return None
    try:
        is_async = registry.get(job.type).is_async
    except UnknownHandlerError:
        is_async = False
    return job.timeout + (ASYNC_TIMEOUT_GRACE if is_async else 0.0)


def _call(dialect: Dialect, conf: JobQueueSettings, flight: InFlight) -> Any:
    job = flight.job
    handler = registry.get(job.type)
    args: tuple[Any, ...] = ()
    if handler.takes_context:
        ttl = flight.lease_ttl or conf.lease_ttl
        args = (
            JobContext(
                job.model(),
                flight.lease.attempt,
                flight.lease.owner,
                ttl,
                dialect,
                _renew=flight.renewer(flight.lease) if flight.renewer else None,
            ),
        )
    if not handler.is_async:
        return handler.func(*args, **job.args)
    timeout = job.timeout
    coro = handler.func(*args, **job.args)
    try:
        return asyncio.run(asyncio.wait_for(coro, timeout) if timeout else coro)
    except TimeoutError:
        raise JobTimeout(f"job ran longer than its timeout of {timeout}s") from None
