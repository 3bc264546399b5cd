"""The gauges duty: reads the ready backlog per queue for the OpenTelemetry queue gauges.

Runs only when ``JOBQUEUE["OPENTELEMETRY"]`` records metrics. Every GAUGE_INTERVAL seconds
each such worker asks which live worker that records metrics has the smallest id (one read of
the workers' table; a worker's row says whether it records them, `Worker.metrics`); that
worker alone reads the ready jobs per queue and hands the figures to the gauges
(`telemetry.otel`), the others report none. A queue's gauge thus comes from one process, and
the ready rows are read once per interval however many workers run; a worker with metrics
off (or of a release before `Worker.metrics`) is never the one.
"""

from __future__ import annotations

from .. import metrics, telemetry
from ..dialects import Dialect
from ..models import Worker as WorkerRow
from ..models.functions import DbNow
from .duty import Duty


class Gauges(Duty):
    """Read the backlog per queue, in the live worker that records metrics with the smallest
    id only."""

    def __init__(
        self, dialect: Dialect, *, worker_id: str, interval: float, lock_timeout: float
    ) -> None:
        super().__init__(dialect, interval=interval, lock_timeout=lock_timeout)
        self.worker_id = worker_id
        self._seen: set[str] = set()  # queues reported: 0 once they have no ready job

    def tick(self) -> float | None:
        hooks = telemetry.active
        if hooks is None:
            return None
        using = self.dialect.using
        live = WorkerRow.objects.using(using).filter(expires_at__gt=DbNow(), metrics=True)
        live = live.order_by("id")
        if live.values_list("id", flat=True).first() != self.worker_id:
            hooks.queues = None  # another worker reports them
            return None
        per_queue = metrics.ready_per_queue(using, self.dialect.now())
        figures = dict.fromkeys(self._seen, (0, 0.0))
        figures.update((q, (n, oldest or 0.0)) for q, (n, oldest) in per_queue.items())
        self._seen.update(figures)
        hooks.queues = figures
        return None

    def finish(self) -> None:
        if telemetry.active is not None:
            telemetry.active.queues = None
