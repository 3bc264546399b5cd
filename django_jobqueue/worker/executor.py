"""The executor: threads that run handlers; a timed-out thread is abandoned and replaced.

A thread takes a handler slot (`slots`) before it takes an attempt: at most `--concurrency`
handlers run at once, sync and async together, and attempts claimed ahead (prefetch) wait in
the queue, unstarted, for a slot. An async handler's attempt is started by a thread and then
runs as a task on the worker's event loop (`eventloop`), with the thread's slot: the thread
goes back for another slot, and the task's end gives its slot back. Each slot (and its `load`)
is given back exactly once, by whoever ends the attempt: the thread or task that ran it, or
`abandon()`.

An attempt whose start was counted against a rate (`InFlight.start_by`) goes ahead of the
others (a lane of its own, taken first), and starts only until then: later, it is handed back
uncharged (`on_late`), since its rate's window no longer covers it. Its thread does not
connect ahead of it (its handler's first query does, as with a pooled connection): a thread
left idle for IDLE_CLOSE would otherwise spend its start's margin on the connect, and hand
back every rated job it met.

A thread connects to the queue database before it calls a handler: when the server refuses
the connection (max_connections, say), the attempt is handed back uncharged rather than failed
by the handler's first query. Any other error of the connect (a `connection_created` receiver
that raises, say) is logged and the job runs: its handler's first query meets the error again
and fails the attempt as usual, so the thread lives on and the job is never left claimed with
nobody running it. A thread left without work for IDLE_CLOSE seconds closes its
connections, so that an idle worker holds only its duties' connections.

A database restart closes the connections of threads busy or waiting meanwhile: a thread
pings its connections before a job once the worker met database trouble, and an attempt
whose first statement met a connection the server had closed is handed back uncharged
(`connection_health`).
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue as queue_module
import threading
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, InterfaceError, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from ..engine.attempts import InFlight, Outcome
from . import connection_health, connection_pool
from .eventloop import EventLoop
from .slots import Slots

if TYPE_CHECKING:
    from .sync_calls import SyncCallThreads

logger = logging.getLogger(__name__)

# Seconds a handler thread waits for work before it closes its connections. Short jobs keep
# their threads busy well within it, so none of them pays a reconnection per job.
IDLE_CLOSE = 5.0
# Seconds between the tries of a handler thread's connection, before it gives the job back.
CONNECT_RETRIES = (0.1, 0.3)
# Seconds without a tick of the event loop, after an async attempt was timed out, for that
# attempt to count as stuck (a loop that runs ticks every eventloop.TICK).
LOOP_STUCK = 1.0


class _Lane:
    """The mark, in the queue, of an attempt put in the lane (it wakes a waiting thread)."""


LANE = _Lane()


class Executor:
    """`concurrency` threads taking claimed attempts from a queue and running them.

    `load` counts the attempts queued or running here; the dispatcher claims more when it
    drops. `run(flight)` returns the outcome, or None when there is nothing to record.
    """

    def __init__(
        self,
        run: Callable[[InFlight], Outcome | None],
        size: int,
        *,
        on_outcome: Callable[[Outcome], None],
        on_idle: Callable[[int], None],
        alias: str | None = None,
        on_no_connection: Callable[..., None] | None = None,
        on_late: Callable[[InFlight], None] | None = None,
        start_async: Callable[[InFlight], Coroutine[Any, Any, Outcome | None] | None] | None = None,
        is_async: Callable[[InFlight], bool] | None = None,
        sync_calls: SyncCallThreads | None = None,
        return_after_queries: bool = False,
    ) -> None:
        self._run = run
        # Async attempts: begun by `start_async` in a thread, awaited on the event loop, their
        # thread-sensitive calls (the ORM's) on one of `sync_calls`' threads.
        self._start_async = start_async
        self._is_async = is_async
        self.event_loop = EventLoop()
        self._sync_calls = sync_calls
        self._on_loop: dict[InFlight, concurrent.futures.Future[Any] | None] = {}
        self._abandoned_tasks: list[float] = []  # when async attempts were timed out
        self._on_outcome = on_outcome
        self._on_idle = on_idle  # called with the new load after each attempt
        # The queue database, connected to before each handler; a flight whose connection
        # cannot be opened goes to `on_no_connection` (settled), not to the handler, and so
        # does one whose handler met a connection the server had closed (`closed=True`).
        self._alias = alias
        # POOL_RETURN = "query": a pooled connection goes back after each query, not each job.
        self._return_after_queries = return_after_queries
        self._on_no_connection = on_no_connection
        self._on_late = on_late  # a rated attempt past its start_by, settled: hand it back
        self.connect_failures = 0  # attempts handed back in a row for want of a connection
        # (job id, attempt) of the attempts handed back for a closed connection: each once per
        # process, so a handler that idles past the server's idle timeout is charged in time.
        self._spared: set[tuple[int, int]] = set()
        self._queue: queue_module.SimpleQueue[InFlight | _Lane | None] = queue_module.SimpleQueue()
        self._lane: queue_module.SimpleQueue[InFlight] = queue_module.SimpleQueue()  # rated
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.slots = Slots(size)
        self.load = 0
        self.abandoned: list[threading.Thread] = []
        self.ewma_duration: float | None = None  # seconds a handler takes, recent average
        self._aliases = list(connections)
        for _ in range(size):
            self._spawn()

    def _spawn(self) -> None:
        thread = threading.Thread(target=self._loop, name="jobqueue-exec", daemon=True)
        self._threads.append(thread)
        thread.start()

    def _loop(self) -> None:
        # This thread's connection object (Django keeps one per thread and alias, closed or
        # not): looked up once, since the lookup costs more than the rest of a job's overhead.
        conn = connections[self._alias] if self._alias is not None else None
        if conn is not None and self._return_after_queries:
            connection_pool.return_after_queries(conn.alias)  # patches `conn` itself
        # Watches a job's first statement on the queue connection: was it closed before it?
        probe = connection_health.FirstStatement(conn) if conn is not None else None
        if conn is not None and connection_pool.pooled(conn):
            conn = None  # a pooled connection is borrowed by the job's first query, not before
        try:
            while True:
                self._take_slot()
                flight = self._next()
                if flight is None:
                    self.slots.give_back()
                    return
                connection_health.refresh(self._aliases)  # pings only after database trouble
                if self._is_async is not None and self._is_async(flight):
                    if not self._handed_back_late(flight):
                        self._start_on_loop(flight)  # the slot goes with it, to its task
                    continue
                if (
                    conn is not None
                    and conn.connection is None
                    and flight.start_by is None  # see the module's docstring
                    and not self._connect(conn, flight)
                ):
                    self._finished()
                    continue
                if self._handed_back_late(flight):
                    continue
                outcome = None
                if probe is not None:
                    probe.watch()
                try:
                    outcome = self._run(flight)
                except BaseException:  # a pool thread never dies of one job: nobody would
                    logger.exception("Unexpected error running job id=%s", flight.job.pk)
                if probe is not None:
                    probe.detach()
                    if outcome is not None and self._met_closed_connection(outcome, probe):
                        outcome = None  # handed back, uncharged
                try:
                    tidy_connections(self._aliases)
                except Exception:  # nor of tidying up after one (its outcome is pending)
                    logger.exception("Could not tidy the connections of a handler thread")
                if outcome is not None:
                    self._observe(outcome.duration)
                    self._on_outcome(outcome)
                if flight.abandoned:
                    return  # replaced (its slot given back) while it hung; retire
                self._finished()
        finally:
            connections.close_all()

    def _start_on_loop(self, flight: InFlight) -> None:
        """Begin an async attempt here, and run it as a task on the event loop.

        The attempt is registered before it starts: the dispatcher may time it out (abandon
        it) at any point from then on, and a coroutine abandoned before it was submitted is
        closed unstarted, never run late.
        """
        assert self._start_async is not None
        with self._lock:
            self._on_loop[flight] = None
        coro = None
        try:
            coro = self._start_async(flight)
        except BaseException:  # as for a sync job: the thread carries on
            logger.exception("Unexpected error starting job id=%s", flight.job.pk)
        if coro is None:
            self._give_back_loop_slot(flight)
            return
        with self._lock:
            abandoned = flight not in self._on_loop
        if abandoned:  # timed out (its slot given back) before it ran
            coro.close()
            return
        task = self._sync_calls.run(coro) if self._sync_calls is not None else coro
        try:
            future = self.event_loop.submit(task, lambda f: self._ended_on_loop(flight, f))
        except BaseException as exc:  # the loop is stopped (shutdown) or cannot take it
            if task is not coro:
                task.close()
            coro.close()
            self._not_submitted(flight, exc)
            return
        with self._lock:
            if flight in self._on_loop:
                self._on_loop[flight] = future
                return
        future.cancel()  # abandoned while it was being submitted

    def _not_submitted(self, flight: InFlight, exc: BaseException) -> None:
        """An async attempt the loop refused: record it failed, unless settled already."""
        if flight.settle():
            logger.error("Could not run job id=%s on the event loop: %s", flight.job.pk, exc)
            self._on_outcome(Outcome(flight, error=exc, duration=flight.duration()))
        self._give_back_loop_slot(flight)

    def _ended_on_loop(self, flight: InFlight, future: concurrent.futures.Future[Any]) -> None:
        """An async attempt's task ended (on the loop's thread): hand on its outcome."""
        outcome = None
        if not future.cancelled():
            try:
                outcome = future.result()
            except BaseException:
                logger.exception("Unexpected error running job id=%s", flight.job.pk)
        if outcome is not None:
            self._observe(outcome.duration)
            self._on_outcome(outcome)
        self._give_back_loop_slot(flight)

    def _give_back_loop_slot(self, flight: InFlight) -> None:
        """Free an async attempt's slot, unless abandon() freed it already (exactly once)."""
        with self._lock:
            mine = self._on_loop.pop(flight, False) is not False
        if mine:
            self._finished()

    def _take_slot(self) -> None:
        """Wait for a free handler slot; this thread's connections are closed while none comes
        (async jobs may hold every slot for long)."""
        if not self.slots.take(IDLE_CLOSE):
            connections.close_all()  # this thread's only
            self.slots.take()

    def _handed_back_late(self, flight: InFlight) -> bool:
        """Hand back `flight` if it would start past its `start_by`; return whether it did.

        Its start was counted against a rate when it was claimed, and the rate's window holds
        a start for only so long: started later, it could be the rate's N+1st start in some
        window. It goes back to `ready` uncharged, to be claimed (and counted) again.
        """
        start_by = flight.start_by
        if start_by is None or self._on_late is None or time.monotonic() <= start_by:
            return False
        if flight.settle():  # not released by a shutdown meanwhile
            self._on_late(flight)
        self._finished()
        return True

    def _next(self) -> InFlight | None:
        """The next attempt to run, the lane's first; this thread's connections are closed
        while none comes."""
        while True:
            if not self._lane.empty():
                try:
                    return self._lane.get_nowait()
                except queue_module.Empty:  # another thread took it meanwhile
                    pass
            try:
                item = self._queue.get(timeout=IDLE_CLOSE)
            except queue_module.Empty:
                connections.close_all()  # this thread's only
                item = self._queue.get()
            if not isinstance(item, _Lane):
                return item

    @property
    def rated_waiting(self) -> int:
        """How many attempts counted against a rate wait for a slot (in the lane)."""
        return self._lane.qsize()

    def _connect(self, conn: BaseDatabaseWrapper, flight: InFlight) -> bool:
        """Open this thread's queue connection, trying a few times; False: handed back."""
        for delay in (*CONNECT_RETRIES, None):
            try:
                conn.ensure_connection()
            except (DatabaseError, InterfaceError) as exc:
                conn.close()
                if delay is not None:
                    time.sleep(delay)
                    continue
                if flight.settle():  # not released by a shutdown meanwhile
                    self.connect_failures += 1
                    if self._on_no_connection is not None:
                        self._on_no_connection(flight, exc)
                return False
            except Exception:
                # Not the server refusing: retrying or handing back would not help, and the
                # thread must not die with the job claimed. The handler meets it, or not.
                logger.exception("Could not set up the connection of a handler thread")
                return True
            self.connect_failures = 0
            return True
        raise AssertionError("unreachable")

    def _met_closed_connection(
        self, outcome: Outcome, probe: connection_health.FirstStatement
    ) -> bool:
        """Hand back, uncharged, an attempt that met a connection the server had closed
        before the job touched it (once per attempt in this process); reset the connection."""
        flight = outcome.flight
        if outcome.error is None or self._on_no_connection is None:
            return False
        key = (flight.job.pk, flight.lease.attempt)
        try:
            if key in self._spared or not connection_health.spare(probe, outcome.error):
                return False
            probe.reset()
        except Exception:  # judging it must not cost the outcome: record it as it is
            logger.exception("Could not check the connection of job id=%s", flight.job.pk)
            return False
        if len(self._spared) >= 10_000:
            self._spared.clear()
        self._spared.add(key)
        self._on_no_connection(flight, outcome.error, closed=True)
        return True

    def _observe(self, duration: float) -> None:
        ewma = self.ewma_duration
        self.ewma_duration = duration if ewma is None else ewma + 0.1 * (duration - ewma)

    def _finished(self) -> None:
        """An attempt that had a slot is over (or was abandoned, or handed back): free its
        slot, then its place in `load` (the dispatcher claims for the free slot it sees)."""
        self.slots.give_back()
        with self._lock:
            self.load -= 1
            load = self.load
        self._on_idle(load)

    def submit(self, flight: InFlight) -> None:
        with self._lock:
            self.load += 1
        if flight.start_by is None:
            self._queue.put(flight)
        else:
            self._lane.put(flight)
            self._queue.put(LANE)

    def take_unstarted(self) -> list[InFlight]:
        """Remove the attempts no thread has started yet, and return them (shutdown)."""
        taken: list[InFlight] = []
        put_back = 0
        for waiting in (self._lane, self._queue):
            while True:
                try:
                    flight = waiting.get_nowait()
                except queue_module.Empty:
                    break
                if flight is None:
                    put_back += 1
                elif not isinstance(flight, _Lane):
                    taken.append(flight)
        for _ in range(put_back):
            self._queue.put(None)
        with self._lock:
            self.load -= len(taken)
        return taken

    def abandon(self, flight: InFlight) -> None:
        """Give up on the thread running `flight`: interrupt it, and replace it.

        Only a thread still inside the handler is interrupted (and then retires): one whose
        handler has returned meanwhile goes back to the pool as usual. Raising JobTimeout into
        a thread that had moved on would lose the next job it took from the queue.
        """
        with self._lock:
            on_loop = flight in self._on_loop
            future = self._on_loop.pop(flight, None)
        if on_loop:  # a task: cancel it (through asyncio) and give its slot back now
            if future is not None:
                future.cancel()
            with self._lock:
                self._abandoned_tasks.append(time.monotonic())
            self._finished()
            return
        thread = next((t for t in self._threads if t.ident == flight.thread_id), None)
        if thread is None or not flight.interrupt():
            return
        self._threads.remove(thread)
        self.abandoned.append(thread)
        self._spawn()
        self._finished()

    def hung(self) -> int:
        """Return how many abandoned threads are still alive, plus the async attempts timed
        out since the event loop last ran (a coroutine blocks it: each counts as a thread)."""
        self.abandoned = [t for t in self.abandoned if t.is_alive()]
        ticked, now = self.event_loop.ticked, time.monotonic()
        with self._lock:
            # Those the loop ran after (or that never reached a loop) are not stuck in it.
            self._abandoned_tasks = [t for t in self._abandoned_tasks if ticked and t >= ticked]
            tasks = sum(1 for t in self._abandoned_tasks if now - t > LOOP_STUCK)
        return len(self.abandoned) + tasks

    def shutdown(self) -> None:
        for _ in self._threads:
            self._queue.put(None)
        self.event_loop.stop()
        if self._sync_calls is not None:
            self._sync_calls.shutdown()


def tidy_connections(aliases: list[str]) -> None:
    """Drop this thread's connections that a handler left broken (the server went away,
    say), so that the next job on this thread connects afresh instead of failing too; give
    pooled ones back to their pool, checked first if the worker met trouble meanwhile."""
    connection_health.refresh(aliases)
    connection_pool.give_back(aliases)
    for alias in aliases:
        conn = connections[alias]
        if conn.errors_occurred and not conn.in_atomic_block:
            # After a failed connect there is no connection, and Django's MySQL backend pings
            # None in is_usable() (AttributeError): that would kill the thread and leave its
            # job `running` under a live worker for good.
            if conn.connection is None or not conn.is_usable():
                conn.close()
                connection_health.bump()
            conn.errors_occurred = False
