"""The exception hierarchy of django_jobqueue."""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from typing import Any

from .names import name_problem


class JobQueueError(Exception):
    """Base class for django_jobqueue errors. Do not raise directly."""


class InvalidJobError(JobQueueError, ValueError):
    """An enqueue call was given bad input; nothing was written."""


class UnknownHandlerError(InvalidJobError):
    """No handler is registered under the given key."""


class InvalidArgumentsError(InvalidJobError):
    """Job arguments are not a JSON object or not JSON-serializable."""


class InvalidDependencyError(InvalidJobError):
    """A dependency or parent does not exist, or lives on another database."""


class HandlerRegistrationError(JobQueueError):
    """A handler key was registered twice for different callables, or is malformed."""


class ScheduleError(JobQueueError, ValueError):
    """A schedule cannot be stored, paused, resumed, removed or run as asked; nothing changed."""


class UnsupportedDatabaseError(JobQueueError):
    """The database cannot run a job queue (too old, wrong engine or vendor)."""


class Retry(Exception):
    """Raised by a handler to retry the job later, after `delay` (seconds or timedelta) or `at`.

    The attempt counts: on the job's last attempt it becomes `dead` instead. With neither
    `delay` nor `at`, the job is ready again at once.

    Args:
        delay: Seconds (an int or a float), or a timedelta, from the database's current time:
            finite, from 0 to 100 years.
        at: An aware datetime to run it again at, from 1900 to before 9000 (UTC).
        reason: The attempt's error message (a default one names `delay` and `at`).

    Raises:
        TypeError: `delay` is not a number or a timedelta (a bool or a Decimal, say), `at` is
            not a datetime, or `reason` is not a string.
        ValueError: Both `delay` and `at` were given, `delay` is negative, not finite or over
            100 years, or `at` is naive or out of range.
    """

    def __init__(
        self,
        delay: float | dt.timedelta | None = None,
        *,
        at: dt.datetime | None = None,
        reason: str = "",
    ) -> None:
        if delay is not None and at is not None:
            raise ValueError("Retry takes delay or at, not both.")
        # Checked here, in the handler, so that a bad value fails the attempt like any other
        # exception instead of reaching the worker's write of the outcome.
        delay = None if delay is None else _retry_delay(delay)
        if at is not None:
            _check_retry_at(at)
            at = at.astimezone(dt.UTC)  # an offset PostgreSQL refuses (+16:00) stored as UTC
        if not isinstance(reason, str):
            raise TypeError(f"Retry reason must be a string, not {type(reason).__name__}.")
        self.delay = delay
        self.at = at
        self.reason = reason
        super().__init__(reason or f"retry requested (delay={delay}, at={at})")


# The bounds enqueue() puts on run_after too (validation.py takes them from here).
RETRY_DELAY_MAX = dt.timedelta(days=36525)
RETRY_AT_MIN = dt.datetime(1900, 1, 1, tzinfo=dt.UTC)
RETRY_AT_MAX = dt.datetime(9000, 1, 1, tzinfo=dt.UTC)


def _retry_delay(delay: object, what: str = "Retry delay") -> float:
    """Return `delay` in seconds if it is a valid Retry delay (or `what`)."""
    if isinstance(delay, dt.timedelta):
        seconds = delay.total_seconds()
    elif isinstance(delay, int | float) and not isinstance(delay, bool):
        try:
            seconds = float(delay)
        except OverflowError:  # an int too large for a float
            seconds = math.inf
    else:
        raise TypeError(
            f"{what} must be seconds (an int or a float) or a timedelta, "
            f"not {type(delay).__name__} {delay!r}."
        )
    if math.isnan(seconds):
        raise ValueError(f"{what} must be a number of seconds, not NaN.")
    if seconds < 0:
        raise ValueError(f"{what} must not be negative.")
    if seconds > RETRY_DELAY_MAX.total_seconds():
        raise ValueError(
            f"{what} must be at most {RETRY_DELAY_MAX.days} days (100 years), not {delay!r}."
        )
    return seconds


def in_datetime_range(value: dt.datetime, low: dt.datetime, high: dt.datetime) -> bool:
    """Whether the aware datetime `value` is in [low, high) (not when its offset overflows)."""
    try:
        return low <= value < high
    except OverflowError:  # an offset that pushes it past Python's own range
        return False


def _check_retry_at(at: object) -> None:
    if not isinstance(at, dt.datetime):
        raise TypeError(f"Retry at must be an aware datetime, not {type(at).__name__} {at!r}.")
    if at.utcoffset() is None:
        raise ValueError("Retry at must be a timezone-aware datetime, not a naive one.")
    if not in_datetime_range(at, RETRY_AT_MIN, RETRY_AT_MAX):
        raise ValueError(
            f"Retry at must be from {RETRY_AT_MIN:%Y-%m-%d} to before {RETRY_AT_MAX:%Y-%m-%d} "
            f"(UTC), not {at.isoformat()}."
        )


class RateLimited(Exception):
    """Raised by a handler when an outside quota said "later" (an HTTP 429, say): no job that
    uses `resource` starts for `retry_after` seconds, on any worker, and this job waits that
    long without using its attempt.

    Args:
        resource: A resource of ``JOBQUEUE["LIMITS"]`` ("openai", "tenant:42").
        retry_after: Seconds, or a timedelta, from the database's current time: finite, from
            0 to 100 years (the `Retry-After` the service sent).

    Raises:
        TypeError: `resource` is not a string, or `retry_after` not a number or timedelta.
        ValueError: `resource` is not a resource name (empty, over 255 characters, with a
            control character, a lone surrogate or a `*`), or `retry_after` negative, not
            finite or too long.
    """

    def __init__(self, resource: str, retry_after: float | dt.timedelta = 0.0) -> None:
        if not isinstance(resource, str):
            raise TypeError(f"RateLimited resource must be a string, not {resource!r}.")
        problem = name_problem(resource, 255, star="none")
        if problem:
            raise ValueError(f"RateLimited resource {problem}.")
        self.resource = resource
        self.retry_after = _retry_delay(retry_after, "RateLimited retry_after")
        super().__init__(f"{resource} is rate limited for {self.retry_after:g}s")


class Fail(Exception):
    """Raised by a handler to fail the job for good: it goes to `dead` without more attempts."""


class JobTimeout(JobQueueError):
    """A job ran longer than its timeout; the attempt was failed and its result fenced off."""


class LeaseLost(JobQueueError):
    """A durable call (a step, a spawn) found its job's lease gone: nothing was recorded."""


class WaitTimeout(JobQueueError):
    """ctx.wait_for_event() gave up: no event was sent within its timeout."""


class LeaseExpired(JobQueueError):
    """A job's lease expired without a heartbeat (its worker died or stalled) and was reclaimed."""


class WorkerShutdown(JobQueueError):
    """Reserved, never raised: a job released at shutdown goes back to `ready` with no error."""


class UpstreamFailed(JobQueueError):
    """An upstream job (or a container's child) ended dead or cancelled, so this job cannot run."""


class JobCancelled(JobQueueError):
    """Reserved, never raised: a job cancelled while it ran keeps its attempt's error, if any."""


class UnreadableJob(JobQueueError):
    """A ready job's row holds what no job may (written around enqueue()): a claim set it aside
    `dead` without running it."""


class ResultNotStored(JobQueueError):
    """A handler's result cannot be stored (not JSON, or refused by the database); the job dies."""


class ReplayMismatch(JobQueueError):
    """A replay's durable call is not the call recorded at its place: the job ends `dead`.

    Attributes:
        job_id: The job.
        place: The call's place in its run (1: the run's first durable call).
        recorded: What was recorded there ("step 'a'", "a sleep", ...).
        asked: What the handler asked for there.
    """

    def __init__(self, job_id: int, place: int, recorded: str, asked: str) -> None:
        self.job_id, self.place, self.recorded, self.asked = job_id, place, recorded, asked
        super().__init__(
            f"job {job_id} does not replay as it ran: at place {place} its handler asks for "
            f"{asked}, where {recorded} was recorded. Deploy such a change as a new version "
            "of the handler, or behind ctx.patched(); to run the new code from there, retry "
            f"the job from place {place - 1} (see 'Changing a durable handler safely')."
        )


class ContainerNotSealed(JobQueueError):
    """A container stayed open (unsealed) too long and was failed; see OPEN_CONTAINER_TIMEOUT."""


@dataclasses.dataclass
class Suspend(BaseException):
    """Raised by a durable call that must wait: the run stops and the job is suspended.

    A BaseException, so that a handler's `except Exception` does not swallow it. `records`
    are the JobStep rows (name, seq, result, place) to write with the suspension.
    """

    # "sleep" (until `until`, or `delay` seconds), "event" (waiting for `key`), "jobs", "map"
    kind: str
    until: dt.datetime | None = None
    delay: float | None = None
    key: str | None = None
    job_ids: list[int] = dataclasses.field(default_factory=list)
    count: int | None = None  # "jobs": how many of `job_ids` must be final (None: all)
    records: list[tuple[str, int, Any, int | None]] = dataclasses.field(default_factory=list)
    closes: str | None = None  # a resource to close for `delay` seconds (RateLimited)

    def __str__(self) -> str:
        until = self.until if self.delay is None else f"{self.delay:g}s from now"
        what = {
            "sleep": f"sleeping until {until}",
            "event": f"waiting for {self.key!r}",
            "map": "waiting for the children of its map",
        }
        return what.get(self.kind, f"waiting for jobs {self.job_ids}")
