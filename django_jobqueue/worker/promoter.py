"""The promoter: moves `scheduled` jobs whose `run_after` has passed to `ready`, and jobs
whose wait for an event timed out back to `ready` (they resume, and their wait raises).

Jobs that run later (a `run_after` in the future, a retry's backoff, a durable sleep) wait as
`scheduled`, outside the ready index, so that a hundred thousand of them cost the claim
nothing. Every worker promotes what is due, in bounded batches with SKIP LOCKED (workers never
wait on each other), and sleeps until the next due time by the database clock, at most
POLL_INTERVAL.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from ..dialects import Dialect, get_dialect
from ..dialects.base import aware
from ..engine import events
from ..engine.staging import promote_due
from ..models import Job, JobWait
from ..models.functions import DbNow
from .duty import Duty

logger = logging.getLogger(__name__)


def any_due(dialect: Dialect, queues: list[str]) -> bool:
    """Whether a scheduled job, or a timed-out wait, in `queues` is due (database clock)."""
    if Job.objects.using(dialect.using).due().in_queues(queues).exists():
        return True
    waits = JobWait.objects.using(dialect.using).filter(until__lte=DbNow())
    return (waits.filter(job__queue__in=queues) if queues else waits).exists()


def seconds_until_due(dialect: Dialect) -> float | None:
    """Seconds until the earliest scheduled job or event wait is due, by the database clock
    (None: none)."""
    due = [seconds for seconds in due_times(dialect) if seconds is not None]
    return min(due) if due else None


def due_times(dialect: Dialect) -> tuple[float | None, float | None]:
    """Seconds until the earliest scheduled job, and until the earliest event wait's timeout,
    is due, by the database clock (None: there is none)."""
    due: list[float | None] = []
    with dialect.connection.cursor() as cursor:
        for sql, params in _due_statements(dialect.using):
            cursor.execute(sql, params)
            row = cursor.fetchone()
            has = row is not None and row[0] is not None
            due.append((aware(row[0]) - aware(row[1])).total_seconds() if has else None)
    return due[0], due[1]


@functools.cache
def _due_statements(using: str) -> list[tuple[str, list[Any]]]:
    """The two reads of seconds_until_due(), compiled once: an idle promoter sends them every
    POLL_INTERVAL, and building them with the ORM each time cost several times their run."""
    dialect = get_dialect(using)
    return [
        dialect.compile_query(
            Job.objects.using(using)
            .filter(state=Job.State.SCHEDULED)
            .order_by("run_after")
            .annotate(now=DbNow())
            .values_list("run_after", "now")[:1]
        ),
        dialect.compile_query(
            JobWait.objects.using(using)
            .filter(until__isnull=False)
            .order_by("until")
            .annotate(now=DbNow())
            .values_list("until", "now")[:1]
        ),
    ]


def promote_all_due(dialect: Dialect, *, batch: int) -> int:
    """Promote a batch of due scheduled jobs, and wake a batch of timed-out waits."""
    return promote_due(dialect, batch=batch) + events.expire_waits(dialect, batch=batch)


class Promoter(Duty):
    """Promotes due jobs; sleeps until the next one is due (at most `interval`)."""

    def __init__(
        self, dialect: Dialect, *, interval: float, lock_timeout: float, batch: int
    ) -> None:
        super().__init__(dialect, interval=interval, lock_timeout=lock_timeout)
        self.batch = batch

    def tick(self) -> float | None:
        # A read first: an idle promoter opens no write transaction (on SQLite, that would
        # take the database's write lock every second for nothing).
        jobs_until, waits_until = due_times(self.dialect)
        due = [until for until in (jobs_until, waits_until) if until is not None]
        if not due:
            return None
        if min(due) > 0:
            # A little after the due time: clocks differ by the time the query took.
            return min(self.interval, min(due) + 0.001)
        promoted = woken = 0
        if jobs_until is not None and jobs_until <= 0:
            promoted = promote_due(self.dialect, batch=self.batch)
        if waits_until is not None and waits_until <= 0:
            woken = events.expire_waits(self.dialect, batch=self.batch)
        if not promoted + woken:
            return 0.01  # another worker's promoter holds them: look again shortly
        logger.debug("Promoted %s due job(s), woke %s timed-out wait(s)", promoted, woken)
        return 0.0  # more may be due: look again at once
