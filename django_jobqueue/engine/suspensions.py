"""The lease transition of a durable sleep or wait: a job gives back its lease and waits.

An attempt that suspends its job (`durable.Suspend`) is recorded like an outcome, fenced by
id, owner and generation, without charging the attempt (its generation is taken back, as a
release does): `scheduled` until the sleep's end, `waiting` for an event or for jobs to be
final, or `ready` at once when that happened meanwhile. The job then holds no lease, and so
no place under any limit. The completer records the suspensions of a batch in one
transaction, as it does successes; where the dialect runs single statements in autocommit
(PostgreSQL at READ COMMITTED), the batch's plain sleeps go first in one statement
(`Dialect.suspend_sleeps`), as simple successes do (`finish_simple`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db.models import Case, DateTimeField, F, Value, When
from django.db.models.lookups import GreaterThan

from ..dialects import Dialect
from ..dialects.base import seconds
from ..exceptions import Suspend
from ..limits.resources import close as close_resource
from ..models import Job, JobStep, JobWait
from ..models.functions import DbNow
from . import events, map_children, workflows
from .leases import BUSY, Lease, fences, held_elsewhere


def suspend(dialect: Dialect, lease: Lease, how: Suspend) -> str | None:
    """Record one suspension; see `suspend_many`."""
    return suspend_many(dialect, [(lease, how)])[lease.job_id]


def suspend_many(dialect: Dialect, items: Sequence[tuple[Lease, Suspend]]) -> dict[int, str | None]:
    """Record that each (lease, how) attempt suspended its job, in one transaction.

    The records of the calls (JobStep rows) are written with it. A job whose cancellation
    was requested ends `cancelled`. Returns {job id: its new state}, None when the lease is
    no longer current, or BUSY when another transaction holds the row locked (nothing was
    written for it; try again).
    """
    states: dict[int, str | None] = {}
    if dialect.autocommit_statements:
        # Plain sleeps (the commonest suspension) in one statement; what it leaves (a row
        # locked elsewhere, a lease gone, a cancellation requested) takes the transaction.
        sleeps = [
            (lease.job_id, lease.owner, lease.attempt, how.delay, how.records)
            for lease, how in items
            if how.kind == "sleep" and how.delay and not how.closes
        ]
        if sleeps:
            suspended = dialect.run_statement(lambda: dialect.suspend_sleeps(sleeps))
            states = dict.fromkeys(suspended, str(Job.State.SCHEDULED))
            items = [(lease, how) for lease, how in items if lease.job_id not in states]
            if not items:
                return states

    def txn() -> dict[int, str | None]:
        jobs = Job.objects.using(dialect.using)
        # Rows in the order the other side locks them: an event's row before a job's (as
        # send_event does), the awaited jobs' rows before the waiting job's (a job finishing
        # locks its own row, then the rows of the jobs that wait for it).
        keys = sorted({how.key for _, how in items if how.kind == "event" and how.key})
        sent = {key: events.lock_event(dialect, key) for key in keys}
        awaited = sorted({pk for _, how in items if how.kind == "jobs" for pk in how.job_ids})
        if awaited:
            workflows.lock_jobs(dialect, awaited)
        rows = {}
        for condition, _ in fences(lease for lease, _ in items):
            for row in dialect.lock(jobs.filter(condition).order_by("pk")).values_list(
                "pk", "cancel_requested", "has_dependents", "parent_id", "has_children"
            ):
                rows[row[0]] = row[1:]
        states: dict[int, str | None] = {}
        for lease, _ in items:
            if lease.job_id not in rows:
                states[lease.job_id] = BUSY if held_elsewhere(dialect, lease) else None
        suspending = [(lease, how) for lease, how in items if lease.job_id in rows]
        JobStep.objects.using(dialect.using).bulk_create(
            JobStep(
                job_id=lease.job_id,
                name=name,
                seq=seq,
                place=place,
                result=result,
                attempt=lease.attempt,
            )
            for lease, how in suspending
            if not rows[lease.job_id][0]
            for name, seq, result, place in how.records
        )
        for resource, delay in sorted(
            {(h.closes, h.delay or 0.0) for _, h in suspending if h.closes}
        ):
            close_resource(dialect, resource, delay)
        ready = set()
        naps: dict[float, list[Lease]] = {}  # sleeps of a delay: one UPDATE for each delay
        for lease, how in suspending:
            cancel_requested, has_dependents, parent_id, has_children = rows[lease.job_id]
            if cancel_requested:
                states[lease.job_id] = _cancel(dialect, lease, has_dependents, parent_id,
                                               has_children)  # fmt: skip
            elif how.kind == "sleep" and how.delay:
                naps.setdefault(how.delay, []).append(lease)
                states[lease.job_id] = str(Job.State.SCHEDULED)
            else:
                states[lease.job_id] = state = _suspend(dialect, lease, how, sent)
                if state == Job.State.READY:
                    ready.add(lease.job_id)
        for delay, sleeping in naps.items():
            for condition, _ in fences(sleeping):
                jobs.filter(condition).update(
                    state=Job.State.SCHEDULED,
                    run_after=DbNow() + seconds(delay),
                    **_LET_GO,
                )
        if ready:
            queues = set(jobs.filter(pk__in=sorted(ready)).values_list("queue", flat=True))
            workflows.notify_on_commit(dialect, queues)
        return states

    states.update(dialect.run_in_transaction(txn))
    return states


# What every suspension writes: the lease ends, and its attempt is not charged. (Every
# suspension but a spawner's wait for jobs writes a record, and that wait records on resume.)
_LET_GO = {
    "has_steps": True,
    "lease_owner": None,
    "lease_expires": None,
    "attempts": F("attempts") - 1,
    "updated_at": DbNow(),
}


def _suspend(dialect: Dialect, lease: Lease, how: Suspend, sent: dict[str, bool]) -> str:
    """Write one suspension (its job row locked); return the job's new state."""
    state: Any = Job.State.READY
    values: dict[str, Any] = {}
    if how.kind == "sleep" and how.delay is not None:  # a sleep of 0: ready at once
        values = {"run_after": DbNow()}
    elif how.kind == "sleep":
        # Due already by the database clock: ready at once, not left for the promoter.
        later = When(
            GreaterThan(Value(how.until, DateTimeField()), DbNow()), then=Value("scheduled")
        )
        state = Case(later, default=Value("ready"))
        values = {"run_after": how.until}
    elif how.kind == "event" and not sent.get(how.key or ""):
        state = Job.State.WAITING
        JobWait.objects.using(dialect.using).update_or_create(
            job_id=lease.job_id, defaults={"key": how.key or "", "until": how.until, "count": None}
        )
    elif (
        how.kind == "jobs"
        and not workflows.await_jobs(dialect, lease.job_id, how.job_ids, how.count)
    ) or (how.kind == "map" and map_children.waits(dialect, lease.job_id)):
        state = Job.State.WAITING
    jobs = Job.objects.using(dialect.using)
    jobs.filter(lease.q()).update(state=state, **_LET_GO, **values)
    if isinstance(state, str):
        return state
    return str(jobs.filter(pk=lease.job_id).values_list("state", flat=True).get())


def _cancel(
    dialect: Dialect, lease: Lease, has_dependents: bool, parent_id: int | None, kids: bool
) -> str:
    """End a job whose cancellation was requested while it ran, instead of suspending it."""
    Job.objects.using(dialect.using).filter(lease.q()).update(
        **workflows.terminal_values(Job.State.CANCELLED)
    )
    if kids:
        workflows.cancel_children(dialect, lease.job_id)
    workflows.on_terminal(
        dialect, lease.job_id, Job.State.CANCELLED, parent_id, has_dependents=has_dependents
    )
    return str(Job.State.CANCELLED)
