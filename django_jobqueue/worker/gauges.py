"""The gauges duty: reads the ready backlog per queue, and what each limit holds, for the
OpenTelemetry queue and limit gauges.

Runs only when ``JOBQUEUE["OPENTELEMETRY"]`` records metrics. Every GAUGE_INTERVAL seconds
each such worker asks which live worker that records metrics has the smallest id (one read of
the workers' table; a worker's row says whether it records them, `Worker.metrics`); that
worker alone reads the ready jobs per queue and the units the jobs in flight hold of each
resource (`engine.occupancy.holding`, the reading of `jobqueue_limits`), and hands the
figures to the gauges (`telemetry.otel`), the others report none. A gauge thus comes from
one process, and the rows are read once per interval however many workers run; a worker with
metrics off (or of a release before `Worker.metrics`) is never the one.
"""

from __future__ import annotations

from .. import metrics, telemetry
from ..dialects import Dialect
from ..engine import occupancy
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
        # Resources of a pattern that held something at the last read: reported 0 once when
        # they hold nothing, then no more (a declared resource is reported whatever it holds).
        self._holding: dict[str, int | None] = {}

    def tick(self) -> float | None:
        hooks = telemetry.active
        if hooks is None:
            return None
        using = self.dialect.using
        live = WorkerRow.objects.using(using).filter(expires_at__gt=DbNow(), metrics=True)
        live = live.order_by("id")
        if live.values_list("id", flat=True).first() != self.worker_id:
            hooks.queues = hooks.limits = None  # another worker reports them
            return None
        per_queue = metrics.ready_per_queue(using, self.dialect.now())
        figures = dict.fromkeys(self._seen, (0, 0.0))
        figures.update((q, (n, oldest or 0.0)) for q, (n, oldest) in per_queue.items())
        self._seen.update(figures)
        hooks.queues = figures
        hooks.limits = self._limits()
        return None

    def _limits(self) -> dict[str, tuple[int, int | None]]:
        """What each limit holds, with a last 0 for a resource that stopped holding anything."""
        held = occupancy.holding(self.dialect)
        gone = {name: (0, cap) for name, cap in self._holding.items() if name not in held}
        self._holding = {name: cap for name, (units, cap) in held.items() if units}
        return {**gone, **held}

    def finish(self) -> None:
        if telemetry.active is not None:
            telemetry.active.queues = telemetry.active.limits = None
