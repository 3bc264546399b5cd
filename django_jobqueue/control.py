"""Operator actions on existing jobs: cancel(), retry(), and container()."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import IntegrityError, transaction

from . import conf, validation, workflows
from .dialects import Dialect, get_dialect
from .dialects.functions import DbNow
from .enqueuing import create_container
from .exceptions import ContainerNotSealed, InvalidJobError
from .models import Job


def _pk(job: Job | int) -> int:
    if isinstance(job, Job):
        if job.pk is None:
            raise InvalidJobError("The job is not saved.")
        return int(job.pk)
    if isinstance(job, int) and not isinstance(job, bool):
        if not 1 <= job <= validation.ID_MAX:  # no such row; the driver could not even send it
            raise InvalidJobError(f"Job {job} does not exist.")
        return job
    raise InvalidJobError(f"Expected a job or a job id, not {job!r}.")


def cancel(job: Job | int) -> bool:
    """Cancel a job: at once when it has not started, cooperatively when it is running.

    A waiting or ready job becomes `cancelled` now and so do the jobs downstream of it. A
    leased or running job gets `cancel_requested`: its handler can see that through its
    context, and whatever it returns is discarded and the job ends `cancelled`. Cancelling a
    container cancels its unfinished children. Returns False when the job was already final.
    """
    dialect = get_dialect(conf.get().database)
    pk = _pk(job)

    def txn() -> bool:
        jobs = Job.objects.using(dialect.using)
        row = (
            dialect.lock_blocking(jobs.filter(pk=pk))
            .values_list("state", "parent_id", "is_container")
            .first()
        )
        if row is None:
            raise InvalidJobError(f"Job {pk} does not exist.")
        state, parent_id, is_container = row
        if state in Job.TERMINAL_STATES:
            return False
        if state in Job.LEASED_STATES:
            jobs.filter(pk=pk).update(cancel_requested=True, updated_at=DbNow())
            return True
        jobs.filter(pk=pk).update(
            **workflows.terminal_values(Job.State.CANCELLED, cancel_requested=True)
        )
        if is_container:
            _cancel_children(dialect, pk)
        workflows.on_terminal(dialect, pk, Job.State.CANCELLED, parent_id)
        return True

    return dialect.run_in_caller_transaction(txn)


def _cancel_children(dialect: Dialect, container_id: int) -> None:
    jobs = Job.objects.using(dialect.using)
    children = list(
        dialect.lock_blocking(
            jobs.filter(parent_id=container_id)
            .exclude(state__in=Job.TERMINAL_STATES)
            .order_by("pk")
        ).values_list("pk", "state", "is_container")
    )
    for pk, state, is_container in children:
        if state in Job.LEASED_STATES:
            jobs.filter(pk=pk).update(cancel_requested=True, updated_at=DbNow())
            continue
        jobs.filter(pk=pk).update(
            **workflows.terminal_values(Job.State.CANCELLED, cancel_requested=True)
        )
        if is_container:
            _cancel_children(dialect, pk)
        workflows.cancel_downstream(dialect, pk, Job.State.CANCELLED)


def retry(job: Job | int, extra_attempts: int = 1) -> Job:
    """Give a dead or cancelled job `extra_attempts` more attempts and make it runnable again.

    The attempt count is never reset: `max_attempts` becomes `attempts + extra_attempts`. The
    jobs this job's failure cancelled are revived, and a dead container it belongs to re-opens.
    """
    validation.check_positive_int("extra_attempts", extra_attempts)
    dialect = get_dialect(conf.get().database)
    pk = _pk(job)

    def txn() -> Job:
        jobs = Job.objects.using(dialect.using)
        # The upstream states below are read under lock: read unlocked, an upstream finishing
        # concurrently (of a job cancelled while it waited) could miss this job, still
        # cancelled for it, while this read it as unfinished, and the job would wait forever.
        # Upstream rows first, then the job, as a worker finishing an upstream locks them.
        workflows.lock_upstream(dialect, [pk])
        found = list(dialect.lock_blocking(jobs.filter(pk=pk)))
        if not found:
            raise InvalidJobError(f"Job {pk} does not exist.")
        row = found[0]
        if row.state not in Job.FAILED_STATES:
            raise InvalidJobError(f"Job {pk} is {row.state}; only dead or cancelled jobs retry.")
        if row.is_container:
            raise InvalidJobError(f"Job {pk} is a container; retry its dead children instead.")
        if row.attempts + extra_attempts > validation.INT_MAX:
            raise InvalidJobError(
                f"extra_attempts: job {pk} has used {row.attempts} attempts; at most "
                f"{validation.INT_MAX - row.attempts} more fit its max_attempts column."
            )
        upstream = jobs.filter(downstream_edges__job_id=pk)
        bad = upstream.filter(state__in=Job.FAILED_STATES).first()
        if bad is not None:
            raise InvalidJobError(
                f"Job {pk} waits on job {bad.pk}, which is {bad.state}: retry that."
            )
        waiting = upstream.exclude(state=Job.State.DONE).exists()
        try:
            with transaction.atomic(using=dialect.using):
                jobs.filter(pk=pk).update(
                    state=Job.State.WAITING if waiting else Job.State.READY,
                    max_attempts=row.attempts + extra_attempts,
                    finished_at=None,
                    run_after=None,
                    cancel_requested=False,
                    cancelled_by=None,
                    unique_slot=1,
                    updated_at=DbNow(),
                )
        except IntegrityError:
            raise InvalidJobError(
                f"Job {pk} cannot run again: another unfinished job holds its unique key "
                f"{row.unique_key!r}."
            ) from None
        try:
            with transaction.atomic(using=dialect.using):
                workflows.revive(dialect, pk)
                if row.parent_id is not None:
                    workflows.reopen_counts(dialect, row.parent_id)
                workflows.reopen_containers(dialect, row.parent_id)
        except IntegrityError:
            raise InvalidJobError(
                f"Job {pk} cannot run again: a job it would revive has a unique key that "
                "another unfinished job holds now."
            ) from None
        if not waiting:
            workflows.notify_on_commit(dialect, row.queue)
        row.refresh_from_db(using=dialect.using)
        return row

    return dialect.run_in_caller_transaction(txn)


@contextmanager
def container(
    name: str,
    *,
    group: str = "",
    parent: Job | int | None = None,
    queue: str | None = None,
) -> Iterator[Job]:
    """Create a container job; enqueue children with ``parent=`` it inside the block.

    A container never runs: it rolls up `done` when all its children are done, or `dead` when
    any child ended otherwise, and only after the block has exited (sealed). An empty container
    is `done` at once. If the block raises, the container is cancelled with its children.
    """
    box = create_container(name, group=group, parent=parent, queue=queue)
    try:
        yield box
    except BaseException:
        cancel(box)
        raise
    seal(box)


def seal(box: Job) -> None:
    """Close a container to new children and roll it up if all its children are final.

    Raises ContainerNotSealed if the workers failed it meanwhile for staying open too long.
    """
    from . import containers

    dialect = get_dialect(conf.get().database)

    def txn() -> None:
        jobs = Job.objects.using(dialect.using)
        jobs.filter(pk=box.pk).update(sealed=True, updated_at=DbNow())
        failed = jobs.filter(pk=box.pk, state=Job.State.DEAD).values_list("last_error", flat=True)
        error = failed.first()
        if error and error.get("type") == containers.NOT_SEALED:
            # A worker failed it while this block ran (see OPEN_CONTAINER_TIMEOUT): say so,
            # rather than let the producer believe its children were taken as one.
            raise ContainerNotSealed(
                f"Container {box.pk} was failed before its block exited: nothing was added to "
                "it for OPEN_CONTAINER_TIMEOUT. Seal it (containers.seal_open) to accept its "
                "children so far."
            )
        # A child finishing now reads `sealed` without a lock (workflows.roll_up): either it
        # reads True after this commits and rolls up itself, or it wrote its final state
        # before that; locking the unfinished children waits for such a write to commit, so
        # that the roll-up below sees it. Without this, both could miss each other.
        list(
            dialect.lock_blocking(
                jobs.filter(parent_id=box.pk).exclude(state__in=Job.TERMINAL_STATES).order_by("pk")
            ).values_list("pk", flat=True)
        )
        # From now on each child that finishes counts itself down (workflows.roll_up).
        if workflows.count_open_children(dialect, int(box.pk)) == 0:
            workflows.roll_up(dialect, int(box.pk), finished=0)

    dialect.run_in_caller_transaction(txn)
    box.sealed = True
