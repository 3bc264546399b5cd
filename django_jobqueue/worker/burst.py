"""When a burst worker may exit: when nothing is runnable by the database's own view.

Nothing ready that it can claim, nothing due in its queues, no expired lease in its queues
whose owner is gone (it stays until its own beats have been healthy for a lease TTL, the
reclaimer's rule for judging others, and reclaims it), and none of the jobs its reclaimer sent
back to `scheduled` still waiting out their backoff. A retry of a job that failed here, or a
`run_after` in the future, is left for the next run.

The dispatcher reads `pending()` before the claim that decides the exit, never after it: a
promotion or a reclaim that another transaction has not committed by that read still shows
the job due or expired (READ COMMITTED, or SQLite's last committed snapshot), and one that
has committed by then is seen by the claim that follows.
"""

from __future__ import annotations

import logging
import threading

from django.db import DatabaseError, InterfaceError

from ..dialects import Dialect
from ..models import Job
from .promoter import Promoter, any_due, promote_all_due
from .reclaimer import Reclaimer, any_reclaimable

logger = logging.getLogger(__name__)


class BurstCheck:
    """What a burst worker still waits for; see the module docstring for the exit rule."""

    def __init__(
        self,
        dialect: Dialect,
        *,
        queues: list[str],
        batch: int,
        promoter: Promoter,
        reclaimer: Reclaimer,
    ) -> None:
        self.dialect = dialect
        self.queues = queues
        self.batch = batch
        self.promoter = promoter
        self.reclaimer = reclaimer
        self._lock = threading.Lock()
        self._rescheduled: set[int] = set()

    def note_reclaimed(self, moved: list[tuple[int, str]]) -> None:
        """Remember the jobs this worker reclaimed to `scheduled` (the reclaimer's on_reclaimed)."""
        with self._lock:
            self._rescheduled.update(pk for pk, state in moved if state == Job.State.SCHEDULED)

    def pending(self) -> bool:
        """Whether anything due or reclaimable is left in this worker's queues."""
        if any_due(self.dialect, self.queues):
            self._promote()
            return True
        if any_reclaimable(self.dialect, self.queues):
            return True
        # Read after any_reclaimable(): a reclaim committed since is still under way, or noted.
        if self.reclaimer.reclaiming:
            return True
        return self._waiting_out_backoff()

    def _waiting_out_backoff(self) -> bool:
        with self._lock:
            ids = set(self._rescheduled)
        if not ids:
            return False
        jobs = Job.objects.using(self.dialect.using).in_queues(self.queues)
        waiting = set(
            jobs.filter(pk__in=sorted(ids), state=Job.State.SCHEDULED).values_list("pk", flat=True)
        )
        with self._lock:
            self._rescheduled -= ids - waiting  # promoted (the claim sees them) or gone on
        return bool(waiting)

    def _promote(self) -> None:
        # Promoted here, the claim that follows takes them at once.
        try:
            promote_all_due(self.dialect, batch=self.batch)
        except (DatabaseError, InterfaceError) as exc:
            logger.debug("Burst promotion failed (%s); the promoter retries", exc)
            self.promoter.wake()
