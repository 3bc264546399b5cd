"""The exception hierarchy of django_jobqueue."""

from __future__ import annotations

import datetime as dt


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


class UnsupportedDatabaseError(JobQueueError):
    """The database cannot run a job queue (too old, wrong engine or vendor)."""


class Retry(Exception):
    """Raised by a handler to retry the job later, after `delay` (seconds or timedelta) or `at`.

    The attempt counts: on the job's last attempt it becomes `dead` instead. With neither
    `delay` nor `at`, the job is ready again at once.

    Args:
        delay: Seconds, or a timedelta, from the database's current time.
        at: An aware datetime to run it again at.
        reason: The attempt's error message (a default one names `delay` and `at`).

    Raises:
        ValueError: Both `delay` and `at` were given, or `delay` is negative.
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
        if isinstance(delay, dt.timedelta):
            delay = delay.total_seconds()
        if delay is not None and delay < 0:
            raise ValueError("Retry delay must not be negative.")
        self.delay = delay
        self.at = at
        self.reason = reason
        super().__init__(reason or f"retry requested (delay={delay}, at={at})")


class Fail(Exception):
    """Raised by a handler to fail the job for good: it goes to `dead` without more attempts."""


class JobTimeout(JobQueueError):
    """A job ran longer than its timeout; the attempt was failed and its result fenced off."""


class LeaseLost(JobQueueError):
    """A worker lost the lease on a job it was running (it expired and was reclaimed)."""


class LeaseExpired(JobQueueError):
    """A job's lease expired without a heartbeat (its worker died or stalled) and was reclaimed."""


class WorkerShutdown(JobQueueError):
    """A worker shut down before the job finished; the job was released, no attempt charged."""


class UpstreamFailed(JobQueueError):
    """An upstream job (or a container's child) ended dead or cancelled, so this job cannot run."""


class JobCancelled(JobQueueError):
    """The job was cancelled while it ran; its result was discarded."""


class ResultNotStored(JobQueueError):
    """A handler's result cannot be stored (not JSON, or refused by the database); the job dies."""
