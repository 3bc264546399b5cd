"""The pruner: applies JOBQUEUE["RETENTION"], one bounded batch of old jobs at a time.

Every worker prunes, so a deployment stays bounded with no cron job: one batch (one short
transaction, see `pruning`) per tick. A pass that found nothing to delete is followed by one
when the next finished job passes its age (at most PRUNE_INTERVAL seconds later); a pass that
deleted rows, by one a second later (under a steady load, jobs pass their age every second).
While a backlog remains, the pace follows the rate at which jobs finish: the next batch comes
after a pause as long as the last batch took (pruning gets at most half of the duty's time),
and the batch doubles, up to MAX_BATCH_SIZE rows, while full batches take under FAST seconds,
and halves when one takes over SLOW. So
RETENTION bounds the table at any rate the workers can drain, and a batch's transaction stays
short. Workers that prune at once skip each other's locked rows.
"""

from __future__ import annotations

import datetime as dt
import logging
import random
import time

from .. import pruning
from ..dialects import Dialect
from .duty import Duty

logger = logging.getLogger(__name__)

PRUNE_INTERVAL = 60.0  # seconds between batches once caught up (+-20% jitter)
BUSY_INTERVAL = 1.0  # seconds between batches while old jobs are left, at most
MIN_PAUSE = 0.05  # seconds between batches while old jobs are left, at least
FAST, SLOW = 0.25, 1.0  # seconds a batch takes below which it grows, above which it shrinks


class Pruner(Duty):
    """Deletes one batch of jobs past their retention age per tick, state after state."""

    def __init__(
        self,
        dialect: Dialect,
        *,
        ages: dict[str, dt.timedelta],
        lock_timeout: float,
        interval: float = PRUNE_INTERVAL,
        batch_size: int = pruning.DEFAULT_BATCH_SIZE,
        max_batch_size: int = pruning.MAX_BATCH_SIZE,
    ) -> None:
        super().__init__(dialect, interval=interval, lock_timeout=lock_timeout)
        self.ages = dict(ages)
        self.min_batch_size = min(batch_size, max_batch_size)
        self.max_batch_size = max_batch_size
        self.batch_size = self.min_batch_size
        self._states = list(self.ages)
        self._turn = 0
        self._cursors = {state: pruning.Cursor() for state in self._states}
        self._backlog = set(self._states)  # states whose current pass has not ended
        self._pass_deleted = 0  # rows deleted since the current passes began

    def tick(self) -> float | None:
        state = self._states[self._turn % len(self._states)]
        self._turn += 1
        started = time.monotonic()
        batch = pruning.prune_batch(
            self.dialect,
            state=state,
            older_than=self.ages[state],
            cursor=self._cursors[state],
            batch_size=self.batch_size,
        )
        took = time.monotonic() - started
        if took > SLOW:
            self.batch_size = max(self.min_batch_size, self.batch_size // 2)
        elif not batch.done and took < FAST:
            self.batch_size = min(self.max_batch_size, self.batch_size * 2)
        if batch.deleted:
            logger.info("Pruned %s %s job(s) past their retention", batch.deleted, state)
            self._pass_deleted += batch.deleted
        if batch.done:
            self._cursors[state] = pruning.Cursor()  # the next pass starts over
            self._backlog.discard(state)
        else:
            self._backlog.add(state)
        if self._backlog:
            return min(BUSY_INTERVAL, max(MIN_PAUSE, took))
        self._backlog = set(self._states)
        deleted, self._pass_deleted = self._pass_deleted, 0
        if deleted:  # jobs are finishing: more pass their age every second
            return BUSY_INTERVAL
        return self._until_next_old()

    def _until_next_old(self) -> float:
        """Seconds until the next pass, when the last one found nothing to delete: when the
        next finished job passes its age, within [BUSY_INTERVAL, interval] (+0-20% jitter).

        A whole interval later, the first pass after a quiet start could meet most of a
        minute of rows at once (on SQLite, a write lock held long enough to slow the drain).
        """
        until = pruning.seconds_until_old(self.dialect, self.ages)
        if until is None:  # no finished job is young: none passes its age before the shortest
            until = min(age.total_seconds() for age in self.ages.values())
        return min(self.interval, max(BUSY_INTERVAL, until)) * random.uniform(1.0, 1.2)
