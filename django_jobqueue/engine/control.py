"""Operator actions on existing jobs: cancel(), retry(), run_now(), release_lease(),
delete_finished().

The Python API and the admin's actions both go through these; each checks, under the rows'
locks, that what it does is still right (a lease still stuck, a job still finished).
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import IntegrityError, transaction
from django.db.models import F, QuerySet
from django.db.models.functions import Greatest

from .. import conf, pruning, validation
from ..dialects import get_dialect
from ..exceptions import InvalidJobError
from ..models import Job, JobDependency, JobStep, Worker
from ..models.functions import DbNow
from . import sequences, workflows
from .replay import SPAWN


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
    container, or a job that spawned children, cancels its unfinished children. A `dead` job
    that blocks its sequence (``sequence_on_failure="block"``) becomes `cancelled`, and the
    next job of the sequence starts. Returns False when the job was already final otherwise.
    """
    dialect = get_dialect(conf.get().database)
    pk = _pk(job)

    def txn() -> bool:
        jobs = Job.objects.using(dialect.using)
        row = (
            dialect.lock_blocking(jobs.filter(pk=pk))
            .values_list("state", "parent_id", "is_container", "has_children", "sequence")
            .first()
        )
        if row is None:
            raise InvalidJobError(f"Job {pk} does not exist.")
        state, parent_id, is_container, has_children, sequence = row
        if state == Job.State.DEAD and sequence is not None:
            return sequences.skip_blocked_head(dialect, pk, sequence)
        if state in Job.TERMINAL_STATES:
            return False
        if state in Job.LEASED_STATES:
            jobs.filter(pk=pk).update(cancel_requested=True, updated_at=DbNow())
            return True
        jobs.filter(pk=pk).update(
            **workflows.terminal_values(Job.State.CANCELLED, cancel_requested=True)
        )
        if is_container or has_children:
            workflows.cancel_children(dialect, pk)
        workflows.on_terminal(dialect, pk, Job.State.CANCELLED, parent_id)
        return True

    return dialect.run_in_caller_transaction(txn)


def retry(
    job: Job | int,
    extra_attempts: int = 1,
    *,
    keep_steps_through: JobStep | int | None = None,
    keep_places_through: int | None = None,
) -> Job:
    """Give a dead or cancelled job `extra_attempts` more attempts and make it runnable again.

    The attempt count is never reset: `max_attempts` becomes `attempts + extra_attempts`. The
    jobs this job's failure cancelled are revived, and a dead container it belongs to re-opens.

    With `keep_steps_through` (a `JobStep` of the job, or its id), the durable calls recorded
    after that one are cleared in the same transaction: the next run returns the kept results
    and calls the others again ("retry from a step"). A spawn among them is refused (its
    children exist: they would be spawned twice).

    With `keep_places_through` (a place in the job's runs: 1 is a run's first durable call),
    the records of later places are cleared the same way: 0 clears them all, and the next run
    starts over. Records written before places were have none: they are kept, unless 0
    clears them all. This is how a job that ended `dead` with `ReplayMismatch` at place `p`
    runs the new code from there: `keep_places_through=p - 1`.
    """
    validation.check_positive_int("extra_attempts", extra_attempts)
    if keep_places_through is not None:
        if keep_steps_through is not None:
            raise InvalidJobError("retry() takes keep_steps_through or keep_places_through.")
        if (
            isinstance(keep_places_through, bool)
            or not isinstance(keep_places_through, int)
            or not 0 <= keep_places_through <= validation.INT_MAX
        ):
            raise InvalidJobError(
                f"keep_places_through must be a place (an integer >= 0), not "
                f"{keep_places_through!r}."
            )
    dialect = get_dialect(conf.get().database)
    pk = _pk(job)
    kept = None
    if isinstance(keep_steps_through, JobStep):
        kept = keep_steps_through.pk
        if kept is None:
            raise InvalidJobError(
                "keep_steps_through must be a step record of the job (a JobStep or its id), "
                "not an unsaved JobStep."
            )
    elif keep_steps_through is not None:
        kept = keep_steps_through
        if (
            isinstance(kept, bool)
            or not isinstance(kept, int)
            or not 1 <= kept <= validation.ID_MAX
        ):
            raise InvalidJobError(
                f"keep_steps_through must be a step record of the job (a JobStep or its id), "
                f"not {keep_steps_through!r}."
            )

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
        if kept is not None:
            _clear_steps_after(dialect.using, pk, kept)
        if keep_places_through is not None:
            _clear_places_after(dialect.using, pk, keep_places_through)
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
        if row.sequence is not None and sequences.rejoin(dialect, pk, row.sequence):
            waiting = True  # an earlier job of its sequence is unfinished: it waits its turn
        if not waiting:
            workflows.notify_on_commit(dialect, row.queue)
        row.refresh_from_db(using=dialect.using)
        return row

    return dialect.run_in_caller_transaction(txn)


def _clear_steps_after(using: str, pk: int, kept: int) -> int:
    """Delete the step records of job `pk` written after record `kept`; return how many."""
    steps = JobStep.objects.using(using).filter(job_id=pk)
    if not steps.filter(pk=kept).exists():
        raise InvalidJobError(f"Job {pk} has no step record {kept}.")
    return _clear(pk, steps.filter(pk__gt=kept), f"after {kept}")


def _clear_places_after(using: str, pk: int, place: int) -> int:
    """Delete the step records of job `pk` at places after `place` (0: every record)."""
    steps = JobStep.objects.using(using).filter(job_id=pk)
    later = steps if place == 0 else steps.filter(place__gt=place)
    return _clear(pk, later, f"at a place after {place}")


def _clear(pk: int, later: QuerySet[JobStep], where: str) -> int:
    """Delete `later`, records of job `pk`: InvalidJobError if a spawn is among them."""
    spawn = later.filter(name=SPAWN).values_list("pk", "result").first()
    if spawn is not None:
        child = (spawn[1] or {}).get("job_id")
        raise InvalidJobError(
            f"Job {pk}: step record {spawn[0]} {where} spawned job {child}; clearing it "
            "would spawn that child again. Retry from a step after it."
        )
    deleted, _ = later.delete()
    return deleted


def run_now(job: Job | int) -> bool:
    """Make a `scheduled` job due now: it becomes `ready` at once.

    Whatever held it back ends early: a delayed `run_after`, a retry's backoff, or a sleep of
    its handler (`ctx.sleep` returns when the job resumes). Judged under the row's lock, so a
    promoter or an operator acting at the same moment changes it once. Returns False when
    the job is not `scheduled` (already due and promoted, running, finished, ...).
    """
    dialect = get_dialect(conf.get().database)
    pk = _pk(job)

    def txn() -> bool:
        jobs = Job.objects.using(dialect.using)
        row = dialect.lock_blocking(jobs.filter(pk=pk)).values_list("state", "queue").first()
        if row is None:
            raise InvalidJobError(f"Job {pk} does not exist.")
        state, queue = row
        if state != Job.State.SCHEDULED:
            return False
        jobs.filter(pk=pk).update(state=Job.State.READY, run_after=DbNow(), updated_at=DbNow())
        workflows.notify_on_commit(dialect, {queue})
        return True

    return dialect.run_in_caller_transaction(txn)


def owner_alive(owner: str | None, using: str | None = None) -> bool:
    """Whether worker `owner` has a row not gone nor expired (its heartbeat is current)."""
    if owner is None:
        return False
    workers = Worker.objects.using(using or conf.get().database)
    return workers.alive().filter(pk=owner).exists()


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
        rows = [
            (pk, parent_id, box or kids)  # a job that spawned children goes after them
            for pk, parent_id, box, kids in dialect.lock_blocking(
                finished.order_by("pk")
            ).values_list("pk", "parent_id", "is_container", "has_children")
        ]
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
