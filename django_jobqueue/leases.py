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
from typing import Any

from django.db.models import F, Q

from . import wake
from .dialects import Dialect
from .dialects.functions import DbNow
from .models import Job, JobDependency

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


def _seconds(value: float) -> dt.timedelta:
    return dt.timedelta(seconds=value)


def claim(
    dialect: Dialect, *, owner: str, queues: list[str], limit: int, lease_ttl: float
) -> list[Job]:
    """Claim up to `limit` ready jobs for `owner` in one transaction.

    The ready rows are read with the dialect's claim lock (FOR UPDATE SKIP LOCKED, or the
    SQLite write lock taken at BEGIN IMMEDIATE) and flipped to `leased` in the same
    transaction, so two workers can never claim the same row.
    """

    def txn() -> list[Job]:
        jobs = Job.objects.using(dialect.using)
        candidates = jobs.ready().in_queues(queues).order_by("-priority", "pk")
        rows = list(dialect.lock(candidates)[:limit])
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


def start(dialect: Dialect, lease: Lease) -> bool:
    """Mark the leased job `running`; False when the lease was lost before it started."""
    return bool(
        Job.objects.using(dialect.using)
        .filter(lease.q())
        .update(state=Job.State.RUNNING, started_at=DbNow(), updated_at=DbNow())
    )


def renew(dialect: Dialect, leases: Iterable[Lease], lease_ttl: float) -> int:
    """Push back the deadline of every lease in `leases` in one statement; return rows renewed."""
    condition = Q()
    for lease in leases:
        condition |= lease.q()
    if not condition:
        return 0
    return (
        Job.objects.using(dialect.using)
        .filter(condition)
        .update(lease_expires=DbNow() + _seconds(lease_ttl), heartbeat_at=DbNow())
    )


def finish(dialect: Dialect, lease: Lease, result: Any) -> bool:
    """Store `result` and mark the job `done` atomically; release jobs that waited on it.

    Returns False (and writes nothing) when the lease is no longer current.
    """

    def txn() -> bool:
        jobs = Job.objects.using(dialect.using)
        updated = jobs.filter(lease.q()).update(
            state=Job.State.DONE,
            result=result,
            lease_owner=None,
            lease_expires=None,
            finished_at=DbNow(),
            updated_at=DbNow(),
        )
        if updated:
            _promote_downstream(dialect, lease.job_id)
        return bool(updated)

    return dialect.run_in_transaction(txn)


def _promote_downstream(dialect: Dialect, upstream_id: int) -> None:
    """Flip the waiting downstream jobs of `upstream_id` whose upstreams are now all done.

    The downstream rows are locked (in id order) before their upstreams are counted, so of two
    upstreams finishing at once the later one sees the earlier one's commit and promotes.
    """
    jobs = Job.objects.using(dialect.using)
    waiting = dialect.lock_blocking(
        jobs.filter(
            state=Job.State.WAITING,
            pk__in=JobDependency.objects.using(dialect.using)
            .filter(depends_on_id=upstream_id)
            .values("job_id"),
        ).order_by("pk")
    )
    candidates = list(waiting.values_list("pk", flat=True))
    if not candidates:
        return
    still_blocked = set(
        JobDependency.objects.using(dialect.using)
        .filter(job_id__in=candidates)
        .exclude(depends_on__state=Job.State.DONE)
        .values_list("job_id", flat=True)
    )
    ready = [pk for pk in candidates if pk not in still_blocked]
    if ready:
        jobs.filter(pk__in=ready, state=Job.State.WAITING).update(
            state=Job.State.READY, updated_at=DbNow()
        )
        queues = set(jobs.filter(pk__in=ready).values_list("queue", flat=True))
        for queue in queues:
            _notify_on_commit(dialect, queue)


def _notify_on_commit(dialect: Dialect, queue: str) -> None:
    from django.db import transaction

    transaction.on_commit(lambda: wake.notify(dialect.using, queue), using=dialect.using)


def backoff_seconds(attempt: int, base: float, cap: float) -> float:
    """Return the delay before retry number `attempt`: exponential, capped, with +-25% jitter."""
    delay = min(cap, base * (2 ** max(0, attempt - 1)))
    return float(delay * random.uniform(0.75, 1.25))


def fail(
    dialect: Dialect,
    lease: Lease,
    error: dict[str, Any],
    *,
    retry_in: float | None = None,
    retry_at: dt.datetime | None = None,
    dead: bool = False,
) -> str | None:
    """Record a failed attempt: back to `ready` after a delay, or `dead`.

    Returns the new state, or None when the lease is no longer current.
    """
    values: dict[str, Any] = {
        "lease_owner": None,
        "lease_expires": None,
        "last_error": error,
        "updated_at": DbNow(),
    }
    if dead:
        values.update(state=Job.State.DEAD, finished_at=DbNow())
    else:
        values["state"] = Job.State.READY
        if retry_at is not None:
            values["run_after"] = retry_at
        else:
            values["run_after"] = DbNow() + _seconds(retry_in or 0.0)
    updated = Job.objects.using(dialect.using).filter(lease.q()).update(**values)
    return str(values["state"]) if updated else None


def release(dialect: Dialect, leases: Iterable[Lease]) -> int:
    """Hand leased jobs back to `ready` without charging the attempt (graceful shutdown)."""
    condition = Q()
    for lease in leases:
        condition |= lease.q()
    if not condition:
        return 0
    return (
        Job.objects.using(dialect.using)
        .filter(condition)
        .update(
            state=Job.State.READY,
            attempts=F("attempts") - 1,
            lease_owner=None,
            lease_expires=None,
            updated_at=DbNow(),
        )
    )
