"""Lease transitions, each conditioned on (job id, owner, generation).

A claim increments `attempts`; that number is the claim's generation. Every later write by
the claiming worker (start, renew, finish, fail, release) matches id, owner, generation and a
leased state, so an attempt whose lease was reclaimed changes nothing: it gets 0 rows back.
All deadlines use the database clock (DbNow), never the worker's.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import random
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from django.db.models import F, Q

from . import workflows
from .dialects import Dialect
from .dialects.functions import DbNow
from .models import Job

if TYPE_CHECKING:
    from .scheduling import Scheduler

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Lease:
    """A worker's hold on one attempt of one job."""

    job_id: int
    owner: str
    attempt: int

    def q(self) -> Q:
        """Match the job row only while this lease is current."""
        return Q(
            pk=self.job_id,
            lease_owner=self.owner,
            attempts=self.attempt,
            state__in=Job.LEASED_STATES,
        )


MAX_DELAY = 10 * 365 * 24 * 3600.0  # seconds: any longer delay is cut to ten years


def _seconds(value: float) -> dt.timedelta:
    return dt.timedelta(seconds=min(max(0.0, value), MAX_DELAY))


def claim(
    dialect: Dialect,
    *,
    owner: str,
    queues: list[str],
    limit: int,
    lease_ttl: float,
    scheduler: Scheduler | None = None,
) -> list[Job]:
    """Claim up to `limit` ready jobs for `owner` in one transaction.

    The ready rows are read with the dialect's claim lock (FOR UPDATE SKIP LOCKED, or the
    SQLite write lock taken at BEGIN IMMEDIATE) and flipped to `leased` in the same
    transaction, so two workers can never claim the same row.
    """

    def txn() -> list[Job]:
        jobs = Job.objects.using(dialect.using)
        ready = jobs.ready().in_queues(queues)
        if scheduler is None:
            rows = list(dialect.lock(ready.order_by("-priority", "pk"))[:limit])
        else:
            rows = scheduler.select(dialect, ready, limit)
        if not rows:
            return []
        jobs.filter(pk__in=[r.pk for r in rows]).update(
            state=Job.State.LEASED,
            attempts=F("attempts") + 1,
            lease_owner=owner,
            lease_expires=DbNow() + _seconds(lease_ttl),
            heartbeat_at=DbNow(),
            updated_at=DbNow(),
        )
        for row in rows:
            row.state = Job.State.LEASED
            row.attempts += 1
            row.lease_owner = owner
        return rows

    return dialect.run_in_transaction(txn)


def start(dialect: Dialect, lease: Lease, worker_ids: list[str] | None = None) -> bool:
    """Mark the leased job `running` (recording `worker_ids`); False when the lease was lost."""
    values: dict[str, Any] = {"state": Job.State.RUNNING, "started_at": DbNow()}
    if worker_ids is not None:
        values["worker_ids"] = worker_ids
    return bool(
        Job.objects.using(dialect.using).filter(lease.q()).update(updated_at=DbNow(), **values)
    )


def renew(dialect: Dialect, leases: Iterable[Lease], lease_ttl: float) -> int:
    """Push back the deadline of every lease in `leases` in one statement; return rows renewed."""
    condition = Q()
    for lease in leases:
        condition |= lease.q()
    if not condition:
        return 0

    def txn() -> int:
        # SKIP LOCKED: a row a producer holds locked (an enqueue depending on it, a cancel in a
        # long transaction) must not stall the renewal of all the others. The skipped row can
        # not be reclaimed meanwhile either (reclaim skips locked rows); it is renewed next time.
        jobs = Job.objects.using(dialect.using)
        free = list(dialect.lock(jobs.filter(condition)).values_list("pk", flat=True))
        if not free:
            return 0
        return jobs.filter(condition, pk__in=free).update(
            lease_expires=DbNow() + _seconds(lease_ttl), heartbeat_at=DbNow()
        )

    return dialect.run_in_transaction(txn)


def finish(
    dialect: Dialect, lease: Lease, result: Any, *, parent_id: int | None = None
) -> str | None:
    """Store `result` and mark the job `done` atomically; the graph reacts in the same transaction.

    A job whose cancellation was requested while it ran ends `cancelled` and its result is
    discarded. Returns the final state, or None (writing nothing) when the lease is lost.
    """

    def txn() -> str | None:
        jobs = Job.objects.using(dialect.using)
        state = Job.State.DONE
        if not jobs.filter(lease.q(), cancel_requested=False).update(
            **workflows.terminal_values(state, result=result)
        ):
            state = Job.State.CANCELLED
            if not jobs.filter(lease.q()).update(**workflows.terminal_values(state)):
                return None
        workflows.on_terminal(dialect, lease.job_id, state, parent_id)
        return str(state)

    return dialect.run_in_transaction(txn)


def backoff_seconds(attempt: int, base: float, cap: float) -> float:
    """Return the delay before retry number `attempt`: exponential, capped, with +-25% jitter."""
    # The exponent is capped before the power, or attempt 1025 would overflow a float.
    delay = min(cap, base * 2.0 ** min(max(0, attempt - 1), 60))
    return float(delay * random.uniform(0.75, 1.25))


def fail(
    dialect: Dialect,
    lease: Lease,
    error: dict[str, Any],
    *,
    retry_in: float | None = None,
    retry_at: dt.datetime | None = None,
    dead: bool = False,
    parent_id: int | None = None,
    previous_errors: list[dict[str, Any]] | None = None,
) -> str | None:
    """Record a failed attempt: back to `ready` after a delay, or `dead`.

    A job whose cancellation was requested ends `cancelled` instead. Returns the new state, or
    None when the lease is no longer current.
    """

    errors = [*(previous_errors or []), error]

    def txn() -> str | None:
        jobs = Job.objects.using(dialect.using)
        # Lock the row first: an UPDATE that matches nothing locks nothing, so a cancel()
        # committing between the two UPDATEs below would be lost.
        if not list(dialect.lock_blocking(jobs.filter(lease.q())).values_list("pk", flat=True)):
            return None
        if jobs.filter(lease.q(), cancel_requested=True).update(
            **workflows.terminal_values(Job.State.CANCELLED, last_error=error, errors=errors)
        ):
            workflows.on_terminal(dialect, lease.job_id, Job.State.CANCELLED, parent_id)
            return str(Job.State.CANCELLED)
        if dead:
            if not jobs.filter(lease.q()).update(
                **workflows.terminal_values(Job.State.DEAD, last_error=error, errors=errors)
            ):
                return None
            workflows.on_terminal(dialect, lease.job_id, Job.State.DEAD, parent_id)
            return str(Job.State.DEAD)
        run_after = retry_at if retry_at is not None else DbNow() + _seconds(retry_in or 0.0)
        updated = jobs.filter(lease.q()).update(
            state=Job.State.READY,
            run_after=run_after,
            lease_owner=None,
            lease_expires=None,
            last_error=error,
            errors=errors,
            updated_at=DbNow(),
        )
        return str(Job.State.READY) if updated else None

    return dialect.run_in_transaction(txn)


def release(dialect: Dialect, leases: Iterable[Lease]) -> int:
    """Hand leased jobs back to `ready` without charging the attempt (graceful shutdown).

    A job whose cancellation was requested is not handed back: it ends `cancelled`.
    """
    condition = Q()
    for lease in leases:
        condition |= lease.q()
    if not condition:
        return 0

    def txn() -> int:
        jobs = Job.objects.using(dialect.using)
        doomed = list(
            dialect.lock_blocking(
                jobs.filter(condition, cancel_requested=True).order_by("pk")
            ).values_list("pk", "parent_id")
        )
        for pk, parent_id in doomed:
            jobs.filter(pk=pk).update(**workflows.terminal_values(Job.State.CANCELLED))
            workflows.on_terminal(dialect, pk, Job.State.CANCELLED, parent_id)
        return len(doomed) + jobs.filter(condition).update(
            state=Job.State.READY,
            attempts=F("attempts") - 1,
            lease_owner=None,
            lease_expires=None,
            updated_at=DbNow(),
        )

    return dialect.run_in_transaction(txn)
