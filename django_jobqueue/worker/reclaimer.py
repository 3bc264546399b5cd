"""The reclaimer: takes leases back from workers that are gone, and sweeps their rows.

A gone worker's row (stopped, or found dead here) is kept GONE_KEPT seconds with the count of
the jobs taken back from it, for the Workers page, then deleted by the same sweep.

Any worker does this for all, every RECLAIM_INTERVAL, in bounded batches. A job whose lease
ran out is only a candidate: it is reclaimed when its owner's row has expired (the worker is
gone or has been unable to beat for a whole TTL) or when its owner, alive, no longer lists the
job (it lost track of it). A live owner that lists the job keeps it, whatever kept its lease
row from being renewed (an application holding the row locked for minutes, say), and the
lease row is pushed back to the owner's own expiry.

A reclaimer also judges others only while it is healthy itself: after a database outage or a
long lock that stopped every heartbeat, it first sees its own beats succeed for a whole lease
TTL, which gives the other workers the same time to beat again.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError
from django.db.models import F, QuerySet

from .. import signals, telemetry
from ..dialects import Dialect
from ..dialects.base import seconds
from ..engine import workflows
from ..engine.error_records import error_record, with_error
from ..exceptions import LeaseExpired
from ..models import Job, Worker
from ..models.functions import DbNow
from . import processes
from .duty import Duty

logger = logging.getLogger(__name__)
# The error.type of a reclaimed attempt, in the OpenTelemetry metrics.
LEASE_EXPIRED = f"{LeaseExpired.__module__}.{LeaseExpired.__qualname__}"

GONE_KEPT = 3600.0  # seconds a gone worker's row stays on the Workers page


@dataclasses.dataclass
class _Owner:
    alive: bool
    expires_at: dt.datetime | None
    lease_ttl: float | None
    job_ids: set[int]


def reclaim_expired(
    dialect: Dialect,
    *,
    batch: int,
    may_judge: Callable[[float | None], bool] = lambda ttl: True,
    owner: str | None = None,
    reason: str = "lease of worker {owner} expired during attempt {attempt}",
) -> list[tuple[int, str]]:
    """Reclaim up to `batch` expired leases whose owner is gone or no longer holds the job.

    Such a job goes back to `scheduled`, due at once (its attempt charged as for any failure,
    but no retry backoff: its worker died, which was not the job's fault), or to `dead` when
    its attempts are spent (`cancelled` if cancellation was requested): a job that keeps
    killing its worker reaches `dead` after `max_attempts` reclaims. Rows another transaction
    holds locked are skipped, so concurrent sweeps never wait on each other.
    `may_judge(owner_ttl)` says whether this worker has been healthy long enough to call an
    owner with that TTL gone. With `owner`, only that worker's leases are looked at. `reason`
    is the error recorded (with `{owner}` and `{attempt}`). Returns (job id, new state) pairs.
    """

    failed: list[tuple[Any, ...]] = []  # (row, state) of attempts ended here, for signals

    def txn() -> list[tuple[int, str]]:
        failed.clear()  # a retried transaction starts over
        jobs = Job.objects.using(dialect.using)
        candidates = jobs.expired() if owner is None else jobs.expired().filter(lease_owner=owner)
        expired = list(
            dialect.lock(candidates.order_by("lease_expires", "pk")).values_list(
                "pk",
                "attempts",
                "max_attempts",
                "lease_owner",
                "parent_id",
                "cancel_requested",
                "errors",
                "has_dependents",
                "type",
                "queue",
                "group_key",
            )[:batch]
        )
        if not expired:
            return []
        owners = _owners(dialect, {str(row[3]) for row in expired})
        moved: list[tuple[int, str]] = []
        for row in expired:
            pk, attempts, max_attempts, holder, parent_id, cancel, errors, deps = row[:8]
            who = owners.get(str(holder))
            if who is not None and who.alive and pk in who.job_ids:
                # Alive and holding it: its lease row only missed renewals.
                jobs.filter(pk=pk, lease_owner=holder).update(lease_expires=who.expires_at)
                continue
            if (who is None or not who.alive) and not may_judge(who.lease_ttl if who else None):
                continue
            error = error_record(
                LeaseExpired, reason.format(owner=holder, attempt=attempts), attempts
            )
            if cancel or attempts >= max_attempts:
                state = Job.State.CANCELLED if cancel else Job.State.DEAD
                jobs.filter(pk=pk).update(
                    **workflows.terminal_values(
                        state, last_error=error, errors=with_error(errors, error)
                    )
                )
                workflows.on_terminal(dialect, pk, state, parent_id, has_dependents=deps)
            else:
                state = Job.State.SCHEDULED
                jobs.filter(pk=pk).update(
                    state=state,
                    run_after=DbNow(),
                    lease_owner=None,
                    lease_expires=None,
                    last_error=error,
                    errors=with_error(errors, error),
                    updated_at=DbNow(),
                )
            moved.append((pk, str(state)))
            failed.append((row, str(state)))
        return moved

    moved = dialect.run_in_transaction(txn)
    for pk, state in moved:
        logger.warning("Reclaimed expired lease of job id=%s -> %s", pk, state)
    if failed and telemetry.active is not None:
        for row, state in failed:
            telemetry.active.failed(row[-3], row[-2], state, LEASE_EXPIRED)
    if failed and (signals.connected(signals.job_failed) or signals.connected(signals.job_dead)):
        for row, state in failed:
            pk, attempts, _, holder, *_, job_type, queue, group = row
            exc = LeaseExpired(reason.format(owner=holder, attempt=attempts))
            about = {"job_id": pk, "job_type": job_type, "queue": queue, "group": group,
                     "attempt": attempts, "worker_id": holder, "duration": None}  # fmt: skip
            signals.send(signals.job_failed, **about, error=exc, state=state)
            if state == Job.State.DEAD:
                signals.send(signals.job_dead, **about, error=exc)
    if failed:
        _count_reclaimed(dialect, Counter(str(row[3]) for row, _ in failed))
    return moved


def reclaim_dead_worker(
    dialect: Dialect, worker_id: str, *, batch: int, reason: str | None = None
) -> list[tuple[int, str]]:
    """Reclaim at once every lease of `worker_id`, a worker process known to be dead.

    For the watchdog that killed it, or that saw it die: no other worker needs to wait for
    its leases to run out.
    Each job is charged the attempt it was in, as for any reclaimed lease, and the worker's
    row is marked gone. Returns (job id, new state) pairs.
    """
    jobs = Job.objects.using(dialect.using)
    rows = Worker.objects.using(dialect.using).filter(pk=worker_id)
    past = DbNow() - seconds(1.0)

    def expire() -> None:
        rows.update(expires_at=past)
        jobs.in_flight().filter(lease_owner=worker_id).update(lease_expires=past)

    dialect.run_in_transaction(expire)
    moved: list[tuple[int, str]] = []
    while True:
        chunk = reclaim_expired(
            dialect,
            batch=batch,
            owner=worker_id,
            reason=reason or KILLED_REASON,
        )
        moved += chunk
        if len(chunk) < batch:
            break
    rows.live().update(gone_at=DbNow(), job_ids=[])
    return moved


KILLED_REASON = (
    "worker {owner} was killed by its watchdog during attempt {attempt}: the process had "
    "stopped running Python code (a handler holding the GIL?)"
)
DIED_REASON = (
    "worker {owner} died during attempt {attempt} (its watchdog saw the process gone and "
    "reclaimed its jobs at once)"
)
GONE_REASON = (
    "worker {owner} died during attempt {attempt} (a worker on its host found its process "
    "gone and reclaimed its jobs at once)"
)


def reclaim_gone_on_host(dialect: Dialect, *, batch: int, me: str) -> list[tuple[int, str]]:
    """Reclaim at once the leases of the workers of this host whose process is provably gone.

    Only the rows whose process identity names this host, boot and pid namespace are looked at
    (worker/processes.py): elsewhere nothing can be proven, and the lease rules. Returns (job
    id, new state) pairs.
    """
    moved: list[tuple[int, str]] = []
    for pk, process in _of_this_host(dialect).exclude(pk=me).values_list("pk", "process_key"):
        if processes.gone(process):
            logger.warning("Worker %s is gone from this host: reclaiming its jobs at once", pk)
            moved += reclaim_dead_worker(dialect, pk, batch=batch, reason=GONE_REASON)
    return moved


def any_reclaimable(dialect: Dialect, queues: list[str]) -> bool:
    """Whether a job in `queues` has an expired lease whose owner is gone or no longer lists it.

    The same test as `reclaim_expired`'s, without its lock: such a lease waits only for a
    reclaimer, so a burst worker does not exit while one is left. A worker of this host whose
    process is gone counts too, whatever its leases have left (`reclaim_gone_on_host` takes
    them back at its next tick, and marks its row gone).
    """
    rows = _of_this_host(dialect).values_list("process_key", flat=True)
    if any(processes.gone(key) for key in rows):
        return True
    expired = Job.objects.using(dialect.using).expired().in_queues(queues)
    holders = {
        str(owner)
        for owner in expired.order_by().values_list("lease_owner", flat=True).distinct()
        if owner is not None
    }
    owners = _owners(dialect, holders) if holders else {}
    for holder in sorted(holders):
        who = owners.get(holder)
        if who is None or not who.alive:
            return True
        held = expired.filter(lease_owner=holder).values_list("pk", flat=True)
        if any(pk not in who.job_ids for pk in held):
            return True
    return False


def _of_this_host(dialect: Dialect) -> QuerySet[Worker]:
    """The rows of the workers whose process names this host, boot and pid namespace (none
    where this process cannot tell them: processes.host() is "")."""
    here = processes.host()
    rows = Worker.objects.using(dialect.using).live()
    return rows.filter(process_key__startswith=f"{here}:") if here else rows.none()


def _owners(dialect: Dialect, ids: set[str]) -> dict[str, _Owner]:
    rows = Worker.objects.using(dialect.using).filter(pk__in=sorted(ids))
    alive = set(rows.alive().values_list("pk", flat=True))
    return {
        pk: _Owner(pk in alive, expires_at, ttl, set(job_ids or []))
        for pk, expires_at, ttl, job_ids in rows.values_list(
            "pk", "expires_at", "lease_ttl", "job_ids"
        )
    }


def _count_reclaimed(dialect: Dialect, by_owner: Counter[str]) -> None:
    """Add to each owner's count of jobs reclaimed (shown on the Workers page).

    After the reclaim's commit, in a transaction of its own: the reclaim locks job rows, and
    `reclaim_dead_worker` writes a worker row before job rows; the two never wait in a circle.
    A count is only shown, never relied on: one that cannot be written (a lost connection,
    contention) is logged and left, after the reclaim's signals were sent.
    """
    workers = Worker.objects.using(dialect.using)

    def txn() -> None:
        for owner, n in sorted(by_owner.items()):
            workers.filter(pk=owner).update(jobs_reclaimed=F("jobs_reclaimed") + n)

    try:
        dialect.run_in_transaction(txn)
    except DatabaseError as exc:
        logger.warning("Could not count the jobs reclaimed from %s: %s", sorted(by_owner), exc)


def _stale_workers(dialect: Dialect, stale_after: float) -> QuerySet[Worker]:
    return (
        Worker.objects.using(dialect.using)
        .live()
        .filter(heartbeat_at__lt=DbNow() - seconds(stale_after))
    )


def _past_keeping(dialect: Dialect) -> QuerySet[Worker]:
    return Worker.objects.using(dialect.using).filter(gone_at__lt=DbNow() - seconds(GONE_KEPT))


def sweep_workers(dialect: Dialect, *, stale_after: float) -> int:
    """Mark gone the Worker rows whose heartbeat is older than four of their own lease TTLs
    (and than `stale_after` seconds): a worker with a longer TTL than this one is judged by
    its own. Delete the rows gone for over GONE_KEPT seconds. Returns the rows marked gone.
    """
    _past_keeping(dialect).delete()
    rows = (
        _stale_workers(dialect, stale_after)
        .annotate(now=DbNow())
        .values_list("pk", "heartbeat_at", "lease_ttl", "now")
    )
    doomed = [
        pk
        for pk, beat, ttl, now in rows
        if (now - beat).total_seconds() > max(stale_after, 4 * (ttl or 0.0))
    ]
    if not doomed:
        return 0
    # Still stale as it is marked: a worker that beat since the read above keeps its row.
    live = _stale_workers(dialect, stale_after).filter(pk__in=doomed)
    return live.update(gone_at=DbNow(), expires_at=DbNow(), job_ids=[])


class Reclaimer(Duty):
    """Every RECLAIM_INTERVAL: reclaim leases of gone workers, then sweep stale worker rows."""

    def __init__(
        self,
        dialect: Dialect,
        *,
        interval: float,
        lock_timeout: float,
        batch: int,
        lease_ttl: float,
        healthy_for: Callable[[], float],
        on_reclaimed: Callable[[list[tuple[int, str]]], None] | None = None,
        worker_id: str = "",
    ) -> None:
        super().__init__(dialect, interval=interval, lock_timeout=lock_timeout)
        self.batch = batch
        self.lease_ttl = lease_ttl
        self.healthy_for = healthy_for
        self.on_reclaimed = on_reclaimed
        self.worker_id = worker_id
        # True from before a reclaim's transaction until on_reclaimed has its outcome: a burst
        # worker reading the database meanwhile cannot tell a job reclaimed here yet.
        self.reclaiming = False

    def may_judge(self, owner_ttl: float | None) -> bool:
        """Whether this worker has beaten without a gap for a whole TTL (its own, the owner's)."""
        return self.healthy_for() >= max(self.lease_ttl, owner_ttl or 0.0)

    def tick(self) -> float | None:
        # Reads first: an idle reclaimer opens no write transaction (on SQLite, that would
        # take the database's write lock every second for nothing).
        stale_after = self.lease_ttl * 4
        if self.may_judge(None) and (
            _stale_workers(self.dialect, stale_after).exists()
            or _past_keeping(self.dialect).exists()
        ):
            sweep_workers(self.dialect, stale_after=stale_after)
        self.reclaiming = True
        try:
            # The workers of this host whose process is gone: proven dead, their leases are
            # taken back now, not once they run out (and whatever this worker's health).
            moved = reclaim_gone_on_host(self.dialect, batch=self.batch, me=self.worker_id)
            if Job.objects.using(self.dialect.using).expired().exists():
                moved += reclaim_expired(
                    self.dialect,
                    batch=self.batch,
                    may_judge=self.may_judge,
                )
            if moved and self.on_reclaimed is not None:
                self.on_reclaimed(moved)
        finally:
            self.reclaiming = False
        return 0.0 if len(moved) >= self.batch else None
