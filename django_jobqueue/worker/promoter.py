"""The promoter: moves `scheduled` jobs whose `run_after` has passed to `ready`.

Jobs that run later (a `run_after` in the future, a retry's backoff) wait as `scheduled`,
outside the ready index, so that a hundred thousand of them cost the claim nothing. Every
worker promotes what is due, in bounded batches with SKIP LOCKED (workers never wait on each
other), and sleeps until the next due time by the database clock, at most POLL_INTERVAL.
"""

from __future__ import annotations

import logging

from ..dialects import Dialect
from ..dialects.functions import DbNow
from ..models import Job
from ..workflows import promote_due
from .duty import Duty

logger = logging.getLogger(__name__)


def any_due(dialect: Dialect, queues: list[str]) -> bool:
    """Whether a scheduled job in `queues` is due (database clock)."""
    return Job.objects.using(dialect.using).due().in_queues(queues).exists()


def seconds_until_due(dialect: Dialect) -> float | None:
    """Seconds until the earliest scheduled job is due, by the database clock (None: none)."""
    row = (
        Job.objects.using(dialect.using)
        .filter(state=Job.State.SCHEDULED)
        .order_by("run_after")
        .annotate(now=DbNow())
        .values_list("run_after", "now")
        .first()
    )
    if row is None:
        return None
    run_after, now = row
    if run_after is None or now is None:
        return None
    return (run_after - now).total_seconds()


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
        until = seconds_until_due(self.dialect)
        if until is None:
            return None
        if until <= 0:
            promoted = promote_due(self.dialect, batch=self.batch)
            if not promoted:
                return 0.01  # another worker's promoter holds them: look again shortly
            logger.debug("Promoted %s due job(s)", promoted)
            return 0.0  # more may be due: look again at once
        # A little after the due time: clocks differ by the time the query took.
        return min(self.interval, until + 0.001)
