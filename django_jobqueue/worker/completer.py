"""The completer: records outcomes in batches, on a thread and a connection of its own.

Executor threads hand it outcomes and go back to work; it writes every finished job that has
accumulated in one transaction (one statement on PostgreSQL), each row fenced by id,
owner and generation, so no handler waits for another's write. Failures are written one by
one (their history is read under the row's lock).

A write that fails because the database is unreachable or busy is retried, with backoff, for
as long as it takes: the attempt stays in the worker's registry meanwhile, so the heartbeat
keeps its lease. A write that can never succeed (the database refuses the result) fails the
attempt for good instead of letting the lease expire and the handler run again; a failure
that cannot be written as planned is written as a plain failure (execution.record_failure).
Either way that one outcome never holds back the others.
"""

from __future__ import annotations

import logging
import queue as queue_module
import time
from collections.abc import Callable

from django.db import connections

from .. import leases
from ..conf import JobQueueSettings
from ..dialects import Dialect
from ..error_records import log_text
from ..exceptions import ResultNotStored
from ..execution import PERMANENT_ERRORS, Outcome, log_outcome, record_failure, send_outcome_signals
from ..execution import logger as execution_logger
from .duty import Duty
from .flights import Flights

logger = logging.getLogger(__name__)

MAX_BATCH = 500


class Completer(Duty):
    """Writes the outcomes it is given; `recorded(flight)` is called after each."""

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
    ) -> None:
        super().__init__(dialect, interval=0.5, lock_timeout=lock_timeout)
        self.conf = conf
        self.owner = owner
        self.flights = flights
        self.on_empty = on_empty
        self._queue: queue_module.SimpleQueue[Outcome | None] = queue_module.SimpleQueue()
        self._pending: list[Outcome] = []
        self._busy_until = 0.0

    def submit(self, outcome: Outcome) -> None:
        """Queue `outcome` for writing (from any thread)."""
        self._queue.put(outcome)

    def backlog(self) -> int:
        """Outcomes not written yet (about: a stop marker may count as one)."""
        return self._queue.qsize() + len(self._pending)

    def run(self) -> None:
        # Not Duty's periodic loop: it blocks on its queue, and writes as soon as it has work.
        try:
            while True:
                if not self._pending:
                    outcome = self._queue.get()
                    if outcome is None:  # stop(): everything before it was written
                        return
                    self._pending.append(outcome)
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
                    self.dialect.connection.close()
                    time.sleep(delay)
                    continue
                if self._pending:  # rows locked by another transaction: come back shortly
                    time.sleep(0.05)
        finally:
            connections.close_all()

    def _drain_queue(self) -> None:
        while len(self._pending) < MAX_BATCH:
            try:
                outcome = self._queue.get_nowait()
            except queue_module.Empty:
                return
            if outcome is None:
                self._queue.put(None)  # stop once the pending ones are written
                return
            self._pending.append(outcome)

    def stop(self, timeout: float | None = None) -> None:
        """Stop after writing what was submitted before (or give up after `timeout`)."""
        self._stop_event.set()
        self._queue.put(None)
        if timeout is not None and self.is_alive():
            self.join(timeout)

    def _write_pending(self) -> None:
        """Write what is pending; what is neither recorded nor busy stays pending on error."""
        pending, self._pending = self._pending, []
        later: list[Outcome] = []
        try:
            done = [o for o in pending if o.succeeded]
            if done:
                later += self._finish(done)
            for outcome in pending:
                failed = not outcome.succeeded and not outcome.flight.recorded
                if failed and not self._fail(outcome):
                    later.append(outcome)
        except BaseException:
            self._pending = [o for o in pending if not o.flight.recorded]
            raise
        self._pending = later

    def _finish(self, outcomes: list[Outcome]) -> list[Outcome]:
        """Write successful outcomes in one transaction; return those whose rows were busy.

        A result the database refuses (a batch failing with a data error) is isolated by
        writing the batch one by one; that attempt then fails for good.
        """
        items = [(o.flight.lease.job_id, o.flight.lease.attempt, o.text) for o in outcomes]
        try:
            report = leases.finish_many(self.dialect, self.owner, items)
        except PERMANENT_ERRORS as exc:
            self.dialect.connection.close()
            if len(outcomes) > 1:
                busy: list[Outcome] = []
                for outcome in outcomes:  # one by one: only the bad one fails
                    busy += self._finish([outcome])
                return busy
            outcome = outcomes[0]
            logger.error(
                "The database refused the result of job id=%s: %s",
                outcome.flight.job.pk, log_text(exc),
            )  # fmt: skip
            outcome.error = ResultNotStored(f"the database refused the result: {exc}")
            outcome.result = outcome.text = None
            return [] if self._fail(outcome) else [outcome]
        by_id = {o.flight.lease.job_id: o for o in outcomes}
        for finished in report.finished:
            self._recorded(by_id[finished.job_id], finished.state)
        for job_id, state in report.recorded:
            logger.info("Job id=%s was recorded %s by an earlier write", job_id, state)
            self._recorded(by_id[job_id], state)
        for job_id in report.lost:
            self._recorded(by_id[job_id], None)
        return [by_id[job_id] for job_id in report.busy]

    def _fail(self, outcome: Outcome) -> bool:
        """Write a failed attempt; False when its row is locked elsewhere (try again later)."""
        state, plan = record_failure(
            self.dialect, outcome, self.conf, on_refused=self.dialect.connection.close
        )
        if state == leases.BUSY:
            return False
        log_outcome(outcome, state, plan)
        self._recorded(outcome, state, logged=True)
        return True

    def _recorded(self, outcome: Outcome, state: str | None, *, logged: bool = False) -> None:
        if not logged and (state is None or execution_logger.isEnabledFor(logging.DEBUG)):
            log_outcome(outcome, state)
        send_outcome_signals(outcome, state)  # committed: receivers see what they are told
        outcome.flight.recorded = True
        if self.flights.remove(outcome.flight) and self.on_empty is not None:
            self.on_empty()

    def flush(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for every queued outcome to be written."""
        deadline = time.monotonic() + timeout
        while self.backlog() and time.monotonic() < deadline and self.is_alive():
            time.sleep(0.01)
        return not self.backlog()
