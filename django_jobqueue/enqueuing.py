"""enqueue(): validate, then write a job (and its dependency edges) in the caller's transaction."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

from django.db import connections, transaction
from django.db.models import Model

from . import conf, registry, validation, wake
from .dialects import get_dialect
from .dialects.functions import DbNow
from .exceptions import InvalidDependencyError
from .models import Job, JobDependency

JobRef = Job | int


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
) -> Job:
    """Create a job for handler `type`, runnable once every job in `depends_on` is done.

    The row is written in the caller's current transaction on the queue database, so it
    commits or rolls back with the caller's own writes. When the caller's open transaction is
    on another database, the write waits for that transaction's commit (and the returned job
    is saved then). Every check runs before anything is written.
    """
    settings = conf.get()
    registry.get(type)  # raises UnknownHandlerError
    job = Job(
        type=type,
        args=validation.check_args(type, args),
        group_key=validation.check_label("group", group, 200, allow_empty=True),
        weight=validation.check_positive_int("weight", weight),
        priority=validation.check_int("priority", priority),
        queue=validation.check_label(
            "queue", settings.default_queue if queue is None else queue, 100
        ),
        max_attempts=validation.check_positive_int(
            "max_attempts", settings.max_attempts if max_attempts is None else max_attempts
        ),
        timeout=validation.check_timeout(settings.timeout if timeout is None else timeout),
    )
    delay = validation.check_run_after(run_after)
    using = settings.database
    upstream_ids = _ids(depends_on, using, "depends_on")
    parent_id = _ids([parent], using, "parent")[0] if parent is not None else None

    other = _open_transaction_elsewhere(using)
    if other is not None:
        _check_exist(using, upstream_ids, parent_id, lock=False)
        transaction.on_commit(
            lambda: _write(job, using, upstream_ids, parent_id, delay), using=other
        )
        return job
    _write(job, using, upstream_ids, parent_id, delay)
    return job


def _write(
    job: Job,
    using: str,
    upstream_ids: list[int],
    parent_id: int | None,
    delay: dt.datetime | dt.timedelta | None,
) -> None:
    job.parent_id = parent_id
    if isinstance(delay, dt.timedelta):
        job.run_after = DbNow() + delay
    else:
        job.run_after = delay
    if not upstream_ids and parent_id is None:
        job.state = Job.State.READY
        job.save(using=using, force_insert=True)  # one INSERT, in autocommit or not
    else:
        with transaction.atomic(using=using, savepoint=False):
            states = _check_exist(using, upstream_ids, parent_id, lock=True)
            waiting = any(s != Job.State.DONE for s in states.values())
            job.state = Job.State.WAITING if waiting else Job.State.READY
            job.save(using=using, force_insert=True)
            JobDependency.objects.using(using).bulk_create(
                JobDependency(job_id=job.pk, depends_on_id=u) for u in upstream_ids
            )
    if isinstance(delay, dt.timedelta):
        job.refresh_from_db(using=using, fields=["run_after"])
    transaction.on_commit(lambda: wake.notify(using, job.queue), using=using)


def _check_exist(
    using: str, upstream_ids: list[int], parent_id: int | None, *, lock: bool
) -> dict[int, str]:
    """Return {id: state} of the upstream jobs, raising if one of them or the parent is missing.

    With `lock`, the upstream rows stay locked until the transaction ends, so an upstream that
    finishes concurrently sees this job's edge when it promotes its downstream jobs.
    """
    wanted = set(upstream_ids) | ({parent_id} if parent_id is not None else set())
    if not wanted:
        return {}
    qs: Any = Job.objects.using(using).filter(pk__in=wanted).order_by("pk")
    if lock:
        qs = get_dialect(using).lock_blocking(qs)
    found = dict(qs.values_list("pk", "state"))
    missing = sorted(wanted - found.keys())
    if missing:
        raise InvalidDependencyError(
            f"Job(s) {missing} do not exist on database {using!r}; a job can only depend on "
            "(or belong to) jobs that already exist."
        )
    return {pk: state for pk, state in found.items() if pk in upstream_ids}


def _ids(refs: Iterable[JobRef | None], using: str, what: str) -> list[int]:
    ids: list[int] = []
    for ref in refs:
        if isinstance(ref, Job):
            if ref.pk is None:
                raise InvalidDependencyError(f"{what}: job {ref!r} is not saved yet.")
            if ref._state.db not in (None, using):
                raise InvalidDependencyError(
                    f"{what}: job {ref.pk} lives on database {ref._state.db!r}, but the queue "
                    f"is on {using!r}."
                )
            ids.append(ref.pk)
        elif isinstance(ref, int) and not isinstance(ref, bool):
            ids.append(ref)
        elif isinstance(ref, Model):
            raise InvalidDependencyError(f"{what} must be jobs, not {type(ref).__name__}.")
        else:
            raise InvalidDependencyError(f"{what} must be jobs or job ids, not {ref!r}.")
    if len(set(ids)) != len(ids):
        ids = list(dict.fromkeys(ids))
    return ids


def _open_transaction_elsewhere(using: str) -> str | None:
    """Return the alias of the caller's open transaction when it is not on the queue database."""
    if connections[using].in_atomic_block:
        return None
    for alias in connections:
        if alias != using and connections[alias].in_atomic_block:
            return alias
    return None
