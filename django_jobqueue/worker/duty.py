"""A duty: one named thing a worker does periodically, on its own thread and connection."""

from __future__ import annotations

import logging
import threading
import time

from django.db import DatabaseError, InterfaceError, connections

from ..dialects import Dialect
from . import connection_health, connection_pool

logger = logging.getLogger(__name__)


class Duty(threading.Thread):
    """Run `tick()` every `interval` seconds until stopped: on a thread of its own, or on a
    housekeeper's thread beside other light duties (`housekeeper.py`, then `host` is set).

    A thread has its own database connection (Django's connections are per thread), with
    every lock wait bounded to `lock_timeout`, so no duty waits behind another thread's, the
    dispatcher or a handler. An error in a tick is logged and the duty carries on after a
    backoff: a duty never dies of a database outage or of one bad row.
    """

    #: How long to wait after a failed tick, at most (doubling from `retry_after`).
    retry_after = 0.5
    max_backoff = 5.0

    def __init__(self, dialect: Dialect, *, interval: float, lock_timeout: float) -> None:
        super().__init__(name=f"jobqueue-{self.duty_name()}", daemon=True)
        self.dialect = dialect
        self.interval = interval
        self.lock_timeout = lock_timeout
        # Set by the worker: the server ends a transaction of this duty idle this long.
        self.idle_timeout: float | None = None
        self._stop_event = threading.Event()
        self._wake_event = threading.Event()
        self.failures = 0
        # The housekeeper whose thread runs this duty's ticks (None: a thread of its own).
        self.host: Duty | None = None

    @classmethod
    def duty_name(cls) -> str:
        return cls.__name__.lower()

    def tick(self) -> float | None:
        """Do the duty once; return seconds until the next tick (None: the interval)."""
        raise NotImplementedError

    def on_error(self, exc: BaseException) -> None:
        """Called after a tick raised (the connection is closed already)."""

    def run(self) -> None:
        # The thread's own connection, beside a pool the alias may have (connection_pool.py),
        # closed when the duty ends.
        try:
            connection_pool.outside_pool(self.dialect.using)
            self.loop()
        finally:
            self.finish()
            connections.close_all()

    def loop(self) -> None:
        """Tick until stopped (a duty that is no periodic loop overrides this, not run())."""
        while not self._stop_event.is_set():
            self._wake_event.clear()
            self._sleep(self.run_once())

    def run_once(self) -> float:
        """Do one tick, bounded, and return the seconds until the next; an error in it is
        logged and answered with a backoff (the connection closed), never raised."""
        try:
            self.dialect.bound_waits(self.lock_timeout, self.idle_timeout)
            delay = self.tick()
            self.failures = 0
        except Exception as exc:  # a duty never dies: log, back off, carry on
            self.failures += 1
            delay = min(self.retry_after * 2 ** (self.failures - 1), self.max_backoff)
            level = logging.WARNING if self.failures <= 3 else logging.ERROR
            # A database error (an outage, a lock held too long) needs no traceback;
            # anything else is a bug worth one.
            trace = self.failures == 1 and not isinstance(exc, DatabaseError | InterfaceError)
            logger.log(
                level, "Worker duty %s failed (%s); retrying in %.1fs",
                self.duty_name(), exc, delay, exc_info=trace,
            )  # fmt: skip
            connection_health.note(exc, self.dialect)
            self.dialect.connection.close()
            self.on_error(exc)
        return self.interval if delay is None else delay

    def finish(self) -> None:
        """Called once when the duty stops, on its thread, before its connections close."""

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + max(0.0, seconds)
        while not self._stop_event.is_set():
            left = deadline - time.monotonic()
            if left <= 0 or self._wake_event.wait(left):
                return

    def wake(self) -> None:
        """Run the next tick now."""
        self._wake_event.set()
        if self.host is not None:
            self.host.wake()

    def stop(self, timeout: float | None = None) -> None:
        """Ask the duty to stop, and wait up to `timeout` seconds for its thread."""
        self._stop_event.set()
        self._wake_event.set()
        if timeout is not None and self.is_alive():
            self.join(timeout)

    @property
    def stopping(self) -> bool:
        return self._stop_event.is_set() or (self.host is not None and self.host.stopping)
