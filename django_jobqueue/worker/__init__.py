"""A worker process: starts, wires and stops its duties.

- the dispatcher (`dispatcher`, on the calling thread): claims ready jobs, times them out;
- the executor (`executor`): handler threads;
- the completer (`completer`): records outcomes in batches;
- the heartbeat (`heartbeat`): the worker's liveness and its leases;
- the promoter (`promoter`): scheduled jobs become ready when due;
- the reclaimer (`reclaimer`): leases of workers that are gone;
- the closer (`closer`): containers left open past OPEN_CONTAINER_TIMEOUT;
- with --burst, `burst`: what is left to do before the worker exits;
- the schedule runner (`schedule_runner`): enqueues due slots of JOBQUEUE["SCHEDULES"] and of
  the schedules stored as rows, which it re-reads every few seconds;
- the pruner (`pruner`, with JOBQUEUE["RETENTION"]): deletes old finished jobs;
- the listener (`listener`, PostgreSQL): push wake-up;
- the maintainer (`maintainer`, PostgreSQL): VACUUM and ANALYZE where autovacuum lags;
- the recorder (`recorder`): the per-minute figures.

The heartbeat, the completer, the listener and the maintainer run on threads of their own,
each with its own database connection; the promoter, reclaimer, recorder, schedule runner,
closer and pruner take turns on the housekeeper's (`housekeeper`), and the dispatcher runs on
the calling thread. A worker holds those connections and one per busy handler thread
(docs: howto/scale-out.md, "Connections").
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import signal
import socket
import threading
import time
from collections.abc import Callable
from types import FrameType

from django.db import DatabaseError, InterfaceError

from .. import conf as conf_module
from .. import metrics, schedules, telemetry
from ..dialects import get_dialect
from ..engine import attempts, leases, wake
from ..engine.attempts import InFlight
from ..engine.fair_selection import FairShare
from ..validation import finite
from . import connection_pool, naming
from .burst import BurstCheck
from .closer import Closer
from .completer import Completer
from .dispatcher import Dispatcher
from .duty import Duty
from .executor import Executor
from .flights import Flights
from .gauges import Gauges
from .heartbeat import Heartbeat
from .housekeeper import Housekeeper
from .listener import WakeListener
from .maintainer import INTERVAL as MAINTENANCE_INTERVAL
from .maintainer import Maintainer
from .promoter import Promoter
from .pruner import Pruner
from .reclaimer import Reclaimer
from .recorder import Recorder
from .schedule_runner import ScheduleRunner
from .sync_calls import SyncCallThreads

logger = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_TOO_MANY_HUNG = 3  # too many timed-out threads would not stop: restart the process

__all__ = ["EXIT_OK", "EXIT_TOO_MANY_HUNG", "JobWorker", "WorkerOptions", "default_worker_id"]


@dataclasses.dataclass
class WorkerOptions:
    """How one worker process runs; unset values come from settings.JOBQUEUE."""

    concurrency: int = 1
    queues: list[str] = dataclasses.field(default_factory=list)
    poll_interval: float | None = None
    lease_ttl: float | None = None
    heartbeat_interval: float | None = None
    shutdown_timeout: float | None = None
    burst: bool = False
    max_jobs: int | None = None
    worker_id: str | None = None
    prefetch: int | None = None


# Seconds a shutdown waits, past its deadline, for threads whose handler has returned to hand
# over their outcome.
RETURNED_GRACE = 2.0


def _check_options(opts: WorkerOptions) -> None:
    """Raise ValueError for options no worker can run with (the command reports it)."""
    if opts.concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    for name in ("poll_interval", "lease_ttl", "heartbeat_interval"):
        value = getattr(opts, name)
        if value is not None and not (finite(value) and value > 0):
            raise ValueError(f"{name} must be a finite positive number, not {value!r}")
    if opts.shutdown_timeout is not None and not (
        finite(opts.shutdown_timeout) and opts.shutdown_timeout >= 0
    ):
        raise ValueError(
            f"shutdown_timeout must be a finite number >= 0, not {opts.shutdown_timeout!r}"
        )
    if opts.worker_id is not None and not 1 <= len(opts.worker_id) <= 255:
        raise ValueError("worker id must be 1 to 255 characters (its column's size)")
    for queue in opts.queues:
        if not 1 <= len(queue) <= 100:
            raise ValueError(f"queue names are 1 to 100 characters, not {queue!r}")


def default_worker_id() -> str:
    """Return host:pid:random, unique per process."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class JobWorker:
    """One worker process; `run()` returns the exit code."""

    def __init__(self, options: WorkerOptions | None = None) -> None:
        self.conf = conf = conf_module.get()
        opts = options or WorkerOptions()
        _check_options(opts)
        self.concurrency = opts.concurrency
        self.queues = list(opts.queues)
        self.poll_interval = opts.poll_interval or conf.poll_interval
        self.lease_ttl = opts.lease_ttl or conf.lease_ttl
        self.heartbeat_interval = opts.heartbeat_interval or conf.heartbeat_interval
        if self.heartbeat_interval * 2 > self.lease_ttl:
            raise ValueError("heartbeat interval must be at most half the lease TTL")
        self.shutdown_timeout = (
            conf.shutdown_timeout if opts.shutdown_timeout is None else opts.shutdown_timeout
        )
        self.prefetch = conf.prefetch if opts.prefetch is None else opts.prefetch
        if self.prefetch < 0:
            raise ValueError("prefetch must not be negative")
        self.burst = opts.burst
        self.max_jobs = opts.max_jobs
        self.worker_id = opts.worker_id or default_worker_id()
        self.dialect = get_dialect(conf.database)
        self.fair_share = FairShare(conf)
        self.schedules = schedules.configured()  # ImproperlyConfigured before any start
        self.flights = Flights()
        self.exit_code = EXIT_OK
        self._signals = 0
        self._stop_requested = False
        self.dispatcher: Dispatcher | None = None
        # Told the start time of each successful heartbeat (the command's watchdog listens).
        self.on_beat: Callable[[float], None] | None = None

    @property
    def claimed(self) -> int:
        """Jobs this worker has claimed so far."""
        return self.dispatcher.claimed if self.dispatcher else 0

    # -- lifecycle ---------------------------------------------------------------------------

    def run(self, *, install_signals: bool = True) -> int:
        """Run until stopped (signal, --burst with nothing to do, --max-jobs); return exit code."""
        unname = naming.install(self.worker_id)
        connection_pool.outside_pool(self.dialect.using)  # the dispatcher's, on this thread
        try:
            # This thread's connection may be open already: name it as a new one would be.
            if self.dialect.connection.connection is not None:
                self.dialect.name_session(
                    naming.label(threading.current_thread().name, self.worker_id)
                )
            return self._run(install_signals=install_signals)
        finally:
            unname()

    def _run(self, *, install_signals: bool) -> int:
        conf, dialect = self.conf, self.dialect
        dialect.check_server()
        if install_signals:
            self._install_signals()
        logger.info(
            "Worker %s starting: database=%s (%s), claim=%s, queues=%s, concurrency=%s",
            self.worker_id,
            dialect.using,
            dialect.describe(),
            dialect.claim_strategy,
            ",".join(self.queues) or "all",
            self.concurrency,
        )
        lock_timeout = conf.lock_timeout
        heartbeat = Heartbeat(
            dialect,
            worker_id=self.worker_id,
            flights=self.flights,
            interval=self.heartbeat_interval,
            lease_ttl=self.lease_ttl,
            lock_timeout=lock_timeout,
            queues=self.queues,
            concurrency=self.concurrency,
            on_beat=self.on_beat,
        )
        heartbeat.register()
        self.fair_share.ensure_limit_rows(dialect.using)
        completer = Completer(
            dialect,
            conf=conf,
            owner=self.worker_id,
            flights=self.flights,
            lock_timeout=lock_timeout,
            on_empty=wake.wake_up,  # --burst and --max-jobs wait for this
        )
        executor = Executor(
            lambda flight: attempts.run(dialect, conf, flight),
            self.concurrency,
            on_outcome=completer.submit,
            on_idle=self._on_idle,
            alias=dialect.using,
            on_no_connection=self._hand_back,
            on_late=lambda flight: self._hand_back(flight, None),
            start_async=lambda flight: attempts.start_async(dialect, conf, flight),
            is_async=lambda flight: attempts.is_async(flight.job),
            sync_calls=SyncCallThreads(min(self.concurrency, conf.sync_call_threads)),
            return_after_queries=conf.pool_return == "query",
        )
        dispatcher = self.dispatcher = Dispatcher(
            dialect,
            owner=self.worker_id,
            queues=self.queues,
            concurrency=self.concurrency,
            prefetch=self.prefetch,
            lease_ttl=self.lease_ttl,
            lock_timeout=lock_timeout,
            poll_interval=self.poll_interval,
            max_abandoned_threads=conf.max_abandoned_threads,
            fair_share=self.fair_share,
            flights=self.flights,
            executor=executor,
            submit_outcome=completer.submit,
            renewer=heartbeat.renewer,
            unrecorded=completer.backlog,
        )
        completer.on_recorded = dispatcher.recorded  # back-pressure: claim again once caught up
        if self._stop_requested:
            dispatcher.stop()
        promoter = Promoter(
            dialect,
            interval=min(self.poll_interval, 1.0),
            lock_timeout=lock_timeout,
            batch=conf.reclaim_batch,
        )
        reclaimer = Reclaimer(
            dialect,
            interval=conf.reclaim_interval,
            lock_timeout=lock_timeout,
            batch=conf.reclaim_batch,
            lease_ttl=self.lease_ttl,
            healthy_for=heartbeat.healthy_for,
            worker_id=self.worker_id,
        )
        completer.on_suspended = promoter.wake  # a job suspended until soon: promote it in time
        burst = BurstCheck(
            dialect,
            queues=self.queues,
            batch=conf.reclaim_batch,
            promoter=promoter,
            reclaimer=reclaimer,
        )
        if self.burst:
            reclaimer.on_reclaimed = burst.note_reclaimed
        tally = metrics.Tally()
        dispatcher.tally = completer.tally = tally
        recorder = Recorder(
            dialect, worker_id=self.worker_id, tally=tally, lock_timeout=lock_timeout
        )
        house: list[Duty] = [promoter, reclaimer, recorder]
        # Always: a schedule stored as a row may be added while it runs.
        house.append(
            ScheduleRunner(
                dialect,
                schedules=self.schedules,
                clock=schedules.clock(dialect),
                # A test clock may run faster than time: look at it every poll.
                interval=self.poll_interval if conf.schedule_clock else 60.0,
                lock_timeout=lock_timeout,
            )
        )
        if conf.open_container_timeout is not None:
            house.append(
                Closer(
                    dialect,
                    timeout=conf.open_container_timeout,
                    lock_timeout=lock_timeout,
                    batch=conf.reclaim_batch,
                )
            )
        if ages := conf.retention_ages():
            house.append(Pruner(dialect, ages=ages, lock_timeout=lock_timeout))
        hooks = telemetry.active
        if hooks is not None and hooks.recording_metrics:
            hooks.watch_leases(self.worker_id, self.flights.__len__)
            house.append(
                Gauges(
                    dialect,
                    worker_id=self.worker_id,
                    interval=hooks.gauge_interval,
                    lock_timeout=lock_timeout,
                )
            )
        housekeeper = Housekeeper(dialect, house, lock_timeout=lock_timeout)
        duties: list[Duty] = [heartbeat, completer, housekeeper]
        if conf.maintenance and dialect.maintains_tables:
            duties.append(
                Maintainer(dialect, interval=MAINTENANCE_INTERVAL, lock_timeout=lock_timeout)
            )
        if dialect.supports_listen_notify:
            # Its own alias may go straight to the server: a LISTEN does not survive a
            # transaction-mode pooler, which everything else may go through.
            listen = get_dialect(conf.listen_database or conf.database)
            duties.append(
                WakeListener(
                    listen, queues=self.queues, on_notify=wake.wake_up, lock_timeout=lock_timeout
                )
            )
        for duty in duties:
            duty.idle_timeout = self.lease_ttl
            duty.start()
        names = [housekeeper.describe() if d is housekeeper else d.duty_name() for d in duties]
        logger.info("Worker %s duties: %s", self.worker_id, ", ".join(names))
        try:
            dispatcher.run(
                burst=self.burst,
                max_jobs=self.max_jobs,
                pending=burst.pending,
            )
            self._drain(dispatcher, executor, completer)
        finally:
            executor.shutdown()
            for duty in duties:
                if duty is not heartbeat and duty is not housekeeper:
                    duty.stop()
            housekeeper.stop_members(keep=(recorder,))
            completer.stop(timeout=5.0)
            # After the completer: its last outcomes count in the figures the recorder writes
            # as its housekeeper stops.
            housekeeper.stop(timeout=recorder.lock_timeout + 5.0)
            # Stopped before the row is deleted: a beat after the delete would register it again.
            heartbeat.stop(timeout=heartbeat.lock_timeout + 5.0)
            if hooks is not None:
                hooks.watch_leases(self.worker_id, None)
            try:
                heartbeat.unregister()
            except (DatabaseError, InterfaceError):
                logger.warning(
                    "Could not mark worker row %s gone; it will be swept", self.worker_id
                )
        if dispatcher.too_many_hung:
            self.exit_code = EXIT_TOO_MANY_HUNG
        logger.info("Worker %s stopped (claimed %s jobs)", self.worker_id, self.claimed)
        return self.exit_code

    def stop(self) -> None:
        """Ask the worker to stop claiming and finish (what the first SIGTERM does)."""
        self._request_stop()
        wake.wake_up()

    def _request_stop(self) -> None:
        # Plain attribute writes, no locks: safe in a signal handler. The flag outlives a
        # signal during start-up (before the dispatcher exists): run() stops the dispatcher
        # it creates after this.
        self._stop_requested = True
        if self.dispatcher is not None:
            self.dispatcher.stopping = True

    def _hand_back(
        self, flight: InFlight, exc: BaseException | None, *, closed: bool = False
    ) -> None:
        # The executor exists before the dispatcher, which releases what is handed back.
        dispatcher = self.dispatcher
        if dispatcher is not None:
            dispatcher.hand_back(flight, exc, closed=closed)

    def _on_idle(self, load: int) -> None:
        # Only when the load falls to the dispatcher's low-water mark: waking it for every
        # finished job would cost more than the claims it leads to.
        dispatcher = self.dispatcher
        if dispatcher is not None and load == dispatcher.low_water():
            wake.wake_up()

    def _install_signals(self) -> None:
        def handle(signum: int, frame: FrameType | None) -> None:
            self._signals += 1
            if self._signals > 1:
                # Second signal: leave now; the leases expire and other workers reclaim them.
                os.write(2, b"jobqueue worker: second signal, exiting at once\n")
                os._exit(128 + signum)
            logger.info("Signal %s: finishing in-flight jobs, then stopping", signum)
            # No wake-up from here. A handler runs in the main thread between two bytecodes,
            # possibly while that thread holds the wake event's lock (inside Event.wait() or
            # clear()): Event.set() would wait for that lock forever. The dispatcher (the main
            # thread) sees the flag when its current wait ends, within its poll interval.
            self._request_stop()

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)

    # -- shutdown ----------------------------------------------------------------------------

    def _drain(self, dispatcher: Dispatcher, executor: Executor, completer: Completer) -> None:
        """Release jobs not started, let running ones finish for up to the shutdown timeout,
        then release the rest; wait for the completer to record what finished."""
        deadline = time.monotonic() + self.shutdown_timeout
        try:
            dispatcher.release_handed_back()
        except (DatabaseError, InterfaceError) as exc:
            logger.warning("Could not release the jobs handed back (%s); their leases will "
                           "expire", exc)  # fmt: skip
        # Claimed ahead (prefetch) but not started: back to ready at once, for other workers.
        self._release([f for f in executor.take_unstarted() if f.settle()])
        while time.monotonic() < deadline and any(not f.settled for f in self.flights.snapshot()):
            dispatcher.reap()
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
        # At the deadline (at once with --shutdown-timeout 0) an attempt whose handler has just
        # returned must not be released before its thread settles it, or a finished job would
        # run again. Such threads settle within moments (they only check the result): wait.
        grace = time.monotonic() + RETURNED_GRACE
        while time.monotonic() < grace and any(
            f.started is not None and not f.in_handler and not f.settled
            for f in self.flights.snapshot()
        ):
            time.sleep(0.005)
        release = [f for f in self.flights.snapshot() if f.settle()]
        completer.flush(max(5.0, deadline - time.monotonic()))
        self._release(release)

    def _release(self, release: list[InFlight]) -> None:
        """Hand unfinished attempts back to `ready` without charging them (shutdown)."""
        if release:
            try:
                released = leases.release(self.dialect, [f.lease for f in release])
            except (DatabaseError, InterfaceError) as exc:
                logger.warning("Could not release %s job(s) (%s); their leases will expire",
                               len(release), exc)  # fmt: skip
            else:
                logger.warning(
                    "Shutdown: released %s unfinished job(s) back to ready: %s",
                    released,
                    ", ".join(str(f.job.pk) for f in release),
                )
            for flight in release:
                self.flights.remove(flight)
                flight.recorded = True
