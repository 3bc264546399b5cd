"""Delete old finished jobs in bounded batches, keeping what unfinished work still needs.

A finished job stays while an unfinished job depends on it (its result feeds that job) or
while its container is not final; a container stays while it has children. Each batch is one
short transaction: candidate rows of one state are read in (finished_at, id) order from the
(state, finished_at) index and locked with SKIP LOCKED (a row another transaction holds, a
retry reviving it say, is left for later), the conditions above are checked under that lock,
and the edges, the `cancelled_by` references and the rows themselves are deleted by id.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

from django.db.models import Q, QuerySet

from .dialects import Dialect
from .models import Job, JobDependency, JobLogLine, JobMap, JobStep, JobWait, PausedWorkflow
from .models.functions import DbNow

DEFAULT_STATES: tuple[str, ...] = (Job.State.DONE, Job.State.CANCELLED)
DEFAULT_BATCH_SIZE = 1000
MAX_BATCH_SIZE = 10_000


def check_states(states: Iterable[str]) -> tuple[str, ...]:
    """Return `states` without repeats, raising ValueError for one that is not final."""
    chosen: list[str] = []
    for state in states:
        if state not in Job.TERMINAL_STATES:
            final = ", ".join(Job.TERMINAL_STATES)
            raise ValueError(f"{state!r} is not a final state; prunable states: {final}.")
        if state not in chosen:
            chosen.append(state)
    return tuple(chosen)


@dataclasses.dataclass
class Cursor:
    """Where a pass over one state's finished rows has got to: (finished_at, id)."""

    finished_at: dt.datetime | None = None
    pk: int = 0

    def q(self) -> Q:
        if self.finished_at is None:
            return Q()
        # The plain `>=` lets the index scan start at the cursor; the OR alone would not.
        return Q(finished_at__gte=self.finished_at) & (
            Q(finished_at__gt=self.finished_at) | Q(pk__gt=self.pk)
        )


@dataclasses.dataclass
class Batch:
    """What one batch looked at and did."""

    state: str
    scanned: int = 0  # candidate rows read (old enough, in the state)
    deleted: int = 0  # rows deleted (or that would be, in a dry run)
    needed: int = 0  # kept: an unfinished job depends on them, or their container is open
    containers: int = 0  # kept: containers that still have children
    done: bool = False  # the pass over this state reached its end


def prune_batch(
    dialect: Dialect,
    *,
    state: str,
    older_than: dt.timedelta,
    cursor: Cursor,
    batch_size: int = DEFAULT_BATCH_SIZE,
    dry_run: bool = False,
) -> Batch:
    """Delete up to `batch_size` jobs of `state` finished over `older_than` ago, after `cursor`.

    One transaction; `cursor` is moved past the rows read. A dry run reads and checks the
    same rows, deletes nothing, and takes no write lock.
    """

    after = cursor.q()  # read once: a retried transaction starts from the same place
    last: list[Any] = []

    def txn() -> Batch:
        batch = Batch(state)
        last.clear()
        jobs = Job.objects.using(dialect.using)
        candidates = jobs.filter(state=state, finished_at__lt=DbNow() - older_than).filter(after)
        read: QuerySet[Job] = candidates.order_by("finished_at", "pk")
        if not dry_run:
            read = dialect.lock(read)
        fields = ("pk", "finished_at", "parent_id", "is_container", "has_children")
        rows = list(read.values_list(*fields)[:batch_size])
        batch.scanned = len(rows)
        batch.done = len(rows) < batch_size
        if not rows:
            return batch
        last[:] = [rows[-1][1], rows[-1][0]]
        # A job that spawned children goes after them, as a container does.
        finished = [(pk, parent_id, box or kids) for pk, _, parent_id, box, kids in rows]
        going, batch.needed, batch.containers = deletable(dialect, finished)
        batch.deleted = len(going)
        if going and not dry_run:
            delete_jobs(dialect, going, containers={pk for pk, _, box in finished if box})
        return batch

    batch = txn() if dry_run else dialect.run_in_transaction(txn)
    if last:
        cursor.finished_at, cursor.pk = last
    return batch


def seconds_until_old(dialect: Dialect, ages: Mapping[str, dt.timedelta]) -> float | None:
    """Seconds until the next finished job of a state in `ages` passes its age (database
    clock); None when no job of those states is younger than its age.

    One seek in the (state, finished_at) index per state: the youngest rows past their age
    (kept for a workflow, say) are not counted, so a pass that keeps them is not repeated at
    once.
    """
    jobs = Job.objects.using(dialect.using)
    waits = []
    for state, age in ages.items():
        row = (
            jobs.filter(state=state, finished_at__gte=DbNow() - age)
            .order_by("finished_at")
            .annotate(now=DbNow())
            .values_list("finished_at", "now")
            .first()
        )
        if row is not None and row[0] is not None and row[1] is not None:
            waits.append((row[0] + age - row[1]).total_seconds())
    return min(waits) if waits else None


def deletable(
    dialect: Dialect, rows: Sequence[tuple[int, int | None, bool]]
) -> tuple[list[int], int, int]:
    """Return which finished jobs of `rows` (id, container id, is a container) may be deleted.

    The one rule for deleting finished jobs (the pruner's and the admin's): a job stays while
    an unfinished job depends on it or while its container is not final; a container stays
    while it has a child that is not deleted with it. The caller holds the rows locked, and
    enqueue() locks the upstream rows it references, so no new dependency slips in before the
    delete. Returns the ids that may go (in the order of `rows`), and how many stay for each
    of the two reasons.
    """
    ids = [pk for pk, _, _ in rows]
    feeding, open_parents = _needed(dialect, ids, {p for _, p, _ in rows if p is not None})
    keep = {pk for pk, parent_id, _ in rows if pk in feeding or parent_id in open_parents}
    going = [pk for pk in ids if pk not in keep]
    parents = _containers_with_children(
        dialect, [pk for pk, _, box in rows if box and pk not in keep], going
    )
    return [pk for pk in going if pk not in parents], len(keep), len(parents)


def _needed(dialect: Dialect, ids: list[int], parent_ids: set[int]) -> tuple[set[int], set[int]]:
    """The jobs of `ids` an unfinished job depends on, and the containers of `parent_ids`
    that are not final."""
    final = Job.TERMINAL_STATES
    edges = JobDependency.objects.using(dialect.using)
    feeding = set(
        edges.filter(depends_on_id__in=dialect.id_set(ids))
        .exclude(job__state__in=final)
        .values_list("depends_on_id", flat=True)
    )
    open_parents: set[int] = set()
    if parent_ids:
        jobs = Job.objects.using(dialect.using).filter(pk__in=sorted(parent_ids))
        open_parents = set(jobs.exclude(state__in=final).values_list("pk", flat=True))
    return feeding, open_parents


def _containers_with_children(dialect: Dialect, boxes: list[int], going: list[int]) -> set[int]:
    """The containers of `boxes` with a child that is not in `going` (nested: transitively)."""
    if not boxes:
        return set()
    jobs = Job.objects.using(dialect.using)
    kept: set[int] = set()
    staying = jobs.filter(parent_id__in=dialect.id_set(boxes)).exclude(pk__in=dialect.id_set(going))
    kept.update(staying.values_list("parent_id", flat=True).distinct())
    # A container kept keeps its own container, if that one is in the batch too.
    while True:
        up = (
            set(
                jobs.filter(pk__in=sorted(kept), parent_id__in=boxes)
                .values_list("parent_id", flat=True)
                .distinct()
            )
            - kept
        )
        if not up:
            return {pk for pk in kept if pk is not None}
        kept |= up


def delete_jobs(dialect: Dialect, ids: list[int], *, containers: Collection[int] = ()) -> int:
    """Delete the jobs `ids` with their edges, step records, maps and log lines, clearing
    references to them; in a transaction.

    A few statements, none through Django's deletion collector (which would read every
    related row first): the edges from and to them, the `cancelled_by` links pointing at them
    (SET NULL, as the model says), the rows, and the `containers` among them last, innermost
    first: MySQL checks a foreign key row by row, so a container must go after its children.
    """
    using = dialect.using
    jobs = Job.objects.using(using)
    JobDependency.objects.using(using).filter(
        Q(job_id__in=dialect.id_set(ids)) | Q(depends_on_id__in=dialect.id_set(ids))
    )._raw_delete(using)
    for durable_rows in (JobStep, JobWait, JobMap, JobLogLine, PausedWorkflow):
        durable_rows.objects.using(using).filter(job_id__in=dialect.id_set(ids))._raw_delete(using)
    # The rows that name one of them as their canceller are few: found by one range of the
    # cancelled_by index, then cleared by id. An IN list of the ids instead made MariaDB
    # estimate, past 200 values, from the index's statistics (a column of NULLs, hence
    # "every row") and scan the whole table: a quarter of a second a batch.
    gone = set(ids)
    naming = [
        pk
        for pk, by in jobs.filter(
            cancelled_by_id__gte=min(ids), cancelled_by_id__lte=max(ids)
        ).values_list("pk", "cancelled_by_id")
        if by in gone
    ]
    if naming:
        jobs.filter(pk__in=dialect.id_set(naming)).update(cancelled_by=None)
    boxes = [pk for pk in ids if pk in containers]
    rows = [pk for pk in ids if pk not in containers]
    deleted = jobs.filter(pk__in=dialect.id_set(rows))._raw_delete(using) if rows else 0
    while boxes:
        inner = set(
            jobs.filter(parent_id__in=dialect.id_set(boxes)).values_list("parent_id", flat=True)
        )
        level = [pk for pk in boxes if pk not in inner]
        if not level:  # a child outside `ids`: the caller checked there is none
            raise AssertionError(f"containers {boxes} still have children")
        deleted += jobs.filter(pk__in=dialect.id_set(level))._raw_delete(using)
        boxes = [pk for pk in boxes if pk in inner]
    return deleted


@dataclasses.dataclass
class Report:
    """What a prune run did, per state."""

    deleted: dict[str, int]
    needed: int = 0
    containers: int = 0
    batches: int = 0

    @property
    def total(self) -> int:
        return sum(self.deleted.values())


MAX_PASSES = 20  # a nesting depth of containers that one run clears at most


def prune(
    dialect: Dialect,
    ages: dict[str, dt.timedelta],
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    dry_run: bool = False,
    progress: Callable[[Batch], Any] | None = None,
) -> Report:
    """Delete the jobs of each state in `ages` finished longer ago than its age, batch by batch.

    Children usually finish before their container, so a container is reached after them;
    one that still had children when reached (a cancelled one whose running children ended
    later) is taken by another pass, made only if the previous one deleted something.
    """
    report = Report({state: 0 for state in ages})
    for _ in range(MAX_PASSES):
        deleted = containers = needed = 0
        for state, age in ages.items():
            cursor = Cursor()
            while True:
                batch = prune_batch(
                    dialect,
                    state=state,
                    older_than=age,
                    cursor=cursor,
                    batch_size=batch_size,
                    dry_run=dry_run,
                )
                if batch.scanned:
                    report.batches += 1
                    report.deleted[state] += batch.deleted
                    deleted += batch.deleted
                    containers += batch.containers
                    needed += batch.needed
                    if progress is not None:
                        progress(batch)
                if batch.done:
                    break
        report.needed, report.containers = needed, containers
        if dry_run or not deleted or not containers:
            break
    return report
