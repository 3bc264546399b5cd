"""run_jobs(): run queued jobs in the caller's thread, through the worker's own code paths.

A worker claims (`leases.claim`), runs (`attempts.run`) and records (`outcomes.record`);
the graph reacts inside those writes (`workflows`). This module does the same, one job at a
time, in the calling thread and on its database connection, so a test sees exactly what
production would write. Only the wiring differs: no threads, no heartbeat, no reclaimer, and
inside a test's wrapping transaction the engine's transactions become savepoints of it (see
`_InCallerTransaction`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, TypeVar

from django.db import DatabaseError, transaction

from .. import conf as conf_module
from ..dialects import Dialect, get_dialect
from ..engine import attempts, events, leases, outcomes, staging
from ..exceptions import JobQueueError
from ..models import Job
from ..models.functions import DbNow

if TYPE_CHECKING:
    from ..conf import JobQueueSettings

logger = logging.getLogger(__name__)

T = TypeVar("T")

__all__ = ["DEFAULT_MAX_RUNS", "RunReport", "RunawayJobsError", "run_jobs"]

# Attempts one run_jobs() call makes at most, unless told otherwise.
DEFAULT_MAX_RUNS = 1000


class RunawayJobsError(JobQueueError):
    """run_jobs() made `max_runs` attempts and jobs were still runnable.

    Usually a handler that enqueues another job every time it runs, or a job that retries
    forever. The job that would have run next was handed back to `ready` untouched.
    """


@dataclasses.dataclass
class RunReport:
    """What one run_jobs() call did.

    Attributes:
        jobs: Every job that ran at least once, in the order of its first attempt, read back
            from the database after the last attempt (so `state`, `result`, `attempts` and
            `last_error` are final for this run).
        attempts: How many attempts ran (a job retried twice counts three times).
    """

    jobs: list[Job] = dataclasses.field(default_factory=list)
    attempts: int = 0

    @property
    def counts(self) -> Counter[str]:
        """How many of the jobs that ran ended in each state, such as `{"done": 3}`."""
        return Counter(str(job.state) for job in self.jobs)

    def __len__(self) -> int:
        return len(self.jobs)

    def of_type(self, type: str) -> list[Job]:
        """The jobs that ran whose handler key is `type`.

        Args:
            type: A handler key, such as `"shop.send_confirmation"`.

        Returns:
            The matching jobs, in the order of their first attempt.
        """
        return [job for job in self.jobs if job.type == type]


def run_jobs(
    *,
    queues: Iterable[str] | None = None,
    ignore_delays: bool = True,
    max_runs: int = DEFAULT_MAX_RUNS,
) -> RunReport:
    """Run queued jobs in this thread until none is runnable; return what ran.

    Jobs run one at a time, highest priority first, then oldest, through the worker's own
    claim, run and record functions: dependencies, containers, retries, `Retry`, `Fail`, the
    `dead` state, cancellation and the cascade to downstream jobs behave as in production.
    Jobs that become runnable while it runs (downstream jobs, retries, jobs a handler
    enqueues) run too. Handlers run in the calling thread, on its database connection: inside
    a test's transaction they see the test's uncommitted rows, and no `transaction=True` is
    needed.

    Args:
        queues: Run only the jobs of these queues; one name will do. None or an empty list
            means every queue, as for the worker.
        ignore_delays: Treat every delay as over: a retry's backoff, `Retry(delay=...)` and a
            `run_after` in the future. Such jobs are made due now (their `run_after` becomes
            the current time) and run at once, so a test never sleeps. With False, a job that
            is not due yet is left `scheduled` and the call returns without it.
        max_runs: Raise `RunawayJobsError` rather than start attempt number `max_runs + 1`:
            a guard against handlers that enqueue forever.

    Returns:
        A `RunReport` with the jobs that ran (read back from the database) and the number of
        attempts.

    Raises:
        RunawayJobsError: More than `max_runs` attempts would have been needed.
        ValueError: `max_runs` is not a positive integer.
    """
    if isinstance(max_runs, bool) or not isinstance(max_runs, int) or max_runs < 1:
        raise ValueError(f"max_runs must be a positive integer, not {max_runs!r}")
    settings = conf_module.get()
    dialect = testing_dialect(settings.database)
    owner = f"run_jobs:{os.getpid()}:{secrets.token_hex(3)}"
    names = sorted({queues} if isinstance(queues, str) else set(queues or ()))
    ran: dict[int, None] = {}  # job ids, in the order of their first attempt
    types: Counter[str] = Counter()  # attempts per handler key, for the runaway message
    report = RunReport()
    while True:
        _promote(dialect, settings, names, ignore_delays=ignore_delays)
        claimed = leases.claim(
            dialect, owner=owner, queues=names, limit=1, lease_ttl=settings.lease_ttl
        )
        if not claimed:
            break
        job = claimed[0]
        lease = leases.Lease(job.id, owner, job.attempts)
        if report.attempts >= max_runs:
            leases.release(dialect, [lease])  # not charged: the job is as it was
            raise RunawayJobsError(_runaway_message(max_runs, types, job.type))
        flight = attempts.InFlight(
            job=job,
            lease=lease,
            claimed=time.monotonic(),
            lease_ttl=settings.lease_ttl,
            ignore_delays=ignore_delays,
            apply_limits=False,
        )
        ran.setdefault(job.id, None)
        types[job.type] += 1
        report.attempts += 1
        outcome = _run_handler(dialect, settings, flight)
        if outcome is not None:
            _record(dialect, settings, owner, outcome)
    if ran:
        by_id = Job.objects.using(dialect.using).in_bulk(list(ran))
        report.jobs = [by_id[pk] for pk in ran if pk in by_id]
    return report


def _promote(
    dialect: Dialect, settings: JobQueueSettings, queues: list[str], *, ignore_delays: bool
) -> None:
    """Make due what is due (as the worker's promoter does); with `ignore_delays`, everything."""
    if ignore_delays:

        def make_due() -> int:
            later = Job.objects.using(dialect.using).in_queues(queues)
            return later.filter(state__in=Job.RUNNABLE_STATES, run_after__gt=DbNow()).update(
                run_after=DbNow(), updated_at=DbNow()
            )

        dialect.run_in_transaction(make_due)
    while staging.promote_due(dialect, batch=settings.reclaim_batch):
        pass
    while events.expire_waits(dialect, batch=settings.reclaim_batch):  # timed out by the clock
        pass


def _run_handler(
    dialect: Dialect, settings: JobQueueSettings, flight: attempts.InFlight
) -> attempts.Outcome | None:
    """Run the handler as a worker thread would (`attempts.run`), in this thread.

    Inside a transaction, the attempt runs in a savepoint that is rolled back when the
    handler failed with a database error: on PostgreSQL the test's transaction would be
    unusable otherwise. Its other writes are kept, as a worker's (autocommit) would be.
    """
    if not dialect.connection.in_atomic_block:
        return attempts.run(dialect, settings, flight)
    with transaction.atomic(using=dialect.using):
        outcome = attempts.run(dialect, settings, flight)
        if outcome is not None and _database_error(outcome.error):
            # Rolled back to the savepoint when the block exits: as Django's atomic blocks
            # do, also when the handler left the transaction marked for rollback.
            transaction.set_rollback(True, using=dialect.using)
    return outcome


def _database_error(error: BaseException | None) -> bool:
    """Whether `error`, or an exception it was raised from or during, is a database error."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, DatabaseError):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


def _record(
    dialect: Dialect, settings: JobQueueSettings, owner: str, outcome: attempts.Outcome
) -> None:
    """Write an attempt's outcome as the worker's completer does (`outcomes.record`)."""
    if outcomes.record(dialect, settings, owner, [outcome]):
        raise _busy(outcome.flight.lease.job_id)


def _busy(job_id: int) -> RuntimeError:
    return RuntimeError(
        f"run_jobs() could not record job {job_id}: another connection holds its row locked "
        "(a worker running at the same time as the test?)"
    )


def _runaway_message(max_runs: int, types: Counter[str], next_type: str) -> str:
    most = ", ".join(f"{type!r} x{count}" for type, count in types.most_common(5))
    return (
        f"run_jobs() stopped after {max_runs} attempts with jobs still runnable (next: "
        f"{next_type!r}; most attempts: {most}). A handler that enqueues a job each time it "
        "runs, or a job that retries forever? If this many attempts are expected, pass a "
        "larger max_runs."
    )


# -- the engine's transactions inside the caller's ---------------------------------------------


class _InCallerTransaction(Dialect):
    """A dialect whose write transactions nest in the caller's open transaction.

    A worker's dialect refuses to start a transaction inside another one (a worker's writes
    must commit on their own). In a test, the caller's transaction is the test's, rolled back
    at its end: each engine transaction becomes a savepoint of it, so that an error rolls back
    exactly what that transaction wrote, and single-statement writes run as they are. Outside
    any transaction (a `transaction=True` test) everything is as in a worker.
    """

    def run_in_transaction(self, func: Callable[[], T], *, tries: int | None = None) -> T:
        if self.connection.in_atomic_block:
            with transaction.atomic(using=self.using):
                return func()
        return super().run_in_transaction(func, tries=tries)

    def run_statement(self, func: Callable[[], T]) -> T:
        if self.connection.in_atomic_block:
            return func()
        return super().run_statement(func)

    @property
    def autocommit_statements(self) -> bool:
        return not self.connection.in_atomic_block and super().autocommit_statements


_classes: dict[type[Dialect], type[Dialect]] = {}


def testing_dialect(using: str) -> Dialect:
    """Return the dialect of database `using`, with its transactions nesting in the caller's."""
    base = type(get_dialect(using))
    cls = _classes.get(base)
    if cls is None:
        cls = _classes[base] = type(f"Testing{base.__name__}", (_InCallerTransaction, base), {})
    return cls(using)
