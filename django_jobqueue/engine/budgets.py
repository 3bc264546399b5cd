"""Units taken while a job runs, and settled by what was used: `ctx.acquire()`, `ctx.settle()`.

A long job (an LLM pipeline of many calls) needs room in a shared rate, a token budget say,
at the moment of each call, not when it started; and the cost of a call is known only after
it. So:

- `acquire(resource, units)` takes units of a resource that JOBQUEUE["LIMITS"] gives a rate,
  in its window (`limits.window`, the one counter of every rate), under the resource's lock
  row, and returns a `Grant`. With no room it suspends the job (`scheduled`, no lease, no
  place under any limit, no attempt used) until the window will have room, and tries again
  when the job runs again;
- `settle(grant, used)` writes what the work really used, at the grant's time: less gives the
  difference back to the window, more charges it to the window the grant was taken in.
  `settle(resource, used)` does the same for the units the job's `uses` took at its claim.
  A charge is written at once; a settlement at or below its grant waits for the job's next
  round trip (`durable.Deferred`): its next grant's transaction (one round trip in all on
  PostgreSQL, `Dialect.grant_sql`), its next durable call, or the end of its run.

Both are durable calls (records "@acquire" and "@settle", written in the transaction of their
window's row, fenced by the lease): a replay returns the same grant and takes nothing again,
and never settles twice (a settlement not yet written when its worker died is settled by the
replay). In any window the units granted (each settlement counted at its
grant's time) never exceed the rate; only a settlement above its grant can push a window
over, by at most that excess, and no grant is made in that window until it has room again.
A grant never settled counts as granted. `testing.run_jobs()` applies no limit: a grant is
made at once, and nothing is counted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import functools
from typing import TYPE_CHECKING, Any

from .. import conf, signals, telemetry
from ..dialects.base import GrantWrite, aware
from ..exceptions import InvalidJobError, Suspend
from ..limits import live, window
from ..limits.resources import make_rows
from ..limits.spec import Spec, find
from ..models import Job, ResourceStart
from ..validation import INT_MAX, name_problem
from .durable import (
    MISSING,
    Deferred,
    check_deferred,
    deferred,
    deferred_written,
    flush,
    lease_lost,
    write,
)

if TYPE_CHECKING:
    from .context import JobContext

ACQUIRE, SETTLE = "@acquire", "@settle"


@dataclasses.dataclass(frozen=True)
class Grant:
    """Units of a rated resource that `ctx.acquire()` granted a running job.

    Attributes:
        resource: The resource ("openai-tokens", "tenant-tokens:42").
        units: The units granted.
        granted_at: The database's time of the grant: the window its units (and their
            settlement) count in.
        job_id: The job it was granted to.
        seq: Which of the job's acquires it was (1, 2, ...): with `job_id`, its identity.
    """

    resource: str
    units: int
    granted_at: dt.datetime
    job_id: int
    seq: int

    @property
    def key(self) -> str:
        """The grant's identity in its job's records ("<job id>:<seq>")."""
        return f"{self.job_id}:{self.seq}"

    def _record(self) -> dict[str, Any]:
        return {
            "resource": self.resource,
            "units": self.units,
            "granted_at": self.granted_at.isoformat(),
        }

    @classmethod
    def _from_record(cls, found: dict[str, Any], job_id: int, seq: int) -> Grant:
        at = dt.datetime.fromisoformat(found["granted_at"])
        return cls(found["resource"], found["units"], at, job_id, seq)


class _NoRow(Exception):
    """The resource has no `Limit` row yet: made outside the grant's transaction, then tried
    again (an INSERT of a row another transaction holds waits, and on MySQL shares its lock)."""


class _NoRoom(Exception):
    """The window had no room: suspend until `until` (raised out of the grant's transaction)."""

    def __init__(self, until: dt.datetime) -> None:
        super().__init__(until)
        self.until = until


def rated(ctx: JobContext, resource: Any, units: Any = None) -> Spec:
    """The limit of `resource` if it has a rate that `units` can fit; else InvalidJobError
    (before anything is written)."""
    problem = name_problem(resource, 255, star="none")
    if problem:
        raise InvalidJobError(f"acquire: the resource {problem}.")
    specs = live.in_force(conf.get(), ctx._dialect.using)
    found = find(resource, specs)
    if found is None:
        known = ", ".join(sorted(n for n, s in specs.items() if s.rate)) or "none"
        raise InvalidJobError(
            f"acquire: {resource!r} is not a resource of JOBQUEUE['LIMITS'] with a rate "
            f"(rated: {known})."
        )
    entry, spec = found
    if spec.rate is None:
        raise InvalidJobError(
            f"acquire: {resource!r} has no rate ({entry!r} gives it "
            f"{spec.describe()}): only units of a rate are granted."
        )
    if units is not None:
        if isinstance(units, bool) or not isinstance(units, int) or not 1 <= units <= INT_MAX:
            raise InvalidJobError(f"acquire: units must be an integer >= 1, not {units!r}.")
        if units > spec.rate[0]:
            raise InvalidJobError(
                f"acquire: {units} units of {resource!r} could never be granted: its rate "
                f"({entry!r}) allows {spec.rate[0]} in a window."
            )
    return spec


def acquire(ctx: JobContext, resource: str, units: int) -> Grant:
    """ctx.acquire(): a grant of `units` of `resource`, from this run or an earlier one's
    record; with no room in the window, suspend the job until it will have room."""
    spec = rated(ctx, resource, units)
    assert spec.rate is not None
    seq, found = ctx._calls.next(ACQUIRE)
    if found is not MISSING:
        return Grant._from_record(found, ctx.job_id, seq)
    try:
        try:
            grant = _grant(ctx, resource, units, spec.rate, seq)
        except _NoRow:  # the resource's first grant: its row, then the grant
            make_rows(ctx._dialect, [resource])
            grant = _grant(ctx, resource, units, spec.rate, seq)
    except _NoRoom as wait:
        if ctx._ignore_delays:  # run_jobs(ignore_delays=True) never waits
            raise AssertionError("unreachable: run_jobs applies no limit") from None
        raise Suspend("sleep", until=wait.until) from None
    ctx._calls.remember(ACQUIRE, seq, grant._record())
    if telemetry.active is not None:
        telemetry.active.units_granted(resource, units)
    return grant


def _grant(ctx: JobContext, resource: str, units: int, rate: tuple[int, int], seq: int) -> Grant:
    """Take `units` and write the grant's record in one transaction. The record's insert is
    fenced by the lease (it locks the job's row while the lease is current, else LeaseLost
    rolls the grant back): no fence before it is needed."""
    dialect = ctx._dialect
    # The settlements deferred since the job's last write go first, in this transaction.
    if not dialect.can_defer_into_grant:
        flush(ctx)
    taken, before = deferred(ctx)
    failed: Exception | None = None
    with dialect.step_transaction():
        if not ctx._apply_limits:  # testing.run_jobs() applies no limit: nothing is counted
            check_deferred(ctx, taken, dialect.write_together(before))
            grant = Grant(resource, units, dialect.now(), ctx.job_id, seq)
            write(ctx, ACQUIRE, seq, grant._record(), None)
        elif dialect.can_grant_in_one_statement and ctx._calls.has_steps:
            got = _take_in_one(ctx, resource, units, rate, seq, taken, before)
            if isinstance(got, Exception):  # raised once the deferred records are committed
                failed = got
            else:
                grant = Grant(resource, units, got, ctx.job_id, seq)
        else:
            now = _take(ctx, resource, units, rate, taken, before)
            grant = Grant(resource, units, now, ctx.job_id, seq)
            rows = window.add_sql(dialect, resource, now, units, ResourceStart.Kind.GRANT,
                                  _fence(ctx), handler=_handler(ctx))  # fmt: skip
            _write(ctx, ACQUIRE, seq, grant._record(), rows, alone=False)
    deferred_written(ctx, taken)
    if failed is not None:
        raise failed
    return grant


def _take_in_one(
    ctx: JobContext,
    resource: str,
    units: int,
    rate: tuple[int, int],
    seq: int,
    taken: list[Deferred],
    before: list[tuple[str, list[Any]]],
) -> dt.datetime | _NoRow | _NoRoom:
    """`_take` and the grant's writes in one round trip with the COMMIT (PostgreSQL): the
    lock, the deferred records, then one statement that writes the grant if its window has
    room (`Dialect.grant_sql`). Return the grant's time, or what to raise once the
    transaction ends (the deferred records are written either way)."""
    dialect = ctx._dialect
    cap, period = rate
    grant = dialect.grant_sql(
        GrantWrite(resource, units, cap, window.read_sql(dialect, {resource: period}),
                   (ACQUIRE, seq, ctx._calls.place_of(ACQUIRE, seq)), _fence(ctx),
                   _handler(ctx))
    )  # fmt: skip
    lock = dialect.lock_resources_sql([resource], wait=True)
    rows, *counts, [(at, closed_until, started, _, written)] = dialect.execute_together(
        [lock, *before, grant], last=True
    )
    check_deferred(ctx, taken, counts)
    if not rows:
        return _NoRow()
    now = aware(at)
    if written:
        return now
    closed = aware(closed_until) if closed_until else None
    if closed is not None and closed > now:
        return _NoRoom(closed)
    if int(started) + units > cap:
        return _NoRoom(
            window.reopens_at(dialect, resource, period, int(started) + units - cap, now)
        )
    raise lease_lost(ctx._lease)  # room, but the record was not written: nothing was


def _fence(ctx: JobContext) -> tuple[int, str, int]:
    lease = ctx._lease
    return (lease.job_id, lease.owner, lease.attempt)


def _write(
    ctx: JobContext,
    name: str,
    seq: int,
    record: dict[str, Any],
    rows: list[tuple[str, list[Any]]],
    *,
    alone: bool,
) -> None:
    """Write the record of a call and the window's `rows` (fenced by the lease, as the
    record): in the caller's transaction, or with `alone` in one of their own. The record goes
    first and locks the job's row; a lease that is gone writes nothing and raises LeaseLost.
    PostgreSQL sends them in one round trip (with the COMMIT, or as one implicit transaction)."""
    dialect, lease = ctx._dialect, ctx._lease
    if not ctx._calls.has_steps:  # the job's first record also marks its row: durable.write
        with dialect.step_transaction() if alone else contextlib.nullcontext():
            write(ctx, name, seq, record, None)
            dialect.write_together(rows)
        return
    statements = [
        dialect.record_call_sql(job_id=lease.job_id, owner=lease.owner, attempt=lease.attempt,
                                name=name, seq=seq, result=record, duration=None,
                                place=ctx._calls.place_of(name, seq)),
        *rows,
    ]  # fmt: skip
    if alone:
        counts = dialect.write_alone(statements)
    else:
        counts = dialect.write_together(statements, last=True)
    if not counts[0]:
        raise lease_lost(lease)


def _take(
    ctx: JobContext,
    resource: str,
    units: int,
    rate: tuple[int, int],
    taken: list[Deferred],
    before: list[tuple[str, list[Any]]],
) -> dt.datetime:
    """Lock `resource`'s row (waited for: one resource), write the deferred records `taken`
    (their statements `before`), and see whether its window has room for `units`: return the
    database's time of the grant (the caller writes it before the lock is let go), or raise
    _NoRoom (the caller's transaction then rolls the deferred records back, to write later)."""
    dialect = ctx._dialect
    cap, period = rate
    lock = dialect.lock_resources_sql([resource], wait=True)
    # The grant's time is read by a statement of its own, after the lock is held: a locking
    # SELECT computes its columns before it waits for the row (PostgreSQL's CLOCK_TIMESTAMP),
    # or reads the clock once when it starts (MySQL's UTC_TIMESTAMP), and a grant stamped
    # before the grants it waited for would leave later windows too early. It is read after
    # the window too: the window's read reaches back a period from its own clock, and a time
    # read before it (these are separate statements here) would leave the rows just over a
    # period before that clock out of the grant's window, uncounted. Read after, the window
    # counted holds every row of the grant's (no row is written meanwhile: each takes the
    # lock this transaction holds), and at most a little more. The deferred records go after
    # the lock, which every grant takes before the job's row.
    clock, clock_params = dialect.clock_sql()
    rows, *counts, totals, [(at,)] = dialect.execute_together(
        [lock, *before, window.read_sql(dialect, {resource: period}),
         (f"SELECT {clock}", clock_params)]
    )  # fmt: skip
    if not rows:
        raise _NoRow
    check_deferred(ctx, taken, counts)
    _, closed_until, _ = rows[0]
    now = aware(at)
    closed = aware(closed_until) if closed_until else None
    if closed is not None and closed > now:
        raise _NoRoom(closed)
    started = window.count(totals).units.get(resource, 0)
    if started + units > cap:
        raise _NoRoom(window.reopens_at(dialect, resource, period, started + units - cap, now))
    return now


def settle(ctx: JobContext, target: Grant | str, used: int) -> None:
    """ctx.settle(): record what the work of a grant (or of the job's `uses` of a resource)
    really used, at the grant's time; once, whatever the replays."""
    if isinstance(used, bool) or not isinstance(used, int) or not 0 <= used <= INT_MAX:
        raise InvalidJobError(f"settle: used must be an integer >= 0, not {used!r}.")
    at: dt.datetime | None
    if isinstance(target, Grant):
        if target.job_id != ctx.job_id:
            raise InvalidJobError(
                f"settle: grant {target.key} belongs to job {target.job_id}, not {ctx.job_id}."
            )
        resource, granted, at, key = target.resource, target.units, target.granted_at, target.key
        kind = ResourceStart.Kind.SETTLE
    elif isinstance(target, str):
        resource, key = target, f"uses:{target}"
        granted, at = _claimed(ctx, resource)
        kind = ResourceStart.Kind.USETTLE  # at the claim's time, as the units it corrects
    else:
        raise InvalidJobError(f"settle takes a Grant or a resource name, not {target!r}.")
    rated(ctx, resource)
    seq, found = ctx._calls.next(SETTLE)
    if found is not MISSING:
        return
    if _settled(ctx, key):
        raise InvalidJobError(f"settle: {key} was settled already; a grant is settled once.")
    delta = used - granted
    record = {"grant": key, "resource": resource, "granted": granted, "used": used}
    rows = []
    if ctx._apply_limits and at is not None:
        rows = window.add_sql(ctx._dialect, resource, at, delta, kind, _fence(ctx), used=used,
                              handler=_handler(ctx))  # fmt: skip
    sent = functools.partial(_sent, ctx, resource, granted, used, key)
    if delta <= 0 and ctx._calls.has_steps and not ctx._dialect.connection.in_atomic_block:
        # Nothing to charge: the record (and the units it gives back) can wait for the job's
        # next round trip. Until then the window counts the whole grant, which only delays
        # the room it gives back; a run that ends first writes it as it ends, one killed
        # first settles again in its replay (the grant's record is there, this one is not).
        lease = ctx._lease
        statement = ctx._dialect.record_call_sql(
            job_id=lease.job_id, owner=lease.owner, attempt=lease.attempt, name=SETTLE,
            seq=seq, result=record, duration=None, place=ctx._calls.place_of(SETTLE, seq),
        )  # fmt: skip
        ctx._deferred.append(Deferred([statement, *rows], sent))
        ctx._calls.remember(SETTLE, seq, record)
        _settled_now(ctx, key)
        return
    # A charge is written at once: the grants after it must count it.
    flush(ctx)
    _write(ctx, SETTLE, seq, record, rows, alone=True)
    ctx._calls.remember(SETTLE, seq, record)
    _settled_now(ctx, key)
    sent()


def _settled_now(ctx: JobContext, key: str) -> None:
    if ctx._settled is not None:
        ctx._settled.add(key)


def _sent(ctx: JobContext, resource: str, granted: int, used: int, key: str) -> None:
    """Count a settlement just written (telemetry), and send `units_settled` for it."""
    if telemetry.active is not None:
        telemetry.active.units_settled(resource, used, ctx._token_usage)
    if signals.connected(signals.units_settled):
        job = ctx._job
        signals.send(
            signals.units_settled,
            job_id=ctx.job_id,
            job_type=job.type,
            queue=job.queue,
            group=job.group_key,
            attempt=ctx.attempt,
            worker_id=ctx.worker_id,
            resource=resource,
            granted=granted,
            used=used,
            grant=key,
        )


def _claimed(ctx: JobContext, resource: str) -> tuple[int, dt.datetime | None]:
    """The units of `resource` the job's `uses` name, and the database's time at which its
    claim counted them (None: not counted, so nothing to correct in a window)."""
    uses = (
        Job.objects.using(ctx._dialect.using)
        .filter(pk=ctx.job_id)
        .values_list("uses", flat=True)
        .first()
        or {}
    )
    if resource not in uses:
        raise InvalidJobError(
            f"settle: job {ctx.job_id} does not use {resource!r} (its uses: {sorted(uses)})."
        )
    return uses[resource], ctx._counted_at


def _settled(ctx: JobContext, key: str) -> bool:
    """Whether a record of this job already settles `key` (the keys settled are gathered from
    the records once a run, then kept: a job of many calls looks at each settlement once)."""
    if ctx._settled is None:
        ctx._settled = {
            value.get("grant")
            for (name, _), value in ctx._calls.recorded().items()
            if name == SETTLE and isinstance(value, dict)
        }
    return key in ctx._settled


def _handler(ctx: JobContext) -> str:
    job = ctx._job
    return str(job.type)
