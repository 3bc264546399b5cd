"""Per-minute figures for the admin's charts, kept small however many jobs there are.

Each worker tallies in memory what it does (claims, outcomes, and the enqueue-to-start latency
of first attempts, as counts per bucket of LATENCY_BUCKETS) and its recorder writes the current
minute's totals to its own `MinuteCount` row every few seconds: one upsert, no contention
between workers. The same counts per handler key (claims, jobs ended `done` or `dead`, failed
attempts) go to its `MinuteHandlerCount` rows, one per handler key it ran that minute, for
the overview's per-handler table (admin/breakdown.py). Once a minute, the first worker to get
there samples the ready backlog of each queue and the age of its oldest ready job into
`MinuteSample` rows, and deletes rows older than KEEP. The charts read these rows: at most a
few thousand for a day, never the job table.

The counts' minutes are those of the worker's clock (UTC), the samples' those of the
database's; hosts kept in time by NTP agree to well within a minute. The latency of a job is
measured from the later of its enqueue (`created_at`, the enqueuing host's clock) and its
`run_after` to its claim (the worker's clock).
"""

from __future__ import annotations

import bisect
import datetime as dt
import threading
import time
from collections.abc import Iterable
from typing import Any

from django.db.models import Count, IntegerField, Max, Min, Sum
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast

from .dialects import get_dialect
from .lease_results import ClaimedJob
from .models import Job, MinuteCount, MinuteHandlerCount, MinuteSample, MinuteSpend
from .models.functions import MinuteSlot

# Upper bounds, in seconds, of the latency buckets; the last bucket has no bound.
LATENCY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 15, 60, 300, 1800, 3600)
KEEP = dt.timedelta(days=2)
MINUTE = dt.timedelta(minutes=1)
# The per-handler counts of a minute, in this order: {handler key: [started, done, failed, dead]}.
HANDLER_COUNTS = ("started", "done", "failed", "dead")


def minute_of(moment: dt.datetime) -> dt.datetime:
    """The start of `moment`'s minute, in UTC."""
    return moment.astimezone(dt.UTC).replace(second=0, microsecond=0)


class Tally:
    """One worker's counts per minute, from its dispatcher's and completer's threads.

    Called for every claim and every written batch of outcomes, so it keeps its minutes as
    whole minutes since the epoch (an int from `time.time()`, no datetime built per call) and
    turns them into datetimes only when the recorder takes them.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._minutes: dict[int, dict[str, Any]] = {}
        self._dirty: set[int] = set()

    def _minute(self, timestamp: float) -> dict[str, Any]:
        key = int(timestamp // 60)
        found = self._minutes.get(key)
        if found is None:
            found = self._minutes[key] = {
                "started": 0,
                "finished": 0,
                "failed": 0,
                "latency": [0] * (len(LATENCY_BUCKETS) + 1),
                "handlers": {},
            }
        self._dirty.add(key)
        return found

    def claimed(self, jobs: Iterable[ClaimedJob], now: dt.datetime | None = None) -> None:
        """Count a claim's jobs, and the latency of those claimed for their first attempt."""
        now = now or dt.datetime.now(dt.UTC)
        jobs = list(jobs)
        if not jobs:
            return
        with self._lock:
            minute = self._minute(now.timestamp())
            minute["started"] += len(jobs)
            for job in jobs:
                _handler_counts(minute, job.type)[0] += 1
                # A first claim only: not a retry, nor a durable job resuming after a sleep or
                # a wait (it has records then), whose wait is not the queue's.
                if job.attempts != 1 or job.has_steps or job.created_at is None:
                    continue
                since = max(job.created_at, job.run_after or job.created_at)
                waited = max(0.0, (now - since).total_seconds())
                minute["latency"][bisect.bisect_left(LATENCY_BUCKETS, waited)] += 1

    def recorded(
        self,
        *,
        finished: int = 0,
        failed: int = 0,
        now: dt.datetime | None = None,
        handler: str | None = None,
        state: str | None = None,
    ) -> None:
        """Count outcomes written: attempts that finished, and attempts that failed; with
        `handler`, also for that handler key, with the job's `done` or `dead` when `state`,
        the state the outcome left the job in, is one of them."""
        if not (finished or failed):
            return
        with self._lock:
            minute = self._minute(now.timestamp() if now else time.time())
            minute["finished"] += finished
            minute["failed"] += failed
            if handler is not None:
                counts = _handler_counts(minute, handler)
                counts[1] += state == "done"
                counts[2] += failed
                counts[3] += state == "dead"

    def take(self, now: dt.datetime | None = None) -> dict[dt.datetime, dict[str, Any]]:
        """The minutes changed since the last take (their totals so far); forget old ones."""
        current = int((now.timestamp() if now else time.time()) // 60)
        with self._lock:
            changed = {_datetime(key): _copy(self._minutes[key]) for key in self._dirty}
            self._dirty.clear()
            for key in [k for k in self._minutes if k < current - 1]:
                del self._minutes[key]  # written already: a minute gets nothing after the next
        return changed

    def untake(self, minutes: Iterable[dt.datetime]) -> None:
        """Mark minutes taken but not written as changed again: the next take has them (with
        their totals by then), unless they are old enough to be forgotten."""
        with self._lock:
            for moment in minutes:
                key = int(moment.timestamp() // 60)
                if key in self._minutes:
                    self._dirty.add(key)


def _datetime(minute: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(minute * 60, dt.UTC)


def _handler_counts(minute: dict[str, Any], handler: str) -> list[int]:
    """A minute's [started, done, failed, dead] for a handler key, made at 0 on first use."""
    counts: list[int] | None = minute["handlers"].get(handler)
    if counts is None:
        counts = minute["handlers"][handler] = [0, 0, 0, 0]
    return counts


def _copy(minute: dict[str, Any]) -> dict[str, Any]:
    handlers = {key: list(counts) for key, counts in minute["handlers"].items()}
    return {**minute, "latency": list(minute["latency"]), "handlers": handlers}


def write(using: str, worker: str, minutes: dict[dt.datetime, dict[str, Any]]) -> None:
    """Store a worker's minute totals (one upsert of its own rows, and one of its rows per
    handler key: `minutes[m]["handlers"]`, {handler key: [started, done, failed, dead]})."""
    if not minutes:
        return
    dialect = get_dialect(using)
    counts, per_handler = [], []
    for key, values in minutes.items():
        values = dict(values)
        for handler, numbers in values.pop("handlers", {}).items():
            figures = dict(zip(HANDLER_COUNTS, numbers, strict=True))
            per_handler.append(
                MinuteHandlerCount(minute=key, worker=worker, handler=handler, **figures)
            )
        counts.append(MinuteCount(minute=key, worker=worker, **values))
    MinuteCount.objects.using(using).bulk_create(
        counts,
        update_conflicts=True,
        unique_fields=dialect.conflict_target(["minute", "worker"]),
        update_fields=["started", "finished", "failed", "latency"],
    )
    if per_handler:
        MinuteHandlerCount.objects.using(using).bulk_create(
            per_handler,
            update_conflicts=True,
            unique_fields=dialect.conflict_target(["minute", "worker", "handler"]),
            update_fields=list(HANDLER_COUNTS),
        )


def sample(using: str, now: dt.datetime) -> bool:
    """Sample minute `now`'s ready backlog per queue, unless a worker did; drop old rows.

    Returns whether this call sampled. Two workers may both sample the same minute now and
    then: the second one's rows are ignored.
    """
    rows = backlog(using, now)
    if rows is None:
        return False
    store_sample(using, rows)
    return True


def backlog(using: str, now: dt.datetime) -> list[MinuteSample] | None:
    """The sample of minute `now` (rows not saved yet), or None if a worker took it already.

    Reads only: the recorder saves the rows in a write transaction of their own (on SQLite a
    write transaction holds the whole database, and the ready rows' count may take a while).
    """
    minute = minute_of(now)
    if MinuteSample.objects.using(using).filter(minute=minute).exists():
        return None
    return [
        MinuteSample(minute=minute, queue=queue, ready=count, oldest_ready=oldest)
        for queue, (count, oldest) in ready_per_queue(using, now).items()
    ] or [MinuteSample(minute=minute, queue="", ready=0, oldest_ready=None)]


def ready_per_queue(using: str, now: dt.datetime) -> dict[str, tuple[int, float | None]]:
    """{queue: (ready jobs, seconds its oldest ready job has waited by `now`)}, the queues
    with ready jobs only: one pass over the ready rows (a ready row's updated_at is when it
    began to wait: see stats.oldest_ready)."""
    jobs = Job.objects.using(using).filter(state=Job.State.READY)
    per_queue = jobs.order_by().values_list("queue").annotate(n=Count("pk"), at=Min("updated_at"))
    return {
        queue: (count, max(0.0, (now - at).total_seconds()) if at else None)
        for queue, count, at in per_queue
    }


def store_sample(using: str, rows: list[MinuteSample]) -> None:
    """Save a minute's sample (unless a worker saved one), and delete rows older than KEEP."""
    samples = MinuteSample.objects.using(using)
    samples.bulk_create(rows, ignore_conflicts=True)
    cutoff = rows[0].minute - KEEP
    samples.filter(minute__lt=cutoff).delete()
    MinuteCount.objects.using(using).filter(minute__lt=cutoff).delete()
    MinuteHandlerCount.objects.using(using).filter(minute__lt=cutoff).delete()
    MinuteSpend.objects.using(using).filter(minute__lt=cutoff).delete()


def series(using: str, since: dt.datetime, until: dt.datetime, step: int = 1) -> dict[str, Any]:
    """The charts' data from `since` to `until`, in steps of `step` minutes.

    Returns {"minutes": [...], "started"|"finished"|"failed": [...], "p50"|"p95": [...],
    "ready": {queue: [...]}, "oldest_ready": [...]}, one value per step (None where nothing
    was recorded), and "latency": the latency buckets of the whole range.
    """
    first = minute_of(since)
    first -= (first.minute % step) * MINUTE  # steps start on the hour's multiples of `step`
    slots = int((minute_of(until) - first) / MINUTE) // step + 1
    keys = [first + i * step * MINUTE for i in range(slots)]

    # Grouped by slot in the database: a day is a few hundred rows of integers, not thousands
    # of datetimes to convert (the day chart read 12,000 rows, 150 ms on MariaDB).
    in_range = {"minute__gte": first, "minute__lte": until}
    counts = MinuteCount.objects.using(using).filter(**in_range)
    counts = counts.annotate(slot=MinuteSlot("minute", first, step)).order_by()
    out: dict[str, Any] = {"minutes": keys}
    totals: dict[str, list[int | None]] = {
        name: [None] * slots for name in ("started", "finished", "failed")
    }
    merged = [[0] * (len(LATENCY_BUCKETS) + 1) for _ in range(slots)]
    bucket_sums = {
        f"b{i}": Sum(Cast(KeyTextTransform(str(i), "latency"), IntegerField()))
        for i in range(len(LATENCY_BUCKETS) + 1)
    }
    # One GROUP BY for the counts and the latency buckets.
    summed = counts.values_list("slot").annotate(
        s=Sum("started"), f=Sum("finished"), x=Sum("failed"), **bucket_sums
    )
    for n, *values in summed:
        if 0 <= n < slots:
            for name, value in zip(totals, values[:3], strict=True):
                totals[name][n] = value or 0
            merged[n] = [v or 0 for v in values[3:]]
    out.update(totals)
    out["p50"] = [quantile(buckets, 0.5) for buckets in merged]
    out["p95"] = [quantile(buckets, 0.95) for buckets in merged]
    out["latency"] = [sum(column) for column in zip(*merged, strict=True)]  # the whole range
    samples = MinuteSample.objects.using(using).filter(**in_range)
    ready: dict[str, list[int | None]] = {}
    oldest: list[float | None] = [None] * slots
    # One row per minute and queue (a unique constraint): a step keeps its minutes' largest.
    per_slot = (
        samples.annotate(slot=MinuteSlot("minute", first, step))
        .order_by()
        .values_list("slot", "queue")
        .annotate(most=Max("ready"), age=Max("oldest_ready"))
    )
    sampled = [False] * slots
    for n, queue, count, age in per_slot:
        if not 0 <= n < slots:
            continue
        sampled[n] = True
        if queue:
            line = ready.setdefault(queue, [None] * slots)
            line[n] = max(line[n] or 0, count)
        if age is not None:
            oldest[n] = max(oldest[n] or 0.0, age)
    for line in ready.values():  # a sampled minute without a queue's row: none was ready
        for n, was in enumerate(sampled):
            if was and line[n] is None:
                line[n] = 0
    out["ready"] = ready
    out["oldest_ready"] = oldest
    return out


def earliest(using: str, since: dt.datetime) -> dt.datetime | None:
    """The first minute since `since` with a figure (a count or a sample), or None."""
    found = [
        model.objects.using(using).filter(minute__gte=since).aggregate(m=Min("minute"))["m"]
        for model in (MinuteCount, MinuteSample)
    ]
    return min((m for m in found if m is not None), default=None)


def quantile(buckets: list[int], q: float) -> float | None:
    """The upper bound of the bucket holding quantile `q` (None without data; the last
    bucket, unbounded, reads as its lower bound)."""
    total = sum(buckets)
    if not total:
        return None
    wanted, seen = q * total, 0
    for index, count in enumerate(buckets):
        seen += count
        if seen >= wanted:
            return float(LATENCY_BUCKETS[min(index, len(LATENCY_BUCKETS) - 1)])
    return float(LATENCY_BUCKETS[-1])
