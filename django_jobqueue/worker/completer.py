"""The completer: records outcomes in batches, on a thread and a connection of its own.

Executor threads hand it outcomes and go back to work; it writes every finished job that has
accumulated in one transaction (one statement on PostgreSQL), each row fenced by id,
owner and generation, so no handler waits for another's write. Failures are written one by
one (their history is read under the row's lock).

A write that fails because the database is unreachable or busy is retried, with backoff, for
as long as it takes: the attempt stays in the worker's registry meanwhile, so the heartbeat
keeps its lease. A write that can never succeed (the database refuses the result) fails the
attempt for good instead of letting the lease expire and the handler run again; a failure
that cannot be written as planned is written as a plain failure. Either way that one outcome
never holds back the others. What is written, logged and signalled is `outcomes.record()`'s.
"""

from __future__ import annotations

import logging
import queue as queue_module
import time
from collections.abc import Callable

from .. import metrics
from ..conf import JobQueueSettings
from ..dialects import Dialect
from ..engine import outcomes
from ..engine.attempts import Outcome
from ..engine.error_records import log_text
from ..exceptions import RateLimited, Suspend
from . import connection_health
from .duty import Duty
from .flights import Flights

logger = logging.getLogger(__name__)

MAX_BATCH = 500
# Outcomes that arrive one at a time (jobs of some milliseconds, threads freeing one by one)
# would each cost a transaction and its commit's WAL flush. After the first outcome of a
# batch the completer waits for more, as long as four gaps between recent arrivals, at most
# GATHER_MAX seconds: it then writes several outcomes in one transaction. Outcomes further
# apart than GATHER_MAX (long jobs) are written at once.
GATHER_MAX = 0.01
GATHER_GAPS = 4


class Completer(Duty):
    """Writes the outcomes it is given.

    `on_empty` is called when a write left no attempt held, `on_recorded` after every write
    that recorded something (the dispatcher's back-pressure waits for it).
    """

    retry_after = 0.05
    max_backoff = 2.0

    def __init__(
        self,
        dialect: Dialect,
        *,
        conf: JobQueueSettings,
        owner: str,
        flights: Flights,
        lock_timeout: float,
        on_empty: Callable[[], None] | None = None,
        on_recorded: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(dialect, interval=0.5, lock_timeout=lock_timeout)
        self.conf = conf
        self.owner = owner
        self.flights = flights
        self.on_empty = on_empty
        self.on_recorded = on_recorded
        # Called after a write that suspended jobs until a time (a sleep, a budget's wait): the
        # promoter looks again at when the next scheduled job is due (it may be sooner than
        # its next tick).
        self.on_suspended: Callable[[], None] | None = None
        self._suspended = False
        self.tally: metrics.Tally | None = None  # set by the worker: the per-minute figures
        self._queue: queue_module.SimpleQueue[Outcome | None] = queue_module.SimpleQueue()
        self._pending: list[Outcome] = []
        self._writing = 0  # outcomes of the write in progress (out of `_pending` meanwhile)
        self._busy_until = 0.0
        self._last_arrival: float | None = None
        self.gap: float | None = None  # seconds between submitted outcomes, recent average

    def submit(self, outcome: Outcome) -> None:
        """Queue `outcome` for writing (from any thread)."""
        now = time.monotonic()
        last, self._last_arrival = self._last_arrival, now
        if last is not None:  # unlocked: a lost update of an average costs nothing
            gap = self.gap
            self.gap = now - last if gap is None else gap + 0.1 * (now - last - gap)
        self._queue.put(outcome)

    def gather_window(self) -> float:
        """Seconds to wait for more outcomes after the first of a batch (0: write at once)."""
        gap = self.gap
        if gap is None or gap > GATHER_MAX / 2:
            return 0.0  # outcomes too far apart for a wait to gather more than one
        return min(GATHER_MAX, gap * GATHER_GAPS)

    def backlog(self) -> int:
        """Outcomes not written yet (about: a stop marker may count as one)."""
        return self._queue.qsize() + len(self._pending) + self._writing

    def loop(self) -> None:
        # Not Duty's periodic loop: it blocks on its queue, and writes as soon as it has work.
        while True:
            if not self._pending:
                outcome = self._queue.get()
                if outcome is None:  # stop(): everything before it was written
                    return
                self._pending.append(outcome)
                self._gather()
            self._drain_queue()
            try:
                self.dialect.bound_waits(self.lock_timeout, self.idle_timeout)
                self._write_pending()
                self.failures = 0
            except Exception as exc:  # the write is retried; the worker carries on
                self.failures += 1
                delay = min(self.retry_after * 2 ** (self.failures - 1), self.max_backoff)
                logger.warning(
                    "Could not record %s outcome(s) yet (%s); retrying in %.2fs",
                    len(self._pending), log_text(exc), delay,
                )  # fmt: skip
                connection_health.note(exc, self.dialect)
                self.dialect.connection.close()
                time.sleep(delay)
                continue
            if self._pending:  # rows locked by another transaction: come back shortly
                time.sleep(0.05)

    def _take(self, timeout: float | None = None) -> bool:
        """Move one more submitted outcome to the pending batch, waiting up to `timeout`
        seconds for it (None: not at all). False when none came, or the queue is stopping."""
        try:
            outcome = self._queue.get(timeout=timeout) if timeout else self._queue.get_nowait()
        except queue_module.Empty:
            return False
        if outcome is None:
            self._queue.put(None)  # stop once the pending ones are written
            return False
        self._pending.append(outcome)
        return True

    def _drain_queue(self) -> None:
        while len(self._pending) < MAX_BATCH and self._take():
            pass

    def _gather(self) -> None:
        """Wait up to the gather window for more outcomes to write with the first."""
        window = self.gather_window()
        if not window:
            return
        deadline = time.monotonic() + window
        while len(self._pending) < MAX_BATCH and (left := deadline - time.monotonic()) > 0:
            if not self._take(left):
                return

    def stop(self, timeout: float | None = None) -> None:
        """Stop after writing what was submitted before (or give up after `timeout`)."""
        self._stop_event.set()
        self._queue.put(None)
        if timeout is not None and self.is_alive():
            self.join(timeout)

    def _write_pending(self) -> None:
        """Write what is pending; what is neither recorded nor busy stays pending on error."""
        # Counted as writing before they leave `_pending`: backlog() never misses them.
        self._writing = len(self._pending)
        pending, self._pending = self._pending, []
        try:
            self._pending = self._finish(pending)
        except BaseException:
            self._pending = [o for o in pending if not o.flight.recorded]
            raise
        finally:
            self._writing = 0
        if self.on_recorded is not None and len(self._pending) < len(pending):
            self.on_recorded()
        if self._suspended:
            self._suspended = False
            if self.on_suspended is not None:
                self.on_suspended()

    def _finish(self, batch: list[Outcome]) -> list[Outcome]:
        """Write the outcomes in `batch` (outcomes.record); return those whose rows were busy."""
        return outcomes.record(
            self.dialect,
            self.conf,
            self.owner,
            batch,
            on_recorded=self._recorded,
            on_refused=self.dialect.connection.close,
        )

    def _recorded(self, outcome: Outcome, state: str | None) -> None:
        if state == "scheduled" and isinstance(outcome.error, Suspend | RateLimited):
            self._suspended = True
        if self.tally is not None and state is not None:
            suspended = isinstance(outcome.error, Suspend | RateLimited)
            handler = outcome.flight.job.type
            if outcome.error is None:
                self.tally.recorded(finished=1, handler=handler, state=state)
            elif not suspended:
                self.tally.recorded(failed=1, handler=handler, state=state)
        if self.flights.remove(outcome.flight) and self.on_empty is not None:
            self.on_empty()

    def flush(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for every queued outcome to be written."""
        deadline = time.monotonic() + timeout
        while self.backlog() and time.monotonic() < deadline and self.is_alive():
            time.sleep(0.01)
        return not self.backlog()
