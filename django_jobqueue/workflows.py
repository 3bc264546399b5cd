"""What happens around a job reaching a final state: the graph reacts, event-driven.

Called inside the transaction that made the job terminal, never from the ready-set scan:
- `done`: downstream jobs whose upstreams are now all done become `ready`;
- `dead`/`cancelled`: waiting downstream jobs are cancelled, transitively, each naming the
  job that caused it (`cancelled_by`), so that retrying that job can revive them;
- either way the job's container rolls up once it is sealed and all its children are final.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from . import wake
from .dialects import Dialect
from .dialects.functions import DbNow
from .models import Job, JobDependency


def terminal_values(state: str, **extra: Any) -> dict[str, Any]:
    """Return the column values of a move to the final `state` (ends lease and unique slot)."""
    return {
        "state": state,
        "lease_owner": None,
        "lease_expires": None,
        "finished_at": DbNow(),
        "updated_at": DbNow(),
        "unique_slot": None,
        **extra,
    }


def upstream_error(upstream_id: int, upstream_state: str) -> dict[str, Any]:
    """Return the last_error of a job cancelled because an upstream job ended badly."""
    return {
        "type": "django_jobqueue.exceptions.UpstreamFailed",
        "message": f"upstream job {upstream_id} ended {upstream_state}",
        "traceback": "",
        "attempt": None,
    }


def on_terminal(dialect: Dialect, job_id: int, state: str, parent_id: int | None) -> None:
    """React to job `job_id` having just become `state` (in the same transaction)."""
    if state == Job.State.DONE:
        promote_downstream(dialect, job_id)
    else:
        cancel_downstream(dialect, job_id, state)
    if parent_id is not None:
        roll_up(dialect, parent_id)


def promote_downstream(dialect: Dialect, upstream_id: int) -> None:
    """Flip the waiting downstream jobs of `upstream_id` whose upstreams are now all done.

    The downstream rows are locked (in id order) before their upstreams are counted, so of two
    upstreams finishing at once the later one sees the earlier one's commit and promotes.
    """
    jobs = Job.objects.using(dialect.using)
    waiting = dialect.lock_blocking(
        jobs.filter(
            state=Job.State.WAITING,
            is_container=False,
            pk__in=JobDependency.objects.using(dialect.using)
            .filter(depends_on_id=upstream_id)
            .values("job_id"),
        ).order_by("pk")
    )
    candidates = list(waiting.values_list("pk", flat=True))
    if not candidates:
        return
    blocked = set(
        JobDependency.objects.using(dialect.using)
        .filter(job_id__in=candidates)
        .exclude(depends_on__state=Job.State.DONE)
        .values_list("job_id", flat=True)
    )
    ready = [pk for pk in candidates if pk not in blocked]
    if ready:
        jobs.filter(pk__in=ready, state=Job.State.WAITING).update(
            state=Job.State.READY, updated_at=DbNow()
        )
        for queue in set(jobs.filter(pk__in=ready).values_list("queue", flat=True)):
            notify_on_commit(dialect, queue)


def cancel_downstream(dialect: Dialect, root_id: int, root_state: str) -> None:
    """Cancel every not-yet-started job downstream of `root_id`, transitively."""
    jobs = Job.objects.using(dialect.using)
    edges = JobDependency.objects.using(dialect.using)
    frontier = [root_id]
    while frontier:
        below = dialect.lock_blocking(
            jobs.filter(
                state__in=(Job.State.WAITING, Job.State.READY),
                pk__in=edges.filter(depends_on_id__in=frontier).values("job_id"),
            ).order_by("pk")
        )
        rows = list(below.values_list("pk", "parent_id"))
        if not rows:
            return
        ids = [pk for pk, _ in rows]
        jobs.filter(pk__in=ids).update(
            **terminal_values(
                Job.State.CANCELLED,
                cancelled_by_id=root_id,
                last_error=upstream_error(root_id, root_state),
            )
        )
        for parent_id in {p for _, p in rows if p is not None}:
            roll_up(dialect, parent_id)
        frontier = ids


def roll_up(dialect: Dialect, container_id: int) -> None:
    """Finish a sealed container whose children are all final: `done` if all are done."""
    jobs = Job.objects.using(dialect.using)
    row = (
        dialect.lock_blocking(jobs.filter(pk=container_id))
        .values_list("is_container", "sealed", "state", "parent_id")
        .first()
    )
    if row is None:
        return
    is_container, sealed, state, parent_id = row
    if not is_container or not sealed or state in Job.TERMINAL_STATES:
        return
    children = jobs.filter(parent_id=container_id)
    if children.exclude(state__in=Job.TERMINAL_STATES).exists():
        return
    ok = not children.exclude(state=Job.State.DONE).exists()
    new_state = Job.State.DONE if ok else Job.State.DEAD
    extra: dict[str, Any] = {}
    if not ok:
        failed = children.exclude(state=Job.State.DONE).order_by("pk").values_list("pk", "state")
        first_id, first_state = failed[0]
        extra["last_error"] = {
            "type": "django_jobqueue.exceptions.UpstreamFailed",
            "message": f"child job {first_id} ended {first_state}",
            "traceback": "",
            "attempt": None,
        }
    jobs.filter(pk=container_id).update(**terminal_values(new_state, **extra))
    on_terminal(dialect, container_id, new_state, parent_id)


def notify_on_commit(dialect: Dialect, queue: str) -> None:
    """Wake this process's workers for `queue` once the current transaction commits."""
    transaction.on_commit(lambda: wake.notify(dialect.using, queue), using=dialect.using)


def revive(dialect: Dialect, cause_id: int) -> list[int]:
    """Bring back the jobs that `cause_id` cancelled; return their ids.

    Revived jobs wait for their upstreams again; one that still has a dead or cancelled
    upstream is cancelled again in that upstream's name.
    """
    jobs = Job.objects.using(dialect.using)
    ids = list(
        dialect.lock_blocking(
            jobs.filter(cancelled_by_id=cause_id, state=Job.State.CANCELLED).order_by("pk")
        ).values_list("pk", flat=True)
    )
    if not ids:
        return []
    jobs.filter(pk__in=ids).update(
        state=Job.State.WAITING,
        finished_at=None,
        cancelled_by=None,
        unique_slot=1,
        updated_at=DbNow(),
    )
    for pk in ids:
        bad = (
            JobDependency.objects.using(dialect.using)
            .filter(job_id=pk, depends_on__state__in=(Job.State.DEAD, Job.State.CANCELLED))
            .values_list("depends_on_id", "depends_on__state")
            .first()
        )
        if bad is not None:
            jobs.filter(pk=pk, state=Job.State.WAITING).update(
                **terminal_values(
                    Job.State.CANCELLED,
                    cancelled_by_id=bad[0],
                    last_error=upstream_error(bad[0], bad[1]),
                )
            )
    return ids


def reopen_containers(dialect: Dialect, container_id: int | None) -> None:
    """Re-open `container_id` and its dead ancestors, reviving the jobs they cancelled."""
    jobs = Job.objects.using(dialect.using)
    while container_id is not None:
        row = (
            dialect.lock_blocking(jobs.filter(pk=container_id))
            .values_list("state", "parent_id")
            .first()
        )
        if row is None or row[0] not in (Job.State.DEAD, Job.State.CANCELLED):
            return
        jobs.filter(pk=container_id).update(
            state=Job.State.WAITING, finished_at=None, unique_slot=1, updated_at=DbNow()
        )
        revive(dialect, container_id)
        container_id = row[1]
