"""enqueue(): validate, then write a job and its edges in the caller's transaction."""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from asgiref.sync import sync_to_async
from django.db import IntegrityError, connections, transaction
from django.db.models.base import ModelState
from django.utils import timezone

from .. import conf, limits, registry, signals, telemetry, validation
from ..dialects import get_dialect
from ..exceptions import InvalidJobError
from ..limits.resources import Resources
from ..models import Job, JobDependency
from ..models.functions import DbNow
from ..options import JobOptions
from . import dag, sequences, wake, workflows
from .dag import JobRef as JobRef

# The fields a cancellation writes, refreshed on a job that was cancelled as it was created.
CANCEL_FIELDS = ["state", "finished_at", "cancelled_by", "last_error", "unique_slot"]


def enqueue(
    type: str,
    args: dict[str, Any] | None = None,
    *,
    depends_on: Iterable[JobRef] = (),
    parent: JobRef | None = None,
    group: str = "",
    weight: int = 1,
    priority: int = 0,
    queue: str | None = None,
    run_after: dt.datetime | dt.timedelta | None = None,
    max_attempts: int | None = None,
    timeout: float | dt.timedelta | None = None,
    unique_key: str | None = None,
    uses: Mapping[str, int] | None = None,
    sequence: str | None = None,
    sequence_on_failure: str | None = None,
) -> Job:
    """Create a job for handler `type`, runnable once every job in `depends_on` is done.

    The row is written in the caller's current transaction on the queue database, so it
    commits or rolls back with the caller's own writes. When the caller's open transaction is
    on another database, the write waits for that transaction's commit (and the returned job
    is saved then). Every check runs before anything is written. With `unique_key`, while an
    unfinished job holds the same key, that job is returned and nothing is inserted.

    Args:
        type: The handler key, registered in this process.
        args: Keyword arguments for the handler: a JSON object (``None`` means ``{}``).
        depends_on: Jobs, or their ids, that must be `done` before this one runs.
        parent: The open container this job belongs to.
        group: Fair-share group (``""``: the default group); up to 200 characters.
        weight: Fair-share weight of the group, from 1.
        priority: Higher runs first within its group; ties go to the older job.
        queue: Queue name; ``None`` means ``JOBQUEUE["DEFAULT_QUEUE"]``.
        run_after: Don't run before this aware datetime, or this long after the database's
            current time (a timedelta).
        max_attempts: Attempts before the job is `dead`; ``None`` means
            ``JOBQUEUE["MAX_ATTEMPTS"]``.
        timeout: Seconds, or a timedelta, one attempt may run; ``None`` means
            ``JOBQUEUE["TIMEOUT"]``.
        unique_key: While an unfinished job holds this key, return it and insert nothing.
        uses: The resources of ``JOBQUEUE["LIMITS"]`` it uses, with their units
            (``{"openai": 1, "tenant:42": 1}``); ``None`` means its handler's default. It
            starts only when each has room.
        sequence: The sequence it joins (``"account:42"``, up to 255 characters): the jobs
            of one sequence start one at a time, in the order they were enqueued, each once
            the one before it is final.
        sequence_on_failure: ``"continue"`` (the next job of its sequence starts when this
            one ends `dead`) or ``"block"`` (none does until it is retried or cancelled);
            ``None`` means ``JOBQUEUE["SEQUENCE_ON_FAILURE"]``.

    Returns:
        The new job: ``ready``; ``scheduled`` until a future `run_after`; ``waiting`` while an
        upstream job is not done, or an earlier job of its sequence is not final;
        ``cancelled`` when an upstream job is already dead or cancelled. Or the unfinished
        job that holds `unique_key` (which keeps its own place, in its own sequence).

    Raises:
        InvalidJobError: Bad input (a ``ValueError`` too); its subclasses
            `UnknownHandlerError`, `InvalidArgumentsError` and `InvalidDependencyError`
            name the cause. Nothing was written.
    """
    options = JobOptions.pick(locals())
    return _enqueue(type, args, options, depends_on=depends_on, parent=parent, follow_caller=True)


async def aenqueue(
    type: str,
    args: dict[str, Any] | None = None,
    *,
    depends_on: Iterable[JobRef] = (),
    parent: JobRef | None = None,
    group: str = "",
    weight: int = 1,
    priority: int = 0,
    queue: str | None = None,
    run_after: dt.datetime | dt.timedelta | None = None,
    max_attempts: int | None = None,
    timeout: float | dt.timedelta | None = None,
    unique_key: str | None = None,
    uses: Mapping[str, int] | None = None,
    sequence: str | None = None,
    sequence_on_failure: str | None = None,
) -> Job:
    """The async twin of `enqueue()`: the same arguments, checks, errors and result.

    It runs `enqueue()` through ``sync_to_async`` (thread-sensitive, as the ORM's async API
    does): in a transaction opened on that thread (``sync_to_async`` around
    ``transaction.atomic()``, or an ASGI request's), the job joins it as `enqueue()`'s would.
    """
    return await sync_to_async(enqueue)(**locals())  # exactly enqueue()'s arguments


def enqueue_direct(
    type: str,
    args: dict[str, Any] | None = None,
    *,
    depends_on: Iterable[JobRef] = (),
    parent: JobRef | None = None,
    **options: Any,
) -> Job:
    """Like enqueue(), but write on the queue database at once even when the caller's open
    transaction is on another database (the Tasks backend needs the id right away)."""
    return _enqueue(
        type,
        args,
        JobOptions(**options),
        depends_on=depends_on,
        parent=parent,
        follow_caller=False,
    )


def spawn_child(parent_id: int, type: str, args: Any, options: dict[str, Any]) -> Job:
    """Enqueue a child of running job `parent_id` (ctx.spawn), in the caller's transaction.

    The caller holds the parent's lease and its row locked; the parent is marked as having
    children, so that it waits for them once its handler returns.
    """
    depends_on = options.pop("depends_on", ())
    unknown = sorted(set(options) - JobOptions.names())
    if unknown:
        what = (
            "takes no parent= (the running job is the parent)"
            if "parent" in unknown
            else (f"got unknown options {unknown}")
        )
        raise InvalidJobError(f"spawn() {what}")
    return _enqueue(
        type,
        args,
        JobOptions(**options),
        depends_on=depends_on,
        parent=parent_id,
        follow_caller=False,
        spawning=True,
    )


def _enqueue(
    type: str,
    args: dict[str, Any] | None,
    options: JobOptions,
    *,
    depends_on: Iterable[JobRef],
    parent: JobRef | None,
    follow_caller: bool,
    spawning: bool = False,
) -> Job:
    using = conf.get().database
    job, delay = _build(type, args, options)
    upstream_ids = dag.job_ids(depends_on, using, "depends_on")
    parent_id = dag.job_ids([parent], using, "parent")[0] if parent is not None else None
    if spawning and parent_id is not None:  # once the child passed its checks, not before
        Job.objects.using(using).filter(pk=parent_id, has_children=False).update(has_children=True)

    other = _open_transaction_elsewhere(using) if follow_caller else None
    if other is not None:
        dag.check_refs(using, upstream_ids, parent_id, lock=False)
        transaction.on_commit(
            lambda: _write(job, using, upstream_ids, parent_id, delay), using=other
        )
        return job
    return _write(job, using, upstream_ids, parent_id, delay, spawning=spawning)


def _build(
    type: str,
    args: dict[str, Any] | None,
    options: JobOptions,
    settings: conf.JobQueueSettings | None = None,
    in_force: Callable[[], Mapping[str, limits.Spec]] | None = None,
) -> tuple[Job, dt.datetime | dt.timedelta | None]:
    """Return an unsaved, fully validated Job and its run_after (absolute or relative).

    `in_force`: the limits in force, read only for `uses` over a cap of the settings; a caller
    that builds many jobs passes one `cached_in_force()` for all.
    """
    settings = settings or conf.get()
    handler = registry.get(type)  # raises UnknownHandlerError
    checked_args = validation.check_args(type, args, settings.max_args_bytes)
    if options.uses is None and handler.uses is not None:
        options = dataclasses.replace(options, uses=handler.default_uses(checked_args))
    fields, delay = options.job_fields(settings, in_force or cached_in_force(settings))
    job = new_job(type=type, args=checked_args, **fields)
    job.run_after = delay if isinstance(delay, dt.datetime) else None
    if telemetry.active is not None:  # its attempts continue the caller's trace
        job.traceparent = telemetry.active.traceparent()
    return job, delay


def cached_in_force(settings: conf.JobQueueSettings) -> Callable[[], Mapping[str, limits.Spec]]:
    """A function that reads JOBQUEUE["LIMITS"] with the live changes of `jobqueue_limits
    set` at its first call, and gives the same at the next ones (one read for a batch)."""
    return functools.cache(lambda: Resources(settings).specs(settings.database))


def new_container(
    name: str, options: JobOptions, *, sealed: bool, settings: conf.JobQueueSettings
) -> Job:
    """Return an unsaved container job named `name`, in the group and queue of `options`."""
    type = validation.check_label("container name", name, 200)
    fields, _ = options.job_fields(settings)
    return Job(
        type=type,
        group_key=fields["group_key"],
        queue=fields["queue"],
        is_container=True,
        sealed=sealed,
        state=Job.State.WAITING,
        max_attempts=1,
    )


# The attribute values of a new Job, but for the fields set by new_job's callers.
_DEFAULTS: dict[str, Any] | None = None


def new_job(**values: Any) -> Job:
    """An unsaved Job with `values` and every other field at its default.

    Built without Model.__init__: a profile of enqueue_many() showed the generic constructor
    (it looks at every field and keyword in turn) as the largest cost of building a job. The
    defaults are the model's own, taken once; mutable ones are fresh for each job. Job has no
    pre_init/post_init receivers of its own.
    """
    job = job_from(defaults(), {})
    job.__dict__.update(values)
    return job


def defaults() -> dict[str, Any]:
    """The attribute values of a new Job (the model's defaults, taken once; not to be
    changed: `job_from` copies them)."""
    global _DEFAULTS
    if _DEFAULTS is None:
        _DEFAULTS = {f.attname: f.get_default() for f in Job._meta.concrete_fields}
    return _DEFAULTS


def job_from(values: dict[str, Any], args: dict[str, Any]) -> Job:
    """An unsaved Job with every attribute of `values` (all of a Job's: `defaults()` and
    what a caller set on them) and `args`, the mutable ones fresh (see `new_job`)."""
    job = Job.__new__(Job)
    attributes = job.__dict__
    attributes.update(values)
    attributes.update(args=args, errors=[], worker_ids=[], _state=ModelState())
    return job


def _write(
    job: Job,
    using: str,
    upstream_ids: list[int],
    parent_id: int | None,
    delay: dt.datetime | dt.timedelta | None,
    *,
    spawning: bool = False,
) -> Job:
    job.parent_id = parent_id
    runnable = runnable_state(delay)
    if isinstance(delay, dt.timedelta):
        job.run_after = DbNow() + delay
    if not upstream_ids and parent_id is None and job.unique_key is None and job.sequence is None:
        job.state = runnable
        if connections[using].in_atomic_block:
            # Every check ran before, but a database can still refuse a row (a server limit
            # lower than ours): the savepoint keeps the caller's transaction usable then.
            with transaction.atomic(using=using):
                job.save(using=using, force_insert=True)
        else:
            # One INSERT in autocommit, retried when it hits lock contention (SQLite's write
            # lock busy past the busy timeout): nothing was written then, so a retry is safe.
            get_dialect(using).run_statement(lambda: job.save(using=using, force_insert=True))
    else:
        dialect = get_dialect(using)

        def txn() -> Job | None:
            """Write the job and its edges; return the holder of its unique key instead."""
            job.pk = None  # a retried attempt inserts afresh
            job._state.adding = True
            states = dag.check_refs(using, upstream_ids, parent_id, lock=True, spawning=spawning)
            waiting = any(s != Job.State.DONE for s in states.values())
            # Its sequence's row is locked before the INSERT: ids rise in enqueue order.
            head = job.sequence is not None and bool(sequences.join(dialect, [job.sequence]))
            held = job.sequence is not None and not head
            job.state = Job.State.WAITING if waiting or held else runnable
            if job.unique_key is not None:
                existing = _insert_unique(job, using)
                if existing is not None:
                    return existing
            else:
                job.save(using=using, force_insert=True)
            if head:
                sequences.make_heads(dialect, {str(job.sequence): job.pk})
            JobDependency.objects.using(using).bulk_create(
                JobDependency(job_id=job.pk, depends_on_id=u) for u in upstream_ids
            )
            mark_dependents(using, upstream_ids)
            if any(s in Job.FAILED_STATES for s in states.values()):
                # A job created downstream of a dead or cancelled job would wait forever
                # (nothing would ever cancel or promote it): it is cancelled at once in that
                # job's name, as it would have been had it existed then, so that retrying
                # that job revives it.
                workflows.cancel_blocked(dialect, [job.pk])
                job.refresh_from_db(using=using, fields=CANCEL_FIELDS)
            return None

        # In the caller's transaction: a savepoint, so that a missing or unusable upstream or
        # parent (the locked check raises) leaves that transaction usable. In its own
        # transaction, it is retried whole when the database breaks a deadlock (the rows
        # locked here are locked by workers too, in other orders).
        existing = dialect.run_in_caller_transaction(txn)
        if existing is not None:
            return existing
    if isinstance(delay, dt.timedelta):
        job.refresh_from_db(using=using, fields=["run_after"])
    transaction.on_commit(lambda: wake.notify(using, job.queue), using=using)
    if signals.job_enqueued.receivers:
        transaction.on_commit(lambda: signals.send_enqueued([job]), using=using)
    return job


def runnable_state(run_after: dt.datetime | dt.timedelta | None) -> str:
    """The state of a new job that may run once `run_after` has passed.

    `scheduled` (out of the ready index until the promoter finds it due) when `run_after` lies
    ahead, else `ready`. Decided on this machine's clock; a job scheduled by a clock that runs
    ahead of the database's is promoted at once.
    """
    if run_after is None:
        return Job.State.READY
    if isinstance(run_after, dt.timedelta):
        return Job.State.SCHEDULED if run_after > dt.timedelta(0) else Job.State.READY
    now = timezone.now()
    if timezone.is_aware(run_after) != timezone.is_aware(now):
        return Job.State.SCHEDULED  # not comparable here: the promoter decides by the database
    return Job.State.SCHEDULED if run_after > now else Job.State.READY


def mark_dependents(using: str, upstream_ids: Iterable[int]) -> None:
    """Record on the (locked) upstream rows that jobs now depend on them."""
    ids = sorted(set(upstream_ids))
    if ids:
        Job.objects.using(using).filter(pk__in=ids, has_dependents=False).update(
            has_dependents=True
        )


def _insert_unique(job: Job, using: str) -> Job | None:
    """Insert `job`, or return the unfinished job that already holds its unique key.

    The database's unique index on (unique_key, unique_slot) decides races between producers:
    the loser's INSERT fails (after waiting for the winner's commit) and it reads the winner.
    """
    dialect = get_dialect(using)
    for _ in range(5):
        try:
            with transaction.atomic(using=using):
                job.save(using=using, force_insert=True)
            return None
        except IntegrityError:
            job.pk = None
            job._state.adding = True
            holder = dialect.lock_blocking(
                Job.objects.using(using).filter(unique_key=job.unique_key, unique_slot=1)
            ).first()
            if holder is not None:
                return holder
    raise IntegrityError(f"could not insert or find a job with unique key {job.unique_key!r}")


def create_container(
    name: str, *, group: str = "", parent: JobRef | None = None, queue: str | None = None
) -> Job:
    """Create an open container job named `name` (used by `jobqueue.container`)."""
    settings = conf.get()
    using = settings.database
    box = new_container(name, JobOptions(group=group, queue=queue), sealed=False, settings=settings)
    parent_id = dag.job_ids([parent], using, "parent")[0] if parent is not None else None
    other = _open_transaction_elsewhere(using)
    if other is not None:
        # Its children would be written at that transaction's commit, after the block had
        # sealed the container: refuse rather than build a batch that cannot take them.
        raise InvalidJobError(
            f"container() cannot run inside a transaction on database {other!r} while the "
            f"queue lives on {using!r}: open the transaction on {using!r} instead."
        )

    def txn() -> None:
        # A write transaction of the dialect's, as every other write: a plain atomic block
        # is DEFERRED on SQLite ("database is locked" under load) and not retried on a
        # deadlock. In the caller's transaction it is a savepoint, so a bad parent leaves
        # that usable.
        box.pk = None
        box._state.adding = True
        dag.check_refs(using, [], parent_id, lock=True)
        box.parent_id = parent_id
        box.save(using=using, force_insert=True)

    get_dialect(using).run_in_caller_transaction(txn)
    return box


def _open_transaction_elsewhere(using: str) -> str | None:
    """Return the alias of the caller's open transaction when it is not on the queue database."""
    if connections[using].in_atomic_block:
        return None
    for alias in connections:
        if alias != using and connections[alias].in_atomic_block:
            return alias
    return None
