"""Sequences: the jobs of one key start one at a time, in the order they were enqueued.

A sequence's row (`JobSequence`) names its head: the one job of it released to run. Every other
unfinished job of the sequence is held `waiting`, and nothing releases it (`Dialect.promote`
skips a sequenced job that is not its sequence's head), until the head is final: then, in the
transaction that made it final, the next one (the lowest id, which is the enqueue order: ids
are drawn under the sequence's lock) becomes the head and runnable. The claim never looks at
sequences. A retry, a durable sleep or a wait leaves the head unfinished, so it keeps its
place; so does a lease reclaimed from a dead worker.

A head that ends `dead` with `sequence_on_failure="block"` stays the head: the sequence is
blocked until that job is retried (it runs again, still the head) or cancelled (the next job
goes). A cancelled job never blocks: cancelling is how a job is taken out of its sequence.

Lock order: job rows, then the sequence's row, then the next job's row (a finish holds the
finished job's row when it moves its sequence on; enqueue locks upstream rows first too).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from django.db.models import BigIntegerField, Case, Exists, OuterRef, Q, QuerySet, Value, When

from ..dialects import Dialect
from ..dialects.base import terminal_columns
from ..models import Job, JobSequence
from . import wake

# The sequences one call of `settle` moves at most per statement of ids.
_CHUNK = 500


def _chunk(dialect: Dialect) -> int:
    """Sequences per statement that takes 3 parameters a sequence (the upsert, the heads'
    CASE): _CHUNK, or fewer where the database allows fewer parameters (an SQLite built with
    the old limit of 999)."""
    most = dialect.connection.features.max_query_params or 65535
    return max(1, min(_CHUNK, most // 3 - 1))


def lock(dialect: Dialect, key: str, *, create: bool) -> JobSequence | None:
    """Lock the row of sequence `key` until the transaction ends; make it first if `create`.

    A concurrent insert of the same key waits for ours (or we for it); a row deleted
    meanwhile (its sequence ran empty) is made again.
    """
    if create:
        return JobSequence(key=key, head=dialect.lock_sequences([key])[key])
    rows = JobSequence.objects.using(dialect.using)
    return dialect.lock_blocking(rows.filter(key=key)).first()


def _settle_locked(dialect: Dialect, row: JobSequence, *, keep_empty: bool) -> int | None:
    """Make sure the locked sequence `row` has its head; return the head's id, or None.

    The head stays while it is unfinished, or `dead` and blocking. Otherwise the lowest
    unfinished job of the sequence becomes the head and is released (promoted, if nothing
    else holds it); none left, the row is deleted (kept when `keep_empty`: a job is joining).
    """
    jobs = Job.objects.using(dialect.using)
    if row.head is not None:
        found = jobs.filter(pk=row.head).values_list("state", "sequence_blocks").first()
        if found is not None:
            state, blocks = found
            if state in Job.UNFINISHED_STATES or (state == Job.State.DEAD and blocks):
                return row.head
    following = (
        jobs.filter(sequence=row.key, state__in=Job.UNFINISHED_STATES)
        .order_by("pk")
        .values_list("pk", "state")
        .first()
    )
    rows = JobSequence.objects.using(dialect.using).filter(key=row.key)
    if following is None:
        if keep_empty:
            if row.head is not None:
                rows.update(head=None)
        else:
            rows.delete()
        row.head = None
        return None
    row.head = following[0]
    rows.update(head=row.head)
    if following[1] == Job.State.WAITING:
        wake.promote(dialect, [row.head])
    return row.head


def join(dialect: Dialect, keys: Iterable[str]) -> set[str]:
    """Lock sequences `keys` for jobs about to join them; return the keys without a head.

    The first job to join each of those is to be its head (`make_heads` once inserted); the
    others are inserted `waiting` (held). A few statements for any number of keys: the rows
    are locked (made where missing) by one upsert per chunk, in key order, and their heads
    checked by one read. A head neither unfinished nor blocking (pruned, say) is replaced
    as `settle` would.
    """
    keys = sorted(set(keys))
    free: set[str] = set()
    size = _chunk(dialect)
    for start in range(0, len(keys), size):
        free |= _join_locked(dialect, dialect.lock_sequences(keys[start : start + size]))
    return free


def _join_locked(dialect: Dialect, heads: dict[str, int | None]) -> set[str]:
    """`join` for the locked sequences `heads` ({key: head})."""
    jobs = Job.objects.using(dialect.using)
    listed = [head for head in heads.values() if head is not None]
    live: set[tuple[str | None, int]] = set()
    if listed:
        holding = Q(state__in=Job.UNFINISHED_STATES) | Q(state=Job.State.DEAD, sequence_blocks=True)
        found = jobs.filter(pk__in=dialect.id_set(listed)).filter(holding)
        live = set(found.values_list("sequence", "pk"))
    unsure = [key for key, head in heads.items() if (key, head) not in live]
    if not unsure:
        return set()
    # Rows made now, or left without a head: free, unless a job of theirs is unfinished.
    found = jobs.filter(sequence__in=unsure, state__in=Job.UNFINISHED_STATES)
    busy = {key for key in found.order_by().values_list("sequence", flat=True).distinct() if key}
    for key in sorted(busy):
        _settle_locked(dialect, JobSequence(key=key, head=heads[key]), keep_empty=True)
    return set(unsure) - busy


def make_heads(dialect: Dialect, heads: Mapping[str, int]) -> None:
    """Record each job of `heads` ({key: id}, inserted after `join` said so) as the head of
    its sequence."""
    rows = JobSequence.objects.using(dialect.using)
    items = sorted(heads.items())
    size = _chunk(dialect)
    for start in range(0, len(items), size):
        chunk = items[start : start + size]
        if len(chunk) == 1:
            rows.filter(key=chunk[0][0]).update(head=chunk[0][1])
            continue
        whens = [When(key=key, then=Value(pk)) for key, pk in chunk]
        rows.filter(key__in=[key for key, _ in chunk]).update(
            head=Case(*whens, output_field=BigIntegerField())
        )


def settle(dialect: Dialect, keys: Iterable[str], *, create: bool = False) -> None:
    """Move sequences `keys` on where their head is final (see `_settle_locked`).

    Called in the transaction that made jobs of them final (or unfinished again: `create`
    makes the row of a sequence that had run empty); the rows are locked in key order, so
    transactions settling several take them in one order.
    """
    for key in sorted(set(keys)):
        row = lock(dialect, key, create=create)
        if row is not None:
            _settle_locked(dialect, row, keep_empty=False)


def settle_jobs(dialect: Dialect, ids: Iterable[int], *, create: bool = False) -> None:
    """Move on the sequences of the jobs `ids` (just made final, or unfinished again)."""
    ids = sorted(set(ids))
    jobs = Job.objects.using(dialect.using)
    keys: set[str] = set()
    for start in range(0, len(ids), _CHUNK):
        chunk = ids[start : start + _CHUNK]
        found = jobs.filter(pk__in=chunk, sequence__isnull=False).values_list("sequence", flat=True)
        keys.update(key for key in found if key is not None)
    if keys:
        settle(dialect, keys, create=create)


def rejoin(dialect: Dialect, job_id: int, key: str) -> bool:
    """Place job `job_id` of sequence `key`, runnable again (retried), in its sequence.

    It runs now if it is the head (a blocked sequence's dead head, retried) or the sequence
    has none; else it waits, held, for its turn: the next after the head. Returns whether it
    is held.
    """
    row = lock(dialect, key, create=True)
    assert row is not None
    head = _settle_locked(dialect, row, keep_empty=False)
    if head is None or head == job_id:
        return False
    Job.objects.using(dialect.using).filter(pk=job_id).update(state=Job.State.WAITING)
    return True


def skip_blocked_head(dialect: Dialect, job_id: int, key: str) -> bool:
    """Cancel the dead job `job_id` (locked) if it blocks sequence `key`, letting the next job
    of the sequence start; return whether it did."""
    row = lock(dialect, key, create=False)
    jobs = Job.objects.using(dialect.using)
    if row is None or row.head != job_id:
        return False
    if not jobs.filter(pk=job_id, state=Job.State.DEAD, sequence_blocks=True).update(
        **terminal_columns(Job.State.CANCELLED)
    ):
        return False
    _settle_locked(dialect, row, keep_empty=False)
    return True


def released() -> Q:
    """Jobs that no sequence holds back: without one, or their sequence's head."""
    heads = JobSequence.objects.filter(key=OuterRef("sequence"), head=OuterRef("pk"))
    return Q(sequence__isnull=True) | Q(Exists(heads))


def blocked(using: str) -> QuerySet[JobSequence, tuple[str, int | None]]:
    """(key, head id) of the blocked sequences: their head is `dead` and blocks them."""
    dead_heads = Job.objects.using(using).filter(
        state=Job.State.DEAD, sequence_blocks=True, pk=OuterRef("head")
    )
    return (
        JobSequence.objects.using(using)
        .filter(Exists(dead_heads))
        .order_by("key")
        .values_list("key", "head")
    )


def is_blocked_head(using: str, job: Job) -> bool:
    """Whether `job` is the dead head that blocks its sequence."""
    return (
        job.sequence is not None
        and job.state == Job.State.DEAD
        and job.sequence_blocks
        and JobSequence.objects.using(using).filter(key=job.sequence, head=job.pk).exists()
    )
