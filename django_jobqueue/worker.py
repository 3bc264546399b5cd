"""The tick loop: reclaim -> scan -> rank -> lease -> dispatch -> persist."""

from __future__ import annotations

import dataclasses
import logging
import os
import queue as queue_module
import random
import secrets
import signal
import socket
import threading
import time
from types import FrameType

from django.db import DatabaseError, InterfaceError, connections

from . import conf as conf_module
from . import leases, maintenance, wake
from .dialects import get_dialect
from .dialects.functions import DbNow
from .exceptions import JobTimeout
from .execution import InFlight, attempt_deadline, execute, record_failure
from .models import Worker as WorkerRow
from .scheduling import Scheduler

logger = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_TOO_MANY_HUNG = 3  # too many timed-out threads would not stop: restart the process


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


def default_worker_id() -> str:
    """Return host:pid:random, unique per process."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class _Executor:
    """Threads that run handlers; a timed-out thread is abandoned and replaced."""

    def __init__(self, run: object, size: int) -> None:
        self._run = run
        self._queue: queue_module.SimpleQueue[InFlight | None] = queue_module.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self.abandoned: list[threading.Thread] = []
        for _ in range(size):
            self._spawn()

    def _spawn(self) -> None:
        thread = threading.Thread(target=self._loop, name="jobqueue-exec", daemon=True)
        self._threads.append(thread)
        thread.start()

    def _loop(self) -> None:
        try:
            while True:
                flight = self._queue.get()
                if flight is None:
                    return
                try:
                    self._run(flight)  # type: ignore[operator]
                except BaseException:  # a pool thread never dies of one job: nobody would
                    logger.exception("Unexpected error running job id=%s", flight.job.pk)
                if flight.abandoned:
                    return  # replaced while it hung; retire
        finally:
            connections.close_all()

    def submit(self, flight: InFlight) -> None:
        self._queue.put(flight)

    def abandon(self, flight: InFlight) -> None:
        """Give up on the thread running `flight`: interrupt it, and replace it.

        Only a thread still inside the handler is interrupted (and then retires): one whose
        handler has returned meanwhile goes back to the pool as usual. Raising JobTimeout into
        a thread that had moved on would lose the next job it took from the queue.
        """
        thread = next((t for t in self._threads if t.ident == flight.thread_id), None)
        if thread is None or not flight.interrupt():
            return
        self._threads.remove(thread)
        self.abandoned.append(thread)
        self._spawn()

    def hung(self) -> int:
        """Return how many abandoned threads are still alive."""
        self.abandoned = [t for t in self.abandoned if t.is_alive()]
        return len(self.abandoned)

    def shutdown(self) -> None:
        for _ in self._threads:
            self._queue.put(None)


class JobWorker:
    """One worker process's loop; `run()` returns the exit code."""

    def __init__(self, options: WorkerOptions | None = None) -> None:
        self.conf = conf_module.get()
        opts = options or WorkerOptions()
        if opts.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.concurrency = opts.concurrency
        self.queues = list(opts.queues)
        self.poll_interval = opts.poll_interval or self.conf.poll_interval
        self.lease_ttl = opts.lease_ttl or self.conf.lease_ttl
        self.heartbeat_interval = opts.heartbeat_interval or self.conf.heartbeat_interval
        if self.heartbeat_interval * 2 > self.lease_ttl:
            raise ValueError("heartbeat interval must be at most half the lease TTL")
        self.shutdown_timeout = (
            self.conf.shutdown_timeout if opts.shutdown_timeout is None else opts.shutdown_timeout
        )
        self.burst = opts.burst
        self.max_jobs = opts.max_jobs
        self.worker_id = opts.worker_id or default_worker_id()
        self.dialect = get_dialect(self.conf.database)
        self.scheduler = Scheduler(self.conf)
        self.in_flight: dict[int, InFlight] = {}
        self.claimed = 0
        self.stopping = False
        self.exit_code = EXIT_OK
        self._signals = 0
        self._next_heartbeat = 0.0
        self._next_reclaim = 0.0
        self._db_backoff = 0.0

    # -- lifecycle ---------------------------------------------------------------------------

    def run(self, *, install_signals: bool = True) -> int:
        """Run until stopped (signal, --burst with nothing to do, --max-jobs); return exit code."""
        self.dialect.check_server()
        if install_signals:
            self._install_signals()
        logger.info(
            "Worker %s starting: database=%s (%s), claim=%s, queues=%s, concurrency=%s",
            self.worker_id,
            self.dialect.using,
            self.dialect.describe(),
            self.dialect.claim_strategy,
            ",".join(self.queues) or "all",
            self.concurrency,
        )
        self._register()
        self.scheduler.ensure_limit_rows(self.dialect.using)
        self._executor = _Executor(self._execute, self.concurrency)
        try:
            self._loop()
            self._drain()
        finally:
            self._executor.shutdown()
            self._unregister()
        logger.info("Worker %s stopped (claimed %s jobs)", self.worker_id, self.claimed)
        return self.exit_code

    def stop(self) -> None:
        """Ask the loop to stop claiming and finish (what the first SIGTERM does)."""
        self.stopping = True
        wake.wake_up()

    def _install_signals(self) -> None:
        def handle(signum: int, frame: FrameType | None) -> None:
            self._signals += 1
            if self._signals > 1:
                # Second signal: leave now; the leases expire and other workers reclaim them.
                os.write(2, b"jobqueue worker: second signal, exiting at once\n")
                os._exit(128 + signum)
            logger.info("Signal %s: finishing in-flight jobs, then stopping", signum)
            self.stop()

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)

    # -- the loop ----------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self.stopping:
            try:
                claimed = self._tick()
                self._db_backoff = 0.0
            except (DatabaseError, InterfaceError) as exc:
                self._database_trouble(exc)
                continue
            except Exception as exc:  # one bad row or hook never kills the worker
                logger.exception("Unexpected error in the worker loop")
                self._database_trouble(exc)
                continue
            if self.stopping:
                break
            if self.max_jobs is not None and self.claimed >= self.max_jobs and not self.in_flight:
                break
            if self.burst and not claimed and not self.in_flight:
                break
            if claimed and len(self.in_flight) < self.concurrency:
                continue  # there may be more ready work: claim again at once
            wake.wait(self._wait_time())

    def _tick(self) -> int:
        now = time.monotonic()
        self._reap(now)
        if now >= self._next_heartbeat:
            self._heartbeat()
            self._next_heartbeat = now + self.heartbeat_interval
        if now >= self._next_reclaim:
            maintenance.reclaim_expired(
                self.dialect,
                batch=self.conf.reclaim_batch,
                backoff=self.conf.retry_backoff,
                backoff_max=self.conf.retry_backoff_max,
            )
            maintenance.sweep_workers(self.dialect, stale_after=self.lease_ttl * 4)
            self._next_reclaim = now + self.conf.reclaim_interval
        if self._executor.hung() >= self.conf.max_abandoned_threads:
            logger.error(
                "%s timed-out jobs are still stuck in their threads; stopping so the process "
                "can be restarted",
                len(self._executor.abandoned),
            )
            self.exit_code = EXIT_TOO_MANY_HUNG
            self.stop()
            return 0
        free = self.concurrency - len(self.in_flight)
        if self.max_jobs is not None:
            free = min(free, self.max_jobs - self.claimed)
        if free <= 0:
            return 0
        jobs = leases.claim(
            self.dialect,
            owner=self.worker_id,
            queues=self.queues,
            limit=free,
            lease_ttl=self.lease_ttl,
            scheduler=self.scheduler,
        )
        started = time.monotonic()
        for job in jobs:
            lease = leases.Lease(job.pk, self.worker_id, job.attempts)
            flight = InFlight(
                job=job,
                lease=lease,
                started=started,
                deadline=attempt_deadline(job, started),
                lease_ttl=self.lease_ttl,
            )
            self.in_flight[job.pk] = flight
            self._executor.submit(flight)
        self.claimed += len(jobs)
        return len(jobs)

    def _execute(self, flight: InFlight) -> None:
        execute(self.dialect, self.conf, flight)
        wake.wake_up()

    def _reap(self, now: float) -> None:
        """Forget finished attempts; time out the ones past their deadline."""
        for pk, flight in list(self.in_flight.items()):
            if flight.done.is_set():
                del self.in_flight[pk]
            elif flight.deadline is not None and now >= flight.deadline and flight.settle():
                del self.in_flight[pk]
                exc = JobTimeout(
                    f"job ran longer than its timeout of {flight.job.timeout}s; the attempt "
                    "was failed and its thread abandoned"
                )
                try:
                    record_failure(self.dialect, self.conf, flight, exc)
                finally:  # even if recording fails: the lease then expires and is reclaimed
                    self._executor.abandon(flight)

    def _heartbeat(self) -> None:
        renewed = leases.renew(
            self.dialect, [f.lease for f in self.in_flight.values()], self.lease_ttl
        )
        if renewed < len(self.in_flight):
            logger.debug("Renewed %s of %s leases", renewed, len(self.in_flight))
        rows = WorkerRow.objects.using(self.dialect.using).filter(pk=self.worker_id)
        if not rows.update(heartbeat_at=DbNow()):
            self._register()

    def _wait_time(self) -> float:
        wait = self.poll_interval * random.uniform(0.8, 1.2)  # jitter spreads idle workers
        now = time.monotonic()
        wait = min(wait, max(0.0, self._next_heartbeat - now))
        deadlines = [f.deadline for f in self.in_flight.values() if f.deadline is not None]
        if deadlines:
            wait = min(wait, max(0.0, min(deadlines) - now))
        return wait

    def _database_trouble(self, exc: Exception) -> None:
        self._db_backoff = min(max(self._db_backoff * 2, 0.5), 30.0)
        logger.warning(
            "Database error in the worker loop (%s); retrying in %.1fs", exc, self._db_backoff
        )
        connections[self.dialect.using].close()
        deadline = time.monotonic() + self._db_backoff
        while not self.stopping and time.monotonic() < deadline:
            wake.wait(min(0.5, deadline - time.monotonic()))

    # -- shutdown ----------------------------------------------------------------------------

    def _drain(self) -> None:
        """Let in-flight jobs finish for up to the shutdown timeout, then release the rest."""
        deadline = time.monotonic() + self.shutdown_timeout
        while self.in_flight and time.monotonic() < deadline:
            try:
                now = time.monotonic()
                self._reap(now)
                if now >= self._next_heartbeat:
                    self._heartbeat()
                    self._next_heartbeat = now + self.heartbeat_interval
            except (DatabaseError, InterfaceError) as exc:
                self._database_trouble(exc)
            if self.in_flight:
                time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
        left = [f for f in self.in_flight.values() if f.settle()]
        if left:
            released = leases.release(self.dialect, [f.lease for f in left])
            logger.warning(
                "Shutdown timeout: released %s unfinished job(s) back to ready: %s",
                released,
                ", ".join(str(f.job.pk) for f in left),
            )

    def _register(self) -> None:
        # In a write transaction of the dialect's: update_or_create reads, then writes, which a
        # DEFERRED SQLite transaction cannot do while another worker writes ("database is
        # locked" at once, no busy wait).
        self.dialect.run_in_transaction(self._upsert_row)

    def _upsert_row(self) -> None:
        WorkerRow.objects.using(self.dialect.using).update_or_create(
            pk=self.worker_id,
            defaults={
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "queues": self.queues,
                "concurrency": self.concurrency,
                "heartbeat_at": DbNow(),
            },
            create_defaults={
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "queues": self.queues,
                "concurrency": self.concurrency,
                "started_at": DbNow(),
                "heartbeat_at": DbNow(),
            },
        )

    def _unregister(self) -> None:
        try:
            WorkerRow.objects.using(self.dialect.using).filter(pk=self.worker_id).delete()
        except (DatabaseError, InterfaceError):
            logger.warning("Could not remove worker row %s; it will be swept", self.worker_id)
