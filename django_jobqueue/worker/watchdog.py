"""The watchdog: kills a worker process that has stopped running Python code, before its
leases can run out, and reclaims its jobs at once.

A handler stuck in C code with the GIL held (a catastrophic regular expression, say) stops
every thread of its process, the heartbeat and the job timeouts included; no thread can
preempt it. The watchdog is a small process of its own (its own GIL), a child of the worker
forked before the worker starts any thread or opens any connection: it inherits the loaded
Django and nothing that another thread could hold. The worker shares two timestamps with it: a
ticker thread writes the time every TICK seconds (it runs only while the interpreter runs
bytecode), and the heartbeat writes the start time of each successful write of the worker's
row. The worker's row, which protects its leases, expires no sooner than a lease TTL after
that start. When the worker has been silent for `quiet` seconds and that deadline is less
than `quiet` seconds away, the watchdog SIGKILLs it, waits until it is gone, and reclaims its
leases: each job is charged the attempt it was in, so a job that freezes every worker ends
`dead` after `max_attempts`. The frozen process is dead before any other worker may take
its jobs.

A watchdog that outlives its worker (killed by SIGKILL or the OOM killer, crashed) reclaims
its jobs at once too: it sees its parent change, which happens only once every thread of the
worker has ended, so no job of it can still be running. They run again within seconds, not a
lease TTL later.

A process stopped by a signal (SIGSTOP, a debugger) is not frozen: the watchdog leaves it.
While the heartbeat fails (the database is down), the ticker alone keeps the worker alive.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

logger = logging.getLogger("django_jobqueue.watchdog")

TICK = 0.1  # seconds between the ticker's writes, and between the watchdog's looks
_TICKED, _BEAT, _DONE = range(3)  # slots of the shared array
# Seconds the watchdog waits for a killed worker to be gone before it gives up.
DEATH_TIMEOUT = 60.0


def quiet_for(lease_ttl: float) -> float:
    """Seconds of silence (and of margin before the row's expiry) that get a worker killed."""
    return max(0.5, lease_ttl / 4)


class Guard:
    """The worker's side: the shared timestamps, the ticker thread, the watchdog process."""

    def __init__(self, *, worker_id: str, lease_ttl: float) -> None:
        # A fork, not a new interpreter: a new one would set Django up again (as long again as
        # the worker's own start) and bring multiprocessing's resource tracker, a third process.
        # start() forks before any thread or connection of the worker exists.
        ctx = multiprocessing.get_context("fork")
        self.shared: Any = ctx.RawArray("d", 3)
        self.shared[_TICKED] = time.monotonic()
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick, name="jobqueue-ticker", daemon=True)
        self.process = ctx.Process(
            target=watch,
            args=(self.shared, os.getpid(), worker_id, lease_ttl),
            name="jobqueue-watchdog",
            daemon=True,
        )

    def start(self) -> None:
        """Fork the watchdog, then start the ticker; call before the worker starts any thread.

        The connections opened so far (the system checks') are closed first: a forked child
        holding the same socket could end the worker's session by closing it.
        """
        from django.db import connections

        connections.close_all()
        self.process.start()
        self._ticker.start()

    def beaten(self, started: float) -> None:
        """Note a successful heartbeat that began at `started` (monotonic)."""
        self.shared[_BEAT] = started

    def stop(self) -> None:
        """End the watchdog (the worker is exiting)."""
        # At once: the worker has released its jobs, and must not outlive that (its handler
        # threads would run on) while the watchdog takes its time to notice.
        self.shared[_DONE] = 1.0
        self._stop.set()
        self.process.kill()
        self.process.join(5.0)

    def _tick(self) -> None:
        # Needs the GIL for each write: when a handler holds it, the ticks stop.
        while not self._stop.wait(TICK):
            self.shared[_TICKED] = time.monotonic()
            if self.process.exitcode is not None and not self.shared[_DONE]:
                logger.error(
                    "The watchdog exited (code %s): this worker is no longer guarded against "
                    "a handler that freezes it",
                    self.process.exitcode,
                )
                return


def watch(shared: Any, pid: int, worker_id: str, lease_ttl: float) -> None:
    """The watchdog process: watch worker `pid` until it exits; kill it if it freezes."""
    # A terminal's Ctrl-C, or a stop sent to the whole group, is for the worker: the watchdog
    # guards its drain too, and leaves when it is gone.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda signum, frame: _leave_if_done(shared, pid))
    _name_process("jobqueue-watch")
    # Imported now, not after a kill: what follows the kill races the leases' expiry. (A fork
    # of the worker has them already; this costs nothing then.)
    import django_jobqueue.dialects
    import django_jobqueue.worker.naming
    import django_jobqueue.worker.reclaimer  # noqa: F401

    quiet = quiet_for(lease_ttl)
    resumed = 0.0  # when the worker was last seen stopped by a signal
    while os.getppid() == pid and not shared[_DONE]:
        time.sleep(TICK)
        now = time.monotonic()
        silent = now - max(shared[_TICKED], resumed)
        beat = shared[_BEAT]
        if not beat or silent < quiet or now < beat + lease_ttl - quiet:
            continue
        if _stopped(pid):
            resumed = now
            continue
        if os.getppid() != pid or shared[_DONE]:
            break
        _kill(pid, worker_id, silent, beat + lease_ttl - now, lease_ttl)
        return
    if os.getppid() != pid and not shared[_DONE]:
        # The worker is gone without stopping (SIGKILL, the OOM killer, a crash): this process
        # was re-parented only once every thread of it had ended, so its jobs may run
        # elsewhere now, not a lease TTL later.
        logger.error("Worker %s (pid %s) is gone without stopping: reclaiming its jobs at once",
                     worker_id, pid)  # fmt: skip
        _reclaim(worker_id, lease_ttl, gone=True)


def _name_process(name: str) -> None:
    """Show `name` as this process's command name in ps and top (Linux; elsewhere nothing)."""
    with contextlib.suppress(OSError):
        Path("/proc/self/comm").write_text(name[:15])


def _leave_if_done(shared: Any, pid: int) -> None:
    if shared[_DONE] or os.getppid() != pid:
        sys.exit(0)


def _stopped(pid: int) -> bool:
    """Whether `pid` is stopped by a signal or a tracer (Linux; elsewhere: never)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")


def _kill(pid: int, worker_id: str, silent: float, left: float, lease_ttl: float) -> None:
    os.kill(pid, signal.SIGKILL)
    # Orphans are re-parented only once every thread of the process is gone: from then on
    # nothing of the worker runs, and its jobs may run elsewhere.
    deadline = time.monotonic() + DEATH_TIMEOUT
    while os.getppid() == pid:
        if time.monotonic() > deadline:
            logger.error("Worker pid %s is still not gone; its leases will expire", pid)
            return
        time.sleep(0.01)
    logger.error(
        "Worker %s (pid %s) ran no Python code for %.1fs (a handler holding the GIL?): "
        "killed it %.1fs before its row could expire",
        worker_id, pid, silent, left,
    )  # fmt: skip
    _reclaim(worker_id, lease_ttl, gone=False)


def _reclaim(worker_id: str, lease_ttl: float, *, gone: bool) -> None:
    """Reclaim at once the leases of worker `worker_id`, whose process is gone: killed here,
    or (`gone`) dead on its own."""
    from django.db import DatabaseError, InterfaceError, connections

    from django_jobqueue import conf as conf_module
    from django_jobqueue.dialects import get_dialect
    from django_jobqueue.worker import naming
    from django_jobqueue.worker.reclaimer import DIED_REASON, KILLED_REASON, reclaim_dead_worker

    naming.install(worker_id, role="watchdog")  # `jobqueue watchdog <id>` in pg_stat_activity
    conf = conf_module.get()
    dialect = get_dialect(conf.database)
    try:
        dialect.bound_waits(conf.lock_timeout, lease_ttl)
        moved = reclaim_dead_worker(dialect, worker_id, batch=conf.reclaim_batch,
                                    reason=DIED_REASON if gone else KILLED_REASON)  # fmt: skip
    except (DatabaseError, InterfaceError) as exc:
        logger.error("Could not reclaim the jobs of worker %s (%s); its leases will expire",
                     worker_id, exc)  # fmt: skip
    else:
        what = "dead" if gone else "killed"
        logger.warning("Reclaimed %s job(s) of %s worker %s", len(moved), what, worker_id)
    finally:
        connections.close_all()
