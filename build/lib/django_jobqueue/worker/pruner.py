"""The pruner: applies JOBQUEUE["RETENTION"], one bounded batch of old jobs at a time.

Every worker prunes, at a low rate, so a deployment stays bounded with no cron job: one
batch (one short transaction, see `pruning`) per tick, a tick every PRUNE_INTERVAL seconds
once nothing is left to delete, every BUSY_INTERVAL while a backlog remains. Workers that
prune at once skip each other's locked rows.
"""

from __future__ import annotations

import datetime as dt
import logging
import random

from .. import pruning
from ..dialects import Dialect
from .duty import Duty

logger = logging.getLogger(__name__)

PRUNE_INTERVAL = 60.0  # seconds between batches once caught up (+-20% jitter)
BUSY_INTERVAL = 1.0  # seconds between batches while old jobs are left


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
    ) -> None:
        super().__init__(dialect, interval=interval, lock_timeout=lock_timeout)
        self.ages = dict(ages)
        self.batch_size = batch_size
        self._states = list(self.ages)
        self._turn = 0
        self._cursors = {state: pruning.Cursor() for state in self._states}
        self._backlog = set(self._states)  # states whose current pass has not ended

    def tick(self) -> float | None:
        state = self._states[self._turn % len(self._states)]
        self._turn += 1
        batch = pruning.prune_batch(
            self.dialect,
            state=state,
            older_than=self.ages[state],
            cursor=self._cursors[state],
            batch_size=self.batch_size,
        )
        if batch.deleted:
            logger.info("Pruned %s %s job(s) past their retention", batch.deleted, state)
        if batch.done:
            self._cursors[state] = pruning.Cursor()  # the next pass starts over
            self._backlog.discard(state)
        else:
            self._backlog.add(state)
        if self._backlog:
            return BUSY_INTERVAL
        self._backlog = set(self._states)
        return self.interval * random.uniform(0.8, 1.2)
