"""Containers: the `container()` block that writes one, sealing it, and containers left open.

A `container()` block outside a transaction writes its container at once, unsealed, and seals
it when the block exits. A producer killed inside the block, or a database outage at its exit,
leaves the container open, and whatever waits on it would wait forever. So an open container
that shows no activity (neither its row nor a new child written) for OPEN_CONTAINER_TIMEOUT is
failed: it ends `dead` with a ContainerNotSealed error, sealed, and its downstream is cancelled
as for any failure. Its children are left alone. Sealing it by hand (`seal_open`, the admin's
"Seal" action) then says the children enqueued so far are the whole container: it re-opens,
its downstream is revived, and it rolls up as a sealed container does.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db.models import Exists, OuterRef, QuerySet

from . import conf
from .dialects import Dialect, get_dialect
from .dialects.base import seconds
from .engine import workflows
from .engine.control import _pk, cancel
from .engine.enqueuing import create_container
from .exceptions import ContainerNotSealed, InvalidJobError
from .models import Job
from .models.functions import DbNow

NOT_SEALED = "django_jobqueue.exceptions.ContainerNotSealed"


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
    dialect = get_dialect(conf.get().database)

    def txn() -> None:
        jobs = Job.objects.using(dialect.using)
        jobs.filter(pk=box.pk).update(sealed=True, updated_at=DbNow())
        failed = jobs.filter(pk=box.pk, state=Job.State.DEAD).values_list("last_error", flat=True)
        error = failed.first()
        if error and error.get("type") == NOT_SEALED:
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


def not_sealed_error(timeout: float) -> dict[str, Any]:
    """The last_error of a container failed because it stayed open."""
    return {
        "type": NOT_SEALED,
        "message": (
            f"the container was not sealed and nothing was added to it for {timeout:g}s "
            "(OPEN_CONTAINER_TIMEOUT): its producer likely died inside container(). Seal it "
            "to accept the children enqueued so far."
        ),
        "traceback": "",
        "attempt": None,
    }


def open_containers(jobs: QuerySet[Job]) -> QuerySet[Job]:
    """The containers of `jobs` that are not sealed and not finished."""
    # state=waiting, not "unfinished": the waiting jobs have an index of their own.
    return jobs.filter(state=Job.State.WAITING, is_container=True, sealed=False)


def stale(jobs: QuerySet[Job], idle_for: float) -> QuerySet[Job]:
    """Open containers neither written nor given a child for `idle_for` seconds (DB clock)."""
    since = DbNow() - seconds(idle_for)
    recent_child = Job.objects.filter(parent_id=OuterRef("pk"), created_at__gte=since)
    return open_containers(jobs).filter(updated_at__lt=since).exclude(Exists(recent_child))


def fail_unsealed(dialect: Dialect, *, idle_for: float, batch: int) -> list[int]:
    """Fail up to `batch` stale open containers (see the module); return their ids.

    Rows are taken with SKIP LOCKED, so workers never fail the same container twice nor wait
    on each other, and a producer adding a child (which locks the container) keeps it.
    """

    def txn() -> list[int]:
        jobs = Job.objects.using(dialect.using)
        rows = list(
            dialect.lock(stale(jobs, idle_for).order_by("pk")).values_list(
                "pk", "parent_id", "has_dependents"
            )[:batch]
        )
        for pk, parent_id, has_dependents in rows:
            jobs.filter(pk=pk, sealed=False, state=Job.State.WAITING).update(
                sealed=True,
                **workflows.terminal_values(Job.State.DEAD, last_error=not_sealed_error(idle_for)),
            )
            workflows.on_terminal(
                dialect, pk, Job.State.DEAD, parent_id, has_dependents=has_dependents
            )
        return [pk for pk, _, _ in rows]

    return dialect.run_in_transaction(txn)


def was_failed_unsealed(job: Job) -> bool:
    """Whether `job` is a container that the workers failed because it stayed open."""
    return (
        job.is_container
        and job.state == Job.State.DEAD
        and (job.last_error or {}).get("type") == NOT_SEALED
    )


def seal_open(job: Job | int) -> str:
    """Seal an open container, or one failed as not sealed: its children so far are all.

    A failed one re-opens first (and revives the jobs its failure cancelled), then rolls up
    like any sealed container: at once if its children are all final. Returns its new state;
    raises InvalidJobError for anything else.
    """
    dialect = get_dialect(conf.get().database)
    pk = _pk(job)

    def txn() -> str:
        jobs = Job.objects.using(dialect.using)
        row = dialect.lock_blocking(jobs.filter(pk=pk)).first()
        if row is None:
            raise InvalidJobError(f"Job {pk} does not exist.")
        if not row.is_container:
            raise InvalidJobError(f"Job {pk} is not a container.")
        if row.state == Job.State.WAITING and not row.sealed:
            seal(row)
        elif was_failed_unsealed(row):
            workflows.reopen_containers(dialect, pk)
            if workflows.count_open_children(dialect, pk) == 0:
                workflows.roll_up(dialect, pk, finished=0)
        else:
            raise InvalidJobError(
                f"Job {pk} is a {'sealed' if row.sealed else row.state} container; only an "
                "open one, or one failed for not being sealed, can be sealed."
            )
        return str(jobs.filter(pk=pk).values_list("state", flat=True).get())

    return dialect.run_in_caller_transaction(txn)
