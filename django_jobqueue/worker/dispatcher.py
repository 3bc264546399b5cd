"""The dispatcher: the loop that claims ready jobs and hands them to the executor.

It claims in batches, sized to the free handler slots plus a prefetch that only short jobs
earn, marks them `running` in the claim itself, and times out attempts past their deadline.
Jobs whose start a claim counts against a rate are not prefetched: a claim takes only as many
as will find a slot at once (`rated_room`), they go ahead of the others in the executor, and
each must start within START_WITHIN of the count (`InFlight.start_by`), or it is handed back
uncharged.
It never renews a lease, reclaims or records an outcome: those are other duties, on other
threads, so nothing it waits for (a locked limit row, a database backoff) can cost a lease.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable

from django.db import DatabaseError, InterfaceError, connections

from .. import metrics
from ..dialects import Dialect
from ..engine import durable, leases, quarantine, wake
from ..engine.attempts import InFlight, Outcome
from ..engine.error_records import log_text
from ..engine.fair_selection import FairShare
from ..exceptions import JobTimeout
from ..limits import window
from . import connection_health
from .executor import Executor
from .flights import Flights

logger = logging.getLogger(__name__)

# Prefetched jobs must start within about this many seconds: prefetch is sized from the
# recent handler duration, so long jobs are never claimed ahead of a free thread.
PREFETCH_HORIZON = 0.05
# After it found work, an idle dispatcher polls again this soon, doubling up to POLL_INTERVAL.
FIRST_IDLE_POLL = 0.05
# While handler threads cannot connect, claims pause this long, doubling up to the maximum.
NO_CONNECTION_PAUSE = 0.5
NO_CONNECTION_PAUSE_MAX = 10.0
# A job counted against a rate starts within this many seconds of the count, or is handed
# back: half the margin by which a rate's window outlasts its period, the other half being
# for the way from the worker's start of the attempt to the handler's first line (job_started
# receivers; an async coroutine's first step on the event loop). So the starts of any window
# of the period, counted at handler start, stay within the rate.
START_WITHIN = window.MARGIN / 2
# Back-pressure: the jobs held (claimed and not yet recorded, running or not) stay within this
# many times the capacity. When the completer falls behind (a slow or locked database), claims
# pause until it has caught up, so memory and held leases stay bounded.
BACKLOG_FACTOR = 2


class Dispatcher:
    """Claims and dispatches until `stop()`; see JobWorker for how it is wired."""

    def __init__(
        self,
        dialect: Dialect,
        *,
        owner: str,
        queues: list[str],
        concurrency: int,
        prefetch: int,
        lease_ttl: float,
        lock_timeout: float,
        poll_interval: float,
        max_abandoned_threads: int,
        fair_share: FairShare,
        flights: Flights,
        executor: Executor,
        submit_outcome: Callable[[Outcome], None],
        renewer: Callable[[leases.Lease], Callable[[], bool]],
        unrecorded: Callable[[], int] = lambda: 0,
    ) -> None:
        self.dialect = dialect
        self.owner = owner
        self.queues = queues
        self.concurrency = concurrency
        self.prefetch = prefetch
        self.lease_ttl = lease_ttl
        self.lock_timeout = lock_timeout
        self.poll_interval = poll_interval
        self.max_abandoned_threads = max_abandoned_threads
        self.fair_share = fair_share
        self.flights = flights
        self.executor = executor
        self.submit_outcome = submit_outcome
        self.renewer = renewer
        self.unrecorded = unrecorded  # outcomes handed to the completer, not written yet
        self.claimed = 0
        self.stopping = False
        self.too_many_hung = False
        self._idle_wait = FIRST_IDLE_POLL
        self._db_backoff = 0.0
        self._handed_back: list[tuple[InFlight, BaseException | None, bool]] = []
        self._handed_back_lock = threading.Lock()
        self._paused_until = 0.0
        # Whether the last step claimed less than it had room for because too many attempts
        # were waiting to be recorded; the completer's progress wakes the loop then.
        self.held_back = False
        self.tally: metrics.Tally | None = None  # set by the worker: the per-minute figures

    # -- sizes -------------------------------------------------------------------------------

    def capacity(self) -> int:
        """Threads plus the prefetch that recent handler durations earn."""
        ewma = self.executor.ewma_duration
        if not self.prefetch or ewma is None:
            return self.concurrency
        earned = int(self.concurrency * PREFETCH_HORIZON / max(ewma, 1e-6))
        return self.concurrency + min(self.prefetch, earned)

    def wants_work(self, load: int) -> bool:
        """Whether to claim at this executor load: a thread is idle, or half the room is free."""
        return load < self.concurrency or load <= self.capacity() // 2

    def rated_room(self, load: int) -> int:
        """How many jobs counted against a rate a claim may take at this executor load.

        As many as will find a slot within START_WITHIN: the free slots, and the prefetch
        that short handlers earn (`capacity()`: it assumes that prefetched jobs start within
        PREFETCH_HORIZON, no longer than START_WITHIN). With no room, one, if the running
        handlers are short enough to free a slot well within START_WITHIN (it waits for it
        ahead of the jobs prefetched): a worker busy with short jobs has no free slot when
        it claims, and would otherwise never start a rated job while its backlog lasts. A
        rated job that would still start later is handed back (its units given back).
        """
        free = self.capacity() - load
        if free > 0:
            return free
        ewma = self.executor.ewma_duration
        if ewma is None or ewma / self.concurrency > START_WITHIN / 4:
            return 0
        return 0 if self.executor.rated_waiting else 1

    def unrecorded_room(self) -> int:
        """How many more jobs may be held before the completer catches up (back-pressure).

        What is held: the attempts queued or running here, and the outcomes waiting to be
        written. (Not `len(flights)`: an attempt leaked by a bug would then hold claims back
        for good.)
        """
        return BACKLOG_FACTOR * self.capacity() - self.executor.load - self.unrecorded()

    def recorded(self) -> None:
        """The completer wrote outcomes (its thread): claim again if that was what held us,
        or if the jobs that ended may have made room under a resource's concurrency cap."""
        if self.held_back or self.fair_share.jobs_ended():
            wake.wake_up()

    def low_water(self) -> int:
        """The highest executor load at which the dispatcher wants to claim."""
        return max(self.concurrency - 1, self.capacity() // 2)

    # -- the loop ----------------------------------------------------------------------------

    def step(self, max_jobs: int | None = None) -> int:
        """Reap timeouts, then claim and dispatch what there is room for; return jobs claimed."""
        self.held_back = False
        self.reap()
        self.release_handed_back()
        if self.paused():
            return 0
        if self.executor.hung() >= self.max_abandoned_threads:
            logger.error(
                "%s timed-out jobs are still stuck in their threads; stopping so the process "
                "can be restarted",
                len(self.executor.abandoned),
            )
            self.too_many_hung = True
            self.stopping = True
            return 0
        load = self.executor.load
        if not self.wants_work(load):
            return 0
        room = self.capacity() - load
        # Set before the count is read: a write recorded after the read then wakes the loop.
        self.held_back = True
        unrecorded_room = self.unrecorded_room()
        self.held_back = unrecorded_room < room
        room = min(room, unrecorded_room)
        if max_jobs is not None:
            room = min(room, max_jobs - self.claimed)
        if room <= 0:
            return 0
        self.fair_share.rated_room = self.rated_room(load)  # they must start at once
        self.dialect.bound_waits(self.lock_timeout, self.lease_ttl)
        jobs = leases.claim(
            self.dialect,
            owner=self.owner,
            queues=self.queues,
            limit=room,
            lease_ttl=self.lease_ttl,
            fair_share=self.fair_share,
        )
        self.fair_share.note_claimed(len(jobs))
        durable.preload(self.dialect, jobs)  # resumed jobs' records: one read for all
        if self.tally is not None:
            self.tally.claimed(jobs)
        now = time.monotonic()
        rated = self.fair_share.rated_ids
        start_by = self.fair_share.counted_at + START_WITHIN
        for job in jobs:
            lease = leases.Lease(job.id, self.owner, job.attempts)
            flight = InFlight(job=job, lease=lease, claimed=now, lease_ttl=self.lease_ttl)
            if job.id in rated:
                flight.start_by = start_by
                flight.rated_units = self.fair_share.rated_units.get(job.id)
                flight.counted_at = self.fair_share.counted_db_at
            flight.renewer = self.renewer
            self.flights.add(flight)
            self.executor.submit(flight)
        self.claimed += len(jobs)
        return len(jobs)

    # -- attempts handed back unstarted (no connection, or too late for their rate) ----------

    def hand_back(
        self, flight: InFlight, exc: BaseException | None, *, closed: bool = False
    ) -> None:
        """Take back an attempt that never started (any thread): for want of a connection
        (`exc`), or (None) too late for the rate its start was counted against; or
        (`closed`) whose handler met a connection the server had closed before it touched
        it."""
        if exc is None:
            late = time.monotonic() - (flight.start_by or 0.0) + START_WITHIN
            logger.warning(
                "Job id=%s would have started %.3fs after its start was counted against a "
                "rate (the most is %ss): handed back without charging an attempt",
                flight.job.pk, late, START_WITHIN,
            )  # fmt: skip
        with self._handed_back_lock:
            self._handed_back.append((flight, exc, closed))
        wake.wake_up()

    def paused(self) -> bool:
        """Whether claims are paused because handler threads could not connect."""
        return time.monotonic() < self._paused_until

    def release_handed_back(self) -> None:
        """Release the handed-back attempts uncharged (this connection works), and pause
        claims if a handler thread could not connect.

        The heartbeat keeps their leases until then; a database error leaves them for the
        next step.
        """
        with self._handed_back_lock:
            taken = list(self._handed_back)
        if not taken:
            return
        leases.release(self.dialect, [flight.lease for flight, _, _ in taken])
        with self._handed_back_lock:
            del self._handed_back[: len(taken)]
        for flight, _, _ in taken:
            self.flights.remove(flight)
            flight.recorded = True
        # The units the late ones' claims counted, never used: back to their windows.
        window.give_back(
            self.dialect,
            [
                (f.rated_units, f.counted_at, f.job.type)
                for f, exc, _ in taken
                if exc is None and f.rated_units and f.counted_at is not None
            ],
        )
        closed = [(f, exc) for f, exc, was_closed in taken if was_closed]
        if closed:
            # The server is (most likely) back: the threads reconnected, no pause is needed.
            logger.warning(
                "%s job(s) met a database connection the server had closed (%s), before "
                "touching the database: handed back without charging an attempt (%s)",
                len(closed), closed[-1][1], ", ".join(str(f.job.pk) for f, _ in closed),
            )  # fmt: skip
        # Late for their rate (no error), or their connection closed: the connections are
        # not to blame, no pause.
        refused = [(f, exc) for f, exc, was_closed in taken if exc is not None and not was_closed]
        if not refused:
            return
        failures = max(1, self.executor.connect_failures)
        pause = min(NO_CONNECTION_PAUSE * 2 ** (failures - 1), NO_CONNECTION_PAUSE_MAX)
        self._paused_until = time.monotonic() + pause
        logger.warning(
            "A handler thread could not connect to the database (%s): handed %s job(s) back "
            "without charging an attempt (%s); claiming again in %.1fs",
            refused[-1][1], len(refused), ", ".join(str(f.job.pk) for f, _ in refused), pause,
        )  # fmt: skip

    def run(self, *, burst: bool, max_jobs: int | None, pending: Callable[[], bool]) -> None:
        """Loop until stopped, or (burst) nothing is left to do, or max_jobs are done.

        A burst worker exits only when `pending()` found nothing due or reclaimable, the claim
        after it got nothing, and nothing was or is in flight.
        """
        while not self.stopping:
            wake.clear()
            # Taken before the claim: a job recorded during it may have held a limit's slot.
            held = len(self.flights)
            try:
                # Read before the claim, never after: a promotion or reclaim committed after
                # this read is seen by the claim.
                waiting = burst and not held and pending()
                claimed = self.step(max_jobs)
                self._db_backoff = 0.0
            except (DatabaseError, InterfaceError) as exc:
                if not self._set_aside_bad_rows(exc):
                    self._database_trouble(exc)
                continue
            except Exception as exc:  # one bad row or hook never kills the worker
                if not self._set_aside_bad_rows(exc):
                    logger.exception("Unexpected error in the dispatcher")
                    self._database_trouble(exc)
                continue
            if self.stopping:
                break
            if max_jobs is not None and self.claimed >= max_jobs and not len(self.flights):
                break
            if (
                burst
                and not waiting
                and not claimed
                and not held
                and not len(self.flights)
                and not self.paused()  # jobs were handed back: they are ready again
            ):
                break
            if claimed:
                self._idle_wait = FIRST_IDLE_POLL
                if self.wants_work(self.executor.load):
                    continue  # there may be more ready work: claim again at once
            wake.wait(self._wait_time(claimed))

    def _wait_time(self, claimed: int) -> float:
        if claimed or self.executor.load or self.held_back:
            # Woken by the executor when a thread is free, or by the completer (held back).
            wait = self.poll_interval
        else:
            wait = min(self._idle_wait, self.poll_interval)
            self._idle_wait = min(self._idle_wait * 2, self.poll_interval)
        wait *= random.uniform(0.8, 1.2)  # jitter spreads idle workers
        now = time.monotonic()
        retry_at = self.fair_share.retry_at()
        if retry_at is not None:  # a rate limit held work back: look again when it has room
            wait = min(wait, max(0.0, retry_at - now))
        deadlines = [f.deadline for f in self.flights.snapshot() if f.deadline is not None]
        if deadlines:
            wait = min(wait, max(0.0, min(deadlines) - now))
        return wait

    def reap(self) -> None:
        """Time out the attempts past their deadline: fail them, and abandon their threads."""
        now = time.monotonic()
        for flight in self.flights.snapshot():
            if flight.deadline is not None and now >= flight.deadline and flight.settle():
                exc = JobTimeout(
                    f"job ran longer than its timeout of {flight.job.timeout}s; the attempt "
                    "was failed and its thread abandoned"
                )
                self.submit_outcome(Outcome(flight, error=exc, duration=flight.duration()))
                self.executor.abandon(flight)

    def _set_aside_bad_rows(self, exc: Exception) -> bool:
        """After a failed claim: whether rows that no claim can read or start were to blame
        (then they were set aside `dead`, and the claim goes on at once without a back-off).

        Lock contention is the database's (retried as such); so is any error the rows read
        one at a time do not meet again.
        """
        if self.dialect.is_transient(exc) or not quarantine.usable(self.dialect):
            return False
        try:
            found = leases.set_aside_unreadable(
                self.dialect, queues=self.queues, fair_share=self.fair_share
            )
        except Exception:  # the database's trouble after all: back off as for any
            return False
        if found:
            logger.warning(
                "A claim failed (%s): set %s job(s) aside whose rows no claim can start: %s",
                log_text(exc), len(found), ", ".join(map(str, found)),
            )  # fmt: skip
        return bool(found)

    def _database_trouble(self, exc: Exception) -> None:
        connection_health.note(exc, self.dialect)
        self._db_backoff = min(max(self._db_backoff * 2, 0.5), 30.0)
        logger.warning(
            "Database error in the worker loop (%s); retrying in %.1fs", exc, self._db_backoff
        )
        connections[self.dialect.using].close()
        deadline = time.monotonic() + self._db_backoff
        while not self.stopping and time.monotonic() < deadline:
            self.reap()
            wake.wait(min(0.5, deadline - time.monotonic()))

    def stop(self) -> None:
        self.stopping = True
        wake.wake_up()
