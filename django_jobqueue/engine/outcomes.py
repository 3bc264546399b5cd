"""Writing attempts' outcomes: a result or a failure, its log line and its signals.

`attempts` runs an attempt and says what to record (`Outcome`, `failure_plan`); `record()`
writes it, for the worker's completer (many at a time, on its own thread) and for
`testing.run_jobs()` (one at a time, in the caller's thread) alike, so a test sees exactly
what production writes. Every write is fenced by the attempt's lease (see `leases`); signals
are sent only once the write has committed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from django.core.exceptions import ValidationError
from django.db import DataError, IntegrityError, NotSupportedError, ProgrammingError

from .. import signals, telemetry
from ..conf import JobQueueSettings
from ..dialects import Dialect
from ..exceptions import RateLimited, ResultNotStored, Retry, Suspend
from . import joblogs, leases, suspensions
from .attempts import Outcome, about, failure_plan, log_extra, plain_failure_plan
from .error_records import error_info, error_record, log_text

# The loggers the docs name: what became of each attempt is told by `django_jobqueue.execution`,
# a result the database refused by the worker's writer, `django_jobqueue.worker.completer`.
logger = logging.getLogger("django_jobqueue.execution")
writer_logger = logging.getLogger("django_jobqueue.worker.completer")

# Errors that writing the same outcome again cannot cure: the database refuses a value, or a
# value cannot even be turned into SQL (a run_after that is not a datetime fails in Python, as
# a TypeError, ValueError, OverflowError or Django's ValidationError, before any statement).
PERMANENT_ERRORS: tuple[type[Exception], ...] = (
    DataError,
    IntegrityError,
    ProgrammingError,
    NotSupportedError,
    TypeError,
    ValueError,
    OverflowError,
    ValidationError,
)


def _nothing() -> None:
    pass


def _forget(outcome: Outcome, state: str | None) -> None:
    pass


def record(
    dialect: Dialect,
    conf: JobQueueSettings,
    owner: str,
    outcomes: Sequence[Outcome],
    *,
    on_recorded: Callable[[Outcome, str | None], None] = _forget,
    on_refused: Callable[[], None] = _nothing,
) -> list[Outcome]:
    """Write the outcomes of `owner`'s attempts; return those whose rows were locked elsewhere.

    The successes are written together, in one transaction (`leases.finish_many`); failures
    one by one (`record_failure`). Each outcome written is logged, its signals are sent (it has
    committed), `flight.recorded` is set and `on_recorded(outcome, state)` is called; state
    None means the lease was lost and nothing was written. The outcomes returned wrote nothing:
    write them again later. `on_refused` runs after each write the database refused.
    """
    # The runs' log lines first (one statement for all, never failing the outcomes): they are
    # there once the jobs are final.
    ended = [o.flight.context._lines for o in outcomes if o.flight.context is not None]
    if ended:
        joblogs.write_ended(dialect, ended)
    failed = [o for o in outcomes if not o.succeeded and not o.flight.recorded]
    done = [o for o in outcomes if o.succeeded]
    suspended = [o for o in failed if isinstance(o.error, Suspend | RateLimited)]
    busy = _finish(dialect, conf, owner, done, on_recorded, on_refused) if done else []
    if suspended:
        busy += _suspend(dialect, conf, suspended, on_recorded, on_refused)
    for outcome in failed:
        if not isinstance(outcome.error, Suspend | RateLimited) and not _fail(
            dialect, conf, outcome, on_recorded, on_refused
        ):
            busy.append(outcome)
    return busy


def _suspend(
    dialect: Dialect,
    conf: JobQueueSettings,
    outcomes: list[Outcome],
    on_recorded: Callable[[Outcome, str | None], None],
    on_refused: Callable[[], None],
) -> list[Outcome]:
    """Write suspensions (durable sleeps and waits) in one transaction; return the busy ones.

    A batch the database refuses is written one by one; a suspension it refuses (a record it
    cannot store) is written as a failure of the attempt.
    """
    items = [(o.flight.lease, _suspension(o.error)) for o in outcomes]
    try:
        states = suspensions.suspend_many(dialect, items)
    except PERMANENT_ERRORS as exc:
        on_refused()
        if len(outcomes) > 1:
            busy: list[Outcome] = []
            for outcome in outcomes:
                busy += _suspend(dialect, conf, [outcome], on_recorded, on_refused)
            return busy
        outcomes[0].error = exc
        return [] if _fail(dialect, conf, outcomes[0], on_recorded, on_refused) else outcomes
    busy = []
    for outcome in outcomes:
        flight = outcome.flight
        state = states[flight.lease.job_id]
        if state == leases.BUSY:
            busy.append(outcome)
            continue
        if state is None:
            log_outcome(outcome, state)
        elif logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "Job id=%s type=%s attempt=%s suspended (%s): %s",
                flight.job.pk, flight.job.type, flight.lease.attempt, outcome.error, state,
                extra=log_extra(flight, outcome.duration, state),
            )  # fmt: skip
        flight.recorded = True
        on_recorded(outcome, state)
        limited = outcome.error
        if isinstance(limited, RateLimited) and state and signals.job_rate_limited.receivers:
            signals.send(
                signals.job_rate_limited,
                **about(flight, outcome.duration),
                resource=limited.resource,
                retry_after=limited.retry_after,
                state=state,
            )
    return busy


def _suspension(error: BaseException | None) -> Suspend:
    """The suspension an outcome asks for: its own, or a RateLimited one's (the resource is
    closed and the job waits as long, without using its attempt)."""
    if isinstance(error, RateLimited):
        return Suspend("sleep", delay=error.retry_after, closes=error.resource)
    assert isinstance(error, Suspend)
    return error


def _finish(
    dialect: Dialect,
    conf: JobQueueSettings,
    owner: str,
    outcomes: list[Outcome],
    on_recorded: Callable[[Outcome, str | None], None],
    on_refused: Callable[[], None],
) -> list[Outcome]:
    """Write successful outcomes in one transaction; return those whose rows were busy.

    A result the database refuses (a batch failing with a data error) is isolated by writing
    the batch one by one; that attempt then fails for good, with ResultNotStored.
    """
    items = [(o.flight.lease.job_id, o.flight.lease.attempt, o.text) for o in outcomes]
    in_graph = {o.flight.lease.job_id for o in outcomes if o.flight.job.in_graph}
    try:
        report = leases.finish_many(dialect, owner, items, in_graph=in_graph)
    except PERMANENT_ERRORS as exc:
        on_refused()
        if len(outcomes) > 1:
            busy: list[Outcome] = []
            for outcome in outcomes:  # one by one: only the bad one fails
                busy += _finish(dialect, conf, owner, [outcome], on_recorded, on_refused)
            return busy
        outcome = outcomes[0]
        writer_logger.error(
            "The database refused the result of job id=%s: %s",
            outcome.flight.job.pk, log_text(exc),
        )  # fmt: skip
        outcome.error = ResultNotStored(f"the database refused the result: {exc}")
        outcome.result = outcome.text = None
        return [] if _fail(dialect, conf, outcome, on_recorded, on_refused) else [outcome]
    by_id = {o.flight.lease.job_id: o for o in outcomes}
    for finished in report.finished:
        _recorded(by_id[finished.job_id], finished.state, on_recorded)
    for job_id, state in report.recorded:
        writer_logger.info("Job id=%s was recorded %s by an earlier write", job_id, state)
        _recorded(by_id[job_id], state, on_recorded)
    for job_id in report.lost:
        _recorded(by_id[job_id], None, on_recorded)
    return [by_id[job_id] for job_id in report.busy]


def _fail(
    dialect: Dialect,
    conf: JobQueueSettings,
    outcome: Outcome,
    on_recorded: Callable[[Outcome, str | None], None],
    on_refused: Callable[[], None],
) -> bool:
    """Write a failed attempt; False when its row is locked elsewhere (try again later)."""
    state, plan = record_failure(dialect, outcome, conf, on_refused=on_refused)
    if state == leases.BUSY:
        return False
    log_outcome(outcome, state, plan)
    _recorded(outcome, state, on_recorded, logged=True)
    return True


def _recorded(
    outcome: Outcome,
    state: str | None,
    on_recorded: Callable[[Outcome, str | None], None],
    *,
    logged: bool = False,
) -> None:
    if not logged and (state is None or logger.isEnabledFor(logging.DEBUG)):
        log_outcome(outcome, state)
    send_outcome_signals(outcome, state)  # committed: receivers see what they are told
    if telemetry.active is not None:
        telemetry.active.recorded(outcome, state)
    outcome.flight.recorded = True
    on_recorded(outcome, state)


def record_failure(
    dialect: Dialect,
    outcome: Outcome,
    conf: JobQueueSettings,
    *,
    on_refused: Callable[[], None] = _nothing,
) -> tuple[str | None, dict[str, Any]]:
    """Write a failed attempt (leases.fail); return the job's new state (or BUSY) and the plan.

    What cannot be written as planned is written more plainly, so that one bad outcome never
    holds back the others: with a plain error record when the database refuses the record,
    then, when the plan itself cannot be written, as an ordinary failure (backoff, or `dead`
    on the last attempt) whose error says why. State None: not even that could be written
    (or the lease was lost); the lease is left to expire and the reclaimer takes the job back.
    `on_refused` runs after each refused write (the completer drops its connection there).
    """
    assert outcome.error is not None
    lease = outcome.flight.lease
    plan = failure_plan(outcome, conf)
    error = error_info(outcome.error, lease.attempt)
    try:
        return leases.fail(dialect, lease, error, **plan), plan
    except PERMANENT_ERRORS as exc:
        on_refused()
        refused = log_text(exc)
    plain = error_record(error["type"], "(could not be stored)", lease.attempt)
    try:
        state = leases.fail(dialect, lease, plain, **plan)
    except PERMANENT_ERRORS as exc:
        on_refused()
        problem = f"{type(exc).__qualname__}: {log_text(exc)}"
    else:
        logger.error("Could not store the error of job id=%s: %s", lease.job_id, refused)
        return state, plan
    logger.error(
        "Could not record the outcome of job id=%s as planned (%s); recording it as a failure",
        lease.job_id, problem,
    )  # fmt: skip
    message = f"(the outcome could not be recorded as planned: {problem})"
    plain = error_record(error["type"], message, lease.attempt)
    plan = plain_failure_plan(outcome.flight, conf)
    try:
        return leases.fail(dialect, lease, plain, **plan), plan
    except PERMANENT_ERRORS as exc:
        on_refused()
        logger.error(
            "Could not record the failure of job id=%s at all (%s); its lease is left to "
            "expire", lease.job_id, log_text(exc),
        )  # fmt: skip
        return None, plan


def send_outcome_signals(outcome: Outcome, state: str | None) -> None:
    """Send job_finished, or job_failed (and job_dead), for a recorded outcome."""
    if state is None:
        return  # the lease was lost: another worker owns the job's fate
    if outcome.error is None:
        if signals.job_finished.receivers:
            kwargs = about(outcome.flight, outcome.duration)
            result = outcome.result if state == "done" else None  # a cancelled one's is dropped
            signals.send(signals.job_finished, **kwargs, state=state, result=result)
        return
    if signals.job_failed.receivers:
        kwargs = about(outcome.flight, outcome.duration)
        signals.send(signals.job_failed, **kwargs, error=outcome.error, state=state)
    if state == "dead" and signals.job_dead.receivers:
        signals.send(
            signals.job_dead, **about(outcome.flight, outcome.duration), error=outcome.error
        )


def log_outcome(outcome: Outcome, state: str | None, plan: dict[str, Any] | None = None) -> None:
    """Log what became of an attempt."""
    flight = outcome.flight
    job, lease = flight.job, flight.lease
    extra = log_extra(flight, outcome.duration, state)
    if state is None:
        logger.warning(
            "Lost the lease on job id=%s type=%s attempt=%s; its outcome was discarded",
            job.pk, job.type, lease.attempt, extra=extra,
        )  # fmt: skip
        return
    if outcome.error is None:
        logger.debug(
            "Job id=%s type=%s attempt=%s %s in %.3fs",
            job.pk, job.type, lease.attempt, state, outcome.duration, extra=extra,
        )  # fmt: skip
        return
    exc = outcome.error
    when = ""
    if state in ("ready", "scheduled") and plan:
        asked = isinstance(exc, Retry) and plan.get("retry_in") == exc.delay
        if plan.get("retry_at") is not None or asked:
            when = f" (retry asked for: delay={plan.get('retry_in')} at={plan.get('retry_at')})"
        else:
            when = f", retry in {plan.get('retry_in', 0):.1f}s"
    verb = {"ready": "failed", "scheduled": "failed", "dead": "died", "cancelled": "was cancelled"}
    cls = type(exc)
    logger.log(
        logging.ERROR if state == "dead" else logging.WARNING,
        "Job id=%s type=%s attempt=%s %s after %.3fs%s: %s.%s: %s",
        job.pk, job.type, lease.attempt, verb.get(state, state), outcome.duration, when,
        cls.__module__, cls.__qualname__, log_text(exc), extra=extra,
    )  # fmt: skip
