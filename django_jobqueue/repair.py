"""Operator repairs: hand a stuck lease back, delete finished jobs that nothing needs."""

from __future__ import annotations

from collections.abc import Iterable

from django.db.models import F
from django.db.models.functions import Greatest

from . import conf, pruning, workflows
from .control import _pk
from .dialects import get_dialect
from .dialects.functions import DbNow
from .exceptions import InvalidJobError
from .models import Job, JobDependency, Worker


def owner_alive(owner: str | None, using: str | None = None) -> bool:
    """Whether worker `owner` has a row that has not expired (its heartbeat is current)."""
    if owner is None:
        return False
    workers = Worker.objects.using(using or conf.get().database)
    return workers.filter(pk=owner, expires_at__gt=DbNow()).exists()


def release_lease(job: Job | int) -> str:
    """Hand a stuck lease back: the job becomes `ready` (`cancelled` if that was requested).

    A lease is stuck when its owner's worker row is gone or expired. A live worker keeps its
    leases whatever its row's `job_ids` say: the heartbeat writes them only once per
    HEARTBEAT_INTERVAL, so a job claimed since is missing there while the worker runs it.
    Raises InvalidJobError for a live owner (cancel the job instead) and for a job that holds
    no lease. The attempt stays counted; the job gets room for one more. Every write matches
    the lease read under the row lock (owner and attempt), so a worker finishing the job at
    the same moment wins or loses whole. Returns the job's new state.
    """
    dialect = get_dialect(conf.get().database)
    pk = _pk(job)

    def txn() -> str:
        jobs = Job.objects.using(dialect.using)
        row = (
            dialect.lock_blocking(jobs.filter(pk=pk))
            .values_list("state", "lease_owner", "attempts", "cancel_requested", "parent_id")
            .first()
        )
        if row is None:
            raise InvalidJobError(f"Job {pk} does not exist.")
        state, owner, attempts, cancel, parent_id = row
        if state not in Job.LEASED_STATES:
            raise InvalidJobError(f"Job {pk} is {state}; it holds no lease.")
        if owner_alive(owner, dialect.using):
            raise InvalidJobError(
                f"Job {pk} is held by live worker {owner} (its heartbeat is current): a live "
                "worker's lease is never released, as the job would run twice; cancel the "
                "job instead."
            )
        lease = jobs.filter(pk=pk, lease_owner=owner, attempts=attempts, state=state)
        if cancel:
            lease.update(**workflows.terminal_values(Job.State.CANCELLED))
            workflows.on_terminal(dialect, pk, Job.State.CANCELLED, parent_id)
            return str(Job.State.CANCELLED)
        lease.update(
            state=Job.State.READY,
            lease_owner=None,
            lease_expires=None,
            run_after=None,
            max_attempts=Greatest(F("max_attempts"), F("attempts") + 1),
            updated_at=DbNow(),
        )
        workflows.notify_on_commit(dialect, jobs.filter(pk=pk).values_list("queue", flat=True))
        return str(Job.State.READY)

    return dialect.run_in_caller_transaction(txn)


def delete_finished(ids: Iterable[int]) -> tuple[list[int], dict[int, str]]:
    """Delete those of jobs `ids` that are finished and that no unfinished job needs.

    The pruner's rule (`pruning.deletable`): a job is kept when it has not finished, when an
    unfinished job depends on it, when its container has not finished, or when it is a
    container with children left (children selected with it go with it). Candidate rows are
    locked before the delete, and enqueue() locks the upstream rows it references, so no new
    dependency can slip in between. Returns the deleted ids and, for each kept id, why it
    was kept.
    """
    dialect = get_dialect(conf.get().database)
    wanted = sorted(set(ids))

    def txn() -> list[int]:
        finished = Job.objects.using(dialect.using).filter(
            pk__in=wanted, state__in=Job.TERMINAL_STATES
        )
        rows = list(
            dialect.lock_blocking(finished.order_by("pk")).values_list(
                "pk", "parent_id", "is_container"
            )
        )
        going, _, _ = pruning.deletable(dialect, rows)
        if going:
            pruning.delete_jobs(dialect, going, containers={pk for pk, _, box in rows if box})
        return going

    deleted = dialect.run_in_caller_transaction(txn)
    return deleted, _why_kept(dialect.using, [pk for pk in wanted if pk not in set(deleted)])


def _why_kept(using: str, ids: list[int]) -> dict[int, str]:
    jobs = Job.objects.using(using)
    reasons: dict[int, str] = {}
    for pk, state, parent_id, parent_state in jobs.filter(pk__in=ids).values_list(
        "pk", "state", "parent_id", "parent__state"
    ):
        if state not in Job.TERMINAL_STATES:
            reasons[pk] = f"it is {state}, not finished"
        elif parent_id is not None and parent_state not in Job.TERMINAL_STATES:
            reasons[pk] = f"its container {parent_id} is {parent_state}"
        elif jobs.filter(parent_id=pk).exists():
            reasons[pk] = "it is a container with children left: delete them first"
        else:
            needer = (
                JobDependency.objects.using(using)
                .filter(depends_on_id=pk, job__state__in=Job.UNFINISHED_STATES)
                .values_list("job_id", flat=True)
                .first()
            )
            reasons[pk] = f"unfinished job {needer} depends on it" if needer else "it changed"
    for pk in set(ids) - set(reasons):
        reasons[pk] = "it no longer exists"
    return reasons
