"""What happens around a job reaching a final state: the graph reacts, event-driven.

Called inside the transaction that made the job terminal, never from the ready-set scan:
- `done`: downstream jobs whose upstreams are now all done become `ready`;
- `dead`/`cancelled`: waiting downstream jobs are cancelled, transitively, each naming the
  job that caused it (`cancelled_by`), so that retrying that job can revive them;
- either way the job's container rolls up once it is sealed and all its children are final.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable
from typing import Any

from ..dialects import Dialect
from ..dialects.base import terminal_columns
from ..exceptions import UpstreamFailed
from ..lease_results import Finished
from ..models import Job, JobDependency, JobStep, JobWait
from ..models.functions import DbNow
from . import map_children, sequences
from .error_records import error_record

# Making waiting jobs runnable and waking workers for them: used here and by every module that
# moves the graph (they may import them from here, where they were first).
from .wake import notify_on_commit as notify_on_commit
from .wake import promote as promote

terminal_values = terminal_columns


def upstream_error(upstream_id: int, upstream_state: str) -> dict[str, Any]:
    """Return the last_error of a job cancelled because an upstream job ended badly."""
    return error_record(UpstreamFailed, f"upstream job {upstream_id} ended {upstream_state}", None)


def on_terminal(
    dialect: Dialect,
    job_id: int,
    state: str,
    parent_id: int | None,
    *,
    has_dependents: bool = True,
) -> None:
    """React to job `job_id` having just become `state` (in the same transaction).

    With `has_dependents=False` (read from the row) the downstream look-up is skipped.
    """
    on_finished(dialect, [Finished(job_id, state, parent_id, has_dependents)])


def on_finished(dialect: Dialect, finished: Iterable[Finished]) -> None:
    """React to a batch of jobs having just become final (in the same transaction).

    Downstream rows are locked before containers, and each set in id order, so batches
    finishing at once on several workers take their locks in one global order.
    """
    finished = list(finished)
    done = [f.job_id for f in finished if f.state == Job.State.DONE and f.has_dependents]
    if done:
        promote_downstream(dialect, done)
    failed = [f for f in finished if f.state != Job.State.DONE and f.has_dependents]
    for f in failed:
        cancel_downstream(dialect, f.job_id, f.state)
    if failed:  # jobs that wait for them to be final, whatever their state (ctx.wait_for)
        promote_downstream(dialect, [f.job_id for f in failed])
    parents: dict[int, list[int]] = {}
    for f in finished:
        if f.parent_id is not None:
            parents.setdefault(f.parent_id, []).append(f.job_id)
    for parent_id in sorted(parents):
        roll_up(dialect, parent_id, finished=len(parents[parent_id]), ids=parents[parent_id])
    # A sequenced job is marked as having dependents: only those can move a sequence on.
    moving = [f.job_id for f in finished if f.has_dependents]
    if moving:
        sequences.settle_jobs(dialect, moving)


def promote_downstream(dialect: Dialect, upstream_ids: int | list[int]) -> None:
    """Flip the waiting downstream jobs of `upstream_ids` whose upstreams are now all done.

    The downstream rows are locked (in id order) before their upstreams are counted, so of two
    upstreams finishing at once the later one sees the earlier one's commit and promotes.
    """
    ids = [upstream_ids] if isinstance(upstream_ids, int) else upstream_ids
    jobs = Job.objects.using(dialect.using)
    waiting = dialect.lock_blocking(
        jobs.filter(
            state=Job.State.WAITING,
            is_container=False,
            pk__in=JobDependency.objects.using(dialect.using)
            .filter(depends_on_id__in=dialect.id_set(ids))
            .values("job_id"),
        ).order_by("pk")
    )
    promote(dialect, list(waiting.values_list("pk", flat=True)))


def lock_jobs(dialect: Dialect, ids: Iterable[int]) -> None:
    """Lock the rows of jobs `ids`, in id order, until the transaction ends."""
    list(
        dialect.lock_blocking(
            Job.objects.using(dialect.using).filter(pk__in=sorted(set(ids))).order_by("pk")
        ).values_list("pk", flat=True)
    )


def await_jobs(dialect: Dialect, job_id: int, ids: list[int], count: int | None = None) -> bool:
    """Make job `job_id` wait for jobs `ids` (locked) to be final, or `count` of them; return
    whether they are.

    `awaits` edges: a job finishing, done or not, then promotes `job_id` once all are final
    (see `promote`), or once `count` are (its JobWait row says how many); their failures
    never cancel it.
    """
    edges = JobDependency.objects.using(dialect.using)
    if count is not None:  # the edges of an earlier wait must not count toward this one
        edges.filter(job_id=job_id, awaits=True).exclude(depends_on_id__in=ids).delete()
    have = set(
        edges.filter(job_id=job_id, depends_on_id__in=ids).values_list("depends_on_id", flat=True)
    )
    edges.bulk_create(
        JobDependency(job_id=job_id, depends_on_id=pk, awaits=True) for pk in ids if pk not in have
    )
    jobs = Job.objects.using(dialect.using)
    jobs.filter(pk__in=ids, has_dependents=False).update(has_dependents=True)
    if count is None:
        return not jobs.filter(pk__in=ids).exclude(state__in=Job.TERMINAL_STATES).exists()
    if jobs.filter(pk__in=ids, state__in=Job.TERMINAL_STATES).count() >= count:
        return True
    JobWait.objects.using(dialect.using).update_or_create(
        job_id=job_id, defaults={"key": "", "until": None, "count": count}
    )
    return False


def lock_upstream(dialect: Dialect, job_ids: list[int]) -> None:
    """Lock the rows of the jobs that the jobs `job_ids` depend on, until the transaction ends.

    Whoever reads an upstream's state to decide a downstream job's fate must hold this lock:
    an upstream becoming final concurrently then waits for this transaction (and sees its
    writes when it promotes or cancels its downstream), or commits first and is seen here.
    """
    if job_ids:
        list(
            dialect.lock_blocking(
                Job.objects.using(dialect.using)
                .filter(downstream_edges__job_id__in=sorted(job_ids))
                .order_by("pk")
            ).values_list("pk", flat=True)
        )


def cancel_downstream(dialect: Dialect, root_id: int, root_state: str) -> None:
    """Cancel every not-yet-started job downstream of `root_id`, transitively."""
    jobs = Job.objects.using(dialect.using)
    edges = JobDependency.objects.using(dialect.using)
    frontier = [root_id]
    cancelled: list[int] = []
    while frontier:
        below = dialect.lock_blocking(
            jobs.filter(
                state__in=(Job.State.WAITING, Job.State.READY),
                pk__in=edges.filter(depends_on_id__in=frontier, awaits=False).values("job_id"),
            ).order_by("pk")
        )
        rows = list(below.values_list("pk", "parent_id"))
        if not rows:
            break
        ids = [pk for pk, _ in rows]
        cancelled += ids
        jobs.filter(pk__in=ids).update(
            **terminal_values(
                Job.State.CANCELLED,
                cancelled_by_id=root_id,
                last_error=upstream_error(root_id, root_state),
            )
        )
        parents = Counter(p for _, p in rows if p is not None)
        for parent_id in sorted(parents):
            roll_up(dialect, parent_id, finished=parents[parent_id])
        sequences.settle_jobs(dialect, ids)
        frontier = ids
    wake_waiters(dialect, cancelled)


def wake_waiters(dialect: Dialect, ids: list[int]) -> None:
    """Promote the jobs that wait (ctx.wait_for) for jobs `ids`, just cancelled by a cascade:
    those jobs are final, and no finish of theirs will come to promote the waiters."""
    if ids:
        promote_downstream(dialect, sorted(ids))


def cancel_children(dialect: Dialect, container_id: int) -> None:
    """Cancel the unfinished children of `container_id` (a container, or a job that spawned
    them), transitively: running ones cooperatively, the others at once."""
    jobs = Job.objects.using(dialect.using)
    children = list(
        dialect.lock_blocking(
            jobs.filter(parent_id=container_id)
            .exclude(state__in=Job.TERMINAL_STATES)
            .order_by("pk")
        ).values_list("pk", "state", "is_container", "has_children")
    )
    for pk, state, is_container, has_children in children:
        if state in Job.LEASED_STATES:
            jobs.filter(pk=pk).update(cancel_requested=True, updated_at=DbNow())
            continue
        jobs.filter(pk=pk).update(**terminal_values(Job.State.CANCELLED, cancel_requested=True))
        if is_container or has_children:
            cancel_children(dialect, pk)
        cancel_downstream(dialect, pk, Job.State.CANCELLED)
    ended = [pk for pk, state, _, _ in children if state not in Job.LEASED_STATES]
    sequences.settle_jobs(dialect, ended)
    wake_waiters(dialect, ended)


def settle_spawners(dialect: Dialect, finished: list[Finished]) -> list[Finished]:
    """Hold back the jobs of `finished` (just written `done`) that spawned jobs not final yet.

    Such a job waits for them as a sealed container does (`waiting`, its result kept) and
    rolls up when the last one is final; its state in the list becomes `waiting`, or `dead`
    when its children are final already and one ended badly unseen (see `_children_state`).
    """
    settled = []
    for f in finished:
        if f.has_children and f.state == Job.State.DONE:
            f = dataclasses.replace(f, state=seal_spawner(dialect, f.job_id))
        elif f.has_children and f.state == Job.State.CANCELLED:
            cancel_children(dialect, f.job_id)
        settled.append(f)
    return settled


def seal_spawner(dialect: Dialect, job_id: int) -> str:
    """Seal job `job_id` (its row locked, `done`) over its children; return its state now."""
    jobs = Job.objects.using(dialect.using)
    # As containers.seal does: a child finishing now either committed before (and is counted
    # final here) or waits for these locks and then sees the job sealed, and counts down.
    unfinished = dialect.lock_blocking(
        jobs.filter(parent_id=job_id).exclude(state__in=Job.TERMINAL_STATES).order_by("pk")
    )
    count = len(list(unfinished.values_list("pk", flat=True)))
    if count:
        jobs.filter(pk=job_id).update(
            state=Job.State.WAITING,
            finished_at=None,
            unique_slot=1,
            sealed=True,
            open_children=count,
            updated_at=DbNow(),
        )
        return str(Job.State.WAITING)
    jobs.filter(pk=job_id).update(sealed=True)
    state, extra = _children_state(dialect, job_id, is_container=False)
    if state != Job.State.DONE:
        jobs.filter(pk=job_id).update(**terminal_values(state, **extra))
    return state


def _children_state(dialect: Dialect, parent_id: int, *, is_container: bool) -> tuple[str, Any]:
    """The state a parent whose children are all final rolls up to, and its columns.

    `done` when every child is done, else `dead` naming the first that is not. For a job that
    spawned them, a child its handler waited for (ctx.wait_for, whether or not it was among
    the first `count`) is left out: that failure was the handler's to handle.
    """
    jobs = Job.objects.using(dialect.using)
    failed = dict(
        jobs.filter(parent_id=parent_id).exclude(state=Job.State.DONE).order_by("pk")
        .values_list("pk", "state")
    )  # fmt: skip
    if failed and not is_container:
        for seen in JobStep.objects.using(dialect.using).filter(job_id=parent_id, name="@wait"):
            for pk in (seen.result or {}).get("ids", ()):
                failed.pop(int(pk), None)
        for seen in JobStep.objects.using(dialect.using).filter(job_id=parent_id, name="@map"):
            span = seen.result or {}
            if "first" in span:  # ctx.map: the handler met their failures (UpstreamFailed)
                failed = {pk: s for pk, s in failed.items()
                          if not span["first"] <= pk <= span["last"]}  # fmt: skip
    if not failed:
        return str(Job.State.DONE), {}
    first_id, first_state = next(iter(failed.items()))
    error = error_record(UpstreamFailed, f"child job {first_id} ended {first_state}", None)
    return str(Job.State.DEAD), {"last_error": error}


def roll_up(
    dialect: Dialect, container_id: int, *, finished: int = 1, ids: list[int] | None = None
) -> None:
    """Count `finished` children of a container as final; finish it when none is left open.

    `open_children` counts a sealed container's unfinished children (set when it is sealed,
    or inserted sealed), so no child counts its siblings. The container becomes `done` if all
    its children are done, else `dead`. The caller has already written its children's final
    states; an open (unsealed) container is left alone without being locked: sealing counts
    its children (see `containers.seal` for why that is safe). A job that spawned children is
    a container once its handler has returned (sealed by `seal_spawner`); while it runs it
    is an open one, whose children `ids` count down its maps (`map_children.count_down`).
    """
    jobs = Job.objects.using(dialect.using)
    # Look before locking: a producer adding a child with depends_on holds the open
    # container's lock while it locks the upstream rows, so a worker finishing one of those
    # (or rolling up a container inside the open one) that then waited for the open container
    # would deadlock with it. An open container cannot roll up, so it needs no lock here.
    peek = jobs.filter(pk=container_id).values_list("sealed", "state", "is_container").first()
    if peek is None or peek[1] in Job.TERMINAL_STATES:
        return
    if not peek[0]:
        if ids and not peek[2]:  # a job that spawned them, still unfinished: maybe a map's
            map_children.count_down(dialect, container_id, ids)
        return
    row = (
        dialect.lock_blocking(jobs.filter(pk=container_id))
        .values_list("is_container", "sealed", "state", "parent_id", "open_children")
        .first()
    )
    if row is None:
        return
    is_container, sealed, state, parent_id, open_children = row
    if not sealed or state in Job.TERMINAL_STATES:
        return
    if finished:
        open_children = max(0, open_children - finished)
        jobs.filter(pk=container_id).update(open_children=open_children)
    if open_children > 0:
        return
    new_state, extra = _children_state(dialect, container_id, is_container=is_container)
    jobs.filter(pk=container_id).update(**terminal_values(new_state, **extra))
    on_terminal(dialect, container_id, new_state, parent_id)


def count_open_children(dialect: Dialect, container_id: int) -> int:
    """Store and return the number of unfinished children of a (locked) container."""
    jobs = Job.objects.using(dialect.using)
    count = jobs.filter(parent_id=container_id).exclude(state__in=Job.TERMINAL_STATES).count()
    jobs.filter(pk=container_id).update(open_children=count)
    return count


def revive(dialect: Dialect, cause_id: int) -> list[int]:
    """Bring back the jobs that `cause_id` cancelled; return their ids.

    Revived jobs wait for their upstreams again; one that still has a dead or cancelled
    upstream is cancelled again in that upstream's name. A dead container that a revived job
    belongs to re-opens, and so revives the jobs its failure cancelled.
    """
    jobs = Job.objects.using(dialect.using)
    cancelled = jobs.filter(cancelled_by_id=cause_id, state=Job.State.CANCELLED)
    candidates = list(cancelled.values_list("pk", flat=True))
    if not candidates:
        return []
    # The upstream states are read under lock: read unlocked, an upstream dying (or finishing)
    # concurrently would see the jobs still cancelled and skip them while this saw it still
    # running, and the job would wait forever. Upstream rows first, then the jobs: the order
    # a worker finishing an upstream locks them in.
    lock_upstream(dialect, candidates)
    rows = list(
        dialect.lock_blocking(cancelled.filter(pk__in=candidates).order_by("pk")).values_list(
            "pk", "parent_id"
        )
    )
    if not rows:
        return []
    ids = [pk for pk, _ in rows]
    jobs.filter(pk__in=ids).update(
        state=Job.State.WAITING,
        finished_at=None,
        cancelled_by=None,
        unique_slot=1,
        updated_at=DbNow(),
    )
    # The revived jobs count as open children of their containers again, or a dead container
    # would stay dead (and its downstream cancelled) after they finished; this comes before
    # any of them is cancelled again below, which counts it as finished once more.
    for parent_id in sorted({p for _, p in rows if p is not None}):
        reopen_counts(dialect, parent_id)
    recancelled = cancel_blocked(dialect, ids)
    # An upstream may have become done since the job was cancelled: nothing would promote it.
    promote(dialect, [pk for pk in ids if pk not in recancelled])
    # A revived job of a sequence takes its turn again (a sequence left empty is made anew).
    sequences.settle_jobs(dialect, [pk for pk in ids if pk not in recancelled], create=True)
    for parent_id in sorted({p for pk, p in rows if p is not None and pk not in recancelled}):
        reopen_containers(dialect, parent_id)
    return ids


def reopen_counts(dialect: Dialect, container_id: int) -> None:
    """Recount the open children of a sealed, unfinished container (children were revived)."""
    jobs = Job.objects.using(dialect.using)
    row = (
        dialect.lock_blocking(jobs.filter(pk=container_id))
        .values_list("sealed", "state", "is_container")
        .first()
    )
    if row is not None and row[0] and row[1] not in Job.TERMINAL_STATES:
        count_open_children(dialect, container_id)
    elif row is not None and not row[2] and row[1] not in Job.TERMINAL_STATES:
        map_children.recount(dialect, container_id)  # a child of its map came back


def cancel_blocked(dialect: Dialect, ids: list[int]) -> set[int]:
    """Cancel those of the waiting jobs `ids` that have a dead or cancelled upstream.

    Each is cancelled in the name of the root cause, as `cancel_downstream` does: the
    upstream's own cause when that upstream was cancelled because of another job, else the
    upstream itself, so that retrying that job revives them. Repeats until no job of `ids` is
    left blocked (one may be blocked by another of `ids`); returns the ids cancelled. The
    caller holds the upstream rows locked (see `lock_upstream`).
    """
    jobs = Job.objects.using(dialect.using)
    edges = JobDependency.objects.using(dialect.using)
    pending = set(ids)
    cancelled: set[int] = set()
    while pending:
        blocked: dict[int, tuple[int, str]] = {}
        for job_id, up_id, up_state, cause_id, cause_state in (
            edges.filter(
                job_id__in=sorted(pending),
                job__state=Job.State.WAITING,
                depends_on__state__in=Job.FAILED_STATES,
                awaits=False,
            )
            .order_by("job_id", "depends_on_id")
            .values_list(
                "job_id",
                "depends_on_id",
                "depends_on__state",
                "depends_on__cancelled_by_id",
                "depends_on__cancelled_by__state",
            )
        ):
            if cause_id is not None and cause_state in Job.FAILED_STATES:
                blocked.setdefault(job_id, (cause_id, cause_state))
            else:
                blocked.setdefault(job_id, (up_id, up_state))
        if not blocked:
            break
        for job_id, (cause_id, cause_state) in sorted(blocked.items()):
            jobs.filter(pk=job_id, state=Job.State.WAITING).update(
                **terminal_values(
                    Job.State.CANCELLED,
                    cancelled_by_id=cause_id,
                    last_error=upstream_error(cause_id, cause_state),
                )
            )
        parents = Counter(
            jobs.filter(pk__in=list(blocked), parent_id__isnull=False).values_list(
                "parent_id", flat=True
            )
        )
        for parent_id in sorted(parents):
            roll_up(dialect, parent_id, finished=parents[parent_id])
        sequences.settle_jobs(dialect, blocked)
        cancelled |= blocked.keys()
        pending -= blocked.keys()
    wake_waiters(dialect, list(cancelled))
    return cancelled


def reopen_containers(dialect: Dialect, container_id: int | None) -> None:
    """Re-open `container_id` and its dead ancestors, reviving the jobs they cancelled."""
    jobs = Job.objects.using(dialect.using)
    while container_id is not None:
        row = (
            dialect.lock_blocking(jobs.filter(pk=container_id))
            .values_list("state", "parent_id")
            .first()
        )
        if row is None:
            return
        if row[0] not in Job.FAILED_STATES:
            # Still open: a child of it came back (re-opened or revived); count it again.
            reopen_counts(dialect, container_id)
            return
        jobs.filter(pk=container_id).update(
            state=Job.State.WAITING, finished_at=None, unique_slot=1, updated_at=DbNow()
        )
        count_open_children(dialect, container_id)
        revive(dialect, container_id)
        container_id = row[1]
