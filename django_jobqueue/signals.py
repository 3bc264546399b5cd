"""Signals sent for every job, whether enqueued by handler key or as a Django task.

The sender is the Job model class. Every signal passes `job_id`, `job_type` (the handler
key), `queue` and `group`; those about an attempt add `attempt`, `worker_id` and, once it
ended, `duration` (seconds the handler ran). They are sent after what they report has been
committed (but `job_started`, sent as the handler starts), from the thread that knows it: the
enqueuing code's, the worker's handler thread for `job_started`, its completer thread for
outcomes (its reclaimer for a job whose lease expired on its last attempt).

- `job_enqueued`: a job was written (once its transaction committed): `job`, the Job.
- `job_started`: a handler is about to run an attempt.
- `job_finished`: an attempt returned and was recorded: `state` is "done", or "cancelled"
  when cancellation was requested while it ran; `result`.
- `job_failed`: an attempt failed (each attempt): `error` (the exception), `state` (what
  became of the job: "ready" or "scheduled" to retry, "dead", "cancelled").
- `job_dead`: a job failed for good: `error`.
- `job_rate_limited`: a handler raised `RateLimited`: `resource` is closed for `retry_after`
  seconds, and the job waits (`state`: "scheduled") without using its attempt.
- `units_settled`: a running job settled units (`ctx.settle()`): `resource`, `granted` (the
  units of the grant, or of the job's `uses`), `used`, and `grant` (the grant's key, or
  "uses:<resource>"). Sent from the handler's thread once the settlement committed (one at
  or below its grant commits with the job's next round trip: its next grant, its next
  durable call, or the end of its run).

A receiver that raises never stops the worker: the error is logged
(logger `django_jobqueue.signals`) and the other receivers still run. With no receiver
connected, sending costs one attribute test, so the worker's hot path does not pay for them.
"""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import Signal

logger = logging.getLogger(__name__)

job_enqueued = Signal()
job_started = Signal()
job_finished = Signal()
job_failed = Signal()
job_dead = Signal()
job_rate_limited = Signal()
units_settled = Signal()

__all__ = [
    "job_dead",
    "job_enqueued",
    "job_failed",
    "job_finished",
    "job_rate_limited",
    "job_started",
    "units_settled",
]


def connected(signal: Signal) -> bool:
    """Whether any receiver is connected to `signal` (cheap: test before building kwargs)."""
    return bool(signal.receivers)


def send(signal: Signal, **kwargs: Any) -> None:
    """Send `signal` from the Job model to every receiver, logging receivers that raise."""
    from .models import Job

    try:
        responses = signal.send_robust(Job, **kwargs)
    except BaseException:  # SystemExit and the like, which send_robust lets through
        logger.exception("A receiver of %s raised", _name(signal))
        return
    for receiver, response in responses:
        if isinstance(response, Exception):
            logger.error(
                "Receiver %r of %s raised: %s",
                receiver,
                _name(signal),
                response,
                exc_info=(type(response), response, response.__traceback__),
            )


def _name(signal: Signal) -> str:
    for name in __all__:
        if globals()[name] is signal:
            return name
    return repr(signal)


def send_enqueued(jobs: list[Any]) -> None:
    """Send `job_enqueued` for each of `jobs` (just committed)."""
    for job in jobs:
        send(
            job_enqueued,
            job=job,
            job_id=job.pk,
            job_type=job.type,
            queue=job.queue,
            group=job.group_key,
        )
