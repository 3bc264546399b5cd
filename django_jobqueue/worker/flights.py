"""The attempts a worker holds: claimed, and not yet recorded."""

from __future__ import annotations

import threading

from ..engine.attempts import InFlight
from ..engine.leases import Lease


class Flights:
    """A thread-safe registry of the attempts this worker holds a lease on.

    The dispatcher adds an attempt when it claims it; the completer removes it once its
    outcome is written (or its lease turned out lost). Until then the heartbeat renews its
    lease and lists it in the worker's row, whatever the handler or the completer is doing.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._flights: dict[int, InFlight] = {}

    def add(self, flight: InFlight) -> None:
        with self._lock:
            self._flights[flight.job.id] = flight

    def remove(self, flight: InFlight) -> bool:
        """Forget `flight`; return whether none is held any more."""
        with self._lock:
            if self._flights.get(flight.job.id) is flight:
                del self._flights[flight.job.id]
            return not self._flights

    def snapshot(self) -> list[InFlight]:
        with self._lock:
            return list(self._flights.values())

    def leases(self) -> list[Lease]:
        with self._lock:
            return [f.lease for f in self._flights.values()]

    def __len__(self) -> int:
        with self._lock:
            return len(self._flights)
