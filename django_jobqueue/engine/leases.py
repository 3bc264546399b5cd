"""Lease transitions, each conditioned on (job id, owner, generation).

A claim increments `attempts`; that number is the claim's generation. Every later write by
the claiming worker (finish, fail, release, renew) matches id, owner, generation and a leased
state, so an attempt whose lease was reclaimed changes nothing: it gets 0 rows back. All
deadlines use the database clock (DbNow), never the worker's. The claim marks jobs `running`
at once: a claimed job's handler starts within milliseconds, so a separate `running` write
would cost a transaction per job and buy nothing.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
import logging
import random
from collections.abc import Collection, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from django.db.models import F, Q

from .. import pausing, registry, versions
from ..dialects import Dialect, get_dialect
from ..dialects.base import MAX_DELAY, seconds
from ..lease_results import ClaimedJob, Finished, FinishReport
from ..models import Job, JobQuerySet
from ..models.functions import DbNow
from . import quarantine, workflows
from .error_records import with_error

if TYPE_CHECKING:
    from .fair_selection import FairShare

logger = logging.getLogger("django_jobqueue.leases")

__all__ = [
    "BUSY",
    "MAX_DELAY",
    "Lease",
    "backoff_seconds",
    "claim",
    "fail",
    "finish",
    "renew_leases",
]

# fail() could not lock the job's row (another transaction holds it): try again later.
BUSY = "busy"

# The states a failed attempt leaves its job in (a `scheduled` one may be `ready` since).
FAILED_ATTEMPT_STATES = (*Job.RUNNABLE_STATES, *Job.FAILED_STATES)


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


def current(leases: Iterable[Lease]) -> Q:
    """Match the job rows of every lease in `leases` while it is current (empty Q: none).

    One OR term per lease: for a few leases only (SQLite refuses an expression of about a
    thousand terms, and PostgreSQL plans it slowly); many leases go through `fences()`.
    """
    condition = Q()
    for lease in leases:
        condition |= lease.q()
    return condition


# Leases fenced by one statement: the transaction of each chunk holds a few hundred row locks
# (or SQLite's write lock) for milliseconds, however many leases a worker holds. A chunk ORs
# at most FENCE_TERMS (owner, generation) groups, far below SQLite's expression depth limit.
FENCE_CHUNK = 500
FENCE_TERMS = 32


def fences(leases: Iterable[Lease], size: int = FENCE_CHUNK) -> Iterator[tuple[Q, int]]:
    """Yield (condition, n): matches of the current rows of `leases`, n <= `size` leases each.

    Leases of one owner and generation share a term (`pk IN ids AND lease_owner AND
    attempts`): the generation fence of each lease holds, and the statement is an indexed
    lookup by primary key whatever the number of leases (a list of at most `size`
    parameters, below every database's limit).
    """
    groups: dict[tuple[str, int], list[int]] = {}
    for lease in leases:
        groups.setdefault((lease.owner, lease.attempt), []).append(lease.job_id)
    condition, count, terms = Q(), 0, 0
    for (owner, attempt), ids in sorted(groups.items()):
        ids.sort()
        while ids:
            if count == size or terms == FENCE_TERMS:
                yield condition, count
                condition, count, terms = Q(), 0, 0
            piece, ids = ids[: size - count], ids[size - count :]
            condition |= Q(
                pk__in=piece, lease_owner=owner, attempts=attempt, state__in=Job.LEASED_STATES
            )
            count, terms = count + len(piece), terms + 1
    if condition:
        yield condition, count


def claim(
    dialect: Dialect,
    *,
    owner: str,
    queues: list[str],
    limit: int,
    lease_ttl: float,
    fair_share: FairShare | None = None,
) -> list[ClaimedJob]:
    """Claim up to `limit` ready jobs for `owner` in one transaction; they are `running`.

    The ready rows are locked (FOR UPDATE SKIP LOCKED, or the SQLite write lock taken at
    BEGIN IMMEDIATE) and marked in the same transaction, so two workers can never claim the
    same row. Without fair share or limits to apply this is one UPDATE ... RETURNING where the
    database has it. Jobs of paused queues, resources and workflows are left out: the worker's
    `fair_share` keeps what is paused for FAIR_SHARE_REFRESH seconds; without one it is read
    at each call.
    """

    # Only the types this process has handlers for, and of those the jobs started under a
    # version it has: a job of another release's handler waits for a worker that has it,
    # instead of dying here (rolling deploys). Paused queues are left out too.
    if limit <= 0:  # no room: the one-statement claims would compile an empty LIMIT
        return []
    types = registry.served()
    if not types:  # no handler here: nothing to claim (an empty IN list compiles to nothing)
        return []
    using = dialect.using
    paused = fair_share.paused_queues(using) if fair_share else pausing.paused_queues(using)
    held = fair_share.held(using) if fair_share else pausing.held(using)
    # Each queue once: a claim of several queues reads each one (Dialect.compile_merged), and
    # one read twice would hand the same rows twice (SKIP LOCKED skips others' locks only).
    shape = (tuple(dict.fromkeys(queues)), types, paused, held)
    ready = _ready(using, *shape)
    dynamic = fair_share.ask_dynamic(ready) if fair_share is not None else {}
    if dialect.autocommit_statements and (
        fair_share is None or not fair_share.needs_planning(ready)
    ):
        # One statement, its own transaction: no BEGIN and COMMIT round trips.
        return dialect.run_statement(
            lambda: dialect.claim_ready(
                ready, owner=owner, limit=limit, lease_ttl=lease_ttl, shape=shape
            )
        )

    def txn() -> list[ClaimedJob]:
        if fair_share is None or not fair_share.needs_planning(ready):
            return dialect.claim_ready(
                ready, owner=owner, limit=limit, lease_ttl=lease_ttl, shape=shape
            )
        rows = fair_share.select(dialect, ready, limit, dynamic)
        last = not fair_share.has_starts_to_record()  # then the marking ends the transaction
        claimed = dialect.mark_claimed(rows, owner=owner, lease_ttl=lease_ttl, last=last)
        fair_share.record_starts(dialect, claimed)  # after the jobs' started_at was stamped
        return claimed

    jobs = dialect.run_in_transaction(txn)
    if fair_share is not None and fair_share.bad_rows:  # candidates no claim can start
        quarantine.set_aside(dialect, fair_share.take_bad_rows())
    return jobs


def set_aside_unreadable(
    dialect: Dialect, *, queues: list[str], fair_share: FairShare | None = None
) -> list[int]:
    """After a claim failed: set aside the ready jobs it was reading whose rows no claim can
    read or start (see `quarantine`); return their ids (none: the database was to blame)."""
    types = registry.served()
    if not types:
        return []
    using = dialect.using
    paused = fair_share.paused_queues(using) if fair_share else pausing.paused_queues(using)
    held = fair_share.held(using) if fair_share else pausing.held(using)
    ready = _ready(using, tuple(dict.fromkeys(queues)), types, paused, held)
    planned = fair_share.last_reads if fair_share is not None else {}
    return quarantine.set_aside(dialect, quarantine.probe(dialect, ready, planned))


@functools.lru_cache(maxsize=64)
def _ready(
    using: str,
    queues: tuple[str, ...],
    types: versions.Served,
    paused: tuple[str, ...],
    held: pausing.Held = pausing.NOTHING_HELD,
) -> JobQuerySet:
    # Built once: a claim only clones it (or, with its SQL compiled already, not even that).
    # With nothing paused, nothing is added to the claim's statement.
    ready = Job.objects.using(using).ready().in_queues(queues).filter(versions.claim_filter(types))
    if paused:
        ready = ready.exclude(queue__in=paused)
    return ready.exclude(held.condition(get_dialect(using).id_set)) if held else ready


def finish_many(
    dialect: Dialect,
    owner: str,
    items: Sequence[tuple[int, int, str | None]],
    *,
    in_graph: Collection[int] = (),
) -> FinishReport:
    """Store each (job id, attempt, result as JSON text) and mark the job `done`, at once.

    Fenced by the lease of `owner`: jobs whose lease is gone are reported `lost` and untouched;
    rows locked by another transaction are reported `busy` (nothing waits for them). A job
    whose cancellation was requested while it ran ends `cancelled`, its result discarded. The
    graph reacts in the same transaction, and only for jobs whose rows say they have
    dependents or a container. `in_graph`: ids of jobs known to have (ClaimedJob.in_graph),
    which go to the transaction at once.
    """

    done: list[Finished] = []
    simple = [item for item in items if item[0] not in in_graph]
    if dialect.autocommit_statements and simple:
        # Jobs without dependents or container need nothing else in their transaction: one
        # statement in autocommit finishes them (their rows say so again: a job may have got
        # dependents since its claim); the others take the full transaction below.
        done = dialect.run_statement(lambda: dialect.finish_simple(owner=owner, items=simple))
        if len(done) == len(items):
            return FinishReport(done)
        finished = {f.job_id for f in done}
        items = [item for item in items if item[0] not in finished]

    def txn() -> FinishReport:
        report = dialect.finish_many(owner=owner, items=items)
        report.finished = workflows.settle_spawners(dialect, report.finished)
        workflows.on_finished(
            dialect, [f for f in report.finished if f.state in Job.TERMINAL_STATES]
        )
        return report

    report = dialect.run_in_transaction(txn)
    report.finished[:0] = done
    return report


def finish(
    dialect: Dialect, lease: Lease, result: Any, *, parent_id: int | None = None
) -> str | None:
    """Store `result` and mark the job `done` atomically; the graph reacts in the same transaction.

    A job whose cancellation was requested while it ran ends `cancelled` and its result is
    discarded. Returns the final state, or None (writing nothing) when the lease is lost.
    """
    text = None if result is None else json.dumps(result)
    report = finish_many(dialect, lease.owner, [(lease.job_id, lease.attempt, text)])
    if report.recorded:  # an earlier try's commit went through, its reply did not
        return report.recorded[0][1]
    return report.finished[0].state if report.finished else None


# Seconds one statement of a renewal may run, at most, where the server can bound it.
RENEW_STATEMENT_TIMEOUT = 5.0


def renew_leases(
    dialect: Dialect,
    leases: Iterable[Lease],
    lease_ttl: float,
    *,
    check: bool = False,
    statement_timeout: float = RENEW_STATEMENT_TIMEOUT,
) -> int:
    """Push back the deadline of every lease in `leases`; return how many are still held.

    Rows another transaction holds locked are skipped, not waited for. With `check`, a
    skipped lease that is still current counts as held. The leases are renewed in chunks of
    FENCE_CHUNK, each its own short transaction whose statements may run `statement_timeout`
    seconds at most: a worker holding thousands of leases never holds a transaction open
    for long.
    """
    leases = list(leases)

    def renew(condition: Q, count: int) -> int:
        with dialect.statement_timeout(statement_timeout):
            jobs = Job.objects.using(dialect.using)
            free = list(dialect.lock(jobs.filter(condition)).values_list("pk", flat=True))
            renewed = 0
            if free:
                renewed = jobs.filter(condition, pk__in=free).update(
                    lease_expires=DbNow() + seconds(lease_ttl), heartbeat_at=DbNow()
                )
            if check and renewed < count:
                renewed += jobs.filter(condition).exclude(pk__in=free).count()
            return renewed

    held = 0
    for condition, count in fences(leases):
        held += dialect.run_in_transaction(functools.partial(renew, condition, count), tries=2)
    return held


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
) -> str | None:
    """Record a failed attempt: back to `scheduled`/`ready` after a delay, or `dead`.

    A job whose cancellation was requested ends `cancelled` instead. Returns the new state,
    None when the lease is no longer current, or BUSY when another transaction holds the row
    locked (nothing is written; try again). The error history is read from the row under its
    lock. Written again after a COMMIT whose reply was lost, it writes nothing and returns
    the state the committed write left (see `_failed_earlier`).
    """
    delay = retry_in or 0.0
    # Due at once: `ready` now. Otherwise `scheduled`, out of the ready index until the
    # promoter finds it due (a retry_at already past is promoted at once).
    if dead:
        planned = Job.State.DEAD
    elif retry_at is None and delay <= 0:
        planned = Job.State.READY
    else:
        planned = Job.State.SCHEDULED
    earlier = False

    def txn() -> str | None:
        nonlocal earlier
        earlier = False  # a retried transaction starts over
        jobs = Job.objects.using(dialect.using)
        # Lock the row first (an UPDATE that matches nothing locks nothing, so a cancel()
        # committing between the two UPDATEs below would be lost), skipping it if locked.
        row = (
            dialect.lock(jobs.filter(lease.q()))
            .values_list("errors", "cancel_requested", "has_dependents")
            .first()
        )
        if row is None:
            if held_elsewhere(dialect, lease):
                return BUSY
            state = _failed_earlier(dialect, lease, error, planned)
            earlier = state is not None
            return state
        history, cancel_requested, has_dependents = row
        errors = with_error(history, error)
        if cancel_requested or dead:
            state = Job.State.CANCELLED if cancel_requested else planned
            jobs.filter(lease.q()).update(
                **workflows.terminal_values(state, last_error=error, errors=errors)
            )
            workflows.on_terminal(
                dialect, lease.job_id, state, parent_id, has_dependents=has_dependents
            )
            return str(state)
        run_after = retry_at if retry_at is not None else DbNow() + seconds(delay)
        jobs.filter(lease.q()).update(
            state=planned,
            run_after=run_after,
            lease_owner=None,
            lease_expires=None,
            last_error=error,
            errors=errors,
            updated_at=DbNow(),
        )
        if planned == Job.State.READY:
            queue = jobs.filter(pk=lease.job_id).values_list("queue", flat=True).get()
            workflows.notify_on_commit(dialect, queue)
        return str(planned)

    state = dialect.run_in_transaction(txn)
    if earlier:
        logger.info(
            "The failure of job id=%s was recorded %s by an earlier write", lease.job_id, state
        )
    return state


def _failed_earlier(
    dialect: Dialect, lease: Lease, error: dict[str, Any], planned: str
) -> str | None:
    """Return the state an earlier, committed fail() of `lease` with `error` left, or None.

    A write whose COMMIT went through but whose reply was lost (the connection dropped) is
    written again, and finds the lease gone: the row tells whether it was its own write. The
    lease's claim is still the last one (`attempts` is its number and its owner is last in
    `worker_ids`: a later claim bumps the one and appends to the other) and the last error is
    `error`, which names the attempt (a reclaim of the attempt records a LeaseExpired, also
    when a later claim was released and took its bump back). Dialect.finished_by decides
    the same for finishes. The state told is the one written (a promoter may have made a
    `scheduled` job `ready` since), or `cancelled` if the job is now: cancelled before the
    write or after it, that is the job's fate either way.
    """
    row = (
        Job.objects.using(dialect.using)
        .filter(pk=lease.job_id, state__in=FAILED_ATTEMPT_STATES)
        .values_list("state", "attempts", "worker_ids", "last_error")
        .first()
    )
    if row is None:
        return None
    state, attempts, worker_ids, last_error = row
    if attempts != lease.attempt or not worker_ids or worker_ids[-1] != lease.owner:
        return None
    if last_error != error:
        return None
    return str(Job.State.CANCELLED if state == Job.State.CANCELLED else planned)


def held_elsewhere(dialect: Dialect, lease: Lease) -> bool:
    """Whether the lease is still current but its row is locked by another transaction."""
    if not dialect.has_select_for_update_skip_locked:
        return False
    return Job.objects.using(dialect.using).filter(lease.q()).exists()


def release(dialect: Dialect, leases: Iterable[Lease]) -> int:
    """Hand leased jobs back to `ready` without charging the attempt (graceful shutdown).

    A job whose cancellation was requested is not handed back: it ends `cancelled`. Many
    leases are released in chunks, each its own short transaction (see `fences`).
    """
    released = 0
    for condition, _ in fences(leases):
        released += dialect.run_in_transaction(functools.partial(_release, dialect, condition))
    return released


def _release(dialect: Dialect, condition: Q) -> int:
    jobs = Job.objects.using(dialect.using)
    doomed = list(
        dialect.lock_blocking(
            jobs.filter(condition, cancel_requested=True).order_by("pk")
        ).values_list("pk", "parent_id", "has_dependents")
    )
    for pk, parent_id, has_dependents in doomed:
        jobs.filter(pk=pk).update(**workflows.terminal_values(Job.State.CANCELLED))
        workflows.on_terminal(
            dialect, pk, Job.State.CANCELLED, parent_id, has_dependents=has_dependents
        )
    queues = set(jobs.filter(condition).values_list("queue", flat=True))
    released = jobs.filter(condition).update(
        state=Job.State.READY,
        attempts=F("attempts") - 1,
        lease_owner=None,
        lease_expires=None,
        updated_at=DbNow(),
    )
    workflows.notify_on_commit(dialect, queues)
    return len(doomed) + released
