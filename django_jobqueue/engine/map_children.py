"""The children's side of ctx.map(): counting a map's children down as they end, and letting
held children go under the map's cap (see maps.py for the whole story).

Called by workflows in the transaction of a child's final state, and by the suspension of
the mapping job: below both, it moves jobs only through `wake.promote`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from django.db.models import Case, Value, When

from ..models import Job, JobMap
from ..models.functions import DbNow
from .wake import notify_on_commit, promote

if TYPE_CHECKING:
    from ..dialects import Dialect


def children(dialect: Dialect, job_id: int, found: Mapping[str, Any]) -> Any:
    """The children of job `job_id`'s map whose record is `found` (their ids are a range)."""
    jobs = Job.objects.using(dialect.using)
    return jobs.filter(parent_id=job_id, pk__gte=found["first"], pk__lte=found["last"])


def count_down(dialect: Dialect, job_id: int, ids: list[int]) -> None:
    """Count the children `ids` of job `job_id`, just written final, off its open maps; let
    held children go in their place; make the job runnable once a map has none unfinished.

    In the transaction of their final state. The job's row is locked first (after the
    children's, the order in which every finish locks), then its JobMap rows.
    """
    maps = JobMap.objects.using(dialect.using).filter(job_id=job_id, unfinished__gt=0)
    spans = list(maps.values_list("pk", "first_id", "last_id"))
    mine = [(pk, [i for i in ids if lo <= i <= hi]) for pk, lo, hi in spans]
    mine = [(pk, done) for pk, done in mine if done]
    if not mine:
        return
    jobs = Job.objects.using(dialect.using)
    state = dialect.lock_blocking(jobs.filter(pk=job_id)).values_list("state", flat=True).first()
    if state is None or state in Job.TERMINAL_STATES:
        return
    for pk, done in mine:
        row = dialect.lock_blocking(maps.filter(pk=pk)).first()
        if row is None:
            continue
        row.running = max(0, row.running - sum(1 for i in done if i <= row.released_through))
        row.unfinished = max(0, row.unfinished - len(done))
        _release(dialect, row)
        row.save(using=dialect.using, update_fields=["running", "unfinished", "released_through"])
        if row.unfinished == 0 and state == Job.State.WAITING:
            promote(dialect, [job_id])


def _release(dialect: Dialect, row: JobMap) -> None:
    """Let the next held children of `row` go, as many as its cap has room for."""
    room = (
        row.last_id - row.released_through
        if row.concurrency is None
        else (row.concurrency - row.running)
    )
    if room <= 0 or row.released_through >= row.last_id:
        return
    jobs = Job.objects.using(dialect.using)
    held = jobs.filter(
        parent_id=row.job_id, pk__gt=row.released_through, pk__lte=row.last_id
    ).filter(state=Job.State.WAITING)
    picked = list(held.order_by("pk").values_list("pk", "queue")[:room])
    if not picked:  # the rest were cancelled while held
        row.released_through = row.last_id
        return
    later = When(run_after__gt=DbNow(), then=Value(Job.State.SCHEDULED))
    let_go = jobs.filter(pk__in=[pk for pk, _ in picked], state=Job.State.WAITING)
    row.running += let_go.update(
        state=Case(later, default=Value(Job.State.READY)), updated_at=DbNow()
    )
    row.released_through = picked[-1][0]
    notify_on_commit(dialect, {queue for _, queue in picked})


def recount(dialect: Dialect, job_id: int, seq: int | None = None) -> bool:
    """Count the children of job `job_id`'s maps (or of its map `seq`) anew from their rows,
    let held ones go where there is room; return whether any is unfinished. The caller holds
    the job's row locked."""
    maps = JobMap.objects.using(dialect.using).filter(job_id=job_id)
    if seq is not None:
        maps = maps.filter(seq=seq)
    unfinished = False
    for row in dialect.lock_blocking(maps.order_by("pk")):
        kids = children(dialect, job_id, {"first": row.first_id, "last": row.last_id})
        live = kids.exclude(state__in=Job.TERMINAL_STATES)
        row.unfinished = live.count()
        row.running = live.filter(pk__lte=row.released_through).count() if row.unfinished else 0
        _release(dialect, row)
        row.save(using=dialect.using, update_fields=["running", "unfinished", "released_through"])
        unfinished = unfinished or row.unfinished > 0
    return unfinished


def waits(dialect: Dialect, job_id: int) -> bool:
    """Whether job `job_id` (its row locked), suspending on a map, has children unfinished."""
    return recount(dialect, job_id)
