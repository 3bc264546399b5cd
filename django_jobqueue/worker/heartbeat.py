"""The heartbeat: the worker's liveness, on a thread and a connection of its own.

Every HEARTBEAT_INTERVAL it writes the worker's own row (the time, `expires_at` = now + the
lease TTL, and the ids of the jobs it holds), then pushes back the deadline of each lease it
holds. The row is what other workers trust: they reclaim a lease only from a worker whose row
has expired or no longer lists the job (see `reclaimer`). The lease rows are renewed too, with
SKIP LOCKED, so that a row an application holds locked never stalls the others; if one is
skipped for minutes, its lease runs out but the worker's row still protects it.

Nothing the dispatcher, a handler or the completer does can delay it: they run on other
threads with other connections. Its own waits are bounded (lock timeout, SQLite busy
timeout); a beat that fails is retried soon after.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable

from .. import registry, telemetry, versions
from ..dialects import Dialect
from ..dialects.base import seconds
from ..engine.leases import Lease, renew_leases
from ..models import Worker as WorkerRow
from ..models.functions import DbNow
from . import processes
from .duty import Duty
from .flights import Flights

logger = logging.getLogger(__name__)


class Heartbeat(Duty):
    """Keeps this worker's row and leases fresh; knows how long it has been healthy."""

    retry_after = 0.1
    max_backoff = 1.0

    def __init__(
        self,
        dialect: Dialect,
        *,
        worker_id: str,
        flights: Flights,
        interval: float,
        lease_ttl: float,
        lock_timeout: float,
        queues: list[str],
        concurrency: int,
        on_beat: Callable[[float], None] | None = None,
    ) -> None:
        # A beat waits at most half an interval for a lock: the next one is never late.
        super().__init__(dialect, interval=interval, lock_timeout=min(lock_timeout, interval / 2))
        self.worker_id = worker_id
        self.flights = flights
        self.lease_ttl = lease_ttl
        self.queues = queues
        self.concurrency = concurrency
        # Called with the monotonic time at which each successful write of the row began:
        # the row expires no sooner than a lease TTL after it (the watchdog's deadline).
        self.on_beat = on_beat
        self._last_ok: float | None = None
        self._healthy_since: float | None = None

    def tick(self) -> float | None:
        self.beat()
        renewed = 0
        leases = self.flights.leases()
        if leases:
            renewed = renew_leases(self.dialect, leases, self.lease_ttl)
            if renewed < len(leases):
                logger.debug("Renewed %s of %s lease rows", renewed, len(leases))
        return None

    def beat(self) -> None:
        """Write the worker's row (registering it if it is missing); note the success."""
        started = time.monotonic()
        job_ids = sorted(lease.job_id for lease in self.flights.leases())
        # A row marked gone (judged dead while this process could not beat) is not revived:
        # `register` replaces it with a new one.
        rows = WorkerRow.objects.using(self.dialect.using).live().filter(pk=self.worker_id)
        values = {
            "heartbeat_at": DbNow(),
            "expires_at": DbNow() + seconds(self.lease_ttl),
            "job_ids": job_ids,
        }
        if not self.dialect.run_in_transaction(lambda: rows.update(**values), tries=1):
            self.register(job_ids)
        now = time.monotonic()
        # A failed beat (on_error) ends the healthy period even when this success follows
        # soon after: the period starts again here, or the reclaimer would never judge again.
        if (
            self._healthy_since is None
            or self._last_ok is None
            or now - self._last_ok > self._max_gap()
        ):
            self._healthy_since = now
        self._last_ok = now
        if self.on_beat is not None:
            self.on_beat(started)

    def register(self, job_ids: list[int] | None = None) -> None:
        """Create (or refresh) the worker's row."""

        def upsert() -> None:
            # In a write transaction of the dialect's: update_or_create reads, then writes,
            # which a DEFERRED SQLite transaction cannot do while another worker writes.
            common = {
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "process_key": processes.identity(),
                "queues": self.queues,
                "concurrency": self.concurrency,
                "lease_ttl": self.lease_ttl,
                "heartbeat_at": DbNow(),
                "expires_at": DbNow() + seconds(self.lease_ttl),
                "job_ids": job_ids or [],
                "handlers": list(registry.allowlist()),
                "handler_versions": versions.worker_row(registry.served()),
                "metrics": telemetry.active is not None and telemetry.active.recording_metrics,
            }
            rows = WorkerRow.objects.using(self.dialect.using)
            # A gone row of the same id (a worker id given again) is an earlier process's.
            rows.gone().filter(pk=self.worker_id).delete()
            rows.update_or_create(
                pk=self.worker_id,
                defaults=common,
                create_defaults={**common, "started_at": DbNow()},
            )

        started = time.monotonic()
        self.dialect.run_in_transaction(upsert)
        if self.on_beat is not None:
            self.on_beat(started)

    def unregister(self) -> None:
        """Mark the worker's row gone (clean exit): expired, holding nothing, kept for a while."""
        rows = WorkerRow.objects.using(self.dialect.using).live().filter(pk=self.worker_id)
        rows.update(gone_at=DbNow(), expires_at=DbNow(), job_ids=[])

    def on_error(self, exc: BaseException) -> None:
        self._healthy_since = None

    def _max_gap(self) -> float:
        return 2 * self.interval + self.lock_timeout

    def healthy_for(self) -> float:
        """Seconds this worker's beats have been succeeding without a gap (0 if they fail).

        A worker that could not write its own row for a while (the database down or locked)
        must not judge others dead for failing to write theirs: the reclaimer waits until this
        is at least the owner's lease TTL.
        """
        now = time.monotonic()
        if (
            self._healthy_since is None
            or self._last_ok is None
            or now - self._last_ok > self._max_gap()
        ):
            return 0.0
        return now - self._healthy_since

    def renewer(self, lease: Lease) -> Callable[[], bool]:
        """A callable for JobContext.renew_lease(): renew `lease` now, in the caller's thread."""

        def renew() -> bool:
            return renew_leases(self.dialect, [lease], self.lease_ttl, check=True) == 1

        return renew
